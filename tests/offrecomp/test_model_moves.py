"""NOTE [Model moves]: a plan whose live prediction moved since its solve is solved again,
a bounded number of times, and the incumbent stays unless the new plan is predicted
faster by MODEL_GAIN; NOTE [Offload trial]: the trial watches the current plan's passes,
less its first and any a host pause distorted."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
import torch

import offrecomp
from offrecomp.phases import Phase
from offrecomp.planning import PlanEntry, learning
from offrecomp.planning.drift import MODEL_GAIN, MODEL_MOVE_REFRESHES, MODEL_RESOLVES, refresh_live
from offrecomp.planning.solving import Solver
from offrecomp.planning.trial import TRIAL_PASSES, OffloadTrial
from scheduler.cost_model import Prediction
from scheduler.plan import Placement, Plan
from tests.helpers import train
from tests.models import MLPBlock, stack

DRIFT = 0.25  # the default: moves of more than 5% count


def _planned(steps: int = 6) -> tuple[offrecomp.Runtime, PlanEntry]:
    """A runtime whose signature has a plan and a profile, trained ``steps`` steps."""
    torch.manual_seed(0)
    m = stack(lambda: MLPBlock(32), n=3)()
    rt = offrecomp.runtime(m, min_bytes=0, budget="50%", drift=100.0)  # no re-solve of its own

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(s))

    train(m, batch, rt, steps=steps)
    entry = next(iter(rt.planner.entries.values()))
    assert entry.plan is not None and entry.profile is not None and entry.plan.predicted_step_seconds
    entry.needs_solve = False
    return rt, entry


def _prediction(seconds: float, peak: int = 0) -> Prediction:
    return Prediction(
        step_seconds=seconds, peak_bytes=peak, recompute_seconds=0.0, stall_seconds=0.0, d2h_bytes=0, h2d_bytes=0
    )


def _predicting(monkeypatch: pytest.MonkeyPatch, seconds: list[float], peak: int = 0) -> None:
    """``predict`` answers each call with the next of ``seconds`` (the last one again
    once they run out) and ``peak`` bytes."""
    calls = iter(seconds)
    last = [seconds[0]]

    def fake(profile: Any, plan: Plan, *, prefetch_regions: int = 2) -> Prediction:
        last[0] = next(calls, last[0])
        return _prediction(last[0], peak)

    monkeypatch.setattr("offrecomp.planning.entries.predict", fake)  # PlanEntry.predict's


def _refresh(entry: PlanEntry, times: int, drift_tolerance: float = DRIFT) -> None:
    for _ in range(times):
        entry.live_every = 1
        refresh_live(entry, 1.0, prefetch_regions=2, drift=drift_tolerance)


def test_a_move_seen_on_refreshes_in_a_row_solves_again_keeping_the_incumbent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, entry = _planned()
    solved = entry.plan.predicted_step_seconds
    _predicting(monkeypatch, [1.10 * solved])  # +10%: inside drift, past its fifth
    _refresh(entry, MODEL_MOVE_REFRESHES - 1)
    assert not entry.needs_solve and entry.incumbent is None
    _refresh(entry, 1)
    assert entry.needs_solve and entry.incumbent is entry.plan and entry.model_resolves == 1


def test_a_new_plan_counts_its_own_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """A move seen on the plan before a re-solve does not count toward the next plan's."""
    rt, entry = _planned()
    solved = entry.plan.predicted_step_seconds
    _predicting(monkeypatch, [1.10 * solved])
    _refresh(entry, 1)
    assert entry.model_moves == 1
    entry.needs_solve = True  # solved again for another reason (a drifting window, say)
    rt.planner.solver.solve(entry)
    assert entry.model_moves == 0 and entry.live_reference is None


def test_a_move_within_the_share_of_drift_counts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    _, entry = _planned()
    solved = entry.plan.predicted_step_seconds
    # moved, back within 5%, moved: never twice in a row
    _predicting(monkeypatch, [1.10 * solved, 1.03 * solved] * 4)
    _refresh(entry, 8)
    assert not entry.needs_solve and entry.model_moves == 0
    _, entry = _planned()
    _predicting(monkeypatch, [0.5 * solved])  # a drift that keeps plans (100) keeps them here too
    _refresh(entry, 4, drift_tolerance=100.0)
    assert not entry.needs_solve and entry.model_resolves == 0


def test_model_moves_solve_again_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    rt, entry = _planned()
    solver: Solver = rt.planner.solver
    solved = entry.plan.predicted_step_seconds
    # an estimate that keeps moving: 10% above what the plan was last judged at
    def fake(profile: Any, plan: Plan, *, prefetch_regions: int = 2) -> Prediction:
        return _prediction(1.1 * (entry.live_reference or solved))

    monkeypatch.setattr("offrecomp.planning.entries.predict", fake)  # PlanEntry.predict's
    monkeypatch.setattr(Solver, "solve_plan", lambda self, e, **kw: dataclasses.replace(
        e.plan, predicted_step_seconds=100 * solved))  # never faster: the incumbent stays
    for _ in range(MODEL_RESOLVES + 3):
        _refresh(entry, MODEL_MOVE_REFRESHES)
        if entry.needs_solve:
            solver.solve(entry)
    assert entry.model_resolves == MODEL_RESOLVES and not entry.needs_solve


def test_the_incumbent_stays_unless_a_plan_is_predicted_faster(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rt, entry = _planned()
    solver: Solver = rt.planner.solver
    incumbent = entry.plan
    solved = incumbent.predicted_step_seconds
    now = 1.2 * solved
    _predicting(monkeypatch, [now])
    offered: list[Plan] = []

    def solve_plan(self: Solver, e: PlanEntry, **kw: Any) -> Plan:
        return offered[-1]

    monkeypatch.setattr(Solver, "solve_plan", solve_plan)
    # predicted within MODEL_GAIN of the incumbent: it stays, and moves count from `now`
    offered.append(dataclasses.replace(incumbent, plan_id="close", predicted_step_seconds=(1 - MODEL_GAIN / 2) * now))
    _refresh(entry, MODEL_MOVE_REFRESHES)
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        solver.solve(entry)
    assert entry.plan is incumbent and not entry.needs_solve and entry.live_reference == now
    assert any(f"keeps plan {incumbent.plan_id}" in r.getMessage() for r in caplog.records)
    _refresh(entry, MODEL_MOVE_REFRESHES)  # `now` again: no move from the new reference
    assert not entry.needs_solve
    # predicted MODEL_GAIN faster: it replaces the incumbent
    _predicting(monkeypatch, [1.4 * solved])
    offered.append(dataclasses.replace(incumbent, plan_id="faster", predicted_step_seconds=1.1 * solved))
    _refresh(entry, MODEL_MOVE_REFRESHES)
    assert entry.needs_solve
    solver.solve(entry)
    assert entry.plan is offered[-1] and entry.live_reference is None


def test_an_incumbent_over_its_budget_does_not_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    rt, entry = _planned()
    incumbent = entry.plan
    assert incumbent.budget_bytes is not None
    _predicting(monkeypatch, [1.2 * incumbent.predicted_step_seconds], peak=incumbent.budget_bytes + 1)
    slower = dataclasses.replace(incumbent, plan_id="slower", predicted_step_seconds=2 * incumbent.predicted_step_seconds)
    monkeypatch.setattr(Solver, "solve_plan", lambda self, e, **kw: slower)
    _refresh(entry, MODEL_MOVE_REFRESHES)
    rt.planner.solver.solve(entry)
    assert entry.plan is slower


def test_the_trial_watches_the_current_plans_passes() -> None:
    """A new plan restarts the watch: passes of an earlier plan do not count toward it."""
    plan_a = Plan(placements={("b", 0, 0): Placement.OFFLOAD})
    plan_b = Plan(placements={("b", 0, 0): Placement.OFFLOAD, ("b", 0, 1): Placement.KEEP})
    trial = OffloadTrial()
    for _ in range(TRIAL_PASSES - 1):
        assert trial.observe(trial.offloads(plan_a), 2.0, 1.0) is None
    assert trial.offloads(plan_b) and trial.with_offload == []
    for _ in range(TRIAL_PASSES - 1):
        assert trial.observe(True, 2.0, 1.0) is None
    assert trial.observe(True, 2.0, 1.0) == "try"


class _Pass:
    """What the trial reads of a planned pass."""

    phase = Phase.PLANNED
    start_mark = backward_end_mark = None


def test_the_trial_skips_a_plans_first_pass_and_paused_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    rt, entry = _planned()
    learner = rt.planner.learner
    seen: list[float] = []
    monkeypatch.setattr(learning, "offload_trial", lambda e, step, solve: seen.append(step))
    paused = [0.0]
    monkeypatch.setattr(learner.host.clock, "pause", lambda a, b: paused[0])
    entry.learnt_since_solve = 0
    learner._trial(entry, _Pass(), 0.5)  # the plan's first pass
    entry.learnt_since_solve = 1
    paused[0] = 0.2
    learner._trial(entry, _Pass(), 0.5)  # 0.2 s of a 0.5 s step in collections
    paused[0] = 0.0
    learner._trial(entry, _Pass(), 0.4)
    assert seen == [0.4]
