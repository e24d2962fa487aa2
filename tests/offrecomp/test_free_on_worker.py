"""Frees that run on a copy worker (NOTE [Frees on a copy worker] in groups.py).

A collection may start on any thread that allocates, the emulated backend's copy
workers included, and drop the last saved tensor of a region call there: the free it
runs must not wait on a copy that the waiting thread itself would run. Emulated waits
time out after ``_HOST_WAIT_TIMEOUT_S`` (lowered here), so such a wait shows as an
error, a stall, or a group never freed rather than as a hung test.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp import _torch_compat as tc
from offrecomp import backends
from offrecomp.backends import EmulatedBackend
from offrecomp.config import Prefetch
from offrecomp.offload import OffloadEngine
from offrecomp.transfer import GroupState
from tests.helpers import offload_group

CPU = torch.device("cpu")


def _engine(backend: EmulatedBackend, regions: int = 2) -> OffloadEngine:
    return OffloadEngine(backend=backend, host_limit_bytes=1 << 26, prefetch=Prefetch(regions=regions))


def _on_worker_copy(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> list[str]:
    """Run ``action`` once, inside the next copy job a side stream's worker runs (where
    a collection its allocation starts would run finalisers); the names of the threads
    it ran on."""
    original = tc.foreach_copy_
    ran: list[str] = []

    def copy(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
        name = threading.current_thread().name
        if name.startswith("offrecomp-side") and not ran:
            ran.append(name)
            action()
        original(dsts, srcs)

    monkeypatch.setattr(tc, "foreach_copy_", copy)
    return ran


def test_a_free_on_the_reloading_worker_does_not_wait_on_its_own_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "_HOST_WAIT_TIMEOUT_S", 3.0)
    backend = EmulatedBackend()
    eng = _engine(backend)
    try:
        a, b, c = (offload_group(eng, [torch.randn(1024, generator=torch.Generator().manual_seed(i))], i)
                   for i in range(3))
        eng.synchronize()
        ran = _on_worker_copy(monkeypatch, lambda: eng.free(a))
        eng.fetch(c)  # reloads c and prefetches b and a behind it on the H2D worker
        assert a.state is GroupState.RELOADING and b.state is GroupState.RELOADING
        deadline = time.monotonic() + 5.0
        while not ran and time.monotonic() < deadline:  # the worker runs b's copy, outside the engine
            time.sleep(0.005)
        start = time.perf_counter()
        eng.fetch(b)  # takes the engine lock; a's free ran on the worker meanwhile
        took = time.perf_counter() - start
        eng.synchronize()  # raises an error a worker recorded (a timed-out wait)
        assert ran and ran[0].startswith("offrecomp-side")
        assert took < 2.0, f"fetch waited {took:.2f} s on a free that waited on its own stream"
        assert a.state is GroupState.FREED
        eng.free(b)
        eng.free(c)
        eng.synchronize()
        assert a.buffer is None and a.block is None  # the held reload went once it landed
        assert eng.pool.stats().in_use_bytes == 0 and eng.device_bytes == 0
    finally:
        eng.close()


def test_a_free_in_a_copy_job_this_thread_runs_leaves_the_sources_to_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that drains a side stream itself (before a fork, at exit: no engine call
    on its stack) runs its jobs; a free a job's finaliser runs there must not wait on a
    copy queued behind that job (NOTE [Freed sources] in offload.py): it would wait on
    the job this thread runs, until the wait timed out."""
    monkeypatch.setattr(backends, "_HOST_WAIT_TIMEOUT_S", 3.0)
    backend = EmulatedBackend(start_delay_s=5.0)  # no worker runs a job first: this thread does
    eng = _engine(backend)
    try:
        a, b = (offload_group(eng, [torch.randn(1024, generator=torch.Generator().manual_seed(i))], i)
                for i in range(2))
        ran: list[str] = []
        original = tc.foreach_copy_

        def copy(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
            if not ran:
                ran.append(threading.current_thread().name)
                eng.free(b)  # b's copy is the next job of the stream
            original(dsts, srcs)

        monkeypatch.setattr(tc, "foreach_copy_", copy)
        start = time.perf_counter()
        backend.synchronize()  # as the at-fork drain does
        took = time.perf_counter() - start
        assert ran == [threading.current_thread().name]
        assert took < 2.0, f"the drain took {took:.2f} s: the free waited on the copy behind its own job"
        assert b.state is GroupState.FREED
        eng.free(a)
        eng.synchronize()
        assert eng.live_groups == 0 and eng.device_bytes == 0 and eng.pool.stats().in_use_bytes == 0
    finally:
        eng.close()


def test_a_free_interrupted_in_its_wait_keeps_the_sources_for_their_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Freed sources]: a free lets go of the sources after compute waits on their
    copy; interrupted in that wait, the group is freed and its sources stay held until
    the copy landed (dropped first, the copy would read memory handed back: the emulated
    backend's error at the next call, a corrupted copy on a GPU; left live, the group
    would keep its pinned block for good)."""
    backend = EmulatedBackend(start_delay_s=5.0)
    eng = _engine(backend)
    try:
        group = offload_group(eng, [torch.randn(1024)], 0)
        original = eng._wait_edge

        def interrupted(edge: str, stream: object, event: object) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(eng, "_wait_edge", interrupted)
        with pytest.raises(KeyboardInterrupt):
            eng.free(group)
        monkeypatch.setattr(eng, "_wait_edge", original)
        assert group.state is GroupState.FREED and eng.live_groups == 0
        assert eng.stash_bytes == group.payload_bytes  # held for the copy still
        eng.synchronize()  # raises a copy whose source was freed before it ran
        assert eng.device_bytes == 0 and eng.pool.stats().in_use_bytes == 0
    finally:
        eng.close()


def test_a_freed_reload_keeps_its_buffer_until_its_copy_landed() -> None:
    """The free does not wait on a reload in flight (edge 6 of a release); the buffer,
    which the copy writes, is dropped only once the copy landed."""
    backend = EmulatedBackend(copy_delay_s=0.3)
    eng = _engine(backend, regions=1)
    try:
        below = offload_group(eng, [torch.randn(256)], 0)
        top = offload_group(eng, [torch.randn(256)], 1)
        eng.synchronize()
        eng.fetch(top)  # waits for top's slow reload; below's is queued behind it
        assert below.state is GroupState.RELOADING and not backend.query(below.h2d_done)
        start = time.perf_counter()
        eng.free(below)
        assert time.perf_counter() - start < 0.2, "the free waited on the reload"
        assert below.state is GroupState.FREED
        assert below.buffer is not None, "the buffer went while its copy was in flight"
        assert eng.device_bytes == top.nbytes  # below's reload is no longer the engine's
        eng.synchronize()  # landed: the next engine call drops it
        assert below.buffer is None and below.block is None
    finally:
        eng.close()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def test_the_last_free_of_a_closed_runtime_on_a_worker_closes_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed runtime's engine closes with its last group; when that group is freed on
    a copy worker, closing (which waits on every stream) must not run there."""
    monkeypatch.setattr(backends, "_HOST_WAIT_TIMEOUT_S", 3.0)
    torch.manual_seed(0)
    model = nn.Sequential(*(_Block() for _ in range(3)))
    rt = offrecomp.runtime(model, mode="offload", min_bytes=0)
    with rt:
        held = [model(torch.randn(8, 64)).sum()]  # no backward: its groups stay live
    rt.close()
    eng = rt.offload_engine
    assert eng is not None and rt.offload_groups_held > 0
    backend = eng.backend
    assert isinstance(backend, EmulatedBackend)
    d2h, h2d = eng.copy_streams(CPU)
    workers = [d2h.worker, h2d.worker]
    def drop() -> None:
        held.clear()
        gc.collect()

    ran = _on_worker_copy(monkeypatch, drop)
    src = torch.ones(4)  # held until its copy ran, as the engine holds its sources
    start = time.monotonic()
    backend.copy_many([torch.empty(4)], [src], d2h)
    while any(w is not None and w.is_alive() for w in workers) and time.monotonic() < start + 10.0:
        time.sleep(0.01)  # closing stops the workers last
    took = time.monotonic() - start
    assert ran == ["offrecomp-side0"]
    assert eng.closed, "the engine did not close"
    assert took < 2.0, f"closing took {took:.2f} s: it waited on the stream whose job closed it"
    assert rt.offload_engine is None and rt.offload_groups_held == 0
    backend.check()  # no worker recorded an error
