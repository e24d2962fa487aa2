"""Long runs and resource faults: no growth, bounded caches, safer plans after OOM."""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

import offrecomp
from tests import models
from tests.helpers import assert_bitwise, make, tight_budget, train, twin


def _live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


@pytest.mark.slow
def test_200_step_soak_with_varying_sequence_lengths() -> None:
    torch.manual_seed(0)
    model = models.GPT(layers=2, h=32, heads=4, p=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    lengths = [8, 12, 16, 20, 24, 28]
    rt = offrecomp.runtime(model, mode="auto", budget="40%", min_bytes=0, plan_cache_size=3)
    proc = psutil.Process()
    marks = {}
    with rt:
        for step in range(200):
            seq = lengths[step % len(lengths)] if step < 100 else lengths[(step // 7) % 2]
            idx = torch.randint(0, 64, (2, seq), generator=torch.Generator().manual_seed(step))
            model(idx).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            assert len(rt.planner.entries) <= 3
            if step in (40, 199):
                marks[step] = (proc.memory_info().rss, _live_tensors())
    (rss0, live0), (rss1, live1) = marks[40], marks[199]
    assert live1 <= live0 + 5, (live0, live1)
    assert rss1 - rss0 < 64 << 20, (rss0, rss1)
    steps = rt.report().steps
    assert len(steps) == 200
    phases = [s.phase for s in steps]
    assert set(phases) == {"measure", "calibrate", "planned", "borrowed", "recompute"}
    # NOTE [Borrowed plans]: six lengths through a cache of three. A length measures at
    # most once: when it is the longest so far (a plain full recompute instead when it
    # is within a quarter of a profiled one, the first time), or when seen again with no
    # cached length covering it; the shorter ones run the plan of the shortest cached
    # length covering them, so the cache does not thrash (most steps measuring, a full
    # recompute under the op recorder).
    assert phases.count("measure") <= 6, phases
    assert phases.count("borrowed") > 100, phases
    assert rt.offload_engine is None


@pytest.mark.slow
def test_offload_soak_pool_does_not_grow() -> None:
    model, batch = make("gpt_dropout")
    rt = offrecomp.runtime(model, mode="offload", min_bytes=0)
    reserved = []
    live = {}
    with rt:
        for step in range(100):
            torch.manual_seed(step)
            model(batch(step % 3)).backward()
            model.zero_grad(set_to_none=True)
            reserved.append(rt.report().steps[-1].pool_reserved_bytes)
            if step in (10, 99):
                live[step] = (_live_tensors(), rt.offload_engine.live_groups)
    assert max(reserved[10:]) == reserved[10] > 0
    assert live[99][0] <= live[10][0] + 5, live
    assert live[99][1] == live[10][1] == 0, live  # every offload group freed after its backward


def _arm_oom(block: torch.nn.Module) -> dict[str, bool]:
    """``block``'s forward raises a (simulated) device OOM once each time the returned
    state's "arm" is set."""
    orig = block.forward
    state = {"arm": False}

    def forward(x: torch.Tensor) -> torch.Tensor:
        if state["arm"]:
            state["arm"] = False
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return orig(x)

    block.forward = forward
    return state


def test_oom_in_a_planned_step_gives_a_safer_plan(caplog: pytest.LogCaptureFixture) -> None:
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", budget="80%", min_bytes=0)
    state = _arm_oom(m.blocks[1])
    with rt:
        for _ in range(3):  # measure, calibrate, plan
            m(batch(0)).backward()
        before = rt.planner.last_entry.plan
        state["arm"] = True
        with caplog.at_level(logging.WARNING, logger="offrecomp"), pytest.raises(torch.OutOfMemoryError):
            m(batch(0)).backward()
        m.zero_grad(set_to_none=True)
        m(batch(0)).backward()  # the next step: solved again for a smaller budget
        after = rt.planner.last_entry.plan
    assert "out of memory" in caplog.text
    assert after.budget_bytes is not None and before.budget_bytes is not None
    assert after.budget_bytes < before.budget_bytes
    assert (after.predicted_peak_bytes or 0) <= (before.predicted_peak_bytes or 0)


def test_an_oom_under_the_frugal_plan_leaves_the_budget(caplog: pytest.LogCaptureFixture) -> None:
    """A planned pass that runs the most frugal plan (the budget is below what the solver
    can meet) and runs out of memory: no smaller budget drops more, so the budget stays
    and the warning says so."""
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", budget="1KiB", min_bytes=0)
    state = _arm_oom(m.blocks[1])
    with rt, caplog.at_level(logging.WARNING, logger="offrecomp"):
        for _ in range(3):  # measure, calibrate, plan
            m(batch(0)).backward()
        entry = rt.planner.last_entry
        assert entry.plan is not None and not entry.plan.feasible
        for _ in range(2):
            state["arm"] = True
            with pytest.raises(torch.OutOfMemoryError):
                m(batch(0)).backward()
            m.zero_grad(set_to_none=True)
        m(batch(0)).backward()
    assert entry.budget_scale == 1.0
    assert caplog.text.count("a smaller budget would not help") == 2


def test_an_oom_raised_outside_the_model_gives_a_safer_plan(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [Unseen out-of-memory errors]: the loss raises the OOM, outside every wrapper
    of the runtime, and the loop retries; the allocator's count tells the planner."""
    from offrecomp.measure import DeviceClock

    ooms = {"n": 3}  # raised before the runtime's first pass: not its own
    monkeypatch.setattr(DeviceClock, "oom_count", lambda self, stats=None: ooms["n"])
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", budget="80%", min_bytes=0)
    with rt:
        for _ in range(3):  # measure, calibrate, plan
            m(batch(0)).backward()
        before = rt.planner.last_entry.plan
        with caplog.at_level(logging.WARNING, logger="offrecomp"):
            try:
                out = m(batch(0))
                ooms["n"] += 1
                raise torch.OutOfMemoryError("CUDA out of memory (simulated, in the loss)")
            except torch.OutOfMemoryError:
                del out  # the loop drops the graph and retries
            m.zero_grad(set_to_none=True)
            for _ in range(2):
                m(batch(0)).backward()
        after = rt.planner.last_entry.plan
    assert "out of memory" in caplog.text
    assert before.budget_bytes is not None and after.budget_bytes is not None
    assert after.budget_bytes < before.budget_bytes
    assert caplog.text.count("device out of memory") == 1


def test_an_oom_a_replay_raised_is_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Unseen out-of-memory errors]: a replay's OOM, told to the planner where it
    is caught, is not counted again by the next pass's end (one shrink, to 70%)."""
    from offrecomp import regenerate
    from offrecomp.measure import DeviceClock

    ooms = {"n": 0, "arm": False}
    monkeypatch.setattr(DeviceClock, "oom_count", lambda self, stats=None: ooms["n"])
    original = regenerate.replay_call

    def replay(*args: Any, **kwargs: Any) -> Any:
        if ooms["arm"]:
            ooms["arm"] = False
            ooms["n"] += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated, in a replay)")
        return original(*args, **kwargs)

    monkeypatch.setattr(regenerate, "replay_call", replay)
    model, batch = make("gpt_dropout")
    budget = tight_budget(model, batch)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0)
    with rt:
        for _ in range(3):  # measure, calibrate, plan
            m(batch(0)).backward()
        loss = m(batch(0))
        loss.backward(retain_graph=True)
        ooms["arm"] = True
        with pytest.raises(torch.OutOfMemoryError):
            loss.backward()
        assert not ooms["arm"], "no replay ran in the second backward"
        del loss
        m.zero_grad(set_to_none=True)
        for _ in range(2):
            m(batch(0)).backward()
    assert sorted(round(e.budget_scale, 3) for e in rt.planner.entries.values()) == [0.7]


def test_host_memory_pressure_stops_offloading(monkeypatch: pytest.MonkeyPatch) -> None:
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=2)

    class Tight:
        total = 64 << 30
        available = 1 << 30  # under the pool's pressure floor

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tight())
    m = twin(model)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, host_limit="1GiB")
    got = train(m, batch, rt, steps=2)
    assert_bitwise(ref, got)
    steps = rt.report().steps
    assert all(s.offloaded_bytes == 0 for s in steps)
    assert sum(steps[0].fallbacks.values()) > 0


def test_pinned_allocation_failure_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from offrecomp import backends

    def fail(self: object, nbytes: int) -> torch.Tensor:
        raise RuntimeError("cudaHostAlloc failed (simulated)")

    monkeypatch.setattr(backends.EmulatedBackend, "alloc_host", fail)
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=2)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    got = train(m, batch, rt, steps=2)
    assert_bitwise(ref, got)
    assert rt.report().steps[0].offloaded_bytes == 0
    assert sum(rt.report().steps[0].fallbacks.values()) > 0


def test_the_report_holds_the_most_recent_steps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A long run keeps a bounded number of step records in memory (each about 2 KB: a
    million steps held gigabytes); the report file still gets every step."""
    import importlib
    import json

    rtmod = importlib.import_module("offrecomp.lifecycle")
    monkeypatch.setattr(rtmod, "REPORT_MAX_STEPS", 5)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "steps.jsonl"
    with offrecomp.runtime(model, mode="keep", report_path=str(path)) as rt:
        for _ in range(7):  # micro-batches before the first optimizer step: more
            model(torch.randn(3, 4)).sum().backward()  # provisional records than it holds
        for _ in range(12):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    steps = rt.report().steps
    assert [s.step for s in steps] == list(range(7, 12))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [d["step"] for d in lines] == list(range(12))
    assert lines[0]["passes"] == 8  # the seven micro-batches merged into the first step


def test_a_first_step_of_forty_micro_batches_is_one_record() -> None:
    """NOTE [Passes and steps]: passes before the first optimizer step are provisional,
    merged at it: 40 micro-batches (16 with steps a gradient scaler skipped) are one first
    step, not one record each. A loop with no optimizer still gets a record per pass."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with offrecomp.runtime(model, mode="recompute") as rt:
        for _ in range(2):
            for _ in range(40):
                model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    assert [s.passes for s in rt.report().steps] == [40, 40]
    with offrecomp.runtime(model, mode="recompute") as rt:
        for _ in range(70):
            model(torch.randn(3, 4)).sum().backward()
    assert [s.passes for s in rt.report().steps] == [1] * 70
