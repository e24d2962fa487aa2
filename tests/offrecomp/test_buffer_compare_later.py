"""NOTE [Buffer comparisons] (buffers.py): on a CUDA device a call's exit does not read
whether the buffers it only read changed (a synchronisation inside the forward); it keeps
their copies, booked, until a later exit finds the flags back, or a replay waits for
them. Run here on the CPU with the comparisons made to come back late
(``compares_later``), and their flags held back until a test lets them go."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch
from torch import nn

import offrecomp
import offrecomp.buffers as buffers
from tests.helpers import cuda_sync_warnings, twin

BLOCKS = 4
WIDTH = 256
ROWS = 256  # a 256 KiB buffer: over READ_SNAPSHOT_MAX_BYTES, so compared at the exit
TABLE_BYTES = ROWS * WIDTH * 4


class _Reads(nn.Module):
    """Reads a 256 KiB table; ``unseen`` also writes it through ``.data`` after the
    read, which moves no version of the buffer (as a kernel writing in place may)."""

    def __init__(self, unseen: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("table", torch.randn(ROWS, WIDTH))
        self.unseen = unseen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x) + self.table[: x.shape[0]])
        if self.unseen:
            self.table.data.mul_(0.5)
        return x + h


def _model(unseen: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(_Reads(unseen) for _ in range(BLOCKS)))


def _x(step: int) -> torch.Tensor:
    return torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(step))


class _Flags:
    """Comparisons made on the CPU as if on a CUDA device, their flags back only once
    ``back`` is set (a replay still waits for them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.back = False
        self.made = 0
        made = buffers.PendingCompare.__init__

        def init(pending: buffers.PendingCompare, *args: object) -> None:
            self.made += 1
            made(pending, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(buffers, "compares_later", lambda device: True)
        monkeypatch.setattr(buffers.PendingCompare, "__init__", init)
        monkeypatch.setattr(buffers.PendingCompare, "ready", lambda pending: self.back)


def _steps(m: nn.Module, rt: offrecomp.Runtime | None, steps: int = 2) -> list[list[torch.Tensor]]:
    out = []
    with rt if rt is not None else contextlib.nullcontext():
        for step in range(steps):
            m.zero_grad(set_to_none=True)
            m(_x(step)).square().mean().backward()
            out.append([p.grad.clone() for p in m.parameters()] + [b.clone() for b in m.buffers()])  # type: ignore[union-attr]
    return out


def _books(rt: offrecomp.Runtime) -> int:
    return rt.report().steps[-1].peak_activation_bytes


def test_copies_compared_later_stay_booked_until_their_flags_are_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call's exit reads its table's comparison at once: the copy goes there. Read
    later, it stays until a later exit finds the flags back (then at most one copy more
    is held at a time), or, where they never come back during the forward, until the
    call's replay waits for them: BLOCKS copies more in the books. Gradients and buffers
    bitwise equal to plain either way."""
    ref = _steps(_model(), None)
    books = {}
    for case in ("at once", "back at the next exit", "back in backward"):
        m = _model()
        rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
        if case != "at once":
            flags = _Flags(monkeypatch)
            flags.back = case == "back at the next exit"
        got = _steps(m, rt)
        assert all(torch.equal(a, b) for r, g in zip(ref, got) for a, b in zip(r, g)), case
        assert rt.report().steps[-1].replays > 0
        books[case] = _books(rt)
        if case != "at once":
            assert flags.made == 2 * BLOCKS, flags.made
        monkeypatch.undo()
    assert 0 < books["back at the next exit"] - books["at once"] <= TABLE_BYTES, books
    assert books["back in backward"] - books["at once"] == BLOCKS * TABLE_BYTES, books


@pytest.mark.parametrize("later", [False, True], ids=["at_once", "later"])
def test_a_buffer_written_unseen_found_later_replays_on_its_copy(later: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each forward writes its table without moving its version. The exit's comparison
    finds it written: the replay runs on the copy of the values the forward read, as
    plain autograd's saves hold them, and puts the written table back. With the flags
    back only in backward, the copy is still there for the replay."""
    ref = _steps(_model(unseen=True), None)
    if later:
        _Flags(monkeypatch)
    m = _model(unseen=True)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    got = _steps(m, rt)
    assert all(torch.equal(a, b) for r, g in zip(ref, got) for a, b in zip(r, g))
    assert rt.report().steps[-1].replays > 0


def test_calls_released_before_their_flags_are_back_hold_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forwards without a backward (an evaluation under grad mode) while the flags are
    out: their calls go with their graphs, copies and all, though their comparisons
    were never read; the next exits pass over them. A step after them books what a
    step before them did."""
    flags = _Flags(monkeypatch)
    m = _model()
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    with rt:
        flags.back = True
        m(_x(0)).square().mean().backward()
        before = _books(rt)
        flags.back = False
        outs = []
        for step in range(1, 4):
            out = m(_x(step))
            node = out.grad_fn
            assert node is not None
            outs.append(weakref.ref(out))
            del out, node
        gc.collect()
        assert all(r() is None for r in outs)
        unsettled = rt._calls._unsettled  # the exits' queue: weak, and dead entries go
        assert all(r() is None or r().buffers is None for r in unsettled)
        flags.back = True
        m(_x(4)).square().mean().backward()
        assert not unsettled
    assert _books(rt) == before, (_books(rt), before)


@pytest.mark.cuda
def test_a_forward_reading_mid_sized_buffers_does_not_synchronise_for_them_on_cuda() -> None:
    """Tables of 256 KiB, compared at each call's exit: none of the forward's
    synchronisations comes from buffers.py, and gradients and buffers are plain's."""
    model = _model().cuda()
    ref, m = twin(model), twin(model)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    with rt:
        for step in range(3):
            x = _x(step).cuda()
            for net in (ref, m):
                net.zero_grad(set_to_none=True)
            ref(x).square().mean().backward()
            loss, seen = cuda_sync_warnings(lambda x=x: m(x).square().mean())
            loss.backward()
            assert not [w for w in seen if w.filename.endswith("buffers.py")], [(w.filename, w.lineno) for w in seen]
            assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), m.parameters()))  # type: ignore[arg-type]
            assert all(torch.equal(a, b) for a, b in zip(ref.buffers(), m.buffers()))
    assert rt.report().steps[-1].replays > 0
