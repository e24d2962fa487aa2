"""Regions that draw from Python's ``random`` or numpy's global RNG (NOTE [Host random
states] in offrecomp/calls.py): a replay draws what its forward drew, and leaves the
caller's states as it found them."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

import offrecomp
from tests import models
from tests.helpers import check_variant

VARIANTS = ["recompute", "auto_tight", "auto_serve"]


def _batch(s: int) -> torch.Tensor:
    return torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(s))


class _PyScale(nn.Module):
    """Scales its branch by a draw from Python's ``random``: the same ops in a replay,
    other values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x) * (0.5 + random.random()))


class _NumpyNoise(nn.Module):
    """Adds noise drawn from numpy's global RNG, a tensor made without an op."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.from_numpy(np.random.rand(*x.shape).astype(np.float32))
        return x + torch.tanh(self.fc(x)) * noise


class _PyLayerDrop(nn.Module):
    """Skips its branch on a draw from Python's ``random`` (layer dropout inside the
    block): a replay that drew another value would run other ops."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 32)
        self.fc2 = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if random.random() < 0.5:
            return x + h
        return x + torch.tanh(self.fc2(h)) * h


class _Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


@pytest.mark.parametrize("block", [_PyScale, _NumpyNoise, _PyLayerDrop])
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_replay_draws_what_its_forward_drew_from_host_random_states(variant: str, block: type) -> None:
    torch.manual_seed(0)
    # a block dropped on a draw saves other tensors from call to call: auto measures again
    check_variant(models.Stack([block() for _ in range(3)]), _batch, variant, stable=block is not _PyLayerDrop)


@pytest.mark.parametrize("block", [_PyScale, _NumpyNoise])
def test_replays_leave_the_callers_host_random_states_as_a_plain_step_does(block: type) -> None:
    """After a step whose backward replayed every block, the loop's next draws from
    ``random`` and numpy are those of a plain step."""

    def step(model: nn.Module) -> tuple[float, float]:
        random.seed(5)
        np.random.seed(5)
        torch.manual_seed(5)
        model(_batch(0)).backward()
        return random.random(), float(np.random.rand())

    torch.manual_seed(0)
    model = models.Stack([block() for _ in range(3)])
    plain = step(model)
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        got = step(model)
    assert rt.report().steps[-1].replays > 0
    assert got == plain


@pytest.mark.parametrize(("block", "kinds"), [(_Plain, 0), (_PyScale, 1), (_NumpyNoise, 2)])
def test_only_a_region_seen_drawing_from_host_states_captures_them(block: type, kinds: int) -> None:
    """Their capture costs about 10 us for ``random`` and 40 us for numpy per call: a
    region's first call tells which it draws from."""
    torch.manual_seed(0)
    model = models.Stack([block() for _ in range(3)])
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        for s in range(2):
            model(_batch(s)).backward()
    assert [r.host_rng for r in rt._regions] == [kinds] * 3
