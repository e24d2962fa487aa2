"""Regenerating dropped saves: the replay of a region call that the unpack of a dropped
save asks for, plain or under the serving dispatch mode, and what a divergence means.

``Regenerator.replay`` picks the replay's program from the call's recording (the ops it
runs, serves or stubs: NOTE [Which ops replay runs]), runs it (replay.py), and falls back
to a plain replay where the recording no longer describes the call. It records each
replay's marks for the planner.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from offrecomp import _torch_compat as tc
from offrecomp.arguments import replay_arguments
from offrecomp.changes import forward_hooked, state_as_replayed
from offrecomp.diagnostics import named, replay_differs, warn_once
from offrecomp.handles import view_on
from offrecomp.replay import replay_call
from offrecomp.state import PENDING_WATCH, RegionCall, StorageRec
from offrecomp.trace import (
    PLACEHOLDER,
    RUN,
    SERVE,
    CastDivergedError,
    PlaceholderReadError,
    RegionStructure,
    ReplayDivergedError,
)
from offrecomp.transfer import Group, GroupState
from scheduler.plan import Placement
from scheduler.working_set import forward_transient_bytes, replay_transient_bytes

if TYPE_CHECKING:
    from offrecomp.groups import OffloadGroups
    from offrecomp.lifecycle import Lifecycle
    from offrecomp.planning import Planner

log = logging.getLogger(__name__)

__all__ = ["Regenerator"]

KEEP, OFFLOAD, RECOMPUTE = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE
_graph_task_id = tc.graph_task_id


_PLACEHOLDERS_DIVERGED = (
    "offrecomp: replay of region %r with placeholders diverged (%s); replaying it without "
    "placeholders from now on. A forward that does not compute the same thing twice (a "
    "branch on a counter outside the region's modules, data-dependent routing) also replays "
    "with other values: OFFRECOMP_VERIFY=1 checks each replay's saves against the "
    "forward's; keep such a region (regions=)"
)


class Regenerator:
    """Replays region calls for one runtime."""

    def __init__(self, lifecycle: Lifecycle, planner: Planner, groups: OffloadGroups) -> None:
        self._life = lifecycle
        self._planner = planner
        self._groups = groups

    # NOTE [Stale recordings]
    # A serving replay follows the op recording of its signature's measuring pass: it
    # serves outputs from held storages with the recorded geometry and checks the op
    # sequence. Three things can make that recording describe another forward than
    # the one being replayed while the signature stays the same:
    # - state the forward reads changed between steps (a dropout rate schedule, a
    #   momentum, a hook added, a forward patched): the replay dispatches other ops or
    #   arguments than the recording. When the region's ``module_state`` (its modules'
    #   scalar attributes, classes, forwards and hooks, and torch's global module hooks)
    #   differs from the recording's, the replay
    #   is redone plainly, as recompute does, and the region replays plainly from then
    #   on (such state may change every step). A divergence the modules do not explain
    #   (state outside them, changed since this pass's forward) raises
    #   ``ReplayDivergedError``, as a plain replay would compute other values;
    # - inputs, parameters or buffers of another layout at the same sizes (a transposed
    #   input, a model moved to channels_last): every op dispatches as recorded, but served
    #   outputs would read held storages with the recorded strides. Each call's
    #   ``RegionCall.layout()`` is compared with the recording's before a serving
    #   replay; on a difference the replay runs plainly and the signature measures
    #   again, up to MAX_RELAYOUT_MEASURES times (steps that alternate between two
    #   layouts the signature does not tell apart, as blocks run on half the sequence
    #   every other step, would otherwise measure and calibrate for good); then the plan
    #   runs, and such calls replay plainly, with one warning. A non-contiguous input's
    #   strides are part of the signature, so layouts that alternate get a recording
    #   each. Storage offsets are not compared: an op
    #   whose output shares a storage with one of its inputs is a view, which a replay
    #   runs and never serves (NOTE [Which ops replay runs]), and every output it
    #   serves is on a storage of its own. So micro-batches sliced from one batch
    #   (``x[i * b:(i + 1) * b]``) replay as their recording does. Which inputs share a
    #   storage is compared: each input storage takes one storage index, so inputs that
    #   are views of one tensor in one pass and not in another shift every index after.
    #   A buffer's strides are those of the tensor the replay reads: as at entry if the
    #   forward changed it, else as its slot holds it. Tensors the forward reads from
    #   elsewhere (a module attribute, an argument object) have no entry to compare: no
    #   op their geometry may reach is served (NOTE [Which ops replay runs]).
    # - plain arguments (numbers, strings) other than the recording's: a temperature
    #   annealed per step, a window length. The ops may take other scalars or shapes; the
    #   replay runs plainly (the call captured its own arguments), and the signature keeps
    #   its recording, as such arguments may change every step.
    # - a recording of a call that built state on first use (a cache made and kept in
    #   an attribute, a buffer or a dict or list its modules hold, its own or one of a
    #   module among its arguments: NOTE
    #   [Modules among the arguments] in arg_state.py; ``RegionStructure.self_changing``): later calls run
    #   other ops. The first divergence replays plainly and measures the signature
    #   again; one after that replays the region plainly from then on. A build made of
    #   factory ops is no divergence: the serving mode passes over it (NOTE [Skipped
    #   builds] in trace/structure.py).
    # A plain replay is right in all cases: it reruns this pass's forward from its own
    # checkpoint.

    # NOTE [Served storages written since]
    # A serving replay rebuilds outputs on the storages the call kept, so they must hold
    # what the forward wrote. Writes inside the region are in the recording (such an op
    # is never served); a write after the region returned is legal for autograd when no
    # node that saved the storage runs in backward (an auxiliary output the loss never
    # reaches, written in place). A kept activation of a call that may drop therefore
    # keeps its version at save and a weak reference to the alias its first save's handle
    # holds (sharing the saved tensor's version counter): one written since, or whose
    # first save's handle is gone, is not served from, and the op that made it runs in
    # the replay.

    # NOTE [Serving from reloads]
    # A storage the call offloaded is held in backward too: its group's reload. A replay
    # in a backward serves from it as from a kept storage (the view at the storage's slot
    # in the reloaded buffer), fetching the group first, so compute waits for the reload
    # before the replay, as the simulator orders a unit's replay after its reload. Without
    # it, dropping GELU's output in a block whose matmul outputs are offloaded reruns the
    # matmul, and the planner, pricing that, could not mix offloads and drops in a region.
    # The copy holds the storage as the region left it (a write inside the region makes
    # its producer unservable in the recording); a slot whose source was written while
    # its copy was in flight (its version when the engine let go of it, or at the fetch,
    # is not the one at issue) is not served from. Sources that share no version counter
    # with the saved tensor (flat, untyped ones) show no such writes, as in NOTE [Writes
    # after a save] in handles.py. Only groups this backward reloads anyway are fetched:
    # issued or fetched and not released, or never handed to compute yet; a group
    # released after its unpacks (a replay reached after them, a second backward) is not
    # reloaded again for a replay, whose ops then run.

    def replay(self, call: RegionCall) -> None:
        life = self._life
        needed = {i for i, w in call.dropped.items() if w() is not None and i not in call.replayed}
        if not needed:
            return
        recording = _recording(call)
        # an opaque one: replay the forward as it is, under no dispatch mode
        structure = recording if recording is not None and not recording.opaque else None
        # NOTE [Serving from reloads]: only where a replay may serve, and in a backward
        in_backward = call.exited and not life.forwards_running and _graph_task_id() != -1
        storage_tensors = _servable_storages(
            call, self._groups if structure is not None and in_backward else None
        )
        kept = [r.index in storage_tensors for r in call.storages]
        if structure is not None and structure.layout is not None:
            layout = call.layout()
            if layout != structure.layout:  # NOTE [Stale recordings]: inputs, parameters or buffers of another layout
                self._planner.remeasure(call, _layout_change(structure.layout, layout))
                structure = None
        if (
            structure is not None and structure.arguments is not None and call.inputs is not None
            and call.inputs.plain_values() != structure.arguments
        ):
            structure = None  # NOTE [Stale recordings]: other plain arguments, this replay plainly
        # a caller's dispatch mode around backward (FlopCounterMode decomposes the ops it
        # has no formula for) may show the serving mode other ops than the recording
        callers_mode = tc.dispatch_modes_active()
        storage_of_save: dict[int, int] = {}
        for i in needed:
            h = call.dropped[i]()
            if h is not None and h.rec is not None:
                storage_of_save[i] = h.rec.index
        start = life.mark()
        k_seen = -1  # ops before the replay's stop (the prefix end K), where known
        if structure is None and recording is not None:
            k_seen = len(recording.program(kept, needed, storage_of_save))  # opaque: plain
        # NOTE [Calibration]: the calibration pass times plain replays (and up to three
        # under the dispatch mode: NOTE [Dispatch probe])
        calibrating = call.pass_state is not None and call.pass_state.phase == "calibrate"
        while True:
            program = None
            run_seconds = 0.0
            if structure is not None:
                program = structure.program(kept, needed, storage_of_save, placeholders=not _hooked(call))
                k_seen = len(program)
                if calibrating:
                    if not self._planner.wants_dispatch_probe(call):
                        program = None
                else:
                    pays, run_seconds = self._serving_pays(call, structure, program)
                    if not pays:
                        program = None  # replay as it is: cheaper than the dispatch mode here
            inputs = None
            if call.inputs is not None and any(x is None for x in call.inputs.tensors):
                inputs = replay_arguments(call.inputs, call.name, self._reloaded_inputs(call))
            try:
                captured = replay_call(
                    call, needed, inputs=inputs, program=program, storage_tensors=storage_tensors
                )
                if call.rewritten_state is not None:  # NOTE [State the first call made] (call_state.py)
                    raise RuntimeError(call.rewritten_state)
                break
            except torch.OutOfMemoryError:
                life.on_oom(call.pass_state)
                raise
            except ReplayDivergedError as exc:
                if calibrating and program is not None:
                    structure = None  # NOTE [Dispatch probe]: a probe only; this replay plainly
                    continue
                if structure is not None and program is not None and isinstance(exc, CastDivergedError):
                    # NOTE [Autocast cache]: a parameter object other than the recorded one
                    # (parameters replaced since the recording): replay this region plainly
                    self._planner.distrust(call.name, structure)
                    structure = None
                    log.warning(
                        "offrecomp: replay of region %r under the dispatch mode diverged at a cast "
                        "of a parameter (%s); replaying it plainly from now on",
                        call.name, exc,
                    )
                    continue
                if structure is not None and program is not None and callers_mode:
                    structure = None  # this replay runs plainly (see callers_mode)
                    continue
                if structure is not None and program is not None and isinstance(exc, PlaceholderReadError):
                    structure.placeholders_ok = False
                    log.warning(_PLACEHOLDERS_DIVERGED, call.name, exc)
                    continue
                region = call.region
                if structure is not None and program is not None and region is not None:
                    # see NOTE [Stale recordings]
                    if structure.self_changing and not region.remeasured:
                        region.remeasured = True  # recorded at its state's first use: again
                        self._planner.remeasure(call, "its recording built state on first use")
                        structure = None
                        continue
                    state = state_as_replayed(region.modules, call.forward_hooks, call.hooks_from, call.hooks_to)
                    if region.host_rng or structure.self_changing or state != structure.state:
                        self._stale_recording(call, structure, str(exc).removeprefix("offrecomp: "))
                        structure = None
                        continue
                raise ReplayDivergedError(f"{exc}. {replay_differs()}") from exc
        end = life.mark()
        p = call.pass_state
        # a replay inside the region's own forward (NOTE [Backward inside a forward]), or
        # outside any backward (a saved tensor read before it), is not a backward's replay
        timed = in_backward
        if p is not None and timed and program is not None and calibrating:
            p.dispatch_probes.append((call.ordinal, start, end, program))  # NOTE [Dispatch probe]
        elif p is not None and timed and program is not None:
            p.dispatch_replays.append((call.ordinal, start, end, run_seconds, program))
        elif p is not None and timed and k_seen >= 0:
            p.plain_replays.append((call.ordinal, start, end, k_seen))
        call.replayed.update(captured)
        life.replay_started(call, start, end, timed=timed)
        book_replay(call, _transient(call, k_seen, plain=program is None))

    def _stale_recording(self, call: RegionCall, structure: Any, why: str) -> None:
        """NOTE [Stale recordings]: ``call``'s region replays plainly from now on. Also
        for a region drawing from Python's or numpy's RNG: its recording drew other
        numbers, which a plain replay redraws as its forward did (NOTE [Host random
        states])."""
        self._planner.distrust(call.name, structure)
        warn_once(
            f"stale:{named(call.region, call.name)}",
            "offrecomp: region %r no longer runs the ops its measuring pass recorded (%s): "
            "state its forward reads changed since (a dropout rate, a hook, a momentum, a "
            "patched forward), or "
            "it draws from Python's or numpy's RNG; it replays plainly from now on",
            call.name, why,
        )

    def _serving_pays(self, call: RegionCall, structure: Any, program: list[int]) -> tuple[bool, float]:
        """NOTE [Serving overhead]: replaying under the dispatch mode costs time for every
        op it sees (host work the device may wait on). It pays only when the ops it skips
        (served or stubbed) take longer than that; otherwise a plain replay, which runs
        the whole prefix at full launch speed, is faster. The cost per op starts at
        SERVING_OVERHEAD_SECONDS (planning/replay_cost.py) and is learnt from the
        dispatch-mode replays that run (``Planner.replay_op_seconds``); the planner prices replays with the same rule
        (``Profile.replay_op_seconds``), so the plan it predicts is the replay that runs.
        Op times are the calibrated ones where the plan has them, else the recording's.
        Returns (dispatch mode pays, seconds of the ops it would run)."""
        ops = call.op_times.ops if call.op_times is not None else structure.op_records
        seconds = [op.seconds for op in ops]
        run = skipped = 0.0
        for a, s in zip(program, seconds):
            if a == RUN:
                run += s
            else:
                skipped += s
        if PLACEHOLDER not in program and SERVE not in program:
            return False, run
        return skipped >= len(program) * self._planner.replay_op_seconds, run

    def _reloaded_inputs(self, call: RegionCall) -> list[torch.Tensor]:
        assert call.inputs is not None
        out: list[torch.Tensor] = []
        group = None
        for i, t in enumerate(call.inputs.tensors):
            if t is not None:
                out.append(t)
                continue
            rec, meta = call.offloaded_inputs[i]
            group = rec.group
            assert group is not None
            storage, at, _ = self._groups.slot_now(group, call, rec.slot)
            size, stride, offset, dtype = meta
            out.append(view_on(storage, at, dtype, size, stride, offset))
        if group is not None and group.uses >= group.handles:
            self._groups.release_device(group)  # the replay's inputs hold what they need
        return out


def _hooked(call: RegionCall) -> bool:
    """Module hooks see the tensors of ``call``'s region in its replay (NOTE [Placeholders
    and hooks] in trace/structure.py): those of its entry, which the replay runs (NOTE
    [Hooks a replay registers] in changes.py), or those of now."""
    region = call.region
    return region is not None and (bool(call.forward_hooks) or forward_hooked(region))


def _recording(call: RegionCall) -> RegionStructure | None:
    """``call``'s recorded structure where it describes the call: not for a call that
    differed from it, nor for a region whose calls vary (NOTE [Regions that vary] in
    placement.py)."""
    region = call.region
    if call.mismatch or (region is not None and region.variable):
        return None
    return call.structure


def _transient(call: RegionCall, k: int, *, plain: bool) -> int:
    """What ``call``'s replay of ops ``0..k-1`` held beyond the storages it dropped, by
    its recording (``k`` < 0: up to the last dropped save; NOTE [Replay transients] in
    scheduler/working_set.py); 0 without a recording that describes the call (under
    ``mode="recompute"``, a call that differed from it, a region whose calls vary: the
    planner models such a region without ops)."""
    structure = _recording(call)
    if structure is None:
        return 0
    recs = structure.storage_records
    dropped = [False] * len(recs)
    for r in call.storages:
        if r.placement is RECOMPUTE and 0 <= r.index < len(recs):
            dropped[r.index] = True
    key = (*dropped, k, plain)
    found = structure.transients.get(key)
    if found is None:
        at = k if k >= 0 else max((s.last_save_op for s, d in zip(recs, dropped) if d), default=0)
        found = structure.transients[key] = replay_transient_bytes(structure.op_records, recs, dropped, at, plain=plain)
    return found


def book_forward(call: RegionCall, groups: OffloadGroups | None) -> None:
    """``call``'s forward has returned: the peak takes what it held beyond the storages
    the books count from their saves, by its recording, beside the device bytes of
    ``groups``' engine (its open group's storages among them, which the recording counts
    as held and the books' resident bytes do not), and the books count the
    storages it dropped that something beyond it still holds, until they die (NOTE
    [Forward transients] in scheduler/working_set.py); nothing without a recording that
    describes the call (under ``mode="recompute"``, a call that differed from it, a
    region whose calls vary)."""
    p = call.pass_state
    structure = _recording(call)
    if p is None or structure is None:
        return
    recs = structure.storage_records
    dropped = [False] * len(recs)
    outliving = []
    for r in call.storages:
        if r.placement is RECOMPUTE and 0 <= r.index < len(recs):
            dropped[r.index] = True
            if recs[r.index].outlives_call:
                outliving.append(r)
    key = ("forward", *dropped)
    found = structure.transients.get(key)
    if found is None:
        found = structure.transients[key] = forward_transient_bytes(structure.op_records, recs, dropped)
    p.stats.sample(found + (groups.device_bytes if groups is not None else 0))
    for r in outliving:  # dropped, but held beyond the call: resident until the storage dies
        if not r.resident and r() is not None:
            r.resident = True  # NOTE [Resident bytes] (state.py): its death takes the bytes off
            p.stats.add_resident(r.nbytes)


def _servable_storages(call: RegionCall, groups: OffloadGroups | None) -> dict[int, tuple[Any, int]]:
    """The storages of ``call`` a serving replay may serve from, by index, as (an
    UntypedStorage, the byte where the storage starts in it): those it kept, still held
    and not written since (NOTE [Served storages written since]), and with ``groups``
    those it offloaded whose group is reloaded for this backward (NOTE [Serving from
    reloads])."""
    out: dict[int, tuple[Any, int]] = {}
    for r in call.storages:
        group = r.group
        if groups is not None and r.placement is OFFLOAD and group is not None and _reload_due(group):
            slot = r.slot
            storage, at, version = groups.slot_now(group, call, slot)
            issued = group.issue_versions
            if slot < len(issued) and issued[slot] == version:
                out[r.index] = (storage, at)
        elif r.placement is KEEP:
            held = r.tensor.untyped_storage() if r.tensor is not None else r()
            watch = r.watch
            if watch is not None:
                seen = watch() if watch is not PENDING_WATCH else None
                if seen is None or seen._version != r.version:
                    continue  # written since, or nothing left to tell: the op runs
            if held is not None:
                out[r.index] = (held, 0)
    return out


def _reload_due(group: Group) -> bool:
    """This backward reloads ``group`` anyway: its reload is issued and not released yet
    (or its sources are served: NOTE [Served groups] in transfer.py), or it was never
    handed to compute (a group released after its unpacks is not reloaded again for a
    replay)."""
    state = group.state
    return state is GroupState.RELOADING or state is GroupState.FETCHED or state is GroupState.SERVED or (
        state is GroupState.OFFLOADED and group.fetches == 0
    )


# NOTE [Replays booked per storage]
# A replay regenerates every dropped save of its call at once, and the books count all
# their bytes from then on. Each unpack hands one out to its backward node, which frees
# it when it has run (as long as a plain run's saved tensor lives), so a storage's bytes
# stop counting when the last of its saves waiting in the replay is handed out, not when
# the whole call's are. A save no backward node unpacks (on a branch the loss does not
# use: an auxiliary loss stored on the module and never summed) stays held by the replay
# until its pass retires, and only its bytes stay booked, as a plain run holds them in
# that branch's graph.


def book_replay(call: RegionCall, transient: int = 0) -> None:
    """Count the bytes of ``call``'s dropped storages, just regenerated, as resident; a
    replay while an earlier one's tensors wait (a save read again) replaces them. The
    peak takes ``transient`` more, what the replay held beyond them while it ran (NOTE
    [Replay transients] in scheduler/working_set.py)."""
    p = call.pass_state
    if p is None:
        return
    dropped = 0
    pending: dict[int, int] = {}
    for r in call.storages:
        if r.placement == RECOMPUTE:
            dropped += r.nbytes
    for idx in call.replayed:
        w = call.dropped.get(idx)
        h = w() if w is not None else None
        if h is not None and h.rec.placement == RECOMPUTE:
            pending[id(h.rec)] = pending.get(id(h.rec), 0) + 1
    p.stats.add_resident(dropped - call.replay_resident)
    p.stats.sample(transient)
    call.replay_resident = dropped
    call.replay_pending = pending


def replay_handed(call: RegionCall, rec: StorageRec) -> None:
    """A save of ``rec`` left ``call``'s replay for its backward node: the storage's bytes
    stop counting when none of its saves waits there (NOTE [Replays booked per storage])."""
    pending = call.replay_pending
    if not pending:
        return
    n = pending.get(id(rec), 0)
    if n > 1:
        pending[id(rec)] = n - 1
        return
    if n == 1:
        del pending[id(rec)]
        p = call.pass_state
        if p is not None and call.replay_resident >= rec.nbytes:
            p.stats.add_resident(-rec.nbytes)
            call.replay_resident -= rec.nbytes


def replay_done(call: RegionCall) -> None:
    """Every regenerated save of ``call`` is handed out: none of its bytes counts."""
    p = call.pass_state
    call.replay_pending = None
    if p is not None and call.replay_resident:
        p.stats.add_resident(-call.replay_resident)
        call.replay_resident = 0


def _layout_change(recorded: tuple[Any, ...], now: tuple[Any, ...]) -> str:
    """What differs between a call's layout (``RegionCall.layout``) and its recording's."""
    if len(recorded) != len(now):
        return (
            "it takes another number of tensors than its recording (an argument given as a "
            "tensor on some calls and None on others?)"
        )
    return "its inputs, parameters or buffers have another layout than its recording"

