"""The offload engine on the emulated backend: data, ordering edges, prefetch, lifecycle.

Every ordering test runs twice: as written (the data must be right) and with exactly one
edge removed through ``_wait_edge`` (the test asserts that the race then shows up), so a
test that would pass without the edge it guards cannot go unnoticed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from offrecomp.backends import EmulatedBackend, _EmuStream
from offrecomp.config import Prefetch
from offrecomp.offload import Edge, OffloadEngine, Ticket, TicketState

KiB, MiB = 1 << 10, 1 << 20
SLOW = 0.25  # seconds a deliberately slow copy sleeps


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


def flat_of(t: torch.Tensor) -> torch.Tensor:
    """The caller's view: a flat uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def random_bytes(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 255, (n,), dtype=torch.uint8, generator=gen)  # never 0xFF


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


@pytest.mark.parametrize("prefetch", [Prefetch(regions=2), Prefetch(nbytes=256 * KiB)])
def test_round_trip_is_bitwise(prefetch: Prefetch) -> None:
    eng = make_engine(prefetch=prefetch)
    gen = torch.Generator().manual_seed(1)
    sizes = [1, 3, 511, 512, 513, 4095, 65536, 100_003, 1 << 20]
    tensors = []
    for i, n in enumerate(sizes):
        kind = i % 3
        if kind == 0:
            t = torch.randn(max(1, n // 4), generator=gen)
        elif kind == 1:
            t = torch.randn(max(1, n // 2), generator=gen).to(torch.bfloat16)
        else:
            t = random_bytes(n, seed=i)
        tensors.append(t)
    try:
        tickets = [eng.offload(flat_of(t), group=i // 2) for i, t in enumerate(tensors)]
        eng.begin_backward()
        for t, ticket in reversed(list(zip(tensors, tickets))):
            assert ticket is not None
            buf = eng.fetch(ticket)
            assert buf.dtype == torch.uint8 and buf.numel() == ticket.nbytes
            got = buf.view(t.dtype).view(t.shape)  # how the caller rebuilds its view
            assert torch.equal(got.view(torch.uint8), t.view(torch.uint8))
            eng.release_device(ticket)
            eng.free(ticket)
        eng.synchronize()
        assert eng.live_tickets == 0 and eng.pool.stats().in_use_bytes == 0
    finally:
        eng.close()


# ------------------------------------------------------------------ ordering edges


def scenario_reload_after_offload(eng: OffloadEngine) -> None:
    """Slow D2H copy; the reload is issued at once. Only edge 3 keeps H2D behind D2H."""
    data = random_bytes(64 * KiB)
    emu(eng).copy_delay_s = SLOW  # the D2H copy sleeps
    ticket = eng.offload(data.clone(), group=0)
    emu(eng).copy_delay_s = 0.0  # the H2D copy does not
    assert ticket is not None
    got = eng.fetch(ticket).clone()
    assert torch.equal(got, data), "reload read the host slot before the D2H copy wrote it"


def test_edge_h2d_waits_on_its_own_d2h(engine: OffloadEngine) -> None:
    scenario_reload_after_offload(engine)
    expect_race(scenario_reload_after_offload, "h2d_after_d2h", match="before the D2H copy")


def scenario_compute_after_reload(eng: OffloadEngine) -> None:
    """D2H landed; slow H2D. Only edge 4 keeps the caller from reading the buffer early."""
    data = random_bytes(64 * KiB, seed=2)
    ticket = eng.offload(data.clone(), group=0)
    assert ticket is not None
    eng.synchronize()
    emu(eng).copy_delay_s = SLOW
    got = eng.fetch(ticket).clone()  # the caller reads as soon as fetch returns
    assert torch.equal(got, data), "compute read the reload buffer before the H2D copy landed"


def test_edge_compute_waits_on_h2d(engine: OffloadEngine) -> None:
    t0 = time.perf_counter()
    scenario_compute_after_reload(engine)
    assert time.perf_counter() - t0 >= SLOW * 0.8  # the emulated host really waited
    stats = engine.end_step()
    assert stats.stall_seconds >= SLOW * 0.8
    expect_race(scenario_compute_after_reload, "compute_after_h2d", match="before the H2D copy")


def scenario_window_release(eng: OffloadEngine) -> None:
    """Window of 0 bytes: each source is released at once, after compute waits on its copy."""
    data = random_bytes(64 * KiB, seed=3)
    emu(eng).copy_delay_s = SLOW
    src = data.clone()
    ticket = eng.offload(src, group=0)
    del src  # the caller's reference: only the engine could keep the source alive now
    emu(eng).copy_delay_s = 0.0
    assert ticket is not None and eng.stash_bytes == 0
    assert torch.equal(eng.fetch(ticket).clone(), data)


def test_edge_compute_waits_on_d2h_before_source_release() -> None:
    eng = make_engine(window_bytes=0)
    try:
        scenario_window_release(eng)
        assert eng.end_step().window_waits == 1
    finally:
        eng.close()
    expect_race(scenario_window_release, "compute_after_d2h", window_bytes=0,
                match="freed before its copy ran")


def scenario_begin_backward(eng: OffloadEngine) -> None:
    """begin_backward empties the stash; compute must wait on copies in flight."""
    data = [random_bytes(16 * KiB, seed=s) for s in range(3)]
    emu(eng).copy_delay_s = SLOW / 3
    tickets = [eng.offload(d.clone(), group=i) for i, d in enumerate(data)]
    emu(eng).copy_delay_s = 0.0
    assert eng.stash_bytes == 3 * 16 * KiB  # clones died; the stash holds them
    eng.begin_backward()
    assert eng.stash_bytes == 0
    for d, t in zip(data, tickets):
        assert t is not None
        assert torch.equal(eng.fetch(t).clone(), d)


def test_edge_begin_backward_waits_on_d2h(engine: OffloadEngine) -> None:
    scenario_begin_backward(engine)
    expect_race(scenario_begin_backward, "compute_after_d2h", match="freed before its copy ran")


def test_dropping_source_before_d2h_lands_is_detected(engine: OffloadEngine,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # With the stash: the caller drops its source at once and the data still arrives.
    data = random_bytes(32 * KiB, seed=4)
    emu(engine).copy_delay_s = SLOW
    src = data.clone()
    ticket = engine.offload(src, group=0)
    del src
    emu(engine).copy_delay_s = 0.0
    assert ticket is not None
    assert torch.equal(engine.fetch(ticket).clone(), data)

    # Without it the emulated backend sees the source die under the in-flight copy.
    monkeypatch.setattr(engine, "_keep_source", lambda entry: None)
    emu(engine).copy_delay_s = SLOW
    src = data.clone()
    ticket = engine.offload(src, group=1)
    del src
    emu(engine).copy_delay_s = 0.0
    assert ticket is not None
    with pytest.raises(RuntimeError, match="freed before its copy ran"):
        engine.fetch(ticket)


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

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, stream: _EmuStream) -> None:
        self.log.append(("copy", stream, None))
        super().copy_async(dst, src, stream)


def assert_d2h_waits_on_producer(log: list[tuple[str, Any, Any]], compute: Any) -> None:
    """The D2H copy is preceded, on its stream, by a wait on an event recorded on the
    compute stream during the same offload call."""
    copy_at = next(i for i, (op, s, _) in enumerate(log) if op == "copy")
    d2h = log[copy_at][1]
    produced = [e for op, s, e in log[:copy_at] if op == "record" and s is compute]
    waited = [e for op, s, e in log[:copy_at] if op == "wait" and s is d2h]
    assert produced and waited and waited[-1] is produced[-1], "D2H does not wait on its producer"


def test_edge_d2h_waits_on_producer() -> None:
    # On the emulated backend compute is the host thread, so its events are complete when
    # recorded and a missing edge cannot corrupt data; the CUDA tier checks the race. Here
    # the edge is checked structurally.
    for remove in (False, True):
        backend = SpyBackend()
        eng = make_engine(backend=backend)
        try:
            ctx = without_edge(eng, "d2h_after_produce") if remove else contextlib.nullcontext()
            with ctx:
                eng.offload(random_bytes(1 * KiB), group=0)
            if remove:
                with pytest.raises(AssertionError, match="does not wait on its producer"):
                    assert_d2h_waits_on_producer(backend.log, backend.live)
            else:
                assert_d2h_waits_on_producer(backend.log, backend.live)
        finally:
            eng.close()


def test_compute_stream_is_looked_up_live() -> None:
    backend = SpyBackend()
    eng = make_engine(backend=backend)
    try:
        first = backend.live
        ticket = eng.offload(random_bytes(1 * KiB), group=0)
        assert ticket is not None
        backend.live = _EmuStream("compute-other", None)  # the caller switched streams
        backend.log.clear()
        eng.fetch(ticket)
        compute_waits = [s for op, s, _ in backend.log if op == "wait" and s.is_compute]
        assert compute_waits == [backend.live]  # not the stream seen at offload
        assert first is not backend.live
    finally:
        eng.close()


def test_host_slot_is_not_reused_under_a_reload(engine: OffloadEngine,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    a_data, b_data = random_bytes(64 * KiB, seed=5), random_bytes(64 * KiB, seed=6)
    a = engine.offload(a_data.clone(), group=0)
    engine.synchronize()
    assert a is not None
    emu(engine).copy_delay_s = SLOW
    engine._reload(a)  # a prefetch in flight
    emu(engine).copy_delay_s = 0.0
    engine.free(a)  # the slot must stay out of the pool until the reload read it
    assert engine.pool.stats().in_use_bytes == 64 * KiB
    b = engine.offload(b_data.clone(), group=1)
    assert b is not None and b._block is not None and b._block.offset != 0
    engine.synchronize()
    assert engine.pool.stats().in_use_bytes == 64 * KiB  # a's slot came back after landing
    assert torch.equal(engine.fetch(b).clone(), b_data)

    # Returning slots on a lie ("everything landed") drops the host view under the reload.
    c = engine.offload(a_data.clone(), group=2)
    engine.synchronize()
    assert c is not None
    emu(engine).copy_delay_s = SLOW
    engine._reload(c)
    emu(engine).copy_delay_s = 0.0
    monkeypatch.setattr(engine.backend, "query", lambda event: True)
    engine.free(c)
    with pytest.raises(RuntimeError, match="freed before its copy ran"):
        engine.synchronize()


# ---------------------------------------------------------------------- prefetch


def offload_groups(eng: OffloadEngine, groups: int, per_group: int, nbytes: int = 1 * KiB,
                   ) -> list[Ticket]:
    tickets: list[Ticket] = []
    for g in range(groups):
        for _ in range(per_group):
            t = eng.offload(random_bytes(nbytes, seed=len(tickets)), group=g)
            assert t is not None
            tickets.append(t)
    eng.synchronize()
    eng.begin_backward()
    return tickets


def reload_log(eng: OffloadEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    log: list[int] = []
    original = eng._reload

    def spy(ticket: Ticket) -> None:
        log.append(ticket.seq)
        original(ticket)

    monkeypatch.setattr(eng, "_reload", spy)
    return log


@pytest.mark.parametrize(
    ("prefetch", "after_first_fetch"),
    [
        (Prefetch(regions=1), [9, 8, 7, 6]),
        (Prefetch(regions=2), [9, 8, 7, 6, 5, 4]),
        (Prefetch(nbytes=3 * KiB), [9, 8, 7, 6]),  # 3 KiB ahead after 9 is fetched
        (Prefetch(nbytes=1), [9, 8]),  # one reload always allowed
        (Prefetch(), [9]),  # no prefetch
    ],
)
def test_prefetch_issues_expected_reloads(prefetch: Prefetch, after_first_fetch: list[int],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    eng = make_engine(prefetch=prefetch)
    try:
        tickets = offload_groups(eng, groups=5, per_group=2)  # seq 0..9, group = seq // 2
        log = reload_log(eng, monkeypatch)
        eng.fetch(tickets[9])
        assert log == after_first_fetch
        for t in reversed(tickets):  # the whole backward, reverse order
            eng.fetch(t)
            eng.release_device(t)
            if prefetch.nbytes is not None:
                assert eng.outstanding_reload_bytes <= max(prefetch.nbytes, 1 * KiB)
        assert sorted(log) == list(range(10)) and len(log) == 10  # each exactly once
        assert log == sorted(log, reverse=True)  # reverse offload order
        stats = eng.end_step()
        assert stats.reloads == 10
        assert stats.prefetches == 10 - (10 if prefetch == Prefetch() else 1)
    finally:
        eng.close()


def test_prefetch_byte_window_moves_with_the_fetches(monkeypatch: pytest.MonkeyPatch) -> None:
    eng = make_engine(prefetch=Prefetch(nbytes=3 * KiB))
    try:
        tickets = offload_groups(eng, groups=5, per_group=2)
        log = reload_log(eng, monkeypatch)
        eng.fetch(tickets[9])
        assert eng.outstanding_reload_bytes == 3 * KiB
        eng.fetch(tickets[8])  # 8 leaves the window: one more comes in
        assert log == [9, 8, 7, 6, 5]
        assert eng.outstanding_reload_bytes == 3 * KiB
    finally:
        eng.close()


def test_retain_graph_double_fetch(engine: OffloadEngine,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    data = [random_bytes(4 * KiB, seed=s) for s in range(6)]
    tickets = [engine.offload(d.clone(), group=i) for i, d in enumerate(data)]
    engine.begin_backward()
    log = reload_log(engine, monkeypatch)
    for backward in range(2):
        for d, t in reversed(list(zip(data, tickets))):
            assert t is not None
            first = engine.fetch(t)
            again = engine.fetch(t)  # a storage shared by two saves: same buffer
            assert again is first and torch.equal(first, d)
            engine.release_device(t)
            assert t.state is TicketState.OFFLOADED and t.fetches == backward + 1
        assert log == list(range(5, -1, -1)) * (backward + 1)  # each reloaded once a pass
    for t in tickets:
        assert t is not None
        engine.free(t)
    stats = engine.end_step()
    assert stats.bytes_h2d == 2 * 6 * 4 * KiB and stats.bytes_d2h == 6 * 4 * KiB


def test_fetch_of_a_ticket_from_an_earlier_step(engine: OffloadEngine) -> None:
    data = random_bytes(2 * KiB, seed=9)
    old = engine.offload(data.clone(), group=0)
    engine.end_step()
    new = engine.offload(random_bytes(2 * KiB), group=0)
    assert old is not None and new is not None and new.seq == 0
    assert torch.equal(engine.fetch(old), data)
    assert new.state is TicketState.OFFLOADED  # same group number, different step


# ---------------------------------------------------------------------- lifecycle


def test_100_steps_do_not_grow() -> None:
    eng = make_engine(prefetch=Prefetch(regions=2), window_bytes=256 * KiB)
    gen = torch.Generator().manual_seed(0)
    try:
        reserved = []
        for step in range(100):
            sizes = torch.randint(1, 48 * KiB, (8,), generator=gen).tolist()
            tickets = [eng.offload(random_bytes(n, seed=step), group=i // 2)
                       for i, n in enumerate(sizes)]
            eng.begin_backward()
            for t in reversed(tickets):
                assert t is not None
                eng.fetch(t)
                eng.release_device(t)
                eng.free(t)
            stats = eng.end_step()
            assert stats.live_tickets == 0 and stats.offloads == 8
            reserved.append(stats.pool_reserved_bytes)
        eng.synchronize()
        assert len(set(reserved)) == 1 and reserved[0] == 4 * MiB  # one slab, reused
        assert eng.pool.stats().in_use_bytes == 0 and eng.live_tickets == 0
        assert not eng._deferred and eng.stash_bytes == 0
    finally:
        eng.close()


def test_close_is_idempotent_and_frees_the_pool() -> None:
    eng = make_engine()
    t = eng.offload(random_bytes(8 * KiB), group=0)
    assert t is not None
    eng.fetch(t)
    streams = [s for s in emu(eng)._workers]
    eng.close()
    eng.close()
    assert eng.closed and eng.pool.stats().reserved_bytes == 0 and eng.live_tickets == 0
    assert t.state is TicketState.FREED
    assert all(s.worker is not None and not s.worker.is_alive() for s in streams)
    eng.free(t)  # harmless after close
    with pytest.raises(RuntimeError, match="closed"):
        eng.offload(random_bytes(8), group=0)
    with pytest.raises(RuntimeError, match="closed"):
        eng.fetch(t)


def test_stats_are_plausible(engine: OffloadEngine) -> None:
    sizes = [10 * KiB, 20 * KiB, 30 * KiB]
    emu(engine).copy_delay_s = 0.02
    tickets = [engine.offload(random_bytes(n), group=i) for i, n in enumerate(sizes)]
    engine.begin_backward()
    for t in reversed(tickets):
        assert t is not None
        engine.fetch(t)
        engine.fetch(t)  # a second fetch moves nothing
    engine.synchronize()
    stats = engine.end_step()
    assert stats.backend == "emulated"
    assert stats.offloads == 3 and stats.reloads == 3
    assert stats.bytes_d2h == stats.bytes_h2d == sum(sizes)  # once per storage
    assert stats.d2h_seconds >= 3 * 0.02 * 0.8 and stats.h2d_seconds >= 3 * 0.02 * 0.8
    assert stats.d2h_gbps is not None and stats.d2h_gbps > 0
    assert stats.h2d_gbps is not None and stats.h2d_gbps > 0
    assert 0 <= stats.stall_seconds < 5
    assert stats.fallbacks == 0 and stats.pending_timings == 0
    assert stats.pool_in_use_bytes == stats.pool_high_water_bytes == sum(sizes)
    assert stats.live_tickets == 3
    assert stats.to_dict()["fallbacks"] == 0
    empty = engine.end_step()
    assert empty.bytes_d2h == 0 and empty.d2h_gbps is None and empty.stall_seconds == 0


def test_offload_rejects_bad_input(engine: OffloadEngine) -> None:
    with pytest.raises(ValueError, match="flat contiguous uint8"):
        engine.offload(torch.zeros(4, dtype=torch.float32), group=0)
    with pytest.raises(ValueError, match="flat contiguous uint8"):
        engine.offload(torch.zeros(2, 2, dtype=torch.uint8), group=0)
    with pytest.raises(ValueError, match="empty"):
        engine.offload(torch.zeros(0, dtype=torch.uint8), group=0)
    with pytest.raises(ValueError, match="cpu tensors"):
        engine.offload(torch.zeros(4, dtype=torch.uint8, device="meta"), group=0)
    with pytest.raises(TypeError, match="Prefetch"):
        OffloadEngine(backend=EmulatedBackend(), host_limit_bytes=0, prefetch=2)  # type: ignore[arg-type]


def test_fetch_of_a_freed_ticket_fails(engine: OffloadEngine) -> None:
    t = engine.offload(random_bytes(KiB), group=0)
    assert t is not None
    engine.free(t)
    engine.free(t)  # no-op
    with pytest.raises(RuntimeError, match="was freed"):
        engine.fetch(t)


def test_free_never_blocks_and_is_safe_to_reenter(engine: OffloadEngine,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = (engine.offload(random_bytes(4 * KiB, seed=s), group=0) for s in range(3))
    assert a is not None and b is not None and c is not None
    engine.synchronize()

    # From another thread while this one is inside the engine: queued, not blocked.
    done = threading.Event()
    with engine._lock:
        worker = threading.Thread(target=lambda: (engine.free(a), done.set()))
        worker.start()
        assert done.wait(5.0), "free() blocked on the engine lock"
        assert a.state is TicketState.OFFLOADED  # not applied under the running call
    worker.join()

    # Re-entered on this thread from inside an engine call (a finaliser run by GC).
    original = engine.pool.alloc

    def alloc_with_finaliser(nbytes: int) -> Any:
        engine.free(b)
        return original(nbytes)

    monkeypatch.setattr(engine.pool, "alloc", alloc_with_finaliser)
    d = engine.offload(random_bytes(4 * KiB, seed=9), group=1)
    monkeypatch.undo()
    assert d is not None and b.state is TicketState.OFFLOADED

    engine.synchronize()  # the next call applies both frees first
    assert a.state is b.state is TicketState.FREED
    assert engine.live_tickets == 2  # c and d
    assert engine.pool.stats().in_use_bytes == 2 * 4 * KiB
