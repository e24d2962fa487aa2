"""A replay reads everything its call read as it was at the call's entry: inputs the
forward wrote and sent to host memory, buffers rebound or written before the backward,
arguments aliasing the region's own state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp import Placement, Plan
from tests.helpers import assert_bitwise, train, twin


def _batch(s: int) -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))


class _WritesItsInput(nn.Module):
    """Scales its input in place first thing (a previous block's output: legal)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return torch.tanh(self.fc(x)) * x


class _WritesOneOfTwoViews(nn.Module):
    """Takes its input and a slice of it; writes the slice in place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        head.mul_(2)
        return torch.tanh(self.fc(x)) * x


class _Sliced(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.blocks = nn.ModuleList(_WritesOneOfTwoViews() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x, x[:, :8])
        return x.square().mean()


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.blocks = nn.ModuleList(_WritesItsInput() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x) * 1.0
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


@pytest.mark.parametrize("model", [_Scaled, _Sliced])
def test_an_offloaded_input_the_first_call_wrote_replays_from_its_copy(model: type[nn.Module]) -> None:
    """NOTE [State written by its region], NOTE [Replay inputs]: under a plan set before a
    region's first call, an input placed OFFLOAD that the forward writes reaches host
    memory with the written values; the first call replays from the copy its watch took
    before the write, so the capture keeps that copy past the call's exit."""
    torch.manual_seed(0)
    base = model()
    ref = train(twin(base), _batch, steps=2)
    m = twin(base)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    rt.set_plan(Plan(  # storage 0: the input (both of _Sliced's, one storage)
        placements={(f"blocks.{b}", 0, 0): Placement.OFFLOAD for b in range(3)},
        default=Placement.RECOMPUTE,
    ))
    assert_bitwise(ref, train(m, _batch, rt, steps=2))
    steps = rt.report().steps
    assert steps[0].replays == 3 and steps[0].offloaded_bytes > 0  # the first calls replay, inputs sent
