"""Host pauses and the forward timeline: what the planner learns from a pass.

NOTE [Host pauses] (``offrecomp/measure.py``): a garbage collection inside a timed span
is time the span's work did not take. The planner learns nothing from a distorted span,
sends a distorted calibration pass back, and keeps the step out of the drift check.
NOTE [Forward timeline] (``offrecomp/planning/learning.py``): the forward is learnt piece by
piece, so a plan that offloads still learns it.

Pauses are simulated: a block sleeps and books the sleep as a collection, so each test
knows exactly which span held one.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn

import offrecomp
import offrecomp.measure as measure
from offrecomp.measure import Clock, Mark
from scheduler import Placement, Plan
from tests.helpers import assert_bitwise, train, twin
from tests.models import Stack

PAUSE = 0.05  # seconds: far above a block's forward on CPU


class PausingBlock(nn.Module):
    """An MLP block that, while ``pause_on`` holds the current pass, stops as a full
    garbage collection would (sleeps, and books the sleep as collection time)."""

    passes: list[int] = []  # shared by every block: the test drives it
    pause_on: set[int] = set()
    book = True  # book the sleep as a collection (False: a pause offrecomp cannot see)

    def __init__(self, pausing: bool, hidden: int = 64) -> None:
        super().__init__()
        self.pausing = pausing
        self.fc1 = nn.Linear(32, hidden)
        self.fc2 = nn.Linear(hidden, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if self.pausing and PausingBlock.passes and PausingBlock.passes[-1] in PausingBlock.pause_on:
            _fake_collection(PAUSE)
        return x + self.fc2(h)


def _fake_collection(seconds: float) -> None:
    time.sleep(seconds)
    if PausingBlock.book:
        measure._GC.seconds += seconds


class Model(nn.Module):
    """Four blocks; block 1 pauses. ``alone``: block 1 has a shape of its own (no
    repeated peer to take times from)."""

    def __init__(self, alone: bool = False) -> None:
        super().__init__()
        self.stack = Stack([PausingBlock(i == 1, 48 if alone and i == 1 else 64) for i in range(4)])

    gap_on: int | None = None  # pause in the gap before this block (0: the first) ...
    gap_passes: set[int] = set()  # ... in these passes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        PausingBlock.passes.append(len(PausingBlock.passes))
        for i, b in enumerate(self.stack.blocks):
            if i == Model.gap_on and PausingBlock.passes[-1] in Model.gap_passes:
                _fake_collection(PAUSE)
            x = b(x)
        return x.square().mean()


@contextmanager
def _pauses(*passes: int, gap: int | None = None) -> Iterator[None]:
    """Pause block 1 in these passes (0 is the first forward), or the gap before block
    ``gap`` instead."""
    PausingBlock.passes = []
    if gap is None:
        PausingBlock.pause_on = set(passes)
    else:
        Model.gap_on, Model.gap_passes = gap, set(passes)
    try:
        yield
    finally:
        PausingBlock.passes, PausingBlock.pause_on, PausingBlock.book = [], set(), True
        Model.gap_on, Model.gap_passes = None, set()


def _batch(seed: int) -> torch.Tensor:
    return torch.randn(8, 16, 32, generator=torch.Generator().manual_seed(seed))


def _model(alone: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return Model(alone)


def _runtime(m: nn.Module, **kw: object) -> offrecomp.Runtime:
    return offrecomp.runtime(m, mode="auto", min_bytes=0, budget="50%", **kw)  # type: ignore[arg-type]


def _forward_of(rt: offrecomp.Runtime, name: str) -> float:
    entry = rt.planner.last_entry
    assert entry is not None and entry.profile is not None
    return next(r.forward_seconds for r in entry.profile.regions if r.name == name)


def test_marks_carry_the_time_spent_in_garbage_collection() -> None:
    clock = Clock(None)
    a = clock.mark()
    junk = []
    for _ in range(20000):
        x: list[object] = []
        x.append(x)  # cycles: only the collector frees them
        junk.append(x)
    del junk
    gc.collect()
    b = clock.mark()
    paused = clock.pause(a, b)
    assert 0.0 < paused <= clock.seconds(a, b)  # type: ignore[operator]
    assert measure.gc_seconds() >= paused


@pytest.mark.parametrize(
    ("span", "paused", "distorted"),
    [
        (0.100, 0.050, True),  # half the span
        (1.000, 0.050, False),  # 5%: under the share
        (0.002, 0.0009, False),  # under the 1 ms floor, whatever its share
        (0.010, 0.002, True),
    ],
)
def test_a_span_is_distorted_by_a_pause_above_its_share_and_the_floor(
    span: float, paused: float, distorted: bool
) -> None:
    clock = Clock(None)
    assert clock.distorted(Mark(1.0, gc=3.0), Mark(1.0 + span, gc=3.0 + paused)) is distorted


def test_a_paused_block_in_the_calibration_pass_takes_its_peers_times() -> None:
    """The calibration pass replaces the recorder's times outright: a pause inside it
    would put a 50 ms block into every plan. A repeated block takes the median of its
    clean peers instead."""
    model = _model()
    m = twin(model)
    rt = _runtime(m)
    with _pauses(1):  # the calibration pass
        train(m, _batch, rt, steps=2)
    steps = rt.report().steps
    assert [s.phase for s in steps] == ["measure", "calibrate"]
    assert steps[1].pause_seconds >= 0.99 * PAUSE
    assert any("stack.blocks.1#0" in n and "peers" in n for n in steps[1].notes), steps[1].notes
    peers = sorted(_forward_of(rt, f"stack.blocks.{i}") for i in (0, 2, 3))
    assert _forward_of(rt, "stack.blocks.1") == peers[1]


def test_a_paused_region_without_peers_sends_the_calibration_pass_back() -> None:
    model = _model(alone=True)
    ref = train(twin(model), _batch, steps=5)
    m = twin(model)
    rt = _runtime(m)
    with _pauses(1):  # the first calibration pass
        got = train(m, _batch, rt, steps=5)
    assert_bitwise(ref, got)
    steps = rt.report().steps
    assert [s.phase for s in steps] == ["measure", "calibrate", "calibrate", "planned", "planned"]
    assert steps[1].pause_seconds >= 0.99 * PAUSE
    assert any("calibrating again" in n for n in steps[1].notes), steps[1].notes
    assert steps[2].notes == []
    assert _forward_of(rt, "stack.blocks.1") < PAUSE / 2


@pytest.mark.parametrize("gap", [2, 0])
def test_a_paused_gap_in_the_calibration_pass(gap: int) -> None:
    """A gap between blocks takes the median of the clean ones; the gap before the first
    block (the root's own work) has no peers and takes its time less the pause."""
    m = _model()
    rt = _runtime(m)
    with _pauses(1, gap=gap):
        train(m, _batch, rt, steps=3)
    phases = [s.phase for s in rt.report().steps]
    assert phases == ["measure", "calibrate", "planned"]
    entry = rt.planner.last_entry
    assert entry is not None and entry.profile is not None
    from offrecomp.planning import _gaps

    assert max(_gaps(entry.profile)) < PAUSE / 2  # the pause is in no gap


def test_calibration_is_sent_back_a_bounded_number_of_times() -> None:
    from offrecomp.planning import MAX_CALIBRATION_TRIES

    m = _model(alone=True)
    rt = _runtime(m)
    with _pauses(*range(1, 10)):  # every pass after the measuring one
        train(m, _batch, rt, steps=MAX_CALIBRATION_TRIES + 3)
    phases = [s.phase for s in rt.report().steps]
    assert phases == ["measure"] + ["calibrate"] * (MAX_CALIBRATION_TRIES + 1) + ["planned"]


@pytest.fixture
def _learn_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every planned pass is learnt (NOTE [Learning cadence]): these tests read what one
    given pass taught."""
    from offrecomp.planning import learning

    monkeypatch.setattr(learning, "LEARN_SHARE", 1e12)


@pytest.mark.usefixtures("_learn_every_pass")
def test_a_paused_region_in_a_planned_pass_keeps_its_estimate() -> None:
    m = _model()
    rt = _runtime(m, drift=100.0)
    with _pauses(4):
        train(m, _batch, rt, steps=4)  # measure, calibrate, planned, planned
        entry = rt.planner.last_entry
        assert entry is not None
        before = _forward_of(rt, "stack.blocks.1")
        other = _forward_of(rt, "stack.blocks.2")
        strikes = len(entry.drift_ratios)
        train(m, _batch, rt, steps=1)  # paused in block 1
    rec = rt.report().steps[-1]
    assert rec.phase == "planned" and rec.pause_seconds >= 0.99 * PAUSE
    assert any("not learnt from stack.blocks.1#0" in n for n in rec.notes), rec.notes
    assert _forward_of(rt, "stack.blocks.1") == pytest.approx(before, rel=1e-9)  # the pause: not learnt
    assert _forward_of(rt, "stack.blocks.2") != other  # the clean regions still learn
    assert len(entry.drift_ratios) == strikes  # a paused step is no evidence of drift


@pytest.mark.usefixtures("_learn_every_pass")
def test_one_slow_pass_moves_a_region_estimate_by_a_bounded_step() -> None:
    """A pause that is no collection (a preempted thread, a busy neighbour) cannot be
    told from the work; one pass reads as at most OUTLIER_RATIO x the estimate, so the
    average (weight 0.3) moves by 1.9x at most, not by 0.3 x 50 ms."""
    from offrecomp.planning import OUTLIER_RATIO

    m = _model()
    rt = _runtime(m, drift=100.0)
    with _pauses(4):
        train(m, _batch, rt, steps=4)
        before = _forward_of(rt, "stack.blocks.1")
        PausingBlock.book = False
        train(m, _batch, rt, steps=1)
    after = _forward_of(rt, "stack.blocks.1")
    assert rt.report().steps[-1].pause_seconds < 0.99 * PAUSE
    assert after == pytest.approx(before * (0.7 + 0.3 * OUTLIER_RATIO))
    # learnt whole, the pause alone would have added 0.3 x PAUSE (a tiny block's own
    # time reaches a few ms on a loaded host, so the bound is on the pause's share)
    assert after < 0.3 * PAUSE


def test_a_plan_that_offloads_still_learns_its_forward() -> None:
    """NOTE [Forward timeline]: a plan that offloads learns its regions and the gaps
    around them, and the forward total is rebuilt from them. A wrong total (as a
    distorted calibration would leave) is corrected by later passes."""
    model = _model()
    r = twin(model)
    ref = train(r, _batch, steps=2) + train(r, _batch, steps=4)  # the same two loops
    m = twin(model)
    rt = _runtime(m)
    got = train(m, _batch, rt, steps=2)  # measure, calibrate
    entry = rt.planner.last_entry
    assert entry is not None and entry.profile is not None and entry.cost is not None
    est = entry.cost._estimate
    assert est is not None
    true_forward = est.forward_seconds
    est.forward_seconds = 10.0  # a forward total no pass measured
    offload = {
        (r.name, r.call_index, i): Placement.OFFLOAD
        for r in est.regions
        if r.name == "stack.blocks.0"
        for i, s in enumerate(r.storages)
        if s.kind == "activation"
    }
    assert offload
    rt.set_plan(Plan(placements=offload))
    got += train(m, _batch, rt, steps=4)
    assert_bitwise(ref, got)
    steps = rt.report().steps
    assert all(s.offloaded_bytes > 0 for s in steps[2:])
    forward = entry.cost._estimate.forward_seconds  # type: ignore[union-attr]
    # four passes learnt it (the old rule kept 10 s): the moving average (weight 0.3 on
    # each pass) has left 0.7**4 of the wrong value, and the rest is the measured one
    assert 10.0 * 0.7**4 < forward < 10.0 * 0.7**4 + 0.1 + 10 * true_forward
    starts = [r.start_seconds for r in entry.cost._estimate.regions]  # type: ignore[union-attr]
    assert starts == sorted(starts) and starts[-1] < forward
