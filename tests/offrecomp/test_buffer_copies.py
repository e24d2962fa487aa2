"""NOTE [Replay and module state]: the copies of the buffers a region call's forward
writes, which its replay checkpoint holds until the call is released, are booked: in the
runtime's peak and in the planner's profile, so that a plan within its budget by the
books holds that budget by the allocator too.

Each block keeps an EMA of its features in a 1 MiB buffer (256K float32) that its
forward updates, as some VQ codebooks and feature trackers do.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from offrecomp.buffers import differ, differ_at_once
from scheduler import Profile
from tests.helpers import assert_bitwise, cuda_sync_warnings, train, twin
from tests.offrecomp.test_memory import allocator_peak

BLOCKS = 6
EMA_BYTES = 1024 * 256 * 4  # 1 MiB, the largest buffer a call copies


class _EMABlock(nn.Module):
    def __init__(self, update: bool, d: int = 256, k: int = 1024) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("ema", torch.zeros(k, d))
        self.update = update

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(self.ln(x)))
        out = x + self.fc2(h) + 0.01 * self.ema.mean(0)
        if self.update:
            with torch.no_grad():
                self.ema.mul_(0.99).add_(0.01 * h[:, : self.ema.shape[1]].mean(0))
        return out


class _Stack(nn.Module):
    def __init__(self, update: bool = True) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_EMABlock(update) for _ in range(BLOCKS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def _stack(update: bool = True) -> _Stack:
    torch.manual_seed(0)
    return _Stack(update)


def _batch(step: int) -> torch.Tensor:
    return torch.randn(256, 256, generator=torch.Generator().manual_seed(step))


def _train(model: nn.Module, ctx: Any, steps: int) -> tuple[list[dict[str, torch.Tensor]], int]:
    """``steps`` SGD steps inside ``ctx``: the gradients, buffers and loss after each (as
    ``helpers.train``), and the allocator's peak over the last step's forward and backward."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out, peak = [], 0
    with ctx if ctx is not None else contextlib.nullcontext():
        for step in range(steps):
            x = _batch(step)
            losses = []

            def run(x: torch.Tensor = x, losses: list[torch.Tensor] = losses) -> None:
                loss = model(x)
                loss.backward()
                losses.append(loss.detach())

            if step == steps - 1:
                peak = allocator_peak(run)
            else:
                run()
            snap = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            snap.update({f"buf.{n}": b.detach().clone() for n, b in model.named_buffers()})
            snap["loss"] = losses[0]
            out.append(snap)
            opt.step()
            opt.zero_grad(set_to_none=False)  # the gradients' allocation is no part of the peaks
    return out, peak


def test_recompute_books_the_buffer_copies_its_calls_hold() -> None:
    """Under recompute every call keeps the entry values of the EMA it updates for its
    replay: 6 x 1 MiB more than the same model whose blocks only read it (a larger read
    buffer's copy goes at the call's exit), in the books as on the allocator. Before
    they were booked, both read the same."""
    ref, _ = _train(_stack(), None, 3)
    books, peaks = {}, {}
    for update in (True, False):
        m = _stack(update)
        rt = offrecomp.runtime(m, mode="recompute")
        got, peaks[update] = _train(m, rt, 3)
        if update:
            assert_bitwise(ref, got)
        books[update] = rt.report().steps[-1].peak_activation_bytes
    assert books[True] - books[False] == BLOCKS * EMA_BYTES, books
    # the allocator sees the same difference, within what one block's forward allocates
    assert abs((peaks[True] - peaks[False]) - BLOCKS * EMA_BYTES) <= EMA_BYTES // 4, peaks


def test_auto_holds_its_budget_counting_the_buffer_copies() -> None:
    """A budget half-way between recompute's books and keep's: the plan drops in calls
    that then hold their EMA's copy, and books it. The planned step's allocator peak is
    keep's less what its books say it saved, within 256 KiB (15 KB here); unbooked, the
    copies of the calls it drops in (1 MiB each) were held on top, silently (13.9 MB
    where the books implied 10.8 MB)."""
    base = _stack()
    ref, _ = _train(twin(base), None, 6)
    books, peaks = {}, {}
    for mode in ("keep", "recompute"):
        m = twin(base)
        rt = offrecomp.runtime(m, mode=mode)
        _, peaks[mode] = _train(m, rt, 2)
        books[mode] = rt.report().steps[-1].peak_activation_bytes
    budget = (books["keep"] + books["recompute"]) // 2
    m = twin(base)
    rt = offrecomp.runtime(m, mode="auto", budget=budget)
    got, peak = _train(m, rt, 6)
    assert_bitwise(ref, got)
    rec = rt.report().steps[-1]
    assert rec.phase == "planned", rec
    assert rec.peak_activation_bytes <= budget, (rec.peak_activation_bytes, budget)
    saved = books["keep"] - rec.peak_activation_bytes
    assert peak <= peaks["keep"] - saved + (256 << 10), (peak, peaks["keep"], saved)
    entry = rt.planner.last_entry
    assert entry is not None and isinstance(entry.profile, Profile)
    snapshots = [[s.nbytes for s in r.storages if s.kind == "snapshot"] for r in entry.profile.regions]
    assert snapshots == [[EMA_BYTES]] * BLOCKS, snapshots


def _pairs() -> list[tuple[torch.Tensor, torch.Tensor]]:
    a = torch.arange(6.0).reshape(2, 3)
    nan = torch.tensor([float("nan"), 1.0])
    return [
        (a, a.clone()), (a, a + 1), (nan, nan.clone()), (torch.empty(0), torch.empty(0)),
        (torch.tensor([True, False]), torch.tensor([True, True])), (torch.tensor([3]), torch.tensor([3])),
        (a.t(), a.t().clone()),
    ]


def test_buffer_comparisons_read_as_torch_equal() -> None:
    """NOTE [Buffer comparisons]: a GPU's flags are read at once (``differ_at_once``, run
    here on CPU tensors); every pair reads as ``not torch.equal``, NaN and other shapes
    included."""
    pairs = _pairs()
    want = [not torch.equal(a, b) for a, b in pairs]
    assert want == [False, True, True, False, True, False, False]
    assert differ_at_once(pairs) == want
    assert differ(pairs) == want
    assert differ([(torch.zeros(2), torch.zeros(3)), (torch.zeros(2), torch.zeros(2, dtype=torch.float64))]) == [True, True]


class _ConvBN(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.conv, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.bn2(self.bn1(self.conv(x))))


@pytest.mark.parametrize("train_mode", [True, False])
def test_a_forward_of_blocks_of_small_buffers_compares_none(train_mode: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Buffer comparisons]: each call's exit compared its six BatchNorm buffers with
    their copies (a synchronisation per call on a GPU), though the copies of buffers that
    small stay either way; its replay compares them. The forward compares none; the
    replays run on the copies where the statistics moved (training) and on the buffers
    where they did not (evaluation); gradients and buffers bitwise."""
    import offrecomp.buffers as buffers

    compared: list[tuple[bool, int]] = []  # (in backward, pairs) per comparison
    in_backward = [False]
    real = buffers.differ

    def counting(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[bool]:
        compared.append((in_backward[0], len(pairs)))
        return real(pairs)

    monkeypatch.setattr(buffers, "differ", counting)
    torch.manual_seed(0)
    model = nn.Sequential(*(_ConvBN(8) for _ in range(3))).train(train_mode)
    x = torch.randn(2, 8, 8, 8)
    ref, m = twin(model), twin(model)
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        for _ in range(2):
            for net in (ref, m):
                net.zero_grad(set_to_none=True)
                loss = net(x).square().mean()
                in_backward[0] = True
                loss.backward()
                in_backward[0] = False
            assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), m.parameters()))  # type: ignore[arg-type]
            assert all(torch.equal(a, b) for a, b in zip(ref.buffers(), m.buffers()))
    assert sum(n for back, n in compared if not back) == 0, compared
    per_call = 4 if train_mode else 6  # training bumps the version of num_batches_tracked: written
    assert sum(n for back, n in compared if back) == 2 * 3 * per_call, compared


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_forward_of_blocks_with_buffers_synchronises_once_per_call_on_cuda(mode: str) -> None:
    """NOTE [Buffer comparisons]: each region call compared its buffers with their
    snapshots by ``torch.equal``, a host synchronisation per buffer inside the forward
    (six per block of two BatchNorms here). A planned or recomputing forward
    synchronises at most once per region call, none of them for its buffers, and
    gradients and buffers match plain bitwise."""
    torch.manual_seed(0)
    blocks = 4
    model = nn.Sequential(*(_ConvBN() for _ in range(blocks))).cuda()
    x = torch.randn(4, 16, 32, 32, device="cuda")
    ref, m = twin(model), twin(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, budget=1 if mode == "auto" else None)  # auto: its most frugal plan
    with rt:
        for step in range(4):
            for net in (ref, m):
                net.zero_grad(set_to_none=True)
            ref(x).square().mean().backward()
            loss, syncs = cuda_sync_warnings(lambda x=x: m(x).square().mean())
            loss.backward()
            if step == 3:
                assert len(syncs) <= blocks, [str(w.message) for w in syncs]
                assert not [w for w in syncs if w.filename.endswith("buffers.py")], [(w.filename, w.lineno) for w in syncs]
            assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), m.parameters()))  # type: ignore[arg-type]
            assert all(torch.equal(a, b) for a, b in zip(ref.buffers(), m.buffers()))
    assert rt.report().steps[-1].replays > 0


class _Membrane(nn.Module):
    """A neuron keeping its membrane in a buffer it rebinds at every call."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.register_buffer("mem", torch.zeros(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mem.shape != x.shape:
            self.mem = torch.zeros_like(x)
        self.mem = 0.5 * self.mem + torch.tanh(self.fc(x))
        return x + self.mem


class _Unrolled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Membrane() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            b.mem = torch.zeros(0)
        out = 0.0
        for t in range(4):  # time steps: each block called once per step
            h = x[t]
            for b in self.blocks:
                h = b(h)
            out = out + h
        return out.square().mean()  # type: ignore[union-attr]


def test_a_rebound_buffer_s_entry_tensor_is_its_copy() -> None:
    """NOTE [Rebound buffers]: a call rebinding its membrane kept a copy of the entry
    membrane, which the call holds as it is (recompute booked 90,112 B here, keep 102,400
    B). The copy goes at the call's exit: 53,248 B; gradients and buffers bitwise."""
    torch.manual_seed(0)
    model = _Unrolled()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(s))

    ref = train(twin(model), batch, steps=3)
    books = {}
    for mode in ("keep", "recompute"):
        m = twin(model)
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0, regions=lambda mod, name: name.startswith("blocks.") and name.count(".") == 1)
        assert_bitwise(ref, train(m, batch, rt, steps=3))
        books[mode] = rt.report().steps[-1].peak_activation_bytes
    assert books["recompute"] <= 0.55 * books["keep"], books  # with the copies: 90,112 of 102,400 B


def test_a_rebound_buffer_s_entry_tensor_written_since_stops_its_replay() -> None:
    """NOTE [Rebound buffers]: the entry membrane written in place after the call no longer
    holds what the forward read: the replay raises, naming the buffer, rather than run on
    other values."""
    torch.manual_seed(0)
    m = nn.Sequential(_Membrane(), _Membrane())
    x = torch.randn(16, 64)
    with offrecomp.runtime(m, mode="recompute", min_bytes=0, regions=lambda mod, name: name.isdigit()):
        m(x).square().mean().backward()  # the membranes exist from here on
        for b in m:
            b.mem = b.mem.detach()  # as a truncated unroll does
        entry = m[0].mem
        loss = m(x).square().mean()
        with torch.no_grad():
            entry.add_(1.0)
        with pytest.raises(RuntimeError, match="buffer 'mem' of region '0' was rebound"):
            loss.backward()


class _BigBookA(nn.Module):
    """Reads a buffer over 1 MiB, then advances it in place (NOTE [Replay and module
    state]: replayed with its post-forward value, warned)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_buffer("book", torch.ones(300_000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.fc(x)) * (self.book[:16] * 1.0)
        with torch.no_grad():
            self.book.mul_(0.5)
        return y


class _BigBookB(_BigBookA):
    pass


@pytest.mark.parametrize("second", [_BigBookA, _BigBookB])
def test_another_model_s_regions_of_the_same_names_warn_again(second: type, caplog: pytest.LogCaptureFixture) -> None:
    """The warning of a region mutating a buffer over 1 MiB is keyed by the region's
    class and name: a later model whose ``blocks.0`` is of another class is warned too
    (keyed by name alone, it was not); one of the same class is not, again."""
    offrecomp.diagnostics.clear_warnings()
    texts = []
    for cls in (_BigBookA, second):
        m = nn.Sequential(cls(), cls())
        caplog.clear()
        with caplog.at_level("WARNING", logger="offrecomp"), offrecomp.runtime(m, mode="recompute", regions=cls):
            m(torch.randn(4, 16)).sum().backward()
        texts.append(caplog.text.count("mutates buffers larger than 1 MiB"))
    assert texts == [2, 2 if second is _BigBookB else 0], texts
