"""The books of a pass (``peak_activation_bytes``) and the model's prediction count each
allocation the runtime holds once, wherever the blocks' inputs come from and whoever
else saves them."""

from __future__ import annotations

import copy

import torch
from torch import nn

import offrecomp
from tests.helpers import assert_bitwise, train

D = 64
ROWS = 32
TENSOR = ROWS * D * 4  # the bytes of one block input


def _batch(s: int) -> torch.Tensor:
    return torch.randn(ROWS, D, generator=torch.Generator().manual_seed(s))


class _SkipBlock(nn.Module):
    """Takes the block before's output and the one before that (a skip)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x) + skip)


class _SkipChain(nn.Module):
    def __init__(self, n: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_SkipBlock() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        prev = h = x * 1.0
        for b in self.blocks:
            prev, h = h, b(h, prev)
        return h.sum()


def test_an_input_the_call_before_counts_is_not_counted_again_for_an_earlier_drop() -> None:
    """NOTE [Inputs counted once] (shared.py): each block's output is dropped by its tanh,
    counted by the next block, which takes it as an input, and taken again by the block
    after that. That call's lookup meets the latest record first (the next block's kept
    input, which counts it), not the dropped one, so the pass counts each of the six
    inputs once, as the model does: its peak is theirs and the last block's output its
    replay regenerates (the earliest record first counted four of them twice)."""
    torch.manual_seed(0)
    base = _SkipChain()
    ref = train(copy.deepcopy(base), _batch, steps=3)
    m = copy.deepcopy(base)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    assert_bitwise(ref, train(m, _batch, rt, steps=3))
    assert {s.peak_activation_bytes for s in rt.report().steps} == {7 * TENSOR}
    m = copy.deepcopy(base)
    rt = offrecomp.runtime(m, mode="auto", budget=1, min_bytes=0)
    train(m, _batch, rt, steps=6)
    planned = [s for s in rt.report().steps if s.phase == "planned"]
    assert planned and all(s.peak_activation_bytes == s.predicted_peak_bytes for s in planned), planned
