"""NOTE [Split backwards] (planning/profiling.py): a pass whose backward is split by
another pass's forward (a 1F1B schedule: F0 F1 B0 F2 B1 F3 B2 B3) is measured whole,
teaches no backward of its own, and its later replays never count against the span it
ended with; the backward the planner learns stays put instead of swinging from pass to
pass."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp.measure import Clock, Mark
from offrecomp.phases import Phase
from offrecomp.planning import learning, profiling
from offrecomp.state import PassState
from scheduler.profile import Profile, RegionRecord

MICRO = 4
STEPS = 10


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.a = nn.Linear(d, 4 * d)
        self.b = nn.Linear(4 * d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.nn.functional.gelu(self.a(self.ln(x))))


class _Model(nn.Module):
    def __init__(self, d: int = 256, n: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(d) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def _schedule(kind: str) -> list[tuple[str, int]]:
    """``plain``: F0 F1 B0 B1, F2 F3 B2 B3 (every backward inside its pass); ``1f1b``:
    F0 F1 B0 F2 B1 F3 B2 B3 (B1 runs after F2 began the next pass)."""
    if kind == "plain":
        return [("F", 0), ("F", 1), ("B", 0), ("B", 1), ("F", 2), ("F", 3), ("B", 2), ("B", 3)]
    return [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]


def _run(kind: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], Any, list[Any]]:
    """Train under ``kind``'s schedule; the factor each learnt planned pass moved the
    regions' backward by, the runtime, and the profiles built (with their passes)."""
    scales: list[float] = []
    built: list[Any] = []
    learn = learning.learn_backward
    build = profiling.build_profile

    def spy_learn(p: PassState, measured: Profile, **kw: Any) -> bool:
        before = sum(r.backward_seconds for r in measured.regions)
        ok = learn(p, measured, **kw)
        after = sum(r.backward_seconds for r in measured.regions)
        if p.phase == Phase.PLANNED and before > 0:
            scales.append(after / before)
        return ok

    def spy_build(p: PassState, marks: Any, end: Any, **kw: Any) -> Any:
        out = build(p, marks, end, **kw)
        built.append((p, list(marks), out[0]))
        return out

    monkeypatch.setattr(learning, "learn_backward", spy_learn)
    monkeypatch.setattr(profiling, "build_profile", spy_build)
    torch.manual_seed(0)
    model = _Model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with offrecomp.runtime(model, mode="auto") as rt:
        for _ in range(STEPS):
            xs = [torch.randn(4, 128, 256, generator=g) for _ in range(MICRO)]
            losses: dict[int, torch.Tensor] = {}
            for op, i in _schedule(kind):
                if op == "F":
                    losses[i] = model(xs[i]) / MICRO
                else:
                    losses.pop(i).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        rt.report()
    monkeypatch.undo()
    return scales, rt, built


def _region_backward(rt: Any) -> float:
    entry = rt.planner.last_entry
    assert entry is not None and entry.profile is not None
    return sum(r.backward_seconds for r in entry.profile.regions)


def test_a_split_backward_is_learnt_without_swinging(monkeypatch: pytest.MonkeyPatch) -> None:
    plain_scales, plain_rt, _ = _run("plain", monkeypatch)
    scales, rt, _ = _run("1f1b", monkeypatch)
    assert len(scales) >= 6, scales
    assert any("planned" in s.phases for s in rt.report().steps)
    swing = [abs(math.log(s)) for s in scales]
    plain_swing = [abs(math.log(s)) for s in plain_scales] or [0.0]
    # learnt from, a split pass's span (B0 alone) would move every region's backward
    # to 0.5-0.8x and the whole pass after it back by 1.2-1.8x; a whole pass moves it
    # by a few percent
    assert statistics.median(swing) <= max(math.log(1.15), 2 * statistics.median(plain_swing)), scales
    assert sum(s > math.log(1.25) for s in swing) <= len(swing) // 4, scales
    ratio = _region_backward(rt) / _region_backward(plain_rt)
    assert 0.7 <= ratio <= 1.4, ratio


def test_the_measuring_pass_times_the_backwards_that_ran_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _, rt, built = _run("1f1b", monkeypatch)
    steps = rt.report().steps
    # the pass after the measuring one cannot calibrate a profile not built yet
    assert steps[0].phases == "measure+recompute", steps[0].phases
    assert len(built) == 1
    p, marks, profile = built[0]
    assert profiling.split_backward(p)
    regions = profile.regions
    assert len(regions) == 8
    assert {o for o, _, _ in marks} == set(range(8))  # B1's replays too
    # no call's backward is the unmeasured 2x forward; B1's calls (call index 1) are
    # timed like B0's (call index 0)
    for r in regions:
        assert r.backward_seconds != pytest.approx(2.0 * r.forward_seconds, rel=1e-9), r
    by_key = {r.key: r for r in regions}
    names = [n for n, i in by_key if i == 0]
    ratios = [by_key[(n, 1)].backward_seconds / by_key[(n, 0)].backward_seconds for n in names]
    assert 0.33 <= statistics.median(ratios) <= 3.0, ratios
    # the profile's backward holds both backwards, not B0's alone
    assert profile.backward_seconds >= 0.9 * sum(r.backward_seconds for r in regions)


def _pass(*, split: bool) -> tuple[PassState, Profile]:
    """A pass timed on the host clock: forward 0-1 s, backward 1-2 s with a replay of
    0.2 s inside, and a replay of 0.5 s at 3 s, after it ended."""
    p = PassState(index=0, signature="s", mode="auto")
    p.start_mark, p.backward_start_mark = Mark(host=0.0), Mark(host=1.0)
    p.backward_ends.append(Mark(host=2.0))
    p.replay_marks += [(0, Mark(host=1.2), Mark(host=1.4)), (0, Mark(host=3.0), Mark(host=3.5))]
    p.awaits_other = split
    region = RegionRecord(name="a", call_index=0, start_seconds=0.0, forward_seconds=0.5, backward_seconds=0.8)
    return p, Profile(signature="s", forward_seconds=1.0, backward_seconds=0.8, regions=[region])


def test_replays_after_the_span_do_not_count_against_it() -> None:
    p, measured = _pass(split=False)
    assert learning.learn_backward(p, measured, clock=Clock(None), calibrating=False)
    assert measured.regions[0].backward_seconds == pytest.approx(0.8)
    assert measured.backward_seconds == pytest.approx(0.8)


def test_a_split_pass_teaches_no_backward() -> None:
    p, measured = _pass(split=True)
    assert learning.learn_backward(p, measured, clock=Clock(None), calibrating=False)
    assert measured.regions[0].backward_seconds == 0.8
    assert measured.backward_seconds == 0.8
