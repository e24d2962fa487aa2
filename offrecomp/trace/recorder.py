"""The recorders: the modes that watch a region's forward, and what they record.

``OpRecorder`` runs over a region call of the measuring pass and records, per ATen op,
its time, the allocations it reads, writes and creates, the view geometry of its
outputs, its non-tensor arguments and results, whether it draws random numbers, and
whether it ran with grad disabled (``_Op``). ``FirstCallWatch`` runs over a region's
first call and records what a replay needs that the capture cannot see at entry.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from offrecomp import _torch_compat as tc
from offrecomp.trace.ops import (
    _param_cast,
    _scalars_of,
    _traits,
    describable,
    op_leaves,
    written_arguments,
    written_tensors,
)
from offrecomp.trace.scope import _is_internal, _RegionMode

COMPILED_FORWARD = "<compiled forward>"
"""The one op of a compiled region's recording (NOTE [Compiled regions])."""


@dataclass
class _OutMeta:
    sid: int  # storage id within the recording (see OpRecorder.storage_id)
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: torch.device
    numel: int


@dataclass
class _Value:
    value: Any


_OPAQUE = object()


@dataclass
class _Op:
    name: str
    func: Any
    start: float
    end: float
    start_ev: Any = None
    end_ev: Any = None
    outputs: list[Any] = field(default_factory=list)
    """Flattened return value: ``_OutMeta`` per describable tensor, ``_OPAQUE`` for a
    tensor we cannot rebuild, ``_Value(v)`` for a non-tensor return."""
    input_sids: tuple[int, ...] = ()
    read_sids: tuple[int, ...] = ()
    written_sids: tuple[int, ...] = ()
    scalars: tuple[Any, ...] = ()
    view: bool = False
    writes: bool = False
    random: bool = False
    factory: bool = False
    grad_enabled: bool = True
    higher_order: bool = False
    """A higher-order operator: its subgraphs' ops are not seen, so the region is opaque."""
    cast_of: int = 0
    """``id`` of the parameter a cast autocast caches converts, else 0 (NOTE [Autocast
    cache])."""


def _gen_states(devices: Sequence[int]) -> tuple[Any, ...]:
    cpu = torch.default_generator.get_state()
    cuda = tuple(torch.cuda.default_generators[i].get_offset() for i in devices) if devices else ()
    return (cpu, cuda)


def _generator_of(args: Any, kwargs: dict[str, Any]) -> torch.Generator | None:
    """The ``torch.Generator`` an op draws from, passed by keyword or, as ``poisson``
    and ``binomial`` take it, by position."""
    gen = kwargs.get("generator")
    if isinstance(gen, torch.Generator):
        return gen
    for a in args:
        if isinstance(a, torch.Generator):
            return a
    return None


def _same_gen(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return bool(torch.equal(a[0], b[0])) and a[1] == b[1]


#: Storages from outside a region call that its first call's watch copies before the
#: call writes them (NOTE [State written by its region] in offrecomp/call_state.py).
EXTERNAL_COPY_MAX_BYTES = 64 << 20

#: Storages from outside a region call that its first call's watch copies at their first
#: read, for a write to them heard only after it (NOTE [Storages no op made]). The copies
#: live until the call's exit, and only a region's first call is watched.
READ_COPY_MAX_BYTES = 16 << 20

#: In-place ops that overwrite their ``self`` without reading it.
_OVERWRITES = frozenset(
    getattr(torch.ops.aten, name) for name in (
        "copy_", "fill_", "zero_", "uniform_", "normal_", "bernoulli_", "random_", "exponential_", "geometric_",
        "log_normal_", "cauchy_",
    ) if hasattr(torch.ops.aten, name)
)


def _writes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[torch.Tensor, bool]]:
    """The tensors ``func`` writes, each with whether the op overwrites all of its
    storage without reading it (an ``out=`` argument, or the ``self`` of a copy or fill,
    covering the storage from its start)."""
    written = written_arguments(func, args, kwargs)
    if not written:
        return []
    overwrites = getattr(func, "overloadpacket", None) in _OVERWRITES
    return [
        (x, (name.startswith("out") or (overwrites and name == "self")) and _covers(x))
        for name, x in written
    ]


def _covers(x: torch.Tensor) -> bool:
    """Does ``x`` lie over all of its storage, contiguously from its start?"""
    return x.is_contiguous() and x.storage_offset() == 0 and x.numel() * x.element_size() == x.untyped_storage().nbytes()


_Hearing = TypeVar("_Hearing", bound="HearsReportedWrites")


class HearsReportedWrites(_RegionMode):
    """A mode that, while entered, hears the writes compiled code reports after making
    them (``reported_write``, NOTE [Storages no op made]): the innermost one on its
    thread."""

    def reported_write(self, t: torch.Tensor) -> None:
        raise NotImplementedError

    def __enter__(self: _Hearing) -> _Hearing:
        _REPORTED_WRITES.push(self)
        try:
            super().__enter__()
        except BaseException:
            _REPORTED_WRITES.pop(self)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            _REPORTED_WRITES.pop(self)


def graph_held(tensors: list[torch.Tensor], made: set[int], nodes: int) -> set[int]:
    """Storages of ``made`` that only the autograd graph of ``tensors`` holds: tensors a
    custom Function's forward kept on ``ctx`` (not through ``save_for_backward``),
    directly or in a list or tuple, found in the nodes reached from ``tensors`` (at most
    ``nodes``: the call's own come first). Held by nothing else (the attribute the only
    reference to the tensor object and to its list, the object its storage's only
    user), no later call can read them and no replay can write them: no state (NOTE
    [State the first call made] in offrecomp/call_state.py)."""
    out: set[int] = set()
    todo: list[Any] = [t.grad_fn for t in tensors if t.grad_fn is not None]
    seen: set[int] = set()
    while todo and nodes > 0:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes -= 1
        attrs = getattr(node, "__dict__", None)  # a custom Function's ctx; built-in nodes have none
        if attrs:
            out.update(_sole_ptrs(attrs, made))
        todo.extend(fn for fn, _ in node.next_functions)
    return out


def _sole_ptrs(attrs: dict[str, Any], made: set[int]) -> list[int]:
    """``graph_held``'s check of one ctx's attributes; the references counted are those
    this function's own frame adds, measured once on a dict of its own (``_SOLE``)."""
    out = []
    for value in attrs.values():
        refs = sys.getrefcount(value)
        items = value if type(value) is list or type(value) is tuple else None
        if items is not None:
            if refs > _SOLE[1]:
                continue
            for t in items:
                if type(t) is torch.Tensor and sys.getrefcount(t) <= _SOLE[2] and describable(t):
                    storage = t.untyped_storage()
                    ptr = int(storage.data_ptr())
                    if ptr in made and tc.storage_use_count(storage) <= 2:  # the tensor and this storage object
                        out.append(ptr)
        elif type(value) is torch.Tensor and refs <= _SOLE[0] and describable(value):
            storage = value.untyped_storage()
            ptr = int(storage.data_ptr())
            if ptr in made and tc.storage_use_count(storage) <= 2:
                out.append(ptr)
    return out


def _sole_refs() -> tuple[int, int, int]:
    """The references ``_sole_ptrs`` sees to a tensor, a list, and a tensor in that list
    that only the attributes' dict holds (the interpreter's own count)."""
    refs = [0, 0, 0]
    for value in {"t": torch.empty(0), "l": [torch.empty(0)]}.values():
        if type(value) is list:
            refs[1] = sys.getrefcount(value)
            for t in value:
                refs[2] = sys.getrefcount(t)
        else:
            refs[0] = sys.getrefcount(value)
    return refs[0], refs[1], refs[2]


_SOLE = _sole_refs()


class FirstCallWatch(HearsReportedWrites):
    """The first call of a region runs under this mode, which learns two things a replay
    needs and the capture cannot see at entry:

    * an op about to write one of the call's captured inputs, or one of its region's
      parameters, makes the capture keep a copy of it as it was (NOTE [State written by
      its region]);
    * a random op drawing from a ``torch.Generator`` of the region's own (not the global
      one) records that generator and its state at its first draw, the state it had when
      the call entered (NOTE [Private generators] in replay.py);
    * an op about to write a storage the call did not see made, that it neither owns nor
      takes as an argument (a buffer of another module or a tensor attribute reached
      through a plain attribute, a global; or a buffer compiled code allocated, NOTE
      [Storages no op made]) copies it first where needed (up to
      EXTERNAL_COPY_MAX_BYTES; ``external``) and calls ``on_foreign``, once (NOTE [State
      written by its region]); ``wrote_outside`` tells, at the call's exit, whether any
      of them was from outside the call;
    * a write that compiled code reports after it made it (NOTE [Storages no op made])
      counts as one of those, its copy the one taken at the storage's first read by the
      call (up to READ_COPY_MAX_BYTES) if any; ``on_foreign`` is told of each such write
      (``heard_after``)."""

    def __init__(
        self, cap: Any, params: Any, own: frozenset[int] = frozenset(), on_foreign: Any = None, state: Any = None
    ) -> None:
        super().__init__()
        self.own = own
        """Storages the call owns or takes: its region's parameters and buffers, its inputs."""
        self.on_foreign = on_foreign
        """Called with False at the first write to a storage outside them seen before it is
        made (NOTE [State written by its region]), with True at each one heard after it
        (NOTE [Storages no op made])."""
        self.foreign_written = False
        self.made: set[int] = set()
        """Storages of the tensors the call's ops made: written freely."""
        self.made_refs: list[tuple[int, weakref.ref[torch.Tensor]]] = []
        """Each tensor made on a new storage, weakly (NOTE [State the first call made] in
        offrecomp/call_state.py)."""
        self.outputs: set[int] = set()
        """Storages of the tensors the call returned (``note_outputs``)."""
        self.external: dict[int, tuple[Any, Any]] = {}
        """Storages outside the call it read, or partly wrote, before writing them:
        (storage, its bytes before the first write, or None where larger than
        EXTERNAL_COPY_MAX_BYTES)."""
        self.read: dict[int, torch.Tensor] = {}
        """Storages outside the call its ops read before any write of them, and the tensor
        first read of each (NOTE [State read from outside] in offrecomp/call_state.py)."""
        self.read_copies: dict[int, Any] = {}
        """The bytes of those up to READ_COPY_MAX_BYTES at their first read."""
        self.written: dict[int, tuple[weakref.ref[Any], bool]] = {}
        """Storages it wrote that it did not see made and neither owns nor takes: a weak
        reference to each, and whether an op overwrote all of it before any read of it
        (NOTE [Storages no op made])."""
        # storage -> (holder, index, tensor): arguments.CapturedInputs, params.ParamState
        # and arg_state.ArgState (``state``: NOTE [State written by the forward]), each
        # with keep_copy(index)
        self.cap = cap
        self.by_ptr: dict[int, list[tuple[Any, int, torch.Tensor]]] = {}
        held = [t for t, _, _ in state.tensors] if state is not None else ()
        for holder, tensors in (
            (cap, cap.tensors), (params, params.objects if params is not None else ()), (state, held)
        ):
            for i, t in enumerate(tensors):
                if t is not None and describable(t):
                    self.by_ptr.setdefault(int(t.untyped_storage().data_ptr()), []).append((holder, i, t))
        self.generators: dict[int, tuple[torch.Generator, torch.Tensor]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        gen = _generator_of(args, kwargs)
        if gen is not None and id(gen) not in self.generators:
            self.generators[id(gen)] = (gen, gen.get_state())
        writes = _writes(func, args, kwargs)  # none for a higher-order op
        overwritten = {id(t) for t, whole in writes if whole}
        inputs: set[int] = set()
        for x in op_leaves((args, kwargs)):
            if isinstance(x, torch.Tensor) and describable(x):
                ptr = int(x.untyped_storage().data_ptr())
                inputs.add(ptr)
                if (
                    id(x) not in overwritten and ptr not in self.read and ptr not in self.made
                    and ptr not in self.own and ptr not in self.by_ptr and ptr not in self.written
                ):
                    self.read[ptr] = x  # from outside the call, read before any write of it
                    storage = x.untyped_storage()
                    if storage.nbytes() <= READ_COPY_MAX_BYTES:  # for a write heard after it
                        self.read_copies[ptr] = storage.clone()
        for x, whole in writes:
            storage = x.untyped_storage()
            ptr = int(storage.data_ptr())
            held = self.by_ptr.get(ptr)
            if held:
                for holder, i, _ in held:
                    if holder is self.cap:  # one copy spanning what else lies there (NOTE [Aliased arguments])
                        holder.keep_copy(i, [t for _, _, t in held])
                    else:
                        holder.keep_copy(i)
            elif ptr and ptr not in self.made and ptr not in self.own:
                self._external(ptr, storage, whole, True)
        out = func(*args, **kwargs)
        for t in op_leaves(out):
            if isinstance(t, torch.Tensor) and describable(t):
                ptr = int(t.untyped_storage().data_ptr())
                if ptr not in inputs:  # a view of an input is the input's storage, not a new one
                    self.made.add(ptr)
                    self.made_refs.append((ptr, weakref.ref(t)))  # each: an address freed may be made again
        return out

    def note_outputs(self, tensors: list[torch.Tensor]) -> None:
        """The call returned ``tensors``: their storages are no state it keeps, nor are
        those only their autograd graph holds (``graph_held``)."""
        for t in tensors:
            if describable(t):
                self.outputs.add(int(t.untyped_storage().data_ptr()))
        self.outputs |= graph_held(tensors, self.made, len(self.made_refs) + 16)

    def made_state(self, skip: Callable[[int, Any], bool]) -> list[torch.Tensor]:
        """At the call's exit: the tensors it made that are alive still, on the storage
        they were made on, neither returned nor named by ``skip(ptr, storage)`` (NOTE
        [State the first call made] in offrecomp/call_state.py)."""
        out: dict[int, torch.Tensor] = {}
        for ptr, ref in self.made_refs:
            t = ref()
            if t is not None and ptr not in self.outputs and ptr not in out and describable(t):
                storage = t.untyped_storage()
                if int(storage.data_ptr()) == ptr and not skip(ptr, storage):
                    out[ptr] = t
        return list(out.values())

    def _external(self, ptr: int, storage: Any, whole: bool, before: bool) -> None:
        """A write to a storage the call did not see made (``whole``: an overwrite of all
        of it that reads nothing of it; ``before``: seen before it happens): its bytes as
        they are where the call read them or keeps some, the call told (NOTE [State
        written by its region])."""
        entry = self.written.get(ptr)
        if entry is None or entry[0]() is not storage:  # else one it wrote before
            scratch = before and whole and ptr not in self.read
            self.written[ptr] = (weakref.ref(storage), scratch)
            if before and not scratch:  # a replay must read them as they were
                small = storage.nbytes() <= EXTERNAL_COPY_MAX_BYTES
                self.external[ptr] = (storage, storage.clone() if small else None)
            elif not before and ptr in self.read:  # read as it was before: copied then, if small
                self.external[ptr] = (storage, self.read_copies.get(ptr))
        if not self.foreign_written or not before:
            self.foreign_written = True
            if self.on_foreign is not None:
                self.on_foreign(not before)

    def reported_write(self, t: torch.Tensor) -> None:
        """Code no op stands for wrote ``t`` in place (NOTE [Storages no op made])."""
        if not describable(t):
            return
        storage = t.untyped_storage()
        ptr = int(storage.data_ptr())
        if ptr and ptr not in self.made and ptr not in self.own and ptr not in self.by_ptr:
            self._external(ptr, storage, False, False)  # an input or a parameter: by versions at exit

    def wrote_outside(self, saved: Callable[[int, Any], bool]) -> bool:
        """At the call's exit: did it write a storage from outside it? Not where each one
        it wrote is scratch of its own: overwritten whole before any read, and now freed
        or held only through a save of the call (``saved(ptr, storage)``; NOTE [Storages
        no op made])."""
        for ptr, (ref, scratch) in self.written.items():
            storage = ref()
            if not scratch or (storage is not None and not saved(ptr, storage)):
                return True
        return False



class _Routed:
    """A process-wide patch kept in place while any thread has a user of it (counted:
    installed for the first, taken off after the last), and each thread's users,
    innermost last (NOTE [Host reads], NOTE [Storages no op made])."""

    def __init__(self, install: Callable[[], None], uninstall: Callable[[], None]) -> None:
        self._install, self._uninstall = install, uninstall
        self._lock = threading.Lock()
        self._users = 0
        self._local = threading.local()

    def users(self) -> list[Any]:
        """This thread's users, innermost last."""
        stack: list[Any] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def push(self, user: Any) -> None:
        with self._lock:
            if self._users == 0:
                self._install()
            self._users += 1
        self.users().append(user)

    def pop(self, user: Any) -> None:
        stack = self.users()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is user:
                del stack[i]
                break
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._uninstall()


# NOTE [Storages no op made]
# The watch counts a storage as the call's own where it saw an op make it. Compiled code
# allocates its buffers where no op shows it (inductor's ``empty_strided_cpu`` and
# ``empty_strided_cuda``) and fills them in kernels no op stands for, or with an op
# writing its ``out=`` (``extern_kernels.addmm(..., out=buf)``), which the watch sees as a
# write to a storage it did not see made, as it sees a write to a tensor attribute. At
# the write it cannot tell them apart: the call keeps what it saves from that write on,
# as for any write from outside (NOTE [State written by its region] in call_state.py), so its
# own replay stops before it. At the call's exit it tells them apart: a storage an op
# overwrote whole before any read of it, that is freed by then or that only the call's
# saves still hold, is scratch of the call's own, and the region is not marked: its
# later calls recompute. A storage from outside is held from outside (a module, a
# global), and one held only through the call's saves is safe to write again: autograd
# fails a backward whose saved tensor was written after its save, and a replay, which
# computes every byte of it again from the same inputs, writes the bytes it holds. A
# storage the call read, or wrote in part, before writing it, one the call's outputs
# alone hold (a block returning the compiled function's result as it is), and any held
# from elsewhere still mark the region. Kernels write where no op shows it too: the
# graph inputs compiled code writes in place (a tensor attribute a compiled function
# advances) are told only after the write, by ``torch.autograd.graph.increment_version``,
# which AOT autograd calls for them, as custom ops do. While a watch runs on a thread,
# that call is routed through it (counted, as NOTE [Host reads] does) and the storage
# counts as written from outside. The call keeps from there on and its region is
# marked; what the call dropped before and still exists is kept too (``on_foreign``
# with ``heard_after``), since a later save of it would need a replay through that
# write, which would write the tensor again. Its replay, for what it dropped and freed
# before the write, stops before it, but reads the tensor: no copy of it as it was could
# be taken at the write (too late), so the watch copies each small storage from outside
# at the call's first read of it (READ_COPY_MAX_BYTES), and the replay runs on that copy;
# a larger one read before such a write makes that replay raise.

def _report_increment(tensors: Any) -> None:
    """``torch._C._increment_version`` while a watch runs: the innermost watch of this
    thread hears of each tensor first (NOTE [Storages no op made])."""
    watches = _REPORTED_WRITES.users()
    if watches and not _is_internal():
        watch = watches[-1]
        if not isinstance(tensors, torch.Tensor):
            tensors = tuple(tensors)  # an iterable handed on: read once
        for t in (tensors,) if isinstance(tensors, torch.Tensor) else tensors:
            if isinstance(t, torch.Tensor):
                watch.reported_write(t)
    tc.VERSION_INCREMENT(tensors)


_REPORTED_WRITES = _Routed(
    lambda: tc.route_version_increments(_report_increment), lambda: tc.route_version_increments(None)
)


# NOTE [Host reads]
# ``.tolist()`` and ``.numpy()`` (and ``np.asarray``, through ``__array__``) hand Python a
# CPU tensor's values without dispatching an ATen op, so the recorder cannot see them,
# while the region's code may branch on them as on ``.item()``'s. While a recorder runs
# on a thread, those two methods of torch.Tensor are wrapped (once for all threads,
# counted, and put back when the last recorder stops) to tell it; the region is then
# opaque (NOTE [Which ops replay runs] in structure.py). Not a function mode: torch.compile
# guards on the function-mode stack, so one would recompile every compiled function the
# region calls. A CUDA tensor's values reach Python through a copy to the CPU, an op.

_HOST_READ_METHODS = ("tolist", "numpy")


def _wrap_host_read(name: str) -> Any:
    original = tc.tensor_base_method(name)

    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        recorders = _HOST_READS.users()
        if recorders and not _is_internal():
            for recorder in recorders:  # nested regions: each outer one read it too
                recorder.host_reads = True
        return original(self, *args, **kwargs)

    read.__name__ = name
    read.__doc__ = original.__doc__
    return read


_HOST_READ_WRAPPERS = {name: _wrap_host_read(name) for name in _HOST_READ_METHODS}


def _wrap_host_reads() -> None:
    for name, read in _HOST_READ_WRAPPERS.items():
        setattr(torch.Tensor, name, read)


def _unwrap_host_reads() -> None:
    for name in _HOST_READ_METHODS:
        delattr(torch.Tensor, name)


_HOST_READS = _Routed(_wrap_host_reads, _unwrap_host_reads)


class OpRecorder(_RegionMode):
    """Records the ATen ops of one region call (measuring pass only)."""

    def __init__(
        self,
        *,
        use_cuda_events: bool,
        cuda_devices: Sequence[int],
        known_ptrs: frozenset[int] = frozenset(),
        passive: bool = False,
    ) -> None:
        super().__init__()
        self.passive = passive
        """A compiled region: never a dispatch mode; one op stands for its whole forward
        (NOTE [Compiled regions])."""
        self.ops: list[_Op] = []
        self.grad_enabled_at_entry = torch.is_grad_enabled()
        self._events = use_cuda_events
        self._cuda_devices = tuple(cuda_devices)
        self._live: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._next_sid = 0
        self._known_ptrs = known_ptrs
        self.known_sids: set[int] = set()
        """Storages legitimately from outside the region: inputs, parameters, buffers."""
        self.collective = False
        """A collective ran in the region (NOTE [Collective regions])."""
        self.host_reads = False
        """The region's code read tensor values through a method no ATen op stands for
        (NOTE [Host reads])."""
        self.made: dict[int, tuple[int, int]] = {}
        """Storages the region's ops made: storage id -> (the op that made it, its bytes)
        (NOTE [Replay transients])."""
        self.freed: dict[int, int] = {}
        """Storage id -> the number of ops recorded when that storage was freed."""
        self.returned: set[int] = set()
        """Storage ids of the tensors the region's forward returned (NOTE [Forward
        transients] in scheduler/working_set.py)."""
        self._made_refs: list[weakref.ref[Any]] = []

    def start(self) -> None:
        """The region's forward begins: record its ops (or, passive, start its one op)."""
        if not self.passive:
            self.__enter__()
            _HOST_READS.push(self)
            return
        op = _Op(name=COMPILED_FORWARD, func=None, start=time.perf_counter(), end=0.0)
        if self._events:
            op.start_ev = torch.cuda.Event(enable_timing=True)
            op.start_ev.record()
        self.ops.append(op)

    def abandon(self, modes: list[Any]) -> None:
        """The call recorded never ended (NOTE [Stale calls] in install.py): take the
        recording mode off where ``modes`` (the dispatch mode stack) holds it."""
        if self.passive or not any(m is self for m in modes):
            return
        if any(u is self for u in _HOST_READS.users()):
            _HOST_READS.pop(self)
        self.__exit__(None, None, None)

    def stop(self, out: Any = None) -> None:
        """The region's forward returned ``out`` (or raised: None)."""
        if not self.passive:
            _HOST_READS.pop(self)
            self.__exit__(None, None, None)  # first: the mode is off whatever ``out`` holds
        else:
            op = self.ops[0]
            op.end = time.perf_counter()
            if self._events:
                op.end_ev = torch.cuda.Event(enable_timing=True)
                op.end_ev.record()
        for t in tc.tree_leaves(out):
            if isinstance(t, torch.Tensor) and describable(t):
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                entry = self._live.get(ptr if ptr else -id(storage))
                if entry is not None and entry[0]() is storage:
                    self.returned.add(entry[1])

    def storage_id(self, t: torch.Tensor, *, known: bool = False) -> int:
        """A number for the allocation behind ``t``, unique within this recording.

        NOTE: data pointers are reused as soon as an allocation is freed, so they are no
        identity over a region's forward. The storage object is (torch keeps one Python
        object per live allocation): an id is handed out per storage object, and a data
        pointer seen again with another storage object gets a new id. Every empty
        allocation has pointer 0, so those are told apart by their objects alone (keyed by
        ``-id``, which no pointer is): two of them live at once, as a cache's first keys
        and values (``torch.tensor([])`` each), keep their ids.
        """
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        key = ptr if ptr else -id(storage)
        entry = self._live.get(key)
        if entry is not None and entry[0]() is storage:
            sid = entry[1]
        else:
            sid = self._next_sid
            self._next_sid += 1
            self._live[key] = (weakref.ref(storage), sid)
            if ptr in self._known_ptrs:
                known = True
        if known:
            self.known_sids.add(sid)
        return sid

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _is_internal():
            return func(*args, **kwargs)
        flat_in = op_leaves((args, kwargs))
        in_tensors = [x for x in flat_in if isinstance(x, torch.Tensor)]
        input_sids = tuple(self.storage_id(x) for x in in_tensors if describable(x))
        tr = _traits(func)
        higher_order = tr.higher_order
        random = higher_order or tr.seeded  # a subgraph may draw
        before = _gen_states(self._cuda_devices) if random else None
        start_ev = end_ev = None
        if self._events:
            start_ev = torch.cuda.Event(enable_timing=True)
            end_ev = torch.cuda.Event(enable_timing=True)
            start_ev.record()
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        t1 = time.perf_counter()
        if end_ev is not None:
            end_ev.record()
        if before is not None:
            # a draw from a generator of the region's own leaves the global ones as they were
            random = _generator_of(args, kwargs) is not None or not _same_gen(
                before, _gen_states(self._cuda_devices)
            )
        written: tuple[int, ...] = ()
        if tr.writes and not higher_order:  # no schema to name them: opaque anyway
            written = tuple(self.storage_id(x) for x in written_tensors(func, args, kwargs))
        outs: list[Any] = []
        first_new = self._next_sid  # an output with an id from here on is a storage this op made
        for x in op_leaves(out):
            if isinstance(x, torch.Tensor):
                if describable(x):
                    sid = self.storage_id(x)
                    if sid >= first_new and sid not in self.made and sid not in self.known_sids:
                        self._track(x, sid)
                    outs.append(
                        _OutMeta(
                            sid=sid,
                            size=tuple(x.shape),
                            stride=x.stride(),
                            offset=int(x.storage_offset()),
                            dtype=x.dtype,
                            device=x.device,
                            numel=x.numel(),
                        )
                    )
                else:
                    outs.append(_OPAQUE)
            else:
                outs.append(_Value(x))
        if tr.collective:
            self.collective = True
        view = tr.view
        if view and outs and all(isinstance(o, _OutMeta) and o.sid not in input_sids for o in outs):
            # a schema that may alias whose call copied (to, contiguous, reshape: reached
            # as themselves under a caller's dispatch mode): it computes, as it will again
            view = False
        self.ops.append(
            _Op(
                name=tr.name,
                func=func,
                start=t0,
                end=t1,
                start_ev=start_ev,
                end_ev=end_ev,
                outputs=outs,
                input_sids=input_sids,
                read_sids=() if tr.metadata_only else input_sids,
                written_sids=written,
                scalars=() if higher_order else _scalars_of(flat_in),  # callables, masks: opaque anyway
                view=view,
                writes=tr.writes,
                random=random,
                factory=not in_tensors,
                grad_enabled=torch.is_grad_enabled(),
                higher_order=higher_order,
                cast_of=_param_cast(tr.name, args, kwargs),
            )
        )
        return out

    def _track(self, x: torch.Tensor, sid: int) -> None:
        """``x``'s storage, new, was made by the op being recorded: note it, and the number
        of ops recorded when it is freed (NOTE [Replay transients])."""
        storage = x.untyped_storage()
        self.made[sid] = (len(self.ops), int(storage.nbytes()))
        freed = self.freed
        ops = self.ops

        def gone(_: Any) -> None:
            freed.setdefault(sid, len(ops))

        self._made_refs.append(weakref.ref(storage, gone))

    def unsaved_live_bytes(self, saved: set[int]) -> list[int]:
        """Per recorded op, the bytes of the storages the region's ops made that are not
        among ``saved`` (storage ids) and are alive when the op has returned: its outputs
        made, its inputs not yet freed (NOTE [Replay transients])."""
        n = len(self.ops)
        diff = [0] * (n + 1)
        for sid, (born, nbytes) in self.made.items():
            if sid in saved:
                continue
            end = min(self.freed.get(sid, n), n)
            if end > born:
                diff[born] += nbytes
                diff[end] -= nbytes
        out = []
        live = 0
        for k in range(n):
            live += diff[k]
            out.append(live)
        return out

    def op_seconds(self) -> list[float]:
        out = []
        for op in self.ops:
            if op.start_ev is not None:
                out.append(op.start_ev.elapsed_time(op.end_ev) / 1e3)
            else:
                out.append(op.end - op.start)
        return out
