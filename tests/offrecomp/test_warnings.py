"""Warnings that must not mislead: passes whose saves never reach offrecomp's hooks end
with their backward (NOTE [Backward without saves]), so auto does not report a
measuring pass as unfinished, and every optimizer step is a step of its own."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import pytest
import torch
from torch import nn

import offrecomp

UNFINISHED = "ended before its backward ran"


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.5


def _unfinished(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings that a measuring pass ended before its backward (the tests that look
    for none have a positive control: test_a_measuring_pass_whose_backward_ran_outside_is_called_unfinished)."""
    return [r.getMessage() for r in caplog.records if UNFINISHED in r.getMessage()]


@pytest.mark.parametrize("block", [Identity, Scale], ids=["identity", "scale"])
def test_regions_that_save_nothing_end_their_passes(
    block: Callable[[], nn.Module], caplog: pytest.LogCaptureFixture
) -> None:
    """Each backward, run inside the context, ends its pass: four steps, measured,
    calibrated and planned, and no warning that the measuring pass was cut short."""
    m = nn.Sequential(block(), block(), block())
    grads = []
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(m) as rt:
        for s in range(5):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(s)).requires_grad_()
            m(x).sum().backward()
            grads.append(x.grad)
    assert _unfinished(caplog) == []
    steps = rt.report().steps
    # NOTE [Host pauses]: a calibration a collection distorted runs again (a loaded host)
    again = [s for s in steps[2:] if s.phase == "calibrate"]
    assert [s.phase for s in steps][:2] == ["measure", "calibrate"] and steps[-1].phase == "planned"
    assert len(again) <= 1 and all(s.pause_seconds > 0 for s in [steps[1], *again][: len(again)]), steps
    scale = 1.0 if block is Identity else 2.5**3
    assert all(torch.equal(g, torch.full_like(g, scale)) for g in grads)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)) for _ in range(4)])


def test_a_forward_under_the_users_save_on_cpu_is_a_step_per_optimizer_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """torchtune's placement of its offloading context: the forward runs under the
    user's own save_on_cpu() inside the runtime. Its hooks take every save, so none
    reaches offrecomp; each backward still ends its pass, and five optimizer steps are
    five step records, not one that merges their bytes. Gradients equal the plain run's."""

    def run(m: nn.Module, rt: offrecomp.Runtime | None) -> list[torch.Tensor]:
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        out = []
        for s in range(5):
            with torch.autograd.graph.save_on_cpu():
                loss = m(torch.randn(32, 64, generator=torch.Generator().manual_seed(s))).square().mean()
            loss.backward()
            out.append(m[0][0].weight.grad.clone())
            opt.step()
            opt.zero_grad()
        return out

    ref = run(_mlp(), None)
    m = _mlp()
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(m, min_bytes=0) as rt:
        got = run(m, rt)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    steps = rt.report().steps
    assert len(steps) == 5, [(s.phase, s.passes) for s in steps]
    assert all(s.passes == 1 for s in steps)
    # no record merges several passes' bytes: at most the region inputs one pass
    # checkpoints (planned passes keep every call whole and take no checkpoint: NOTE
    # [Kept planned calls])
    assert max(s.kept_bytes for s in steps) == steps[0].kept_bytes > 0, [s.kept_bytes for s in steps]
    assert _unfinished(caplog) == []
    hidden = [r.getMessage() for r in caplog.records if "owns their activations" in r.getMessage()]
    assert len(hidden) == 1 and "a saved-tensor hook around it (entered by the model's code around the region, or around the model's forward)" in hidden[0], hidden


def test_a_measuring_pass_whose_backward_ran_outside_is_called_unfinished(caplog: pytest.LogCaptureFixture) -> None:
    """The positive control of the tests that look for no such warning: the runtime's
    context exits after the measuring pass's forward, its backward runs outside, and
    ``_unfinished`` finds the warning, once. (A graph the forward drops is an aborted
    pass, NOTE [Dropped graphs], of which the warning says nothing.)"""
    m = _mlp()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        with offrecomp.runtime(m, min_bytes=0):
            loss = m(x).sum()
        loss.backward()
    warned = _unfinished(caplog)
    assert len(warned) == 1 and "measuring pass of signature" in warned[0], caplog.text


def test_a_forward_on_a_thread_that_did_not_enter_says_it_runs_plainly(caplog: pytest.LogCaptureFixture) -> None:
    """Saved-tensor hooks are per thread: a forward on another thread is not the runtime's
    (its gradients are plain's, it records no step), and a warning says so."""
    import threading

    import offrecomp.diagnostics

    offrecomp.diagnostics.clear_warnings()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])
    plain = copy.deepcopy(model)
    x = torch.randn(4, 8)
    errors: list[BaseException] = []

    def train_once() -> None:
        try:
            model(x).sum().backward()
        except BaseException as exc:  # re-raised on the main thread below
            errors.append(exc)

    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        worker = threading.Thread(target=train_once, name="trainer")
        worker.start()
        worker.join()
    if errors:
        raise errors[0]
    plain(x).sum().backward()
    got = {n: p.grad for n, p in model.named_parameters()}
    want = {n: p.grad for n, p in plain.named_parameters()}
    assert all(g is not None for g in got.values())
    assert all(torch.equal(got[n], want[n]) for n in want)  # bitwise plain's
    assert not rt.report().steps
    assert any("thread ('trainer')" in r.getMessage() for r in caplog.records)


class _Guard(torch.autograd.Function):
    """Raises in backward while ``on`` (a gradient guard, a NaN check)."""

    on = False

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        if _Guard.on:
            raise ArithmeticError("guard")
        return g


def test_a_measuring_pass_whose_backward_raised_is_not_called_unfinished(caplog: pytest.LogCaptureFixture) -> None:
    """Its backward ran and raised: no advice to run the forward under no_grad."""
    m = _mlp()
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(m, min_bytes=0):
        for s in range(3):
            _Guard.on = s == 0
            x = torch.randn(4, 64, generator=torch.Generator().manual_seed(s))
            loss = m[2:](_Guard.apply(m[:2](x))).sum()  # raises after blocks 3 and 2 replayed
            try:
                loss.backward()
            except ArithmeticError:
                assert s == 0
    _Guard.on = False
    assert _unfinished(caplog) == []


def test_an_optimizer_step_inside_an_autocast_context_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """Autocast's weight cache serves the casts from before the step to the forwards
    after it in the same context; a replay casts the updated weights."""
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    amp = torch.autocast("cpu", dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(m, mode="recompute"), amp:
        for s in range(2):
            m(torch.randn(4, 64, generator=torch.Generator().manual_seed(s))).float().sum().backward()
            opt.step()
    assert "stepped inside a torch.autocast context" in caplog.text


def test_a_step_closed_before_its_backward_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """``with rt.step():`` around the forward only: the backward after the block belongs to
    no step, and auto would measure every such pass again; said once."""
    offrecomp.diagnostics.clear_warnings()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])
    rt = offrecomp.runtime(model, min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"), rt:
        for _ in range(3):
            with rt.step():
                loss = model(torch.randn(4, 8)).sum()
            loss.backward()
    assert caplog.text.count("rt.step() closed a step whose forward saved tensors") == 1
