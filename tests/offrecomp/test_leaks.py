"""Graphs dropped without backward, and a dropped runtime, free everything they held.

Plain autograd frees a graph, and every tensor it saved, once nothing references it.
A saved-tensor handle that held the tensor it saved would hold, for an op's saved
output, a tensor whose grad_fn is the node holding the handle: a cycle through C++ that
Python's collector cannot see (NOTE [Saved tensor handles] in offrecomp/state.py).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
import offrecomp.backends
from tests.helpers import make, train

MODES = ["keep", "recompute", "offload", "auto"]


class _Marker:
    """An object only a graph node's metadata holds."""


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * x


def _model(width: int = 64, depth: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[Block(width) for _ in range(depth)])


@pytest.fixture(autouse=True)
def _no_automatic_gc() -> Iterator[None]:
    """Reference counting alone must free the graphs, as it does for plain autograd."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _forward_without_backward(m: nn.Module, x: torch.Tensor, saved: list[weakref.ref]) -> weakref.ref:
    """One forward whose graph is dropped at once. Returns a weak reference to a marker
    in the output node's metadata; ``saved`` gets weak references to the activations
    each block saved (their outputs, read through forward hooks)."""
    handles = [
        b.register_forward_hook(lambda mod, args, out: saved.append(weakref.ref(out)))
        for b in m
    ]
    try:
        out = m(x).exp().sum()
    finally:
        for h in handles:
            h.remove()
    marker = _Marker()
    out.grad_fn.metadata["marker"] = marker  # type: ignore[union-attr]
    return weakref.ref(marker)


def _live(refs: list[weakref.ref]) -> int:
    return sum(r() is not None for r in refs)


@pytest.mark.parametrize("mode", MODES)
def test_graphs_without_backward_are_freed_inside_and_after_the_context(mode: str) -> None:
    m = _model()
    x = torch.randn(32, 64)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    with rt:
        m(x).sum().backward()  # one ordinary step first: the runtime is warm
        markers, saved = [], []
        for _ in range(10):
            markers.append(_forward_without_backward(m, x, saved))
        assert _live(markers) == 0, "graph nodes of forwards without backward are alive"
        assert _live(saved) == 0, "activations saved by dropped graphs are alive"
        # the graph of a retained backward, dropped after it ran
        out = m(x).sum()
        marker = _Marker()
        out.grad_fn.metadata["marker"] = marker  # type: ignore[union-attr]
        ref = weakref.ref(marker)
        del marker
        out.backward(retain_graph=True)
        del out
        assert ref() is None
        late = _forward_without_backward(m, x, saved)
    assert late() is None and _live(saved) == 0
    engine = rt.offload_engine  # the last forward's copies in flight: let go at exit
    assert engine is None or engine.stash_bytes == 0
    markers = [_forward_without_backward(m, x, saved) for _ in range(3)]  # after the exit
    assert _live(markers) == 0 and _live(saved) == 0


@pytest.mark.parametrize("mode", MODES)
def test_the_issue_repro(mode: str) -> None:
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))

    def fwd() -> weakref.ref:
        out = m(torch.randn(4, 8)).exp().sum()
        p = _Marker()
        out.grad_fn.next_functions[0][0].metadata["p"] = p  # type: ignore[union-attr]
        return weakref.ref(p)

    with offrecomp.runtime(m, mode=mode):
        r = fwd()
    assert r() is None


def test_a_dropped_runtime_frees_its_pinned_pool_at_once() -> None:
    m = _model()
    x = torch.randn(32, 64)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    with rt:
        for _ in range(2):
            m(x).sum().backward()
    engine = rt.offload_engine
    assert engine is not None and not engine.closed
    ref = weakref.ref(rt)
    del rt
    assert ref() is None, "the runtime sits in a reference cycle"
    assert engine.closed


def test_a_runtime_collected_under_a_live_graph_closes_its_pool_after_the_backward() -> None:
    """NOTE [Pool lifetime]: the runtime dropped while a graph kept past its exit still
    needs the pool (a helper making the runtime and returning the loss): that backward
    reloads its groups, and the engine closes when the last one is freed."""
    m = _model()
    x = torch.randn(32, 64)
    ref_model = copy.deepcopy(m)
    ref_model(x).sum().backward()
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    with rt:
        loss = m(x).sum()
    engine = rt.offload_engine
    del rt
    gc.collect()
    assert engine is not None and not engine.closed
    loss.backward()
    del loss
    gc.collect()
    assert engine.closed
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ref_model.parameters(), m.parameters()))


def test_kept_bytes_end_with_the_storage() -> None:
    """NOTE [Resident bytes]: a kept activation stops counting when its storage dies,
    not when the pass ends."""
    m = _model(depth=2)
    x = torch.randn(32, 64)
    with offrecomp.runtime(m, mode="keep", min_bytes=0) as rt:
        out = m(x).sum()
        p = rt.current_pass
        assert p is not None and p.stats.resident_bytes > 0
        del out
        # the input, saved by the first block and still held here, is all that is left
        assert p.stats.resident_bytes == x.untyped_storage().nbytes()


def _alive(kind: type) -> int:
    return sum(type(o) is kind for o in gc.get_objects())


def _sgd_steps(m: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, n: int) -> None:
    for _ in range(n):
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()


@pytest.mark.parametrize("mode", ["keep", "recompute", "offload", "auto", "auto_tight"])
def test_finished_passes_are_freed_without_the_collector(mode: str) -> None:
    """NOTE [Pass retirement]: a finished pass's records (reference cycles) are freed by
    reference counting once the planner is done with them, so with the collector off
    the runtime's records do not pile up step after step."""
    from offrecomp.state import RegionCall, StorageRec

    m = _model()
    x = torch.randn(8, 64, requires_grad=True)
    kw: dict = {}
    if mode == "auto_tight":
        mode, kw["budget"] = "auto", 2 * 8 * 64 * 4  # a little over two activations
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, **kw)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    with rt:
        _sgd_steps(m, opt, x, 6)  # measure, calibrate, plan (auto)
        calls, recs = _alive(RegionCall), _alive(StorageRec)
        _sgd_steps(m, opt, x, 12)
        # at most the planner's last step and the one it has not read yet stay
        assert _alive(RegionCall) <= calls + 2 * 5, (calls, _alive(RegionCall))
        assert _alive(StorageRec) <= recs + 2 * 30, (recs, _alive(StorageRec))
        # explain() still reads the last pass (forced modes): every block has its row
        rows = [line.split()[:2] for line in rt.explain().splitlines()]
        assert all([str(i), "0"] in rows for i in range(4)), rt.explain()
    assert rt.report().steps[-1].storages > 0


@pytest.mark.parametrize("mode", ["keep", "recompute", "offload"])
def test_a_graph_retained_across_steps_still_backpropagates(mode: str) -> None:
    """A graph kept (``retain_graph=True``) while later steps run and retire their passes
    still backpropagates again, bitwise as plainly: its calls are leased (offload,
    recompute) or its kept saves reach their records through back edges (keep)."""

    runtimes = []

    def run(mode: str | None) -> list[torch.Tensor]:
        m = _model()
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0) if mode is not None else None
        runtimes.append(rt)
        step = rt.step if rt is not None else contextlib.nullcontext
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
        with rt if rt is not None else contextlib.nullcontext():
            with step():
                loss = m(x).pow(2).mean()
                loss.backward(retain_graph=True)
            grads = [p.grad.clone() for p in m.parameters()]
            for i in range(4):  # later steps (rt.step(): no optimizer may change the weights)
                m.zero_grad()
                with step():
                    m(x * (i + 2)).pow(2).mean().backward()
                grads += [p.grad.clone() for p in m.parameters()]
            m.zero_grad()
            loss.backward()  # the first graph again
            return grads + [p.grad.clone() for p in m.parameters()]

    ref = run(None)
    got = run(mode)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    rt = runtimes[-1]
    assert rt is not None
    steps = rt.report().steps
    assert len(steps) == 5, steps
    acted = {"keep": "kept_bytes", "recompute": "replays", "offload": "offloaded_bytes"}[mode]
    assert all(getattr(s, acted) > 0 for s in steps), steps  # every step's saves went that way


class _NegativeView(nn.Module):
    """Saves ``z.conj().imag``: a real view that reads its storage negated, which offload
    cannot move (it moves bytes only), so it is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(64))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z.conj().imag * self.w


def test_an_offload_kept_instead_ends_with_its_storage() -> None:
    """NOTE [Resident bytes]: a storage planned to offload that cannot move falls back
    to KEEP; its bytes stop counting when it dies, although its record was made without
    the death callback an offload needs none of."""
    m = nn.Sequential(_NegativeView())
    z = torch.randn(64, dtype=torch.complex64)
    with offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_NegativeView) as rt:
        out = m(z).sum()
        p = rt.current_pass
        assert p is not None
        assert p.stats.resident_bytes == z.untyped_storage().nbytes() == p.stats.kept_bytes
        assert p.stats.offloaded_bytes == 0
        del out
        assert p.stats.resident_bytes == z.untyped_storage().nbytes()  # still held here
        del z
        gc.collect()
        assert p.stats.resident_bytes == 0


def test_root_saves_kept_by_a_refused_group_are_freed() -> None:
    """A root group the pool refuses at issue keeps its storages (offload_to_keep); once
    the runtime and the graph are gone, so are they."""
    m = _model(depth=2)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    watched: list[weakref.ref[Any]] = []
    with rt:
        engine = rt._groups.get_engine()
        engine.pool.pressure_bytes = 1 << 62  # every new slab would leave too little host memory
        for _ in range(3):
            loss = (m(torch.randn(32, 64)) * 2).cos().sum()
            p = rt.current_pass
            assert p is not None
            watched += [weakref.ref(r()) for c in p.all_calls() for r in c.storages if r() is not None]
            loss.backward()
            del loss, p
            m.zero_grad()
    assert rt.report().steps[-1].fallbacks.get("offload_to_keep", 0) >= 1
    del rt
    gc.collect()
    assert watched and not [w for w in watched if w() is not None]


def test_root_saves_the_pool_refuses_leave_no_group_behind() -> None:
    """Region groups fill a small pool and the root saves after them fall back to keep:
    no empty root group stays counted, so close() frees the pool and its copy threads."""
    m = _model(width=256)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=Block, host_limit="1MiB")
    with rt:
        for _ in range(3):
            (m(torch.randn(128, 256)).exp() * 2).sum().backward()
            m.zero_grad()
    steps = rt.report().steps
    assert steps[-1].offloaded_bytes > 0 and steps[-1].fallbacks
    engine = rt.offload_engine
    assert engine is not None and rt.offload_groups_held == 0
    rt.close()
    assert engine.closed


class _ForceBlock(nn.Module):
    """Runs a backward of its own (a force field): its replays hold their saves."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        (g,) = torch.autograd.grad((torch.tanh(h) * h).sum(), h, create_graph=True)
        return x + torch.tanh(g * h)


@pytest.mark.parametrize("mode", ["recompute", "auto_tight"])
def test_replays_holding_their_saves_leave_nothing_behind(mode: str) -> None:
    """NOTE [Backward inside a forward] (replay.py): a replay holds detached aliases of its
    saves; the tensors themselves, saved by the nodes that made them (tanh saves its
    output), would each close a cycle through C++ and stay alive for good."""
    torch.manual_seed(0)
    m = nn.Sequential(*[_ForceBlock(32) for _ in range(3)])
    x = torch.randn(8, 32)
    kw: dict = {}
    if mode == "auto_tight":
        mode, kw["budget"] = "auto", 8 * 32 * 4 * 3
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, **kw)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    with rt:
        _sgd_steps(m, opt, x, 6)
        tensors = _alive(torch.Tensor) + _alive(nn.Parameter)
        _sgd_steps(m, opt, x, 6)
        assert _alive(torch.Tensor) + _alive(nn.Parameter) == tensors
    assert rt.report().steps[-1].recomputed_bytes > 0


class _KeepsLast(nn.Module):
    """Keeps its latest output on itself (a feature for a probe, a recurrent memory)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.last: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x + torch.tanh(self.fc(x))
        self.last = out
        return out


@pytest.mark.parametrize("mode", MODES)
def test_an_attribute_holding_the_output_keeps_one_graph_not_every_one(mode: str) -> None:
    """NOTE [Attributes with a graph] (changes.py): a block that sets ``self.last = out``
    holds its latest graph, as in plain autograd; the entry values a call keeps for its
    replay hold no graph, so forwards dropped without backward free theirs, as plain's
    do, and no earlier output outlives its forward."""
    m = nn.Sequential(*[_KeepsLast(32) for _ in range(3)])
    outs: list[weakref.ref] = []
    with offrecomp.runtime(m, mode=mode, min_bytes=0):
        for _ in range(12):
            out = m(torch.randn(4, 32))
            outs.append(weakref.ref(out))
            del out
            gc.collect()
    assert [r() is None for r in outs] == [True] * 11 + [False]  # the last held by blocks[2].last
    for blk in m:
        blk.last = None  # the graph it held would keep the runtime (a known limit)


class _StoresAux(nn.Module):
    """A block keeping a side activation on itself, for logging: the loss never reads it,
    so its nodes never run in backward and their offloaded saves are never unpacked."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.aux_fc = nn.Linear(64, 64)
        self.aux: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        self.aux = torch.tanh(self.aux_fc(y))
        return x + torch.relu(y)


def test_reloads_of_saves_no_node_reads_go_at_the_backwards_end() -> None:
    """NOTE [Reloads at a backward's end] (groups.py): each block's group was reloaded for
    the saves its backward reads and kept on the device, for the stored branch's, after
    the backward (4 x 128 KiB here) until the next forward rebound the attribute."""
    torch.manual_seed(0)
    m = nn.Sequential(*[_StoresAux() for _ in range(4)])
    ref = copy.deepcopy(m)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    held = []
    with rt:
        for step in range(3):
            x = torch.randn(4, 32, 64, generator=torch.Generator().manual_seed(step))
            m(x).pow(2).mean().backward()
            ref(x).pow(2).mean().backward()
            for a, b in zip(m.parameters(), ref.parameters()):
                assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)  # type: ignore[arg-type]
            m.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
            engine = rt.offload_engine
            assert engine is not None
            held.append(engine.device_bytes)
    assert rt.report().steps[-1].offloaded_bytes > 0
    assert held == [0, 0, 0]
    assert m[0].aux is not None and torch.equal(m[0].aux, ref[0].aux)  # type: ignore[arg-type]


@contextlib.contextmanager
def _offload_with_late_copies(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[nn.Module, offrecomp.Runtime]]:
    """The model under forced offload, entered, one step run, its copies from then on
    left to land when something waits on them."""
    monkeypatch.setattr(offrecomp.backends, "START_DELAY_S", 1.0)  # no copy lands by itself
    m = _model()
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    with rt:
        m(torch.randn(32, 64)).sum().backward()
        yield m, rt


def test_a_dropped_graph_lets_go_of_the_sources_of_its_copies_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Freed sources] (offload.py): the groups of a forward whose graph dies before
    their copies landed let go of their device sources with it, as plain autograd frees
    them; left in the engine's stash, they would stay until its next call (the next
    forward, or the runtime's exit)."""
    with _offload_with_late_copies(monkeypatch) as (m, rt):
        engine = rt.offload_engine
        assert engine is not None
        out = m(torch.randn(32, 64)).sum()
        assert engine.stash_bytes > 0  # in flight still
        del out
        assert (engine.stash_bytes, engine.device_bytes) == (0, 0)


@pytest.mark.serve_held
def test_a_backward_that_raises_lets_go_of_the_sources_it_was_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Freed sources]: a backward interrupted inside a block whose group it was
    being served (its sources handed out, the copy not landed: NOTE [Served groups] in
    transfer.py) frees the group with its graph, and its sources with it, not at the
    engine's next call."""
    with _offload_with_late_copies(monkeypatch) as (m, rt):
        engine = rt.offload_engine
        assert engine is not None
        inner = []
        hook = m[-1].fc.register_forward_hook(lambda mod, args, out: inner.append(out))
        out = m(torch.randn(32, 64)).sum()
        hook.remove()

        def stop(grad: torch.Tensor) -> torch.Tensor:
            raise KeyboardInterrupt

        inner[0].register_hook(stop)  # the last block's mul and tanh read their saves, its fc not
        with pytest.raises(KeyboardInterrupt):
            out.backward()
        assert engine.stash_bytes > 0
        del out
        inner.clear()
        assert (engine.stash_bytes, engine.device_bytes) == (0, 0)
    assert rt.report().steps[-1].served_groups > 0


def test_a_later_backward_that_stops_inside_the_blocks_lets_go_of_its_reloads() -> None:
    """NOTE [Reloads at a backward's end] (groups.py): a later backward of a finished
    pass (``autograd.grad`` of a block's inner tensor, the graph kept) lets go of its
    reloads at its end; the group it stopped in would otherwise stay reloaded until the
    graph dies, one more group for each such backward."""
    torch.manual_seed(0)
    m = nn.Sequential(*[Block(64) for _ in range(4)])
    ref = copy.deepcopy(m)
    x = torch.randn(32, 64)

    def run(model: nn.Module, engine_bytes: Callable[[], int]) -> tuple[list[torch.Tensor], list[int]]:
        inner: list[torch.Tensor] = []
        hooks = [b.fc.register_forward_hook(lambda mod, args, out: inner.append(out)) for b in model]
        loss = model(x).pow(2).mean()
        for h in hooks:
            h.remove()
        loss.backward(retain_graph=True)
        grads, held = [p.grad.clone() for p in model.parameters()], []  # type: ignore[union-attr]
        for t in inner:
            grads += torch.autograd.grad(loss, t, retain_graph=True)
            held.append(engine_bytes())
        return grads, held

    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    with rt:
        got, held = run(m, lambda: rt.offload_engine.device_bytes)  # type: ignore[union-attr]
    want, _ = run(ref, lambda: 0)
    assert rt.report().steps[-1].offloaded_bytes > 0
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert held == [0, 0, 0, 0]


def _cyclic_tensors() -> list[torch.Tensor]:
    """The tensors a garbage collection finds in reference cycles now."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return [o for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("replay_op_us", [None, 0.0])
def test_replays_under_the_serving_mode_leave_no_cycle_holding_their_tensors(replay_op_us: float | None) -> None:
    """A replay under the serving mode that stops at a later op hung its stop on the mode,
    which the capture refers to: a cycle holding every tensor the replay captured until a
    garbage collection, after backward had freed them (auto's calibration step, whose
    probes serve, held 3.2x recompute's peak and kept 2.4x of it past the optimizer step
    in an encoder-decoder). The collector must find no tensor in a cycle, at any phase."""
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.TransformerEncoderLayer(32, 4, 64, 0.1, batch_first=True) for _ in range(3)])
    kw: dict[str, Any] = {} if replay_op_us is None else {"replay_op_us": replay_op_us}
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget=1, **kw)  # the most frugal plan
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    x = torch.randn(4, 16, 32)
    with rt:
        for _ in range(5):
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            cyclic = _cyclic_tensors()
            assert not cyclic, [tuple(t.shape) for t in cyclic[:4]]
    assert [s.phase for s in rt.report().steps][:2] == ["measure", "calibrate"]
    assert rt.report().steps[-1].replays > 0


class _GrownCache(nn.Module):
    """Attention-free block with a cos table kept as a buffer and grown in forward when a
    longer sequence arrives (as lazily sized RoPE caches are)."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.register_buffer("cos", torch.ones(8, d), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if self.cos.shape[0] < t:
            # random: a build the serving mode may not look past (NOTE [Skipped builds])
            pos = torch.rand(t, generator=torch.Generator().manual_seed(t), dtype=x.dtype) * t
            inv = torch.linspace(0.1, 1.0, x.shape[-1])[: x.shape[-1] // 2]
            freqs = torch.outer(pos, inv)
            self.cos = torch.cat([freqs, freqs], -1).cos()
        return x + torch.tanh(self.fc(x * self.cos[:t]))


def test_a_diverged_serving_replay_leaves_no_cycle_holding_its_tensors() -> None:
    """A serving replay that diverges (here a calibration probe of a call that took
    from a cache the table its recording built with random numbers) left the serving mode holding its
    divergence, whose traceback holds the mode and the replayed forward's frames: every
    tensor of that replay lived until a garbage collection, after backward (a
    calibration step held 1.5-1.6x recompute's peak in a long-sequence sweep). The
    collector must find no tensor in a cycle; gradients bitwise."""
    torch.manual_seed(0)
    model = nn.Sequential(*(_GrownCache() for _ in range(3)))
    lengths = [48, 64, 96, 128, 96, 128]

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, lengths[s], 32, generator=torch.Generator().manual_seed(s))

    ref, m = copy.deepcopy(model), copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0)
    gc.collect()  # what earlier tests left
    with rt:
        for s in range(len(lengths)):
            for net in (ref, m):
                net.zero_grad(set_to_none=True)
                net(batch(s)).square().mean().backward()
            assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), m.parameters()))  # type: ignore[arg-type]
            if s == 0:
                gc.collect()  # the first step imports modules lazily (torch.fx), which leaves cycles once
                continue
            cyclic = _cyclic_tensors()
            assert not cyclic, (s, [tuple(t.shape) for t in cyclic[:4]])
    assert "calibrate" in [r.phase for r in rt.report().steps]


def test_an_entry_forgets_the_wrappers_it_did_not_put_back() -> None:
    """NOTE [Wrappers kept across entries]: a wrapper kept for a module (and the module
    with it) goes at the first entry that did not put it back: one of a module replaced
    since would keep that module alive for the runtime's life."""
    from offrecomp.slots import Installed, KeptWrappers

    kept = KeptWrappers()
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)

    def made(m: nn.Module) -> Callable[[], Installed]:
        return lambda: Installed(m.forward, m, "forward", None)

    wa = kept.wrapper(a, "forward", "a", None, False, made(a))
    kept.wrapper(b, "forward", "b", None, False, made(b))
    kept.settle()
    assert kept.wrapper(a, "forward", "a", None, False, made(a)) is wa  # the next entry puts back a's only
    kept.settle()
    gone = weakref.ref(b)
    del b
    gc.collect()
    assert gone() is None
    assert kept.wrapper(a, "forward", "a", None, True, made(a)) is not wa  # made for a model without compiled code


class _MultiHookBlock(nn.Module):
    """A block registering a multi-grad hook over two of its activations at each call:
    the hook torch registers keeps both nodes, a cycle through C++ that a graph never
    differentiated (a replay's) never breaks."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.fc1(x)
        v = torch.nn.functional.gelu(u)
        if u.requires_grad:
            torch.autograd.graph.register_multi_grad_hook((u, v), lambda grads: None)
        return x + self.fc2(v)


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_replay_graph_kept_alive_by_the_block_keeps_no_activation(mode: str) -> None:
    """NOTE [Replay graphs kept alive] (replay.py): a block's multi-grad hook keeps its
    replay's graph alive for good (as under torch.utils.checkpoint), and the graph held
    the replay's capture with every activation it captured: 2.3 MB a step on a 4-block
    model. The capture lets go of them once the replay returned: no tensor of an
    activation's size outlives the steps (the graph's nodes and the replay's input
    leaves, which share the block inputs' storages, still do)."""
    torch.manual_seed(0)
    m = nn.Sequential(*(_MultiHookBlock() for _ in range(4)))
    x = torch.randn(8, 32, 16)
    act = 8 * 32 * 64 * 4  # fc1's output, which gelu saves

    def activations() -> int:
        gc.collect()
        return sum(
            1 for o in gc.get_objects()
            if type(o) is torch.Tensor and o.layout == torch.strided and o.untyped_storage().nbytes() == act
        )

    kw: dict[str, Any] = {"budget": 1} if mode == "auto" else {}
    with offrecomp.runtime(m, mode=mode, min_bytes=0, **kw) as rt:
        for _ in range(3):
            m(x).square().mean().backward()
        before = activations()
        for _ in range(4):
            m(x).square().mean().backward()
        assert activations() == before, (before, activations())
    assert rt.report().steps[-1].replays > 0


class _StateArg(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, st: Any) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * st.scale + x


class _ClassPerCall(nn.Module):
    """Makes a class per forward (``make_dataclass``) and hands its instance to the blocks."""

    def __init__(self, made: list[weakref.ref[type]]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_StateArg() for _ in range(3))
        self.made = made

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = dataclasses.make_dataclass("State", [("scale", float)])
        self.made.append(weakref.ref(state))
        st = state(1.0)
        for b in self.blocks:
            x = b(x, st)
        return x.square().mean()


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_classes_a_forward_makes_per_call_are_not_kept(mode: str) -> None:
    """The tables of argument types (RNG kinds, slot names) hold their classes weakly: a
    class made per forward goes with its step's graph."""
    made: list[weakref.ref[type]] = []
    m = _ClassPerCall(made)
    with offrecomp.runtime(m, mode=mode, min_bytes=0):
        for i in range(12):
            m(torch.randn(4, 16, generator=torch.Generator().manual_seed(i))).backward()
    gc.collect()
    assert sum(r() is not None for r in made) == 0


_FIRST_RUNTIME = """
import gc, sys, weakref
import torch
from torch import nn
import offrecomp
assert "torch._dynamo" not in sys.modules

def trial():
    m = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(3)])
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    with rt:
        m(torch.randn(32, 64)).sum().backward()
    engine = rt.offload_engine
    ref = weakref.ref(rt)
    del rt
    return ref() is None, engine.closed

gc.collect()
gc.disable()
print(trial(), trial())
"""


def test_the_first_runtime_of_a_process_is_freed_at_once() -> None:
    """The first entry imports torch._dynamo off the caller's thread: on it, the import's
    cyclic garbage held the entry's frame, and the runtime with its pool, until a GC."""
    out = subprocess.run([sys.executable, "-c", _FIRST_RUNTIME], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(True, True) (True, True)", out.stdout


@pytest.mark.parametrize("mode", MODES)
def test_a_dropped_model_and_runtime_go_by_refcounting(mode: str) -> None:
    """NOTE [Wrappers and the installer], NOTE [Pass retirement]: with the collector off,
    ``del model, rt`` after training frees the model's modules and parameters (wrappers
    reached the installer, regions their wrappers, the planner its calls, and passes left
    unretired their records, all strongly: the model waited for a collection, and under
    ``gc.freeze()`` for ever)."""
    model, batch = make("gpt_dropout")
    warm = offrecomp.runtime(model, mode=mode, min_bytes=0)  # the planner's kernels loaded
    train(model, batch, warm, steps=4)
    del warm
    gc.collect()
    gc.disable()
    try:
        model, batch = make("gpt_dropout")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rt = offrecomp.runtime(model, mode=mode, min_bytes=0)
        with rt:
            for i in range(4):
                model(batch(i)).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        parts = [weakref.ref(t) for t in (*model.modules(), *model.parameters())]
        del model, rt, opt
        alive = sum(r() is not None for r in parts)
    finally:
        gc.enable()
    assert alive == 0, f"{alive} of {len(parts)} modules and parameters alive"


def test_a_root_wrapper_a_patch_put_back_after_exit_holds_no_runtime() -> None:
    """NOTE [Wrappers and the installer]: ``mock.patch`` of the model's forward while
    entered puts the runtime's wrapper back in the slot after the exit; the wrapper
    reaches the lifecycle through the installer, weakly, so ``del rt`` frees it."""
    from unittest import mock

    m = _model()
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    rt.__enter__()
    def patched(*a: Any, _orig: Any = m.forward, **k: Any) -> Any:
        return _orig(*a, **k)

    with mock.patch.object(m, "forward", patched):
        m(torch.randn(8, 64)).sum().backward()
        rt.__exit__(None, None, None)
    assert isinstance(m.__dict__.get("forward"), offrecomp.slots.Installed)
    life = weakref.ref(rt._life)
    del rt, patched
    assert life() is None
    m(torch.randn(8, 64)).sum().backward()  # the wrapper left runs the forward plainly
