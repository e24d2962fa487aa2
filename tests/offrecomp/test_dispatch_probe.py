"""The calibration pass's replay under the dispatch mode teaches the planner what that
mode costs per op before the first plan (NOTE [Dispatch probe] in
offrecomp/planning/replay_cost.py)."""

from __future__ import annotations

import logging
import re
import time

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

import offrecomp
from offrecomp.planning.replay_cost import PROBE_RANGE, SERVING_OVERHEAD_SECONDS, ReplayCost
from tests.helpers import assert_bitwise, make, tight_budget, train, twin


@pytest.fixture()
def observed(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Each cost per op a probe reported."""
    seen: list[float] = []
    original = ReplayCost.observe

    def spy(self: ReplayCost, seconds: float, entries: object) -> None:
        seen.append(seconds)
        original(self, seconds, entries)  # type: ignore[arg-type]

    monkeypatch.setattr(ReplayCost, "observe", spy)
    return seen


def test_the_calibration_pass_probes_the_dispatch_cost_once(observed: list[float]) -> None:
    """A GPT of repeated blocks: the calibration pass replays the blocks after the first
    under the dispatch mode, their peer having replayed plainly; their median cost per
    op, bounded, replaces the starting guess before the first plan, and gradients stay
    bitwise equal to plain."""
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=5)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget=tight_budget(model, batch))
    assert_bitwise(ref, train(m, batch, rt, steps=5))
    assert len(observed) == 1 and 0.0 <= observed[0] < 1.0, observed  # host time: a loaded host may pause a probe
    steps = rt.report().steps
    assert [s.phase for s in steps[:2]] == ["measure", "calibrate"]
    assert steps[1].served_ops + steps[1].rerun_ops > 0  # the probe ran under the mode
    first = steps[2]
    assert first.phase == "planned"
    if first.served_ops:
        # a host loaded enough to slow the replays' ops picks a plan that serves, and that
        # step's serving replays are learnt on top of the probe: only the probe is checked
        return
    low, high = PROBE_RANGE
    bounded = min(max(observed[0], low * SERVING_OVERHEAD_SECONDS), high * SERVING_OVERHEAD_SECONDS)
    assert first.replay_op_us == pytest.approx(1e6 * bounded)


@pytest.mark.parametrize(("seen", "kept"), [(0.0, 3.125e-6), (10e-6, 10e-6), (1e-3, 100e-6)])
def test_what_the_probes_teach_is_bounded(seen: float, kept: float) -> None:
    """A small replay on a loaded host can read 0 or many times the truth: the figure
    stays within PROBE_RANGE times the starting guess."""
    cost = ReplayCost(None)
    cost.observe(seen, {})
    assert cost.probed and cost.seconds == pytest.approx(kept)
    pinned = ReplayCost(7.0)
    pinned.observe(seen, {})
    assert not pinned.probed and pinned.seconds == pytest.approx(7e-6)


def test_a_pinned_cost_is_not_probed(observed: list[float]) -> None:
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget=tight_budget(model, batch), replay_op_us=25.0)
    train(m, batch, rt, steps=3)
    steps = rt.report().steps
    assert observed == [] and steps[1].served_ops + steps[1].rerun_ops == 0
    assert all(s.replay_op_us == pytest.approx(25.0) for s in steps)


class _Widen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class _Squash(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.down(torch.tanh(self.up(x))))


class _TwoKinds(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _Widen(), _Squash()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(self.a(x))
        return (y * y).mean()


def test_a_model_without_repeated_regions_keeps_the_guess(observed: list[float]) -> None:
    """Two regions of different kinds: none has a peer replayed plainly before it, so
    no probe runs and the starting guess stays."""
    torch.manual_seed(0)
    model = _TwoKinds()
    gen = torch.Generator().manual_seed(1)
    data = torch.randn(8, 16, generator=gen)
    rt = offrecomp.runtime(model, mode="auto", min_bytes=0, budget=1, regions=lambda m, name: name in ("a", "b"))
    train(model, lambda s: data, rt, steps=3)
    steps = rt.report().steps
    assert steps[1].phase == "calibrate" and steps[1].replays == 2
    assert observed == [] and steps[1].served_ops + steps[1].rerun_ops == 0
    assert all(s.replay_op_us == pytest.approx(1e6 * SERVING_OVERHEAD_SECONDS) for s in steps)


class _ManyOps(nn.Module):
    """Many small ops; under a dispatch mode (the probes' replays) it also sleeps, so the
    probes weigh more than the rest of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _get_current_dispatch_mode() is not None:
            time.sleep(PROBE_SLEEP)
        h = self.fc(x)
        for _ in range(40):
            h = torch.tanh(h) * 0.9 + 0.1
        return x + h


PROBE_SLEEP = 0.03


def test_the_calibration_check_leaves_the_probes_out(caplog: pytest.LogCaptureFixture) -> None:
    """The probes replay under the dispatch mode, which the check's prediction would price
    plainly (the cheaper rule there): their time leaves the measured step and their calls
    the predicted plan, so a model whose probes are slow is not said to run far slower than
    its model. Counting them would read below -75% here (two probes of 30 ms against a step
    of about 15 ms); host noise moves the figure either way (a loaded host's calibration
    step ran at twice the model's forward: -41%), so the bound is one-sided and wide."""
    torch.manual_seed(0)
    m = nn.Sequential(*(_ManyOps() for _ in range(3)))
    with caplog.at_level(logging.INFO, logger="offrecomp"), offrecomp.runtime(m, mode="auto", min_bytes=0):
        for s in range(3):
            m(torch.randn(4, 8, generator=torch.Generator().manual_seed(s))).square().sum().backward()
    said = [r for r in caplog.records if "calibration pass" in r.getMessage() and "measured step" in r.getMessage()]
    assert len(said) == 1 and "less 2 dispatch-mode probe(s)" in said[0].getMessage(), said
    text = said[0].getMessage()
    probes = float(re.search(r"probe\(s\) of ([0-9.]+)s", text).group(1))  # type: ignore[union-attr]
    assert probes >= 2 * PROBE_SLEEP, text  # the probes did sleep
    off = float(re.search(r"predicts [0-9.]+s \(([+-]?[0-9]+)%", text).group(1))  # type: ignore[union-attr]
    assert off > -60, text
