"""A function compiled by inductor, called inside an eager block: the buffers its code
allocates where no op shows it, and fills with ``out=`` ops, are the call's own scratch,
so the block recomputes; a tensor from outside the block that the compiled code writes
in place still keeps the block (NOTE [Storages no op made] in trace/recorder.py)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import shutil
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
import offrecomp.diagnostics
import offrecomp.replay_state
import offrecomp.trace.recorder
from tests import models
from tests.helpers import assert_bitwise, batch_on, tight_budget, train, train_bitwise

pytestmark = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")), reason="inductor on the CPU needs a C++ compiler"
)


def _mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def _advance(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    pos.add_(1.0)  # inductor writes it in its kernel, then bumps its version
    return torch.tanh(F.linear(x, w, b) + pos)


_COMPILED: dict[str, Callable[..., torch.Tensor]] = {}


def _compiled(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` compiled by inductor, once for every test (each compile builds C++)."""
    if fn.__name__ not in _COMPILED:
        _COMPILED[fn.__name__] = torch.compile(fn, backend="inductor")
    return _COMPILED[fn.__name__]


class _MlpBlock(nn.Module):
    """Calls a compiled MLP: its matmuls write ``out=`` buffers the compiled code made."""

    def __init__(self, fn: Callable[..., torch.Tensor], h: int = 16) -> None:
        super().__init__()
        self.fn = fn
        self.ln = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 2 * h)
        self.fc2 = nn.Linear(2 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln(x)
        return x + self.fn(y, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias) * y


class _AdvancingBlock(nn.Module):
    """Calls a compiled function that advances a plain tensor attribute (not a buffer)."""

    def __init__(self, fn: Callable[..., torch.Tensor], h: int = 16) -> None:
        super().__init__()
        self.fn = fn
        self.fc = nn.Linear(h, h)
        self.pos = torch.zeros(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fn(x, self.fc.weight, self.fc.bias, self.pos)


class _ReadAdvancedBlock(nn.Module):
    """Saves a tensor before a compiled function advances its plain tensor attribute, and
    saves it again after (``reads_pos``: that tensor is made from the attribute)."""

    def __init__(self, fn: Callable[..., torch.Tensor], reads_pos: bool, h: int = 16) -> None:
        super().__init__()
        self.fn = fn
        self.reads_pos = reads_pos
        self.fc = nn.Linear(h, h)
        self.pos = torch.zeros(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sin(x + self.pos) if self.reads_pos else torch.tanh(x)  # saved (dropped)
        z = self.fn(y, self.fc.weight, self.fc.bias, self.pos)  # the write, heard after it
        return x + z * y  # y saved again


class _LaterAdvancingBlock(nn.Module):
    """Advances its plain tensor attribute from the second step on (``advance``, set by
    the loop); the first call never touches it."""

    def __init__(self, fn: Callable[..., torch.Tensor], h: int = 16) -> None:
        super().__init__()
        self.fn = fn
        self.fc = nn.Linear(h, h)
        self.pos = torch.zeros(h)
        self.advance = False
        self.reads = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x)
        if self.reads and not self.advance:  # reads it, leaves it as it is
            return x + torch.tanh(F.linear(y, self.fc.weight, self.fc.bias) + self.pos) * y
        pos = self.pos if self.advance else torch.zeros(self.pos.shape)  # no op touches the attribute
        return x + self.fn(y, self.fc.weight, self.fc.bias, pos) * y


def _batch(s: int) -> torch.Tensor:
    return torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(s))


#: The CPU, and a GPU where there is one (inductor allocates with ``empty_strided_cuda``
#: there: NOTE [Storages no op made]).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _foreign_warnings(caplog: pytest.LogCaptureFixture) -> list[Any]:
    return [r for r in caplog.records if "neither owns nor takes" in r.getMessage()]


def _advanced_once_per_step(block: Callable[[Callable[..., torch.Tensor]], nn.Module], device: str) -> Any:
    """Two blocks of ``block(fn)`` (``fn``: ``_advance`` compiled), their plain tensor
    attribute ``pos`` on ``device``, trained 3 steps under recompute bitwise against a
    plain copy; each attribute advanced once per step, as in plain training. The runtime."""
    fn = _compiled(_advance)
    torch.manual_seed(0)
    model = models.Stack([block(fn) for _ in range(2)])
    for b in model.blocks:
        b.pos = b.pos.to(device)  # a plain attribute: not moved by .to()
    model.to(device)
    batch = batch_on(torch.device(device), _batch)
    plain = copy.deepcopy(model)
    ref = train(plain, batch, steps=3)
    rt = train_bitwise(model, batch, "recompute", None, ref, steps=3)
    for got, want in zip(model.blocks, plain.blocks):
        assert torch.equal(got.pos, want.pos) and float(want.pos[0]) == 3.0
    return rt


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["recompute", "auto_tight"])
def test_an_inductor_function_in_a_block_recomputes(
    variant: str, device: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Inductor allocates its buffers with ``empty_strided_cpu`` (no op) and fills them
    with ``addmm(out=buf)``: writes to storages the first call's watch did not see made.
    At the call's exit each is freed or held by the call's saves only: scratch of its
    own. The first call keeps from that write on; every later call recomputes, with no
    warning."""
    offrecomp.diagnostics.clear_warnings()
    fn = _compiled(_mlp)
    torch.manual_seed(0)
    model = models.Stack([_MlpBlock(fn) for _ in range(2)]).to(device)
    batch = batch_on(torch.device(device), _batch)
    ref = train(copy.deepcopy(model), batch, steps=4)
    budget = tight_budget(model, batch) if variant == "auto_tight" else None
    rt = train_bitwise(model, batch, variant, budget, ref, steps=4)
    steps = rt.report().steps
    if variant == "recompute":
        assert all(s.replays == 2 for s in steps), [s.replays for s in steps]
        # from the second step on the replays run the compiled function again
        assert all(s.recomputed_bytes > steps[0].recomputed_bytes for s in steps[1:]), [
            s.recomputed_bytes for s in steps
        ]
    else:
        assert steps[-1].phase == "planned" and steps[-1].recomputed_bytes > 0, steps[-1]
    assert not _foreign_warnings(caplog)


@pytest.mark.parametrize("device", DEVICES)
def test_an_inductor_function_advancing_an_attribute_keeps_its_block(
    device: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The compiled function writes the block's plain tensor attribute in its kernel (no
    op shows it); AOT autograd bumps the attribute's version afterwards, which the watch
    hears: a write from outside the call. The region is kept, with the warning, and the
    attribute advances once per step as in plain training (a replay would advance it
    again). Its matmul's ``out=`` buffer alone would pass as scratch."""
    offrecomp.diagnostics.clear_warnings()
    rt = _advanced_once_per_step(lambda fn: _AdvancingBlock(fn), device)
    assert all(s.replays == 0 for s in rt.report().steps), [s.replays for s in rt.report().steps]
    assert _foreign_warnings(caplog)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reads_pos", [False, True], ids=["saved_again", "read_before"])
def test_saves_before_an_inductor_function_advancing_an_attribute_replay_as_the_forward_ran(
    reads_pos: bool, device: str
) -> None:
    """The first call drops a save, then the compiled function writes the attribute (heard
    only after the write), then the call saves the same storage again. What the call
    dropped and still holds is kept from the write on, so no replay runs the compiled
    function again (the attribute advanced twice, the gradients off); a replay of what it
    dropped and freed (``x + pos``) reads the attribute as copied at its first read."""
    rt = _advanced_once_per_step(lambda fn: _ReadAdvancedBlock(fn, reads_pos), device)
    replays = [s.replays for s in rt.report().steps]
    assert replays == ([1, 0, 0] if reads_pos else [0, 0, 0]), replays  # one first call replays x + pos


def test_a_replay_reading_an_attribute_too_large_to_copy_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attribute read before the compiled function advances it was not copied (over
    READ_COPY_MAX_BYTES): the first call's replay raises, naming the region, rather than
    read the advanced values."""
    monkeypatch.setattr(offrecomp.trace.recorder, "READ_COPY_MAX_BYTES", 0)
    fn = _compiled(_advance)
    torch.manual_seed(0)
    model = models.Stack([_ReadAdvancedBlock(fn, True) for _ in range(2)])
    with pytest.raises(RuntimeError, match=r"region 'blocks\.\d' wrote in place"):
        train(model, _batch, offrecomp.runtime(model, mode="recompute"), steps=1)


@pytest.mark.parametrize("how", ["eager", "inductor"])
def test_an_attribute_written_only_after_the_first_call_stops_the_replay(how: str) -> None:
    """NOTE [Attributes written after the first call]: the first call, the one watched,
    leaves the attribute alone; from step 1 the forward advances it (eagerly, or in an
    inductor kernel that reports the write afterwards). The call's exit sees its version
    moved: the region is kept from then on, and that call's replay, which would advance
    it again (other gradients, silently, as under torch.utils.checkpoint), raises naming
    it, where it reads it (eager) or writes it (compiled)."""
    fn = _compiled(_advance) if how == "inductor" else _advance
    torch.manual_seed(0)
    model = models.Stack([_LaterAdvancingBlock(fn) for _ in range(2)])
    rt = offrecomp.runtime(model, mode="recompute")
    with rt:
        model(_batch(0)).backward()
        for b in model.blocks:
            b.advance = True
        loss = model(_batch(1))
        with pytest.raises(RuntimeError, match=r"tensor attribute 'pos' of _LaterAdvancingBlock \(written by this "
                           r"call's forward; the region's first call, the one watched, did not\) in region "
                           r"'blocks\.\d' was modified in place"):
            loss.backward()
    assert all(float(b.pos[0]) == 1.0 for b in model.blocks)  # once: the replay stopped before its write
    with rt:
        model(_batch(2)).backward()  # kept from then on
    assert rt.report().steps[-1].replays == 0
    assert all(float(b.pos[0]) == 2.0 for b in model.blocks)


def test_an_attribute_the_first_call_read_and_a_later_one_writes_replays_on_its_copy() -> None:
    """The first call reads the attribute (NOTE [State read from outside]): each later
    call copies it at entry, and the replay of the one that starts advancing it runs on
    that copy, writing the copy, not the attribute: bitwise, the attribute advanced once
    per step, no error (NOTE [Attributes written after the first call] leaves it be)."""

    def build() -> nn.Module:
        torch.manual_seed(0)
        model = models.Stack([_LaterAdvancingBlock(_advance) for _ in range(2)])
        for b in model.blocks:
            b.reads = True
        return model

    def run(model: nn.Module, rt: offrecomp.Runtime | None) -> list[torch.Tensor]:
        grads = []
        with rt if rt is not None else contextlib.nullcontext():
            for step in range(3):
                for b in model.blocks:
                    b.advance = step >= 1
                model(_batch(step)).backward()
                grads += [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
                model.zero_grad()
        return grads

    plain, m = build(), build()
    ref = run(plain, None)
    rt = offrecomp.runtime(m, mode="recompute")
    got = run(m, rt)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert [float(b.pos[0]) for b in m.blocks] == [float(b.pos[0]) for b in plain.blocks] == [2.0, 2.0]
    # the region stays replayed: both blocks in every step, the writing ones too
    assert [s.replays for s in rt.report().steps] == [2, 2, 2]


class _FactorBlock(nn.Module):
    """A block whose inner layer a K-FAC-style hook watches: the hook keeps an input
    covariance factor in a dict of its own, made on the layer's first call and updated in
    place at each later one (``in_replay``: the update skipped in replays). ``width``
    sets the factor's size (``width**2`` floats)."""

    def __init__(self, factors: dict[nn.Module, torch.Tensor], width: int = 16, in_replay: bool = False) -> None:
        super().__init__()
        self.width = width
        self.up = nn.Linear(16, width)
        self.fc = nn.Linear(width, 16)
        self.factors = [factors]  # in a list: not a module attribute the runtime reads
        self.fc.register_forward_pre_hook(self._factor)
        self.in_replay = in_replay

    def _factor(self, mod: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if self.in_replay and offrecomp.in_replay():
            return
        factors = self.factors[0]
        a = args[0].detach().reshape(-1, self.width)
        if mod not in factors:
            factors[mod] = torch.eye(self.width)
        factors[mod].mul_(0.9).add_(a.t() @ a, alpha=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(torch.tanh(self.up(x)))


def _factor_run(mode: str | None, width: int = 16, guarded: bool = False, steps: int = 3) -> tuple[list[torch.Tensor], list[torch.Tensor], offrecomp.Runtime | None]:
    torch.manual_seed(0)
    factors: dict[nn.Module, torch.Tensor] = {}
    model = models.Stack([_FactorBlock(factors, width, guarded) for _ in range(2)])
    kw: dict[str, Any] = {"budget": 1} if mode == "auto" else {}  # the most frugal plan: it recomputes
    rt = offrecomp.runtime(model, mode=mode, min_bytes=0, **kw) if mode else None
    grads: list[torch.Tensor] = []
    with rt if rt is not None else contextlib.nullcontext():
        for step in range(steps):
            model(_batch(step)).backward()
            grads += [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
            model.zero_grad()
    return grads, [f.clone() for f in factors.values()], rt


@pytest.mark.parametrize("guarded", [False, True])
@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_state_a_hook_makes_on_first_use_and_updates_later_replays_as_found(mode: str, guarded: bool) -> None:
    """NOTE [State the first call made]: the factor the hook made in the region's first
    call outlives it, and each later forward updates it in place. The first call's replay
    leaves it as it found it, and the later calls' replays run on the copy their entry
    took and put back what they wrote: each factor updated once per forward, as in a
    plain run, and the region still replayed (recomputed in every step). Skipped under
    ``offrecomp.in_replay()``, the same."""
    ref, ref_factors, _ = _factor_run(None, steps=12)
    got, factors, rt = _factor_run(mode, guarded=guarded, steps=12)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert all(torch.equal(a, b) for a, b in zip(ref_factors, factors))
    assert rt is not None
    steps = rt.report().steps
    assert all(s.recomputed_bytes > 0 for s in steps[-3:]), [(s.phase, s.recomputed_bytes) for s in steps]


def test_large_state_a_hook_makes_on_first_use_and_updates_later_stops_the_replay() -> None:
    """NOTE [State the first call made], NOTE [Attributes written after the first call]:
    a factor too large to copy at each call's entry (here 100 KiB) is left as found by
    the first call's replay (step 0 as plain); the second call's forward updates it in
    place, which its exit sees: that call's replay, which would update it again, raises
    naming it, and the region is kept from then on."""
    ref, _, _ = _factor_run(None, width=160, steps=1)
    got, _, _ = _factor_run("recompute", width=160, steps=1)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    torch.manual_seed(0)
    model = models.Stack([_FactorBlock({}, 160) for _ in range(2)])
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    with rt:
        model(_batch(0)).backward()
        loss = model(_batch(1))
        with pytest.raises(RuntimeError, match=r"a \(160, 160\) tensor the region's first call made and kept outside "
                           r"the region's modules .* in region 'blocks\.\d' was modified in place"):
            loss.backward()
    with rt:
        model(_batch(2)).backward()  # kept from then on
    assert rt.report().steps[-1].replays == 0


def test_state_too_large_to_copy_that_the_first_replay_writes_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [State the first call made]: a factor over EXTERNAL_COPY_MAX_BYTES (lowered
    here) is not copied before the first call's replay, which updates it again: the
    replay raises after it, naming it, rather than leaving it updated twice unsaid."""
    monkeypatch.setattr(offrecomp.replay_state, "EXTERNAL_COPY_MAX_BYTES", 512)
    torch.manual_seed(0)
    model = models.Stack([_FactorBlock({}) for _ in range(2)])
    with offrecomp.runtime(model, mode="recompute", min_bytes=0):
        loss = model(_batch(0))
        with pytest.raises(RuntimeError, match=r"the replay of region 'blocks\.\d' wrote in place a \(16, 16\) "
                           r"tensor its first call made"):
            loss.backward()


@dataclasses.dataclass
class _Out:
    h: torch.Tensor
    aux: torch.Tensor


class _ReturnsADataclass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> _Out:
        h = torch.tanh(self.fc(x))
        return _Out(h, h.square().mean())


class _DataclassStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_ReturnsADataclass() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        aux = x.new_zeros(())
        for b in self.blocks:
            out = b(x)
            x, aux = out.h, aux + out.aux
        return x.square().mean() + aux


def test_tensors_a_call_returns_in_a_dataclass_are_no_state_it_made() -> None:
    """NOTE [State the first call made]: the tensors a region returns in the fields of a
    dataclass no pytree knows are outputs, not state the call keeps (each would be copied
    at every later call's entry, and around the first call's replay)."""
    torch.manual_seed(0)
    model = _DataclassStack()
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    train(model, _batch, rt, steps=2)
    assert [len(r.made_state) for r in rt.planner.host.regions] == [0, 0]


class _KeepsOnCtx(torch.autograd.Function):
    """Keeps an intermediate on ``ctx`` rather than through ``save_for_backward``
    (directly, and in a list), as fused kernels' Functions do; ``also`` keeps the
    direct one in a dict of its own too."""

    also: dict[str, torch.Tensor] | None = None

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.twice = x * 2
        ctx.more = [x * 3]
        if _KeepsOnCtx.also is not None:
            _KeepsOnCtx.also[str(len(_KeepsOnCtx.also))] = ctx.twice
        return x * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * ctx.twice + 0 * ctx.more[0]


class _CtxBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + _KeepsOnCtx.apply(torch.tanh(self.fc(x)))


@pytest.mark.parametrize("elsewhere", [False, True], ids=["ctx_only", "also_in_a_dict"])
def test_tensors_only_a_custom_functions_ctx_holds_are_no_state_it_made(
    elsewhere: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [State the first call made]: tensors a custom Function keeps on ``ctx`` live
    only in the call's graph, which no later call reads and no replay writes: no state
    (each was copied around the first call's replay, up to 64 MiB). One a dict of the
    user's holds too stays state. Gradients bitwise either way."""
    monkeypatch.setattr(_KeepsOnCtx, "also", {} if elsewhere else None)
    torch.manual_seed(0)
    model = models.Stack([_CtxBlock() for _ in range(2)])
    ref = train(copy.deepcopy(model), _batch, None, steps=3)
    if elsewhere:
        monkeypatch.setattr(_KeepsOnCtx, "also", {})
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    assert_bitwise(ref, train(m, _batch, rt, steps=3))
    assert [len(r.made_state) for r in rt.planner.host.regions] == ([1, 1] if elsewhere else [0, 0])
