"""A measuring pass into a ``scheduler.Profile``: each region call's structure when its
forward returns (from the op recording), and at the pass's end the profile (region and
root storage records, forward and backward times, the host link's bandwidth)."""

from __future__ import annotations

import bisect
import logging
import statistics
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from offrecomp import _torch_compat as tc
from offrecomp.changes import forward_hooked, module_state
from offrecomp.diagnostics import warn_once
from offrecomp.measure import device_capacity_bytes, distorts
from offrecomp.outputs import awaits_backward
from offrecomp.placement import never_replayed
from offrecomp.regions import buffer_of
from offrecomp.signatures import shown
from offrecomp.trace import RegionStructure, build_structure
from scheduler.plan import Placement
from scheduler.profile import Profile, RegionRecord, StorageRecord

if TYPE_CHECKING:
    from offrecomp.config import Config, Prefetch
    from offrecomp.measure import Clock
    from offrecomp.planning.entries import PlanEntry
    from offrecomp.planning.host import PlannerHost
    from offrecomp.regions import Region
    from offrecomp.state import PassState, RegionCall
    from offrecomp.trace import OpRecorder

log = logging.getLogger(__name__)

ReplayMarks = list[tuple[int, Any, Any]]
"""A pass's replay marks: (region call ordinal, start mark, end mark) per replay."""


# NOTE [Split backwards]
# A pass whose backward ended while one of its forwards' graphs still awaited a backward
# (NOTE [Several backwards] in lifecycle.py) ends at the next forward, and the backward
# it awaited runs later, inside another pass: a pipeline's 1F1B schedule (F0 F1 B0 F2 B1
# ..., F2 ends the pass of F0 and F1 while B1 is still to run), or a forward whose graph
# is dropped undifferentiated. Its backward span, from its backward's start to its last
# backward's end, then holds only some of its calls' backwards, and its replay marks
# keep growing after it ended (each later replay of its calls adds one). So:
# - everything that learns from a span (the backward, its host time, the calibration
#   check) subtracts only the replays inside that span;
# - its measuring pass's profile is built once the backwards it awaited have run (at
#   the latest when the pass after the next begins, or the runtime waits for its
#   records): each call a later backward replays is timed from its replay's end to
#   the next replay's start, and its time adds to the profile's backward; a call with
#   no measured backward takes the backward-to-forward ratio of its measured peers (the
#   same ops and sizes), else of every measured call, rather than twice its forward.
#   The pass in between runs a plain full recompute (what the measuring pass held,
#   without the recorder), as it cannot calibrate a profile not built yet;
# - a calibration or planned pass split so is not learnt from for its backward (its
#   forward is; a calibration pass learnt before its later backward ran fits the regions
#   it did not replay yet from their fitted peers), and gives the offload trial and the
#   live prediction no step time: the span's calls are unknown where they kept their
#   saves (no replay marks them), and the later backwards run inside another pass's
#   forward, outside its span. The signature's backward is learnt from its passes that
#   were not split (in a 1F1B step, the last), and a signature whose every pass is split
#   keeps its measured backward.
# A pass with a single backward (or several, all inside it) is built and learnt from
# its whole span, which holds all of its replay marks. A backward that runs inside a
# later pass's forward is taken out of that pass's times (NOTE [Backwards of other
# passes]).


# NOTE [Backwards of other passes]
# A backward of an ended pass (a split pass's later backward, B1 in a 1F1B schedule's F2
# B1 F3; a dropped graph differentiated late) runs while another pass is the running
# one, mostly inside its forward, between two of its region calls. It is not that
# pass's work: in its forward span it would double the forward the planner learns on
# every other pass of a 1F1B step (each such pass's forward holds the previous pass's
# backward in the gap between its two forwards), and the pass's step time the live
# prediction and the offload trial read would hold it too. So each root forward's output
# nodes (NOTE [Dropped graphs] in lifecycle.py) time a backward that reaches them while
# another pass runs (not that pass's own backward), from the output's node to the
# backward's end, into the running pass's ``other_backwards``; every span learnt or
# built from that pass (its forward total, each gap, its backward, its step, a root
# save's offset, a measuring pass's region calls) is taken less the backwards that ran
# wholly inside it. A piece one of them crosses (a backward that began before the piece
# and ended in it), and a learnt pass's region call one ran inside (on a GPU its host
# span would hold the backward's host time), teach nothing: the estimate's value stands.
# The pass is still learnt from, not skipped: in a 1F1B step of N micro-batches every
# pass but the first runs a backward of the one before inside its forward, and skipping
# those would leave one pass in N to learn the forward from. What the backward's call
# costs outside the engine's work from that node on (the Python call, the engine's setup,
# its return) stays in the gap: about a millisecond on a CPU. A backward that reaches no
# watched output (one through an intermediate tensor, or another model's) is not seen,
# and counts as the running pass's own time. Only auto mode watches for them.


def split_backward(p: PassState) -> bool:
    """Did ``p`` end while a forward of it still awaited a backward (NOTE [Split
    backwards])?"""
    return p.awaits_other


def awaits_late_backward(p: PassState) -> bool:
    """Does a forward of the split pass ``p`` still have an output graph alive that no
    backward reached (NOTE [Split backwards])?"""
    return p.awaits_other and awaits_backward(p.graphs)


def others_inside(p: PassState, a: Any, b: Any) -> list[tuple[Any, Any]] | None:
    """The backwards of other passes that ran wholly between ``p``'s marks ``a`` and
    ``b`` (NOTE [Backwards of other passes]); None when one crosses ``a`` or ``b``."""
    inside = []
    for s, e in p.other_backwards:
        if a is None or b is None or e.host <= a.host or s.host >= b.host:
            continue
        if s.host < a.host or e.host > b.host:
            return None
        inside.append((s, e))
    return inside


def own_seconds(p: PassState, a: Any, b: Any, clock: Clock, *, wait: bool = False) -> float | None:
    """Seconds from ``p``'s mark ``a`` to ``b`` less the backwards of other passes
    inside (NOTE [Backwards of other passes]); None when unknown, or when one of them
    crosses ``a`` or ``b``."""
    secs = clock.seconds(a, b, wait=wait)
    if secs is None or not p.other_backwards:
        return secs
    inside = others_inside(p, a, b)
    if inside is None:
        return None
    for s, e in inside:
        other = clock.seconds(s, e, wait=wait)
        if other is None:
            return None
        secs -= other
    return max(0.0, secs)


def own_pause(p: PassState, a: Any, b: Any, clock: Clock) -> float:
    """Host pause seconds from ``p``'s mark ``a`` to ``b`` outside the backwards of
    other passes inside (NOTE [Backwards of other passes], [Host pauses])."""
    paused = clock.pause(a, b)
    if paused and p.other_backwards:
        paused -= sum(clock.pause(s, e) for s, e in others_inside(p, a, b) or ())
    return max(0.0, paused)


def own_distorted(p: PassState, a: Any, b: Any, clock: Clock, seconds: float | None) -> bool:
    """``clock.distorted`` for ``p``'s span from ``a`` to ``b`` (``seconds`` long, less
    the backwards of other passes inside): their pauses are not its own."""
    if not p.other_backwards:
        return clock.distorted(a, b, seconds)
    return distorts(own_pause(p, a, b, clock), seconds)


def marks_within(marks: ReplayMarks, start: Any, end: Any) -> ReplayMarks:
    """The replay marks of ``marks`` that lie between the marks ``start`` and ``end``
    (NOTE [Split backwards]); all of them when either is unknown."""
    if start is None or end is None:
        return marks
    return [m for m in marks if start.host <= m[1].host and m[2].host <= end.host]


def within(p: PassState) -> ReplayMarks:
    """``p``'s replay marks inside its backward span: a backward after its end (NOTE
    [Split backwards]) adds marks later."""
    return marks_within(p.replay_marks, p.backward_start_mark, p.backward_end_mark)


def region_shape(r: RegionRecord) -> tuple[Any, ...]:
    """What repeated blocks share: the same ops and the same storage sizes."""
    return (tuple(op.name for op in r.ops), tuple(s.nbytes for s in r.storages))


def timed_on_device(rec: OpRecorder) -> bool:
    """The recording timed its ops with CUDA events, which can be read only once the
    device has run them (at the end of the pass)."""
    return any(op.start_ev is not None for op in rec.ops)


def mark_found(profile: Profile, regions: Iterable[Region]) -> None:
    """What is known of ``regions`` since ``profile`` was built goes into it before a plan
    is solved from it: a region found never replayable is not replayable in it, so the
    plan keeps or offloads its storages, as the placement rules will; a region found to
    vary (NOTE [Regions that vary] in placement.py) is opaque in it, as its replays run
    plainly, the whole prefix up to what they regenerate."""
    unreplayable = {r.name for r in regions if never_replayed(r) is not None or r.collective}
    variable = {r.name for r in regions if r.variable}
    for rec in profile.regions:
        if rec.name in unreplayable:
            rec.replayable = False
        if rec.name in variable:
            rec.opaque = True


def record_structure(call: RegionCall, *, min_bytes: int, opaque: bool) -> None:
    """The region call's forward returned in a measuring pass: derive its structure from
    its recording (``opaque``: its region's recording proved untrustworthy before)."""
    rec = call.recorder
    assert rec is not None
    call.recorder = None
    region = call.region
    used = region.forward_used if region is not None else ()
    kinds = []
    for s in call.storages:
        if s.kind == "input":
            kinds.append("input")
        elif s.nbytes < min_bytes or s.aliased or s.index in used:
            # always kept: planned as fixed (aliased: NOTE [Untracked aliases]; read
            # in the forward: NOTE [Backward inside a forward])
            kinds.append("external")
        else:
            kinds.append("activation")
    call.structure = build_structure(
        rec,
        call.saves,
        [s.sid for s in call.storages],
        [s.nbytes for s in call.storages],
        kinds,
        rec.op_seconds() if not timed_on_device(rec) else [0.0] * len(rec.ops),
        # the ops' times count from the end of the call's checkpoint (NOTE [Host time])
        call.start_mark.host + call.capture_seconds if call.start_mark is not None else 0.0,
        compiled=region is not None and (region.compiled or region.backward_in_forward or opaque),
        hooked=region is not None and forward_hooked(region),  # NOTE [Placeholders and hooks]
    )
    call.structure.layout = call.layout()
    call.structure.arguments = call.inputs.plain_values() if call.inputs is not None else None
    if region is not None:
        call.structure.state = module_state(region.modules)
    bufs = call.buffers
    call.structure.self_changing = (
        bool(call.attrs)
        or call.filled_contents  # a dict or list its modules hold filled (NOTE [Attributes at entry])
        or (bufs is not None and any(bufs.objects[i] is not buffer_of(*bufs.slots[i]) for i in bufs.mutated or ()))
        or (call.arg_state is not None and call.arg_state.rebound)  # NOTE [Modules among the arguments]
    )
    call.structure.snapshot_bytes = call.snapshot_bytes  # NOTE [Replay and module state]
    # aliased ones only: a save a backward inside the forward reads is freed by that backward
    call.structure.kept_dropped = sum(
        s.nbytes for s in call.storages if s.aliased and s.placement is Placement.RECOMPUTE
    )
    recs = call.structure.storage_records
    for s in call.storages:
        if s.by_argument:  # NOTE [Inputs held by arguments] in calls.py
            recs[s.index].keep_only = True
        if s.placement is not Placement.RECOMPUTE:  # the pass held it: nothing tells what else did
            recs[s.index].outlives_call = False
    call.structure.small_storages = tuple(
        i for i, s in enumerate(call.storages)
        if kinds[i] == "external" and s.nbytes < min_bytes and not s.aliased
        and s.index not in used and recs[i].producer_op >= 0
    )
    call.recorded_ops = rec  # op events are resolved at the end of the pass (CUDA)
    call.saves = []


# NOTE [Prefetch windows]
# The planner models a prefetch depth in groups: at a group's first fetch, the next N
# groups that offload are reloaded. A byte window (prefetch="256MiB") lets the engine
# reload ahead while the reloaded-but-unfetched bytes stay within it, at least one group:
# with groups of G bytes, window // G of them. A plan's group holds at most its region
# call's activation bytes, so the depth read from the profile's median call is at most
# the one that runs: the stalls it predicts are an upper bound.


def prefetch_depth(prefetch: Prefetch, profile: Profile) -> int:
    """The reload depth in groups the planner models for ``prefetch`` on ``profile``
    (NOTE [Prefetch windows])."""
    if prefetch.regions is not None:
        return prefetch.regions
    sizes = sorted(
        b for b in (sum(s.nbytes for s in r.storages if s.kind == "activation") for r in profile.regions) if b > 0
    )
    if not sizes:
        return 1
    return max(1, (prefetch.nbytes or 0) // sizes[len(sizes) // 2])


def chosen_depth(cfg: Config, profile: Profile) -> int | None:
    """The reload depth plans are solved for: the configured one, or, where
    ``OFFRECOMP_PREFETCH`` is not set, None: the solver's choice (NOTE [Chosen prefetch]
    in scheduler/solver/api.py)."""
    if cfg.sources.get("prefetch", "default") == "default":
        return None
    return prefetch_depth(cfg.prefetch, profile)


def build_profile(
    p: PassState, replay_marks: ReplayMarks, end_mark: Any, *, clock: Clock, config: Config, device: torch.device,
    host_limit: Callable[[], int],
) -> tuple[Profile, dict[tuple[str, int], RegionStructure]]:
    """The profile of the measuring (or re-profiling) pass ``p``, whose replay marks and
    backward end were ``replay_marks`` and ``end_mark`` when it ended (a split pass's:
    its replay marks now, NOTE [Split backwards]), and the region structures it was
    built from."""
    split = split_backward(p)
    replay_by_ordinal: dict[int, tuple[Any, Any]] = {}
    for ordinal, a, b in replay_marks:
        replay_by_ordinal.setdefault(ordinal, (a, b))
    in_span = marks_within(replay_marks, p.backward_start_mark, end_mark) if split else replay_marks
    total_replay = sum(clock.seconds(a, b, wait=True) or 0.0 for _, a, b in in_span)
    ends = [m for m in p.backward_ends if m is not None and m.host < end_mark.host] if end_mark is not None else []
    regions, structures, unmeasured = _region_records(p, replay_by_ordinal, [*ends, end_mark], clock)
    late = 0.0
    if split:
        fill_unmeasured(regions, unmeasured)
        later = {o for o, _, _ in replay_marks} - {o for o, _, _ in in_span}
        by_ordinal = {c.ordinal: c.key for c in p.calls}
        late_keys = {by_ordinal.get(o) for o in later}
        late = sum(r.backward_seconds for r in regions if r.key in late_keys)
    root_records: list[StorageRecord] = []
    if p.root is not None:
        for s in p.root.storages:
            other = s.same_as  # NOTE [Activations counted once] (shared.py): an earlier record of it
            root_records.append(
                StorageRecord(
                    nbytes=s.nbytes,
                    kind="activation" if s.nbytes >= config.min_bytes and not s.aliased else "external",
                    offset_seconds=_offset(p, s.save_mark, clock),
                    shared_with=None if other is None else (other.call.name, other.call.call_index, other.index),
                    held=s.held,  # NOTE [Held past backward] (scheduler/timeline.py)
                )
            )
    fwd_total = _offset(p, p.backward_start_mark, clock)
    bwd_total = own_seconds(p, p.backward_start_mark, end_mark, clock, wait=True)
    if bwd_total is None:
        bwd_total = clock.seconds(p.backward_start_mark, end_mark, wait=True) or 0.0
    d2h, h2d = link_gbps(config, device)
    # NOTE [Host limit in plans]: the pool refuses a group past its limit, and the
    # runtime keeps that group's storages instead: over the budget. The solver offloads
    # no more than the limit: the pool's own figure (``host_limit``, read once per runtime).
    limit = host_limit() if d2h > 0 and h2d > 0 else 0
    profile = Profile(
        signature=p.signature,
        device=device.type,
        forward_seconds=fwd_total,
        backward_seconds=max(0.0, bwd_total - total_replay) + late,
        d2h_gbps=d2h,
        h2d_gbps=h2d,
        regions=regions,
        root=root_records,
        device_capacity_bytes=device_capacity_bytes(device),
        host_limit_bytes=limit,
        native_keep=config.native_keep,  # NOTE [Native keep]: kept-whole calls run no hooks
        meta={"torch": torch.__version__},
    )
    if p.device_peak is not None:
        profile.fixed_bytes = max(0, p.alloc_start + p.device_peak - p.stats.peak_resident_bytes)
    return profile, structures


def profile_into(entry: PlanEntry, p: PassState, replay_marks: ReplayMarks, end_mark: Any, host: PlannerHost) -> None:
    """Build ``entry``'s profile from the measuring (or re-profiling) pass ``p``
    (``build_profile``), keeping the calls a re-profiling pass did not run (NOTE [Calls
    the profile lacks]), and save it where the config asks."""
    cfg = host.config
    profile, structures = build_profile(
        p, replay_marks, end_mark, clock=host.clock, config=cfg, device=host.device(),
        host_limit=host.host_limit_bytes,
    )
    if p.reprofile and entry.profile is not None and entry.structures:
        added = keep_missing_calls(profile, structures, entry.profile, entry.structures)
        if added:
            log.info(
                "offrecomp: signature %s's profile keeps %d call(s) this pass did not run",
                shown(p.signature), added,
            )
    entry.take_profile(profile, structures, p.stats.peak_resident_bytes)
    if cfg.profile_path:
        # the measured profile now; each solve overwrites it with the calibrated one
        save_profile(profile, cfg.profile_path, p.signature)


def replays_by_call(p: PassState, clock: Clock) -> dict[tuple[str, int], float]:
    """Seconds ``p``'s timed replays took, summed per region call (name, call index)."""
    by_ordinal = {c.ordinal: c for c in p.calls}
    out: dict[tuple[str, int], float] = {}
    for ordinal, a, b in p.replay_marks:
        call = by_ordinal.get(ordinal)
        secs = clock.seconds(a, b)
        if call is not None and secs is not None:
            out[call.key] = out.get(call.key, 0.0) + secs
    return out


def learn_held(p: PassState, profile: Profile) -> bool:
    """Mark ``held`` the records of ``profile`` whose storages pass ``p`` found alive at
    its backward's end (NOTE [Held past backward] in scheduler/timeline.py); a storage
    marked once stays marked. True when one was not marked before."""
    by_key = {r.key: r.storages for r in profile.regions}
    new = False
    for call in p.all_calls():
        storages = profile.root if call.is_root else by_key.get(call.key)
        if storages is None:
            continue
        for rec in call.storages:
            if rec.held and 0 <= rec.index < len(storages) and storages[rec.index].nbytes == rec.nbytes:
                new = new or not storages[rec.index].held
                storages[rec.index].held = True
    return new


def keep_missing_calls(
    profile: Profile,
    structures: dict[tuple[str, int], RegionStructure],
    old: Profile,
    old_structures: dict[tuple[str, int], RegionStructure],
) -> int:
    """Put the calls of ``old`` (the signature's previous profile) that the re-profiling
    pass behind ``profile`` did not run into it, each after the call it followed, with
    the times it had: a profile only grows (NOTE [Calls the profile lacks]). Returns how
    many were put in."""
    have = {r.key for r in profile.regions}
    order = [r.key for r in old.regions]
    added = 0
    for i, rec in enumerate(old.regions):
        if rec.key in have or rec.key not in old_structures:
            continue
        regions = profile.regions
        pos = 0
        for k in reversed(order[:i]):  # after the nearest earlier call the new one has
            j = next((j for j, r in enumerate(regions) if r.key == k), None)
            if j is not None:
                pos = j + 1
                break
        start = regions[pos - 1].start_seconds + regions[pos - 1].forward_seconds if pos else 0.0
        shift = max(0.0, start + rec.forward_seconds - (regions[pos].start_seconds if pos < len(regions) else start))
        for r in regions[pos:]:
            r.start_seconds += shift
        copy = RegionRecord(**{**vars(rec), "start_seconds": start})
        regions.insert(pos, copy)
        profile.forward_seconds += rec.forward_seconds
        profile.backward_seconds += rec.backward_seconds
        structures[rec.key] = old_structures[rec.key]
        have.add(rec.key)
        added += 1
    return added


def _region_records(
    p: PassState, replay_by_ordinal: dict[int, tuple[Any, Any]], ends: list[Any], clock: Clock
) -> tuple[list[RegionRecord], dict[tuple[str, int], RegionStructure], set[tuple[str, int]]]:
    """A record per region call of ``p`` that has a structure, with its times (``ends``:
    the end mark of each of its backwards), and the keys of those whose backward was not
    measured (twice their forward)."""
    regions: list[RegionRecord] = []
    structures: dict[tuple[str, int], RegionStructure] = {}
    unmeasured: set[tuple[str, int]] = set()
    timeline = _timeline(replay_by_ordinal, ends)
    for call in p.calls:
        st = call.structure
        if st is None:
            continue
        rec = getattr(call, "recorded_ops", None)
        if rec is not None and timed_on_device(rec):
            secs = rec.op_seconds()  # CUDA events: resolved now, after backward
            for op, s in zip(st.op_records, secs):
                op.seconds = float(s)
        fwd = own_seconds(p, call.start_mark, call.end_mark, clock, wait=True)
        if fwd is None:
            fwd = clock.seconds(call.start_mark, call.end_mark, wait=True) or 0.0
        bwd = _backward_seconds(clock, call.ordinal, replay_by_ordinal, timeline)
        storages = [StorageRecord(**vars(s)) for s in st.storage_records]
        for r in call.storages:
            if not 0 <= r.index < len(storages):
                continue
            record, other = storages[r.index], r.same_as
            if other is not None:  # NOTE [Inputs counted once], [Activations counted once] (shared.py)
                record.shared_with = (other.call.name, other.call.call_index, other.index)
            record.held |= r.held  # NOTE [Held past backward] (scheduler/timeline.py)
            record.returned |= r.returned  # NOTE [Whole calls counted once] (shared.py)
            record.argument |= r.argument
        if bwd is None:
            unmeasured.add(call.key)
        if st.snapshot_bytes:  # held from the call's entry while it may replay (NOTE [Replay and module state])
            storages.append(StorageRecord(nbytes=st.snapshot_bytes, kind="snapshot", saves=0))
        regions.append(
            RegionRecord(
                name=call.name,
                call_index=call.call_index,
                start_seconds=_offset(p, call.start_mark, clock),
                forward_seconds=fwd,
                backward_seconds=bwd if bwd is not None else 2.0 * fwd,
                ops=list(st.op_records),
                storages=storages,
                opaque=st.opaque,
                replayable=not call.collective and never_replayed(call.region) is None,
            )
        )
        structures[call.key] = st
    return regions, structures, unmeasured


def _offset(p: PassState, mark: Any, clock: Clock) -> float:
    """Seconds from ``p``'s start to ``mark``, less the backwards of other passes that
    ended before it (NOTE [Backwards of other passes])."""
    secs = clock.seconds(p.start_mark, mark, wait=True) or 0.0
    if not p.other_backwards:
        return secs
    for s, e in p.other_backwards:
        if mark is not None and p.start_mark is not None and p.start_mark.host <= s.host and e.host <= mark.host:
            secs -= clock.seconds(s, e, wait=True) or 0.0
    return max(0.0, secs)


def fill_unmeasured(regions: list[RegionRecord], unmeasured: set[tuple[str, int]]) -> None:
    """NOTE [Split backwards]: each region of ``unmeasured`` (its backward not measured)
    takes the median backward-to-forward ratio of its measured peers (the same ops and
    sizes), else of every measured region, times its forward (twice it when none was)."""
    ratios: dict[tuple[Any, ...], list[float]] = {}
    every: list[float] = []
    for r in regions:
        if r.key not in unmeasured and r.forward_seconds > 0:
            ratio = r.backward_seconds / r.forward_seconds
            ratios.setdefault(region_shape(r), []).append(ratio)
            every.append(ratio)
    for r in regions:
        if r.key in unmeasured:
            peers = ratios.get(region_shape(r)) or every
            r.backward_seconds = (statistics.median(peers) if peers else 2.0) * r.forward_seconds


def _timeline(marks: dict[int, tuple[Any, Any]], ends: list[Any]) -> tuple[list[float], list[Any]]:
    """The replays' start marks and the backwards' end marks in time order (their host
    times, and the marks), for ``_backward_seconds``."""
    points = sorted(
        [(a.host, i, a) for i, (a, _) in enumerate(marks.values())]
        + [(m.host, len(marks) + i, m) for i, m in enumerate(ends) if m is not None]
    )
    return [t for t, _, _ in points], [m for _, _, m in points]


def _backward_seconds(
    clock: Clock, ordinal: int, marks: dict[int, tuple[Any, Any]], timeline: tuple[list[float], list[Any]]
) -> float | None:
    """Backward time of one region call in the measuring pass: from the end of its replay
    to what came next in time, the next replay's start or its backward's end. (Not the
    next call in reverse forward order: a pass's backwards may run its calls in another
    order, NOTE [Several backwards] in lifecycle.py.)"""
    if ordinal not in marks:
        return None
    _, end = marks[ordinal]
    hosts, points = timeline
    i = bisect.bisect_left(hosts, end.host)
    if i == len(points):
        return None
    return clock.seconds(end, points[i], wait=True)


def link_gbps(config: Config, device: torch.device) -> tuple[float, float]:
    """The host link's D2H and H2D bandwidth: configured, else measured once per GPU
    (none off a GPU unless configured)."""
    if device.type != "cuda":
        return (config.d2h_gbps or 0.0, config.h2d_gbps or 0.0)
    d2h = config.d2h_gbps
    h2d = config.h2d_gbps
    if d2h is None or h2d is None:
        md2h, mh2d = _probe_link(device)
        d2h = d2h if d2h is not None else md2h
        h2d = h2d if h2d is not None else mh2d
    return (d2h, h2d)


_link_cache: dict[int, tuple[float, float]] = {}


def _probe_link(device: torch.device) -> tuple[float, float]:
    """Measure pinned D2H/H2D bandwidth once per device (64 MiB each way)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx in _link_cache:
        return _link_cache[idx]
    n = 64 << 20
    try:
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device=device)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host.copy_(dev, non_blocking=True)  # warm-up
        torch.cuda.synchronize(device)
        s.record()
        host.copy_(dev, non_blocking=True)
        e.record()
        e.synchronize()
        d2h = n / (s.elapsed_time(e) / 1e3) / 1e9
        s.record()
        dev.copy_(host, non_blocking=True)
        e.record()
        e.synchronize()
        h2d = n / (s.elapsed_time(e) / 1e3) / 1e9
    except RuntimeError as exc:
        log.warning("offrecomp: could not measure the host link (%s); planning without offload", exc)
        d2h = h2d = 0.0
    _link_cache[idx] = (d2h, h2d)
    return d2h, h2d


def save_profile(profile: Profile, path: str, signature: str) -> None:
    """Write ``profile`` to ``OFFRECOMP_PROFILE``'s ``path``; a failure (the disk filled,
    the folder removed since the runtime checked it) is logged once and training goes on."""
    path = tc.per_rank_path(path)  # NOTE [Files per rank] in config.py
    try:
        profile.save(path)
    except OSError as exc:
        warn_once(
            f"profile-path:{path}",
            "offrecomp: cannot write the profile to OFFRECOMP_PROFILE=%r (%s); training goes on "
            "without it",
            path, exc,
        )
        return
    log.info("offrecomp: profile of signature %s saved to %s", signature, path)
