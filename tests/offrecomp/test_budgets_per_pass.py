"""NOTE [Budgets per pass]: a step whose micro-batches differ in shape runs the plans of
several signatures; each pass is checked against the plan it ran."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp.planning import records

SHORT, LONG = 16, 64


class _Block(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(3))
        self.head = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x).mean()


def _run(steps: list[tuple[int, ...]], **kw: object) -> offrecomp.Runtime:
    """One optimizer step per entry of ``steps``, a micro-batch per length in it."""
    torch.manual_seed(0)
    m = _Net()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    with offrecomp.runtime(m, min_bytes=0, **kw) as rt:  # type: ignore[arg-type]
        for lengths in steps:
            for n in lengths:
                m(torch.randn(4, n, 64, generator=gen)).backward()
            opt.step()
            opt.zero_grad()
    return rt


def test_micro_batches_of_other_shapes_are_checked_against_their_own_plans(caplog: pytest.LogCaptureFixture) -> None:
    """A short micro-batch then a long one per step, for a budget the short shape's plan
    meets and no plan of the long one can: the long signature's budget is said to be out
    of reach, and the short one, whose passes meet it, is not blamed for the long one's
    peak."""
    budget = _run([(SHORT,)], mode="keep").report().steps[0].peak_activation_bytes // 2
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = _run([(SHORT, LONG)] * 8 + [(SHORT, SHORT)] * 3, mode="auto", budget=budget)
    messages = [r.getMessage() for r in caplog.records]
    over = [m for m in messages if "planned step held" in m]
    infeasible = [m for m in messages if "cannot be met" in m]
    assert not any(f"(4, {SHORT}, 64)" in m for m in over), over
    assert len(infeasible) == 1 and f"(4, {LONG}, 64)" in infeasible[0], infeasible
    steps = rt.report().steps
    mixed = [s for s in steps[:8] if s.phases == "planned"]
    assert mixed, [s.phases for s in steps]
    for s in mixed:  # the long pass's plan: its prediction beside the peak it set
        assert s.predicted_peak_bytes is not None and s.predicted_peak_bytes >= 0.9 * s.peak_activation_bytes
    for s in steps[-3:]:  # the short shape alone: within its budget
        assert s.peak_activation_bytes <= 1.05 * budget and s.budget_bytes == budget


def test_a_borrowed_step_over_an_infeasible_budget_says_it_cannot_be_met(caplog: pytest.LogCaptureFixture) -> None:
    """A budget no plan of the long shape meets; a short step borrows the long shape's
    (most frugal) plan before that plan's own first step: it says the budget cannot be
    met, naming the smallest one, once, and never that a lower budget would help (the
    over-budget advice)."""
    budget = _run([(SHORT,)], mode="keep").report().steps[0].peak_activation_bytes // 20
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = _run([(LONG,), (LONG,), (SHORT,), (LONG,), (LONG,)], mode="auto", budget=budget)
    assert [s.phase for s in rt.report().steps] == ["measure", "calibrate", "borrowed", "planned", "planned"]
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "planned step held" in m], messages
    infeasible = [m for m in messages if "cannot be met" in m]
    assert len(infeasible) == 1 and f"(4, {LONG}, 64)" in infeasible[0], infeasible


def test_a_step_of_several_micro_batches_is_predicted_as_their_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Budgets per pass]: a step of two micro-batches measures both passes, and its
    prediction is both plans'; one pass's, half its time, would read as a plan running
    twice its prediction."""
    predicted = []
    add_prediction = records.add_prediction

    def spy(rec: offrecomp.StepRecord, runs: list[Any], *, every_pass: bool) -> None:
        add_prediction(rec, runs, every_pass=every_pass)
        one = offrecomp.StepRecord(step=rec.step)
        add_prediction(one, runs[:1], every_pass=True)  # one pass's, under the same estimates
        predicted.append((len(runs), rec.predicted_step_seconds, one.predicted_step_seconds))

    monkeypatch.setattr(records, "add_prediction", spy)
    rt = _run([(SHORT,)] * 6 + [(SHORT, SHORT)] * 4, mode="auto")
    steps = rt.report().steps
    double = [s for s in steps[6:] if s.phases == "planned" and s.passes == 2]
    assert double, [(s.phases, s.passes) for s in steps]
    assert sorted({n for n, *_ in predicted}) == [1, 2]
    for n, step, one in predicted:
        assert step is not None and one is not None and step == pytest.approx(n * one, rel=1e-12)
    assert [s.predicted_step_seconds for s in double] == [step for n, step, _ in predicted if n == 2]


def test_each_pass_of_a_step_is_predicted_by_the_plan_it_ran() -> None:
    """A plan set between the micro-batches of a step runs only in the later one: the
    step's prediction is the solver's plan for the first pass and the set plan for the
    second; crediting both with the set plan, the plan the entry holds when the step's
    record is made, would predict a second more."""
    torch.manual_seed(0)
    m = _Net()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    with offrecomp.runtime(m, min_bytes=0, mode="auto") as rt:
        for _ in range(5):
            m(torch.randn(4, SHORT, 64, generator=gen)).backward()
            opt.step()
            opt.zero_grad()
        solved = rt.planner.entries[rt.report().steps[-1].signature].plan
        assert solved is not None and solved.predicted_step_seconds
        user = copy.deepcopy(solved)
        user.plan_id, user.predicted_step_seconds = "set-between", solved.predicted_step_seconds + 1.0
        m(torch.randn(4, SHORT, 64, generator=gen)).backward()
        rt.set_plan(user)
        m(torch.randn(4, SHORT, 64, generator=gen)).backward()
        opt.step()
        opt.zero_grad()
    steps = rt.report().steps
    assert [s.phases for s in steps[-1:]] == ["planned+user-plan"], [(s.phases, s.passes) for s in steps]
    one = steps[-2].predicted_step_seconds  # the solver's plan, predicted as the step's record does
    assert one is not None and one < 0.25
    assert steps[-1].predicted_step_seconds == pytest.approx(one + user.predicted_step_seconds, abs=0.1)
