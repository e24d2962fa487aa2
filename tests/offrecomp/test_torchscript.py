"""TorchScript submodules (``torch.jit.script`` / ``torch.jit.trace``) inside blocks:
their buffer table is a wrapper that iterates by index and has no ``get`` (region
discovery raised on it), and the interpreter turns what the replay's hooks and
dispatch mode raise into a RuntimeError of its own (the replay's early stop surfaced
as an error). Gradients and buffers (a scripted BatchNorm's running statistics) equal
the plain run's, bitwise."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests import models
from tests.helpers import train, train_bitwise


class MLP(nn.Module):
    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(h, 4 * h)
        self.bn = nn.BatchNorm1d(4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        y = self.bn(y.flatten(0, 1)).view(y.shape)
        return self.fc2(F.gelu(y))


class Block(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(32)
        mlp = MLP()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.mlp = torch.jit.script(mlp) if how == "script" else torch.jit.trace(mlp, torch.randn(2, 8, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.dropout(self.mlp(self.ln(x)), 0.1, self.training)


def _batch(s: int) -> torch.Tensor:
    return torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(s))


@pytest.mark.parametrize("variant", ["recompute", "auto_serve", "offload"])
@pytest.mark.parametrize("how", ["script", "trace"])
def test_torchscript_blocks_bitwise_equal_to_plain(how: str, variant: str) -> None:
    def fresh() -> nn.Module:  # a deep copy of a ScriptModule does not train: build anew
        torch.manual_seed(0)
        return models.Stack([Block(how) for _ in range(3)])

    ref = train(fresh(), _batch, steps=4)
    rt = train_bitwise(fresh(), _batch, variant, 20_000 if variant == "auto_serve" else None, ref)
    assert rt.regions == ["blocks.0", "blocks.1", "blocks.2"]
    steps = rt.report().steps
    if variant == "recompute":
        assert all(s.replays == 3 for s in steps)
    if variant == "auto_serve":
        assert any(s.phase == "planned" and s.recomputed_bytes > 0 for s in steps)
