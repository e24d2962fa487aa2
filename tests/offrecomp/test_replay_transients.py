"""NOTE [Replay transients] and NOTE [Forward transients] (scheduler/working_set.py): the
recorder measures what a region's forward holds beyond its saves, and a plan under a
budget keeps the allocator within it, forwards and replays included. The allocator's peak is compared less what a plain step
holds at its peak beyond its saves (its gradients, the loss's backward)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
from tests import models
from tests.helpers import assert_bitwise, train
from tests.offrecomp.test_memory import allocator_peak

ROWS, D, PAIRS = 32, 64, 40
TENSOR = ROWS * D * 4  # the bytes of one block input
PRODUCT = ROWS * D * PAIRS * 4  # the outer product no op saves: 40 tensors


class _GateBlock(nn.Module):
    """A gate from an outer product of the block's first result with its first columns,
    summed away at once (no op saves the product, nor does the backward make one like
    it), then a chain of sines saving a tensor each. A replay reaching a sine makes the
    product again."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        c = h.detach()
        g = (c.unsqueeze(-1) * c[:, :PAIRS].unsqueeze(-2)).sum(-1)
        h = h * torch.sigmoid(g)
        for _ in range(12):
            h = torch.sin(h)
        return h


class _GateChain(nn.Module):
    """Six blocks, then cosines outside them saving more than the product: a plain
    step's peak, at its forward's end, lies above every point its forward held a
    product, so what it holds there beyond its saves is a few tensors, as a GPT's last
    layers put a plain step's peak past its attention's temporaries."""

    def __init__(self, n: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_GateBlock() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 1.0
        for b in self.blocks:
            x = b(x)
        for _ in range(30):
            x = torch.cos(x)
        return x.square().sum()


class _LateBlock(nn.Module):
    """Twelve sines saving a tensor each, then the outer product of ``_GateBlock`` late in
    the forward: every save but the last two made when the product is."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        for _ in range(12):
            h = torch.sin(h)
        c = h.detach()
        g = (c.unsqueeze(-1) * c[:, :PAIRS].unsqueeze(-2)).sum(-1)
        return h * torch.sigmoid(g)


class _Chain(nn.Module):
    """``n`` blocks in turn, the loss in float32 (``.float()`` is the tensor itself where
    it is one already)."""

    def __init__(self, block: Callable[[], nn.Module], n: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(block() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.float().square().sum()


def _late_chain() -> _Chain:
    """Six late blocks: a plain step's peak is the last block's product, in its forward."""
    return _Chain(_LateBlock)


class _CastBlock(nn.Module):
    """A wide Linear on few rows: under bf16 autocast its weight's cast (128 KiB), which
    the matmul saves, is most of what the block saves; the sine's input is what a replay
    frees for certain (the tanh's output is the next block's input, which it saves)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4 * D, 4 * D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.sin(self.lin(x)))


def _cast_chain() -> _Chain:
    return _Chain(_CastBlock)


def _batch(s: int) -> torch.Tensor:
    return torch.randn(ROWS, D, generator=torch.Generator().manual_seed(s))


def _tokens(s: int) -> torch.Tensor:
    return torch.randint(0, 64, (4, 64), generator=torch.Generator().manual_seed(1000 + s))


def _step(model: nn.Module, x: torch.Tensor, bf16: bool = False) -> Callable[[], None]:
    def run() -> None:
        torch.manual_seed(1)
        if bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float()
        else:
            loss = model(x)
        loss.backward()

    return run


def _plain_saved(model: nn.Module, x: torch.Tensor, bf16: bool = False) -> int:
    """Bytes of the distinct storages a plain step saves (parameters aside)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, nn.Parameter) and not isinstance(t._base, nn.Parameter):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _step(copy.deepcopy(model), x, bf16)()
    return sum(seen.values())


def _warm(model: nn.Module) -> nn.Module:
    m = copy.deepcopy(model)
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    return m


def _peaks(model: nn.Module, x: torch.Tensor, frac: float, bf16: bool = False) -> tuple[int, int, Any]:
    """(a plain step's saves, the allocator's peak of a step of auto at ``frac`` of them
    less a plain step's overhead beyond its saves, that step's record)."""
    plain = _warm(model)
    for _ in range(3):
        _step(plain, x, bf16)()
    saved = _plain_saved(model, x, bf16)
    overhead = allocator_peak(_step(plain, x, bf16)) - saved
    m = _warm(model)
    with offrecomp.runtime(m, mode="auto", budget=int(frac * saved), min_bytes=0, drift=100.0) as rt:
        for _ in range(5):
            _step(m, x, bf16)()
        peak = allocator_peak(_step(m, x, bf16))
    step = rt.report().steps[-1]
    assert step.phase == "planned" and step.replays > 0, step
    return saved, peak - overhead, step


def test_the_recorder_measures_the_outer_product_no_op_saves() -> None:
    """The profile's ops carry the bytes alive beyond the saves: the outer product from
    the op making it until the sum has reduced it."""
    torch.manual_seed(0)
    m = _GateChain()
    with offrecomp.runtime(m, mode="auto", budget=1, min_bytes=0) as rt:
        for _ in range(2):
            _step(m, _batch(0))()
    entry = rt.planner.last_entry
    assert entry is not None and entry.profile is not None
    ops = entry.profile.regions[1].ops
    mul = [op.name for op in ops].index("aten.mul.Tensor")
    assert ops[mul + 1].name == "aten.sum.dim_IntList"
    assert ops[mul].transient_bytes >= PRODUCT and ops[mul + 1].transient_bytes >= PRODUCT
    assert all(op.transient_bytes < PRODUCT for op in ops[mul + 2 :]), [op.transient_bytes for op in ops]


@pytest.mark.parametrize("frac", [0.35, 0.47])
def test_the_allocator_stays_within_what_auto_plans_through_replays(frac: float) -> None:
    """A block saves 14 tensors, and its replay, reaching a dropped sine, makes the
    product of 40 more, which a plain step's backward never holds. Counted, the
    allocator's peak stays within the budget where the plan meets it (0.47 of a plain
    step's saves), and within the predicted peak of the most frugal plan where it cannot
    (0.35, where leaving the replays' products out predicted 0.97x the budget and the
    allocator held 1.19x), with the books beside the prediction."""
    torch.manual_seed(0)
    saved, held, step = _peaks(_GateChain(), _batch(0), frac)
    budget = int(frac * saved)
    predicted = step.predicted_peak_bytes
    assert predicted is not None and step.peak_activation_bytes <= max(budget, predicted), step
    assert held <= 1.02 * max(budget, predicted), (held, budget, predicted, held / budget)
    if frac > 0.4:
        assert predicted <= budget, (predicted, budget)


def test_a_bf16_gpt_under_auto_stays_within_its_budget_through_its_attention_replays() -> None:
    """Under bf16 autocast on the CPU, scaled_dot_product_attention's math path makes
    the scores and probabilities in float (0.5-0.9 MB a block here) that no op saves. At
    0.3 of a plain step's saves, leaving them out held the allocator at 1.05-1.21x the
    budget during a replay; counted, within it. Plans follow measured times, and on a
    loaded host some keep the last block nearly whole, with their peak in its forward:
    there the forward's own temporaries and the earlier blocks' weight casts, which
    autocast's cache keeps though the plan drops them, count too (NOTE [Forward
    transients]; left out, 1.07-1.15x in about one run in three)."""
    torch.manual_seed(0)
    model = models.GPT(layers=4, h=64, heads=4, p=0.1)
    saved, held, step = _peaks(model, _tokens(0), 0.3, bf16=True)
    budget = int(0.3 * saved)
    assert step.peak_activation_bytes <= budget, (step.peak_activation_bytes, budget)
    assert held <= 1.03 * budget, (held, budget, held / budget)


def test_a_forward_making_its_largest_temporary_late_stays_within_the_budget() -> None:
    """NOTE [Forward transients]: the budget lets a plan keep every save and half the
    product beside them. Counting the saves only, the plan kept all and the allocator
    held a plain step's peak, 1.18x the budget, inside the last block's forward;
    counted, the plan drops what the product needs and the allocator's peak (the
    step's own, no overhead taken off: the forward's is the step's) stays within the
    budget, with the books at the prediction."""
    torch.manual_seed(0)
    model, x = _late_chain(), _batch(0)
    budget = _plain_saved(model, x) + PRODUCT // 2
    m = _warm(model)
    with offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0, drift=100.0) as rt:
        for _ in range(5):
            _step(m, x)()
        peak = allocator_peak(_step(m, x))
    step = rt.report().steps[-1]
    assert step.phase == "planned", step
    assert peak <= budget, (peak, budget, peak / budget)
    assert step.predicted_peak_bytes == step.peak_activation_bytes <= budget, step


def test_weight_casts_autocast_caches_count_until_the_forward_ends_where_a_plan_drops_them() -> None:
    """NOTE [Forward transients]: autocast's cache holds each weight's bf16 cast until
    autocast exits, so a plan dropping the casts frees none of them before the forward
    ends. Counted as the dropped saves they are, the plan predicted (and the books said)
    0.99x the budget while the allocator held 1.24x; counted as held to the forward's
    end, the books equal the prediction, which says the budget cannot be met here (the
    last block's forward holds every block's cast), and the allocator stays within it."""
    torch.manual_seed(0)
    model, x = _cast_chain(), torch.randn(16, 4 * D, generator=torch.Generator().manual_seed(0))
    plain = _warm(model)
    for _ in range(3):
        _step(plain, x, True)()
    saved = _plain_saved(model, x, True)
    overhead = allocator_peak(_step(plain, x, True)) - saved
    budget = int(0.7 * saved)
    m = _warm(model)
    with offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0, drift=100.0) as rt:
        for _ in range(5):
            _step(m, x, True)()
        held = allocator_peak(_step(m, x, True)) - overhead
    step = rt.report().steps[-1]
    assert step.phase == "planned" and step.replays > 0, step
    predicted = step.predicted_peak_bytes
    assert predicted is not None and step.peak_activation_bytes == predicted > budget, (step, budget)
    assert held <= 1.03 * predicted, (held, budget, predicted, held / budget)


def test_gradients_stay_bitwise_under_a_plan_counting_transients() -> None:
    torch.manual_seed(0)
    base = _GateChain()
    ref = train(copy.deepcopy(base), _batch, steps=6)
    m = copy.deepcopy(base)
    budget = int(0.47 * _plain_saved(base, _batch(0)))
    assert_bitwise(ref, train(m, _batch, offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0), steps=6))


def test_gradients_stay_bitwise_under_a_plan_counting_forward_transients() -> None:
    torch.manual_seed(0)
    base = _late_chain()
    ref = train(copy.deepcopy(base), _batch, steps=6)
    m = copy.deepcopy(base)
    budget = _plain_saved(base, _batch(0)) + PRODUCT // 2
    assert_bitwise(ref, train(m, _batch, offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0), steps=6))
