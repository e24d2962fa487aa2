"""NOTE [Held past backward] (scheduler/timeline.py): storages the training loop keeps
alive through backward (the loss's saved output and target, a block output the model
hands back) stay resident in the books until backward ends; auto plans with them held,
so what a planned step holds is what its plan predicted, within the budget."""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from tests.helpers import assert_bitwise

OUT = 256


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.a = nn.Linear(d, 4 * d)
        self.b = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


class _Model(nn.Module):
    """Four blocks and a head; also hands back the second block's output."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(d) for _ in range(4))
        self.head = nn.Linear(d, OUT)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mid = x
        for i, b in enumerate(self.blocks):
            x = b(x)
            if i == 1:
                mid = x
        return self.head(x), mid


def _loop(m: nn.Module, steps: int) -> list[dict[str, torch.Tensor]]:
    """The usual loop: ``out``, ``y`` (which mse_loss saves) and ``mid`` stay referenced
    through ``backward()``."""
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    grads: list[dict[str, torch.Tensor]] = []
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, 64, generator=g)
        y = torch.randn(32, OUT, generator=g)
        out, mid = m(x)
        loss = F.mse_loss(out, y) + 1e-3 * mid.square().mean()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad()
    return grads


def _model() -> nn.Module:
    torch.manual_seed(0)
    return _Model()


def _keep_peak() -> int:
    m = _model()
    with offrecomp.runtime(m, mode="keep") as rt:
        _loop(m, 1)
    return rt.report().steps[-1].peak_activation_bytes


def _planned(budget: int, caplog: pytest.LogCaptureFixture) -> tuple[list[Any], list[str]]:
    ref = _loop(_model(), 6)
    m = _model()
    with caplog.at_level(logging.INFO, logger="offrecomp"), offrecomp.runtime(m, mode="auto", budget=budget) as rt:
        got = _loop(m, 6)
    assert_bitwise(ref, got)
    planned = [s for s in rt.report().steps if s.phase == "planned"]
    assert planned
    return planned, [r.getMessage() for r in caplog.records]


def test_planned_steps_hold_what_they_predict_within_the_budget(caplog: pytest.LogCaptureFixture) -> None:
    budget = _keep_peak() * 3 // 4
    planned, messages = _planned(budget, caplog)
    assert not [x for x in messages if "cannot be met" in x]
    for s in planned:
        assert s.peak_activation_bytes == s.predicted_peak_bytes, s
        assert s.peak_activation_bytes <= budget, (s, budget)


def test_the_smallest_feasible_budget_named_is_held(caplog: pytest.LogCaptureFixture) -> None:
    budget = _keep_peak() // 2
    planned, messages = _planned(budget, caplog)
    named = [int(x) for m in messages for x in re.findall(r"smallest feasible budget is [^(]*\((\d+) bytes\)", m)]
    assert named, messages
    for s in planned:
        assert s.peak_activation_bytes == s.predicted_peak_bytes == named[0], (s, named)


def test_the_profile_marks_what_the_loop_holds() -> None:
    """The loss's two saves in the root, the model's input, and the block output the
    loop holds (the third block's input): held; the blocks' own saves are not."""
    m = _model()
    with offrecomp.runtime(m, mode="auto", budget=1) as rt:
        _loop(m, 3)
    (profile,) = [e.profile for e in rt._planner.entries.values() if e.profile is not None]
    big = [s for s in profile.root if s.nbytes == 32 * OUT * 4]
    assert len(big) == 2 and all(s.held for s in big)
    held = {(r.name, i) for r in profile.regions for i, s in enumerate(r.storages) if s.held}
    assert held == {("blocks.0", 0), ("blocks.2", 0)}, held
    copy.deepcopy(profile)
