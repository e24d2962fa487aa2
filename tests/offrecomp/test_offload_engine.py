"""The grouped offload engine on the emulated backend: data, ordering edges, prefetch,
lifecycle.

Every ordering test runs twice: as written (the data must be right) and with exactly one
edge removed through ``_wait_edge`` (the test asserts that the race then shows up), so a
test that would pass without the edge it guards cannot go unnoticed. On the emulated
backend compute is the host thread, so the edges that order side streams after compute
(the producer, the allocation) cannot corrupt data here; they are checked structurally
on the logged stream operations, and the CUDA tier checks the race itself.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch

from offrecomp.backends import EmulatedBackend, _EmuStream
from offrecomp.config import Prefetch
from offrecomp.offload import Edge, OffloadEngine
from offrecomp.pool import ALIGN_BYTES
from offrecomp.transfer import BACKWARD_START, Group, GroupState, slot_offsets
from tests.helpers import offload_group

KiB, MiB = 1 << 10, 1 << 20
SLOW = 0.25  # seconds a deliberately slow copy sleeps
CPU = torch.device("cpu")


def make_engine(
    *, backend: EmulatedBackend | None = None, prefetch: Prefetch | None = None,
    window_bytes: int = 64 * MiB, host_limit_bytes: int = 64 * MiB,
) -> OffloadEngine:
    return OffloadEngine(
        backend=backend or EmulatedBackend(),
        host_limit_bytes=host_limit_bytes,
        prefetch=prefetch or Prefetch(regions=1),
        window_bytes=window_bytes,
        slab_bytes=4 * MiB,
        host_pressure_bytes=0,
    )


def emu(eng: OffloadEngine) -> EmulatedBackend:
    assert isinstance(eng.backend, EmulatedBackend)
    return eng.backend


@pytest.fixture()
def engine() -> Iterator[OffloadEngine]:
    eng = make_engine()
    yield eng
    eng.close()


def random_bytes(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 255, (n,), dtype=torch.uint8, generator=gen)  # never 0xFF


def offload(eng: OffloadEngine, sources: Sequence[torch.Tensor], ordinal: int = 0) -> Group:
    group = offload_group(eng, list(sources), ordinal)
    assert group is not None
    return group


def slot(buf: torch.Tensor, group: Group, i: int) -> torch.Tensor:
    """Storage ``i`` of a fetched group (how the hooks rebuild a saved tensor)."""
    return buf[group.offsets[i] : group.offsets[i] + group.sizes[i]]


@contextlib.contextmanager
def without_edge(engine: OffloadEngine, edge: Edge) -> Iterator[None]:
    """Remove exactly one ordering edge of NOTE [Stream ordering]."""
    original = engine._wait_edge

    def patched(name: Edge, stream: Any, event: Any) -> None:
        if name != edge:
            original(name, stream, event)

    setattr(engine, "_wait_edge", patched)  # noqa: B010 (an instance attribute shadows the method)
    try:
        yield
    finally:
        del engine._wait_edge


def expect_race(scenario: Callable[[OffloadEngine], None], edge: Edge, *, match: str,
                window_bytes: int = 64 * MiB) -> None:
    """Run ``scenario`` on a fresh engine with ``edge`` removed: it must fail with ``match``."""
    eng = make_engine(window_bytes=window_bytes)
    try:
        with without_edge(eng, edge), pytest.raises((AssertionError, RuntimeError), match=match):
            scenario(eng)
    finally:
        emu(eng).copy_delay_s = 0.0
        with contextlib.suppress(RuntimeError):
            eng.synchronize()
        eng.close()


# --------------------------------------------------------------------------- data


def test_slot_offsets_are_aligned_and_packed() -> None:
    offsets, total = slot_offsets([1, 512, 513, 0, 7])
    assert offsets == [0, 512, 1024, 2048, 2048]
    assert total == 2048 + 512
    assert all(o % ALIGN_BYTES == 0 for o in offsets)


@pytest.mark.parametrize("prefetch", [Prefetch(regions=2), Prefetch(nbytes=256 * KiB)])
def test_round_trip_is_bitwise(prefetch: Prefetch) -> None:
    eng = make_engine(prefetch=prefetch)
    sizes = [1, 3, 511, 512, 513, 4095, 65536, 100_003, 1 << 20]
    data = [random_bytes(n, seed=i) for i, n in enumerate(sizes)]
    try:
        groups = [offload(eng, [d.clone() for d in data[i : i + 3]], ordinal=i // 3) for i in range(0, 9, 3)]
        for g, group in reversed(list(enumerate(groups))):
            buf = eng.fetch(group)
            assert buf.dtype == torch.uint8 and buf.numel() == group.nbytes
            for i in range(3):
                assert torch.equal(slot(buf, group, i), data[3 * g + i])
            eng.release_device(group)
            eng.free(group)
        eng.synchronize()
        assert eng.live_groups == 0 and eng.pool.stats().in_use_bytes == 0
    finally:
        eng.close()


def test_one_block_and_one_reload_per_group(engine: OffloadEngine) -> None:
    group = offload(engine, [random_bytes(1000, seed=s) for s in range(16)])
    assert engine.pool.stats().allocs == 1  # one pinned block for the 16 storages
    engine.fetch(group)
    stats = engine.end_step()
    assert stats.groups_offloaded == 1 and stats.storages_offloaded == 16
    assert stats.groups_reloaded == 1 and stats.bytes_d2h == stats.bytes_h2d == 16 * 1000


# ------------------------------------------------------------------ ordering edges


def scenario_reload_after_offload(eng: OffloadEngine) -> None:
    """Slow D2H copy; the reload is issued at once. Only edge 3 keeps H2D behind D2H."""
    data = random_bytes(64 * KiB)
    emu(eng).copy_delay_s = SLOW  # the D2H copy sleeps
    group = offload(eng, [data.clone()])
    emu(eng).copy_delay_s = 0.0  # the H2D copy does not
    got = slot(eng.fetch(group), group, 0).clone()
    assert torch.equal(got, data), "reload read the host block before the D2H copy wrote it"


def test_edge_h2d_waits_on_its_own_d2h(engine: OffloadEngine) -> None:
    scenario_reload_after_offload(engine)
    expect_race(scenario_reload_after_offload, "h2d_after_d2h", match="before the D2H copy")


def scenario_compute_after_reload(eng: OffloadEngine) -> None:
    """D2H landed; slow H2D. Only edge 5 keeps the caller from reading the buffer early."""
    data = random_bytes(64 * KiB, seed=2)
    group = offload(eng, [data.clone()])
    eng.synchronize()
    emu(eng).copy_delay_s = SLOW
    got = slot(eng.fetch(group), group, 0).clone()  # the caller reads as soon as fetch returns
    assert torch.equal(got, data), "compute read the reload buffer before the H2D copy landed"


def test_edge_compute_waits_on_h2d(engine: OffloadEngine) -> None:
    t0 = time.perf_counter()
    scenario_compute_after_reload(engine)
    assert time.perf_counter() - t0 >= SLOW * 0.8  # the emulated host really waited
    stats = engine.end_step()
    assert stats.stall_seconds >= SLOW * 0.8
    expect_race(scenario_compute_after_reload, "compute_after_h2d", match="before the H2D copy")


def scenario_window_release(eng: OffloadEngine) -> None:
    """Window of 0 bytes: a group's sources go at once, after compute waits on its copy."""
    data = random_bytes(64 * KiB, seed=3)
    emu(eng).copy_delay_s = SLOW
    src = data.clone()
    group = offload(eng, [src])
    del src  # the caller's reference: only the engine could keep the source alive now
    emu(eng).copy_delay_s = 0.0
    assert eng.stash_bytes == 0
    assert torch.equal(slot(eng.fetch(group), group, 0).clone(), data)


def test_edge_compute_waits_on_d2h_before_source_release() -> None:
    eng = make_engine(window_bytes=0)
    try:
        scenario_window_release(eng)
        assert eng.end_step().window_waits == 1
    finally:
        eng.close()
    expect_race(scenario_window_release, "compute_after_d2h", window_bytes=0,
                match="freed before its copy ran")


def scenario_planned_release(eng: OffloadEngine) -> None:
    """A plan lets go of a group's sources at the end of its unit 3 (NOTE [Planned
    release] in groups.py), before the slow copy landed: compute waits on it first."""
    data = random_bytes(64 * KiB, seed=5)
    emu(eng).copy_delay_s = SLOW
    src = data.clone()
    group = offload_group(eng, [src], ordinal=1, release_at=3)
    del src  # only the engine keeps the source alive now
    eng.release_due(2)
    assert eng.stash_bytes == 64 * KiB  # not due yet, and the copy has not landed
    eng.release_due(3)
    assert eng.stash_bytes == 0
    emu(eng).copy_delay_s = 0.0
    assert torch.equal(slot(eng.fetch(group), group, 0).clone(), data)


def test_edge_compute_waits_on_d2h_before_a_planned_release() -> None:
    eng = make_engine()
    try:
        scenario_planned_release(eng)
        stats = eng.end_step()
        assert (stats.release_waits, stats.window_waits) == (1, 0)
    finally:
        eng.close()
    expect_race(scenario_planned_release, "compute_after_d2h", match="freed before its copy ran")


def test_planned_release_leaves_unplanned_groups_to_the_polls(engine: OffloadEngine) -> None:
    """Backward's start lets go of every planned group, none issued outside a plan; a
    landed planned group costs compute no wait."""
    planned = offload_group(engine, [random_bytes(16 * KiB, seed=6)], ordinal=0, release_at=1)
    engine.synchronize()  # landed; the poll inside synchronize dropped it already
    assert planned is not None and engine.stash_bytes == 0
    emu(engine).copy_delay_s = SLOW / 3
    free = offload(engine, [random_bytes(16 * KiB, seed=7)], ordinal=1)
    engine.release_due(BACKWARD_START)
    assert engine.stash_bytes == 16 * KiB  # not a plan's: the copy's landing lets go of it
    emu(engine).copy_delay_s = 0.0
    engine.synchronize()
    assert engine.stash_bytes == 0 and engine.end_step().release_waits == 0
    assert free.state is GroupState.OFFLOADED


def test_backward_does_not_drain_the_copies(engine: OffloadEngine) -> None:
    """Sources of copies in flight stay in the stash until they land, with no wait on
    compute; a fetch of such a group is still ordered after its own copy."""
    data = [random_bytes(16 * KiB, seed=s) for s in range(3)]
    emu(engine).copy_delay_s = SLOW / 3
    groups = [offload(engine, [d.clone()], ordinal=i) for i, d in enumerate(data)]
    emu(engine).copy_delay_s = 0.0
    assert engine.stash_bytes == 3 * 16 * KiB  # the clones died; the stash holds them
    for d, g in reversed(list(zip(data, groups))):
        assert torch.equal(slot(engine.fetch(g), g, 0).clone(), d)
    engine.synchronize()
    assert engine.stash_bytes == 0 and engine.end_step().window_waits == 0


def test_dropping_sources_before_d2h_lands_is_detected(engine: OffloadEngine,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # With the stash: the caller drops its sources at once and the data still arrives.
    data = random_bytes(32 * KiB, seed=4)
    emu(engine).copy_delay_s = SLOW
    src = data.clone()
    group = offload(engine, [src])
    del src
    emu(engine).copy_delay_s = 0.0
    assert torch.equal(slot(engine.fetch(group), group, 0).clone(), data)

    # Without it the emulated backend sees the source die under the in-flight copy.
    monkeypatch.setattr(engine, "_keep_sources", lambda entry: None)
    emu(engine).copy_delay_s = SLOW
    src = data.clone()
    group = offload(engine, [src], ordinal=1)
    del src
    emu(engine).copy_delay_s = 0.0
    with pytest.raises(RuntimeError, match="freed before its copy ran"):
        engine.fetch(group)


class SpyBackend(EmulatedBackend):
    """Logs stream operations; ``live`` is what current_stream returns right now."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, Any, Any]] = []
        self.live = self._compute

    def current_stream(self, device: torch.device) -> _EmuStream:
        return self.live

    def record_event(self, stream: _EmuStream, timing: bool = False) -> Any:
        event = super().record_event(stream, timing)
        self.log.append(("record", stream, event))
        return event

    def wait_event(self, stream: _EmuStream, event: Any) -> None:
        self.log.append(("wait", stream, event))
        super().wait_event(stream, event)

    def copy_many(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], stream: _EmuStream) -> None:
        self.log.append(("copy", stream, len(srcs)))
        super().copy_many(dsts, srcs, stream)

    def alloc_device(
        self, nbytes: int, device: torch.device, stream: _EmuStream, storage: Any = None
    ) -> torch.Tensor:
        self.log.append(("alloc", stream, nbytes))
        return super().alloc_device(nbytes, device, stream, storage)


def side_waits_on_compute_event(log: list[tuple[str, Any, Any]], copy_at: int, since: int) -> bool:
    """Between ``since`` and the copy at ``copy_at``, does the copy's stream wait on an
    event recorded on the compute stream in that span?"""
    stream = log[copy_at][1]
    span = log[since:copy_at]
    recorded = {id(e) for op, s, e in span if op == "record" and s.is_compute}
    return any(op == "wait" and s is stream and id(e) in recorded for op, s, e in span)


def test_edge_d2h_waits_on_producer() -> None:
    for remove in (False, True):
        backend = SpyBackend()
        eng = make_engine(backend=backend)
        try:
            ctx = without_edge(eng, "d2h_after_produce") if remove else contextlib.nullcontext()
            with ctx:
                offload(eng, [random_bytes(1 * KiB), random_bytes(2 * KiB)])
            copies = [i for i, (op, _, _) in enumerate(backend.log) if op == "copy"]
            assert len(copies) == 1 and backend.log[copies[0]][2] == 2  # one call for the group
            assert side_waits_on_compute_event(backend.log, copies[0], 0) is not remove
        finally:
            eng.close()


def test_edge_h2d_waits_on_the_allocation() -> None:
    for remove in (False, True):
        backend = SpyBackend()
        eng = make_engine(backend=backend)
        try:
            group = offload(eng, [random_bytes(1 * KiB)])
            backend.log.clear()
            ctx = without_edge(eng, "h2d_after_alloc") if remove else contextlib.nullcontext()
            with ctx:
                eng.fetch(group)
            log = backend.log
            alloc = next(i for i, (op, _, _) in enumerate(log) if op == "alloc")
            assert log[alloc][1] is backend.live  # allocated on compute, the reader
            copy = next(i for i, (op, _, _) in enumerate(log) if op == "copy")
            assert copy > alloc
            assert side_waits_on_compute_event(log, copy, alloc) is not remove
        finally:
            eng.close()


def test_edge_release_of_an_unfetched_reload_waits_on_it() -> None:
    """A prefetched group released without a fetch: compute waits on its H2D copy
    before the engine drops the buffer (edge 6)."""
    for remove in (False, True):
        backend = SpyBackend()
        eng = make_engine(backend=backend, prefetch=Prefetch(regions=1))
        try:
            below = offload(eng, [random_bytes(1 * KiB)], ordinal=0)
            top = offload(eng, [random_bytes(1 * KiB, seed=1)], ordinal=1)
            eng.fetch(top)  # prefetches `below`
            assert below.state is GroupState.RELOADING
            backend.log.clear()
            ctx = without_edge(eng, "free_after_h2d") if remove else contextlib.nullcontext()
            with ctx:
                eng.release_device(below)
            waits = [e for op, s, e in backend.log if op == "wait" and s is backend.live]
            assert (waits == [below.h2d_done]) is not remove
            assert below.state is GroupState.OFFLOADED and below.buffer is None
        finally:
            eng.close()


def test_compute_stream_is_looked_up_live() -> None:
    backend = SpyBackend()
    eng = make_engine(backend=backend)
    try:
        first = backend.live
        group = offload(eng, [random_bytes(1 * KiB)])
        backend.live = _EmuStream("compute-other", None)  # the caller switched streams
        backend.log.clear()
        eng.fetch(group)
        compute_waits = [s for op, s, _ in backend.log if op == "wait" and s.is_compute]
        assert compute_waits == [backend.live]  # not the stream seen at offload
        assert first is not backend.live
    finally:
        eng.close()


def test_compute_waits_once_per_reload(engine: OffloadEngine) -> None:
    group = offload(engine, [random_bytes(KiB, seed=s) for s in range(4)])
    first = engine.fetch(group)
    again = engine.fetch(group)  # a second save of the group: no more work
    assert again is first
    stats = engine.end_step()
    assert stats.groups_reloaded == 1 and stats.reload_host_seconds > 0
    assert stats.offload_host_seconds > 0


def test_host_block_is_not_reused_under_a_reload(engine: OffloadEngine,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Compute's wait on an unfetched reload (edge 6) blocks the emulated host, where on a
    # GPU it is queued: removed here, so the host goes on while the reload is in flight.
    stack = contextlib.ExitStack()
    stack.enter_context(without_edge(engine, "free_after_h2d"))
    a_data, b_data = random_bytes(64 * KiB, seed=5), random_bytes(64 * KiB, seed=6)
    a = offload(engine, [a_data.clone()])
    engine.synchronize()
    emu(engine).copy_delay_s = SLOW
    engine._reload(a, engine.backend.current_stream(CPU))  # a prefetch in flight
    emu(engine).copy_delay_s = 0.0
    engine.free(a)  # the block must stay out of the pool until the reload read it
    assert engine.pool.stats().in_use_bytes == 64 * KiB
    b = offload(engine, [b_data.clone()], ordinal=1)
    assert b.block is not None and b.block.offset != 0
    engine.synchronize()
    assert engine.pool.stats().in_use_bytes == 64 * KiB  # a's block came back after landing
    assert torch.equal(slot(engine.fetch(b), b, 0).clone(), b_data)

    # Returning blocks on a lie ("everything landed") hands c's block, under its reload,
    # to the next group of its size (NOTE [Idle blocks]), whose copy overwrites it.
    c = offload(engine, [a_data.clone()], ordinal=2)
    engine.synchronize()
    emu(engine).copy_delay_s = SLOW
    engine._reload(c, engine.backend.current_stream(CPU))
    reloaded, block = c.buffer, c.block
    emu(engine).copy_delay_s = 0.0
    monkeypatch.setattr(engine.backend, "query", lambda event: True)
    engine.free(c)
    d = offload(engine, [b_data.clone()], ordinal=3)
    assert d.block is block  # handed on while c's reload still reads it
    monkeypatch.undo()
    engine.synchronize()
    assert reloaded is not None and torch.equal(reloaded[: 64 * KiB], b_data)  # not a_data
    stack.close()


# ---------------------------------------------------------------------- prefetch


def offload_groups(eng: OffloadEngine, groups: int, per_group: int, nbytes: int = 1 * KiB) -> list[Group]:
    out = [
        offload(eng, [random_bytes(nbytes, seed=g * per_group + i) for i in range(per_group)], ordinal=g)
        for g in range(groups)
    ]
    eng.synchronize()
    return out


def reload_log(eng: OffloadEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    log: list[int] = []
    original = eng._reload

    def spy(group: Group, compute: Any) -> None:
        log.append(group.seq)
        original(group, compute)

    monkeypatch.setattr(eng, "_reload", spy)
    return log


@pytest.mark.parametrize(
    ("prefetch", "after_first_fetch"),
    [
        (Prefetch(regions=1), [4, 3]),
        (Prefetch(regions=2), [4, 3, 2]),
        (Prefetch(nbytes=5 * KiB), [4, 3, 2]),  # 2 KiB groups: 4 KiB ahead fit, 6 do not
        (Prefetch(nbytes=1), [4, 3]),  # one reload always allowed
        (Prefetch(), [4]),  # no prefetch
    ],
)
def test_prefetch_issues_expected_reloads(prefetch: Prefetch, after_first_fetch: list[int],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    eng = make_engine(prefetch=prefetch)
    try:
        groups = offload_groups(eng, groups=5, per_group=2)  # seq 0..4, 2 KiB each
        log = reload_log(eng, monkeypatch)
        eng.fetch(groups[4])
        assert log == after_first_fetch
        for g in reversed(groups):  # the whole backward, reverse order
            eng.fetch(g)
            eng.release_device(g)
            if prefetch.nbytes is not None:
                assert eng.outstanding_reload_bytes <= max(prefetch.nbytes, 2 * KiB)
        assert log == [4, 3, 2, 1, 0]  # each exactly once, in reverse offload order
        stats = eng.end_step()
        assert stats.groups_reloaded == 5
        assert stats.prefetches == (0 if prefetch == Prefetch() else 4)
    finally:
        eng.close()


def test_prefetch_skips_nothing_between_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Region calls that offload nothing have no group: the depth counts groups."""
    eng = make_engine(prefetch=Prefetch(regions=2))
    try:
        groups = [offload(eng, [random_bytes(KiB, seed=o)], ordinal=o) for o in (0, 5, 9, 20)]
        log = reload_log(eng, monkeypatch)
        eng.fetch(groups[-1])
        assert log == [3, 2, 1]
    finally:
        eng.close()


def test_prefetch_byte_window_moves_with_the_fetches(monkeypatch: pytest.MonkeyPatch) -> None:
    eng = make_engine(prefetch=Prefetch(nbytes=4 * KiB))
    try:
        groups = offload_groups(eng, groups=5, per_group=2)
        log = reload_log(eng, monkeypatch)
        eng.fetch(groups[4])
        assert eng.outstanding_reload_bytes == 4 * KiB
        eng.fetch(groups[3])  # 3 leaves the window: one more comes in
        assert log == [4, 3, 2, 1]
        assert eng.outstanding_reload_bytes == 4 * KiB
    finally:
        eng.close()


def test_retain_graph_double_fetch(engine: OffloadEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    data = [random_bytes(4 * KiB, seed=s) for s in range(6)]
    groups = [offload(engine, [d.clone()], ordinal=i) for i, d in enumerate(data)]
    log = reload_log(engine, monkeypatch)
    for backward in range(2):
        for d, g in reversed(list(zip(data, groups))):
            first = engine.fetch(g)
            again = engine.fetch(g)  # a storage shared by two saves: same buffer
            assert again is first and torch.equal(slot(first, g, 0), d)
            engine.release_device(g)
            assert g.state is GroupState.OFFLOADED and g.fetches == backward + 1
        assert log == list(range(5, -1, -1)) * (backward + 1)  # each reloaded once a pass
    for g in groups:
        engine.free(g)
    stats = engine.end_step()
    assert stats.bytes_h2d == 2 * 6 * 4 * KiB and stats.bytes_d2h == 6 * 4 * KiB


def test_fetch_of_a_group_from_an_earlier_step(engine: OffloadEngine) -> None:
    data = random_bytes(2 * KiB, seed=9)
    old = offload(engine, [data.clone()])
    engine.end_step()
    new = offload(engine, [random_bytes(2 * KiB)])
    assert new.seq == 0
    assert torch.equal(slot(engine.fetch(old), old, 0), data)
    assert new.state is GroupState.OFFLOADED  # same seq, another step: not prefetched


# ---------------------------------------------------------------------- lifecycle


def test_100_steps_do_not_grow() -> None:
    eng = make_engine(prefetch=Prefetch(regions=2), window_bytes=256 * KiB)
    gen = torch.Generator().manual_seed(0)
    try:
        reserved = []
        for step in range(100):
            sizes = torch.randint(1, 48 * KiB, (8,), generator=gen).tolist()
            groups = [
                offload(eng, [random_bytes(n, seed=step) for n in sizes[i : i + 2]], ordinal=i // 2)
                for i in range(0, 8, 2)
            ]
            for g in reversed(groups):
                eng.fetch(g)
                eng.release_device(g)
                eng.free(g)
            stats = eng.end_step()
            assert stats.live_groups == 0 and stats.groups_offloaded == 4
            reserved.append(stats.pool_reserved_bytes)
        eng.synchronize()
        assert len(set(reserved)) == 1 and reserved[0] == 4 * MiB  # one slab, reused
        assert eng.pool.stats().in_use_bytes == 0 and eng.live_groups == 0
        assert not eng._deferred and eng.stash_bytes == 0 and eng.device_bytes == 0
    finally:
        eng.close()


def test_close_is_idempotent_and_frees_the_pool() -> None:
    eng = make_engine()
    group = offload(eng, [random_bytes(8 * KiB)])
    eng.fetch(group)
    streams = list(emu(eng)._workers)
    eng.close()
    eng.close()
    assert eng.closed and eng.pool.stats().reserved_bytes == 0 and eng.live_groups == 0
    assert group.state is GroupState.FREED
    assert all(s.worker is not None and not s.worker.is_alive() for s in streams)
    eng.free(group)  # harmless after close
    with pytest.raises(RuntimeError, match="closed"):
        eng.open_group(0, CPU)
    with pytest.raises(RuntimeError, match="closed"):
        eng.fetch(group)


def test_stats_are_plausible(engine: OffloadEngine) -> None:
    sizes = [10 * KiB, 20 * KiB, 30 * KiB]
    emu(engine).copy_delay_s = 0.02
    groups = [offload(engine, [random_bytes(n)], ordinal=i) for i, n in enumerate(sizes)]
    for g in reversed(groups):
        engine.fetch(g)
        engine.fetch(g)  # a second fetch moves nothing
    engine.synchronize()
    stats = engine.end_step()
    assert stats.backend == "emulated"
    assert stats.groups_offloaded == 3 and stats.groups_reloaded == 3
    assert stats.bytes_d2h == stats.bytes_h2d == sum(sizes)  # once per storage
    # one copy in TIME_EVERY is timed: the first group's each way
    assert stats.d2h_seconds >= 0.02 * 0.8 and stats.h2d_seconds >= 0.02 * 0.8
    assert stats.d2h_gbps is not None and stats.d2h_gbps > 0
    assert stats.h2d_gbps is not None and stats.h2d_gbps > 0
    assert 0 <= stats.stall_seconds < 5
    assert stats.fallbacks == 0 and stats.pending_timings == 0
    assert stats.pool_in_use_bytes == stats.pool_high_water_bytes == sum(sizes)
    assert stats.live_groups == 3
    assert stats.to_dict()["fallbacks"] == 0
    empty = engine.end_step()
    assert empty.bytes_d2h == 0 and empty.d2h_gbps is None and empty.stall_seconds == 0


def test_add_refuses_past_the_host_limit() -> None:
    eng = make_engine(host_limit_bytes=4 * KiB)
    try:
        group = eng.open_group(0, CPU)
        sources = [random_bytes(2 * KiB), random_bytes(2 * KiB), random_bytes(1)]
        assert [eng.add(group, s.untyped_storage(), s.numel()) for s in sources] == [0, 1, -1]
        assert len(group.sources) == 2  # the refused one was not added
        assert eng.device_bytes == 4 * KiB  # promised to open groups already
        assert eng.end_step().fallbacks_pool_full == 1
    finally:
        eng.close()


def test_a_group_the_pool_refuses_at_issue_is_freed() -> None:
    eng = make_engine(host_limit_bytes=4 * KiB)
    try:
        group = eng.open_group(0, CPU)
        src = random_bytes(2 * KiB)
        assert eng.add(group, src.untyped_storage(), src.numel()) == 0
        eng.pool.limit_bytes = 0  # the pool shrank under the open group
        assert not eng.issue(group)
        assert group.state is GroupState.FREED and group.sources  # the caller keeps them
        assert eng.device_bytes == 0
    finally:
        eng.close()


def test_bad_use_is_reported(engine: OffloadEngine) -> None:
    with pytest.raises(ValueError, match="moves cpu tensors"):
        engine.open_group(0, torch.device("meta"))
    with pytest.raises(TypeError, match="Prefetch"):
        OffloadEngine(backend=EmulatedBackend(), host_limit_bytes=0, prefetch=2)  # type: ignore[arg-type]
    group = offload(engine, [random_bytes(KiB)])
    with pytest.raises(RuntimeError, match="issued already"):
        engine.issue(group)
    open_group = engine.open_group(1, CPU)
    with pytest.raises(RuntimeError, match="cannot be fetched"):
        engine.fetch(open_group)


def test_fetch_of_a_freed_group_fails(engine: OffloadEngine) -> None:
    group = offload(engine, [random_bytes(KiB)])
    engine.free(group)
    engine.free(group)  # no-op
    with pytest.raises(RuntimeError, match="cannot be fetched"):
        engine.fetch(group)


def test_free_never_blocks_and_is_safe_to_reenter(engine: OffloadEngine,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = (offload(engine, [random_bytes(4 * KiB, seed=s)], ordinal=s) for s in range(3))
    engine.synchronize()

    # From another thread while this one is inside the engine: queued, not blocked.
    done = threading.Event()
    with engine._lock:
        worker = threading.Thread(target=lambda: (engine.free(a), done.set()))
        worker.start()
        assert done.wait(5.0), "free() blocked on the engine lock"
        assert a.state is GroupState.OFFLOADED  # not applied under the running call
    worker.join()

    # Re-entered on this thread from inside an engine call (a finaliser run by GC).
    original = engine.pool.alloc

    def alloc_with_finaliser(nbytes: int) -> Any:
        engine.free(b)
        return original(nbytes)

    monkeypatch.setattr(engine.pool, "alloc", alloc_with_finaliser)
    d = offload(engine, [random_bytes(4 * KiB, seed=9)], ordinal=3)
    monkeypatch.undo()
    assert b.state is GroupState.OFFLOADED

    engine.synchronize()  # the next call applies both frees first
    assert a.state is b.state is GroupState.FREED
    assert engine.live_groups == 2 and {c, d} == engine._groups
    assert engine.pool.stats().in_use_bytes == 2 * 4 * KiB


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def _round_trip(engine: OffloadEngine, sources: list[tuple[torch.Tensor, bool | str]]) -> Any:
    """Offload ``sources`` as one group, each typed (a contiguous tensor covering its
    storage, added as ``t.data``, whose geometry its slot takes; ``"strided"``: a permuted
    one, with its strides) or flat (its storage), reload it and compare every slot's
    bytes; return the group's block."""
    group = engine.open_group(0, CPU)
    for t, typed in sources:
        nbytes = t.untyped_storage().nbytes()
        if typed == "strided":
            assert engine.add(group, t.data, nbytes, t.stride()) >= 0
        elif typed:
            assert engine.add(group, t.data, nbytes) >= 0
        else:
            assert engine.add(group, t.untyped_storage(), nbytes) >= 0
    assert engine.issue(group)
    assert group.shapes == tuple(t.shape if typed else None for t, typed in sources)
    assert group.dtypes == tuple(t.dtype if typed else None for t, typed in sources)
    buf = engine.fetch(group)
    for i, (t, _) in enumerate(sources):
        assert torch.equal(slot(buf, group, i), _storage_bytes(t)), f"slot {i}"
    block = group.block
    engine.release_device(group)
    engine.free(group)
    engine.synchronize()
    engine.end_step()
    return block


def test_typed_and_flat_sources_share_a_group_and_each_layout_gets_its_slot_views(engine: OffloadEngine) -> None:
    """NOTE [Typed sources]: typed and flat sources of several dtypes in one group come
    back byte for byte; a later group of the same sizes but other dtypes and shapes, in
    the same block, gets slot views of its own geometry (a view of the old dtype would
    convert the values)."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(8, 8, generator=g)
    first = [
        (torch.randn(4, 8, generator=g), True),
        (base[2:6], False),  # a view of part of its storage: flat
        (torch.randn(8, generator=g).to(torch.bfloat16), True),
        (torch.randn(4, 4, generator=g).t(), False),  # covers its storage, not contiguous: flat
    ]
    block = _round_trip(engine, first)
    second = [
        (torch.randint(-(2**30), 2**30, (8, 4), dtype=torch.int32, generator=g), True),
        (torch.randn(8, 8, generator=g)[4:8], False),
        (torch.randint(-(2**14), 2**14, (2, 4), dtype=torch.int16, generator=g), True),
        (torch.randn(16, generator=g), True),
    ]
    assert [t.untyped_storage().nbytes() for t, _ in second] == [t.untyped_storage().nbytes() for t, _ in first]
    assert _round_trip(engine, second) is block  # the idle block, handed back with its views
    # the same sizes, shapes and dtypes, permuted: host views of those strides, whose
    # copies keep the storage's byte order (a contiguous view would reorder the bytes)
    third = [(torch.randn(8, 4, generator=g).t(), "strided"), *second[1:]]
    assert third[0][0].shape == second[0][0].t().shape
    assert _round_trip(engine, third) is block
    fourth = [(torch.randn(4, 8, generator=g), True), *second[1:]]  # contiguous again
    assert _round_trip(engine, fourth) is block


@pytest.mark.parametrize(
    ("make", "dense"),
    [
        (lambda: torch.randn(4, 8), True),
        (lambda: torch.randn(4, 8).t(), True),
        (lambda: torch.randn(2, 3, 4).permute(2, 0, 1), True),
        (lambda: torch.randn(1, 4, 1).as_strided((1, 4, 1), (7, 1, 5)), True),  # size-1 strides are free
        (lambda: torch.randn(8)[2:], False),  # starts past the storage's first element
        (lambda: torch.randn(4, 8)[:, :4], False),  # gaps
        (lambda: torch.randn(4).expand(3, 4), False),  # a stride of 0: overlap
        (lambda: torch.randn(16).as_strided((2, 2, 2), (3, 3, 1)), False),  # overlap, last offset 7
    ],
)
def test_dense_from_start_accepts_only_layouts_that_fill_their_storage_once(make: Any, dense: bool) -> None:
    from offrecomp.transfer import dense_from_start

    assert dense_from_start(make()) is dense


def test_a_reload_reuses_its_positions_storage_once_nothing_else_uses_it(engine: OffloadEngine) -> None:
    """NOTE [Reused reload buffers]: a reload grows its position's storage (the group's
    place in its step's issue order), and the engine empties it only when no tensor but
    its cached aliases is on it. One still on it keeps it and its data; the position's
    next reload then takes a fresh buffer."""
    src, other = random_bytes(2 * KiB), random_bytes(2 * KiB, seed=1)
    first = offload(engine, [src])
    buf = engine.fetch(first)
    reuse = first.reuse
    assert reuse is not None and buf.untyped_storage() is reuse.storage
    held = buf[: 2 * KiB]  # outlives the group's release, as a tensor autograd kept would
    engine.release_device(first)
    engine.end_step()  # polls; the next step's first group has the same position
    assert reuse.busy and reuse.storage.nbytes() == first.nbytes
    second = offload(engine, [other])
    assert torch.equal(engine.fetch(second)[: 2 * KiB], other)
    assert second.reuse is None  # a fresh buffer
    assert torch.equal(held, src)
    engine.release_device(second)
    del held, buf
    engine.end_step()
    assert not reuse.busy and reuse.storage.nbytes() == 0
    third = offload(engine, [other])
    buf = engine.fetch(third)
    assert third.reuse is reuse and torch.equal(buf[: 2 * KiB], other)
    engine.release_device(third)


def test_a_failed_reload_allocation_leaves_its_position_free() -> None:
    """A reload whose allocation fails (out of memory) raises, and its position's buffer
    is free for the next reload (NOTE [Reused reload buffers])."""
    backend = SpyBackend()
    eng = make_engine(backend=backend)
    fail = [True]
    alloc = backend.alloc_device

    def failing(nbytes: int, device: torch.device, stream: Any, storage: Any = None) -> torch.Tensor:
        if fail[0]:
            fail[0] = False
            raise RuntimeError("out of memory")
        return alloc(nbytes, device, stream, storage)

    backend.alloc_device = failing  # type: ignore[method-assign]
    try:
        src = random_bytes(1 * KiB)
        group = offload(eng, [src])
        with pytest.raises(RuntimeError, match="out of memory"):
            eng.fetch(group)
        again = offload(eng, [src])
        assert torch.equal(eng.fetch(again)[: 1 * KiB], src)
        assert again.reuse is not None  # the position's buffer, not a fresh one
        eng.release_device(again)
    finally:
        eng.close()


class _InFlightBackend(EmulatedBackend):
    """query() counted, and False throughout (every copy still in flight, as on a GPU
    whose host runs ahead): a conservative answer, which the engine must tolerate."""

    def __init__(self) -> None:
        super().__init__()
        self.queries = 0

    def query(self, event: Any) -> bool:
        self.queries += 1
        return False


def test_backward_frees_do_not_rescan_the_waiting_groups() -> None:
    """NOTE [Host slot lifetime]: freeing each of n groups in backward while their copies
    are in flight costs a bounded number of queries per group, not a scan of every group
    freed before it (n * (n + 1) / 2 queries); the blocks return at end_step."""
    backend = _InFlightBackend()
    eng = make_engine(backend=backend)
    try:
        n = 16
        groups = [offload(eng, [random_bytes(4 * KiB, seed=g)], ordinal=g) for g in range(n)]
        backend.queries = 0
        for g in reversed(groups):
            eng.fetch(g)
            eng.free(g)
        assert backend.queries <= 4 * n, backend.queries
        assert eng.pool.stats().in_use_bytes > 0  # nothing said the copies landed
    finally:
        eng.close()


def test_only_the_edges_waited_on_at_once_use_ordering_events(engine: OffloadEngine) -> None:
    """NOTE [Ordering events] in backends.py: edges 1 and 4 of NOTE [Stream ordering]
    wait on an event of ``record_ordering_event`` (which a CUDA backend records again for
    the next edge); every other edge waits on an event the engine holds."""
    backend = emu(engine)
    ordering: list[Any] = []
    record = backend.record_ordering_event

    def tracked(stream: Any) -> Any:
        event = record(stream)
        ordering.append(event)
        return event

    waits: list[tuple[str, Any]] = []
    original = engine._wait_edge

    def logged(edge: Edge, stream: Any, event: Any) -> None:
        waits.append((edge, event))
        original(edge, stream, event)

    backend.record_ordering_event = tracked  # type: ignore[method-assign]
    setattr(engine, "_wait_edge", logged)  # noqa: B010 (an instance attribute shadows the method)
    src = random_bytes(8192)
    group = offload(engine, [src])
    buf = engine.fetch(group)
    assert torch.equal(slot(buf, group, 0), src)
    by_edge = {edge: event for edge, event in waits}
    assert {"d2h_after_produce", "h2d_after_alloc"} <= by_edge.keys()
    assert [by_edge["d2h_after_produce"], by_edge["h2d_after_alloc"]] == ordering
    assert all(event not in ordering for edge, event in waits if edge not in ("d2h_after_produce", "h2d_after_alloc"))


def test_a_root_save_waits_for_another_threads_issue_of_its_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Offload groups]: a backward starting on one thread issues the root's run of
    saves while the next forward, on another, may still add a root save to it. The save
    joins after the issue, in a group of its own: added to the run being laid out, it
    would have a slot beyond the layout (an IndexError at its unpack)."""
    from offrecomp.config import Config
    from offrecomp.groups import OffloadGroups
    from offrecomp.measure import DeviceClock
    from offrecomp.state import ROOT, RegionCall

    groups = OffloadGroups(Config(), DeviceClock(CPU))
    groups._device_check()
    groups.get_engine()
    root = RegionCall(name=ROOT, call_index=0, ordinal=-1)

    def join(t: torch.Tensor) -> Any:
        return groups.join_typed(root, t, t.nbytes, t.untyped_storage().data_ptr(), False)

    sealed = threading.Event()
    seal = Group.seal

    def slow_seal(group: Group) -> None:
        seal(group)
        if threading.current_thread().name == "backward":
            sealed.set()
            time.sleep(0.2)  # the issue lays the run out: the other thread's save comes now

    monkeypatch.setattr(Group, "seal", slow_seal)
    a, b = torch.randn(256), torch.randn(256)
    first = join(a)
    issuer = threading.Thread(target=groups.issue, args=(root,), name="backward")
    issuer.start()
    assert sealed.wait(5)
    second = join(b)
    issuer.join()
    assert isinstance(first, tuple) and isinstance(second, tuple)
    assert second[0] is not first[0] and second[1] == 0
    assert len(first[0].offsets) == len(first[0].sizes) == 1
    assert groups.engine is not None
    groups.engine.close()


@pytest.mark.parametrize("engine_prefetch", [Prefetch(regions=2), Prefetch(nbytes=64 * KiB)])
def test_a_group_reloads_ahead_as_its_plan_chose(engine_prefetch: Prefetch, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Chosen prefetch] (scheduler/solver/api.py): a group whose pass's plan was
    solved for one group ahead reloads one ahead, whatever the engine's prefetch; the
    engine's two ahead (or its window) would hold a second group the plan did not count."""
    eng = make_engine(prefetch=engine_prefetch)
    try:
        assert eng.open_group(0, CPU, 1).depth == 1 and eng.open_group(0, CPU).depth is None
        groups = offload_groups(eng, groups=5, per_group=2)
        for g in groups:
            g.depth = 1
        log = reload_log(eng, monkeypatch)
        eng.fetch(groups[4])
        assert log == [4, 3]
        for g in reversed(groups):
            eng.fetch(g)
            eng.release_device(g)
        assert log == [4, 3, 2, 1, 0]
        assert eng.end_step().prefetches == 4
    finally:
        eng.close()
