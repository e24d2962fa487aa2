"""NOTE [Hooks a replay registers]: hooks a block registers in its forward (on first use,
or swapped at each call) are registered once, as in a plain run, however often the block
replays."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import tight_budget, train, variant_runtime


class _LazyHooks(nn.Module):
    """Registers, on first use, a gradient hook on a parameter, a post-accumulate hook on
    another and a forward hook on a submodule; swaps a per-batch hook at each call,
    keeping its handle."""

    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)
        self.hooked = False
        self.handle: Any = None
        self.accumulated = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.hooked:
            self.fc1.weight.register_hook(lambda g: g * 0.5)
            self.fc2.bias.register_post_accumulate_grad_hook(self._count)
            self.fc2.register_forward_hook(lambda m, a, out: out * 1.5)
            self.hooked = True
        if self.handle is not None:
            self.handle.remove()
        s = float(x.detach().abs().mean())
        self.handle = self.fc2.weight.register_hook(lambda g: g / (1.0 + s))
        return x + self.fc2(F.gelu(self.fc1(x)))

    def _count(self, p: torch.Tensor) -> None:
        self.accumulated += 1


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_LazyHooks() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def _batch(s: int) -> torch.Tensor:
    return torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s))


def _hooks(m: nn.Module) -> list[int]:
    out = []
    for b in m.blocks:  # type: ignore[union-attr]
        out += [
            len(b.fc1.weight._backward_hooks or {}), len(b.fc2.weight._backward_hooks or {}),
            len(b.fc2.bias._post_accumulate_grad_hooks or {}), len(b.fc2._forward_hooks), b.accumulated,
        ]
    return out


@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve", "offload"])
def test_hooks_a_forward_registers_are_not_registered_again_by_replays(variant: str) -> None:
    """Replays saw the guard attribute (and the swapped handle) as at the call's entry and
    registered the hooks again: the parameter's gradient went through both from step 0
    on (half of plain's), and the swapped hook piled up one per step."""
    torch.manual_seed(0)
    model = _Model()
    ref_model = copy.deepcopy(model)
    ref = train(ref_model, _batch, None, steps=6)
    budget = tight_budget(model, _batch) if variant.startswith("auto") else None
    m = copy.deepcopy(model)
    got = train(m, _batch, variant_runtime(m, variant, budget), steps=6)
    for r, g in zip(ref, got):
        assert r.keys() == g.keys() and all(torch.equal(r[k], g[k]) for k in r)
    assert _hooks(m) == _hooks(ref_model)
