"""The planner inside the runtime: calibration, the learnt replay cost, the records."""

from __future__ import annotations

import ast
import contextlib
import copy
import gc
import itertools
import json
import logging
import pathlib
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import offrecomp
from offrecomp.measure import Clock, Mark
from offrecomp.native import AUDIT_EVERY, PROBATION
from offrecomp.planning import (
    TRIAL_EXCESS,
    TRIAL_PASSES,
    OffloadTrial,
    Planner,
    Solver,
    drift,
    learning,
    replay_cost,
    solving,
    trial,
)
from offrecomp.state import PassState
from offrecomp.trace import RUN
from scheduler import Placement, Plan, predict
from tests.helpers import (
    assert_bitwise,
    make,
    recalibrated,
    settled_phases,
    tight_budget,
    train,
    train_bitwise,
    twin,
)
from tests.models import stack


def _runtime(model: object, **kw: object) -> offrecomp.Runtime:
    return offrecomp.runtime(model, mode="auto", min_bytes=0, **kw)  # type: ignore[arg-type]


def _pass_with_replays(signature: str, *replays: tuple[float, int, float]) -> PassState:
    """A planned pass whose dispatch-mode replays took (seconds, ops seen, seconds of ops run)."""
    p = PassState(index=0, signature=signature, mode="auto")
    p.phase = "planned"
    for secs, k, run in replays:
        p.dispatch_replays.append((-1, Mark(0.0), Mark(secs), run, [RUN] * k))
    return p


def _learn_replay_cost(planner: Planner, p: PassState) -> None:
    planner.replay_cost.learn(p, planner.entries, planner.host.clock)


def _planned(**kw: object) -> tuple[offrecomp.Runtime, torch.nn.Module, object]:
    """A runtime that has measured, calibrated and run one planned step."""
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = _runtime(m, budget="50%", **kw)
    train(m, batch, rt, steps=3)
    return rt, m, batch


def test_replay_cost_is_learnt_and_a_moved_cost_solves_again() -> None:
    """NOTE [Serving overhead]: the rest of a dispatch-mode replay's time, per op seen,
    is the mode's cost; the estimate is smoothed, and plans solved with a cost it has
    left by more than half are solved again."""
    rt, _, _ = _planned(drift=100.0)  # no re-solve from timing noise
    planner = rt.planner
    entry = planner.last_entry
    assert entry is not None and entry.plan is not None and entry.calibrated
    entry.needs_solve = False  # what follows is about the replay cost alone
    start = planner.replay_cost.seconds = entry.solved_replay_op_seconds = 25e-6
    # 100 ops seen, 5 ms of them run, 10 ms measured: 50 us per op
    _learn_replay_cost(planner, _pass_with_replays(entry.signature, (0.010, 100, 0.005)))
    assert planner.replay_op_seconds == pytest.approx(0.7 * start + 0.3 * 50e-6)
    assert not entry.needs_solve  # moved by less than half
    # faster than predicted: never below zero
    _learn_replay_cost(planner, _pass_with_replays(entry.signature, (0.001, 100, 0.005)))
    assert planner.replay_op_seconds == pytest.approx(0.7 * (0.7 * start + 0.3 * 50e-6))
    _learn_replay_cost(planner, _pass_with_replays(entry.signature, (0.100, 100, 0.0)))  # 1 ms per op
    assert planner.replay_op_seconds > 1.5 * start
    assert entry.needs_solve


def test_replay_cost_discounts_a_slow_pass_and_clips_outliers() -> None:
    """A pass that ran slower as a whole (another process on the machine) ran its
    replayed ops slower too: that is not the mode's cost. And one outlying pass moves the
    estimate by a bounded step."""
    rt, _, _ = _planned()
    planner = rt.planner
    entry = planner.last_entry
    assert entry is not None and entry.profile is not None and entry.calibrated
    est_fwd = entry.profile.forward_seconds
    assert est_fwd > 0
    start = planner.replay_cost.seconds = entry.solved_replay_op_seconds = 25e-6
    # forward ran 2x the estimate; the replay's 5 ms of predicted ops took 10 ms, plus
    # 100 ops x 25 us of mode: 12.5 ms measured is exactly the current cost per op
    p = _pass_with_replays(entry.signature, (0.0125, 100, 0.005))
    p.start_mark, p.backward_start_mark = Mark(0.0), Mark(2.0 * est_fwd)
    _learn_replay_cost(planner, p)
    assert planner.replay_op_seconds == pytest.approx(start)
    # without the slowdown it would have read 75 us per op
    p = _pass_with_replays(entry.signature, (0.0125, 100, 0.005))
    p.start_mark, p.backward_start_mark = Mark(0.0), Mark(est_fwd)
    _learn_replay_cost(planner, p)
    assert planner.replay_op_seconds == pytest.approx(0.7 * start + 0.3 * 75e-6)
    # 10 ms per op in one pass counts as 4x the current value plus 20 us
    cur = planner.replay_op_seconds
    _learn_replay_cost(planner, _pass_with_replays(entry.signature, (1.0, 100, 0.0)))
    assert planner.replay_op_seconds == pytest.approx(0.7 * cur + 0.3 * (4 * cur + 20e-6))


def test_a_pinned_replay_cost_is_never_learnt() -> None:
    model, _ = make("gpt_dropout")
    rt = _runtime(twin(model), replay_op_us=3.0)
    planner = rt.planner
    assert planner.replay_op_seconds == pytest.approx(3e-6)
    _learn_replay_cost(planner, _pass_with_replays("s", (1.0, 10, 0.0)))
    assert planner.replay_op_seconds == pytest.approx(3e-6)


def test_dispatch_replays_teach_the_replay_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan that drops one cheap tensor per block replays under the dispatch mode;
    what those replays measure replaces the starting guess."""
    from offrecomp.regenerate import Regenerator

    monkeypatch.setattr(replay_cost, "SERVING_OVERHEAD_SECONDS", 0.0)  # the mode always pays
    # the calibration pass's probe (NOTE [Dispatch probe]) would replace the guess first
    monkeypatch.setattr(Planner, "wants_dispatch_probe", lambda self, call: False)
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = _runtime(m)
    train(m, batch, rt, steps=2)  # measure, calibrate
    assert rt.planner.replay_op_seconds == 0.0
    profile = rt.planner.last_entry.profile  # type: ignore[union-attr]
    names = [r.name for r in profile.regions]  # type: ignore[union-attr]
    drops = {}
    for r in profile.regions:  # type: ignore[union-attr]
        for i, s in enumerate(r.storages):
            if s.kind == "activation" and s.producer_op >= 0 and "gelu" in r.ops[s.producer_op].name:
                drops[(r.name, r.call_index, i)] = Placement.RECOMPUTE
    assert len(drops) == len(names)
    rt.set_plan(Plan(placements=drops))
    # Price the ops the replays run at 0 s, so that the whole replay is the mode's cost
    # whatever the machine's timing noise (the estimate comes from two small passes).
    pays = Regenerator._serving_pays
    monkeypatch.setattr(Regenerator, "_serving_pays", lambda self, *a: (pays(self, *a)[0], 0.0))
    train(m, batch, rt, steps=1)
    assert rt.report().steps[-1].served_ops > 0  # the dispatch mode ran
    assert rt.planner.replay_op_seconds > 0.0


def test_calibration_fits_replays_and_logs_the_check(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [Calibration]: after the calibration pass the ops before each region's stop
    add up to its measured plain replay, and the whole pass is compared with its
    prediction."""
    # every region replays plainly: no probe under the dispatch mode (NOTE [Dispatch probe])
    monkeypatch.setattr(Planner, "wants_dispatch_probe", lambda self, call: False)
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = _runtime(m, budget="50%")
    # A collection inside a replay marks it paused, and a paused replay takes a peer's
    # fitted times instead of its own (NOTE [Host pauses]); here every replay must fit.
    gc.collect()
    gc.disable()
    try:
        with caplog.at_level(logging.INFO, logger="offrecomp"):
            train(m, batch, rt, steps=2)
            steps = rt.report().steps
    finally:
        gc.enable()
    assert [s.phase for s in steps] == ["measure", "calibrate"]
    assert any("calibration pass of signature" in r.getMessage() for r in caplog.records)
    entry = rt.planner.last_entry
    assert entry is not None and entry.calibrated and entry.profile is not None
    every = Plan(
        placements={
            (r.name, r.call_index, i): Placement.RECOMPUTE
            for r in entry.profile.regions
            for i, s in enumerate(r.storages)
            if s.kind == "activation"
        }
    )
    profile = copy.deepcopy(entry.profile)
    profile.replay_op_seconds = 1.0  # as the calibration pass replayed: plainly
    predicted = predict(profile, every).recompute_seconds
    assert predicted == pytest.approx(steps[1].recompute_seconds, rel=0.02)
    # the time between ops went to every op, views included
    ops = [op for r in entry.profile.regions for op in r.ops]
    assert min(op.seconds for op in ops) > 0


def test_planned_steps_record_the_predicted_breakdown() -> None:
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = _runtime(m, budget="50%")
    train(m, batch, rt, steps=3)
    last = rt.report().steps[-1]
    assert last.phase == "planned"
    assert last.forward_seconds > 0
    assert last.predicted_forward_seconds is not None and last.predicted_forward_seconds > 0
    assert last.predicted_recompute_seconds is not None
    assert last.predicted_stall_seconds == 0.0  # no offload on CPU


def test_live_prediction_follows_the_estimate_and_a_moved_one_solves_again() -> None:
    """NOTE [Live prediction]: each planned pass's record carries the plan predicted
    under the estimate learnt up to the pass before it; when that prediction leaves the
    solve's by more than ``drift``, the plan is solved again."""
    # the replay cost pinned and a wide drift: re-solves from timing noise stay rare
    rt, m, batch = _planned(drift=0.5, replay_op_us=25.0)  # measure, calibrate, planned
    planner = rt.planner
    entry = planner.last_entry
    assert entry is not None and entry.plan is not None and entry.profile is not None
    for _ in range(4):  # until a pass was learnt since the last solve, refreshing each pass
        entry.live_every, entry.live_skipped = 1, 0
        if not entry.needs_solve and entry.live is not None:
            break
        train(m, batch, rt, steps=1)
    assert not entry.needs_solve and entry.live is not None
    want = predict(entry.profile, entry.plan, prefetch_regions=2)
    assert entry.live.step_seconds == pytest.approx(want.step_seconds)
    live, plan = entry.live, entry.plan
    train(m, batch, rt, steps=1)
    rec = rt.report().steps[-1]
    assert rec.phase == "planned" and entry.plan is not None
    if entry.plan is plan:  # the record predicts from the estimate before its pass
        assert rec.predicted_step_seconds == pytest.approx(live.step_seconds)
        assert rec.predicted_forward_seconds == pytest.approx(live.forward_seconds)
        assert rec.predicted_recompute_seconds == pytest.approx(live.recompute_seconds)
    else:  # solved again before the pass (noise moved the estimate): the solve's numbers
        assert rec.predicted_step_seconds == pytest.approx(entry.plan.predicted_step_seconds)
    # every time in the estimate scales so that the plan now predicts twice the step it
    # was solved for: the plan was chosen for other costs
    entry.needs_solve = False
    entry.live_every, entry.live_skipped = 1, 0
    solved = entry.plan.predicted_step_seconds or 0.0
    base = predict(entry.profile, entry.plan, prefetch_regions=2).step_seconds
    f = 2.0 * solved / base
    slow = entry.profile.copy()
    slow.forward_seconds *= f
    slow.backward_seconds *= f
    slow.replay_op_seconds *= f
    for name in ("pack", "unpack", "offload", "reload", "replay"):  # the runtime's host costs
        setattr(slow, f"{name}_host_seconds", getattr(slow, f"{name}_host_seconds") * f)
    for r in slow.regions:
        r.forward_seconds *= f
        r.backward_seconds *= f
        r.start_seconds *= f
        r.host_seconds = None if r.host_seconds is None else r.host_seconds * f
        r.backward_host_seconds = None if r.backward_host_seconds is None else r.backward_host_seconds * f
        for op in r.ops:
            op.seconds *= f
        for st in r.storages:
            st.offset_seconds *= f
    for st in slow.root:
        st.offset_seconds *= f
    entry.profile = slow
    drift.refresh_live(entry, 1.0, prefetch_regions=2, drift=0.5)
    assert entry.live is not None
    assert entry.live.step_seconds == pytest.approx(2.0 * solved, rel=1e-6)
    assert entry.needs_solve


def test_backward_outside_the_context_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    """auto plans only from passes whose backward ran inside the context: a loop that runs
    backward after leaving it is told so, once, instead of measuring silently forever."""
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = _runtime(m)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        for step in range(3):
            with rt:
                loss = m(batch(step))
            loss.backward()
    warned = [r for r in caplog.records if "ended before its backward" in r.getMessage()]
    assert len(warned) == 1
    assert all(s.phase == "measure" for s in rt.report().steps)


def test_records_carry_the_planners_host_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the profile (after the measuring pass) and solving (before the first
    planned pass) happen outside the timed span; the records say how long they took."""
    from offrecomp.planning.solving import Solver

    solve = Solver.solve

    def slow_solve(self: Solver, entry: Any) -> None:
        time.sleep(0.2)  # a solve longer than this model's step, on any host
        solve(self, entry)

    monkeypatch.setattr(Solver, "solve", slow_solve)
    rt, _, _ = _planned()
    steps = rt.report().steps
    assert [s.phase for s in steps] == ["measure", "calibrate", "planned"]
    assert all(s.planner_seconds > 0 for s in steps)
    assert steps[2].planner_seconds >= 0.2  # the solve, counted in the step it planned
    assert steps[2].step_seconds < 0.2  # and outside its timed span


class AdaptiveDepth(torch.nn.Module):
    """Runs its blocks once or twice, as the data says (a halting decision): the input
    shapes, and so the signature, stay the same while the number of region calls changes."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
            for _ in range(2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(1 + int(x[0, 0, 0].item() > 0)):
            for blk in self.blocks:
                x = x + blk(x)
        return x.square().mean()


def _alternating(s: int) -> torch.Tensor:
    x = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(s))
    x[0, 0, 0] = 1.0 if (s // 10) % 2 else -1.0  # train() seeds step i with 10 * i
    return x


def test_calls_the_profile_lacks_extend_it_instead_of_measuring_again() -> None:
    """NOTE [Calls the profile lacks]: depths that alternate step by step are recorded
    within the planned pass that runs the extra calls, once; sending the signature back
    to a measuring pass (full recompute) at each such pass would do so for good."""
    torch.manual_seed(0)
    base = AdaptiveDepth()
    ref = train(twin(base), _alternating, steps=10)
    rt = train_bitwise(twin(base), _alternating, "auto_tight", 60_000, ref, steps=10)
    phases = [s.phase for s in rt.report().steps]
    assert phases.count("measure") == 1, phases
    assert phases[-6:] == ["planned"] * 6, phases
    entry = rt.planner.entries[rt.report().steps[-1].signature]
    assert {k[1] for k in entry.structures} == {0, 1}  # the profile covers the deeper pass
    assert any(s.recomputed_bytes > 0 for s in rt.report().steps[-2:])


class _TwoHeads(torch.nn.Module):
    """Blocks, then one of two task heads (regions of a ModuleDict), alternating by pass."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16)) for _ in range(3)
        )
        self.heads = torch.nn.ModuleDict({t: torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for t in "ab"})
        self.passes = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        self.passes += 1
        return self.heads["ab"[self.passes % 2]](x).square().mean()


def test_a_profile_keeps_the_calls_a_reprofiling_pass_did_not_run() -> None:
    """NOTE [Calls the profile lacks]: passes alternating between two task heads run
    disjoint sets of calls. A pass reaching a head the profile lacks records it, and the
    profile it builds keeps the other head's calls, so auto plans; a profile of only the
    pass's own calls would lack the other head each time, and every pass would calibrate
    (a full recompute), for good."""
    torch.manual_seed(0)
    base = _TwoHeads()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))

    ref = train(twin(base), batch, steps=10)
    rt = train_bitwise(twin(base), batch, "auto_tight", tight_budget(base, batch), ref, steps=10)
    phases = [s.phase for s in rt.report().steps]
    assert phases.count("measure") == 1 and phases[-6:] == ["planned"] * 6, phases
    entry = rt.planner.entries[rt.report().steps[-1].signature]
    assert {k[0] for k in entry.structures} >= {"heads.a", "heads.b"}
    assert {r.name for r in entry.profile.regions} >= {"heads.a", "heads.b"}


class _BranchBlock(torch.nn.Module):
    """Takes one of two activations by the sign of its input's mean: gelu saves its
    input, tanh its output, so the two branches save different storages."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        y = torch.nn.functional.gelu(y) if x.mean() > 0 else torch.tanh(y)
        return x + self.fc2(y)


def test_a_region_whose_saves_change_with_the_data_is_placed_by_position_instead_of_measured_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A branch on the data that flips every step: a planned call saving other storages
    than its recording measures again (its forwards then run under a passive dispatch
    mode, NOTE [Replay] step 7); when it differs again, its region is placed by position
    and replayed plainly from then on (NOTE [Regions that vary]), named in a warning and
    in explain(), and auto stays planned instead of measuring every four steps with the
    planned ones over the budget; gradients bitwise."""
    torch.manual_seed(0)
    base = stack(_BranchBlock, 3)()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s)) + (1.0 if (s // 10) % 2 else -1.0)

    ref = train(twin(base), batch, steps=16)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = train_bitwise(twin(base), batch, "auto_tight", tight_budget(base, batch), ref, steps=16)
    phases = [s.phase for s in rt.report().steps]
    assert phases.count("measure") <= 3 and phases[-6:] == ["planned"] * 6, phases
    assert any("branches on the data" in r.getMessage() for r in caplog.records)
    assert "branches on the data" in rt.explain()


class _Experts(torch.nn.Module):
    """Runs the first ``k`` of four experts (``k`` set on the model between steps)."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 16)) for _ in range(4)
        )
        self.k = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + sum(e(x) for e in self.experts[: self.k])  # type: ignore[return-value]


@pytest.mark.parametrize("native", [True, False])
def test_a_call_kept_whole_that_saves_more_than_its_profile_measures_again(native: bool) -> None:
    """NOTE [Kept planned calls]: a plan that keeps a call whole places nothing in it;
    such a call saving more than its profile (a mixture of experts running more of
    them) is seen at its exit and sends its signature to measure again, and the new plan
    meets the budget, where every later step would hold more than it. With native keep
    the call saves without the hooks but in the PROBATION passes after its record and
    once in AUDIT_EVERY passes after them (NOTE [Native keep]): the growth at the
    plan's third pass falls in the probation, so it is seen at once, as with the hooks
    always on."""
    torch.manual_seed(0)
    base = stack(_Experts, 3)()

    def set_k(m: torch.nn.Module, k: int) -> None:
        for blk in m.blocks:  # type: ignore[union-attr]
            blk.k = k

    def batch(s: int) -> torch.Tensor:
        return torch.randn(8, 16, generator=torch.Generator().manual_seed(s))

    probe = twin(base)
    set_k(probe, 2)
    # between k=1's whole keep (its last block's forward holds its first Linear's output
    # beside the Tanh's: NOTE [Forward transients]) and k=2's
    budget = int(tight_budget(probe, batch) * 1.5)
    m = twin(base)
    rt = _runtime(m, budget=budget, native_keep=native)
    with rt:
        for step in range(8 + AUDIT_EVERY):
            set_k(m, 1 if step < 4 else 2)
            m(batch(step)).square().mean().backward()
    steps = rt.report().steps
    phases = [s.phase for s in steps]
    first = settled_phases(steps[:4])  # k=1
    assert first == ["measure", "calibrate"] + ["planned"] * (len(first) - 2) and len(first) >= 3, phases
    assert all(s.recomputed_bytes == 0 for s in steps[:4] if s.phase == "planned")
    # the first step at k=2 sends it back: with the hooks on, and natively in the
    # probation (the record at step 2, then PROBATION hooked passes)
    assert PROBATION >= 2
    seen = 4
    assert phases[seen] == "planned" and phases[seen + 1] == "measure", phases  # seen at step 4's exit
    assert phases[-3:] == ["planned"] * 3 and all(s.peak_activation_bytes <= budget * 1.05 for s in steps[-3:]), [
        (s.phase, s.peak_activation_bytes, budget) for s in steps
    ]


def test_explain_shows_the_replaced_plan_while_a_signature_measures_again() -> None:
    """A signature measuring again has no plan until it plans again: ``rt.explain()``
    says why, and shows the plan it ran before (not "no plan yet")."""
    torch.manual_seed(0)
    base = stack(_Experts, 3)()
    m = twin(base)
    rt = _runtime(m, budget="50%", native_keep=False)
    with rt:
        for step in range(6):  # measure, calibrate, planned at k=1; k=2 grows: measure
            for blk in m.blocks:  # type: ignore[union-attr]
                blk.k = 1 if step < 4 else 2
            m(torch.randn(8, 16, generator=torch.Generator().manual_seed(step))).square().mean().backward()
            if step == 3:
                before = rt.explain()
    assert [s.phase for s in rt.report().steps] == ["measure", "calibrate", "planned", "planned", "planned", "measure"]
    text = rt.explain()
    assert "is measured and calibrated again" in text and "saved more than its profile: 1 time(s)" in text, text
    assert before.splitlines()[0] in text.splitlines()[1], (before, text)
    assert "no plan yet" not in text


class ComplexBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.cfloat) * 0.3)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + torch.tanh(z @ self.w)


class ComplexModel(torch.nn.Module):
    """Every tensor it saves is complex, so every save is kept as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(ComplexBlock() for _ in range(3))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            z = blk(z)
        return (z * z.conj()).real.mean()


def test_a_pass_whose_saves_are_all_kept_as_they_are_still_ends() -> None:
    """The backward of a pass is seen through any save, also one kept as it is; otherwise
    such a pass would never end: one step for the whole loop, measured forever."""
    torch.manual_seed(0)
    m = ComplexModel()
    batch = lambda s: torch.randn(4, 8, dtype=torch.cfloat, generator=torch.Generator().manual_seed(s))  # noqa: E731
    rt = train_bitwise(m, batch, "auto", None, train(twin(m), batch, steps=4))
    assert [s.phase for s in rt.report().steps] == ["measure", "calibrate", "planned", "planned"]


class JaggedStack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)) for _ in range(3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = x + blk(x)
        return x.values().square().mean()


def test_jagged_batches_of_the_same_size_share_a_signature() -> None:
    """A jagged nested tensor's ragged dimension is a new symbol in every batch: the
    signature reads the components and the packed values instead, so packed batches of
    one token count plan once (before, every step was a new signature, measured)."""
    lengths = [(3, 5, 2), (4, 4, 2), (2, 6, 2), (5, 3, 2)]

    def batch(s: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(s)
        n = lengths[(s // 10) % len(lengths)]  # train() seeds step i with 10 * i
        return torch.nested.nested_tensor([torch.randn(k, 16, generator=g) for k in n], layout=torch.jagged)

    torch.manual_seed(0)
    m = JaggedStack()
    rt = train_bitwise(m, batch, "auto", None, train(twin(m), batch, steps=4))
    steps = rt.report().steps
    assert len({s.signature for s in steps}) == 1, [s.signature for s in steps]
    assert [s.phase for s in steps] == ["measure", "calibrate", "planned", "planned"]


def test_autocast_and_the_parameters_dtype_are_part_of_the_signature() -> None:
    """A step under bf16 autocast saves other bytes than one without, as does a model cast
    to another dtype: each is its own signature, measured once and planned from then on,
    not two states alternating under one plan that each finds differing from its
    profile."""
    torch.manual_seed(0)
    model = make("gpt_dropout")[0]
    batch = make("gpt_dropout")[1]
    m = twin(model)
    budget = tight_budget(m, batch)
    rt = _runtime(m, budget=budget)
    with rt:
        for step in range(10):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=step % 2 == 1):
                loss = m(batch(step))
            loss.backward()
            m.zero_grad(set_to_none=True)
    steps = rt.report().steps
    signatures = sorted({s.signature for s in steps})
    assert len(signatures) == 2 and "autocast:cpu:bfloat16|" in signatures[1], signatures
    assert [s.phase for s in steps].count("measure") == 2, [s.phase for s in steps]
    assert [s.phase for s in steps][-4:] == ["planned"] * 4
    m.double()
    with rt:
        m(batch(0)).backward()
    assert "params:float64|" in rt.report().steps[-1].signature


def _two_lengths(s: int) -> torch.Tensor:
    """Micro-batch 0 of each step has 24 tokens, micro-batch 1 has 12 (train(): 10*step + micro)."""
    return torch.randint(0, 64, (2, 24 if s % 10 == 0 else 12), generator=torch.Generator().manual_seed(s))


def test_each_pass_of_a_step_is_learnt_by_its_own_signature() -> None:
    """Gradient accumulation over micro-batches of two lengths: two signatures in every
    step. Each pass's times go to its own signature's cost model, so both calibrate once
    and plan. Learnt into the first pass's signature, the second's times would mix both
    lengths in one model, and the second signature would calibrate (a full recompute) at
    every step."""
    torch.manual_seed(0)
    model = make("gpt_dropout")[0]
    ref = train(twin(model), _two_lengths, steps=6, accumulate=2)
    m = twin(model)
    rt = _runtime(m, budget="50%")
    assert_bitwise(ref, train(m, _two_lengths, rt, steps=6, accumulate=2))
    entries = rt.planner.entries
    assert sorted(entries) == ["train|(2, 12):int64:cpu", "train|(2, 24):int64:cpu"]
    for sig, e in entries.items():
        assert e.calibrated and e.plan is not None, sig
        # one sample per pass of this signature since its calibration (steps 1-5)
        assert e.cost is not None and 1 <= e.cost.samples <= 5, (sig, e.cost and e.cost.samples)
    assert [s.phase for s in rt.report().steps][-3:] == ["planned"] * 3


def _longer_after_step_0(s: int) -> torch.Tensor:
    """Step 0's micro-batches have 12 tokens, later steps' 24 (train(): 10*step + micro):
    too long to borrow step 0's plan."""
    return torch.randint(0, 64, (2, 12 if s < 10 else 24), generator=torch.Generator().manual_seed(s))


def test_a_calibration_in_the_open_step_is_learnt_before_the_next_micro_batch() -> None:
    """NOTE [Calibration in an open step]: a signature first seen in the second step, of
    three micro-batches, measures, calibrates and plans within that step. Learnt only
    once the step's record is read (after the optimizer step), its calibration would be
    unread when the third micro-batch begins, which would calibrate (a full recompute)
    again, as would every further micro-batch of the step."""
    torch.manual_seed(0)
    model = make("gpt_dropout")[0]
    ref = train(twin(model), _longer_after_step_0, steps=3, accumulate=3)
    m = twin(model)
    rt = _runtime(m, budget="50%")
    assert_bitwise(ref, train(m, _longer_after_step_0, rt, steps=3, accumulate=3))
    steps = rt.report().steps
    assert [s.signature for s in steps] == ["train|(2, 12):int64:cpu"] + ["train|(2, 24):int64:cpu"] * 2
    if not recalibrated(steps):  # a host pause may make a calibration run again
        assert [s.phases for s in steps] == ["measure+calibrate+planned", "measure+calibrate+planned", "planned"]
    entry = rt.planner.entries["train|(2, 24):int64:cpu"]
    assert entry.calibrated and entry.plan is not None


class _PadShortBlock(torch.nn.Module):
    """Saves a larger activation for shorter inputs (pads them to 32 positions first),
    with the same storages in the same order either way."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 64)
        self.out = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        y = torch.nn.functional.pad(x, (0, 0, 0, 32 - t)) if t < 12 else x * 1.0
        return x + self.out(torch.tanh(self.fc(y)))[:, :t]


def _pad_short_batch(s: int) -> torch.Tensor:
    t = [16, 8, 8, 16][(s // 10) % 4]
    return torch.randn(2, t, 16, generator=torch.Generator().manual_seed(s))


def test_a_borrowed_plan_that_does_not_bound_a_storage_measures_next_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NOTE [Borrowed plans]: code whose saves depend on the shape (here: shorter inputs
    are padded to 32 positions) can save more than the donor at the same index. That
    call drops its activations, and the signature measures its own profile next time
    (with a plan cache of one: otherwise it would borrow again)."""
    torch.manual_seed(0)
    model = stack(_PadShortBlock)()
    ref = train(twin(model), _pad_short_batch, steps=4)
    m = twin(model)
    rt = _runtime(m, budget=10_000_000, plan_cache_size=1)
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        assert_bitwise(ref, train(m, _pad_short_batch, rt, steps=4))
    assert "region 'blocks.0' call 0 saves storage" in caplog.text
    phases = [s.phase for s in rt.report().steps]
    assert phases == ["measure", "borrowed", "measure", "measure"], phases
    borrowed = rt.report().steps[1]
    assert borrowed.recomputed_bytes > 0  # the call that outgrew the donor dropped


def _long_then_short(s: int) -> torch.Tensor:
    t = 24 if s < 20 else 16  # two steps at 24 tokens (measure, calibrate), then shorter
    return torch.randint(0, 64, (2, t), generator=torch.Generator().manual_seed(s))


def test_a_borrowing_pass_runs_the_donor_plan_priced_for_plain_replays() -> None:
    """NOTE [Borrowed plans]: a borrowing pass replays plainly (nothing is served: the
    donor's recording is another shape's), so it runs the donor's plan solved with every
    replay priced plainly. Under that pricing it is never slower than the plan the donor
    runs itself (solved with every dispatch-mode replay paying, ``replay_op_us=0``); the
    two may coincide, as the measured times decide."""
    torch.manual_seed(0)
    model = make("gpt_dropout")[0]
    ref = train(twin(model), _long_then_short, steps=5)
    m = twin(model)
    rt = _runtime(m, budget="40%", replay_op_us=0, plan_cache_size=1)  # a seen signature borrows again
    assert_bitwise(ref, train(m, _long_then_short, rt, steps=5))
    steps = rt.report().steps
    assert [s.phase for s in steps] == ["measure", "calibrate", "borrowed", "borrowed", "borrowed"]
    donor = rt.planner.entries["train|(2, 24):int64:cpu"]
    assert donor.plan is not None and donor.borrow_plan is not None and donor.profile is not None
    assert all(s.plan_id == donor.borrow_plan.plan_id for s in steps[2:])
    plain = copy.deepcopy(donor.profile)
    plain.replay_op_seconds = Solver.PLAIN_REPLAY_OP_SECONDS
    borrowed, own = predict(plain, donor.borrow_plan), predict(plain, donor.plan)
    assert borrowed.peak_bytes <= rt.planner.budget_bytes(plain)  # type: ignore[operator]
    assert borrowed.step_seconds <= own.step_seconds * (1 + 1e-9)


def test_passes_borrowing_a_plan_that_fits_no_budget_drop_every_droppable_save(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NOTE [Borrowed plans]: where no plan with plain replays is predicted to fit the
    donor's budget (its own plan fits with served replays), a pass that would borrow it
    runs a plain full recompute instead: it holds no more than the donor's measuring
    pass, which dropped the same saves at a larger shape. Said once, at INFO."""
    original = Solver.solve_borrow_plan

    def infeasible(self: Solver, entry: Any) -> None:
        original(self, entry)
        entry.borrow_plan.feasible = False
        entry.borrow_plan.predicted_peak_bytes = entry.measured_peak_bytes + 1  # above full recompute's

    monkeypatch.setattr(Solver, "solve_borrow_plan", infeasible)
    torch.manual_seed(0)
    model = make("gpt_dropout")[0]
    ref = train(twin(model), _long_then_short, steps=5)
    m = twin(model)
    rt = _runtime(m, budget="40%", plan_cache_size=1)
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        assert_bitwise(ref, train(m, _long_then_short, rt, steps=5))
    steps = rt.report().steps
    assert [s.phase for s in steps] == ["measure", "calibrate", "recompute", "recompute", "recompute"]
    donor = rt.planner.entries["train|(2, 24):int64:cpu"]
    assert donor.measured_peak_bytes is not None
    assert all(0 < s.peak_activation_bytes <= donor.measured_peak_bytes for s in steps[2:])
    said = [r for r in caplog.records if "drop every droppable save instead" in r.getMessage()]
    assert len(said) == 1


def test_a_borrow_plan_predicted_below_full_recompute_runs_even_if_it_does_not_fit() -> None:
    """NOTE [Borrowed plans]: full recompute replaces an infeasible borrow plan only where
    the donor's measuring pass held no more than that plan is predicted to; a plan that
    holds less (offloading root saves, say) still runs."""
    from offrecomp.planning.entries import PlanEntry
    from offrecomp.planning.planner import _recompute_instead

    entry = PlanEntry(signature="sig", measured_peak_bytes=1000)
    entry.borrow_plan = Plan(feasible=True, predicted_peak_bytes=2000)
    assert not _recompute_instead(entry)
    entry.borrow_plan = Plan(feasible=False, predicted_peak_bytes=2000)
    assert _recompute_instead(entry)
    entry.borrow_plan = Plan(feasible=False, predicted_peak_bytes=900)
    assert not _recompute_instead(entry)


def test_a_step_over_a_budget_said_to_be_out_of_reach_gives_no_advice(caplog: pytest.LogCaptureFixture) -> None:
    """records.check_budget: over the budget by more than OVER_BUDGET, a step warns once
    to plan with a lower budget, unless the budget was already said to be infeasible."""
    from offrecomp.planning import records
    from offrecomp.planning.entries import PlanEntry

    plan = Plan(budget_bytes=1000)
    for infeasible in (True, False):
        entry = PlanEntry(signature="sig", warned_infeasible=infeasible)
        with caplog.at_level(logging.WARNING, logger="offrecomp"):
            caplog.clear()
            records.check_budget(entry, plan, 2000, "sig")
        advice = [r for r in caplog.records if "Plan with a budget lower" in r.getMessage()]
        assert len(advice) == (0 if infeasible else 1)


def test_a_slow_first_solve_says_why_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first plan of a process compiles the planner's kernels (about 20 s where numba
    has no cache yet): a warning names the cause and the warmup command, once."""
    monkeypatch.setattr(solving, "SLOW_FIRST_SOLVE_SECONDS", 0.0)
    monkeypatch.setattr(solving, "_solved_once", False)
    model, batch = make("gpt_dropout")
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        for _ in range(2):
            m = twin(model)
            train(m, batch, offrecomp.runtime(m, mode="auto", min_bytes=0), steps=4)
    slow = [r for r in caplog.records if "first plan of this process" in r.getMessage()]
    assert len(slow) == 1 and "python -m offrecomp warmup" in slow[0].getMessage()


def test_offload_trial_state_machine() -> None:
    """NOTE [Offload trial]: a median of TRIAL_PASSES passes over the prediction by more
    than TRIAL_EXCESS starts a trial; one slow pass does not; the faster stays."""
    over = 1.0 + 2 * TRIAL_EXCESS
    t = OffloadTrial()
    assert [t.observe(False, 5.0, 1.0) for _ in range(TRIAL_PASSES)] == [None] * TRIAL_PASSES
    assert t.observe(True, over, 1.0) is None  # one slow pass
    for _ in range(TRIAL_PASSES - 2):
        assert t.observe(True, 1.0, 1.0) is None
    assert t.observe(True, 1.0, 1.0) is None and t.state == "watch" and t.allow_offload
    results = [t.observe(True, over, 1.0) for _ in range(TRIAL_PASSES)]
    assert results.count("try") == 1  # as soon as most of the window is slow
    assert t.state == "trial" and not t.allow_offload and t.measured_with() == over
    assert t.observe(True, 9.0, 1.0) is None  # a pass that still offloads is not the trial's
    results = [t.observe(False, 1.05, 1.0) for _ in range(TRIAL_PASSES)]
    assert results[-1] == "keep" and not t.allow_offload and t.state == "settled"
    assert t.observe(True, 9.0, 1.0) is None and t.observe(False, 9.0, 1.0) is None

    slower = OffloadTrial()
    for _ in range(TRIAL_PASSES):
        slower.observe(True, over, 1.0)
    assert [slower.observe(False, 2 * over, 1.0) for _ in range(TRIAL_PASSES)][-1] == "back"
    assert slower.allow_offload and slower.state == "settled"

    cancelled = OffloadTrial()
    for _ in range(TRIAL_PASSES):
        cancelled.observe(True, over, 1.0)
    cancelled.cancel()
    assert cancelled.allow_offload and cancelled.state == "settled"
    assert cancelled.observe(True, 10 * over, 1.0) is None


def _trial_runtime(monkeypatch: pytest.MonkeyPatch, alt_scale: float) -> tuple[offrecomp.Runtime, int]:
    """auto with offloading allowed on CPU (the emulated backend), every plan that
    offloads taken for slow, and the plan without offloading predicted ``alt_scale``
    times what the solver says; trains a GPT and checks it bitwise against plain.
    Returns the runtime and the steps of the planned passes' first trial window."""
    monkeypatch.setattr(solving, "offload_allowed", lambda entry, profile: entry.trial.allow_offload)
    # the emulated backend's host costs (threads, not a link) would price offloading out
    monkeypatch.setattr(learning, "learn_host_costs", lambda p, measured: None)
    monkeypatch.setattr(trial, "TRIAL_EXCESS", -1.0)  # every offloading plan is "slow", whatever it predicts
    solve_plan = Solver.solve_plan

    def scaled(self: Solver, entry: Any, *, allow_offload: bool | None = None) -> Plan:
        plan = solve_plan(self, entry, allow_offload=allow_offload)
        if allow_offload is False and plan.predicted_step_seconds is not None:
            plan.predicted_step_seconds *= alt_scale  # the trial's own solve only
        return plan

    monkeypatch.setattr(Solver, "solve_plan", scaled)
    model, batch = make("gpt_dropout")
    steps = 6 + 3 * TRIAL_PASSES  # two first passes skipped, and room for a paused one
    ref = train(twin(model), batch, steps=steps)
    budget = tight_budget(model, batch)
    m = twin(model)
    # drift=100: a loaded host's step times must not re-plan (and so restart the trial)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget=budget, d2h_gbps=5, h2d_gbps=5, drift=100.0)
    assert_bitwise(ref, train(m, batch, rt, steps=steps))
    return rt, TRIAL_PASSES


def test_offload_trial_runs_the_plan_without_offloading(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end with the emulated offload backend: plans that offload, the trial's
    plan without, then the faster one; gradients bitwise equal to plain throughout."""
    rt, passes = _trial_runtime(monkeypatch, alt_scale=0.01)
    recs = rt.report().steps
    assert [s.phase for s in recs[:2]] == ["measure", "calibrate"]
    planned = recs[2:]
    assert all(s.phase == "planned" for s in planned)
    notes = [(i, n) for i, s in enumerate(planned) for n in s.notes if n.startswith("offload trial")]
    assert len(notes) == 2, notes
    (start, first), (end, second) = notes
    # a trial judges the offloading plan's last `passes` steps but its first and any a
    # host pause distorted (a re-plan restarts it); the same for the plan without
    assert start >= passes and "trying without offloading" in first
    assert all(s.offloaded_bytes > 0 for s in planned[:start + 1])
    assert end >= start + passes + 1 and all(s.offloaded_bytes == 0 for s in planned[start + 1:end + 1])
    offloading_again = "offloading again" in second
    assert offloading_again or "offloading stays off" in second
    assert all((s.offloaded_bytes > 0) == offloading_again for s in planned[end + 1:])
    assert "note: offload trial: " in rt.explain()


def test_offload_trial_not_run_when_the_plan_without_is_no_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan without offloading, predicted slower than what the offloading plan
    measured, is not tried: a note says so, and offloading goes on."""
    rt, passes = _trial_runtime(monkeypatch, alt_scale=100.0)
    planned = rt.report().steps[2:]
    notes = [(i, n) for i, s in enumerate(planned) for n in s.notes if n.startswith("offload trial")]
    assert len(notes) == 1 and notes[0][0] >= passes, notes
    assert all(s.offloaded_bytes > 0 for s in planned[notes[0][0] - passes + 1 : notes[0][0] + 1])
    assert "offloading stays" in notes[0][1]
    assert all(s.offloaded_bytes > 0 for s in planned)


def test_phases_read_as_the_strings_reports_show() -> None:
    """``Phase`` members are the strings step records, the report's table and its JSON
    lines carry: compared, formatted and serialised as those strings."""
    from offrecomp.phases import Phase

    want = {"measure", "calibrate", "planned", "borrowed", "user-plan", "recompute", "keep", "offload"}
    assert {p.value for p in Phase} == want
    for p in Phase:
        assert p == p.value and hash(p) == hash(p.value) and Phase(p.value) is p
        assert str(p) == f"{p}" == "%s" % p == p.value  # noqa: UP031 (log messages format so)
        assert f"{p:>10}" == f"{p.value:>10}"
        assert json.dumps([p]) == json.dumps([p.value])
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = _runtime(m, budget="50%")
    train(m, batch, rt, steps=3)
    report = rt.report()
    assert [s.phase for s in report.steps] == ["measure", "calibrate", "planned"]
    assert all(isinstance(s.phase, Phase) for s in report.steps)
    for text in (report.to_json(), report.to_json(indent=2)):
        assert [s["phase"] for s in json.loads(text)["steps"]] == ["measure", "calibrate", "planned"]
    rows = str(report).splitlines()[2:5]  # under the header and its rule
    assert [row.split()[1] for row in rows] == ["measure", "calibrate", "planned"]


def _imports(path: pathlib.Path, submodules: set[str]) -> set[str]:
    """The modules ``path`` imports when it runs (not those under TYPE_CHECKING); a name
    imported from a package counts as its submodule where it is one of ``submodules``."""
    tree = ast.parse(path.read_text())
    skip = {
        id(n) for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in submodules else node.module)
    return out


def test_the_planning_package_imports_one_way() -> None:
    """The planner needs neither the runtime nor the hooks (it reads the runtime through
    ``PlannerHost``), and its modules import each other without a circle (none imports
    the package itself, whose ``__init__`` imports them)."""
    root = pathlib.Path(offrecomp.__file__).parent / "planning"
    modules = {f"offrecomp.planning.{p.stem}": p for p in root.glob("*.py") if p.stem != "__init__"}
    assert {"offrecomp.planning.host", "offrecomp.planning.planner"} <= set(modules)
    deps = {}
    for name, path in modules.items():
        imported = _imports(path, set(modules))
        assert not imported & {"offrecomp.runtime", "offrecomp.hooks", "offrecomp.planning"}, (name, imported)
        deps[name] = {m for m in imported if m in modules and m != name}
    done: set[str] = set()
    while len(done) < len(deps):  # peel the modules whose imports are all peeled: a circle stalls
        ready = {m for m, d in deps.items() if m not in done and d <= done}
        assert ready, {m: d - done for m, d in deps.items() if m not in done}
        done |= ready


class _Host:
    """A ``PlannerHost`` that is no runtime: what a planner needs, and nothing else."""

    def __init__(self, **config: Any) -> None:
        self.config = offrecomp.Config.resolve(config)
        self.clock = Clock(None)
        self.regions: list[Any] = []
        self.distributed = False
        self.user_plan: Plan | None = None

    def device(self) -> torch.device:
        return torch.device("cpu")

    def engine(self) -> Any:
        raise AssertionError("no plan here offloads")

    def host_limit_bytes(self) -> int:
        return 0

    def warn_collective(self, region: Any) -> None:
        raise AssertionError("no region here runs collectives")


def test_a_planner_runs_over_any_planner_host() -> None:
    """``Planner`` reads only ``PlannerHost``: over a stand-in host it gives a forced
    mode's phase and placements and a user plan's, and explains a forced mode."""
    from offrecomp.placement import Placements
    from offrecomp.state import RegionCall

    host = _Host(mode="keep")
    planner = Planner(host)
    wanted = Placements(host.config, planner, None, lambda: host.user_plan)._wanted  # type: ignore[arg-type]
    p = PassState(index=0, signature="sig", mode="keep")
    planner.begin_pass(p)
    assert p.phase == "keep"
    call = RegionCall(name="blocks.0", call_index=0, ordinal=0)
    assert wanted(p, call, 0, 1 << 20, "activation") == Placement.KEEP
    assert not planner.needs_capture(p, call)
    assert "mode='keep'" in planner.explain()
    host.user_plan = Plan(placements={("blocks.0", 0, 0): Placement.RECOMPUTE})
    p = PassState(index=1, signature="sig", mode="keep")
    planner.begin_pass(p)
    assert p.phase == "user-plan" and p.plan_id == host.user_plan.plan_id
    assert wanted(p, call, 0, 1 << 20, "activation") == Placement.RECOMPUTE
    assert planner.needs_capture(p, call)
    assert "set with rt.set_plan()" in planner.explain()


def test_the_runtime_hands_its_planner_exactly_the_planner_host() -> None:
    """The runtime's adapter has the public names of ``PlannerHost``, no more."""
    from offrecomp.planning import PlannerHost

    def public(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_")}

    assert public(PlannerHost) == {
        "config", "clock", "regions", "distributed", "user_plan", "device", "engine", "host_limit_bytes",
        "warn_collective",
    }
    model, _ = make("gpt_dropout")
    rt = _runtime(twin(model))
    assert public(type(rt.planner.host)) == public(PlannerHost)
    assert rt.planner.host.config is rt.config and rt.planner.host.device().type == "cpu"
    plan = Plan(placements={})
    rt.set_plan(plan)
    assert rt.planner.host.user_plan == plan  # read live (a copy of it: NOTE in set_plan)
    rt.set_plan(None)
    assert rt.planner.host.user_plan is None


def test_a_learnt_forward_total_shrinks_a_stale_timeline() -> None:
    """NOTE [Forward timeline]: a pass whose calls are not the profile's learns only the
    forward total; region starts left from a measuring pass that a one-off pause
    lengthened are fitted into it (their gaps shrink, the regions' own times stay), so
    the layout takes the learnt total, not the stale timeline's end, for the forward
    (which kept the prediction at 30x the measured step through every re-plan)."""
    from scheduler.profile import Profile, RegionRecord

    regions = [
        RegionRecord(name=f"b.{i}", call_index=0, start_seconds=s, forward_seconds=0.001, backward_seconds=0.002)
        for i, s in enumerate([0.0, 0.3, 0.301])  # a 0.3 s pause before b.1 when measured
    ]
    profile = Profile(signature="s", forward_seconds=0.01, regions=regions)
    learning._fit_timeline(profile)
    ends = [r.start_seconds + r.forward_seconds for r in profile.regions]
    assert ends[-1] <= 0.01 + 1e-12, ends
    assert all(b.start_seconds >= a.start_seconds + a.forward_seconds - 1e-12 for a, b in itertools.pairwise(regions))
    assert [r.forward_seconds for r in regions] == [0.001] * 3
    late = RegionRecord(name="b", call_index=0, start_seconds=0.2, forward_seconds=0.1, backward_seconds=0.2)
    kept = Profile(signature="s", forward_seconds=1.0, regions=[late])
    learning._fit_timeline(kept)
    assert kept.regions[0].start_seconds == 0.2  # a timeline within the total stays


def test_backward_seconds_follow_time_not_forward_order() -> None:
    """NOTE [Several backwards]: two forwards' losses backwarded one at a time, the first
    forward's first: each call's backward runs from its replay's end to what came next in
    time (the next replay, or its backward's end), never to a replay of the other
    backward."""
    from offrecomp.planning.profiling import _backward_seconds, _timeline

    m = {t: Mark(float(t)) for t in range(10, 25)}
    # forward A: calls 0 and 1; forward B: calls 2 and 3; A's backward first, then B's
    marks = {1: (m[10], m[11]), 0: (m[12], m[13]), 3: (m[20], m[21]), 2: (m[22], m[23])}
    timeline = _timeline(marks, [m[14], m[24]])
    clock = Clock(None)
    got = {k: _backward_seconds(clock, k, marks, timeline) for k in range(4)}
    assert got == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    assert _backward_seconds(clock, 4, marks, timeline) is None  # not replayed


class _HalfEveryOther(torch.nn.Module):
    """Every other step the blocks run on the first half of the sequence: one input
    signature, two layouts of the blocks' inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
            for _ in range(4)
        )
        self.half = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.half:
            x = x[:, : x.shape[1] // 2]
        for b in self.blocks:
            x = x + b(x)
        return x.square().mean()


def test_steps_alternating_block_layouts_under_one_signature_plan_after_a_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NOTE [Stale recordings]: a calibration pass whose calls run on inputs of another
    layout than the measuring pass's recording sends the signature to measure again;
    when that keeps happening (steps alternate between two layouts the signature does not
    tell apart) it stops after MAX_RELAYOUT_MEASURES times, with one warning, and the
    plan runs, such calls replaying plainly: gradients stay plain's."""
    from offrecomp.planning.differences import MAX_RELAYOUT_MEASURES

    torch.manual_seed(0)
    base = _HalfEveryOther()
    steps = 2 * (MAX_RELAYOUT_MEASURES + 1) + 6

    def run(m: torch.nn.Module, rt: offrecomp.Runtime | None) -> list[list[torch.Tensor]]:
        out = []
        for s in range(steps):
            m.half = bool(s % 2)  # type: ignore[assignment]
            x = torch.randn(4, 64, 64, generator=torch.Generator().manual_seed(s))
            with rt if rt is not None else contextlib.nullcontext():
                m(x).backward()
            out.append([p.grad.clone() for p in m.parameters()])  # type: ignore[union-attr]
            m.zero_grad()
        return out

    ref = run(twin(base), None)
    m = twin(base)
    rt = offrecomp.runtime(m, mode="auto", budget="50%")
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        got = run(m, rt)
    for a, b in zip(ref, got):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    phases = [s.phase for s in rt.report().steps]
    assert phases[-4:] == ["planned"] * 4, phases
    warned = [r.getMessage() for r in caplog.records if "other inputs than their recording" in r.getMessage()]
    assert len(warned) == 1
    assert "(last: its inputs, parameters or buffers have another layout than its recording;" in warned[0]


class _OptionalBiasBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.tanh(self.lin(x))
        return x + (h if bias is None else h * bias.sigmoid())


class _OptionalBiasChain(torch.nn.Module):
    """Each block gets an optional tensor argument on every other step: the model's
    inputs have one shape throughout."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_OptionalBiasBlock() for _ in range(4))
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, b in enumerate(self.blocks):
            x = b(x, None if (self.step + i) % 2 else x[:, :1])
        return x.square().mean()


def test_an_optional_argument_given_on_some_steps_is_named_in_the_warning(caplog: pytest.LogCaptureFixture) -> None:
    """The warning blamed another layout or size of the inputs, which never changed: it
    names what did (another number of tensors), and hints at optional arguments."""
    torch.manual_seed(0)
    m = _OptionalBiasChain()
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(m, mode="auto", min_bytes=0):
        for s in range(10):
            m.step = s
            m(torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(s))).backward()
    warned = [r.getMessage() for r in caplog.records if "other inputs than their recording" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "another number of tensors than its recording (an argument given as a tensor" in warned[0]
    assert "give each optional argument on every step or on none" in warned[0]


def _maml(model: torch.nn.Module, rt: offrecomp.Runtime | None, steps: int) -> list[dict[str, torch.Tensor]]:
    """MAML: two tasks, two inner steps of fast weights (``functional_call``, gradients
    made with ``create_graph``), the outer loss backwarded through them."""
    from torch.func import functional_call

    def batch(s: int) -> torch.Tensor:
        return torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1000 + s))

    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    out = []
    with rt if rt is not None else contextlib.nullcontext():
        for s in range(steps):
            torch.manual_seed(s)
            meta: Any = 0
            for task in range(2):
                params = dict(model.named_parameters())
                for i in range(2):
                    inner = functional_call(model, params, (batch(100 * s + 10 * task + i),))
                    grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
                    params = {n: p - 0.1 * g for (n, p), g in zip(params.items(), grads)}
                meta = meta + functional_call(model, params, (batch(100 * s + 10 * task + 9),))
            meta.backward()
            out.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            opt.step()
            opt.zero_grad(set_to_none=True)
    return out


def test_meta_learning_steps_are_held_to_the_budget_or_warned(caplog: pytest.LogCaptureFixture) -> None:
    """MAML under auto: each step runs several passes (four inner forwards with
    ``create_graph``, two outer ones); its blocks save nothing of the parameters in the
    first inner forward and the fast weights in the later ones, which are signatures of
    their own (NOTE [Frozen parameters]). The first step measures, the second
    calibrates, and from the third on every step runs plans (its own or borrowed).
    Gradients are bitwise; every step that plans names its budget, and one that held
    more than 5% over it says so."""
    from offrecomp.planning.records import OVER_BUDGET
    from tests import models

    torch.manual_seed(0)
    base = models.GPT(layers=4, h=16, heads=2, p=0.1)
    ref = _maml(twin(base), None, 11)
    probe = twin(base)
    keep = offrecomp.runtime(probe, mode="keep", min_bytes=0)
    _maml(probe, keep, 1)
    budget = keep.report().steps[0].peak_activation_bytes // 2
    m = twin(base)
    rt = offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        got = _maml(m, rt, 11)
    assert_bitwise(ref, got)
    steps = rt.report().steps
    shown = [(s.phase, s.phases, s.budget_bytes, s.peak_activation_bytes) for s in steps]
    phases = [s.phase for s in steps]
    assert phases[:2] == ["measure", "calibrate"] and phases[2:] == ["planned"] * (len(phases) - 2), shown
    assert all(set(s.phases.split("+")) <= {"planned", "borrowed"} for s in steps[3:]), shown
    assert all(s.budget_bytes == budget for s in steps[2:]), shown
    # held within 5% on a quiet host; a loaded one times the passes otherwise, and the
    # plan it picks may hold the kept fast weights over the budget: then it says so
    over = [s for s in steps if s.budget_bytes is not None and s.peak_activation_bytes > OVER_BUDGET * budget]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    warned = any("of activations for a budget of" in m or "cannot be met" in m for m in said)
    assert not over or warned, (shown, said)


@pytest.mark.parametrize("case", ["cnn_batchnorm", "views_inplace", "shared_block", "kwargs_tuple"])
def test_the_most_frugal_plans_peak_is_predicted_as_measured(case: str) -> None:
    """NOTE [Frees before a replay] (scheduler/timeline.py): at a budget no plan meets,
    with plain replays (a dispatch mode priced out of every replay), the most frugal
    plan's predicted peak is the peak its steps book: a replay's working set does not
    come on top of the kept storages autograd freed before it, so budgets such plans
    meet are not called infeasible. ``kwargs_tuple``'s blocks take as input a
    storage the block before keeps: one allocation, counted once by the books and the
    model (NOTE [Inputs counted once] in shared.py)."""
    model, batch = make(case)
    budget = tight_budget(model, batch) // 2
    m = twin(model)
    rt = _runtime(m, budget=budget, drift=100.0, replay_op_us=1e5)
    train(m, batch, rt, steps=5)
    entry = rt.planner.last_entry
    assert entry is not None and entry.plan is not None and not entry.plan.feasible
    planned = [s.peak_activation_bytes for s in rt.report().steps if s.phase == "planned"]
    assert planned and set(planned) == {entry.plan.predicted_peak_bytes}, (planned, entry.plan.predicted_peak_bytes)


@pytest.mark.parametrize("depth", [1, None])
def test_a_pass_reloads_as_far_ahead_as_its_plan_chose(depth: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Chosen prefetch] (scheduler/solver/api.py): the groups of a pass running a
    plan solved for one group ahead reload one ahead (the engine's prefetch otherwise),
    and its gradients stay bitwise; a plan naming no depth reloads as configured."""
    from offrecomp.offload import OffloadEngine

    opened: list[int | None] = []
    open_group = OffloadEngine.open_group

    def spy(self: OffloadEngine, ordinal: int, device: torch.device, prefetch_regions: int | None = None) -> Any:
        opened.append(prefetch_regions)
        return open_group(self, ordinal, device, prefetch_regions)

    monkeypatch.setattr(OffloadEngine, "open_group", spy)
    model, batch = make("gpt_dropout")
    plain = twin(model)
    ref = train(plain, batch, None, steps=3) + train(plain, batch, None, steps=2)
    m = twin(model)
    rt = _runtime(m)
    got = []
    with rt:
        got += train(m, batch, None, steps=3)
        solved = rt.planner.entries[rt.report().steps[-1].signature].plan
        assert solved is not None
        user = copy.deepcopy(solved)
        user.placements = dict.fromkeys(solved.placements, Placement.OFFLOAD)
        user.prefetch_regions = depth
        rt.set_plan(user)
        opened.clear()
        got += train(m, batch, None, steps=2)
    assert_bitwise(ref[3:], got[3:])
    assert len(opened) > 2 and set(opened) == {depth}, opened


@pytest.mark.parametrize(("kw", "depths"), [({}, {1, 2}), ({"prefetch": 2}, {None}), ({"prefetch": "1MiB"}, {None})])
def test_plans_name_their_depth_unless_the_prefetch_is_configured(kw: dict[str, Any], depths: set[int | None]) -> None:
    """The solver chooses the depth of a run's plans where ``prefetch`` is left as it is;
    a configured one (a count, a byte window) is the engine's, and the plans name none."""
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = _runtime(m, budget=tight_budget(model, batch), **kw)
    train(m, batch, rt, steps=4)
    plan = rt.planner.entries[rt.report().steps[-1].signature].plan
    assert plan is not None and plan.prefetch_regions in depths
    said = f"reloads {plan.prefetch_regions} group" in rt.explain()
    assert said == (plan.prefetch_regions is not None and plan.counts()[Placement.OFFLOAD] > 0)


class _DropsLayers(nn.Module):
    """Six MLP blocks, those named in ``skip`` left out of a forward (layer drop decided
    outside the blocks)."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, d)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(6)
        )
        self.head = nn.Linear(d, 64)

    def forward(self, tok: torch.Tensor, skip: tuple[int, ...] = (), moded: tuple[int, ...] = ()) -> torch.Tensor:
        x = self.emb(tok)
        for i, b in enumerate(self.blocks):
            if i in moded:  # under a dispatch mode of the caller's: no recording of it is made
                with _Passthrough():
                    x = x + b(x)
            elif i not in skip:
                x = x + b(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), tok.flatten())


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def test_a_donor_lends_on_where_a_call_no_profile_can_hold_ran() -> None:
    """A block run under a dispatch mode of the caller's keeps its activations and is in
    no profile, the donor's included: a pass borrowing the plan that runs it is no
    reason to stop lending (every later length would run a full recompute)."""
    torch.manual_seed(0)
    m = _DropsLayers()
    with _runtime(m) as rt:
        for i, t in enumerate((80, 72, 70, 68, 66, 64)):
            m(torch.randint(0, 64, (4, t), generator=torch.Generator().manual_seed(i)), moded=(5,)).backward()
    assert [s.phase for s in rt.report().steps] == ["measure"] + ["borrowed"] * 5


def test_a_donor_lacking_calls_a_borrower_ran_lends_no_more(caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Borrowed plans]: the donor's measuring pass skipped two blocks; a shorter
    length borrowing its plan runs them, their replays beyond the donor's peak (over the
    budget, warned). The lengths after it borrowed that plan too, each over the budget;
    now the donor lends no more, and they stay within it (a full recompute, at most a
    quarter below a profiled shape)."""
    schedule = [((4, 80), (3, 5))] + [((4, t), ()) for t in (72, 70, 68, 66, 64)]

    def run(m: nn.Module, rt: Any) -> list[list[torch.Tensor]]:
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            for i, (shape, skip) in enumerate(schedule):
                tok = torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(i))
                m(tok, skip).backward()
                out.append([p.grad.clone() for p in m.parameters() if p.grad is not None])
                m.zero_grad()
        return out

    torch.manual_seed(0)
    model = _DropsLayers()
    kept = twin(model)
    keep = offrecomp.runtime(kept, mode="keep", min_bytes=0)
    run(kept, keep)
    budget = int(0.3 * keep.report().steps[1].peak_activation_bytes)
    ref = run(twin(model), None)
    m = twin(model)
    rt = _runtime(m, budget=budget)
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        got = run(m, rt)
    assert all(torch.equal(a, b) for r, g in zip(ref, got) for a, b in zip(r, g))
    steps = rt.report().steps
    assert [s.phase for s in steps[:2]] == ["measure", "borrowed"]
    assert "borrowed" not in [s.phase for s in steps[2:]], [s.phase for s in steps]
    assert all(s.peak_activation_bytes <= budget for s in steps[2:]), [s.peak_activation_bytes / budget for s in steps]
    assert sum("it lends no plan until profiled again" in r.getMessage() for r in caplog.records) == 1
