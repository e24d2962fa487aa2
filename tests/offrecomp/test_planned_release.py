"""A plan's offload groups are let go of at the unit ends the simulator freed them at
(NOTE [Planned release] in offrecomp/groups.py), on the emulated offload backend."""

from __future__ import annotations

import pytest

import offrecomp
from offrecomp.backends import EmulatedBackend
from offrecomp.offload import OffloadEngine
from offrecomp.planning import learning, solving
from offrecomp.planning.planner import pass_releases
from offrecomp.transfer import BACKWARD_START
from scheduler import Placement, Plan
from tests.helpers import assert_bitwise, make, tight_budget, train, twin


def test_planned_passes_let_go_of_every_group_by_backward_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offloading plans on CPU (a 5 GB/s link configured, the emulated backend moving
    the bytes): each planned pass calls release_due at its unit ends in order, ending
    with backward's start, after which the engine holds no copy source; gradients stay
    bitwise equal to plain."""
    monkeypatch.setattr(solving, "offload_allowed", lambda entry, profile: True)
    # the emulated backend's host costs (threads, not a link) would price offloading out
    monkeypatch.setattr(learning, "learn_host_costs", lambda p, measured: None)
    calls: list[tuple[int, int]] = []  # (boundary, stash bytes after)
    original = OffloadEngine.release_due

    def spy(self: OffloadEngine, boundary: int) -> None:
        original(self, boundary)
        calls.append((boundary, self.stash_bytes))

    monkeypatch.setattr(OffloadEngine, "release_due", spy)
    # slow copies: the last ones are still in flight when backward starts
    init = EmulatedBackend.__init__
    monkeypatch.setattr(EmulatedBackend, "__init__", lambda self: init(self, copy_delay_s=0.01))
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=5)
    m = twin(model)
    rt = offrecomp.runtime(
        m, mode="auto", min_bytes=0, budget=tight_budget(model, batch), d2h_gbps=5, h2d_gbps=5, drift=100.0
    )
    assert_bitwise(ref, train(m, batch, rt, steps=5))
    planned = [s for s in rt.report().steps if s.phase == "planned"]
    assert planned and all(s.offloaded_bytes > 0 for s in planned), [s.offloaded_bytes for s in planned]
    ends = [i for i, (b, _) in enumerate(calls) if b == BACKWARD_START]
    assert len(ends) == len(planned)
    start = 0
    for end in ends:
        boundaries = [b for b, _ in calls[start:end]]
        assert boundaries == sorted(boundaries) and len(boundaries) > 1  # every unit end, in order
        assert calls[end][1] == 0  # nothing left in flight holding device memory
        start = end + 1


def test_slow_copies_leave_planned_steps_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies slower than the link the plan assumed (20 ms each on the emulated backend):
    the groups still go where the plan freed them, compute waiting on their copies, so
    the booked peak of every offloading step is the predicted one, within the budget.
    Letting go only of landed copies held 290,816 bytes for a 262,658-byte budget here
    (predicted 253,828)."""
    monkeypatch.setattr(solving, "offload_allowed", lambda entry, profile: True)
    monkeypatch.setattr(learning, "learn_host_costs", lambda p, measured: None)
    init = EmulatedBackend.__init__
    monkeypatch.setattr(EmulatedBackend, "__init__", lambda self: init(self, copy_delay_s=0.02))
    model, batch = make("gpt_dropout")
    budget = tight_budget(model, batch)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget=budget, d2h_gbps=5, h2d_gbps=5, drift=100.0)
    train(m, batch, rt, steps=4)
    steps = [s for s in rt.report().steps if s.phase == "planned" and s.offloaded_bytes > 0]
    assert steps
    for s in steps:
        assert s.predicted_peak_bytes is not None
        assert s.peak_activation_bytes <= min(budget, int(s.predicted_peak_bytes * 1.01)), (
            s.peak_activation_bytes, s.predicted_peak_bytes, budget,
        )


def test_a_pass_reads_the_last_unit_as_backward_start() -> None:
    assert pass_releases(Plan().releases) == ()
    assert pass_releases(Plan(releases=(0, 3, 2, 3, 4)).releases) == (0, 3, 2, 3, BACKWARD_START)


def test_a_users_plan_that_offloads_gets_its_releases_from_the_timeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rt.set_plan`` with offloads (a 5 GB/s link configured): its passes let go of
    their groups at the unit ends the simulator frees them at, as a solved plan's do."""
    calls: list[int] = []
    original = OffloadEngine.release_due

    def spy(self: OffloadEngine, boundary: int) -> None:
        calls.append(boundary)
        original(self, boundary)

    monkeypatch.setattr(OffloadEngine, "release_due", spy)
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=4)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, d2h_gbps=5, h2d_gbps=5)
    rt.set_plan(Plan(default=Placement.OFFLOAD))
    assert_bitwise(ref, train(m, batch, rt, steps=4))
    steps = [s for s in rt.report().steps if s.phase == "user-plan"]
    assert steps and all(s.offloaded_bytes > 0 for s in steps)
    assert calls.count(BACKWARD_START) == len(steps)


def test_plans_offload_no_more_than_the_host_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Host limit in plans]: the solver sees the pool's limit, so a plan offloads no
    more than it, and the pool refuses no group of a planned step (a refused group's
    storages fall back, with a warning, to what the plan did not choose)."""
    monkeypatch.setattr(solving, "offload_allowed", lambda entry, profile: True)
    monkeypatch.setattr(learning, "learn_host_costs", lambda p, measured: None)
    model, batch = make("gpt_dropout")
    budget = tight_budget(model, batch)

    def planned(**kw: object) -> tuple[offrecomp.Runtime, list[int]]:
        m = twin(model)
        rt = offrecomp.runtime(  # type: ignore[arg-type]
            m, mode="auto", min_bytes=0, budget=budget, d2h_gbps=5, h2d_gbps=5, drift=100.0, **kw
        )
        train(m, batch, rt, steps=4)
        steps = [s for s in rt.report().steps if s.phase == "planned"]
        assert steps and not any(s.fallbacks for s in steps), [s.fallbacks for s in steps]
        return rt, [s.offloaded_bytes for s in steps]

    rt, free = planned()
    assert min(free) > 0, free
    # the default limit (a share of what is available) is read once: pool and plan agree
    entry = next(iter(rt.planner.entries.values()))
    assert entry.profile is not None and rt.offload_engine is not None
    assert entry.profile.host_limit_bytes == rt.offload_engine.pool.limit_bytes > 0
    limit = min(free) // 2
    rt, held = planned(host_limit=limit)
    assert all(b <= limit for b in held), (held, limit)
    entry = next(iter(rt.planner.entries.values()))
    assert entry.profile is not None and entry.profile.host_limit_bytes == limit
