"""Step records: a step's passes summed into a ``StepRecord`` when the step ends, with
the plan's prediction beside them, and its device times filled once they can be read
(NOTE [Lazy timing])."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from offrecomp.config import format_bytes
from offrecomp.planning.solving import infeasible_note
from offrecomp.report import StepRecord
from offrecomp.signatures import shown
from offrecomp.state import PassState, PassStats

if TYPE_CHECKING:
    from offrecomp.measure import Clock
    from offrecomp.planning.entries import PlanEntry
    from scheduler.plan import Plan

log = logging.getLogger(__name__)

#: A planned step whose activation peak passes its budget by more than this warns.
OVER_BUDGET = 1.05


def step_record(step: int, passes: list[PassState], mode: str) -> StepRecord:
    """The record of one step of ``passes`` under ``mode``: what its passes placed and
    moved; its times are filled by ``fill_times``.

    NOTE [Lazy timing]: on GPU, times come from CUDA events that complete after the
    host has moved on. A record waits in the planner's pending records until its events
    have landed (checked with ``query()``, never a host sync in the training loop);
    ``report()`` and leaving the context wait for the rest.
    """
    # the step is its first pass with a backward, not a dropped graph's (NOTE [Dropped
    # graphs]) or a failed forward's
    first = next((q for q in passes if not q.aborted), passes[0])
    last = passes[-1]
    rec = StepRecord(step=step, passes=len(passes), signature=first.signature, mode=mode)
    rec.phase = first.phase
    # a step of several passes (gradient accumulation) shows each phase it ran: its
    # first step measures and then calibrates ("measure+calibrate")
    rec.phases = "+".join(dict.fromkeys(p.phase for p in passes))
    rec.plan_id = first.plan_id
    rec.wall_seconds = max(0.0, last.end_time - first.start_time)
    rec.planner_seconds = sum(p.planner_seconds for p in passes)
    total = PassStats()
    for p in passes:
        total.add(p.stats)
        # replays as the step ends, not as each pass does: a pass a later forward ended
        # (1F1B: NOTE [Several backwards] in lifecycle.py) replays in the backwards after
        for call in p.all_calls():
            total.replays += call.replays
            total.served_ops += call.served_ops
            total.rerun_ops += call.rerun_ops
        if p.device_peak is not None:
            rec.device_peak_bytes = max(rec.device_peak_bytes or 0, p.device_peak)
        o = p.offload_stats
        if o is not None:
            rec.backend = getattr(o, "backend", "")
            rec.d2h_bytes += int(getattr(o, "bytes_d2h", 0))
            rec.h2d_bytes += int(getattr(o, "bytes_h2d", 0))
            rec.served_groups += int(getattr(o, "groups_served", 0))
            rec.stall_seconds += float(getattr(o, "stall_seconds", 0.0))
            rec.d2h_gbps = float(getattr(o, "d2h_gbps", None) or rec.d2h_gbps)
            rec.h2d_gbps = float(getattr(o, "h2d_gbps", None) or rec.h2d_gbps)
            rec.pool_reserved_bytes = int(getattr(o, "pool_reserved_bytes", 0))
            rec.pool_high_water_bytes = int(getattr(o, "pool_high_water_bytes", 0))
    rec.peak_activation_bytes = total.peak_resident_bytes
    rec.kept_bytes = total.kept_bytes
    rec.offloaded_bytes = total.offloaded_bytes
    rec.recomputed_bytes = total.recomputed_bytes
    rec.input_bytes = total.input_bytes
    rec.replays = total.replays
    rec.served_ops = total.served_ops
    rec.rerun_ops = total.rerun_ops
    rec.saved_tensors = total.saved_tensors
    rec.storages = total.storages
    rec.fallbacks = dict(total.fallbacks)
    return rec


def add_prediction(rec: StepRecord, runs: list[tuple[PlanEntry | None, Plan]], *, every_pass: bool) -> None:
    """The prediction of the step ``rec`` from the plans its passes ran of their own,
    each with its entry, if any (``every_pass``: one for each of its passes): the largest
    of their peaks, a budget bounding one pass, and, where every pass ran one, their
    times summed, as the step's are (NOTE [Budgets per pass]). Each plan's is the live one
    where there is one (NOTE [Live prediction] in drift.py)."""
    times: list[tuple[float | None, ...]] = []
    peaks: list[int] = []
    for entry, plan in runs:
        live = entry.live if entry is not None and plan is entry.plan else None
        if live is not None:
            times.append((live.step_seconds, live.forward_seconds, live.recompute_seconds, live.stall_seconds))
            peaks.append(live.peak_bytes)
        else:
            times.append((
                plan.predicted_step_seconds, plan.predicted_forward_seconds,
                plan.predicted_recompute_seconds, plan.predicted_stall_seconds,
            ))
            if plan.predicted_peak_bytes is not None:
                peaks.append(plan.predicted_peak_bytes)
    rec.predicted_peak_bytes = max(peaks) if peaks else None
    if not every_pass or any(t[0] is None for t in times):
        return  # a pass ran no plan of its own (or one predicting no step): nor does the step
    rec.predicted_step_seconds = sum(t[0] or 0.0 for t in times)
    rec.predicted_forward_seconds = sum(t[1] or 0.0 for t in times)
    rec.predicted_recompute_seconds = sum(t[2] or 0.0 for t in times)
    rec.predicted_stall_seconds = sum(t[3] or 0.0 for t in times)


# NOTE [Budgets per pass]
# A budget bounds what one pass holds: a step of several passes (gradient accumulation)
# frees each micro-batch's activations in its backward before the next forward. Where
# the micro-batches differ in shape (dynamic padding), the passes of one step run the
# plans of several signatures, each solved for its own shape: each pass is checked
# against the plan it ran, and a warning names that pass's signature (the step's first
# pass would blame a plan that met its budget for a longer micro-batch's peak, and keep
# quiet about the longer one's budget being out of reach). The step's record shows the
# largest budget and predicted peak among the plans its passes ran, beside its peak,
# the largest of its passes', and their predicted times summed, as its measured times
# are (a prediction of one pass beside a step of several read as a plan running twice
# its time); a step with a pass that ran no plan of its own (a measuring or borrowing
# one) has no predicted times, and the largest predicted peak of the plans that did.


def check_pass(rec: StepRecord, entry: PlanEntry, plan: Plan, p: PassState) -> None:
    """The planned pass ``p`` of the step ``rec`` ran ``plan``: ``entry``'s own, or
    borrowed from it. Its peak against the plan's budget (NOTE [Budgets per pass]):
    an infeasible plan's warning (one borrowed too: a lower budget would not help it),
    else the over-budget one, each once per entry."""
    budget = plan.budget_bytes
    if budget is not None:
        rec.budget_bytes = max(rec.budget_bytes or 0, budget)
    held = p.stats.peak_resident_bytes
    if budget is not None and not plan.feasible:
        warn_infeasible(entry, plan, budget, held)
    else:
        check_budget(entry, plan, held, p.signature, double=p.double_backward)


def check_budget(entry: PlanEntry, plan: Plan, held: int, signature: str, *, double: bool = False) -> None:
    """A pass of ``signature`` that ran ``plan`` (``entry``'s own, or borrowed from it)
    held ``held`` bytes at its peak: a warning, once per entry, when that is more than
    the budget (``double``: the pass's backward made a graph a second backward
    differentiates)."""
    budget = plan.budget_bytes
    if entry.warned_infeasible:
        return  # the budget was said to be out of reach: a lower one would not help
    if budget is not None and held > OVER_BUDGET * budget and not entry.warned_over_budget:
        entry.warned_over_budget = True
        log.warning(
            "offrecomp: signature %s: a planned step held %s of activations for a "
            "budget of %s (%+.0f%%).%s",
            shown(signature), format_bytes(held), format_bytes(budget),
            100 * (held / budget - 1),
            " Its backward made a graph that a second backward differentiates (a "
            "gradient penalty); that graph holds the tensors the first backward's "
            "replays regenerate, which the plan does not count: expect this margin, "
            "or keep those regions (regions=, mode='keep')." if double else
            " This is the most memory-frugal plan: the measuring pass held less by "
            "dropping saves no plan drops (saves under min_bytes, saves a region did not "
            "make); raise the budget, or lower min_bytes." if plan.plan_id == entry.frugal_plan_id else
            " Plan with a budget lower by that margin; rt.explain() and the step "
            "records show where the memory went.",
        )


def warn_infeasible(entry: PlanEntry, plan: Plan, budget: int, held: int) -> None:
    """NOTE [Infeasible budgets]: once per signature, at its first planned step (a step
    within the budget says nothing), naming the smallest budget the solver accepts: the
    lower of the frugal plan's prediction and the measuring pass's peak, so that the
    same budget with infeasible='error' runs."""
    if entry.warned_infeasible or held <= budget:
        return
    entry.warned_infeasible = True  # once per signature, not once per re-plan
    smallest = plan.min_feasible_budget_bytes or held
    plan.min_feasible_budget_bytes = smallest
    plan.notes = [n for n in plan.notes if "cannot be met" not in n] + [infeasible_note(budget, smallest)]
    log.warning(
        "offrecomp: signature %s: %s. Raise the budget (budget=, OFFRECOMP_BUDGET) or "
        "accept the most frugal plan; infeasible='error' makes this an error",
        shown(entry.signature), "; ".join(plan.notes),
    )


def times_ready(clock: Clock, passes: list[PassState]) -> bool:
    """The events of every mark the step's times are read from have landed."""
    first, last = passes[0], passes[-1]
    marks = [first.start_mark, last.backward_end_mark]
    for p in passes:
        marks += [m for _, a, b in p.replay_marks for m in (a, b)]
    return clock.ready(*marks)


def fill_times(rec: StepRecord, passes: list[PassState], clock: Clock) -> None:
    """The step's measured times into ``rec``, waiting for their events."""
    first, last = passes[0], passes[-1]
    secs = clock.seconds(first.start_mark, last.backward_end_mark, wait=True)
    rec.step_seconds = secs if secs is not None else rec.wall_seconds
    rec.recompute_seconds = sum(
        clock.seconds(a, b, wait=True) or 0.0 for p in passes for _, a, b in p.replay_marks
    )
    rec.forward_seconds = sum(
        clock.seconds(p.start_mark, p.backward_start_mark, wait=True) or 0.0 for p in passes
    )
    rec.forward_host_seconds = sum(
        p.backward_start_mark.host - p.start_mark.host
        for p in passes
        if p.start_mark is not None and p.backward_start_mark is not None
    )
