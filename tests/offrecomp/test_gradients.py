"""Invariant 1: gradients (and buffers) under every mode equal the plain run's, bitwise."""

from __future__ import annotations

import contextlib

import pytest
import torch

import offrecomp
from tests.helpers import CASES, assert_bitwise, make, train, twin

MODES = ["keep", "recompute", "offload", "auto"]


def _runtime(model: torch.nn.Module, mode: str, **kw: object) -> offrecomp.Runtime:
    return offrecomp.runtime(model, mode=mode, min_bytes=0, **kw)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", MODES)
def test_bitwise_equal_to_plain(case: str, mode: str) -> None:
    model, batch = make(case)
    ref = train(twin(model), batch)
    m = twin(model)
    rt = _runtime(m, mode)
    got = train(m, batch, rt)
    assert_bitwise(ref, got)
    steps = rt.report().steps
    assert len(steps) == 3
    if mode == "recompute":
        assert all(s.recomputed_bytes > 0 and s.replays > 0 for s in steps)
    if mode == "offload":
        assert all(s.offloaded_bytes > 0 for s in steps)
        assert all(s.backend == "emulated" for s in steps)


@pytest.mark.parametrize("case", ["gpt_dropout", "cnn_batchnorm"])
def test_auto_with_tight_budget_is_bitwise_equal(case: str) -> None:
    model, batch = make(case)
    ref = train(twin(model), batch, steps=4)
    probe = twin(model)  # keep's peak sets the budget
    keep = _runtime(probe, "keep")
    train(probe, batch, keep, steps=1)
    budget = keep.report().steps[0].peak_activation_bytes * 3 // 4  # the CNN's most frugal plan holds 0.64
    m = twin(model)
    rt = _runtime(m, "auto", budget=budget)
    got = train(m, batch, rt, steps=4)
    assert_bitwise(ref, got)
    phases = [s.phase for s in rt.report().steps]
    assert phases[0] == "measure" and phases[-1] == "planned"
    planned = rt.report().steps[-1]
    assert planned.recomputed_bytes > 0  # the budget forced some dropping
    assert planned.peak_activation_bytes <= budget * 1.05
    # the planner's memory model, after recalibration with real times, matches the books
    assert planned.predicted_peak_bytes is not None
    assert abs(planned.predicted_peak_bytes - planned.peak_activation_bytes) <= 0.1 * budget


@pytest.mark.parametrize("mode", ["recompute", "offload"])
def test_gradient_accumulation(mode: str) -> None:
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, accumulate=3)
    m = twin(model)
    rt = _runtime(m, mode)
    got = train(m, batch, rt, accumulate=3)
    assert_bitwise(ref, got)
    steps = rt.report().steps
    assert [s.passes for s in steps] == [3, 3, 3]


@pytest.mark.parametrize("mode", ["recompute", "offload", "keep"])
def test_autograd_grad(mode: str) -> None:
    model, batch = make("kwargs_tuple")
    ref = train(twin(model), batch, autograd_grad=True)
    m = twin(model)
    got = train(m, batch, _runtime(m, mode), autograd_grad=True)
    assert_bitwise(ref, got)


def test_eval_and_no_grad_forward_inside_context() -> None:
    """An eval forward under no_grad, then a training step, inside the context: the eval
    output and the gradients equal a plain run's outside any runtime."""
    model, batch = make("gpt_dropout")

    def run(mm: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        mm.eval()
        with torch.no_grad():
            a = mm(batch(0))
        mm.train()
        torch.manual_seed(3)
        loss = mm(batch(1))
        loss.backward()
        return a, loss.detach()

    ref_model = twin(model)
    ref_eval, ref_loss = run(ref_model)  # plain, outside the runtime
    m = twin(model)
    rt = _runtime(m, "recompute")
    with rt:
        got_eval, got_loss = run(m)
    # eval/no_grad forwards save nothing and replay nothing
    assert torch.equal(ref_eval, got_eval)
    assert torch.equal(ref_loss, got_loss)
    grads = {n: p.grad for n, p in m.named_parameters()}
    for n, p in ref_model.named_parameters():
        assert p.grad is not None and grads[n] is not None, n
        assert torch.equal(p.grad, grads[n]), n
    assert rt.report().steps[-1].replays > 0


@pytest.mark.parametrize("mode", ["recompute", "offload", "keep"])
def test_bf16_autocast_cpu(mode: str) -> None:
    model, batch = make("gpt_dropout")

    def run(m: torch.nn.Module, ctx: object) -> list[dict[str, torch.Tensor]]:
        class Autocast(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = m

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return self.inner(x)

        return train(Autocast(), batch, ctx)

    ref = run(twin(model), None)
    m = twin(model)
    got = run(m, _runtime(m, mode))
    assert_bitwise(ref, got)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_replay_runs_in_the_forwards_autocast_state_not_the_backwards(where: str) -> None:
    """Autocast on around the forward only, or around the backward only: each replay runs
    as its forward did (a replay of a forward without autocast enters no context only
    where autocast is off when it runs too: ``regions.autocast_as_now``); gradients
    bitwise."""
    model, batch = make("gpt_dropout")

    def run(m: torch.nn.Module, rt: offrecomp.Runtime | None) -> list[dict[str, torch.Tensor]]:
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            for step in range(3):
                torch.manual_seed(step)
                m.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=where == "forward"):
                    loss = m(batch(step))
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=where == "backward"):
                    loss.backward()
                out.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
        return out

    ref = run(twin(model), None)
    m = twin(model)
    rt = _runtime(m, "recompute")
    assert_bitwise(ref, run(m, rt))
    assert rt.report().steps[-1].replays > 0


def test_mixed_placements_in_one_region() -> None:
    """Some storages kept, some offloaded, some dropped, in the same block."""
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=3)
    m = twin(model)
    rt = _runtime(m, "auto")
    plan_default = offrecomp.Placement.KEEP
    placements = {}
    for b in range(3):
        for i in range(1, 40):
            placements[(f"blocks.{b}", 0, i)] = [
                offrecomp.Placement.KEEP, offrecomp.Placement.OFFLOAD, offrecomp.Placement.RECOMPUTE
            ][i % 3]
    rt.set_plan(offrecomp.Plan(placements=placements, default=plan_default, plan_id="mixed"))
    got = train(m, batch, rt, steps=3)
    assert_bitwise(ref, got)
    last = rt.report().steps[-1]
    assert last.kept_bytes > 0 and last.offloaded_bytes > 0 and last.recomputed_bytes > 0


@pytest.mark.parametrize("mode", ["keep", "recompute", "offload"])
def test_double_backward(mode: str) -> None:
    """create_graph=True through placed activations (a gradient penalty)."""
    torch.manual_seed(0)

    class B(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(x)) * x

    model = torch.nn.Sequential(B(), B(), B())
    x = torch.randn(4, 16)

    def run(m: torch.nn.Module) -> list[torch.Tensor]:
        out = m(x).pow(2).sum()
        grads = torch.autograd.grad(out, list(m.parameters()), create_graph=True)
        sum(g.pow(2).sum() for g in grads).backward()
        return [p.grad.clone() for p in m.parameters()]

    ref = run(twin(model))
    m = twin(model)
    with offrecomp.runtime(m, mode=mode, min_bytes=0):
        got = run(m)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))


def test_first_planned_pass_calibrates_the_plan() -> None:
    """The measuring pass runs under the op recorder; the calibration pass replaces its
    timings before the first plan is solved (NOTE [Calibration])."""
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = _runtime(m, "auto", budget="50%")
    train(m, batch, rt, steps=4)
    entry = rt.planner.last_entry
    assert entry is not None and entry.calibrated
    assert entry.cost is not None and entry.cost.samples >= 2  # replaced, then averaged
    steps = rt.report().steps
    assert [s.phase for s in steps] == ["measure", "calibrate", "planned", "planned"]
    assert not any("drift: re-plan" in s.notes for s in steps)


def test_explicit_steps_inside_and_outside_the_context() -> None:
    """rt.step() marks a step of two passes (no optimizer here to detect it)."""
    model, batch = make("gpt_dropout")
    ref_m = twin(model)
    for micro in range(2):
        torch.manual_seed(micro)
        ref_m(batch(micro)).backward()
    for inside in (True, False):
        m = twin(model)
        rt = _runtime(m, "recompute")
        ctx = rt if inside else contextlib.nullcontext()
        with ctx, rt.step():
            for micro in range(2):
                torch.manual_seed(micro)
                m(batch(micro)).backward()
        steps = rt.report().steps
        assert [s.passes for s in steps] == [2], (inside, [s.passes for s in steps])
        for (n, p), q in zip(ref_m.named_parameters(), m.parameters()):
            assert torch.equal(p.grad, q.grad), n


def test_steps_outside_explicit_ones_are_found_automatically() -> None:
    """An rt.step() block closes its own step; iterations outside such blocks are closed
    by their optimizer step, so passes do not pile up unretired and auto goes
    on to plan."""
    model, batch = make("gpt_dropout")
    m = twin(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    rt = _runtime(m, "auto")
    with rt:
        with rt.step():
            m(batch(0)).backward()
            opt.step()
            opt.step()  # inside the block: closes nothing
        for s in range(1, 6):
            m(batch(s)).backward()
            opt.step()
            opt.zero_grad()
    steps = rt.report().steps
    assert [s.passes for s in steps] == [1] * 6
    assert steps[-1].phase == "planned", [s.phase for s in steps]


def test_offloaded_inputs_with_recomputed_internals() -> None:
    """The checkpoint itself goes to host memory; the block replays from the reload."""
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=3)
    m = twin(model)
    rt = _runtime(m, "recompute")
    rt.set_plan(
        offrecomp.Plan(
            placements={(f"blocks.{b}", 0, 0): offrecomp.Placement.OFFLOAD for b in range(3)},
            default=offrecomp.Placement.RECOMPUTE,
        )
    )
    got = train(m, batch, rt, steps=3)
    assert_bitwise(ref, got)
    last = rt.report().steps[-1]
    assert last.offloaded_bytes == last.input_bytes > 0
    assert last.replays == 3


def test_one_mib_host_limit_still_trains_exactly() -> None:
    model, _ = make("gpt_dropout")

    def batch(s: int) -> torch.Tensor:  # about 3 MiB of activations: more than the pool takes
        return torch.randint(0, 64, (8, 48), generator=torch.Generator().manual_seed(s))

    ref = train(twin(model), batch, steps=3)
    m = twin(model)
    rt = _runtime(m, "offload", host_limit="1MiB")
    got = train(m, batch, rt, steps=3)
    assert_bitwise(ref, got)
    steps = rt.report().steps
    assert all(s.offloaded_bytes > 0 for s in steps)
    assert all(sum(s.fallbacks.values()) > 0 for s in steps)  # the rest fell back, counted
    assert all(s.pool_reserved_bytes <= 1 << 20 for s in steps)
