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
from offrecomp.planning import (
    DRIFT_HISTORY,
    DRIFT_MAX_BACKOFF,
    DRIFT_REPLANS,
    DRIFT_WINDOW,
    PlanEntry,
    drift,
)
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


def _judge(entry: PlanEntry, ratio: float) -> bool:
    """One window of ``entry``'s planned steps, each ``ratio`` times its prediction:
    whether it was solved again."""
    entry.needs_solve = False
    for _ in range(DRIFT_WINDOW << entry.drift_backoff):
        drift.check_drift(entry, StepRecord(step=0, step_seconds=ratio, predicted_step_seconds=1.0), 0.25)
    return entry.needs_solve


def test_drift_that_comes_and_goes_backs_off_and_a_fit_brings_the_window_back() -> None:
    """A host whose load comes and goes drifts one window in two: after more than
    DRIFT_REPLANS of the latest DRIFT_HISTORY windows drifted, the window doubles at
    each drifting one, and a good window between two bad ones does not shrink it. Once
    at most one remembered window drifted, each good window halves it again, down to
    DRIFT_WINDOW."""
    entry = PlanEntry(signature="sig")
    replans = [_judge(entry, r) for r in [2.0, 1.0] * 3]
    assert replans == [True, False, True, False, True, False], replans
    assert entry.drift_backoff == 1  # the third drifting window of the latest six
    assert _judge(entry, 2.0) and entry.drift_backoff == 2
    assert not _judge(entry, 1.0) and entry.drift_backoff == 2  # three of six drifted
    sizes = []
    while entry.drift_backoff:
        sizes.append(DRIFT_WINDOW << entry.drift_backoff)
        assert not _judge(entry, 1.0)
        assert len(sizes) <= DRIFT_HISTORY + DRIFT_MAX_BACKOFF
    assert sizes[-2:] == [4 * DRIFT_WINDOW, 2 * DRIFT_WINDOW], sizes
    assert not entry.drift_learning


def test_a_host_loaded_in_some_windows_replans_less_than_in_every_other_window(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Windows alternately at the prediction and 60% under it, as a host whose load
    comes and goes makes them, over 160 steps: twenty windows of DRIFT_WINDOW, ten of
    them off. Three re-plans, then the window grows (16, 32, 64 steps): at most six."""
    check = drift.check_drift
    windows = [0]

    def alternating(entry: PlanEntry, rec: StepRecord, tolerance: float) -> None:
        if rec.predicted_step_seconds:
            if not entry.drift_ratios:
                windows[0] += 1
            rec.step_seconds = rec.predicted_step_seconds * (0.4 if windows[0] % 2 else 1.0)
        check(entry, rec, tolerance)

    monkeypatch.setattr(drift, "check_drift", alternating)
    torch.manual_seed(0)
    m = stack(lambda: MLPBlock(32), n=3)()
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        rt = offrecomp.runtime(m, min_bytes=0, budget="50%")
        train(m, _batch, rt, steps=2 * STEPS)
    replans = sum("drift: re-plan" in s.notes for s in rt.report().steps)
    assert DRIFT_REPLANS < replans <= 6, replans
    assert len([r for r in caplog.records if "backs off" in r.getMessage()]) == 1


def test_steps_of_several_micro_batches_drift_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Drift]: a run whose every step accumulates two micro-batches is judged by its
    passes' own spans (3x the prediction here) and re-plans; judging steps of one pass
    only, it would judge no window, and a plan its times left would keep running."""
    check = drift.check_drift
    judged = []

    def slow(entry: PlanEntry, rec: StepRecord, tolerance: float, measured: float | None = None) -> None:
        if rec.predicted_step_seconds and measured is not None:
            judged.append(rec.passes)
            measured = 3.0 * rec.predicted_step_seconds
        check(entry, rec, tolerance, measured=measured)

    monkeypatch.setattr(drift, "check_drift", slow)
    torch.manual_seed(0)
    m = stack(lambda: MLPBlock(32), n=3)()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    rt = offrecomp.runtime(m, min_bytes=0, budget="50%")
    with rt:
        for step in range(3 * DRIFT_WINDOW):
            for micro in range(2):
                m(_batch(2 * step + micro)).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    steps = rt.report().steps
    assert judged and set(judged) == {2}
    assert any("drift: re-plan" in s.notes for s in steps), [s.notes for s in steps]
