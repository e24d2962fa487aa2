"""NOTE [Hooks off in backward]: a backward under the runtime runs with the runtime's
saved-tensor hook pair off the thread's stack, and the pair is back when it returns."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import offrecomp
from offrecomp import _torch_compat as tc
from offrecomp import backward_entry
from tests import models
from tests.helpers import assert_bitwise, make, train, twin


def _mlp() -> nn.Module:
    return models.stack(lambda: models.MLPBlock(16))()


def _stack_during_backward(loss: torch.Tensor, **kw: Any) -> list[Any]:
    """The top hook pair each gradient hook on ``loss``'s input saw, for one backward."""
    seen: list[Any] = []
    node = loss.grad_fn
    assert node is not None
    node.register_prehook(lambda grads: seen.append(tc.top_saved_tensors_hooks()))
    if kw.pop("grad", False):
        torch.autograd.grad(loss, kw.pop("inputs"), **kw)
    else:
        loss.backward(**kw)
    return seen


@pytest.mark.parametrize("mode", ["keep", "offload", "recompute"])
def test_a_backward_runs_with_the_pair_off_and_gets_it_back(mode: str) -> None:
    torch.manual_seed(0)
    m = _mlp()
    x = torch.randn(4, 16)
    original = tc.backward_entry()
    with offrecomp.runtime(m, mode=mode, min_bytes=0) as rt:
        assert backward_entry.owned() and tc.backward_entry() is not original
        own = tc.top_saved_tensors_hooks()
        assert own is not None
        for _ in range(2):
            assert _stack_during_backward(m(x).sum()) == [None]
            assert tc.top_saved_tensors_hooks() == own
        params = list(m.parameters())
        assert _stack_during_backward(m(x).sum(), grad=True, inputs=params) == [None]
        assert tc.top_saved_tensors_hooks() == own
    assert tc.backward_entry() is original and not backward_entry.owned()
    assert tc.top_saved_tensors_hooks() is None
    assert rt.report().steps[-1].saved_tensors > 0


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_a_backward_that_makes_a_graph_keeps_the_pair() -> None:
    torch.manual_seed(0)
    m = _mlp()
    x = torch.randn(4, 16, requires_grad=True)
    with offrecomp.runtime(m, mode="offload", min_bytes=0):
        own = tc.top_saved_tensors_hooks()
        loss = m(x).pow(2).sum()
        assert _stack_during_backward(loss, grad=True, inputs=[x], create_graph=True) == [own]
        loss = m(x).pow(2).sum()
        assert _stack_during_backward(loss, create_graph=True) == [own]
        assert tc.top_saved_tensors_hooks() == own
        m.zero_grad()
        x.grad = None


def test_a_pair_beneath_the_runtimes_keeps_it_on() -> None:
    torch.manual_seed(0)
    m = _mlp()
    x = torch.randn(4, 16)
    outer = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    with outer, offrecomp.runtime(m, mode="keep"):  # it warns that the outer pair sees no save
        own = tc.top_saved_tensors_hooks()
        assert _stack_during_backward(m(x).sum()) == [own]


def test_the_pair_is_back_after_a_backward_that_raises() -> None:
    torch.manual_seed(0)
    m = _mlp()
    x = torch.randn(4, 16)

    def boom(grads: Any) -> None:
        raise ValueError("boom")

    with offrecomp.runtime(m, mode="offload", min_bytes=0):
        own = tc.top_saved_tensors_hooks()
        loss = m(x).sum()
        assert loss.grad_fn is not None
        loss.grad_fn.register_prehook(boom)
        with pytest.raises(ValueError, match="boom"):
            loss.backward()
        assert tc.top_saved_tensors_hooks() == own
        assert _stack_during_backward(m(x).sum()) == [None]


def test_a_wrapper_put_around_the_entry_keeps_working_after_exit() -> None:
    """Something that wraps the entry while a runtime is installed keeps its wrapper at
    the runtime's exit; the runtime's passes calls through, and a later runtime places a
    new one over both."""
    original = tc.backward_entry()
    calls: list[int] = []
    torch.manual_seed(0)
    m = _mlp()
    x = torch.randn(4, 16)
    try:
        with offrecomp.runtime(m, mode="keep"):
            ours = tc.backward_entry()

            def theirs(*args: Any, **kwargs: Any) -> Any:
                calls.append(1)
                return ours(*args, **kwargs)

            tc.set_backward_entry(theirs)
            assert _stack_during_backward(m(x).sum()) == [None]
        assert tc.backward_entry() is theirs
        m(x).sum().backward()  # no runtime: passed through
        with offrecomp.runtime(m, mode="keep"):
            assert tc.backward_entry() is not theirs and backward_entry.owned()
            assert _stack_during_backward(m(x).sum()) == [None]
        assert tc.backward_entry() is theirs
        assert len(calls) == 3
    finally:
        tc.set_backward_entry(original)


def test_a_wrapper_another_patch_dropped_is_placed_again() -> None:
    """A patch that puts torch's own entry back while a runtime is installed (as
    torch.compiler's does at its exit) drops the wrapper; the next runtime places one."""
    original = tc.backward_entry()
    torch.manual_seed(0)
    m = _mlp()
    x = torch.randn(4, 16)
    with offrecomp.runtime(m, mode="keep"):
        tc.set_backward_entry(original)
        assert not backward_entry.owned()
        own = tc.top_saved_tensors_hooks()
        assert _stack_during_backward(m(x).sum()) == [own]  # the pair stays on: still right
    assert tc.backward_entry() is original
    with offrecomp.runtime(m, mode="keep"):
        assert backward_entry.owned()
        assert _stack_during_backward(m(x).sum()) == [None]
    assert tc.backward_entry() is original


def test_an_interrupt_between_the_pop_and_the_backward_leaves_the_pair_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C may land right after the pair came off: it goes back on all the same."""
    torch.manual_seed(0)
    m = _mlp()
    x = torch.randn(4, 16)
    pop = tc.pop_saved_tensors_hooks

    def pop_then_interrupt() -> None:
        pop()
        raise KeyboardInterrupt

    with offrecomp.runtime(m, mode="offload", min_bytes=0):
        own = tc.top_saved_tensors_hooks()
        monkeypatch.setattr(tc, "pop_saved_tensors_hooks", pop_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            m(x).sum().backward()
        monkeypatch.setattr(tc, "pop_saved_tensors_hooks", pop)
        assert tc.top_saved_tensors_hooks() == own
        assert _stack_during_backward(m(x).sum()) == [None]
    assert tc.top_saved_tensors_hooks() is None


def test_a_backward_that_found_the_wrapper_after_the_last_exit_passes_through() -> None:
    """Another thread may look the wrapper up just before the last runtime takes it out."""
    torch.manual_seed(0)
    m = _mlp()
    x = torch.randn(4, 16)
    with offrecomp.runtime(m, mode="keep"):
        stale = tc.backward_entry()
    assert stale is not tc.backward_entry()
    loss = m(x)
    stale((loss,), (torch.ones_like(loss),), False, False, (), allow_unreachable=True, accumulate_grad=True)
    assert all(p.grad is not None for p in m.parameters())


class _Reentrant(nn.Module):
    """A block that checkpoints itself reentrantly: its recomputation saves inside the
    backward, with the runtime's pair off."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["keep", "offload", "recompute", "auto"])
def test_gradients_bitwise_with_a_reentrant_checkpoint_inside(mode: str) -> None:
    m, batch = make("gpt_dropout")
    m.blocks[1] = _Reentrant(m.blocks[1])
    ref = train(twin(m), batch, steps=3)
    got = train(m, batch, offrecomp.runtime(m, mode=mode, min_bytes=0), steps=3)
    assert_bitwise(ref, got)


def test_gradient_penalty_bitwise() -> None:
    """A double backward (create_graph) under the runtime, as WGAN-GP's penalty."""
    torch.manual_seed(0)
    m = _mlp()
    ref_m = twin(m)

    def run(model: nn.Module) -> list[torch.Tensor]:
        torch.manual_seed(1)
        x = torch.randn(4, 16, requires_grad=True)
        out = model(x).sum()
        (g,) = torch.autograd.grad(out, x, create_graph=True)
        (out + g.pow(2).sum()).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    ref = run(ref_m)
    with offrecomp.runtime(m, mode="offload", min_bytes=0):
        got = run(m)
    assert len(ref) == len(got) and all(torch.equal(a, b) for a, b in zip(ref, got))
