"""NOTE [Offload trial]: whether plans of a signature may offload, decided by measuring
the plan that offloads against the one that does not."""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler.plan import Placement

if TYPE_CHECKING:
    from offrecomp.planning.entries import PlanEntry
    from scheduler.plan import Plan

log = logging.getLogger(__name__)

#: NOTE [Offload trial]: a plan that offloads is tried against one that does not when
#: its measured step exceeds its prediction by more than this ...
TRIAL_EXCESS = 0.10
#: ... over the median of this many planned passes; each plan then runs this many.
TRIAL_PASSES = 3


# NOTE [Offload trial]
# The model takes an offload that hides under compute to cost nothing. On a GPU its
# copies, events, the stash and the reloads also cost host time and stream waits the
# model does not see; where the forward is short (an H200 at 4K tokens: 1.5 ms a block)
# plans that offload ran 1.46x their prediction and 1.33x full recompute, while the
# plan solved for the same budget without offloading ran 1.07x its prediction and 0.88x
# full recompute. So the runtime checks the plan by measurement: when the median of
# TRIAL_PASSES planned passes of a plan that offloads is more than TRIAL_EXCESS over
# its prediction, it solves the same budget without offloading; if that plan fits the
# budget and is predicted faster than what the offloading plan measured, it runs for
# TRIAL_PASSES passes, and the faster of the two by measured median stays for the
# signature (re-plans included). Each signature is tried once. The passes watched are
# the current plan's, less its first (one-time costs: the first use of its reload
# buffers' sizes, say) and any a host pause distorted (NOTE [Host pauses]): at 4K
# tokens on an H200 a plan's first three passes measured 132, 325 (a 205 ms pause) and
# 120 ms, its third within 3% of its prediction, and their median took offloading off
# for the signature.
@dataclass
class OffloadTrial:
    state: str = "watch"
    """watch (offloading allowed, plans checked), trial (running without), settled."""
    allow_offload: bool = True
    with_offload: list[float] = field(default_factory=list)
    without_offload: list[float] = field(default_factory=list)
    _plan: Plan | None = field(default=None, repr=False, compare=False)
    _plan_offloads: bool = field(default=False, repr=False, compare=False)

    def offloads(self, plan: Plan) -> bool:
        """Does ``plan`` offload a storage? Read once per plan (a step reads it every
        pass; a plan's placements do not change once solved)."""
        if self._plan is not plan:
            self._plan = plan
            self._plan_offloads = any(pl == Placement.OFFLOAD for _, pl in plan)
            if self.state == "watch":
                self.with_offload = []  # the passes watched are this plan's
        return self._plan_offloads

    def observe(self, offloads: bool, measured: float, predicted: float | None) -> str | None:
        """One planned pass of a plan that ``offloads`` (or not), ``measured`` seconds
        against ``predicted``. Returns "try" (solve without offloading, and run it if it
        is predicted faster than ``self.measured_with()``), "keep" (the plan without
        offloading measured faster: keep it), "back" (it did not: offload again), or None."""
        if self.state == "watch" and offloads and predicted:
            self.with_offload = [*self.with_offload, measured][-TRIAL_PASSES:]
            if len(self.with_offload) == TRIAL_PASSES and self.measured_with() > (1.0 + TRIAL_EXCESS) * predicted:
                self.state = "trial"
                self.allow_offload = False
                return "try"
        elif self.state == "trial" and not offloads:
            self.without_offload.append(measured)
            if len(self.without_offload) == TRIAL_PASSES:
                self.state = "settled"
                if statistics.median(self.without_offload) <= self.measured_with():
                    return "keep"
                self.allow_offload = True
                return "back"
        return None

    def measured_with(self) -> float:
        return statistics.median(self.with_offload)

    def outcome(self) -> str:
        """The settled trial, as the step notes, the log and ``rt.explain()`` say it."""
        return (
            f"{1e3 * statistics.median(self.without_offload):.1f} ms without offloading, "
            f"{1e3 * self.measured_with():.1f} ms with: "
            + ("offloading stays off" if not self.allow_offload else "offloading again")
        )

    def cancel(self) -> None:
        """The plan without offloading does not fit or is not predicted faster."""
        self.state = "settled"
        self.allow_offload = True

    def notes(self) -> list[str]:
        """What ``rt.explain()`` says of the trial: running, settled, or nothing."""
        if self.state == "trial":
            return [
                f"offload trial running: the plan that offloaded measured "
                f"{1e3 * self.measured_with():.1f} ms a step; this one does not offload"
            ]
        if self.state == "settled" and self.without_offload:
            return [f"offload trial: {self.outcome()}"]
        return []


def offload_trial(
    entry: PlanEntry, step_seconds: float, solve_without_offload: Callable[[PlanEntry], Plan]
) -> str | None:
    """NOTE [Offload trial]: learn from one planned pass of ``entry``'s own plan, which
    measured ``step_seconds``, whether offloading pays; a note for the step record when
    the trial moved. ``solve_without_offload`` solves the entry's budget without
    offloading."""
    plan, profile, trial = entry.plan, entry.profile, entry.trial
    if plan is None or profile is None or trial.state == "settled":
        return None
    offloads = trial.offloads(plan)
    predicted = entry.live.step_seconds if entry.live is not None else plan.predicted_step_seconds
    action = trial.observe(offloads, step_seconds, predicted)
    if action == "try":
        measured = trial.measured_with()
        alt = solve_without_offload(entry)
        alt_step = alt.predicted_step_seconds or math.inf
        ran = f"plan measured {1e3 * measured:.1f} ms against {1e3 * (predicted or 0.0):.1f} ms predicted"
        if not alt.feasible or alt_step >= measured:
            trial.cancel()
            why = "does not fit the budget" if not alt.feasible else f"is predicted at {1e3 * alt_step:.1f} ms"
            note = f"offload trial: {ran}; without offloading {why}: offloading stays"
        else:
            entry.needs_solve = True
            entry.next_plan = alt
            note = (
                f"offload trial: {ran}, trying without offloading (predicted "
                f"{1e3 * alt_step:.1f} ms) for {TRIAL_PASSES} passes"
            )
    elif action in ("keep", "back"):
        if action == "back":
            entry.needs_solve = True  # offloading again: solve with it
        note = f"offload trial: {trial.outcome()}"
    else:
        return None
    log.info("offrecomp: signature %s: %s", entry.signature, note)
    return note
