"""Tensors made under ``torch.inference_mode`` reaching a region: an argument, a buffer or
a plain attribute built at first use during an evaluation (a rotary or ALiBi cache), a
global. They have no version counter (reading ``_version`` raises), and autograd never
saves them, but an op that saves nothing of them (an add) may read them, and a plain run
trains. So does every mode: a region's replay reads them as they are, and a write to one
between a forward and its backward can only happen inside ``inference_mode`` (docs/reliability.md)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.helpers import ZOO_VARIANTS, check_variant

_GLOBAL: dict[str, torch.Tensor] = {}


class _Block(nn.Module):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.role = role
        if role == "buffer":
            self.register_buffer("cache", None)
        else:
            self.cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, extra: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        y = torch.tanh(self.fc(x))
        if self.role == "argument":
            return y + extra  # read, never saved
        if self.role == "listed":
            return y + extra[0]
        if self.role == "global":
            return y + _GLOBAL["bias"]
        if self.cache is None:  # built at first use: in the evaluation, under inference_mode
            self.cache = torch.arange(8, dtype=x.dtype) * 0.01
        return y + self.cache


class _Model(nn.Module):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role
        self.blocks = nn.ModuleList(_Block(role) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():  # made per step, as a bias an inference-mode helper returns
            extra = torch.full((8,), 0.1) * x.shape[0]
        arg = [extra] if self.role == "listed" else extra
        for b in self.blocks:
            x = b(x, arg)
        return x.square().mean()


def _batch(seed: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))


def _evaluated(role: str) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        torch.manual_seed(0)
        m = _Model(role)
        _GLOBAL["bias"] = torch.linspace(0, 1, 8)
        with torch.inference_mode():  # an evaluation first: the caches are built here
            _GLOBAL["bias"] = torch.linspace(0, 1, 8)
            m(_batch(99))
        return m

    return make


@pytest.mark.parametrize("variant", ZOO_VARIANTS)
@pytest.mark.parametrize("role", ["argument", "listed", "buffer", "attribute", "global"])
def test_inference_tensors_reaching_a_region_train_bitwise(role: str, variant: str) -> None:
    base = _evaluated(role)()
    if role in ("buffer", "attribute"):
        assert all(b.cache is not None and b.cache.is_inference() for b in base.blocks)
    assert _GLOBAL["bias"].is_inference()
    rt, _ = check_variant(base, _batch, variant, steps=5)
    if variant == "recompute":
        assert all(s.recomputed_bytes > 0 for s in rt.report().steps)
