"""Learning from calibration and planned passes: their measured times into the
signature's cost model (region spans, the gaps around them, the backward, the runtime's
host costs, the link), the calibration pass's fit of op times to its plain replays, and
what each pass means for the plan (NOTE [Live prediction], NOTE [Offload trial])."""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from typing import TYPE_CHECKING, Any

from offrecomp.measure import distorts
from offrecomp.phases import Phase
from offrecomp.planning.calibration import calibrate_replays
from offrecomp.planning.differences import settle_growth, variable_sizes
from offrecomp.planning.drift import refresh_live
from offrecomp.planning.profiling import (
    learn_held,
    others_inside,
    own_distorted,
    own_pause,
    own_seconds,
    prefetch_depth,
    region_shape,
    replays_by_call,
    split_backward,
    within,
)
from offrecomp.planning.trial import offload_trial
from offrecomp.state import Stage
from offrecomp.trace import RUN
from scheduler.cost_model import CostModel
from scheduler.plan import Placement

if TYPE_CHECKING:
    from collections.abc import Mapping

    from offrecomp.measure import Clock
    from offrecomp.planning.entries import PlanEntry
    from offrecomp.planning.host import PlannerHost
    from offrecomp.planning.replay_cost import ReplayCost
    from offrecomp.planning.solving import Solver
    from offrecomp.state import PassState, RegionCall
    from scheduler.profile import Profile, RegionRecord

log = logging.getLogger(__name__)

OFFLOAD, RECOMPUTE = Placement.OFFLOAD, Placement.RECOMPUTE

OUTLIER_RATIO = 4.0
"""A planned pass reads a region's forward time, or the backward, as at most this many
times (and at least its inverse) the estimate: one pass slowed by something else on the
machine (a preempted thread, a busy neighbour) moves the average (weight 0.3) by 1.9x
at most, and a real change is followed within a few passes."""

MAX_CALIBRATION_TRIES = 2
"""Calibration passes a host pause may send back (NOTE [Host pauses]); the pass after
the last of them is taken as it is."""

LEARN_SHARE = 0.02
"""Learning from planned passes takes at most this share of step time (NOTE [Learning
cadence])."""

MAX_LEARN_EVERY = 16
"""A settled plan still learns from one planned pass in this many at least."""

FIRST_LEARNT = 2
"""Planned passes of a new plan always learnt, before the cadence applies."""


class Learner:
    """Feeds the passes of the planner's signatures into their cost models."""

    def __init__(
        self, host: PlannerHost, replay_cost: ReplayCost, solver: Solver, entries: Mapping[str, PlanEntry]
    ) -> None:
        self.host = host
        self.replay_cost = replay_cost
        self.solver = solver
        self._entries = entries  # the planner's, by signature (a plan the probe moves is solved again)

    def learn(self, entry: PlanEntry, p: PassState) -> str | None:
        """Feed a calibration or planned pass's measured times into the cost model; a
        note for the step record when the pass taught less than usual.

        NOTE [Forward timeline]: the forward is learnt piece by piece: each region's
        span and each gap around the regions (the root's work: embedding, head, loss).
        A piece is taken from this pass only when it timed compute alone: in a pass
        whose compute waited on the offload window, the regions that offloaded and the
        gaps may hold that wait, and a span a host pause distorted (NOTE [Host pauses])
        holds the pause. A region that offloads is learnt like the others otherwise:
        its group is copied after its forward, and the hooks' and the group issue's
        host time come off its span (NOTE [Host time] in scheduler/timeline.py).
        Skipped pieces keep the estimate's value; the region starts, the root saves'
        offsets and the forward total are rebuilt from the pieces, so one pause never
        shifts the timeline after it.
        """
        calibrating = p.phase == Phase.CALIBRATE
        if entry.cost is None or not (p.planned or calibrating) or p.aborted or p.stage is not Stage.DONE:
            return None
        if p.phase == Phase.BORROWED:
            return None  # it ran another signature's plan (NOTE [Borrowed plans], [Pass signatures])
        if p.reprofile:
            return None  # its end built the profile again (NOTE [Calls the profile lacks])
        if calibrating and (entry.needs_measure or _calibrated_another(entry, p)):
            # its calls differed from the recording (NOTE [Calibration sizes] in
            # differences.py): the signature measures again, or has since (a new profile)
            return None
        # a split pass's span is not its step, nor another pass's backward inside a span
        # its own (NOTE [Split backwards], [Backwards of other passes] in profiling.py)
        step = None if calibrating or split_backward(p) else own_seconds(p, p.start_mark, p.backward_end_mark, self.host.clock)
        grew = p.phase == Phase.PLANNED and entry.profile is not None and variable_sizes(p, entry.profile, grow=False)
        if p.phase == Phase.PLANNED and not grew and self._skip(entry):
            return self._trial(entry, p, step)  # the step time still reaches the offload trial
        t0 = time.perf_counter()
        note = self._learn(entry, p, calibrating, step)
        if p.phase == Phase.PLANNED:
            entry.replays_seen = replays_by_call(p, self.host.clock)
            entry.learnt_since_solve += 1
            if step is not None and step > 0:
                share = (time.perf_counter() - t0) / (LEARN_SHARE * step)
                entry.learn_every = max(1, min(MAX_LEARN_EVERY, int(share) + 1))
        return note

    # NOTE [Learning cadence]
    # Learning from a planned pass (copying the estimate, fitting the forward and the
    # backward, averaging into the cost model, the live prediction) takes host time in
    # proportion to the profile: about a millisecond a step for two dozen small blocks
    # on the CPU machine, at the start of the next pass, where a host-bound GPU step pays
    # it in full. The passes of a settled plan teach little each, so after a plan's first
    # FIRST_LEARNT passes the planner learns from one planned pass in ``learn_every``,
    # set after each learnt pass so that learning takes at most LEARN_SHARE of the step
    # time (one pass in MAX_LEARN_EVERY at least). The passes between still feed the
    # offload trial their step times, and the drift check reads every step's record, so
    # a plan that stops fitting is still caught. Calibration passes, passes under a
    # user's plan (``rt.set_plan``), and the passes of a plan solved again for drift
    # (until a window fits, or re-planning backs off: NOTE [Drift]) are always learnt:
    # learning one pass in 16 would give such a plan two passes of each window of
    # DRIFT_WINDOW to correct the times it missed by.

    @staticmethod
    def _skip(entry: PlanEntry) -> bool:
        """Skip learning from this planned pass (NOTE [Learning cadence])?"""
        if entry.learnt_since_solve < FIRST_LEARNT or entry.drift_learning:
            return False
        entry.learn_skipped += 1
        if entry.learn_skipped < entry.learn_every:
            return True
        entry.learn_skipped = 0
        return False

    def _trial(self, entry: PlanEntry, p: PassState, step: float | None) -> str | None:
        """Planned pass ``p``'s step time (``step`` seconds) into the offload trial; the
        trial's note."""
        if step is None or p.phase != Phase.PLANNED or self.host.user_plan is not None:
            return None
        if entry.learnt_since_solve == 0:
            return None  # NOTE [Offload trial]: not a plan's first pass
        if distorts(self.host.clock.pause(p.start_mark, p.backward_end_mark), step):
            return None  # NOTE [Host pauses]
        return offload_trial(entry, step, self.solver.solve_without_offload)

    def _learn(self, entry: PlanEntry, p: PassState, calibrating: bool, step: float | None) -> str | None:
        """Learn from ``p`` (``step``: its measured seconds, None while calibrating)."""
        assert entry.cost is not None
        host = self.host
        clock = host.clock
        measured = entry.cost.estimate()
        learn_host_costs(p, measured)
        alone: list[str] = []
        on_device = host.device().type == "cuda"
        skipped = learn_forward(
            p, measured, clock=clock, on_device=on_device, calibrating=calibrating, alone=alone
        )
        if calibrating and alone and entry.calibration_tries < MAX_CALIBRATION_TRIES:
            entry.calibration_tries += 1
            entry.calibration_ran = False  # the next pass calibrates again
            pause = clock.pause(p.start_mark, p.backward_end_mark)
            log.info(
                "offrecomp: calibration pass of signature %s: %.1f ms of garbage collection "
                "distorted %s, with no repeated peer to take times from; calibrating again",
                p.signature, 1e3 * pause, ", ".join(alone),
            )
            return f"host pause {1e3 * pause:.1f} ms in {', '.join(alone)}; calibrating again"
        if not learn_backward(p, measured, clock=clock, calibrating=calibrating, on_device=on_device):
            skipped.append("backward")
        if not calibrating:
            if on_device:
                learn_served_replays(p, measured, clock)
            learn_replay_host(p, measured, clock)
        # the link as the engine's copies achieved it (per-copy overheads included)
        o = p.offload_stats
        for name in ("d2h_gbps", "h2d_gbps"):
            achieved = float(getattr(o, name, 0.0) or 0.0) if o is not None else 0.0
            if achieved > 0 and getattr(host.config, name) is None:
                setattr(measured, name, achieved)
        if calibrating:
            calibrate_replays(p, measured, host, self.replay_cost, self._entries)
            # NOTE [Calibration]: replace the recorder-inflated times outright; the plan
            # is solved with these before the next pass. Later passes average in.
            entry.cost = CostModel()
            entry.calibrated = True
            entry.needs_solve = True
        if not calibrating:  # NOTE [Sizes of regions that vary] (differences.py)
            settle_growth(entry, variable_sizes(p, measured, grow=True))
        else:  # calls that differed from their recording again (NOTE [Calibration sizes])
            variable_sizes(p, measured, grow=True, calibrating=True)
        if learn_held(p, measured):  # NOTE [Held past backward] (scheduler/timeline.py)
            entry.needs_solve = True
        # `measured` is this pass's own copy: the model keeps it as the new estimate, and
        # the entry reads it (the next pass learns on a fresh copy, so it stays as is).
        measured.replay_op_seconds = self.replay_cost.seconds
        entry.cost.update(measured, take=True)
        entry.profile = measured
        if not calibrating:
            if host.user_plan is None:
                cfg = host.config
                refresh_live(entry, step, prefetch_regions=prefetch_depth(cfg.prefetch, measured), drift=cfg.drift)
            trial_note = self._trial(entry, p, step)
            if trial_note is not None:
                return trial_note
        if skipped:  # only distorted spans are skipped, so the pass paused
            pause = clock.pause(p.start_mark, p.backward_end_mark)
            note = f"host pause {1e3 * pause:.1f} ms: not learnt from " + ", ".join(skipped)
            if calibrating and any("#" in x for x in skipped):
                note += " (regions: their repeated peers' times)"
            return note
        return None


def learn_backward(
    p: PassState, measured: Profile, *, clock: Clock, calibrating: bool, on_device: bool = False
) -> bool:
    """``p``'s backward, less its replays, stalls and the runtime's host time, into
    ``measured`` (each region's share scaled alike), and on a GPU its host time
    (``_learn_backward_host``); False when a host pause distorted it (nothing learnt).
    A split pass teaches no backward (NOTE [Split backwards] in profiling.py)."""
    fwd_total = clock.seconds(p.start_mark, p.backward_start_mark)
    bwd_total = own_seconds(p, p.backward_start_mark, p.backward_end_mark, clock)
    if fwd_total is None or bwd_total is None or split_backward(p):
        return True
    marks = within(p)
    replay = sum(clock.seconds(a, b) or 0.0 for _, a, b in marks)
    stall = float(getattr(p.offload_stats, "stall_seconds", 0.0) or 0.0)
    # NOTE [Host time]: the hooks' and the reloads' host time is the model's to add: on
    # CPU (host and device are one) it comes off the backward's time; on GPU the events
    # time the device, and it comes off the host's span of the backward instead
    extra = _backward_host_extra(p, measured)
    bwd = max(0.0, bwd_total - replay - stall - (0.0 if on_device else extra))
    # pauses inside replays went out with the replays' time
    paused = own_pause(p, p.backward_start_mark, p.backward_end_mark, clock) - sum(clock.pause(a, b) for _, a, b in marks)
    if distorts(paused, bwd):
        return False
    est = sum(r.backward_seconds for r in measured.regions)
    if est > 0 and bwd > 0:
        scale = bwd / (est + max(0.0, measured.backward_seconds - est))
        if not calibrating:
            scale = min(OUTLIER_RATIO, max(1.0 / OUTLIER_RATIO, scale))
            bwd = scale * max(est, measured.backward_seconds)
        for r in measured.regions:
            r.backward_seconds *= scale
    measured.backward_seconds = bwd
    if on_device and bwd > 0:
        _learn_backward_host(p, measured, extra, calibrating)
    return True


def _learn_backward_host(p: PassState, measured: Profile, extra: float, calibrating: bool) -> None:
    """NOTE [Backward host time]: each region's backward host time from ``p``'s host span
    of its backward, less the replays' host spans and the runtime's ``extra`` host time,
    shared out over the regions as their device times are."""
    start, end = p.backward_start_mark, p.backward_end_mark
    others = [*within(p), *((0, a, b) for a, b in others_inside(p, start, end) or ())]
    host = end.host - start.host - sum(b.host - a.host for _, a, b in others) - extra
    if host <= 0:
        return
    ratio = host / measured.backward_seconds
    for r in measured.regions:
        new = r.backward_seconds * ratio
        old = r.backward_host_seconds
        if old is not None and old > 0 and not calibrating:
            new = min(OUTLIER_RATIO * old, max(old / OUTLIER_RATIO, new))
        r.backward_host_seconds = new


# NOTE [Backward host time]
# On a GPU the host issues a backward's kernels ahead of the device where the kernels are
# long (the autograd engine, the unpack hooks, the reloads' issue), and a unit's backward
# in the model takes the longer of its device and host time (NOTE [Host time] in
# scheduler/timeline.py). Without a measured host time a region's is its device time, so
# every unpack and reload issue the model adds lengthens its backward by all of it, where
# a device that takes the longer hides them under its kernels: at 8K tokens on an H200 the
# plans that offload (a reload per group) ran at 0.980-0.984 of their prediction, those
# without at 1.006-1.014. Each planned or calibration pass on a GPU measures the host's
# span of its backward, less the replays' host spans and the hooks' and reloads' host
# time, and gives each region the share of it its device time has; the root's share keeps
# its device time. The device time of the backward is the events', with nothing taken
# off for the runtime's host time.


def learn_forward(
    p: PassState, measured: Profile, *, clock: Clock, on_device: bool, calibrating: bool, alone: list[str]
) -> list[str]:
    """NOTE [Forward timeline]: learn the forward's pieces from ``p`` into
    ``measured`` (the estimate's copy); the pieces a host pause made it skip.

    A planned pass moves a region's time by at most ``OUTLIER_RATIO`` either way.
    A calibration pass replaces the recorder's times, which a skipped region would
    keep (NOTE [Host pauses]): a repeated block takes its clean peers' times, and
    the regions without one go into ``alone`` (the caller sends the pass back).
    """
    calls = [c for c in p.calls if not c.is_root]
    skipped: list[str] = []
    o = p.offload_stats
    waited = int(getattr(o, "window_waits", 0) or 0) if o is not None else 0
    skipped_regions = _learn_regions(
        p, calls, measured, clock=clock, on_device=on_device, calibrating=calibrating, waited=waited, skipped=skipped
    )
    if calibrating and skipped_regions:
        alone += _fill_from_peers(measured, skipped_regions)
    if not _aligned(calls, measured.regions):
        # The pass's calls are not the profile's regions one for one (a structure
        # the next measuring pass will settle): the whole forward, when clean.
        _learn_whole_forward(p, measured, clock=clock, on_device=on_device, waited=waited, skipped=skipped)
    else:
        _learn_gaps(p, calls, measured, clock=clock, calibrating=calibrating, waited=waited, skipped=skipped)
    return skipped


def _learn_regions(
    p: PassState, calls: list[RegionCall], measured: Profile, *, clock: Clock, on_device: bool, calibrating: bool,
    waited: int, skipped: list[str],
) -> set[tuple[str, int]]:
    """Each region call's forward span into its region record (scaling its ops and its
    storages' offsets alike); the regions a host pause distorted (added to ``skipped``)."""
    by_key = {r.key: r for r in measured.regions}
    seen: set[tuple[str, int]] = set()
    skipped_regions: set[tuple[str, int]] = set()
    for call in calls:
        r = by_key.get(call.key)
        if r is None or call.key in seen:
            continue
        seen.add(call.key)
        offloads = any(rec.placement == OFFLOAD for rec in call.storages)
        if offloads and waited:
            continue  # NOTE [Source lifetime]: a window wait stalls compute anywhere
        fwd = clock.seconds(call.start_mark, call.end_mark)
        if fwd is None or fwd <= 0 or r.forward_seconds <= 0 or others_inside(p, call.start_mark, call.end_mark) != []:
            continue  # (or one crossed it: NOTE [Backwards of other passes] in profiling.py)
        if clock.distorted(call.start_mark, call.end_mark, fwd):
            skipped.append(f"{call.name}#{call.call_index}")
            skipped_regions.add(call.key)
            continue
        # NOTE [Host time]: the span holds the checkpoint's, the pack hooks' and the
        # group offload's host time, which the model adds per unit: on CPU (host and
        # device are one) it comes off the region's time; on GPU the events time the
        # device, and the host's own span, less that time, is the region's host time
        extra = call.capture_seconds + (0.0 if call.native else _forward_host_extra(measured, r, offloads))
        if on_device:
            host = call.end_mark.host - call.start_mark.host - extra
            if host > 0:
                old = r.host_seconds
                if old is not None and old > 0 and not calibrating:
                    host = min(OUTLIER_RATIO * old, max(old / OUTLIER_RATIO, host))
                r.host_seconds = host
        elif fwd - extra > 0:
            fwd -= extra
        ratio = fwd / r.forward_seconds
        if not calibrating:
            ratio = min(OUTLIER_RATIO, max(1.0 / OUTLIER_RATIO, ratio))
        r.forward_seconds *= ratio
        for op in r.ops:
            op.seconds *= ratio
        for st in r.storages:
            st.offset_seconds *= ratio
    return skipped_regions


def _learn_whole_forward(
    p: PassState, measured: Profile, *, clock: Clock, on_device: bool, waited: int, skipped: list[str]
) -> None:
    """The forward total of a pass whose calls are not the profile's regions, when no
    window wait or host pause is in it."""
    fwd_total = own_seconds(p, p.start_mark, p.backward_start_mark, clock)  # NOTE [Backwards of other passes]
    if fwd_total is None or waited != 0:
        return
    if own_distorted(p, p.start_mark, p.backward_start_mark, clock, fwd_total):
        skipped.append("forward")
        return
    # NOTE [Host time]: on CPU the total holds the checkpoints, the hooks and the
    # group offloads, which the model adds back per unit
    o = p.offload_stats
    groups = int(getattr(o, "groups_offloaded", 0) or 0) if o is not None else 0
    extra = (
        0.0
        if on_device
        else p.stats.capture_seconds
        + int(p.stats.hooked_saves) * measured.pack_host_seconds
        + groups * measured.offload_host_seconds
    )
    measured.forward_seconds = fwd_total - extra if extra < fwd_total else fwd_total
    _fit_timeline(measured)


def _fit_timeline(profile: Profile) -> None:
    """Shrink the gaps between the regions' start times so that the timeline ends within
    the learnt forward total: starts left from a measuring pass that a one-off pause
    lengthened would otherwise outweigh every later total (NOTE [Forward timeline])."""
    gaps = _gaps(profile)
    inner = sum(gaps[:-1])
    busy = sum(r.forward_seconds for r in profile.regions)
    if not profile.regions or inner + busy <= profile.forward_seconds:
        return
    scale = max(0.0, profile.forward_seconds - busy) / inner if inner > 0 else 0.0
    t = 0.0
    for gap, r in zip(gaps, profile.regions):
        t += gap * scale
        r.start_seconds = t
        t += r.forward_seconds


def _learn_gaps(
    p: PassState, calls: list[RegionCall], measured: Profile, *, clock: Clock, calibrating: bool,
    waited: int, skipped: list[str],
) -> None:
    """The gaps before the first region, between regions and after the last one; the
    timeline (region starts, the root saves' offsets, the forward) rebuilt from them."""
    regions = measured.regions
    bounds = [p.start_mark]
    for c in calls:
        bounds += [c.start_mark, c.end_mark]
    bounds.append(p.backward_start_mark)
    at = [clock.seconds(p.start_mark, m) for m in bounds]
    times = [t for t in at if t is not None]
    if len(times) != len(at) or any(b < a for a, b in itertools.pairwise(times)):
        return  # unresolved marks, or regions that overlap: no timeline
    gaps = _gaps(measured)  # the estimate's, replaced by what this pass measured cleanly
    gap_learnt = [False] * len(gaps)
    unpaused = list(gaps)  # a distorted gap's time less its pause
    if waited == 0:  # NOTE [Source lifetime]: a window wait stalls compute anywhere
        for j in range(len(gaps)):
            a, b = bounds[2 * j], bounds[2 * j + 1]
            g = times[2 * j + 1] - times[2 * j]
            if p.other_backwards:  # NOTE [Backwards of other passes] (profiling.py): less those inside
                own = own_seconds(p, a, b, clock)
                if own is None:
                    continue  # one crosses the gap's bounds: the estimate's gap stands
                g = own
            if own_distorted(p, a, b, clock, g):
                skipped.append(f"gap {j}")
                unpaused[j] = max(0.0, g - own_pause(p, a, b, clock))
                continue
            gaps[j] = g
            gap_learnt[j] = True
    if calibrating and waited == 0 and not all(gap_learnt):
        # The estimate's gaps are the measuring pass's, which hold the recorder's
        # setup: a paused gap between blocks takes the median of the clean ones. The
        # first and the last (the root's own work) have no peers: their time less
        # the pause (exact on CPU; on GPU at most the queued work short, and later
        # passes learn gaps without bounds).
        inner = sorted(gaps[j] for j in range(1, len(gaps) - 1) if gap_learnt[j])
        for j, ok in enumerate(gap_learnt):
            if not ok:
                gaps[j] = inner[len(inner) // 2] if 0 < j < len(gaps) - 1 and inner else unpaused[j]
    t = 0.0
    gap_start = []
    for j, r in enumerate(regions):
        gap_start.append(t)
        t += gaps[j]
        r.start_seconds = t
        t += r.forward_seconds
    gap_start.append(t)
    measured.forward_seconds = t + gaps[-1]
    # root saves: at their place within their gap, on the rebuilt timeline
    if p.root is not None and len(p.root.storages) == len(measured.root):
        for rec_s, st in zip(p.root.storages, measured.root):
            off = clock.seconds(p.start_mark, rec_s.save_mark)
            if off is None:
                continue
            for j in range(len(gaps)):
                if times[2 * j] <= off <= times[2 * j + 1]:
                    if gap_learnt[j]:
                        into = own_seconds(p, bounds[2 * j], rec_s.save_mark, clock) if p.other_backwards else None
                        st.offset_seconds = gap_start[j] + min(off - times[2 * j] if into is None else into, gaps[j])
                    break


def learn_host_costs(p: PassState, measured: Profile) -> None:
    """NOTE [Host time]: the runtime's own host costs as ``p`` measured them, into
    ``measured`` (the cost model averages them): per saved tensor in the pack and
    the unpack hook (``PassStats.pack_seconds`` over ``pack_timed``, the calls timed:
    a native call's saves run no hook, so a pass's timed calls are not a fixed share
    of its saves), per region call's replay checkpoint (``capture_seconds`` over
    ``captures``), per group offload and per group reload issued
    (``OffloadStats.offload_host_seconds`` over ``groups_offloaded``,
    ``reload_host_seconds`` over ``groups_reloaded``). A cost the pass did not measure
    keeps the estimate; one pass moves a cost by at most ``OUTLIER_RATIO`` times the
    estimate (plus 20 us)."""
    st, o = p.stats, p.offload_stats
    costs = {
        "pack_host_seconds": (st.pack_seconds, st.pack_timed),
        "unpack_host_seconds": (st.unpack_seconds, st.unpack_timed),
        "capture_host_seconds": (st.capture_seconds, st.captures),
        "offload_host_seconds": (
            getattr(o, "offload_host_seconds", None),
            int(getattr(o, "groups_offloaded", 0) or 0),
        ),
        "reload_host_seconds": (
            getattr(o, "reload_host_seconds", None),
            int(getattr(o, "groups_reloaded", 0) or 0),
        ),
    }
    for name, (total, count) in costs.items():
        if total is None or count <= 0 or not total > 0:
            continue  # not measured: the estimate stands
        per = float(total) / count
        old = getattr(measured, name)
        if old > 0:
            per = min(per, OUTLIER_RATIO * old + 20e-6)
        setattr(measured, name, per)


def _forward_host_extra(measured: Profile, r: RegionRecord, offloads: bool) -> float:
    """Host time the runtime added to region ``r``'s forward span: its saves' pack
    hooks and, when it offloads, its group's offload issue (NOTE [Host time])."""
    saves = sum(st.saves for st in r.storages)
    return saves * measured.pack_host_seconds + (measured.offload_host_seconds if offloads else 0.0)


def _backward_host_extra(p: PassState, measured: Profile) -> float:
    """Host time the runtime added to ``p``'s backward: the unpack hooks of the saves
    that went through them and the group reloads it issued (NOTE [Host time])."""
    saves = int(p.stats.hooked_saves)
    groups = int(getattr(p.offload_stats, "groups_reloaded", 0) or 0)
    return saves * measured.unpack_host_seconds + groups * measured.reload_host_seconds


def _aligned(calls: list[RegionCall], regions: list[RegionRecord]) -> bool:
    """The pass's region calls are the profile's regions, one for one and in order."""
    return len(calls) == len(regions) and all(
        c.key == r.key and c.start_mark is not None and c.end_mark is not None
        for c, r in zip(calls, regions)
    )


def _fill_from_peers(profile: Profile, skipped: set[tuple[str, int]]) -> list[str]:
    """Give each skipped region the forward time and op times of the median of its clean
    peers (regions of the same shape, NOTE [Host pauses]); the names of those with none."""
    clean: dict[tuple[Any, ...], list[RegionRecord]] = {}
    for r in profile.regions:
        if r.key not in skipped and r.ops:
            clean.setdefault(region_shape(r), []).append(r)
    alone = []
    for r in profile.regions:
        if r.key not in skipped:
            continue
        peers = sorted(clean.get(region_shape(r), []), key=lambda q: q.forward_seconds)
        if not peers:
            alone.append(f"{r.name}#{r.call_index}")
            continue
        peer = peers[len(peers) // 2]
        r.forward_seconds = peer.forward_seconds
        for op, q in zip(r.ops, peer.ops):
            op.seconds = q.seconds
        for st, qs in zip(r.storages, peer.storages):
            st.offset_seconds = qs.offset_seconds
    return alone


def _gaps(profile: Profile) -> list[float]:
    """The estimate's forward gaps: before the first region, between regions (from their
    start times) and after the last one, none below 0 (NOTE [Forward timeline])."""
    gaps, end = [], 0.0
    for r in profile.regions:
        gaps.append(max(0.0, r.start_seconds - end))
        end = max(end, r.start_seconds) + r.forward_seconds
    gaps.append(max(0.0, profile.forward_seconds - end))
    return gaps


def _calibrated_another(entry: PlanEntry, p: PassState) -> bool:
    """The calibration pass ``p`` ran on recordings that ``entry`` no longer holds (it
    measured again since: NOTE [Calibration sizes] in differences.py)."""
    structures = entry.structures
    return any(c.structure is not None and structures.get(c.key) is not c.structure for c in p.calls)


# NOTE [Served replay times]
# A replay under the dispatch mode runs only the ops its program marks RUN (NOTE [Which
# ops replay runs] in trace/structure.py). Their seconds come from the calibration
# pass's plain replays, fitted region by region (NOTE [Calibration]): right for the ops
# together, not always for a part of them. On an H200 at 16K tokens, serving replays ran
# at 0.70-0.76x their prediction while plain replays ran within 4% of theirs, and the
# planner, pricing plans that serve too high, chose plans that ran 2-4% slower. What a
# served replay takes beyond its ops' seconds is the dispatch mode's own cost, learnt
# per op (NOTE [Serving overhead]); on a GPU, where the mode's host work runs ahead of
# the device, what a replay's device time falls short of them can only be the ops': in
# each planned pass's measured profile the ops such a replay ran take its time over their
# seconds in the estimate (at least SERVED_FLOOR of them), which the cost model averages
# in as it does every measured time, so the plans that serve are priced as they run.
# Ops never grow here: time above them may be the mode's. On a CPU host and device are
# one: a replay's time holds the mode's cost as well as the ops', and a fast pass on a
# noisy host would bring the ops down and the mode's cost up, which prices plain replays
# too low; there the ops keep their calibrated times. A replay a host pause distorted
# teaches nothing.

#: The least share of the ops' seconds one served replay's time sets them to.
SERVED_FLOOR = 0.5


def learn_served_replays(p: PassState, measured: Profile, clock: Clock) -> None:
    """NOTE [Served replay times]: the ops of ``p``'s served replays that ran faster than
    ``measured`` says, scaled toward their measured time."""
    if not p.dispatch_replays:
        return
    by_ordinal = {c.ordinal: c for c in p.calls}
    by_key = {r.key: r for r in measured.regions}
    for ordinal, a, b, _, program in p.dispatch_replays:
        call = by_ordinal.get(ordinal)
        r = by_key.get(call.key) if call is not None else None
        secs = clock.seconds(a, b)
        if r is None or secs is None or len(program) > len(r.ops) or clock.distorted(a, b, secs):
            continue
        ran = [j for j, act in enumerate(program) if act == RUN]
        predicted = sum(r.ops[j].seconds for j in ran)
        if predicted <= 0 or secs >= predicted:
            continue
        scale = max(SERVED_FLOOR, secs / predicted)
        for j in ran:
            r.ops[j].seconds *= scale


# NOTE [Replay host time]
# A replay's host work (the region's Python forward, each op's launch, the replay's own
# hooks and checkpoint restore) runs ahead of the device where the ops are long, and
# holds the device up where they are short: at 4K tokens on an H200, plain replays ran at
# 1.2-1.5x the ops' seconds the planner priced them with, at 16K within 4%. The
# simulator takes a backward unit's time as the longer of its device time and its host
# time, a replay's host time being its ops' seconds plus ``Profile.replay_host_seconds`` (NOTE
# [Host time] in scheduler/timeline.py). On a GPU each planned pass sets that figure to
# the median, over its timed plain replays, of the replay's host span less its ops'
# seconds in the estimate (0 where the host ran ahead), which the cost model averages
# in. Served replays teach it nothing (their host time holds the dispatch mode's cost,
# learnt per op: NOTE [Serving overhead]). A CPU learns it too: its ops' seconds are
# fitted to the calibration's whole replays (NOTE [Calibration]), which spread a
# replay's fixed costs (the checkpoint's restore, the early stop) over every op, so a
# plan's partial replay of a prefix costs more than its ops' seconds (left out, a small
# GPT's planned steps run 1.24x their prediction, and each drift check solves the same
# plan again).

#: A figure learnt as 0 (the host ran ahead of every replay), which the cost model, taking
#: 0 for unmeasured, would otherwise keep from an earlier pass.
_ZERO = 1e-12


def learn_replay_host(p: PassState, measured: Profile, clock: Clock) -> None:
    """NOTE [Replay host time]: ``measured.replay_host_seconds`` from ``p``'s plain replays."""
    if not p.plain_replays:
        return
    by_ordinal = {c.ordinal: c for c in p.calls}
    by_key = {r.key: r for r in measured.regions}
    extra = []
    for ordinal, a, b, k in p.plain_replays:
        call = by_ordinal.get(ordinal)
        r = by_key.get(call.key) if call is not None else None
        if r is None or not r.ops or k <= 0 or clock.distorted(a, b):
            continue
        ops = sum(op.seconds for op in r.ops[:k])
        extra.append(max(0.0, (b.host - a.host) - ops))
    if extra:
        measured.replay_host_seconds = max(_ZERO, statistics.median(extra))

