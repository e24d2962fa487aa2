"""Replays run with the attributes their forward read, whatever changed them since
(NOTE [Attributes at entry] in offrecomp/attr_tables.py): gradients bitwise equal to a
plain run, and the attributes left as the loop left them."""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp

MODES = ["recompute", "auto"]


def _batch(step: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(step))


def _compare(model: nn.Module, mode: str, step: Callable[[nn.Module, int], torch.Tensor], steps: int = 4,
             state: Callable[[nn.Module], Any] = lambda m: None) -> None:
    """Train ``model`` plainly and a copy under the runtime; every step's gradients
    bitwise equal, and ``state`` of the two models equal after each step."""
    plain, managed = copy.deepcopy(model), copy.deepcopy(model)
    kw: dict[str, Any] = {"budget": 1} if mode == "auto" else {}
    with offrecomp.runtime(managed, mode=mode, min_bytes=0, **kw) as rt:
        for i in range(steps):
            for m in (plain, managed):
                m.zero_grad()
                step(m, i).backward()
            for (name, a), b in zip(plain.named_parameters(), managed.parameters()):
                assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad), (i, name)
            assert state(plain) == state(managed), i
    assert sum(s.replays for s in rt.report().steps) > 0


class _Scaled(nn.Module):
    """A LoRA-like block: its scale lives in a dict, as PEFT's ``scaling``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.scaling = {"default": 1.0}
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x) * self.scaling["default"] * self.scale)


class _ScalesItsBlocks(nn.Module):
    """Scales its blocks at its entry and back in a ``finally`` (diffusers'
    ``scale_lora_layers`` / ``unscale_lora_layers``): in place in a dict, and by
    rebinding a float."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Scaled() for _ in range(3))

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        for b in self.blocks:
            b.scaling["default"] *= scale
            b.scale = b.scale * scale
        try:
            for b in self.blocks:
                x = b(x)
            return x.square().mean()
        finally:
            for b in self.blocks:
                b.scaling["default"] /= scale
                b.scale = b.scale / scale


@pytest.mark.parametrize("mode", MODES)
def test_attributes_a_parent_sets_around_its_blocks(mode: str) -> None:
    torch.manual_seed(0)
    _compare(
        _ScalesItsBlocks(), mode, lambda m, i: m(_batch(i, 8, 16), scale=0.5),
        state=lambda m: [(b.scaling, b.scale) for b in m.blocks],
    )


class _Adapters(nn.Module):
    """Two adapters of one shape; ``active`` picks one (PEFT's ``set_adapter``)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(16, 16)
        self.adapters = nn.ModuleDict({"first": nn.Linear(16, 16), "second": nn.Linear(16, 16)})
        self.active = "first"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.base(x) + self.adapters[self.active](x))


@pytest.mark.parametrize("mode", MODES)
def test_an_adapter_switched_between_two_forwards_of_one_step(mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(_Adapters() for _ in range(3)))

    def step(m: nn.Module, i: int) -> torch.Tensor:
        losses = []
        for name in ("first", "second"):
            for b in m:
                b.active = name
            losses.append(m(_batch(i, 8, 16)).square().mean())
        return losses[0] + losses[1]

    _compare(model, mode, step, state=lambda m: [b.active for b in m])


class _Conditioned(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.ctx: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.ctx is not None
        return x + torch.tanh(self.fc(x) * self.ctx)


@pytest.mark.parametrize("mode", MODES)
def test_a_tensor_the_loop_binds_before_each_call_with_two_forwards_in_flight(mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(_Conditioned() for _ in range(2)))

    def step(m: nn.Module, i: int) -> torch.Tensor:
        losses = []
        for k in range(2):  # two micro-batches, then their backwards
            ctx = _batch(10 * i + k, 8, 16)
            x = _batch(100 * i + k, 8, 16)
            for b in m:
                b.ctx = ctx
                x = b(x)
            losses.append(x.square().sum())
        return losses[0] + losses[1]

    _compare(model, mode, step)


_STEP = [0]


class _Scheduled(nn.Module):
    """Sets its temperature from a schedule, first at step 3, only outside a replay (as
    docs/reliability.md advises)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.tau = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x) * self.tau)
        if not offrecomp.in_replay() and _STEP[0] >= 3:
            self.tau = 1.0 / (1 + _STEP[0])
        return x + h * self.tau


@pytest.mark.parametrize("mode", MODES)
def test_an_attribute_the_forward_first_changes_in_a_later_step(mode: str) -> None:
    torch.manual_seed(0)

    def step(m: nn.Module, i: int) -> torch.Tensor:
        _STEP[0] = i
        return m(_batch(i, 2, 8)).square().sum()

    _compare(nn.Sequential(*(_Scheduled() for _ in range(2))), mode, step, steps=6,
             state=lambda m: [b.tau for b in m])


class _StashBlock(nn.Module):
    """The first block stashes a tensor in a dict all blocks hold, later blocks read it:
    a replay of the first block must find the dict as it was at its entry."""

    def __init__(self, shared: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.shared = shared
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.shared.get("first")
        if first is None:
            self.shared["first"] = x * 2
            return x + torch.tanh(self.fc(x))
        return x + torch.tanh(self.fc(x + first))


class _StashModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared: dict[str, torch.Tensor] = {}
        self.blocks = nn.ModuleList(_StashBlock(self.shared) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.shared.clear()
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


@pytest.mark.parametrize("mode", MODES)
def test_a_dict_the_blocks_share_filled_by_the_first(mode: str) -> None:
    torch.manual_seed(0)
    _compare(_StashModel(), mode, lambda m, i: m(_batch(i, 4, 16)), state=lambda m: sorted(m.shared))


def test_unchanged_tables_are_shared_between_calls() -> None:
    """Steady state: a call whose modules' tables are the region's last shares them."""
    torch.manual_seed(0)
    model = nn.Sequential(*(_Scaled() for _ in range(2)))
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        for i in range(3):
            model(_batch(i, 4, 16)).sum().backward()
        region = rt._regions[0]
        before = region.attr_tables
        model(_batch(9, 4, 16)).sum().backward()
        assert before is not None and region.attr_tables is before
        model[0].scale = 2.0  # rebound: read anew
        model(_batch(9, 4, 16)).sum().backward()
        assert region.attr_tables is not before


class _Counts(nn.Module):
    """Counts its calls in a container of the standard library's, and scales by the count."""

    def __init__(self, counts: Any) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.counts = counts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.counts["calls"] += 1
        return x + torch.tanh(self.fc(x)) * self.counts["calls"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "make", [collections.defaultdict, collections.OrderedDict, collections.Counter], ids=lambda f: f.__name__
)
def test_a_forward_counting_in_a_defaultdict_ordereddict_or_counter(mode: str, make: Callable[..., Any]) -> None:
    """A dict subclass of the standard library's is copied at entry and put back around a
    replay, as a plain dict is; left alone, a replay would read the forward's exit count
    (and its own increment would leak into the next forward), gradients silently off from
    the second step."""

    def counts() -> Any:
        c = make(int) if make is collections.defaultdict else make()
        c["calls"] = 0
        return c

    torch.manual_seed(0)
    model = nn.Sequential(*[_Counts(counts()) for _ in range(3)])
    _compare(model, mode, lambda m, i: m(_batch(i, 4, 16)).pow(2).sum(),
             state=lambda m: [dict(b.counts) for b in m])
