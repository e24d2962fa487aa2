"""When measured times leave a plan behind: the plan predicted again under the latest
estimate (NOTE [Live prediction], NOTE [Model moves]) and the measured steps judged
against the prediction (NOTE [Drift]); each marks the signature to be solved again."""

from __future__ import annotations

import logging
import statistics
import time
from typing import TYPE_CHECKING

from offrecomp.measure import distorts
from offrecomp.phases import Phase

if TYPE_CHECKING:
    from offrecomp.measure import Clock
    from offrecomp.planning.entries import PlanEntry
    from offrecomp.report import StepRecord
    from offrecomp.state import PassState

log = logging.getLogger(__name__)

#: NOTE [Drift]: planned steps whose median is judged against the prediction, ...
DRIFT_WINDOW = 8
#: ... how many of the latest windows judged are remembered, ...
DRIFT_HISTORY = 6
#: ... how many of those may drift (each followed by a re-plan) before the window grows, ...
DRIFT_REPLANS = 2
#: ... and how many times it may double.
DRIFT_MAX_BACKOFF = 8


def refresh_live(entry: PlanEntry, step_seconds: float | None, *, prefetch_regions: int, drift: float) -> None:
    """NOTE [Live prediction]: predict the plan again under the estimate that now
    includes this pass, for the next step's record and for the re-plan check.

    The plan's own prediction dates from its solve; the estimate moves with every
    pass (warm-up, clocks, other work on the machine), so the step after a pass is
    predicted from the estimate after it. When that prediction has moved by more than
    ``drift`` from the one the plan was judged at (its solve's, or that of the re-solve
    it survived), the plan was chosen for costs that no longer hold: it is solved
    again; a smaller move may solve it again too (NOTE [Model moves]).
    """
    plan, profile = entry.plan, entry.profile
    if plan is None or profile is None or entry.needs_solve:
        return
    entry.live_skipped += 1
    if entry.live_skipped < entry.live_every:
        return
    entry.live_skipped = 0
    t0 = time.perf_counter()
    try:
        live = entry.predict(profile, plan, prefetch_regions=plan.reload_depth(prefetch_regions))
    except ValueError as exc:  # the plan no longer places on this profile
        log.debug("offrecomp: live prediction skipped (%s)", exc)
        return
    spent = time.perf_counter() - t0
    if step_seconds and step_seconds > 0:
        entry.live_every = max(1, min(64, int(spent / (0.02 * step_seconds)) + 1))
    entry.live = live
    # what the plan was judged at: its solve, or the re-solve it survived (NOTE [Model moves])
    judged = entry.live_reference or plan.predicted_step_seconds
    if not judged:
        return
    moved = live.step_seconds / judged - 1.0
    if abs(moved) > drift:
        log.info(
            "offrecomp: the plan of signature %s was judged at %.4fs a step; under the "
            "measured times it now predicts %.4fs (%+.0f%%): solving again",
            entry.signature, judged, live.step_seconds, 100 * moved,
        )
        entry.needs_solve = True
    else:
        _model_moved(entry, moved, MODEL_MOVE_SHARE * drift)


# NOTE [Model moves]
# A plan is the best the solver found under the estimate of its solve. The first passes
# of a plan teach the estimate what no earlier pass could: an offloading plan's first
# pass is the first to measure the group issue's and the reloads' host time, and a new
# mix of replays measures their cost. On an H200 at 4K tokens a plan solved for a 108 ms
# step was predicted at 123 ms once its first pass was learnt, while the plan solved for
# the same budget without offloading was predicted at 115 ms: the model knew a better
# plan, but 14% is inside ``drift`` (which must tolerate noisy measured steps), so the
# plan ran on until the offload trial measured it. So a live prediction that moved more
# than MODEL_MOVE_SHARE x ``drift`` (5% at the default) from the one the plan was judged
# by, on MODEL_MOVE_REFRESHES refreshes in a row (one refresh's move may be one pass's
# one-time costs), solves the signature again, at most MODEL_RESOLVES times per profile.
# The new plan replaces the incumbent only when it is predicted at least MODEL_GAIN
# faster than the incumbent under the same estimate (``Solver.solve``); otherwise the
# incumbent stays and its prediction then becomes the one later moves are judged from.
# A move past ``drift`` solves again and takes the new plan whatever it predicts.

#: NOTE [Model moves]: the relative move of the live prediction that counts, as a share
#: of ``drift`` (0.05 at its default; a ``drift`` that keeps plans keeps them here too), ...
MODEL_MOVE_SHARE = 0.2
#: ... on this many refreshes in a row, ...
MODEL_MOVE_REFRESHES = 2
#: ... at most this many re-solves per profile, ...
MODEL_RESOLVES = 2
#: ... and the predicted gain a re-solved plan needs to replace the incumbent.
MODEL_GAIN = 0.02


def _model_moved(entry: PlanEntry, moved: float, move: float) -> None:
    """NOTE [Model moves]: count a live prediction ``moved`` (relative) from the one the
    plan was judged at, past ``move``, and mark a re-solve that keeps the incumbent
    unless beaten."""
    if entry.model_resolves >= MODEL_RESOLVES:
        return
    if abs(moved) <= move:
        entry.model_moves = 0
        return
    entry.model_moves += 1
    if entry.model_moves < MODEL_MOVE_REFRESHES:
        return
    entry.model_moves = 0
    entry.model_resolves += 1
    entry.incumbent = entry.plan
    entry.needs_solve = True
    log.info(
        "offrecomp: the plan of signature %s now predicts a step %+.0f%% off the one it was "
        "judged at: solving again, keeping it unless a plan is predicted %.0f%% faster",
        entry.signature, 100 * moved, 100 * MODEL_GAIN,
    )


# NOTE [Drift]
# A plan's prediction is checked against the measured steps on the median of a window
# of DRIFT_WINDOW planned steps, not step by step: on a loaded host single steps run
# far off either way, and a check on a few steps in a row would solve a signature
# again every few steps for good, warning each time. A window whose median is more
# than Config.drift off solves the plan again with the measured times (warned once
# per signature, then logged). A shift in the times (clocks, a longer sequence mix)
# drifts every window until a re-plan or two fits them; a host whose load comes and
# goes drifts some windows and not others, whatever the plan. So the runtime remembers
# the latest DRIFT_HISTORY windows: when more than DRIFT_REPLANS of them drifted, the
# times are not the model's to predict (another process shares the device or the
# host): the window doubles at each further drifting one, up to DRIFT_WINDOW <<
# DRIFT_MAX_BACKOFF steps, and the runtime says so once. A window within the tolerance
# halves it again only once at most one remembered window drifted, so a good window
# between two bad ones does not bring back the short window and its re-plans. A step of
# several passes (gradient accumulation) counts when they are all of one signature and
# each ran its plan, judged by their own spans summed (a forward's start to its
# backward's end: the gaps between micro-batches, a data loader's, are no plan's); a
# step mixing signatures, or with a borrowing pass, is not judged.


def check_step(entry: PlanEntry, rec: StepRecord, passes: list[PassState], clock: Clock, drift: float) -> None:
    """NOTE [Drift]: the planned step ``rec`` of ``passes``, ``entry``'s first, into the
    drift check: a step of one pass, or of passes of ``entry``'s signature that each ran
    its plan, judged by their own spans."""
    if len(passes) == 1:
        check_drift(entry, rec, drift)
    elif all(
        q.signature == entry.signature and q.planned and q.phase != Phase.BORROWED and not q.aborted
        and q.plan_id == passes[0].plan_id
        for q in passes
    ):
        spans = [clock.seconds(q.start_mark, q.backward_end_mark) for q in passes]
        if None not in spans:
            check_drift(entry, rec, drift, measured=sum(s or 0.0 for s in spans))


def check_drift(entry: PlanEntry, rec: StepRecord, drift: float, measured: float | None = None) -> None:
    """NOTE [Drift]: count a planned step of ``entry`` into its window; at the window's
    end, judge its median against ``drift`` and mark a re-plan. ``measured``: the step's
    time to judge where it is not ``rec.step_seconds`` (a step of several passes: theirs
    summed, without the gaps between them)."""
    pred = rec.predicted_step_seconds
    seconds = rec.step_seconds if measured is None else measured
    if not pred or (measured is None and rec.passes != 1):
        return
    if distorts(rec.pause_seconds, seconds):
        return  # NOTE [Host pauses]: the step's time is not the plan's
    entry.drift_ratios.append(seconds / pred)
    window = DRIFT_WINDOW << entry.drift_backoff
    if len(entry.drift_ratios) < window:
        return
    ratio = statistics.median(entry.drift_ratios)
    entry.drift_ratios.clear()
    drifted = abs(ratio - 1.0) > drift
    recent = entry.drift_windows
    recent.append(drifted)
    del recent[:-DRIFT_HISTORY]
    if not drifted:
        entry.drift_learning = False
        if entry.drift_backoff and sum(recent) <= 1:
            entry.drift_backoff -= 1
        return
    entry.drift_learning = sum(recent) <= DRIFT_REPLANS
    if not entry.drift_learning:
        entry.drift_backoff = min(DRIFT_MAX_BACKOFF, entry.drift_backoff + 1)
        if not entry.drift_said_backoff:
            entry.drift_said_backoff = True
            log.warning(
                "offrecomp: signature %s: steps still run %+.0f%% off the prediction, %d of "
                "the latest %d windows of steps off by more than the tolerance in spite of "
                "re-plans with the measured times, so its step times are not the model's to "
                "predict (another process loading the host or the device, say); re-planning "
                "backs off, judging windows of up to %d steps",
                entry.signature, 100 * (ratio - 1), sum(recent), len(recent), DRIFT_WINDOW << DRIFT_MAX_BACKOFF,
            )
    level = logging.INFO if entry.drift_warned else logging.WARNING
    entry.drift_warned = True
    log.log(
        level,
        "offrecomp: the median measured step time of %d steps is %+.0f%% off the predicted "
        "%.4fs; planning signature %s again with the measured times",
        window, 100 * (ratio - 1), pred, entry.signature,
    )
    rec.notes.append("drift: re-plan")
    entry.needs_solve = True
