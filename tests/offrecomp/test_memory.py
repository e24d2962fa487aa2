"""Invariant 5 and the recompute memory bound, measured independently of the runtime.

On CPU the independent measurement is the allocator itself: ``torch.profiler`` with
``profile_memory=True`` reports every allocation and free; the peak of their running sum
over a training step is the step's peak memory.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import offrecomp
from offrecomp import Placement, Plan
from tests import models
from tests.helpers import twin


def allocator_peak(fn: Callable[[], None]) -> int:
    """The most bytes ``fn`` held at once by the CPU allocator's events. Earlier garbage
    collected inside the window would count its frees against ``fn`` (a baseline read
    171,656 B low so in a full run): it is collected before."""
    gc.collect()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        if e.name() == "[memory]":
            cur += e.nbytes()
            peak = max(peak, cur)
    return peak


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return models.GPT(layers=6, h=64, heads=4, p=0.1), torch.randint(0, 64, (4, 96))


class CkptGPT(nn.Module):
    """The same model with torch.utils.checkpoint around every block."""

    def __init__(self, inner: models.GPT) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        m = self.inner
        x = m.emb(idx)
        for blk in m.blocks:
            x = checkpoint(blk, x, use_reentrant=False)
        return torch.nn.functional.cross_entropy(m.head(m.ln(x)).flatten(0, 1), idx.flatten())


def _step(model: nn.Module, idx: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        torch.manual_seed(1)
        model(idx).backward()

    return run


@pytest.mark.parametrize("min_bytes", [0, None])
def test_recompute_peak_at_most_checkpoint_per_block(min_bytes: int | None) -> None:
    model, idx = _model()
    plain_m = twin(model)
    ckpt_m = CkptGPT(twin(model))
    ours_m = twin(model)
    for m in (plain_m, ckpt_m):  # warm up: grads allocated, lazy init done
        _step(m, idx)()
    plain = allocator_peak(_step(plain_m, idx))
    ckpt = allocator_peak(_step(ckpt_m, idx))
    kw = {} if min_bytes is None else {"min_bytes": min_bytes}  # None: the default
    with offrecomp.runtime(ours_m, mode="recompute", **kw):
        _step(ours_m, idx)()
        ours = allocator_peak(_step(ours_m, idx))
    assert ours <= ckpt, (ours, ckpt)
    assert ours < 0.6 * plain, (ours, plain)


def test_reported_activation_bytes_match_an_independent_count() -> None:
    """Keep mode: the runtime's peak equals the bytes of distinct saved storages counted
    by a separate hook pair in a plain run."""
    model, idx = _model()
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, nn.Parameter) and not isinstance(t._base, nn.Parameter):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        return t

    m1 = twin(model)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.manual_seed(1)
        loss = m1(idx)
    independent = sum(seen.values())
    loss.backward()
    m2 = twin(model)
    with offrecomp.runtime(m2, mode="keep", min_bytes=0) as rt:
        _step(m2, idx)()
    rep = rt.report().steps[0]
    assert rep.kept_bytes == independent
    assert rep.peak_activation_bytes == independent


def test_recompute_reports_less_than_keep() -> None:
    model, idx = _model()
    peaks = {}
    for mode in ("keep", "recompute"):
        m = twin(model)
        with offrecomp.runtime(m, mode=mode, min_bytes=0) as rt:
            _step(m, idx)()
        peaks[mode] = rt.report().steps[0].peak_activation_bytes
    assert peaks["recompute"] < 0.5 * peaks["keep"]


class _AuxBlock(nn.Module):
    """An MLP block that also stores a side loss on itself (as MoE layers store an aux
    loss) which, with ``dead``, the step's loss never uses."""

    def __init__(self, dead: bool) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(64), nn.Linear(64, 256), nn.Linear(256, 64)
        self.dead = dead

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        if self.dead:
            self.aux_loss = torch.logsumexp(h, -1).square().mean()  # saves h and its logsumexp
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(h)))


def test_saves_no_backward_unpacks_book_only_their_own_bytes() -> None:
    """NOTE [Replays booked per storage]: a replay's saves stop counting as they are handed
    out; those on a branch the loss does not use stay booked, alone (each block's ``h``,
    256 x 64 floats, and its logsumexp), not every byte the replay regenerated."""
    peaks = {}
    for dead in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(*(_AuxBlock(dead) for _ in range(4)))
        x = torch.randn(256, 64)
        with offrecomp.runtime(m, mode="recompute", min_bytes=0) as rt:
            for _ in range(2):
                m(x).square().mean().backward()
        peaks[dead] = rt.report().steps[-1].peak_activation_bytes
    dead_saves = 4 * (256 * 64 * 4 + 2 * 256 * 4)
    assert peaks[False] < peaks[True] <= peaks[False] + dead_saves, peaks


class _ResidualBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x)).float()  # a float32 residual stream under autocast


def test_replays_under_autocast_leave_no_casts_in_its_cache() -> None:
    """NOTE [Autocast cache]: with backward called inside the forward's autocast context,
    each replay's cast of its input (a fresh leaf that requires grad, which autocast
    caches) stayed in that context's cache until it exited: a bf16 copy of every
    replayed block's input, 8 x 1 MiB here. Replays now run with the cache off, so the
    peak stays within 1.5 MiB of the run that calls backward after the context."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_ResidualBlock() for _ in range(8)])
    x = torch.randn(2048, 256)

    def step(inside: bool) -> Callable[[], None]:
        def run() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).square().mean()
                if inside:
                    loss.backward()
            if not inside:
                loss.backward()

        return run

    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        outside, inside = allocator_peak(step(False)), allocator_peak(step(True))
    assert all(s.replays == 8 for s in rt.report().steps)
    assert inside - outside <= 1.5 * 2**20, (inside - outside) / 2**20


class _LoopBlock(nn.Module):
    """One Linear applied eight times: under autocast the forward casts its weight once
    (the weight cache) and uses the cast at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(8):
            h = torch.tanh(self.lin(h))
        return x + h


class _Ckpt(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


def test_a_replay_under_autocast_casts_a_weight_once_as_its_forward_did() -> None:
    """NOTE [Autocast cache]: a replay outside any autocast context ran with the cache off,
    so each use of a weight made and held a cast of its own (8 bf16 casts of each block's
    weight, 1.8x torch.utils.checkpoint's step peak here). Its contexts are the outermost
    there: the cache is on, one cast per weight, cleared at their exit."""
    torch.manual_seed(0)
    blocks = [_LoopBlock() for _ in range(4)]
    x = torch.randn(64, 256)

    def step(m: nn.Module) -> Callable[[], None]:
        def run() -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = m(x).float().square().mean()
            loss.backward()

        return run

    ckpt_m = nn.Sequential(*[_Ckpt(twin(b)) for b in blocks])
    ours_m = nn.Sequential(*[twin(b) for b in blocks])
    step(ckpt_m)()  # warm up: grads allocated
    ckpt = allocator_peak(step(ckpt_m))
    with offrecomp.runtime(ours_m, mode="recompute", min_bytes=0) as rt:
        step(ours_m)()
        ours = allocator_peak(step(ours_m))
    assert rt.report().steps[-1].replays == 4
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ckpt_m.parameters(), ours_m.parameters()))  # type: ignore[arg-type]
    assert ours <= ckpt, (ours, ckpt)
    assert not torch.is_autocast_enabled("cpu")


class _TwoReads(nn.Module):
    """Reads its input through two Linears: under autocast the forward casts the input (a
    block's output, not a leaf) at each; a replay's input is a fresh leaf, whose cast a
    cache would keep."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.a(x)) * self.b(x)


class _Autocast(nn.Module):
    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for blk in self.blocks:
                x = blk(x)
            return x.float().square().mean()


@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
def test_replays_under_autocast_follow_the_recording_cast_by_cast(variant: str) -> None:
    """NOTE [Autocast cache]: a replay under the serving mode follows the recording op by
    op; with the cache on it cast its input once where the forward cast it at each read,
    and diverged (ReplayDivergedError at the second cast: HF BERT, Llama-like layers under
    bf16). Serving replays run with the cache off; plain ones keep it, bitwise."""
    from tests.helpers import check_variant

    torch.manual_seed(0)
    model = _Autocast([_TwoReads() for _ in range(3)])
    check_variant(model, lambda s: torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(s)), variant, serves=True)


class _TopOneMoE(nn.Module):
    """Top-1 routed experts: each expert's rows picked by ``nonzero``, its output added
    back with ``index_add``, which saves the index its rows were picked by."""

    def __init__(self, d: int = 64, experts: int = 4) -> None:
        super().__init__()
        self.ln, self.gate = nn.LayerNorm(d), nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln(x).reshape(-1, d)
        w, idx = torch.softmax(self.gate(h), -1).max(-1)
        y = torch.zeros_like(h)
        for e, ex in enumerate(self.experts):
            rows = (idx == e).nonzero().squeeze(-1)
            if rows.numel():
                y = y.index_add(0, rows, ex(h[rows]) * w[rows, None])
        return x + y.reshape(b, t, d)


def test_a_replay_stops_at_an_index_saved_before() -> None:
    """NOTE [Replay], step 5: a replay whose last needed save is an index that
    ``index_add`` saves (no grad, version 0) ran that op to its end, in case it filled
    the index: its output was one activation more at the replay's peak (recompute 1.046x
    ``torch.utils.checkpoint``'s step peak here). An earlier op saved that index already,
    so nothing fills it: the replay stops at once."""
    torch.manual_seed(0)
    blocks = [_TopOneMoE() for _ in range(4)]

    def peaks(m: nn.Module, ctx: Any) -> tuple[list[int], list[torch.Tensor]]:
        out, grads = [], []
        with ctx:
            for s in range(4):
                x = torch.randn(8, 64, 64, generator=torch.Generator().manual_seed(s))
                out.append(allocator_peak(lambda: m(x).square().mean().backward()))  # noqa: B023
                grads += [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]
                m.zero_grad(set_to_none=False)
        return out[1:], grads

    ckpt, ckpt_grads = peaks(nn.Sequential(*[_Ckpt(twin(b)) for b in blocks]), contextlib.nullcontext())
    m = nn.Sequential(*[twin(b) for b in blocks])
    ours, grads = peaks(m, offrecomp.runtime(m, mode="recompute", min_bytes=0))
    assert all(torch.equal(a, b) for a, b in zip(ckpt_grads, grads))
    assert all(o <= 1.01 * c for o, c in zip(ours, ckpt)), (ours, ckpt)


class _Loop(nn.Module):
    """One Linear applied eight times to its input and to its own output: under autocast
    the forward casts the weight once and the input (a previous block's output, no leaf)
    at each step."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(48, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(8):
            h = torch.tanh(self.lin(h) + self.lin(x))
        return x + h


def _weight_casts(prof: torch.profiler.profile, shape: list[int]) -> int:
    """The casts to bf16 (ScalarType 15) of a float tensor of ``shape`` the profiler saw."""
    return sum(
        1 for e in prof.events()
        if e.name == "aten::_to_copy" and e.input_shapes[:1] == [shape] and e.concrete_inputs[1:2] == [15]
    )


def test_a_serving_replay_under_autocast_casts_a_weight_once_as_its_forward_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Autocast cache]: a replay under the serving mode ran with the cache off, so it
    cast its block's weight (and held the cast, which the Linear saves) at each of its 8
    uses where the forward cast it once: 8 casts per replay. The plan keeps each block's
    first tanh, so every replay serves it; the profiler counts the casts the replays of a
    backward make: one per replay, bitwise as plain training."""
    monkeypatch.setenv("OFFRECOMP_REPLAY_OP_US", "0")  # tiny blocks: serving pays whatever it skips
    torch.manual_seed(0)
    model = _Autocast([_Loop() for _ in range(4)])
    x = torch.randn(2, 8, 48)
    ref = twin(model)
    ref(x).backward()
    with offrecomp.runtime(model, mode="auto", min_bytes=0) as rt:
        model(x).backward()  # the measuring pass records the blocks' ops
        model.zero_grad(set_to_none=True)
        st = next(iter(rt.planner.entries.values())).structures[("blocks.0", 0)]
        tanh = next(
            i for i, s in enumerate(st.storage_records)
            if s.producer_op >= 0 and "tanh" in st.op_names[s.producer_op] and s.kind == "activation"
        )
        rt.set_plan(Plan(placements={(f"blocks.{b}", 0, tanh): Placement.KEEP for b in range(4)}, default=Placement.RECOMPUTE))
        loss = model(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            loss.backward()
    last = rt.report().steps[-1]
    assert last.replays == 4 and last.served_ops >= 4 and last.rerun_ops > 0  # under the serving mode
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ref.parameters(), model.parameters()))  # type: ignore[arg-type]
    casts = sum(
        1 for e in prof.events()  # autocast's casts (its aten::to, not the mode's call) of a weight to bf16 (15)
        if e.name == "aten::_to_copy" and e.input_shapes[:1] == [[48, 48]] and e.concrete_inputs[1:2] == [15]
        and e.cpu_parent is not None and e.cpu_parent.name == "aten::to"
    )
    assert casts == 4, casts
