"""Forwards with grad that are never (or only partly) differentiated, and other models
trained in the same loop: what a pass and a step are made of, and that the runtime's
books stay bounded.

An evaluation loop that forgets ``torch.no_grad()`` (``out = model(x)``: the previous
batch's graph lives until ``out`` is rebound, after the next forward) must not make
one pass of every batch (NOTE [Dropped graphs]); passes joined by forwards whose graphs
are all held stop at ``MAX_FORWARDS``; another model's optimizer stepping between a
forward and its backward ends no step (NOTE [Optimizers of other models]), and another
model's backward begins no pass (NOTE [Saves outside the forward]). Gradients are
compared bitwise with a plain run of the same loop; growth is counted in passes and
objects.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from offrecomp import lifecycle
from offrecomp.outputs import WATCHED_OUTPUTS
from offrecomp.signatures import shown
from offrecomp.state import PassState, RegionCall
from tests.helpers import assert_bitwise, one_intra_op_thread, variant_runtime

Snap = dict[str, torch.Tensor]
H = 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(H, 2 * H)
        self.fc2 = nn.Linear(2 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.dropout(self.fc2(F.gelu(self.fc1(x))), 0.1, self.training)


class Net(nn.Module):
    """Blocks (the regions), then a head; returns a tensor, as an evaluation forward does."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.head = nn.Linear(H, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _x(seed: int, b: int = 2, t: int = 8) -> torch.Tensor:
    return torch.randn(b, t, H, generator=torch.Generator().manual_seed(seed))


def _snap(model: nn.Module, **extra: torch.Tensor) -> Snap:
    s = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    s.update({k: v.detach().clone() for k, v in extra.items()})
    return s


_one_thread = pytest.fixture(autouse=True, scope="module")(one_intra_op_thread)


def _live(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def _steps(
    step: Callable[[nn.Module, int], tuple[torch.Tensor, dict[str, torch.Tensor]]], steps: int = 4
) -> Callable[[nn.Module, offrecomp.Runtime | None], list[Snap]]:
    """A loop of ``steps`` training steps whose forwards and loss ``step`` makes (its
    loss, and tensors to compare besides the gradients)."""

    def loop(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
        torch.manual_seed(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            for i in range(steps):
                loss, extra = step(model, i)
                loss.backward()
                out.append(_snap(model, **extra))
                opt.step()
                opt.zero_grad(set_to_none=True)
        return out

    return loop


def _bitwise(
    loop: Callable[[nn.Module, offrecomp.Runtime | None], list[Snap]], variant: str,
    make: Callable[[], nn.Module] = Net, **kw: Any,
) -> offrecomp.Runtime:
    """``loop`` plain and under ``variant`` (``kw``: more runtime options), from the same
    weights of a ``make()`` model: bitwise equal."""
    torch.manual_seed(0)
    model = make()
    ref = loop(copy.deepcopy(model), None)
    rt = variant_runtime(model, variant, **kw)
    assert_bitwise(ref, loop(model, rt))
    return rt


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    model.train()
    model(_x(seed)).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


# ------------------------------------------------------------------ evaluation loops


@pytest.mark.parametrize("mode", ["keep", "recompute", "auto"])
def test_an_eval_loop_without_no_grad_holds_the_same_books_every_batch(mode: str) -> None:
    """NOTE [Dropped graphs]: each forward finds the previous batch's graph alive, and
    the oldest of its pass's gone: passes of two forwards, one kept per step, the rest
    retired as they end; the step after counts them all."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rt = offrecomp.runtime(model, mode=mode, min_bytes=0)
    live: list[tuple[int, int]] = []
    with rt:
        for i in range(2):
            _train_step(model, opt, i)
        model.eval()
        for i in range(60):
            out = model(_x(100 + i))
            out.mean().item()
            p = rt.current_pass
            assert p is not None and len(p.parts) <= 2 and p.signature.count(" + ") <= 1
            if i in (19, 59):
                live.append((_live(PassState), _live(RegionCall)))
        del out
        _train_step(model, opt, 2)
    assert live[0] == live[1], live  # 40 more batches, no more passes or calls held
    steps = rt.report().steps
    assert [s.passes for s in steps] == [1, 1, 30 + 1]  # 60 forwards in 30 passes, then training
    assert steps[-1].signature.startswith("train|")


@dataclasses.dataclass
class _Out:
    y: torch.Tensor


class _WrappedNet(Net):
    """``Net`` returning a dataclass, or a dict whose first eight leaves are numbers."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
        y = super().forward(x)
        return _Out(y) if self.kind == "dataclass" else {**{f"m{i}": i for i in range(8)}, "y": y}


@pytest.mark.parametrize("kind", ["dataclass", "dict"])
def test_an_eval_loop_watches_outputs_inside_dataclasses_and_past_other_leaves(kind: str) -> None:
    """NOTE [Dropped graphs]: the watched tensors are found inside a dataclass and past
    leaves that are not tensors, so each batch's dropped graph ends its pass."""
    torch.manual_seed(0)
    model = _WrappedNet(kind)
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    with rt:
        model.eval()
        for i in range(20):
            out = model(_x(100 + i))
            p = rt.current_pass
            assert p is not None and len(p.parts) <= 2, (i, len(p.parts) if p is not None else None)
        del out


@pytest.mark.parametrize("variant", ["keep", "recompute", "offload", "auto"])
def test_a_graph_left_in_an_ended_pass_is_differentiated_later(variant: str) -> None:
    """The first forward's graph is dropped, the second's kept: the third forward begins
    a pass of its own, and a backward of the second and third reads both passes' saves
    (and replays their calls) as a plain run does."""

    def step(model: nn.Module, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        a = model(_x(10 * i))
        b = model(_x(10 * i + 1))
        del a
        c = model(_x(10 * i + 2))
        return b.square().mean() + c.mean(), {"b": b, "c": c}

    rt = _bitwise(_steps(step), variant)
    steps = rt.report().steps
    assert [s.passes for s in steps] == [2] * 4
    if variant == "recompute":
        assert all(s.replays > 0 for s in steps)


@pytest.mark.parametrize("variant", ["keep", "recompute", "auto"])
def test_several_forwards_with_a_detached_middle_one_are_one_pass(variant: str) -> None:
    """The documented case NOTE [Dropped graphs] keeps: forwards whose first graph lives
    join one pass, though a middle one's output was detached (a target)."""

    def step(model: nn.Module, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        q = model(_x(10 * i))
        k = model(_x(10 * i + 1)).detach()
        r = model(_x(10 * i + 2))
        return (q - k).square().mean() + r.mean(), {"q": q, "r": r}

    rt = _bitwise(_steps(step), variant)
    steps = rt.report().steps
    assert [s.passes for s in steps] == [1] * 4
    assert steps[-1].signature.count(" + ") == 2


@pytest.mark.parametrize("variant", ["keep", "recompute", "auto"])
def test_a_pass_joins_at_most_max_forwards(variant: str, caplog: pytest.LogCaptureFixture) -> None:
    """Forwards whose graphs all live, past MAX_FORWARDS: a new pass begins (one warning,
    its signature shortened), and one backward of them all is a plain run's."""
    n = lifecycle.MAX_FORWARDS + 6

    def step(model: nn.Module, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return torch.stack([model(_x(1000 * i + j, b=1, t=2)) for j in range(n)]).mean(), {}

    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = _bitwise(_steps(step, 2), variant)
    warned = [r.getMessage() for r in caplog.records if "root forwards joined one pass" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"... {lifecycle.MAX_FORWARDS - 3} more" in warned[0] and len(warned[0]) < 1000
    assert [s.passes for s in rt.report().steps] == [2, 2]


def test_messages_show_a_joined_signature_shortened() -> None:
    part = "train|(2, 8, 16):float32:cpu"
    assert shown(part) == part
    assert shown(" + ".join([part] * 4)) == " + ".join([part] * 4)
    assert shown(" + ".join([part] * 400)) == " + ".join([part] * 3) + " + ... 397 more"


def test_a_copy_s_passes_are_named_for_what_they_are(caplog: pytest.LogCaptureFixture) -> None:
    """A copy of the model made inside the runtime and trained there runs the managed
    model's region calls outside its forward: the messages about those passes said
    "signature unknown" without a word of what that is."""
    import copy

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(4)])
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(model, mode="auto", budget=1, min_bytes=0):
        twin_model = copy.deepcopy(model)
        for _ in range(4):
            twin_model(torch.randn(4, 16)).sum().backward()
    named = [r.getMessage() for r in caplog.records if "signature unknown" in r.getMessage()]
    assert named and all("outside any forward of the managed model" in m for m in named), named


# ------------------------------------------------------------ optimizers of other models


def _other() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(5)
    other = nn.Linear(H, H)
    return other, torch.optim.SGD(other.parameters(), lr=0.1)


@pytest.mark.parametrize("variant", ["keep", "recompute", "auto"])
def test_an_optimizer_over_another_model_ends_no_step_between_a_forward_and_its_backward(variant: str) -> None:
    """NOTE [Optimizers of other models]: another model's optimizer steps between the
    second micro-batch's forward and its backward; the step holds both micro-batches.
    Given a parameter of this model, that optimizer ends the step there."""

    def loop(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
        torch.manual_seed(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        other, other_opt = _other()
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            for i in range(4):
                model(_x(10 * i)).mean().backward()
                loss = model(_x(10 * i + 1)).mean()
                for q in other.parameters():
                    q.grad = torch.full_like(q, 0.01 * (i + 1))
                other_opt.step()
                loss.backward()
                out.append(_snap(model))
                opt.step()
                opt.zero_grad(set_to_none=True)
            if rt is not None:
                assert [s.passes for s in rt.report().steps] == [2] * 4
            other_opt.add_param_group({"params": [model.head.bias]})  # it steps this model's now
            model(_x(98)).mean().backward()
            opt.zero_grad(set_to_none=True)  # nothing for it to update
            loss = model(_x(99)).mean()
            other_opt.step()
            if rt is not None:
                assert [s.passes for s in rt.report().steps] == [2] * 4 + [1]
            loss.backward()
        return out

    _bitwise(loop, variant)


@pytest.mark.parametrize("variant", ["recompute", "auto"])
def test_an_optimizer_another_thread_steps_during_the_backward_ends_no_step(variant: str) -> None:
    """NOTE [Optimizers of other models]: a gradient hook of the model's backward has
    another thread train another model, optimizer step included, and waits for it; the
    backward's step went on (it ended there, and under auto the signature measured at
    every step: none of its passes finished)."""

    def loop(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
        other, other_opt = _other()

        def other_step() -> None:
            other(_x(7)).sum().backward()
            other_opt.step()
            other_opt.zero_grad(set_to_none=True)

        def hook(g: torch.Tensor) -> None:
            t = threading.Thread(target=other_step)
            t.start()
            t.join()

        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            for i in range(6):
                h = model.blocks[0](_x(10 * i))
                h.register_hook(hook)
                for b in model.blocks[1:]:
                    h = b(h)
                model.head(h).mean().backward()
                out.append(_snap(model))
                opt.step()
                opt.zero_grad(set_to_none=True)
        return out

    rt = _bitwise(loop, variant, lambda: Net(layers=3))
    steps = rt.report().steps
    assert [s.replays for s in steps[:2]] == [3, 3]
    if variant == "auto":
        assert steps[-1].phase == "planned", [s.phase for s in steps]


def _gan_loop(gen: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """A DCGAN-style loop with the runtime around the generator only: the
    discriminator's forward, backward and step run between the generator's forward and
    its backward."""
    torch.manual_seed(1)
    disc = nn.Sequential(nn.Linear(1, H), nn.GELU(), nn.Linear(H, 1))
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.05)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.05)
    out = []
    with rt if rt is not None else contextlib.nullcontext():
        for i in range(4):
            fake = gen(_x(10 * i))
            real = _x(10 * i + 1)[..., :1]
            d_loss = F.softplus(-disc(real)).mean() + F.softplus(disc(fake.detach())).mean()
            d_loss.backward()
            opt_d.step()
            opt_d.zero_grad(set_to_none=True)
            g_loss = F.softplus(-disc(fake)).mean()
            g_loss.backward()
            out.append(_snap(gen, g=g_loss))
            opt_g.step()
            opt_g.zero_grad(set_to_none=True)
            disc.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("variant", ["keep", "recompute", "offload", "auto"])
def test_a_gan_with_the_runtime_around_the_generator_only(variant: str) -> None:
    """NOTE [Saves outside the forward]: the discriminator's backward reads saves that
    joined the generator's pass and ends nothing; the generator's backward, reaching its
    output, begins the pass, whose replays count in its step."""
    rt = _bitwise(_gan_loop, variant)
    steps = rt.report().steps
    assert [s.passes for s in steps] == [1] * 4
    if variant == "recompute":
        assert all(s.replays > 0 for s in steps), [s.replays for s in steps]


class _ManyOutputs(nn.Module):
    """No repeated blocks (the root call saves everything) and more outputs than the
    runtime watches (``WATCHED_OUTPUTS``, outputs.py); the last is unwatched."""

    outputs = WATCHED_OUTPUTS + 2

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.w = nn.Parameter(torch.randn(H, H) / H**0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.tanh(x @ self.w + i) for i in range(self.outputs))


@pytest.mark.parametrize("variant", ["keep", "offload", "auto"])
def test_a_backward_through_an_unwatched_output_of_a_root_only_model_is_its_step(variant: str) -> None:
    """NOTE [Saves outside the forward]: the backward through the last output reads only
    root saves made inside the forward; each begins its pass, so every step knows where
    its forward ended and auto gets past its measuring pass."""

    def step(model: nn.Module, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return model(_x(10 * i))[-1].mean(), {}

    rt = _bitwise(_steps(step, 6), variant, _ManyOutputs, native_keep=False)
    steps = rt.report().steps
    assert [s.passes for s in steps] == [1] * 6
    assert all(s.forward_seconds > 0 for s in steps)  # where its backward began
    if variant == "auto":
        assert steps[-1].phase.value == "planned", [s.phase for s in steps]


class _BypassOutput(_ManyOutputs):
    """Ten outputs, all watched; the last one's path saves nothing in the forward (an
    add, a scalar product): its backward reads only the loss's saves, made after the
    forward."""

    outputs = 10

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.zeros(H))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (*super().forward(x)[:-1], x + self.b * 2)


@pytest.mark.parametrize("variant", ["keep", "auto"])
def test_a_backward_through_a_watched_output_that_saved_nothing_is_its_step(variant: str) -> None:
    """NOTE [Dropped graphs]: the first WATCHED_OUTPUTS (outputs.py) are watched, so the
    backward reaching the last begins the pass; the output is held until the next
    forward, as ``out = model(x)`` holds it."""
    held: list[Any] = []

    def step(model: nn.Module, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        held[:] = [model(_x(10 * i))]
        return held[0][-1].square().sum(), {}

    rt = _bitwise(_steps(step, 6), variant, _BypassOutput, native_keep=False)
    steps = rt.report().steps
    assert [s.passes for s in steps] == [1] * 6
    assert all(s.forward_seconds > 0 for s in steps)
    if variant == "auto":
        assert steps[-1].phase.value == "planned", [s.phase for s in steps]


class _GradInForward(nn.Module):
    """A forward that differentiates part of itself (an input-gradient penalty): that
    backward reads root saves made inside the forward and is not the pass's."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.w = nn.Parameter(torch.randn(H, H) / H**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.requires_grad_()
        y = torch.tanh(x @ self.w)
        (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        return (y * y).mean() + (g * g).mean()


@pytest.mark.parametrize("variant", ["keep", "recompute", "offload"])
def test_a_backward_inside_a_root_forward_begins_no_pass(variant: str) -> None:
    def step(model: nn.Module, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        first = model(_x(10 * i))  # the second forward's inner backward comes after it
        return first + model(_x(10 * i + 1)), {}

    rt = _bitwise(_steps(step), variant, _GradInForward)
    assert [s.passes for s in rt.report().steps] == [1] * 4


def _two_forwards_two_backwards(model: nn.Module, i: int) -> None:
    big, small = model(_x(i, b=4, t=16)).mean(), model(_x(i + 8)).mean()
    small.backward()
    big.backward()


def _two_forwards_two_backwards_reversed(model: nn.Module, i: int) -> None:
    big, small = model(_x(i, b=4, t=16)).mean(), model(_x(i + 8)).mean()
    big.backward()  # in forward order: the replays run out of reverse forward order
    small.backward()


@pytest.mark.parametrize("backwards", [_two_forwards_two_backwards, _two_forwards_two_backwards_reversed])
def test_several_backwards_of_one_pass_count_every_replay(backwards: Callable[[nn.Module, int], None]) -> None:
    """Two forwards, then each loss's backward on its own (multi-task losses): each step
    replays every block twice, in one pass, and its record says so (NOTE [Several
    backwards])."""
    torch.manual_seed(0)
    model = Net(layers=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    with rt:
        for i in range(3):
            backwards(model, i)
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert [(s.passes, s.replays) for s in rt.report().steps] == [(1, 8)] * 3


@pytest.mark.parametrize("variant", ["keep", "recompute", "auto"])
def test_a_forward_kept_and_never_differentiated_ends_its_pass_at_the_step(variant: str) -> None:
    """A second forward with grad whose output is kept (for logging) but never
    differentiated: the pass awaits a backward through it (NOTE [Several backwards])
    until the optimizer steps, and its step is one pass with one backward's replays."""

    def step(model: nn.Module, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = model(_x(i)).mean()
        shown = model(_x(100 + i))  # alive through the backward and the step
        return loss, {"shown": shown}

    rt = _bitwise(_steps(step), variant)
    steps = rt.report().steps
    assert [s.passes for s in steps] == [1] * 4
    if variant == "recompute":
        assert [s.replays for s in steps] == [2] * 4  # the first forward's two blocks



def test_saves_before_the_next_forward_begin_the_next_pass() -> None:
    """A loop without an optimizer whose forward kept for logging leaves each pass
    awaiting (NOTE [Several backwards]): the next step's saves made before its forward
    (an input transform with a weight outside the model) begin the next pass, rather
    than join the one that awaits, and each step ends at its backward's end."""
    torch.manual_seed(0)
    model = Net()
    w = nn.Parameter(torch.eye(H))
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    logged: list[torch.Tensor] = []
    with rt:
        for i in range(5):
            loss = model(torch.tanh(_x(i) @ w)).mean()  # tanh and mm save before the forward
            logged[:] = [model(_x(100 + i))]  # kept, never differentiated
            loss.backward()
            with torch.no_grad():
                for p in [*model.parameters(), w]:
                    p -= 0.01 * p.grad
                    p.grad = None
            time.sleep(0.2)  # work between steps: in no step's wall time
    steps = rt.report().steps
    assert len({(s.passes, s.saved_tensors, s.replays) for s in steps}) == 1, steps
    assert all(s.wall_seconds < 0.2 for s in steps[1:]), [s.wall_seconds for s in steps]


class _AdaptsInForward(nn.Module):
    """Test-time adaptation (TENT): the forward runs a training step of the inner model."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(H, H), nn.Tanh(), nn.Linear(H, H))
        self.opt = torch.optim.SGD(self.inner.parameters(), lr=0.05)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        out.square().mean().backward()
        self.opt.step()
        self.opt.zero_grad()
        return out


def test_an_optimizer_stepped_inside_the_forward_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """A forward running its own backward and optimizer step teaches auto nothing (that
    backward is not the pass's): a warning says so and names the fix, where the only one
    said the measuring pass's backward never ran."""
    m = _AdaptsInForward()
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(m, mode="auto"):
        for i in range(3):
            m(_x(i))
    assert "an optimizer stepped inside the forward of the model the runtime was given" in caplog.text


@pytest.mark.parametrize("forwards", [1, 2, 3])
def test_forwards_without_a_backward_end_with_the_optimizer_step_they_ran_before(forwards: int) -> None:
    """Forwards with grad on whose outputs are dropped unbackwarded (an evaluation with
    grad on, Lightning's SWA epoch) and then an optimizer step: their pass stayed open
    past the step, so it joined the next step's pass (the report one record short of
    the optimizer's steps at one forward) or made a record of its own one step late."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)) for _ in range(3)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, 16)
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        for _ in range(3):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        for _ in range(forwards):
            model(x).square().mean()  # dropped: no backward
        opt.step()
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    steps = rt.report().steps
    assert len(steps) == 6, [(s.step, s.passes) for s in steps]
    assert [s.recomputed_bytes for s in steps[4:]] == [steps[0].recomputed_bytes] * 2, [s.recomputed_bytes for s in steps]


def test_saves_outside_every_forward_for_no_backward_are_no_step() -> None:
    """A weight made from parameters with grad on after the last step (pruning's
    ``weight_orig * mask`` at an epoch's end) saved tensors for a backward that never
    came: the runtime's exit wrote a step record of it."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)) for _ in range(3)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        for _ in range(3):
            model(torch.randn(4, 16)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        w = model[0][0].weight * torch.ones_like(model[0][0].weight)
    assert len(rt.report().steps) == 3 and w.requires_grad
