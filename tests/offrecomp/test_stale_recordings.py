"""NOTE [Stale recordings] (offrecomp/regenerate.py): a signature's op recording no longer
describes its forward (state changed between steps, another layout at the same sizes);
replays under the dispatch mode then replay plainly, bitwise equal to plain."""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from tests.helpers import assert_bitwise, settled_phases, tight_budget, variant_runtime
from tests.models import Stack


class _DropNormBlock(nn.Module):
    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(h, 4 * h)
        self.norm = nn.BatchNorm1d(4 * h)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = self.norm(h.flatten(0, 1)).view_as(h)
        return x + self.fc2(self.drop(F.gelu(h)))


class _ConvBlock(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.BatchNorm2d(c)
        self.mix = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.conv(x)))
        return x + self.mix(torch.sin(h) * h)


Mutate = Callable[[Stack, int], None]


def _loop(
    model: Stack, batch: Callable[[int], torch.Tensor], rt: Any, mutate: Mutate, steps: int = 7
) -> list[dict[str, torch.Tensor]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    with rt if rt is not None else contextlib.nullcontext():
        for step in range(steps):
            mutate(model, step)
            torch.manual_seed(step)
            model(batch(step)).backward()
            snap = {f"grad.{n}": p.grad.clone() for n, p in model.named_parameters()}
            snap.update({f"buf.{n}": b.clone() for n, b in model.named_buffers()})
            out.append(snap)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return out


def _check(model: Stack, batch: Callable[[int], torch.Tensor], mutate: Mutate, share: float = 0.5) -> Any:
    """Plain against auto with every replay under the dispatch mode (``replay_op_us=0``)
    under ``share`` of keep's peak; returns the runtime."""
    ref = _loop(copy.deepcopy(model), batch, None, mutate)
    budget = int(2 * share * tight_budget(model, batch))
    m = copy.deepcopy(model)
    rt = variant_runtime(m, "auto_serve", budget)
    assert_bitwise(ref, _loop(m, batch, rt, mutate))
    assert rt.report().steps[-1].recomputed_bytes > 0
    return rt


def _change(what: str) -> Mutate:
    handles: list[Any] = []

    def mutate(model: Stack, step: int) -> None:
        for b in model.blocks:
            if what == "dropout":  # a dropout-rate schedule
                b.drop.p = 0.1 + 0.05 * step
            elif what == "momentum":
                b.norm.momentum = 0.1 + 0.1 * step
            elif step == 3 and what == "hook":  # a forward hook changing the layer's output
                handles.append(b.fc1.register_forward_hook(lambda m, i, o: torch.tanh(o)))
            elif step == 3 and what == "forward":  # the instance's forward rebound
                b.forward = types.MethodType(_silu_forward, b)
            elif what == "class":  # the block's class patched from step 3 (each run from its own)
                type(b).forward = _silu_forward if step >= 3 else _DropNormBlock.forward  # type: ignore[method-assign]

    return mutate


def _silu_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    h = self.fc1(x)
    h = self.norm(h.flatten(0, 1)).view_as(h)
    return x + self.fc2(self.drop(F.silu(h)))


@pytest.mark.parametrize("what", ["dropout", "momentum", "hook", "forward", "class"])
def test_state_changed_between_steps_replays_plainly(what: str, caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Stale recordings] (regenerate.py): a dropout rate schedule, a momentum, a
    hook added, a block's forward rebound or its class patched between steps: serving
    replays diverging from the recording are redone plainly, the forward's code among
    the state compared (a forward patched raised ``ReplayDivergedError``)."""
    offrecomp.diagnostics.clear_warnings()
    torch.manual_seed(0)
    block = type("_PatchedBlock", (_DropNormBlock,), {}) if what == "class" else _DropNormBlock
    model = Stack([block() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 12, 16, generator=torch.Generator().manual_seed(s))

    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        _check(model, batch, _change(what))
    if what != "hook":  # hooked, its replays hand out no placeholders and serve nothing here:
        # they run plainly from the start (NOTE [Placeholders and hooks])
        assert "no longer runs the ops its measuring pass recorded" in caplog.text


@pytest.mark.parametrize("what", ["parameters", "input"])
def test_another_layout_at_the_same_sizes_replays_plainly(what: str, caplog: pytest.LogCaptureFixture) -> None:
    """Parameters moved to channels_last after the recording (the replay sees another
    layout, replays plainly and the signature measures again), or inputs whose layout
    alternates (a signature each)."""
    torch.manual_seed(0)
    model = Stack([_ConvBlock() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        x = torch.randn(4, 8, 10, 10, generator=torch.Generator().manual_seed(s))
        return x.contiguous(memory_format=torch.channels_last) if what == "input" and s % 2 else x

    def mutate(model: Stack, step: int) -> None:
        if what == "parameters" and step == 4:
            model.to(memory_format=torch.channels_last)

    with caplog.at_level(logging.INFO, logger="offrecomp"):
        rt = _check(model, batch, mutate)
    if what == "input":
        assert len(rt.planner.entries) == 2
    else:
        assert "its inputs, parameters or buffers have another layout than its recording" in caplog.text


class _LazyCacheBlock(nn.Module):
    """Builds a position table on its first call and keeps it in a plain attribute (or
    a dict of them by length, ``held``); later calls slice it: the measuring pass records
    the building call. The table is made by factory ops, or from a parameter."""

    def __init__(self, source: str, held: str = "attribute", h: int = 16) -> None:
        super().__init__()
        self.source = source
        self.held = held
        self.lin = nn.Linear(h, h)
        self.table: torch.Tensor | None = None
        self.tables: dict[int, torch.Tensor] = {}

    def _build(self) -> torch.Tensor:
        if self.source == "factory":
            return torch.arange(64, dtype=torch.float32).unsqueeze(1) / 64
        return self.lin.bias.detach().repeat(4).unsqueeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.held == "dict":
            if x.shape[1] not in self.tables:
                self.tables[x.shape[1]] = self._build()
            table = self.tables[x.shape[1]]
        else:
            if self.table is None:
                self.table = self._build()
            table = self.table
        h = self.lin(x) * torch.cos(table[: x.shape[1]])
        return x + torch.tanh(h)


@pytest.mark.parametrize("held", ["attribute", "dict"])
@pytest.mark.parametrize("source", ["factory", "parameter"])
def test_a_recording_of_a_call_that_built_its_cache(source: str, held: str) -> None:
    """The serving replay of a later call diverges from the recording (it slices where
    the recording built). A table of factory ops is a skipped build (NOTE [Skipped
    builds] in trace/structure.py); one computed from a parameter is not: the replay
    runs plainly and the signature measures again, also for a table kept in a dict the
    block holds (which raised ``ReplayDivergedError``). At 0.8 of keep's peak: below 0.71
    the most frugal plan drops the gate's cosine too, and its replays run every op, under
    no dispatch mode (a replay holds the Linear's output and its gated product beside the
    tanh's it brings back, NOTE [Replay transients] in scheduler/working_set.py)."""
    torch.manual_seed(0)
    model = Stack([_LazyCacheBlock(source, held) for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(s))

    rt = _check(model, batch, lambda m, s: None, share=0.8)
    phases = settled_phases(rt.report().steps)
    if source == "factory":
        assert phases == ["measure", "calibrate"] + ["planned"] * (len(phases) - 2) and len(phases) >= 5, phases
    else:
        assert phases[:5] == ["measure", "calibrate", "planned", "measure", "calibrate"]


@pytest.mark.parametrize("batches", ["one_size", "sizes_varying"])
def test_micro_batches_sliced_from_one_batch_replay_as_recorded(batches: str, caplog: pytest.LogCaptureFixture) -> None:
    """Gradient accumulation over slices of one batch: each micro-batch's input has
    another storage offset, which no served output depends on, so the signature plans
    and its replays serve (NOTE [Stale recordings]); also when the batch they are sliced
    from has another size each step (NOTE [Region inputs of another storage size])."""
    torch.manual_seed(0)
    model = Stack([_DropNormBlock() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        rows = 8 + 4 * (s % 2) if batches == "sizes_varying" else 8
        return torch.randn(rows, 12, 16, generator=torch.Generator().manual_seed(s))

    def loop(m: Stack, rt: Any) -> list[dict[str, torch.Tensor]]:
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            for step in range(6):
                torch.manual_seed(step)
                x = batch(step)
                with rt.step() if rt is not None else contextlib.nullcontext():
                    for k in range(2):
                        m(x[4 * k : 4 * (k + 1)]).backward()
                out.append({f"grad.{n}": p.grad.clone() for n, p in m.named_parameters()})
                m.zero_grad(set_to_none=True)
        return out

    ref = loop(copy.deepcopy(model), None)
    m = copy.deepcopy(model)
    rt = variant_runtime(m, "auto_serve", tight_budget(model, lambda s: batch(s)[:4]))
    assert_bitwise(ref, loop(m, rt))
    steps = rt.report().steps
    assert steps[-1].phase == "planned", [s.phases for s in steps]
    assert steps[-1].served_ops > 0 and steps[-1].recomputed_bytes > 0
    assert not any("saved other tensors" in r.getMessage() for r in caplog.records)


class _TwoInputBlock(nn.Module):
    def __init__(self, h: int = 64) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(h, h) / h**0.5)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = torch.sin(torch.sin(torch.matmul(a, self.w)))
        return a + torch.sin(d) * b, b


class _TwoInputModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_TwoInputBlock() for _ in range(2)])

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            a, b = blk(a, b)
        return a.square().mean()


def test_inputs_sharing_a_storage_in_some_passes_only_replay_plainly() -> None:
    """Inputs that are views of one tensor in one pass and separate tensors in the next
    (same sizes and strides): each input storage takes one storage index, so every index
    after them differs; the layout tells the passes apart and nothing is served from
    another storage (NOTE [Stale recordings])."""

    def inputs(step: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.randn(2, 8, 16, 64, generator=torch.Generator().manual_seed(100 * step + k))
        return (t[0], t[1].clone()) if k == 0 else (t[0], t[1])

    def loop(m: nn.Module, rt: Any) -> list[dict[str, torch.Tensor]]:
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            for step in range(4):
                torch.manual_seed(step)
                with rt.step() if rt is not None else contextlib.nullcontext():
                    for k in range(2):
                        m(*inputs(step, k)).backward()
                out.append({n: p.grad.clone() for n, p in m.named_parameters()})
                m.zero_grad(set_to_none=True)
        return out

    torch.manual_seed(0)
    model = _TwoInputModel()
    ref = loop(copy.deepcopy(model), None)
    probe = copy.deepcopy(model)
    keep = variant_runtime(probe, "keep")
    loop(probe, keep)
    budget = int(0.9 * keep.report().steps[0].peak_activation_bytes)
    m = copy.deepcopy(model)
    rt = variant_runtime(m, "auto_serve", budget)
    assert_bitwise(ref, loop(m, rt))
    assert rt.report().steps[-1].recomputed_bytes > 0


def _sgd_steps(
    m: nn.Module, rt: Any, steps: int, loss: Callable[[nn.Module, int], torch.Tensor]
) -> list[dict[str, torch.Tensor]]:
    """``steps`` SGD steps on ``loss(m, step)`` (inside ``rt`` unless None); the
    gradients of each."""
    out = []
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with rt if rt is not None else contextlib.nullcontext():
        for step in range(steps):
            loss(m, step).backward()
            out.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
            opt.step()
            opt.zero_grad(set_to_none=True)
    return out



def _plain_then_planned(
    model: nn.Module, loss: Callable[[nn.Module, int], torch.Tensor], steps: int, drop: dict[Any, Any]
) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]], Any]:
    """``steps`` SGD steps of a copy of ``model`` plainly, then of another under auto with
    every replay served (``replay_op_us=0``) and a plan dropping the storages ``drop``
    names (RECOMPUTE), keeping the rest: the gradients of both runs and the runtime."""
    from scheduler.plan import Placement, Plan

    ref = _sgd_steps(copy.deepcopy(model), None, steps, loss)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, replay_op_us=0)
    rt.set_plan(Plan(placements=drop, default=Placement.KEEP))
    return ref, _sgd_steps(m, rt, steps, loss), rt

class _Holder:
    def __init__(self, c: torch.Tensor) -> None:
        self.c = c


class _ScaledBlock(nn.Module):
    """``c * h`` takes its strides from ``c``, which reaches the block as a buffer, a
    module attribute or an argument object's attribute (``where``)."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.w = nn.Parameter(torch.randn(16, 16) / 4)
        self.ctx: torch.Tensor | None = None
        if where == "buffer":
            self.register_buffer("c", torch.linspace(-1, 1, 96).view(6, 16))

    def forward(self, x: torch.Tensor, holder: _Holder | None = None) -> torch.Tensor:
        c = self.c if self.where == "buffer" else self.ctx if self.where == "attribute" else holder.c  # type: ignore[union-attr]
        g = c * torch.sin(x @ self.w)
        return x + torch.exp(torch.cos(torch.sin(g)))


class _ScaledModel(nn.Module):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.blocks = nn.ModuleList(_ScaledBlock(where) for _ in range(3))
        self.restrided = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = torch.linspace(-1, 1, 96).view(6, 16)
        c = c.t().contiguous().t() if self.restrided else c
        for b in self.blocks:
            if self.where == "buffer":
                if self.restrided and b.c.is_contiguous():
                    b.c = b.c.t().contiguous().t()  # the same values, other strides
                x = b(x)
            elif self.where == "attribute":
                b.ctx = c
                x = b(x)
            else:
                x = b(x, _Holder(c))
        return x.square().mean()


@pytest.mark.parametrize("where", ["buffer", "attribute", "argument_object"])
def test_a_tensor_read_beside_the_inputs_restrided_between_steps(where: str) -> None:
    """A buffer (NOTE [Stale recordings]: its strides are part of the layout), or a
    tensor from a module attribute or an argument object (NOTE [Which ops replay runs]:
    no op its geometry may reach is served), of other strides from step 4: the op
    ``c * h`` makes its output in those strides, so serving it with the recorded ones
    would hand backward another tensor. A plan drops a storage of every block."""
    from scheduler.plan import Placement

    def loss(m: nn.Module, step: int) -> torch.Tensor:
        m.restrided = step >= 4
        return m(torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(step)))

    torch.manual_seed(0)
    drop = {(f"blocks.{i}", 0, 4): Placement.RECOMPUTE for i in range(3)}
    ref, got, rt = _plain_then_planned(_ScaledModel(where), loss, 8, drop)
    assert_bitwise(ref, got)
    steps = rt.report().steps
    assert all(s.recomputed_bytes > 0 for s in steps)
    assert steps[1].served_ops > 0  # what no such tensor reaches is still served


class _NoiseBlock(nn.Module):
    """Draws a mask from a generator passed in (``where="argument"``) or held in an
    attribute the loop assigns anew each step (``"attribute"``), and scales by a plain
    number argument."""

    def __init__(self, where: str, h: int = 32) -> None:
        super().__init__()
        self.where = where
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)
        self.gen: torch.Generator | None = None

    def forward(self, x: torch.Tensor, gen: torch.Generator, scale: float) -> torch.Tensor:
        u = F.gelu(self.fc1(x)) * scale
        g = gen if self.where == "argument" else self.gen
        mask = (torch.rand(u.shape, generator=g) > 0.2).to(u.dtype)
        return x + self.fc2(u * mask)


class _NoiseModel(nn.Module):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_NoiseBlock(where) for _ in range(3))

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(100 + step)  # a new generator each step
        for b in self.blocks:
            b.gen = gen
            x = b(x, gen, 1.0 + 0.1 * (step % 3))  # an annealed scale
        return x.square().mean()


@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
@pytest.mark.parametrize("where", ["argument", "attribute"])
def test_a_new_generator_and_other_plain_arguments_each_step(where: str, variant: str) -> None:
    """NOTE [Private generators]: a generator made each step, passed in or assigned to
    an attribute, has its state captured at entry, so a replay draws what the forward
    drew; plain arguments other than the recording's replay plainly (a serving replay
    would meet other scalars than recorded), NOTE [Stale recordings]."""

    def loss(m: nn.Module, step: int) -> torch.Tensor:
        return m(torch.randn(3, 8, 32, generator=torch.Generator().manual_seed(step)), step)

    def loop(m: nn.Module, rt: Any) -> list[dict[str, torch.Tensor]]:
        return _sgd_steps(m, rt, 8, loss)

    torch.manual_seed(0)
    model = _NoiseModel(where)
    ref = loop(copy.deepcopy(model), None)
    probe = copy.deepcopy(model)
    keep = variant_runtime(probe, "keep")
    loop(probe, keep)
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, keep.report().steps[0].peak_activation_bytes // 2)
    assert_bitwise(ref, loop(m, rt))
    assert rt.report().steps[-1].recomputed_bytes > 0


class _AuxBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.w2 = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.a(x)  # storage 1, kept
        aux = h * self.w2  # saves h; the loss never reaches aux
        return x + self.b(torch.tanh(h)), h, aux  # tanh's output: storage 2, dropped


class _AuxModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_AuxBlock() for _ in range(2)])
        self.stash: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stash = []
        for b in self.blocks:
            x, h, aux = b(x)
            self.stash.append(aux)
            h.mul_(3.0)  # legal: the node that saved h never runs in backward
        return (x**2).mean()


def test_a_kept_storage_written_after_its_region_is_not_served_from() -> None:
    """NOTE [Served storages written since] (regenerate.py): the replay runs the op that
    made a kept storage written in place since, rather than rebuilding an output on its
    new bytes."""
    from scheduler.plan import Placement

    def loss(m: nn.Module, step: int) -> torch.Tensor:
        return m(torch.randn(4, 8, generator=torch.Generator().manual_seed(step)))

    torch.manual_seed(0)
    drop = {(f"blocks.{i}", 0, 2): Placement.RECOMPUTE for i in range(2)}
    ref, got, rt = _plain_then_planned(_AuxModel(), loss, 3, drop)
    assert_bitwise(ref, got)
    assert all(s.served_ops > 0 for s in rt.report().steps)


_MASKS: dict[int, torch.Tensor] = {}


@functools.lru_cache(maxsize=4)
def _lru_bias(n: int) -> torch.Tensor:
    return torch.full((n, n), float("-inf")).triu(1)


def _dict_bias(n: int) -> torch.Tensor:
    if n not in _MASKS:
        _MASKS[n] = torch.ones(n, n).tril().log()
    return _MASKS[n]


def _random_bias(n: int) -> torch.Tensor:
    if n not in _MASKS:
        _MASKS[n] = torch.rand(n, n)
    return _MASKS[n]


def _added_bias(n: int) -> torch.Tensor:
    """A build holding an op of the name of the op after it (an ``add``)."""
    if n not in _MASKS:
        _MASKS[n] = (torch.ones(n, n).tril() + 1e-9).log()
    return _MASKS[n]


def _sliced_bias(n: int) -> torch.Tensor:
    """A build holding the very slice, arguments and all, that every call takes of the
    cached table after it."""
    if n not in _MASKS:
        _MASKS[n] = torch.ones(2 * n, n)[:n].tril().log()
    return _MASKS[n][:n]


def _filled_bias(n: int) -> torch.Tensor:
    """A build whose first op is the op every call runs after it, with other arguments."""
    if n not in _MASKS:
        _MASKS[n] = torch.full((n, n), 2.0).tril()
    return _MASKS[n] - torch.full((n,), 1.0)


_BIASES = {
    "lru_cache": _lru_bias, "dict": _dict_bias, "random": _random_bias, "added": _added_bias,
    "sliced": _sliced_bias, "filled": _filled_bias,
}


class _CachedBiasBlock(nn.Module):
    """Attention whose bias comes from a cache outside the modules, built by the first
    call that needs it: the measuring pass records the build in blocks.0 only."""

    def __init__(self, bias: str, h: int = 16) -> None:
        super().__init__()
        self.bias = _BIASES[bias]
        self.f1 = nn.Linear(h, 4 * h)
        self.f2 = nn.Linear(4 * h, h)
        self.q = nn.Linear(h, h)
        self.k = nn.Linear(h, h)
        self.o = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sin(self.f2(torch.tanh(self.f1(x)) ** 2))
        q, k = self.q(h), self.k(h)
        att = torch.softmax(q @ k.transpose(-1, -2) + self.bias(x.shape[1]), -1)
        y = x + self.o(torch.tanh(att @ q))
        return y + torch.tanh(self.f2(torch.tanh(self.f1(y))))


def _bias_steps(bias: str) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]], Any]:
    """Plain, then auto under a plan that drops the last storages of every block and keeps
    the rest (every replay serves), each run with cold caches: the gradients of both and
    the runtime."""
    from scheduler.plan import Placement

    def loss(m: nn.Module, step: int) -> torch.Tensor:
        if step == 0:  # each run builds the bias in its first forward
            _lru_bias.cache_clear()
            _MASKS.clear()
        return m(torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(step)))

    torch.manual_seed(0)
    drop = {(f"blocks.{b}", 0, i): Placement.RECOMPUTE for b in range(3) for i in range(10, 14)}
    return _plain_then_planned(Stack([_CachedBiasBlock(bias) for _ in range(3)]), loss, 5, drop)


@pytest.mark.parametrize("bias", ["lru_cache", "dict", "added", "sliced", "filled"])
def test_a_tensor_cached_outside_the_modules_is_a_skipped_build(bias: str, caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Skipped builds]: serving replays of blocks.0 skip the recorded ops that built
    the bias, and match the ops after them, by name and non-tensor arguments: a build
    holding an ``add`` made the replay's ``add`` resume inside it, and diverge; a build
    holding the slice the replay takes of its table, arguments and all, made the replay
    resume at that slice and diverge at the op after it, raising; a build whose first op
    is the replay's op with other arguments raised; bitwise equal to plain."""
    with caplog.at_level(logging.INFO, logger="offrecomp.trace.serving"):
        ref, got, rt = _bias_steps(bias)
    assert_bitwise(ref, got)
    assert "they built a tensor its forward now takes from a cache" in caplog.text
    assert all(s.served_ops > 0 and s.recomputed_bytes > 0 for s in rt.report().steps[1:])


def test_a_cached_random_tensor_is_not_a_skipped_build() -> None:
    """A run of ops that draws random numbers is never skipped (the replay would draw
    others after it): the serving replay that misses it raises."""
    with pytest.raises(offrecomp.ReplayDivergedError, match=r"ran aten\.rand\.default, the replay ran"):
        _bias_steps("random")
