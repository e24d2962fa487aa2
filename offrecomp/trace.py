"""Op-level view of a region: recorded once per signature, used to make replay cheap.

The measuring pass runs each region's forward under ``OpRecorder``, a dispatch mode that
sees every ATen op below autograd: its time, the allocations it reads and creates, the
view geometry of its outputs, whether it writes its inputs, draws random numbers, hands
a value to Python, or runs with grad disabled. From that trace and the saves the hooks
saw, ``build_structure`` derives a ``RegionStructure``:

* for the planner: per op its time, its dataflow (``reads``), whether replay could serve
  it, and which saved storage each output lives in (``scheduler.profile.OpRecord``);
* for replay: a program saying, for each op of the replayed prefix, whether to run it,
  serve it from held storages, or hand out a placeholder (``ServingMode``).

NOTE [Which ops replay runs]
Replay must regenerate the dropped storages it needs, and nothing else. Going backwards
from the ops that produced those storages, it follows the dataflow the recording saw:
an op runs if a running op reads what it produced, or if it is a *sink* (draws random
numbers, writes in place, writes storage it did not create, or hands a value to Python
such as ``.item()``), whose effects must happen as in the forward. An op whose every
output lives in a held storage (a KEEP save, never written in place in the region) is
*served*: its outputs are rebuilt with the recorded size/stride/offset on the held
storage, the very bytes the forward produced, and what it read is not needed. Every
other op gets placeholder outputs (right shape, strides and dtype, unspecified values)
because nothing that runs reads them. View ops always run (they cost nothing and keep
Python-level metadata right).

That is only sound when the recording saw all the dataflow, and when every pass takes
the recorded path through the region's Python code. It did not, or may not, when:
  * the region holds torch.compile'd modules: under a dispatch mode dynamo does not
    compile them (and may give up on them for good), so a recording would show other ops
    and saves than the compiled forward runs. Such a region is *opaque* from the start
    and is never recorded: one op stands for its whole forward (NOTE [Compiled regions]
    in runtime.py);
  * a higher-order operator ran (flex_attention, cond): it reaches the recorder as one
    op whose subgraphs it never sees. The region is *opaque*. Both modes here accept
    such operators (without that they raise), and both step aside while dynamo
    compiles (``ignore_compile_internals``): under a mode dynamo would not compile,
    would give up on that code for good, and code compiled with ``fullgraph=True``
    (eager flex_attention's own wrapper) would raise;
  * an op ran with grad disabled inside the grad-enabled region (a custom
    autograd.Function, a compiled graph, a no_grad block): such code may launch kernels
    the dispatcher never sees. The region is *opaque*: replay runs its whole prefix, as
    torch.utils.checkpoint does, and serves nothing;
  * an op handed Python a value or a shape that depends on the data (``.item()``,
    ``bool(t)``, ``nonzero``, ``unique``): the code may branch on it, so another pass may
    run other ops, or the same ops on other tensors, than the recording. The region is
    *opaque*: replay reruns the prefix plainly, following this pass's own branches;
  * an op read a tensor that no op of the region created and that is neither a region
    input nor a parameter or buffer (``torch.tensor(x.tolist())``, ``from_numpy``): a
    Python-side value path the dispatcher cannot see. Then replay serves held outputs but
    hands out no placeholders (every op in the prefix runs or is served).
Replay checks that it dispatches the same ops with the same non-tensor arguments as the
forward. If a replay with placeholders diverges anyway, it is redone without
placeholders and the region never uses them again (logged once); a replay without
placeholders that diverges is an error: the region's forward is not a deterministic
function of its inputs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from offrecomp import _torch_compat as tc
from offrecomp._torch_compat import tree_flatten
from scheduler.profile import OpRecord, StorageRecord

log = logging.getLogger(__name__)

__all__ = [
    "FirstCallWatch",
    "OpRecorder",
    "ParamGuard",
    "RegionStructure",
    "ReplayDivergedError",
    "ServingMode",
    "build_structure",
    "internal",
    "user_code",
]

class ThreadDepth(threading.local):
    """A per-thread nesting depth. The class default answers threads that never set it
    (``getattr`` with a default costs an exception on every miss, on every op)."""

    depth = 0


_tls = ThreadDepth()  # internal() nesting on this thread


@contextlib.contextmanager
def internal() -> Iterator[None]:
    """Ops offrecomp itself issues (inside its hooks) are invisible to the modes below."""
    _tls.depth = _tls.depth + 1
    try:
        yield
    finally:
        _tls.depth -= 1


@contextlib.contextmanager
def user_code() -> Iterator[None]:
    """Undo ``internal()`` while offrecomp runs user code (a replayed forward)."""
    saved = _tls.depth
    _tls.depth = 0
    try:
        yield
    finally:
        _tls.depth = saved


def _is_internal() -> bool:
    return _tls.depth > 0


class ReplayDivergedError(RuntimeError):
    """A replay did not dispatch what the forward dispatched."""


class CastDivergedError(ReplayDivergedError):
    """A replay under the serving mode diverged at a cast of a parameter, which autocast's
    weight cache explains (NOTE [Autocast cache]): a plain replay is right."""


#: torch.distributed's ops as the dispatcher names them (dist.all_reduce and friends, and
#: the functional collectives).
_COLLECTIVE_NAMESPACES = ("c10d.", "_c10d_functional.", "c10d_functional.")

COMPILED_FORWARD = "<compiled forward>"
"""The one op of a compiled region's recording (NOTE [Compiled regions])."""

# Ops that read only the metadata (shape, dtype, device) of their tensor inputs.
_METADATA_ONLY = frozenset(
    {
        "aten.empty_like.default",
        "aten.zeros_like.default",
        "aten.ones_like.default",
        "aten.full_like.default",
        "aten.rand_like.default",
        "aten.randn_like.default",
        "aten.randint_like.default",
        "aten.new_empty.default",
        "aten.new_empty_strided.default",
        "aten.new_zeros.default",
        "aten.new_ones.default",
        "aten.new_full.default",
        "aten.sym_size.int",
        "aten.sym_stride.int",
        "aten.sym_numel.default",
        "aten.sym_storage_offset.default",
        "aten.size.int",
        "aten.stride.int",
        "aten.dim.default",
        "aten.is_same_size.default",
    }
)

_SIMPLE_RETURN_TYPES = ("Tensor", "Tensor?", "SymInt", "int", "float", "bool", "Tensor[]", "ScalarType")


_DATA_TAGS = tuple(
    getattr(torch.Tag, name) for name in ("data_dependent_output", "dynamic_output_shape")
    if hasattr(torch.Tag, name)
)


def _branches_on_data(op: Any) -> bool:
    """The op hands Python a value or a shape that depends on tensor data (``.item()``,
    ``bool(t)``, ``nonzero``, ``unique``): the region's Python code may branch on it."""
    if any(tag in _DATA_TAGS for tag in getattr(op.func, "tags", ())):
        return True
    values = [o for o in op.outputs if isinstance(o, _Value)]
    return bool(values) and not any(isinstance(o, _OutMeta) for o in op.outputs)


def _returns_rebuildable(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is None:  # a higher-order operator
        return False
    types = [str(r.type) for r in schema.returns]
    if not types or any(t not in _SIMPLE_RETURN_TYPES for t in types):
        return False
    return not (len(types) > 1 and "Tensor[]" in types)


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


def _describable(t: torch.Tensor) -> bool:
    # By exact type: a tensor subclass (DTensor, also as a parameter under tensor
    # parallelism) is a wrapper whose storage has no data pointer.
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        return False
    return t.layout == torch.strided and not t.is_meta


# NOTE [Op leaves]
# The modes see every op a region runs, and each flattened the op's arguments (and the
# recorder its results) with pytree: about 12 us per op for a single tensor argument,
# most of a mode's cost per op (a bare dispatch mode costs about 5). The dispatcher hands
# a mode tuples and lists (and the kwargs dict) of tensors and scalars, which
# ``op_leaves`` walks directly; any other type goes through pytree, so the leaves, and
# their order, are always pytree's.
_NODE_TYPES = (tuple, list, torch.Size)
_LEAF_TYPES = frozenset(
    {
        torch.Tensor, torch.nn.Parameter, int, float, bool, str, complex, type(None),
        torch.dtype, torch.device, torch.layout, torch.memory_format,
    }
)


class _Traits(NamedTuple):
    """What the recorder asks of every op that depends on the operator alone."""

    name: str
    higher_order: bool
    seeded: bool  # may draw from an RNG
    writes: bool  # in-place or out=
    view: bool  # a return aliases an input
    collective: bool
    metadata_only: bool  # reads only its inputs' shapes and dtypes


_TRAITS: dict[Any, _Traits] = {}


def _traits(func: Any) -> _Traits:
    """The operator's traits, worked out once per operator (from its schema and tags)."""
    t = _TRAITS.get(func)
    if t is None:
        name = str(func)
        t = _TRAITS[func] = _Traits(
            name=name,
            higher_order=tc.is_higher_order(func),
            seeded=tc.is_nondeterministic_seeded(func),
            writes=tc.op_writes_inputs(func),
            view=tc.op_returns_alias(func),
            collective=name.startswith(_COLLECTIVE_NAMESPACES),
            metadata_only=name in _METADATA_ONLY,
        )
    return t


def op_name(func: Any) -> str:
    """``str(func)``, worked out once per operator (it formats the schema name each time)."""
    return _traits(func).name


def op_leaves(tree: Any) -> list[Any]:
    """``tree_flatten(tree)[0]``, fast for what the dispatcher passes (NOTE [Op leaves])."""
    out: list[Any] = []
    _collect(tree, out)
    return out


def _collect(x: Any, out: list[Any]) -> None:
    t = type(x)
    if t in _LEAF_TYPES:
        out.append(x)
    elif t in _NODE_TYPES:
        for y in x:
            if type(y) in _LEAF_TYPES:
                out.append(y)
            else:
                _collect(y, out)
    elif t is dict:
        for y in x.values():
            _collect(y, out)
    else:
        out.extend(tree_flatten(x)[0])


def _scalars_of(leaves: list[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            out.append(None)
        elif isinstance(x, (int, float, bool, str)) or x is None:
            out.append(x)
        else:
            out.append(str(x))
    return tuple(out)


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


def _same_gen(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return bool(torch.equal(a[0], b[0])) and a[1] == b[1]


class _RegionMode(tc.TorchDispatchMode):
    """What the recorder and the replay's serving mode share about code they do not see
    op by op.

    Higher-order operators (flex_attention, cond) reach the mode as one op; without
    ``supports_higher_order_operators`` they raise NotImplementedError. The recorder
    records one as one op, which makes the region opaque (see build_structure); the
    serving mode, which never runs on an opaque region, reports one as a divergence.

    Both step aside while dynamo compiles (``ignore_compile_internals``). Otherwise
    dynamo falls back to eager under the mode, gives up on that code for good, and code
    compiled with fullgraph=True raises (eager flex_attention compiles its own wrapper
    that way). Compiled code then runs compiled in the recording and the replay alike:
    the kernels of a compiled graph are seen by neither, and a value they make is read
    from outside the recording, which turns placeholders off."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


def written_tensors(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The plain tensors an op writes (in-place and ``out=`` arguments), by its schema."""
    names = tc.written_arg_names(func)
    if not names:
        return []
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.name not in names:
            continue
        val = kwargs.get(a.name, args[i] if i < len(args) else None)
        out += [x for x in op_leaves(val) if isinstance(x, torch.Tensor) and _describable(x)]
    return out


class FirstCallWatch(_RegionMode):
    """The first call of a region runs under this mode, which learns two things a replay
    needs and the capture cannot see at entry:

    * an op about to write one of the call's captured inputs, or one of its region's
      parameters, makes the capture keep a copy of it as it was (NOTE [State written by
      its region] in runtime.py);
    * a random op drawing from a ``torch.Generator`` of the region's own (not the global
      one) records that generator and its state at its first draw, the state it had when
      the call entered (NOTE [Private generators] in replay.py)."""

    def __init__(self, cap: Any, params: Any) -> None:
        super().__init__()
        # storage -> (holder, index): regions.CapturedInputs and regions.ParamState, each
        # with keep_copy(index)
        self.by_ptr: dict[int, list[tuple[Any, int]]] = {}
        for holder, tensors in ((cap, cap.tensors), (params, params.objects if params is not None else ())):
            for i, t in enumerate(tensors):
                if t is not None and _describable(t):
                    self.by_ptr.setdefault(int(t.untyped_storage().data_ptr()), []).append((holder, i))
        self.generators: dict[int, tuple[torch.Generator, torch.Tensor]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        gen = kwargs.get("generator")
        if isinstance(gen, torch.Generator) and id(gen) not in self.generators:
            self.generators[id(gen)] = (gen, gen.get_state())
        if self.by_ptr:
            for x in written_tensors(func, args, kwargs):  # none for a higher-order op
                for holder, i in self.by_ptr.get(int(x.untyped_storage().data_ptr()), ()):
                    holder.keep_copy(i)
        return func(*args, **kwargs)


class ParamGuard(_RegionMode):
    """Raises when an op of the replay reads a parameter modified in place since the
    forward (NOTE [Replay and parameters] in regions.py); ops the serving mode serves
    are not seen."""

    def __init__(self, region_name: str, modified: dict[int, str]) -> None:
        super().__init__()
        self.region_name = region_name
        self.modified = modified

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        for t in op_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and _describable(t):
                what = self.modified.get(int(t.untyped_storage().data_ptr()))
                if what is not None:
                    raise RuntimeError(
                        f"offrecomp: {what} in region {self.region_name!r} was modified in place "
                        f"after the region's forward, and replaying the region reads it ({func}), "
                        "so it would produce other activations than the forward's. Hint: update "
                        "parameters after backward (optimizer.step()), not between forward and "
                        "backward, or keep this region's activations (regions=)."
                    )
        return func(*args, **(kwargs or {}))


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
        """A collective ran in the region (NOTE [Collective regions] in runtime.py)."""

    def start(self) -> None:
        """The region's forward begins: record its ops (or, passive, start its one op)."""
        if not self.passive:
            self.__enter__()
            return
        op = _Op(name=COMPILED_FORWARD, func=None, start=time.perf_counter(), end=0.0)
        if self._events:
            op.start_ev = torch.cuda.Event(enable_timing=True)
            op.start_ev.record()
        self.ops.append(op)

    def stop(self) -> None:
        """The region's forward returned (or raised)."""
        if not self.passive:
            self.__exit__(None, None, None)
            return
        op = self.ops[0]
        op.end = time.perf_counter()
        if self._events:
            op.end_ev = torch.cuda.Event(enable_timing=True)
            op.end_ev.record()

    def storage_id(self, t: torch.Tensor, *, known: bool = False) -> int:
        """A number for the allocation behind ``t``, unique within this recording.

        NOTE: data pointers are reused as soon as an allocation is freed, so they are no
        identity over a region's forward. The storage object is (torch keeps one Python
        object per live allocation): an id is handed out per storage object, and a data
        pointer seen again with another storage object gets a new id.
        """
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        entry = self._live.get(ptr)
        if entry is not None and entry[0]() is storage:
            sid = entry[1]
        else:
            sid = self._next_sid
            self._next_sid += 1
            self._live[ptr] = (weakref.ref(storage), sid)
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
        input_sids = tuple(self.storage_id(x) for x in in_tensors if _describable(x))
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
            random = not _same_gen(before, _gen_states(self._cuda_devices))
        written: tuple[int, ...] = ()
        if tr.writes and not higher_order:  # no schema to name them: opaque anyway
            written = tuple(self.storage_id(x) for x in written_tensors(func, args, kwargs))
        outs: list[Any] = []
        for x in op_leaves(out):
            if isinstance(x, torch.Tensor):
                if _describable(x):
                    outs.append(
                        _OutMeta(
                            sid=self.storage_id(x),
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
                view=tr.view,
                writes=tr.writes,
                random=random,
                factory=not in_tensors,
                grad_enabled=torch.is_grad_enabled(),
                higher_order=higher_order,
                cast_of=_param_cast(tr.name, args, kwargs),
            )
        )
        return out

    def op_seconds(self) -> list[float]:
        out = []
        for op in self.ops:
            if op.start_ev is not None:
                out.append(op.start_ev.elapsed_time(op.end_ev) / 1e3)
            else:
                out.append(op.end - op.start)
        return out


@dataclass
class ServedOutput:
    """How replay rebuilds one tensor output of an op it does not run."""

    storage: int  # index into the region call's storages; -1: not held (placeholder)
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: torch.device


# A skipped op's flattened return value: tensors to rebuild, or plain values as recorded.
ServedEntry = ServedOutput | _Value

RUN, SERVE, PLACEHOLDER = 0, 1, 2


@dataclass
class RegionStructure:
    """What one region call looks like at op level (stable across steps of a signature)."""

    op_names: list[str]
    op_scalars: list[tuple[Any, ...]]
    op_records: list[OpRecord]
    storage_records: list[StorageRecord]
    opaque: bool
    placeholders_ok: bool
    outputs: list[list[ServedEntry] | None]
    """Per op, how to rebuild its flattened return without running it (None: cannot)."""
    servable: list[bool]
    """Per op: may be served when all its ``outputs`` storages are held."""
    view_ops: list[bool]
    save_ops: list[int] = field(default_factory=list)
    """Per save (pack index): number of ops dispatched before it."""
    param_casts: dict[int, int] = field(default_factory=dict)
    """Op index -> ``id`` of the parameter it casts, for the casts autocast caches (NOTE
    [Autocast cache])."""
    small_storages: tuple[int, ...] = ()
    """Storages made in the region that are ``external`` only for being under the
    runtime's ``min_bytes``: the most frugal plan may drop them (NOTE [Small storages])."""

    def program(self, kept: Sequence[bool], needed_saves: set[int], storage_of_save: dict[int, int]) -> list[int]:
        """What replay does with each op of the prefix it must cover.

        ``kept[i]``: storage i is held at replay time. ``needed_saves``: pack indices of the
        dropped saves to regenerate; ``storage_of_save[p]``: storage index of save p.
        """
        last = max(needed_saves)
        k_end = self.save_ops[last] if last < len(self.save_ops) else len(self.op_records)
        ops = self.op_records
        prog = [RUN] * k_end
        if self.opaque:
            return prog

        def served(k: int) -> bool:
            if not self.servable[k]:
                return False
            outs = ops[k].outputs
            return bool(outs) and all(0 <= s < len(kept) and kept[s] for s in outs)

        if not self.placeholders_ok:
            return [SERVE if served(k) else RUN for k in range(k_end)]
        run = [False] * k_end
        work: list[int] = []
        for p in needed_saves:
            sidx = storage_of_save.get(p, -1)
            prod = self.storage_records[sidx].producer_op if 0 <= sidx < len(self.storage_records) else -1
            if prod < 0:
                return [SERVE if served(k) else RUN for k in range(k_end)]  # unknown origin: be safe
            if prod < k_end:
                work.append(prod)
        for k in range(k_end):
            if ops[k].sink:
                work.append(k)
            elif self.view_ops[k]:
                run[k] = True  # views run (free) but read no values: reads not followed
        done = [False] * k_end
        serve = [False] * k_end
        while work:
            k = work.pop()
            if k >= k_end or done[k]:
                continue
            done[k] = True
            if self.view_ops[k]:
                continue
            if not ops[k].sink and served(k):
                serve[k] = True
                continue
            run[k] = True
            reads = ops[k].reads or ()
            work.extend(r for r in reads if 0 <= r < k_end and not done[r])
        for k in range(k_end):
            if run[k]:
                prog[k] = RUN
            elif serve[k] or served(k):
                prog[k] = SERVE
            elif self.outputs[k] is not None:
                prog[k] = PLACEHOLDER
            else:
                prog[k] = RUN
        return prog


@dataclass
class SaveInfo:
    """What the hooks saw for one save during the recorded forward."""

    storage: int
    ops_before: int
    time: float


def build_structure(
    rec: OpRecorder,
    saves: Sequence[SaveInfo],
    storage_sids: Sequence[int | None],
    storage_nbytes: Sequence[int],
    storage_kinds: Sequence[str],
    op_seconds: Sequence[float],
    region_start: float,
    *,
    compiled: bool = False,
) -> RegionStructure:
    """Combine the op trace with the saves into a ``RegionStructure``.

    ``storage_sids[i]`` is the recorder's storage id of the region call's storage i
    (inputs first, then activations in order of first save).
    """
    sid_to_storage = {sid: i for i, sid in enumerate(storage_sids) if sid is not None}
    written: set[int] = set()
    for op in rec.ops:
        written.update(op.written_sids)
    opaque = (
        compiled
        or any(op.higher_order for op in rec.ops)
        or (not rec.grad_enabled_at_entry)
        or any(not op.grad_enabled for op in rec.ops)
        or any(_branches_on_data(op) for op in rec.ops)
    )

    creator: dict[int, int] = {}  # sid -> op that allocated it
    producer = [-1] * len(storage_sids)
    placeholders_ok = not opaque
    op_records: list[OpRecord] = []
    outputs_all: list[list[ServedEntry] | None] = []
    servable: list[bool] = []
    view_ops: list[bool] = []
    if rec.passive:  # NOTE [Compiled regions]: op 0 is the compiled forward; it makes every activation
        made = tuple(i for i, kind in enumerate(storage_kinds) if kind == "activation")
        for i in made:
            producer[i] = 0
        op_records.append(
            OpRecord(seconds=float(op_seconds[0]), skippable=False, outputs=made, name=COMPILED_FORWARD,
                     reads=None, sink=True, view=False)
        )
        outputs_all.append(None)
        servable.append(False)
        view_ops.append(False)
    for k, op in enumerate(() if rec.passive else rec.ops):
        reads: list[int] = []
        for sid in op.read_sids:
            c = creator.get(sid)
            if c is not None:
                reads.append(c)
            elif sid not in rec.known_sids:
                placeholders_ok = False  # a value from a path the dispatcher cannot see
        outputs: list[int] = []
        entries: list[ServedEntry] = []
        rebuildable = _returns_rebuildable(op.func)
        held = True
        writes_foreign = any(sid not in creator or sid in rec.known_sids for sid in op.written_sids)
        for o in op.outputs:
            if isinstance(o, _Value):
                entries.append(o)
                continue
            if not isinstance(o, _OutMeta):
                rebuildable = False
                outputs.append(-1)
                continue
            sidx = sid_to_storage.get(o.sid, -1)
            outputs.append(sidx)
            fresh = o.sid not in op.input_sids and o.sid not in creator
            if fresh:
                creator[o.sid] = k
                if sidx >= 0 and producer[sidx] < 0:
                    producer[sidx] = k
            if o.numel == 0 or sidx < 0 or o.sid in written:
                held = False
            entries.append(ServedOutput(sidx if (o.numel and sidx >= 0) else -1, o.size, o.stride,
                                        o.offset if sidx >= 0 else 0, o.dtype, o.device))
        # _unsafe_view and friends alias an input without saying so in their schema.
        aliasing = op.view or any(isinstance(o, _OutMeta) and o.sid in op.input_sids for o in op.outputs)
        has_value_out = any(isinstance(e, _Value) for e in entries) and not any(
            isinstance(e, ServedOutput) for e in entries
        )
        pure_view = aliasing and not op.writes
        sink = not pure_view and (op.random or op.writes or writes_foreign or has_value_out or not rebuildable)
        can_serve = (
            not opaque and rebuildable and not aliasing and not op.writes and not op.random and held
            and any(isinstance(e, ServedOutput) and e.storage >= 0 for e in entries)
        )
        op_records.append(
            OpRecord(
                seconds=float(op_seconds[k]),
                skippable=can_serve,
                outputs=tuple(outputs),
                name=op.name,
                reads=None if opaque else tuple(sorted(set(reads))),
                sink=sink,
                view=pure_view,
            )
        )
        outputs_all.append(entries if rebuildable and not aliasing else None)
        servable.append(can_serve)
        view_ops.append(pure_view)

    first: dict[int, SaveInfo] = {}
    last: dict[int, SaveInfo] = {}
    counts = [0] * len(storage_sids)
    for s in saves:
        if s.storage < 0:
            continue
        first.setdefault(s.storage, s)
        last[s.storage] = s
        counts[s.storage] += 1
    storages: list[StorageRecord] = []
    for i in range(len(storage_sids)):
        kind = storage_kinds[i]
        if kind == "activation" and producer[i] < 0:
            kind = "external"
        f = first.get(i)
        la = last.get(i)
        storages.append(
            StorageRecord(
                nbytes=int(storage_nbytes[i]),
                kind=kind,  # type: ignore[arg-type]
                producer_op=producer[i],
                first_save_op=f.ops_before if f else 0,
                last_save_op=la.ops_before if la else 0,
                offset_seconds=max(0.0, (f.time - region_start)) if f else 0.0,
                saves=counts[i],
            )
        )
    if not placeholders_ok and not opaque:
        for r in op_records:
            r.reads = None  # planner: prefix semantics
    return RegionStructure(
        op_names=[op.name for op in rec.ops],
        op_scalars=[op.scalars for op in rec.ops],
        op_records=op_records,
        storage_records=storages,
        opaque=opaque,
        placeholders_ok=placeholders_ok,
        outputs=outputs_all,
        servable=servable,
        view_ops=view_ops,
        save_ops=[s.ops_before for s in saves],
        param_casts={k: op.cast_of for k, op in enumerate(rec.ops) if op.cast_of},
    )


class ServingMode(_RegionMode):
    """During replay: run, serve or stub each op per the program; check the op sequence."""

    def __init__(
        self,
        *,
        region_name: str,
        structure: RegionStructure,
        program: Sequence[int],
        storage_tensors: dict[int, Any],
    ) -> None:
        super().__init__()
        self.region_name = region_name
        self.structure = structure
        self.program = program
        self.storage_tensors = storage_tensors
        self.index = 0
        self.ran = 0  # compute ops run (views excluded)
        self.served = 0
        self.stubbed = 0
        # NOTE [Placeholder guard]: addresses of the placeholders' storages while they
        # live (each leaves the set when its storage is freed, so a later allocation at
        # that address is not mistaken for one; holding them instead would grow the
        # replay's memory). No op that runs may read one's values (ops that read only
        # shape and dtype, like empty_like in dropout, may take one), and no save may
        # capture one: if either happens, this pass took another path through the
        # region's code than the recording, and the replay is redone plainly.
        self._placeholders: set[int] = set()
        self.diverged: ReplayDivergedError | None = None
        """The divergence this replay raised (here or in its pack hook), in case code
        between it and the replay (as TorchScript does) turns it into another error."""

    def diverge(self, msg: str, *, cast: bool = False) -> ReplayDivergedError:
        """Record a divergence; the caller raises what it returns. ``cast``: at a parameter
        cast (NOTE [Autocast cache])."""
        self.diverged = (CastDivergedError if cast else ReplayDivergedError)(msg)
        return self.diverged

    def is_placeholder(self, t: torch.Tensor) -> bool:
        """True when ``t`` lies in a placeholder's storage (its values are garbage)."""
        if not self._placeholders or t.numel() == 0 or not _describable(t):
            return False
        return t.untyped_storage().data_ptr() in self._placeholders

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _is_internal():
            return func(*args, **kwargs)
        k = self.index
        self.index += 1
        st = self.structure
        expected = st.op_names[k] if k < len(st.op_names) else None
        name = op_name(func)
        if name == _TO_COPY:
            cast_of = _param_cast(name, args, kwargs)
            recorded = st.param_casts.get(k, 0)
            if cast_of and cast_of != recorded:
                # NOTE [Autocast cache]: the forward found this cast in autocast's cache
                self.index = k
                return func(*args, **kwargs)
            if recorded and not cast_of:
                raise self.diverge(
                    f"offrecomp: replay of region {self.region_name!r} diverged at op {k}: the "
                    "forward cast a parameter there, the replay casts another tensor",
                    cast=True,
                )
        if expected != name:
            raise self.diverge(
                f"offrecomp: replay of region {self.region_name!r} diverged at op {k}: the forward "
                f"ran {expected or '<nothing>'}, the replay ran {name}",
                cast=k in st.param_casts,  # a recorded parameter cast the replay does not make
            )
        action = self.program[k] if k < len(self.program) else RUN
        if action == RUN:
            leaves = op_leaves((args, kwargs))
            scalars = _scalars_of(leaves)
            if scalars != st.op_scalars[k]:
                raise self.diverge(
                    f"offrecomp: replay of region {self.region_name!r} diverged at op {k} ({name}): "
                    f"non-tensor arguments {scalars} differ from the forward's "
                    f"{st.op_scalars[k]}"
                )
            if not st.view_ops[k]:
                self.ran += 1
                if self._placeholders and not _traits(func).metadata_only:  # NOTE [Placeholder guard]
                    for x in leaves:
                        if isinstance(x, torch.Tensor) and self.is_placeholder(x):
                            raise self.diverge(
                                f"offrecomp: replay of region {self.region_name!r} diverged at "
                                f"op {k} ({name}): it reads a tensor the recording did not need"
                            )
            return func(*args, **kwargs)
        outs = st.outputs[k]
        assert outs is not None
        rebuilt: list[Any] = []
        for o in outs:
            if isinstance(o, _Value):
                rebuilt.append(o.value)
            elif action == SERVE and o.storage >= 0:
                base = self.storage_tensors[o.storage]  # an UntypedStorage
                t = torch.empty(0, dtype=o.dtype, device=base.device)
                t.set_(base, o.offset, o.size, o.stride)
                rebuilt.append(t)
            else:
                t = torch.empty_strided(o.size, o.stride, dtype=o.dtype, device=o.device)
                if t.numel():
                    storage = t.untyped_storage()
                    ptr = storage.data_ptr()
                    self._placeholders.add(ptr)
                    weakref.finalize(storage, self._placeholders.discard, ptr)
                rebuilt.append(t)
        if action == SERVE:
            self.served += 1
        else:
            self.stubbed += 1
        return _unflatten_like(func, rebuilt)


# NOTE [Autocast cache]
# Under autocast, the first op that needs a float32 parameter in bf16/fp16 casts it
# (aten._to_copy) and autocast caches the cast until the outermost autocast context
# exits; later uses of that parameter in the context dispatch no cast. A block that uses
# a parameter an earlier block already cast (weights shared or tied between blocks, a
# block called twice, two forwards in one autocast context) records no cast, and a
# replay that casts again dispatches one op more than the recording. Replays run with
# the cache off (``regions.autocast_contexts``), so they dispatch every cast: never
# fewer than the recording, even inside the forward's context (backward called under
# autocast, where the cache still holds the forward's casts). There the cache also
# kept, until the context exited, a cast of each replay's inputs (fresh leaves that
# require grad, which autocast caches): a bf16 copy of every replayed block's input.
# Replays of compiled code keep the forward's setting, which the compiled graph guards
# on (as do replays of forwards without autocast, where it decides nothing; a compiled
# function called in a block under autocast compiles once more for its replays). The
# recording marks each parameter cast with its parameter; the serving mode runs a
# parameter cast that is not the recorded op at its place without consuming that op
# (never serving it: running it is always right). Matching by name alone was not enough: an extra cast of a bias took
# the place of the recorded cast of the input and was served the input's bytes. Plain
# replays check nothing.
_TO_COPY = "aten._to_copy.default"


def _param_cast(name: str, args: Any, kwargs: dict[str, Any]) -> int:
    """``id`` of the parameter when the op is a cast autocast caches (a float32
    parameter to a lower floating precision), else 0. A replay's region inputs are
    fresh leaves that require grad, so "a parameter" is what tells the casts apart, not
    "a leaf" (inside autocast's kernel its keys are excluded, so
    ``torch.is_autocast_enabled`` reads False here). Running such a cast is always
    safe: it is a pure function of the parameter."""
    if name != _TO_COPY or not args:
        return 0
    t = args[0]
    if not isinstance(t, torch.nn.Parameter) or t.dtype != torch.float32 or not t.requires_grad:
        return 0
    return id(t) if kwargs.get("dtype") in (torch.bfloat16, torch.float16) else 0


def _unflatten_like(func: Any, flat: list[Any]) -> Any:
    """Rebuild an op's return value from its flattened outputs."""
    returns = func._schema.returns
    if len(returns) == 1:
        if str(returns[0].type) == "Tensor[]":
            return list(flat)
        return flat[0]
    return tuple(flat)
