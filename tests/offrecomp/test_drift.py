"""NOTE [Drift]: a plan's prediction is judged on the median of a window of planned
steps; a signature whose steps stay off after re-plans backs off and says so once, and
repeated drift does not repeat the warning. The host's load is simulated by scaling each
planned step's measured time by a random factor before the drift check sees it."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator

import pytest
import torch

import offrecomp
from offrecomp.planning import DRIFT_REPLANS, DRIFT_WINDOW, PlanEntry, drift
from offrecomp.report import StepRecord
from tests.helpers import train
from tests.models import MLPBlock, stack

STEPS = 80


def _batch(s: int) -> torch.Tensor:
    return torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(s))


@pytest.fixture
def loaded_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Every planned step measures its own time times a factor drawn from ``bounds``
    (set by the test), as a host loaded by other work makes it."""
    bounds = [1.0, 1.0]
    rng = random.Random(0)
    check = drift.check_drift

    def noisy(entry: PlanEntry, rec: StepRecord, tolerance: float) -> None:
        if rec.predicted_step_seconds:
            rec.step_seconds = rec.predicted_step_seconds * rng.uniform(*bounds)
        check(entry, rec, tolerance)

    monkeypatch.setattr(drift, "check_drift", noisy)
    yield bounds


def _run(caplog: pytest.LogCaptureFixture) -> tuple[list[StepRecord], list[str]]:
    torch.manual_seed(0)
    m = stack(lambda: MLPBlock(32), n=3)()
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        rt = offrecomp.runtime(m, min_bytes=0, budget="50%")
        train(m, _batch, rt, steps=STEPS)
    return rt.report().steps, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_loaded_host_replans_a_bounded_number_of_times(
    loaded_host: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    """Steps -28% to -73% off their prediction, for good (the issue's soak): re-plans
    thin out (the window doubles), one warning says the signature drifts, one says why
    re-planning backs off."""
    loaded_host[:] = [0.27, 0.72]
    steps, warnings = _run(caplog)
    planned = [s for s in steps if s.phase == "planned"]
    assert len(planned) >= STEPS - 5
    replans = sum("drift: re-plan" in s.notes for s in steps)
    # windows of 8, 8, 8, then 16, 32: at most six re-plans in 75 planned steps
    assert DRIFT_REPLANS <= replans <= 6, replans
    drift = [w for w in warnings if "off the predicted" in w]
    assert len(drift) == 1, drift
    backoff = [w for w in warnings if "backs off" in w]
    assert len(backoff) == 1, backoff
    # nothing else, but the first solve of a fresh process compiling the kernels and the
    # calibration check, which reads the calibration pass's real times (a loaded machine
    # can put it 25% off; the fixture noises planned steps only)
    others = [
        w for w in warnings
        if "compiling the planner's kernels" not in w and "offrecomp: calibration pass of signature" not in w
    ]
    assert len(others) == 2, warnings


def test_noise_around_the_prediction_is_no_drift(loaded_host: list[float], caplog: pytest.LogCaptureFixture) -> None:
    """Single steps off either way by up to 30% (beyond the 25% tolerance) around a
    right prediction: the window's median stays within it, so no re-plan and no warning."""
    loaded_host[:] = [0.7, 1.3]
    steps, warnings = _run(caplog)
    assert not any("drift: re-plan" in s.notes for s in steps)
    assert [w for w in warnings if "off the predicted" in w] == []
    assert DRIFT_WINDOW >= 5
