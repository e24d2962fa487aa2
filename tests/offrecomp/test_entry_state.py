"""A replay reads everything its call read as it was at the call's entry: inputs the
forward wrote and sent to host memory, buffers rebound or written before the backward,
arguments aliasing the region's own state."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp import Placement, Plan
from tests import models
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


class _ReadsATable(nn.Module):
    """Adds a buffer to its input: the add saves nothing, the linear after it saves the
    sum, which a replay recomputes from the buffer."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.fc = nn.Linear(numel // 64, numel // 64)
        self.register_buffer("table", torch.rand(64, numel // 64) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x + self.table)) + x


def _table_grads(model: nn.Module, change: str, rt: offrecomp.Runtime | None = None) -> list[torch.Tensor]:
    x = torch.randn(64, model.blocks[0].fc.in_features, generator=torch.Generator().manual_seed(0))
    with rt if rt is not None else contextlib.nullcontext():
        loss = model(x)
        for b in model.blocks:
            if change == "rebind":
                b.table.data = b.table.data * 2.0
            elif change == "rebind_strided":  # another geometry too
                b.table.data = (b.table.data * 2.0).t().contiguous().t()
            else:
                b.table.add_(1.0)
        loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("numel", [32 << 10, 512 << 10], ids=["128KiB", "2MiB"])
@pytest.mark.parametrize("change", ["rebind", "rebind_strided"])
# auto_measure: auto's measuring pass (one pass, no budget: it never plans, so it never serves)
@pytest.mark.parametrize("variant", ["recompute", "auto_measure"])
def test_a_large_buffer_rebound_through_data_before_the_backward_replays_as_read(
    numel: int, change: str, variant: str
) -> None:
    """NOTE [Replay and buffer slots]: ``buffer.data = other`` between a forward and its
    backward moves no version; over READ_SNAPSHOT_MAX_BYTES no snapshot holds the values
    the forward read, so the call holds the buffer's storage at entry and the replay
    reads it: plain's gradients (plain saved the sum), the new values in the slot after."""
    torch.manual_seed(0)
    base = models.Stack([_ReadsATable(numel) for _ in range(2)])
    ref = _table_grads(twin(base), change)
    m = twin(base)
    rt = offrecomp.runtime(m, mode="recompute" if variant == "recompute" else "auto", min_bytes=0)
    got = _table_grads(m, change, rt)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert rt.report().steps[-1].replays > 0
    b = m.blocks[0]
    assert torch.equal(b.table, 2.0 * twin(base).blocks[0].table)  # the new values stay


@pytest.mark.parametrize("numel", [32 << 10, 512 << 10], ids=["128KiB", "2MiB"])
def test_a_large_buffer_written_in_place_before_the_backward_stops_a_replay_reading_it(numel: int) -> None:
    """A buffer over READ_SNAPSHOT_MAX_BYTES written in place between a forward and its
    backward: no copy holds what the forward read, so a replay reading it raises, naming
    it (plain autograd, which saved the sum, trains on)."""
    torch.manual_seed(0)
    m = models.Stack([_ReadsATable(numel) for _ in range(2)])
    with pytest.raises(RuntimeError, match=r"buffer 'table' of _ReadsATable \(version \d+ -> \d+\) in region 'blocks\.1'"):
        _table_grads(m, "inplace", offrecomp.runtime(m, mode="recompute", min_bytes=0))


@dataclasses.dataclass
class _State:
    hs: tuple[torch.Tensor, ...]


@dataclasses.dataclass
class _Shared:
    """Two containers of one tuple: itself, and an object it holds."""

    a: _State
    hs: tuple[torch.Tensor, ...]


class _Aliasing(nn.Module):
    """A block whose arguments alias state it reaches otherwise (``how``)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.how = how

    def forward(self, x: torch.Tensor, other: Any) -> torch.Tensor:
        how = self.how
        if how == "param_is":  # its own parameter as an argument, branched on by identity
            return torch.tanh(self.fc(x) * (1.0 if other is self.fc.weight else 0.5)) + x @ other.t()
        if how == "param_write":  # written through the argument, read through the slot
            with torch.no_grad():
                other.mul_(0.9)
            return torch.tanh(self.fc(x)) + x
        if how == "tuple_is":  # a tuple an argument object holds: the tensor argument
            return torch.tanh(self.fc(x) * (1.0 if other.hs[0] is x else 0.5)) + x
        if how == "tuple_named":
            return torch.tanh(self.fc(x) * (1.0 if other.hs.a is x and other.hs.b[0] is x else 0.5)) + x
        if how == "tuple_shared":  # one tuple in two containers, each read
            return torch.tanh(self.fc(x) * (1.0 if other.a.hs[0] is x and other.hs[0] is x else 0.5)) + x
        x.mul_(2.0)  # mixed dtypes, conjugate: one storage, the float input written
        if how == "mixed_dtype":
            return torch.tanh(self.fc(x)) + (other & 1).float()
        return torch.tanh(self.fc(torch.view_as_real(other.resolve_conj()).flatten(-2)[..., :16]))


_Pair = collections.namedtuple("_Pair", ["a", "b"])


class _AliasingNet(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.inp = nn.Linear(16, 16)
        self.blocks = nn.ModuleList(_Aliasing(how) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = x * 1.0
            if self.how.startswith("param"):
                x = b(x, b.fc.weight)
            elif self.how == "tuple_is":
                x = b(x, _State(hs=(x,)))
            elif self.how == "tuple_named":
                x = b(x, _State(hs=_Pair(x, (x, x))))
            elif self.how == "tuple_shared":
                hs = (x,)
                x = b(x, _Shared(a=_State(hs=hs), hs=hs))
            elif self.how == "mixed_dtype":
                x = b(x, x.view(torch.int32))
            else:
                z = torch.complex(x, 0.5 * x)
                x = b(z, z.conj())
        return x.square().mean()


@pytest.mark.parametrize(
    "how", ["param_is", "param_write", "tuple_is", "tuple_named", "tuple_shared", "mixed_dtype", "conj_write"]
)
# auto_measure: auto's measuring and calibrating passes (two steps, no budget: no plan runs)
@pytest.mark.parametrize("variant", ["recompute", "auto_measure"])
def test_arguments_aliasing_the_regions_state_replay_as_in_the_forward(how: str, variant: str) -> None:
    """NOTE [Aliased arguments]: a region's own parameter as an argument is the slot's
    tensor in the replay; a tuple an argument object holds binds the replay's tensor
    arguments; inputs of one storage in several dtypes, or a conjugate view, written in
    place replay on one storage, none a leaf that autograd would refuse to write."""
    torch.manual_seed(0)
    base = _AliasingNet(how)
    ref = train(twin(base), _batch, steps=2)
    m = twin(base)
    rt = offrecomp.runtime(m, mode="recompute" if variant == "recompute" else "auto", min_bytes=0)
    assert_bitwise(ref, train(m, _batch, rt, steps=2))
    assert rt.report().steps[0].replays > 0


class _PruneBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def _prune_run(mode: str | None, change: str) -> list[Any]:
    """Three steps of three blocks; between the second step's forward and its backward the
    middle block's Linear is pruned (``prune``) or its pruning removed (``remove``,
    pruned before the runtime): its parameter names after each step and the gradients."""
    from torch.nn.utils import prune

    torch.manual_seed(0)
    m = nn.Sequential(*(_PruneBlock() for _ in range(3)))
    fc = m[1].fc
    if change == "remove":
        prune.l1_unstructured(fc, "weight", amount=0.5)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0) if mode else contextlib.nullcontext()
    seen: list[Any] = []
    with rt:
        for step in range(3):
            loss = m(_batch(step)).square().sum()
            if step == 1:
                if change == "prune":
                    prune.l1_unstructured(fc, "weight", amount=0.5)
                else:
                    prune.remove(fc, "weight")
            loss.backward()
            seen.append(sorted(fc._parameters))
            seen += [p.grad.clone() for p in m.parameters() if p.grad is not None]
            m.zero_grad()
    return seen


@pytest.mark.parametrize("mode", ["keep", "recompute", "auto"])
@pytest.mark.parametrize("change", ["prune", "remove"])
def test_a_layer_pruned_between_a_forward_and_its_backward_replays_as_its_forward_ran(mode: str, change: str) -> None:
    """NOTE [Parameter tables changed since the forward] (replay_state.py): pruning moves
    ``weight`` to ``weight_orig`` and sets a plain ``weight`` attribute; its removal does
    the reverse. Done between a forward and its backward, a replay read the pruned
    attribute (or ran the prune pre-hook over a Parameter, a TypeError in backward) and
    left ``'weight': None`` in the table, which broke the next forward. The replay runs
    with the tables as at entry and leaves them as the loop set them."""
    ref, got = _prune_run(None, change), _prune_run(mode, change)
    assert len(ref) == len(got)
    for a, b in zip(ref, got):
        assert a == b if isinstance(a, list) else torch.equal(a, b), (a, b)


class _TwoLayerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc2(torch.tanh(self.fc1(x))))


def test_a_parametrization_registered_between_a_forward_and_its_backward_is_named() -> None:
    """NOTE [Parameter tables changed since the forward]: a parametrization registered
    on a parameter of a region between the forward and its backward makes the name a
    property a replay cannot give the forward's tensor: an error names it, before any
    table was changed, so a layer of the block pruned meanwhile keeps the loop's table
    and the next forward runs."""
    from torch.nn.utils import prune

    torch.manual_seed(0)
    m = nn.Sequential(*(_TwoLayerBlock() for _ in range(3)))
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        loss = m(_batch(0)).square().sum()
        prune.l1_unstructured(m[1].fc1, "weight", amount=0.5)
        nn.utils.parametrizations.orthogonal(m[1].fc2, "weight")
        with pytest.raises(RuntimeError, match="parameter 'weight' of ParametrizedLinear became a property"):
            loss.backward()
        assert sorted(m[1].fc1._parameters) == ["bias", "weight_orig"] and "weight" in m[1].fc1.__dict__
        m(_batch(1)).square().sum().backward()
