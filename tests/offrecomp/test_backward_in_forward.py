"""Forwards that run a backward of their own (NOTE [Backward inside a forward] in
replay.py): a force field computed as -d energy / d x with create_graph, as in
Hamiltonian and energy-based networks; flex_attention's autograd rule does the same
internally on every call (its CUDA test is in test_higher_order.py).

The inner backward must not end the pass in the middle of the forward, and a replay of
such a block must hold what its inner backward unpacks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from offrecomp import early_unpacks
from tests import models
from tests.helpers import (
    ZOO_VARIANTS,
    assert_bitwise,
    batch_on,
    check_variant,
    deterministic_plain,
    tight_budget,
    train,
    train_bitwise,
    variant_runtime,
)

STEPS = 5


class ForceBlock(nn.Module):
    """Adds a learnt force field: the gradient of an energy MLP at the normed input."""

    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.e1 = nn.Linear(h, 4 * h)
        self.e2 = nn.Linear(4 * h, 1)
        self.out = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln(x)
        with torch.enable_grad():
            z = y if y.requires_grad else y.detach().requires_grad_()
            energy = self.e2(torch.tanh(self.e1(z))).sum()
            (force,) = torch.autograd.grad(energy, z, create_graph=True)
        return x + F.dropout(self.out(torch.relu(force + y)), 0.1, self.training)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return models.Stack([ForceBlock() for _ in range(3)])


def _batch(s: int) -> torch.Tensor:
    return torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(s))


@pytest.mark.parametrize("variant", ZOO_VARIANTS)
def test_force_field_blocks_bitwise_equal_to_plain(variant: str) -> None:
    rt, _ = check_variant(_model(), _batch, variant, steps=STEPS)
    steps = rt.report().steps
    assert len(steps) == STEPS and all(s.passes == 1 for s in steps)  # the inner backward ends no pass
    if variant.startswith("auto"):
        assert steps[-1].phase == "planned"
    regions = rt._regions
    if variant != "keep" and variant != "offload":
        assert all(r.backward_in_forward and r.forward_used for r in regions)
    if variant == "recompute":
        # the first forward regenerates what its inner backward reads, once per block;
        # later calls keep it, and every step replays each block once in backward
        assert [s.replays for s in steps] == [6] + [3] * (STEPS - 1)
    if variant.startswith("auto"):
        assert all(s.served_ops == 0 for s in steps)  # replayed plainly
        assert rt.explain().count("runs a backward inside its forward") == 3


@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
def test_replay_meeting_an_inner_backward_starts_again_holding(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay of a block not known to run a backward in its forward (also one under
    the dispatch mode): the replayed inner backward finds nothing held, and the replay
    starts again, plainly, holding its saves."""
    monkeypatch.setattr(early_unpacks, "_in_forward", lambda call, rec: None)
    model = _model()
    ref = train(copy.deepcopy(model), _batch, steps=STEPS)
    budget = tight_budget(model, _batch) if variant == "auto_serve" else None
    m = copy.deepcopy(model)
    rt = train_bitwise(m, _batch, variant, budget, ref, steps=STEPS)
    assert all(r.backward_in_forward and not r.forward_used for r in rt._regions)
    assert rt.report().steps[-1].replays > 0


class SensitivityHead(nn.Module):
    """Scales its input by the size of d(sum of its input) / d(x0), where x0 is an
    earlier activation: the backward inside this forward reads other blocks' saves."""

    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.fc = nn.Linear(h, h)
        self.x0: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.x0 is not None
        (g,) = torch.autograd.grad(x.sum(), self.x0, create_graph=True)
        return self.fc(x) * (1 + 0.01 * g.square().mean())


class SensitivityModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 32)
        self.blocks = nn.ModuleList(models.MLPBlock(32) for _ in range(3))
        self.head = SensitivityHead()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = self.inp(x)
        self.head.x0 = x0
        h = x0
        for b in self.blocks:
            h = b(h)
        return self.head(h).square().mean()


@pytest.mark.parametrize("head_is_a_region", [False, True])
@pytest.mark.parametrize("variant", ZOO_VARIANTS)
def test_a_backward_inside_a_forward_reaching_earlier_blocks(variant: str, head_is_a_region: bool) -> None:
    """docs/reliability.md, known limits: the inner backward reads the earlier blocks'
    saves mid-forward, from the root's code or from a region's forward; gradients stay
    bitwise equal to plain."""
    torch.manual_seed(0)
    kw = {"regions": [models.MLPBlock, SensitivityHead]} if head_is_a_region else {}
    rt, _ = check_variant(SensitivityModel(), _batch, variant, steps=STEPS, **kw)
    steps = rt.report().steps
    assert all(s.passes == 1 for s in steps), [s.passes for s in steps]  # one pass a step
    if variant.startswith("auto"):
        assert steps[-1].phase == "planned"
    heads = [r for r in rt._regions if isinstance(r.module, SensitivityHead)]
    assert len(heads) == (1 if head_is_a_region else 0)
    if heads and variant not in ("keep", "offload"):
        # a replay of the head, from its detached input, could not run its backward
        assert heads[0].reaches_out
        assert all(not r.reaches_out for r in rt._regions if r is not heads[0])
        if variant.startswith("auto"):
            text = rt.explain()
            assert text.count("runs a backward through earlier activations: never recomputed") == 1


@pytest.mark.cuda
@pytest.mark.parametrize("variant", ["recompute", "offload", "auto_serve"])
def test_force_field_blocks_on_cuda(variant: str) -> None:
    """On the GPU the inner backward's nodes run on autograd's device thread, where the
    runtime's call stack (thread-local) is empty: what marks the pass and the region
    must not depend on it."""
    dev = torch.device("cuda")
    model = _model().to(dev)
    batch = batch_on(dev, _batch)
    ref = deterministic_plain(model, batch, STEPS)
    if ref is None:
        pytest.skip("plain CUDA runs differ run to run (nondeterministic kernels)")
    budget = tight_budget(model, batch) if variant == "auto_serve" else None
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, budget)
    assert_bitwise(ref, train(m, batch, rt, steps=STEPS))
    assert len(rt.report().steps) == STEPS
    if variant != "offload":
        assert all(r.backward_in_forward for r in rt._regions)


class LocalLossBlock(nn.Module):
    """Trains a probe of its own on a local loss inside its forward (as greedy
    layer-wise and local-learning setups do): ``loss.backward()`` mid-forward
    accumulates into the probe's ``.grad``, and the block goes on computing after it,
    saving again a tensor it saved before."""

    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.fc = nn.Linear(h, h)
        self.probe = nn.Linear(h, 4)
        self.out = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        if torch.is_grad_enabled():
            local = self.probe(F.dropout(h.detach(), 0.1, self.training)).square().mean()
            local.backward()
        # ``out`` saves h again, after the backward
        return x + self.out(h) + F.dropout(torch.relu(h), 0.1, self.training)


def _local_model() -> nn.Module:
    torch.manual_seed(0)
    return models.Stack([LocalLossBlock(), models.MLPBlock(32), LocalLossBlock(), models.MLPBlock(32)])


@pytest.mark.parametrize("variant", ZOO_VARIANTS)
def test_a_backward_accumulating_inside_a_forward_runs_once(variant: str) -> None:
    """NOTE [Accumulating backward in a forward]: a replay would run the local loss's
    backward again and add the probe's gradients twice; such blocks are never
    recomputed, and the others still are."""
    rt, _ = check_variant(_local_model(), _batch, variant, steps=STEPS)
    local = [r for r in rt._regions if isinstance(r.module, LocalLossBlock)]
    assert len(local) == 2
    assert all(r.accumulates for r in local)
    assert not any(r.accumulates for r in rt._regions if r not in local)
    if variant.startswith("auto"):
        assert rt.explain().count("runs a backward that accumulates into .grad: never recomputed") == 2


class ReplayOnlyLossBlock(LocalLossBlock):
    """Runs its local loss's backward only in a replay: the forward never showed it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        if offrecomp.in_replay():
            self.probe.weight.sum().backward()  # saves nothing: the replay's saves line up
        return x + self.out(torch.relu(h))


def test_a_replay_meeting_an_accumulating_backward_raises() -> None:
    """NOTE [Accumulating backward in a forward]: a replay that runs such a backward its
    forward did not run raises rather than add the gradients twice."""
    torch.manual_seed(0)
    m = models.Stack([ReplayOnlyLossBlock() for _ in range(2)])
    x = _batch(0)
    with offrecomp.runtime(m, mode="recompute") as rt:
        loss = m(x)
        with pytest.raises(RuntimeError, match=r"reached a backward that accumulates into \.grad.*twice"):
            loss.backward()
    assert not any(r.accumulates for r in rt._regions)
    assert all(p.grad is None for n, p in m.named_parameters() if "probe" in n)
