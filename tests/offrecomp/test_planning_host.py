"""The planner's host-time learning (NOTE [Host time] in scheduler/timeline.py) and its
bookkeeping outside the backward-done callback (NOTE [Bookkeeping off the critical
path] in offrecomp/planning/planner.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

import offrecomp
from offrecomp._torch_compat import current_graph_task_id
from offrecomp.hooks import HOOK_SAMPLE
from offrecomp.planning import OUTLIER_RATIO, Planner, learning
from offrecomp.state import PassState
from scheduler import Placement, Plan
from tests.helpers import assert_bitwise, make, train, twin
from tests.offrecomp.test_host_pauses import _batch, _model


def _runtime(model: object, **kw: object) -> offrecomp.Runtime:
    return offrecomp.runtime(model, mode="auto", min_bytes=0, **kw)  # type: ignore[arg-type]


def _measured_pass(saves: int, **costs: Any) -> PassState:
    """A pass whose stats carry the runtime's host-cost fields given in ``costs``, every
    save hooked (the timed calls' counts default to one in HOOK_SAMPLE saves)."""
    p = PassState(index=0, signature="sig", mode="auto")
    p.stats.saved_tensors = p.stats.hooked_saves = saves
    p.stats.pack_timed = p.stats.unpack_timed = max(1, saves // HOOK_SAMPLE)
    for name in ("pack_seconds", "unpack_seconds", "pack_timed", "unpack_timed", "capture_seconds", "captures"):
        if name in costs:
            setattr(p.stats, name, costs.pop(name))
    p.offload_stats = SimpleNamespace(**costs)  # type: ignore[assignment]
    return p


def test_host_costs_are_learnt_per_save_and_per_group() -> None:
    from scheduler import Profile

    measured = Profile(signature="sig")
    p = _measured_pass(
        100,
        pack_seconds=1e-4,
        pack_timed=10,
        unpack_seconds=5e-5,
        unpack_timed=10,
        groups_offloaded=4,
        offload_host_seconds=2e-4,
        groups_reloaded=2,
        reload_host_seconds=1e-4,
        capture_seconds=6e-4,
        captures=3,
    )
    learning.learn_host_costs(p, measured)
    assert measured.capture_host_seconds == pytest.approx(2e-4)
    assert measured.pack_host_seconds == pytest.approx(1e-5)
    assert measured.unpack_host_seconds == pytest.approx(5e-6)
    assert measured.offload_host_seconds == pytest.approx(5e-5)
    assert measured.reload_host_seconds == pytest.approx(5e-5)
    # a pass that did not measure a cost (no field, no group) leaves the estimate
    learning.learn_host_costs(_measured_pass(100, groups_offloaded=0), measured)
    assert measured.pack_host_seconds == pytest.approx(1e-5)
    assert measured.offload_host_seconds == pytest.approx(5e-5)
    # one outlying pass reads as at most OUTLIER_RATIO x the estimate plus 20 us
    learning.learn_host_costs(_measured_pass(100, pack_seconds=1.0), measured)
    assert measured.pack_host_seconds == pytest.approx(OUTLIER_RATIO * 1e-5 + 20e-6)


def test_host_costs_are_per_hooked_save() -> None:
    """NOTE [Native keep]: a native call's saves run no hook. The per-save costs are the
    mean of the calls timed, and the backward's hook time is the hooked saves', however
    few of the pass's saves ran the hooks."""
    from scheduler import Profile

    measured = Profile(signature="sig", unpack_host_seconds=2e-6)
    p = _measured_pass(201, pack_seconds=3e-6, pack_timed=1, unpack_seconds=0.0, unpack_timed=0)
    p.stats.hooked_saves = 1  # the root's save; 200 saved natively
    learning.learn_host_costs(p, measured)
    assert measured.pack_host_seconds == pytest.approx(3e-6)
    assert measured.unpack_host_seconds == pytest.approx(2e-6)  # none timed: the estimate stands
    assert learning._backward_host_extra(p, measured) == pytest.approx(2e-6)


def test_a_native_call_is_learnt_without_the_hooks_and_predicted_without_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls that a plan keeps whole save natively: their spans hold no hook time, so
    none comes off them when learnt, and the profile the runtime builds says so
    (``Profile.native_keep``), so the model charges their saves no hook time either;
    gradients stay bitwise."""
    m = _model()
    ref = train(twin(m), _batch, steps=2 + 12)
    rt = _runtime(m, drift=100.0, budget="100%")
    taken: list[tuple[bool, float]] = []
    original = learning._forward_host_extra
    natives: set[tuple[str, int]] = set()
    learn_forward = learning.learn_forward

    def spy_forward(p: PassState, measured: Any, **kw: Any) -> list[str]:
        natives.clear()
        natives.update(c.key for c in p.calls if c.native)
        return learn_forward(p, measured, **kw)

    def spy_extra(measured: Any, r: Any, offloads: bool) -> float:
        taken.append((r.key in natives, original(measured, r, offloads)))
        return taken[-1][1]

    monkeypatch.setattr(learning, "learn_forward", spy_forward)
    monkeypatch.setattr(learning, "_forward_host_extra", spy_extra)
    got = train(m, _batch, rt, steps=2 + 12)
    assert_bitwise(ref, got)
    entry = rt.planner.last_entry
    assert entry is not None and entry.profile is not None and entry.plan is not None
    assert entry.profile.native_keep
    assert all(pl is Placement.KEEP for pl in entry.plan.placements.values())
    passes = rt.report().steps
    assert [s.phase for s in passes].count("planned") == 12
    assert taken and not any(native for native, _ in taken)  # hooked calls only (audits)
    # the plan keeps every region whole: only the root's saves pay the pack hook
    from scheduler import predict

    profile = entry.profile.copy()
    profile.pack_host_seconds, profile.unpack_host_seconds = 1e-3, 0.0
    bare = profile.copy()
    bare.pack_host_seconds = 0.0
    root_saves = sum(s.saves for s in profile.root)
    region_saves = sum(s.saves for r in profile.regions for s in r.storages)
    assert region_saves > 0
    got_extra = predict(profile, entry.plan).forward_seconds - predict(bare, entry.plan).forward_seconds
    assert got_extra == pytest.approx(root_saves * 1e-3, abs=1e-9)
    profile.native_keep = bare.native_keep = False  # with the hooks on, every save pays
    got_extra = predict(profile, entry.plan).forward_seconds - predict(bare, entry.plan).forward_seconds
    assert got_extra == pytest.approx((root_saves + region_saves) * 1e-3, rel=1e-6)


def test_a_replay_checkpoint_is_learnt_apart_from_the_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A region call's entry keeps what a replay needs (a checkpoint) unless the plan
    keeps the call whole. The calibration pass checkpoints every call: the checkpoints'
    time is learnt per call (``Profile.capture_host_seconds``), not as time between the
    regions or in them, so a plan keeping every call whole is predicted without it."""
    from offrecomp.calls import RegionCalls
    from scheduler import predict

    slow = 0.2  # well above what a loaded machine makes of a tiny block
    original = RegionCalls._capture

    def slow_capture(self: RegionCalls, *args: Any) -> None:
        time.sleep(slow)
        original(self, *args)

    monkeypatch.setattr(RegionCalls, "_capture", slow_capture)
    m, batch = make("gpt_dropout")
    ref = train(twin(m), batch, steps=4)
    rt = _runtime(m, drift=100.0, budget="100%")
    got = train(m, batch, rt, steps=4)
    assert_bitwise(ref, got)
    steps = rt.report().steps
    assert [s.phase for s in steps] == ["measure", "calibrate", "planned", "planned"]
    entry = rt.planner.last_entry
    assert entry is not None and entry.profile is not None and entry.plan is not None
    profile = entry.profile
    assert slow <= profile.capture_host_seconds < 3 * slow
    assert max(learning._gaps(profile)[1:-1]) < slow / 2  # between the blocks
    assert max(r.forward_seconds for r in profile.regions) < slow / 2
    # kept whole, no call checkpoints: the prediction holds none of them
    assert all(pl is Placement.KEEP for pl in entry.plan.placements.values())
    bare = profile.copy()
    bare.capture_host_seconds = 0.0
    assert predict(profile, entry.plan).step_seconds == predict(bare, entry.plan).step_seconds


def test_a_plan_solved_again_for_drift_learns_every_pass() -> None:
    """NOTE [Learning cadence]: after a re-plan for drift, until a window fits or
    re-planning backs off, every planned pass is learnt."""
    from offrecomp.planning.drift import DRIFT_REPLANS, DRIFT_WINDOW, check_drift
    from offrecomp.planning.entries import PlanEntry
    from offrecomp.report import StepRecord

    entry = PlanEntry(signature="sig")
    entry.learnt_since_solve = learning.FIRST_LEARNT
    entry.learn_every = learning.MAX_LEARN_EVERY

    def learnt() -> int:
        return [learning.Learner._skip(entry) for _ in range(learning.MAX_LEARN_EVERY)].count(False)

    def window(ratio: float) -> None:
        for _ in range(DRIFT_WINDOW << entry.drift_backoff):
            check_drift(entry, StepRecord(step=0, step_seconds=ratio, predicted_step_seconds=1.0), 0.25)

    assert learnt() == 1
    for _ in range(DRIFT_REPLANS):
        window(2.0)  # drifted: solved again
        assert learnt() == learning.MAX_LEARN_EVERY
    window(1.0)  # fits: the cadence again
    assert learnt() == 1
    window(2.0)  # one drifting window too many: backed off, the cadence again
    assert entry.drift_backoff == 1 and learnt() == 1


def test_learnt_host_costs_reach_the_estimate_and_the_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's fields (read with defaults: they may be absent) go through the cost
    model into the profile that plans are solved and predicted with."""
    per_save = 40e-6
    learn = learning.learn_host_costs

    def with_fields(p: PassState, measured: Any) -> None:
        p.stats.pack_seconds = per_save * p.stats.saved_tensors
        p.stats.pack_timed = p.stats.saved_tensors
        learn(p, measured)

    monkeypatch.setattr(learning, "learn_host_costs", with_fields)
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = _runtime(m, budget="50%", drift=100.0, native_keep=False)  # every save hooked
    train(m, batch, rt, steps=4)
    entry = rt.planner.last_entry
    assert entry is not None and entry.profile is not None and entry.plan is not None
    assert entry.profile.pack_host_seconds == pytest.approx(per_save)
    # the model adds the hooks back: the predicted forward holds them
    saves = sum(s.saves for r in entry.profile.regions for s in r.storages)
    saves += sum(s.saves for s in entry.profile.root)
    bare = entry.profile.copy()
    bare.pack_host_seconds = 0.0
    from scheduler import predict

    with_hooks = predict(entry.profile, entry.plan).forward_seconds
    without = predict(bare, entry.plan).forward_seconds
    assert with_hooks - without == pytest.approx(saves * per_save, rel=1e-6)


def test_a_region_that_offloads_is_learnt_like_the_others() -> None:
    """NOTE [Forward timeline]: the grouped engine copies a region's group after its
    forward, so its span is compute (and the hooks): it is learnt, not skipped."""
    m = _model()
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget="50%")
    train(m, _batch, rt, steps=2)  # measure, calibrate
    entry = rt.planner.last_entry
    assert entry is not None and entry.cost is not None
    est = entry.cost._estimate
    assert est is not None
    block0 = next(r for r in est.regions if r.name == "stack.blocks.0")
    block0.forward_seconds = 10.0  # an estimate no pass measured
    offload = {
        (block0.name, block0.call_index, i): Placement.OFFLOAD
        for i, s in enumerate(block0.storages)
        if s.kind == "activation"
    }
    assert offload
    rt.set_plan(Plan(placements=offload))
    train(m, _batch, rt, steps=6)
    assert all(s.offloaded_bytes > 0 for s in rt.report().steps[2:])
    learnt = next(r for r in entry.cost._estimate.regions if r.name == "stack.blocks.0")  # type: ignore[union-attr]
    # each pass reads at least 1/OUTLIER_RATIO of the estimate: four passes leave
    # (0.7 + 0.3 / 4) ** 4 of the wrong value at most (skipped, it would stay at 10 s);
    # six run, as a pass a collection paused is not learnt from (NOTE [Host pauses])
    assert learnt.forward_seconds <= 10.0 * (0.7 + 0.3 / OUTLIER_RATIO) ** 4 + 1e-9


def test_the_backward_callback_leaves_the_planning_to_the_next_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Bookkeeping off the critical path]: the measuring pass's profile is built,
    and each record learnt from, when the next pass begins (or the context exits), never
    inside autograd's backward-done callback; a signature still plans from its third pass."""
    where: list[str] = []
    plan_from, resolve_now = Planner._plan_from, Planner._resolve

    def spy_plan_from(self: Planner, *a: Any) -> None:
        where.append("callback" if current_graph_task_id() != -1 else "plan_from")
        plan_from(self, *a)

    def spy_resolve(self: Planner, **kw: Any) -> None:
        if self._pending:
            where.append("callback" if current_graph_task_id() != -1 else "learn")
        resolve_now(self, **kw)

    monkeypatch.setattr(Planner, "_plan_from", spy_plan_from)
    monkeypatch.setattr(Planner, "_resolve", spy_resolve)
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = _runtime(m, budget="50%")
    with rt:
        loss = m(batch(0))
        loss.backward()  # the measuring pass ends in this backward's callback
        assert rt.planner.entries == {} or all(e.profile is None for e in rt.planner.entries.values())
        assert rt.planner.pending_ids()  # its record is not read yet
    assert "callback" not in where and "plan_from" in where
    train(m, batch, rt, steps=3)
    phases = [s.phase for s in rt.report().steps]
    assert phases == ["measure", "calibrate", "planned", "planned"]
    assert "callback" not in where


@pytest.mark.parametrize(("share", "every"), [(1e-12, learning.MAX_LEARN_EVERY), (1e12, 1)])
def test_a_settled_plan_learns_from_one_pass_in_learn_every(
    monkeypatch: pytest.MonkeyPatch, share: float, every: int
) -> None:
    """NOTE [Learning cadence]: a plan's first FIRST_LEARNT passes are learnt, then one
    planned pass in ``learn_every``, sized so that learning keeps to LEARN_SHARE of the
    step (a share no learning meets: one in MAX_LEARN_EVERY; one every pass meets:
    every pass); gradients stay bitwise."""
    monkeypatch.setattr(learning, "LEARN_SHARE", share)
    m = _model()
    ref = train(twin(m), _batch, steps=2 + 40)
    rt = _runtime(m, drift=100.0)  # no re-plan (a new plan restarts the cadence)
    learnt: list[int] = []
    original = learning.Learner._learn

    def spy(
        self: learning.Learner, entry: Any, p: PassState, calibrating: bool, step: float | None
    ) -> str | None:
        learnt.append(p.index)
        return original(self, entry, p, calibrating, step)

    monkeypatch.setattr(learning.Learner, "_learn", spy)
    got = train(m, _batch, rt, steps=2 + 40)  # measure, calibrate, 40 planned
    assert [s.phase for s in rt.report().steps].count("planned") == 40
    planned = [i for i in learnt if i >= 2]  # pass 1 is the calibration
    first = learning.FIRST_LEARNT
    assert planned[:first] == [2, 3]
    gaps = {b - a for a, b in zip(planned[first - 1 :], planned[first:])}
    assert gaps == {every}, planned
    assert_bitwise(ref, got)


class _Clock:
    """Marks are seconds; a span is their difference, never distorted."""

    def seconds(self, a: float, b: float) -> float:
        return b - a

    def distorted(self, a: Any, b: Any, secs: float | None = None) -> bool:
        return False


def test_served_replays_faster_than_their_ops_bring_those_ops_down() -> None:
    """NOTE [Served replay times]: the ops a served replay ran (RUN) take its time over
    their predicted seconds, at least half of them per pass; served and stubbed ops and
    the replays that ran at or over their ops' seconds leave every op as it was."""
    from offrecomp.trace import PLACEHOLDER, RUN, SERVE
    from scheduler import OpRecord, Profile, RegionRecord

    def record(name: str) -> RegionRecord:
        ops = [OpRecord(seconds=s, skippable=True) for s in (1.0, 4.0, 2.0, 3.0)]
        return RegionRecord(name=name, call_index=0, start_seconds=0.0, forward_seconds=10.0, backward_seconds=20.0, ops=ops)

    measured = Profile(signature="sig", regions=[record("a"), record("b"), record("c")])
    p = PassState(index=0, signature="sig", mode="auto")
    p.calls = [SimpleNamespace(ordinal=i, key=(n, 0)) for i, n in enumerate("abc")]  # type: ignore[misc]
    p.dispatch_replays = [
        (0, 0.0, 4.5, 6.0, [RUN, SERVE, RUN, RUN]),  # ran 1 + 2 + 3 = 6 s in 4.5: x0.75
        (1, 0.0, 1.0, 4.0, [RUN, PLACEHOLDER, RUN, SERVE]),  # 3 s in 1: the floor, x0.5
        (2, 0.0, 9.0, 6.0, [RUN, SERVE, RUN, RUN]),  # over: the mode's cost, not the ops'
    ]
    learning.learn_served_replays(p, measured, _Clock())  # type: ignore[arg-type]
    a, b, c = ([op.seconds for op in r.ops] for r in measured.regions)
    assert a == [0.75, 4.0, 1.5, 2.25]
    assert b == [0.5, 4.0, 1.0, 3.0]
    assert c == [1.0, 4.0, 2.0, 3.0]


def test_a_plain_replays_host_time_beyond_its_ops_is_learnt_per_replay() -> None:
    """NOTE [Replay host time]: the median over a pass's plain replays of the host span
    less the ops' seconds up to the replay's stop (0 where the host ran ahead of them)."""
    from offrecomp.measure import Mark
    from scheduler import OpRecord, Profile, RegionRecord

    def record(name: str) -> RegionRecord:
        ops = [OpRecord(seconds=s, skippable=True) for s in (1.0, 2.0, 3.0)]
        return RegionRecord(name=name, call_index=0, start_seconds=0.0, forward_seconds=6.0, backward_seconds=9.0, ops=ops)

    measured = Profile(signature="sig", regions=[record("a"), record("b"), record("c")])
    p = PassState(index=0, signature="sig", mode="auto")
    p.calls = [SimpleNamespace(ordinal=i, key=(n, 0)) for i, n in enumerate("abc")]  # type: ignore[misc]
    p.plain_replays = [
        (0, Mark(host=0.0), Mark(host=4.5), 2),  # ops 0-1: 3 s; host 4.5: 1.5 beyond
        (1, Mark(host=0.0), Mark(host=8.0), 3),  # 6 s; 2 beyond
        (2, Mark(host=0.0), Mark(host=1.0), 3),  # the host ran ahead: 0
    ]
    learning.learn_replay_host(p, measured, _Clock())  # type: ignore[arg-type]
    assert measured.replay_host_seconds == 1.5
    p.plain_replays = p.plain_replays[2:]
    learning.learn_replay_host(p, measured, _Clock())  # type: ignore[arg-type]
    assert 0 < measured.replay_host_seconds < 1e-9  # learnt as 0, not left unmeasured


class _DeviceClock:
    """A GPU's clock in a test: a mark's ``event`` is its device time; ``host`` its
    host time."""

    @staticmethod
    def seconds(a: Any, b: Any, wait: bool = False) -> float:
        return float(b.event - a.event)

    @staticmethod
    def pause(a: Any, b: Any) -> float:
        return 0.0


def test_backward_host_time_is_learnt_on_a_gpu() -> None:
    """NOTE [Backward host time]: on a GPU the backward's device time is the events', the
    runtime's host time left on it; each region's host time is its share of the host's
    span, less the replays' host spans and the hooks' and reloads' host time. On a CPU
    the runtime's host time comes off the backward, and no host time is set."""
    from offrecomp.measure import Mark
    from scheduler import Profile, RegionRecord

    def measured() -> Profile:
        return Profile(
            signature="sig", forward_seconds=1.0, backward_seconds=4.0, unpack_host_seconds=0.01,
            reload_host_seconds=0.1,
            regions=[
                RegionRecord(name=n, call_index=0, start_seconds=0.5 * i, forward_seconds=0.5, backward_seconds=2.0)
                for i, n in enumerate("ab")
            ],
        )

    p = _measured_pass(10, groups_reloaded=2, stall_seconds=0.0)  # 0.1 s of hooks, 0.2 s of reloads
    p.start_mark = Mark(0.0, 0.0)
    p.backward_start_mark = Mark(1.0, 1.0)
    p.replay_marks = [(0, Mark(1.5, 2.0), Mark(2.0, 2.5))]  # 0.5 s each on host and device
    p.backward_ends.append(Mark(3.0, 5.5))  # host 2 s, device 4.5 s
    on_gpu = measured()
    assert learning.learn_backward(p, on_gpu, clock=_DeviceClock(), calibrating=True, on_device=True)
    assert on_gpu.backward_seconds == pytest.approx(4.0)  # 4.5 less the replay
    # host: 2 - 0.5 (replay) - 0.1 (unpacks) - 0.2 (reloads) = 1.2 s, over 4 s of device
    assert [r.backward_host_seconds for r in on_gpu.regions] == pytest.approx([0.6, 0.6])
    on_cpu = measured()
    assert learning.learn_backward(p, on_cpu, clock=_DeviceClock(), calibrating=True)
    assert on_cpu.backward_seconds == pytest.approx(3.7)  # less the runtime's 0.3 s too
    assert [r.backward_host_seconds for r in on_cpu.regions] == [None, None]


def test_a_prefetch_window_is_planned_as_the_groups_it_holds() -> None:
    """NOTE [Prefetch windows]: a byte window models as many groups of the profile's
    median call as it holds, at least one; a number of regions as it is."""
    from offrecomp.config import Prefetch
    from offrecomp.planning.profiling import prefetch_depth
    from scheduler import Profile, RegionRecord, StorageRecord

    def call(name: str, *sizes: int) -> RegionRecord:
        return RegionRecord(
            name=name, call_index=0, start_seconds=0.0, forward_seconds=1.0, backward_seconds=1.0,
            storages=[StorageRecord(nbytes=n) for n in sizes],
        )

    profile = Profile(signature="s", regions=[call("b0", 60, 40), call("b1", 100), call("b2", 300)])
    assert prefetch_depth(Prefetch(regions=3), profile) == 3
    assert prefetch_depth(Prefetch(nbytes=350), profile) == 3  # groups of 100 B (the median call)
    assert prefetch_depth(Prefetch(nbytes=50), profile) == 1  # one reload is always allowed
    assert prefetch_depth(Prefetch(nbytes=50), Profile(signature="s")) == 1


def test_partial_replays_teach_their_host_time_on_cpu() -> None:
    """NOTE [Replay host time]: a plan that drops part of each block replays a prefix,
    whose fixed costs (the checkpoint's restore, the early stop) the calibration's whole
    replays spread over all the ops; on a CPU too, planned passes learn what a replay
    costs beyond its ops' seconds (a step ran 1.24x its prediction without it, and the
    drift check solved the same plan again and again)."""
    import torch

    from tests import models

    torch.manual_seed(0)
    m = models.GPT(layers=2, h=32, heads=4, p=0.0)
    rt = offrecomp.runtime(m, mode="auto", budget=150_000, min_bytes=0)
    train(m, lambda s: torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s)), rt, steps=12)
    planned = [s for s in rt.report().steps if s.phase == "planned"]
    assert planned and all(s.recomputed_bytes > 0 for s in planned), [s.recomputed_bytes for s in planned]
    entry = next(iter(rt.planner.entries.values()))
    assert entry.profile is not None and entry.profile.replay_host_seconds > 1e-9, entry.profile.replay_host_seconds
