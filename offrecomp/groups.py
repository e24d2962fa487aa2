"""Offload groups as the runtime uses them: the open group of each region call, its
issue at the call's exit, its reload on the first unpack, and its release.

The engine (offload.py) moves bytes; this part ties its groups to region calls and to
the pass's statistics, and owns the engine's lifetime (NOTE [Pool lifetime]).

NOTE [Offload groups]
The unit of transfer is a region call's group of offloaded storages (as in
TransformerEngine's and Megatron's offloaders), never a single tensor: the pack hook
appends a storage to its call's open group, the group is copied to host at the call's
exit under one event, reloaded in backward as one buffer on the first unpack of any of
its saves (with the next groups prefetched), and released as a whole once each of its
saves was unpacked. Saves outside every region form runs: the run since the last region
call is issued when the next region call begins, or when backward begins, so it never
joins a region's group. A group the pinned pool refuses at issue keeps its storages
(fallback offload_to_keep). A root storage saved again after its run was issued is a new
storage: the copy holds its bytes of then, and a legal in-place write may have come
since. Backwards on two threads may both reach the root's last run: its issue runs once,
under a lock, and the group stays the call's until its storages' placements are final,
so the other thread waits for it rather than reading a group not laid out yet. A root
save joins under that lock too: the next forward may begin on one thread while the last
one's backward starts on another and issues the root's run the save would join.

NOTE [Planned release]
The engine's polls let go of a group's sources once query() says its copy landed, in
host time: when the host runs ahead of the device (a device-bound forward), the last
poll of forward comes before most copies land, and their sources stay allocated deep
into backward, over the budget the plan was solved for. Under a plan each group
carries ``release_at``: the unit of the step at whose end the simulator frees it, the
first unit to end after its copy is predicted to land, or backward's start, which then
waits for the last copies (scheduler.timeline). The runtime calls release_due() at the
end of each unit (a region call's entry ends a gap, its exit ends the call, and
backward's start ends forward): the due groups' sources go there, and where query()
says a copy has not landed yet, compute first waits on it (edge 2 of NOTE [Stream
ordering] in offload.py), which costs the device nothing when the prediction holds.
The memory is then free, in the allocator's stream order, where the plan counted on
it, whatever the host's lead. Units are numbered as the profile's (``2k`` the gap
before region call ``k``, ``2k + 1`` the call), which a pass that follows its
profile's calls matches; on any other pass a release comes early or late, never
unsafely. A user's plan (``rt.set_plan``) gets its releases from its timeline on the
signature's profile.

NOTE [Copies under inference mode]
A backward run under ``torch.inference_mode()`` issues reloads (and a root run's copy)
there: buffers and views made in inference mode are inference tensors, and a copy into
them outside it (the emulated side stream's worker thread, a reused reload buffer in a
later step) raises. The engine is entered with inference mode off.

NOTE [Pool lifetime]
Pinning host memory is slow (cudaHostAlloc, and it synchronises the device), so the
pinned pool is the runtime's, not the context's: a normal exit keeps it for the next
entry (loops that enter the runtime once per step would otherwise re-pin gigabytes every
step). It is freed by close(), when the runtime is garbage collected, and after an exit
by exception; in each case only once no saved tensor still needs it (a graph kept alive
past exit): the last freed offload group closes it then.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch.nn.parameter import is_lazy

from offrecomp import _torch_compat as tc
from offrecomp.config import Config, format_bytes
from offrecomp.handles import interned_stride
from offrecomp.measure import DeviceClock
from offrecomp.state import PassState, RegionCall, Stage, StorageRec
from offrecomp.transfer import BACKWARD_START, NOT_PLANNED, dense_from_start
from scheduler.plan import Placement

if TYPE_CHECKING:
    from offrecomp.offload import OffloadEngine, OffloadStats
    from offrecomp.transfer import Group

log = logging.getLogger(__name__)

__all__ = ["TYPED_DTYPES", "OffloadGroups", "may_alias_parameter", "reads_bytes_as_stored"]

KEEP = Placement.KEEP
_T = TypeVar("_T")
#: Dtypes whose copy moves every byte as it is (NOTE [Typed sources] in transfer.py): a
#: bool copy writes 1 for every nonzero byte, and sub-byte and other shell dtypes have
#: no copy kernel.
TYPED_DTYPES = _TYPED = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
})
_IS_CUDA = operator.attrgetter("is_cuda")
_IS_CPU = operator.attrgetter("is_cpu")


def reads_bytes_as_stored(t: torch.Tensor) -> bool:
    """Offload moves bytes only: a view that reads its storage negated or conjugated
    (``z.conj().imag``) would come back without that bit, so such a save or region input
    stays as it is, also when its storage is offloaded for another view."""
    return not (t.is_neg() or t.is_conj())


def may_alias_parameter(t: torch.Tensor, base: torch.Tensor | None) -> bool:
    """Can ``t`` (``base``: ``t._base``) lie over a parameter's storage without being a
    view of the parameter: a leaf, or a view of one (NOTE [Parameter storages])?"""
    return t.is_leaf or (base is not None and base.is_leaf)


# NOTE [Free from finalisers]
# Callers free groups from finalisers (when autograd drops the last saved tensor of a region call),
# which can run at any allocation: on another thread while this one holds the engine lock (the
# emulated backend's workers, autograd's device threads), or re-entrantly in the middle of an
# engine call on this thread. ``OffloadEngine.free`` therefore never waits for the lock and never
# mutates state under a running call: if the lock is held, by another thread or by this one inside
# an engine call, the group goes to `_pending_frees` (a deque: appends are atomic), which the next
# engine call made from outside the engine drains before it does anything else.

# NOTE [Engine lock]
# Engine calls hold the lock with ``with`` on the RLock itself, whose enter and exit are C calls:
# no interrupt (Ctrl-C, a watchdog handler's exception) lands in them, so none leaves it held (a
# Python ``__exit__`` cut short at its first instruction would: every later free queued for good, a
# backward on another thread waiting forever). Whether this thread is inside an engine call is the
# lock's ``_is_owned()``.

# NOTE [Frees on a copy worker]
# A finaliser, and so a free, may also run on a thread that does a stream's work: the emulated
# backend's copy workers run Python, and a collection their allocations start may drop the last
# saved tensor of a region call; so do the jobs a thread runs for a stream it waits on or drains
# (before a fork, at exit: NOTE [Emulated waits] in backends.py). A free that waited there would
# wait on its own stream: a prefetched reload not waited on yet (edge 6) is fired by the H2D
# worker, which is the thread waiting, and the step would hang holding the engine lock. So a free
# never waits on a reload: one that has not landed keeps its buffer, as the freed group keeps its
# host block, until ``_return_blocks`` sees it landed; its memory is reused only after the copy, as
# the wait would have ordered it. There, a free leaves the sources of a D2H copy to the next poll
# (NOTE [Freed sources]) and, dropping a closing runtime's last group, closes its engine on a
# thread of its own (on a worker) or leaves it to a later call (in a job another thread runs):
# closing waits on every stream.

class OffloadGroups:
    """The runtime's offload engine (created on first use) and its region-call groups."""

    def __init__(self, config: Config, device: DeviceClock) -> None:
        self._config = config
        self._device = device
        self.engine: OffloadEngine | None = None
        self.live_groups = 0  # opened and not yet freed
        self.closing = False  # free the pool once nothing needs it
        self.entered = False  # the runtime is entered (its pool stays)
        self._on_device: Callable[[torch.Tensor], bool] | None = None  # set at the first join
        self._issuing = threading.RLock()  # one issue at a time (two threads' backwards)
        self.parameters: Callable[[], Iterable[torch.Tensor]] = tuple
        """The model's parameters (set by the runtime): NOTE [Parameter storages]."""
        self._param_ptrs: tuple[int, frozenset[int]] = (-1, frozenset())  # (pass index, storages)
        self._host_limit: int | None = None

    # ------------------------------------------------------------ the engine

    def device_moved(self) -> None:
        """The runtime's device changed, no group being live (NOTE [Model devices] in
        context.py): the next join reads it again, and an engine on the old device goes."""
        self._on_device = None
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()

    def get_engine(self) -> OffloadEngine:
        if self.engine is None:
            from offrecomp.backends import get_backend
            from offrecomp.offload import OffloadEngine
            device = self._device.device or torch.device("cpu")
            host_limit = self.host_limit_bytes()
            self.engine = OffloadEngine(
                backend=get_backend(device), host_limit_bytes=host_limit, prefetch=self._config.prefetch
            )
            log.info("offrecomp: offload engine on %s, host limit %s", device, format_bytes(host_limit))
        return self.engine

    def host_limit_bytes(self) -> int:
        """The pinned host bytes the pool may hold, read once (the default is a share of
        what is available then): the engine's limit and the planner's, the same figure
        (NOTE [Host limit in plans] in planning/profiling.py)."""
        if self._host_limit is None:
            from offrecomp.pool import host_limit_of

            self._host_limit = host_limit_of(self._config.host_limit)
        return self._host_limit

    def end_step(self) -> OffloadStats | None:
        return self.engine.end_step() if self.engine is not None else None

    @property
    def device_bytes(self) -> int:
        """Device bytes the engine holds: copies not landed yet and reloads in use."""
        return self.engine.device_bytes if self.engine is not None else 0

    # ---------------------------------------------------------------- groups

    def join(
        self, call: RegionCall, rec: StorageRec, t: torch.Tensor, storage: Any, dtype: torch.dtype, covers: bool
    ) -> bool | None:
        """``_join`` (below), under the issue lock for a root call (NOTE [Offload groups])."""
        if call.ordinal < 0:
            with self._issuing:
                return self._join(call, rec, t, storage, dtype, covers)
        return self._join(call, rec, t, storage, dtype, covers)

    def _join(
        self, call: RegionCall, rec: StorageRec, t: torch.Tensor, storage: Any, dtype: torch.dtype, covers: bool
    ) -> bool | None:
        """Add the OFFLOAD storage ``rec`` (behind ``t``, of ``dtype``; ``covers``: ``t``
        has every byte of it) to ``call``'s open group, if it can move and the pinned
        pool has room. None: it cannot move (empty; not of the runtime's device: on a GPU
        run, a CPU tensor is in host memory already; or a view that reads it negated or
        conjugated, as offload moves bytes only); False: the pool has no room; True: it
        joined, as an alias of ``t`` when ``t`` covers it contiguously, or of the
        view's base when that does (NOTE [Typed sources] in transfer.py), else as the
        storage."""
        on_device = self._on_device or self._device_check()
        # reads_bytes_as_stored(t), inline: a conjugate bit only ever sits on a complex tensor
        if not rec.nbytes or not on_device(t) or t.is_neg() or (dtype.is_complex and t.is_conj()):
            return None  # an empty storage has nothing to move (a group of them none to copy)
        base = t._base
        if may_alias_parameter(t, base) and rec.ptr in self._param_storages(call):
            return None  # NOTE [Parameter storages]
        engine = self.engine or self.get_engine()
        if covers and dtype in _TYPED and t.is_contiguous():
            # NOTE [Typed sources] in transfer.py; a detached alias shares t's version
            # counter (NOTE [Writes after a save] in handles.py)
            return self._add(call, rec, engine, t.detach())
        if (
            type(base) is torch.Tensor and base.dtype in _TYPED and base.nbytes == rec.nbytes
            and base.storage_offset() == 0 and base.is_contiguous() and not base.is_neg()
        ):  # a view of part of the storage, or a permuted one, over a base that covers it
            return self._add(call, rec, engine, base.detach())
        if covers and dtype in _TYPED and dense_from_start(t):  # permuted, no base (attention's output)
            return self._add(call, rec, engine, t.detach(), interned_stride(t.stride()))
        return self._add(call, rec, engine, storage)

    def join_typed(
        self, call: RegionCall, t: torch.Tensor, nbytes: int, ptr: int, may_alias: bool
    ) -> tuple[Group, int] | bool | None:
        """``_join_typed`` (below), under the issue lock for a root call (NOTE [Offload
        groups])."""
        if call.ordinal < 0:
            with self._issuing:
                return self._join_typed(call, t, nbytes, ptr, may_alias)
        return self._join_typed(call, t, nbytes, ptr, may_alias)

    def _join_typed(
        self, call: RegionCall, t: torch.Tensor, nbytes: int, ptr: int, may_alias: bool
    ) -> tuple[Group, int] | bool | None:
        """``join`` for a contiguous ``t`` of a dtype of ``TYPED_DTYPES`` that covers its
        storage (``nbytes`` at ``ptr``) from its first byte, typed (``may_alias``:
        ``may_alias_parameter(t, t._base)``), before its record is made: the group it
        joined (read once: another thread's backward may issue ``call.group``, a root's,
        meanwhile) and its slot there; False: the pool has no room (counted); None,
        having changed nothing: ``join`` must decide (a tensor that cannot move or over a
        parameter's storage, or no engine yet: NOTE [Offload fast path] in hooks.py)."""
        on_device = self._on_device
        engine = self.engine
        if (
            on_device is None or engine is None or not on_device(t) or t.is_neg()
            or (may_alias and ptr in self._param_storages(call))  # NOTE [Parameter storages]
        ):
            return None
        # NOTE [Typed sources] in transfer.py; a detached alias shares t's version
        # counter (NOTE [Writes after a save] in handles.py)
        group = call.group
        if group is not None:
            slot = engine.add(group, t.detach(), nbytes)
            return (group, slot) if slot >= 0 else False
        group = self._open(call, engine, t.device)
        slot = engine.add(group, t.detach(), nbytes)
        if slot < 0:
            self._close_empty(call, group)
            return False
        return group, slot

    def _add(
        self, call: RegionCall, rec: StorageRec, engine: OffloadEngine, source: Any,
        stride: tuple[int, ...] | None = None,
    ) -> bool:
        """Add ``rec``'s storage (``source``: a typed alias, of ``stride`` if not
        contiguous, or the storage: ``OffloadEngine.add``) to ``call``'s open group,
        opened now if it has none: True, or False where the pool has no room (a group
        opened for it is closed again)."""
        group = opened = call.group
        if group is None:
            group = self._open(call, engine, source.device)
        slot = engine.add(group, source, rec.nbytes, stride)
        if slot < 0:
            if opened is None:
                self._close_empty(call, group)
            return False
        rec.group = group
        rec.slot = slot
        return True

    def _device_check(self) -> Callable[[torch.Tensor], bool]:
        """Is a tensor on the runtime's device (so in device memory, for a GPU run)?"""
        device = self._device.device
        kind = device.type if device is not None else "cpu"
        # is_cuda and is_cpu are flags; t.device makes a device object (a third of a µs)
        self._on_device = (
            _IS_CUDA if kind == "cuda" else _IS_CPU if kind == "cpu" else lambda x: x.device.type == kind
        )
        return self._on_device

    def _open(self, call: RegionCall, engine: OffloadEngine, device: torch.device) -> Group:
        """A new open group for ``call``'s offloaded storages."""
        p = call.pass_state
        plan = p.plan if p is not None else None
        depth = plan.prefetch_regions if plan is not None else None  # NOTE [Chosen prefetch] (scheduler)
        group = call.group = engine.open_group(len(p.calls) if p is not None else 0, device, depth)
        call.groups.append(group)
        group.live = True
        self.live_groups += 1
        return group

    def _close_empty(self, call: RegionCall, group: Group) -> None:
        """A group opened for a storage that did not join stays empty: a root call may
        never release it."""
        call.group = None
        call.groups.remove(group)
        self.free(group)

    def _param_storages(self, call: RegionCall) -> frozenset[int]:
        """The storages of the model's parameters, read once per pass (again at each
        call while a lazy module's parameters are not made yet)."""
        p = call.pass_state
        index = p.index if p is not None else -1
        if index >= 0 and self._param_ptrs[0] == index:
            return self._param_ptrs[1]
        ptrs = set()
        for q in self.parameters():
            if is_lazy(q):  # nn.LazyLinear's before its first forward: no storage yet
                index = -1
                continue
            try:
                ptrs.add(int(q.untyped_storage().data_ptr()))
            except (RuntimeError, NotImplementedError):  # a subclass or layout without one
                continue
        self._param_ptrs = (index, frozenset(ptrs))
        return self._param_ptrs[1]

    # NOTE [Parameter storages]
    # A tensor over a parameter's storage that is not a view of it (``weight.data``,
    # ``weight.data.t()``) has its own version counter: a parameter updated in place
    # between forward and backward (an optimizer or EMA step under no_grad) is legal for
    # autograd, and backward reads the new values. A copy to host would hold the values
    # of whenever it ran. Such a save is never offloaded: it is kept, as it is in plain
    # autograd. Such an alias is a leaf (no grad_fn), or a view of one
    # (``weight.data.requires_grad_().t()``: a grad_fn, and a plain leaf as its base), so
    # leaves and views of leaves look up the parameters' storages, read once per pass; an
    # activation and its views (a base with a grad_fn) never do.

    def issue(self, call: RegionCall) -> None:
        """Copy ``call``'s open group to host (its exit, or the end of a root run); a group
        the pool refuses keeps its storages. The group stays ``call.group`` until its
        storages' placements are final: a backward on another thread that unpacks one of
        them meanwhile calls this too, and waits here (NOTE [Offload groups])."""
        with self._issuing:
            group = call.group
            if group is None:
                return
            try:
                _inference_mode_off(self._issue, call, group)
            finally:
                call.group = None

    def _issue(self, call: RegionCall, group: Group) -> None:
        p = call.pass_state
        if p is not None and self.engine is not None:
            # the open group's storages are device bytes until their copy lands: the
            # most they were, as nothing the engine holds shrinks while a group fills
            p.stats.sample(self.engine.device_bytes)
        sources = list(group.sources)
        if self.engine is not None and self.engine.issue(group, _release_at(p, call)):
            return
        for rec in call.storages:
            if rec.group is not group:
                continue
            rec.group = None
            rec.placement = KEEP
            source = sources[rec.slot]
            if isinstance(source, torch.Tensor):
                rec.tensor = source
            else:
                rec.tensor = torch.empty(0, dtype=torch.uint8, device=source.device).set_(source)
            if p is not None:
                p.stats.offloaded_bytes -= rec.nbytes
                p.stats.fallback("offload_to_keep")
                p.stats.keep(rec)
                rec.resident_until_death()  # NOTE [Resident bytes] in state.py

    def release_due(self, p: PassState, boundary: int) -> None:
        """The end of unit ``boundary`` of pass ``p``, whose plan has releases: let go of
        the groups it frees there (NOTE [Planned release])."""
        engine = self.engine
        if engine is not None:
            # what the sources held until now counts in the pass's peak, as the plan's does
            p.stats.sample(engine.device_bytes)
            engine.release_due(boundary)

    def fetch(self, group: Group, call: RegionCall, serve: bool = False) -> torch.Tensor | None:
        """The device buffer of ``group`` (one of ``call``'s), reloaded on first use; with
        ``serve``, None where its held sources are served instead (``group.served``: NOTE
        [Served groups] in transfer.py)."""
        buf = group.ready
        if buf is not None:  # compute already waited on this reload
            return buf
        engine = self.engine
        if engine is None:
            raise RuntimeError(
                "offrecomp: the offload engine of this saved tensor's runtime was closed while "
                "the tensor still needed it"
            )
        buf = _inference_mode_off(engine.fetch, group, serve)
        p = call.pass_state
        if p is not None:
            p.backward_reached(call.ordinal)
            p.stats.sample(engine.device_bytes)
            if p.stage is Stage.DONE:
                self._release_after_later_backward(p)
        return buf

    def _release_after_later_backward(self, p: PassState) -> None:
        """A backward of the finished pass ``p`` (its graph kept, ``retain_graph``) fetched
        one of its groups: at that backward's end, its reloads go (NOTE [Reloads at a
        backward's end]); once per backward."""
        task = tc.current_graph_task_id()
        if task == -1 or task == p.later_backward_task:
            return
        p.later_backward_task = task
        with contextlib.suppress(RuntimeError):  # no backward running on this thread after all
            tc.queue_backward_callback(functools.partial(self._later_backward_done, weakref.ref(p)))

    def _later_backward_done(self, pref: weakref.ref[PassState]) -> None:
        p, engine = pref(), self.engine
        if p is not None and engine is not None and not engine.closed:
            self.release_reloads(p)
            engine.poll()  # the released buffers no tensor uses any more go now (no step end follows)

    def fetch_or_serve(self, group: Group, call: RegionCall) -> torch.Tensor | list[torch.Tensor]:
        """``group``'s (one of ``call``'s) served sources, a list (NOTE [Served groups] in
        transfer.py), or else its reload's buffer, a tensor; fetched either way."""
        served = group.served
        if served is not None and group.waited:  # handed out since its first fetch
            return served
        buf = self.fetch(group, call, serve=True)
        if buf is not None:
            return buf
        served = group.served
        if served is not None:
            return served
        buf = self.fetch(group, call)  # another thread's backward let go of it meanwhile
        assert buf is not None
        return buf

    def slot_now(self, group: Group, call: RegionCall, slot: int) -> tuple[Any, int, int | None]:
        """Where ``slot`` of ``group`` (one of ``call``'s) is on the device now: the
        storage, the byte of it where the slot's storage begins, and the slot's source's
        version as last seen (None: not seen yet). Its served source, or its reload."""
        got = self.fetch_or_serve(group, call)
        if isinstance(got, list):
            source = got[slot]
            return source.untyped_storage(), 0, source._version
        versions = group.versions
        return got.untyped_storage(), group.offsets[slot], versions[slot] if slot < len(versions) else None

    def release_device(self, group: Group) -> None:
        if self.engine is not None:
            self.engine.release_device(group)

    def release_reloads(self, p: PassState) -> None:
        """``p``'s backward is over: let go of its groups' reload buffers that saves no
        node read still held (NOTE [Reloads at a backward's end])."""
        engine = self.engine
        if engine is None or not engine.device_bytes:
            return
        seen: set[int] = set()
        for call in p.all_calls():
            for rec in call.storages:
                group = rec.group
                if group is not None and group.holds_reload and id(group) not in seen:
                    seen.add(id(group))
                    engine.release_device(group)

    def free(self, group: Group) -> None:
        if self.engine is None:
            return
        try:
            self.engine.free(group)
        finally:
            if group.live:  # once: a release an interrupt cut short frees its groups again
                group.live = False
                self.live_groups -= 1
            self.maybe_close()

    def settle(self) -> None:
        """At exit: drop the device sources the engine still holds for copies in flight
        (a last forward whose graph was dropped without backward), waiting for them."""
        engine = self.engine
        if engine is not None and not engine.closed and engine.stash_bytes:
            engine.synchronize()

    def maybe_close(self) -> None:
        """Close the engine when the runtime is closing, not entered, and no saved tensor
        needs the pool (NOTE [Pool lifetime])."""
        if self.engine is not None and self.closing and not self.entered and self.live_groups <= 0:
            backend = self.engine.backend
            if backend.in_stream_work() and not backend.on_side_thread():
                return  # a stream's job this thread runs (a drain): a later call closes it
            engine, self.engine = self.engine, None
            if backend.on_side_thread():  # a finaliser on a copy worker (NOTE [Frees on a copy worker])
                threading.Thread(target=engine.close, name="offrecomp-close", daemon=True).start()
            else:
                engine.close()


def _inference_mode_off(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` with inference mode off (NOTE [Copies under inference mode]); no
    context is entered when it is off already."""
    if torch.is_inference_mode_enabled():
        with torch.inference_mode(False):
            return fn(*args)
    return fn(*args)


def _release_at(p: PassState | None, call: RegionCall) -> int:
    """The unit at whose end the plan of ``p`` lets go of ``call``'s group being issued
    (NOTE [Planned release]): a region call's own unit, or for the root's run the gap
    it closes, the one before the next call."""
    if p is None or not p.releases:
        return NOT_PLANNED
    unit = 2 * len(p.calls) if call.is_root else 2 * call.ordinal + 1
    return p.releases[unit] if unit < len(p.releases) else BACKWARD_START


# NOTE [Reloads at a backward's end]
# A group's reload buffer goes when each of its live saves was unpacked since the reload.
# A save no backward node reads (an activation the block keeps on itself, or a side loss
# the step's loss does not use: that branch's nodes never run) keeps its handle alive and
# never unpacks, so its group's buffer would stay on the device after the backward, until
# the graph holding the handle dies (the next forward rebinding the attribute). When a
# pass's backward is over, its groups' reloads go, prefetched ones never fetched too; a
# later read of such a save (the graph differentiated after all) reloads its group. A
# later backward of a finished pass (its graph kept, ``retain_graph``) lets go of its
# reloads at its end too: one that stops inside the blocks (``autograd.grad`` of an
# inner tensor) leaves the group it stopped in unread, which would stay on the device
# until the graph dies, one more group for each such backward.
