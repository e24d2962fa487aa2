"""Pinned host pool: ceiling, first fit, coalescing, reuse, alignment, pressure, failures."""

from __future__ import annotations

import logging
import random
from types import SimpleNamespace

import pytest
import torch

import offrecomp.pool as pool_mod
from offrecomp.backends import EmulatedBackend
from offrecomp.config import Prefetch
from offrecomp.offload import OffloadEngine
from offrecomp.pool import ALIGN_BYTES, PinnedPool, default_host_limit, default_pressure_bytes
from tests.helpers import offload_group

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


class CountingBackend(EmulatedBackend):
    """Counts host allocations; ``fail`` makes the next ones raise like cudaHostAlloc."""

    def __init__(self) -> None:
        super().__init__()
        self.host_allocs: list[int] = []
        self.fail = False

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        self.host_allocs.append(nbytes)
        if self.fail:
            raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")
        return super().alloc_host(nbytes)


class Pow2Backend(CountingBackend):
    def host_alloc_size(self, nbytes: int) -> int:
        return 1 << max(0, nbytes - 1).bit_length()


def make_pool(limit: int = 64 * MiB, slab: int = 1 * MiB, backend: EmulatedBackend | None = None,
              ) -> PinnedPool:
    return PinnedPool(backend=backend or CountingBackend(), limit_bytes=limit, slab_bytes=slab,
                      pressure_bytes=0)


def test_ceiling_respected() -> None:
    pool = make_pool(limit=1 * MiB, slab=256 * KiB)
    blocks = []
    while (b := pool.alloc(100 * KiB)) is not None:
        blocks.append(b)
    stats = pool.stats()
    assert stats.reserved_bytes <= 1 * MiB
    assert len(blocks) == 8  # 2 per 256 KiB slab (100 KiB rounds to 100 KiB, no pow2)
    assert pool.last_failure == "full" and stats.failures == 1
    assert pool.alloc(2 * MiB) is None
    # One request larger than the limit never fits.
    assert make_pool(limit=1 * MiB).alloc(1 * MiB + 1) is None


def test_engine_falls_back_beyond_the_host_limit(caplog: pytest.LogCaptureFixture) -> None:
    engine = OffloadEngine(backend=EmulatedBackend(), host_limit_bytes=1 * MiB,
                           prefetch=Prefetch(regions=1), slab_bytes=1 * MiB,
                           host_pressure_bytes=0)
    try:
        admitted = []
        with caplog.at_level(logging.WARNING, logger="offrecomp.offload"):
            for i in range(6):
                group = offload_group(engine, [torch.ones(256 * KiB, dtype=torch.uint8)], i)
                admitted.append(group is not None)
        assert admitted == [True] * 4 + [False] * 2
        warnings = [r for r in caplog.records if "cannot take" in r.getMessage()]
        assert len(warnings) == 1  # logged once
        stats = engine.end_step()
        assert stats.fallbacks_pool_full == 2 and stats.fallbacks == 2
        assert stats.pool_reserved_bytes == 1 * MiB
        assert stats.groups_offloaded == 4 and stats.bytes_d2h == 4 * 256 * KiB
    finally:
        engine.close()


def test_a_refusal_for_groups_not_yet_copied_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """The pool had no block in use: the warning read "cannot take 32768 more bytes (0 of
    65536 reserved, 0 in use)", which fits; the bytes of the open group refused it."""
    engine = OffloadEngine(backend=EmulatedBackend(), host_limit_bytes=64 * KiB,
                           prefetch=Prefetch(regions=1), slab_bytes=64 * KiB, host_pressure_bytes=0)
    try:
        group = engine.open_group(0, torch.device("cpu"))
        with caplog.at_level(logging.WARNING, logger="offrecomp.offload"):
            assert engine.add(group, torch.ones(40 * KiB, dtype=torch.uint8), 40 * KiB) == 0
            assert engine.add(group, torch.ones(32 * KiB, dtype=torch.uint8), 32 * KiB) == -1
        (msg,) = [r.getMessage() for r in caplog.records if "cannot take" in r.getMessage()]
        assert (
            "cannot take 32.00 KiB more (32768 bytes): 0 B in use and 40.00 KiB for groups not yet copied, "
            "of a limit of 64.00 KiB" in msg
        ), msg
        assert "host_limit=, OFFRECOMP_HOST_LIMIT" in msg
    finally:
        engine.close()


def test_first_fit_and_coalescing() -> None:
    pool = make_pool(slab=64 * KiB)
    a, b, c = pool.alloc(10 * KiB), pool.alloc(20 * KiB), pool.alloc(10 * KiB)
    assert a and b and c
    assert (a.offset, b.offset, c.offset) == (0, 10 * KiB, 30 * KiB)
    pool.free(b)
    d = pool.alloc(5 * KiB)  # first fit: the hole left by b
    assert d is not None and d.offset == 10 * KiB
    pool.free(d)
    assert pool.free_ranges() == [[(10 * KiB, 20 * KiB), (40 * KiB, 24 * KiB)]]
    pool.free(a)  # merges with the next range
    assert pool.free_ranges() == [[(0, 30 * KiB), (40 * KiB, 24 * KiB)]]
    pool.free(c)  # merges both sides: one range again
    assert pool.free_ranges() == [[(0, 64 * KiB)]]
    assert pool.stats().in_use_bytes == 0
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.free(c)


def test_alignment_and_no_power_of_two_rounding() -> None:
    pool = make_pool(slab=1 * MiB)
    sizes = [1, 511, 512, 513, 1000, 3 * KiB + 7, 100 * KiB + 1]
    blocks = [pool.alloc(n) for n in sizes]
    base = pool._slabs[0].tensor.data_ptr()
    for n, blk in zip(sizes, blocks):
        assert blk is not None
        assert blk.offset % ALIGN_BYTES == 0
        assert (blk.view.data_ptr() - base) % ALIGN_BYTES == 0
        assert blk.view.numel() == n
        assert blk.size == -(-n // ALIGN_BYTES) * ALIGN_BYTES  # aligned, not rounded to 2^k
    assert pool.stats().slabs == 1


def test_request_larger_than_a_slab_gets_its_own_slab() -> None:
    backend = CountingBackend()
    pool = make_pool(slab=1 * MiB, backend=backend)
    blk = pool.alloc(3 * MiB + 100)
    assert blk is not None
    assert backend.host_allocs == [3 * MiB + 512]


def test_slab_shrinks_to_fit_the_limit() -> None:
    backend = CountingBackend()
    pool = make_pool(limit=3 * MiB, slab=2 * MiB, backend=backend)
    assert pool.alloc(2 * MiB) and pool.alloc(512 * KiB)
    assert backend.host_allocs == [2 * MiB, 1 * MiB]
    assert pool.stats().reserved_bytes == 3 * MiB


def test_accounting_counts_host_allocator_rounding() -> None:
    # On CUDA the caching host allocator pins a power of two; the pool asks for exactly
    # that and counts it, so its reserved bytes are what is really pinned.
    backend = Pow2Backend()
    pool = make_pool(limit=6 * MiB, slab=3 * MiB, backend=backend)
    assert pool.alloc(3 * MiB) is not None  # 3 MiB slab -> 4 MiB pinned
    assert backend.host_allocs == [4 * MiB]
    assert pool.alloc(1 * MiB) is not None  # fits in the same slab
    assert pool.alloc(1 * MiB) is not None  # new slab: the 2 MiB left under the limit
    assert backend.host_allocs == [4 * MiB, 2 * MiB]
    assert pool.stats().reserved_bytes <= 6 * MiB
    assert pool.alloc(2 * MiB) is None and pool.last_failure == "full"


def test_no_growth_over_100_steps() -> None:
    backend = CountingBackend()
    pool = make_pool(limit=16 * MiB, slab=1 * MiB, backend=backend)
    rng = random.Random(0)
    reserved = []
    for _step in range(100):
        blocks = [pool.alloc(rng.randint(1, 64 * KiB)) for _ in range(24)]
        assert all(b is not None for b in blocks)
        rng.shuffle(blocks)
        for b in blocks:
            assert b is not None
            pool.free(b)
        reserved.append(pool.stats().reserved_bytes)
        assert pool.free_ranges() == [[(0, 1 * MiB)]] * pool.stats().slabs
    assert len(set(reserved)) == 1  # reserved after step 1 never grows
    assert len(backend.host_allocs) == pool.stats().slabs <= 2
    assert pool.stats().allocs == 2400


def test_high_water() -> None:
    pool = make_pool()
    a, b = pool.alloc(1 * KiB), pool.alloc(1 * KiB)
    assert a and b
    pool.free(a)
    pool.free(b)
    assert pool.stats().high_water_bytes == 2 * KiB
    pool.reset_high_water()
    assert pool.stats().high_water_bytes == 0


def _fake_vm(available: int, total: int = 64 * GiB) -> SimpleNamespace:
    return SimpleNamespace(available=available, total=total)


def test_pressure_threshold(monkeypatch: pytest.MonkeyPatch,
                            caplog: pytest.LogCaptureFixture) -> None:
    backend = CountingBackend()
    pool = PinnedPool(backend=backend, limit_bytes=1 * GiB, slab_bytes=1 * MiB,
                      pressure_bytes=2 * GiB)
    monkeypatch.setattr(pool_mod.psutil, "virtual_memory", lambda: _fake_vm(4 * GiB))
    assert pool.alloc(1 * KiB) is not None  # 4 GiB available: fine
    monkeypatch.setattr(pool_mod.psutil, "virtual_memory", lambda: _fake_vm(2 * GiB + 1))
    with caplog.at_level(logging.WARNING, logger="offrecomp.pool"):
        assert pool.alloc(1 * KiB) is not None  # served by the existing slab
        assert pool.alloc(2 * MiB) is None  # a new slab would cross the threshold
        assert pool.alloc(2 * MiB) is None
    assert pool.last_failure == "pressure"
    assert len([r for r in caplog.records if "host memory is short" in r.getMessage()]) == 1
    assert len(backend.host_allocs) == 1


def test_default_pressure_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_mod.psutil, "virtual_memory", lambda: _fake_vm(0, total=16 * GiB))
    assert default_pressure_bytes() == 2 * GiB
    monkeypatch.setattr(pool_mod.psutil, "virtual_memory", lambda: _fake_vm(0, total=1024 * GiB))
    assert default_pressure_bytes() == int(1024 * GiB * 0.05)


def test_pin_failure_disables_growth(caplog: pytest.LogCaptureFixture) -> None:
    backend = CountingBackend()
    pool = make_pool(slab=1 * MiB, backend=backend)
    first = pool.alloc(512 * KiB)
    backend.fail = True
    with caplog.at_level(logging.WARNING, logger="offrecomp.pool"):
        assert pool.alloc(1 * MiB) is None
        assert pool.last_failure == "pin_failed"
        assert pool.alloc(1 * MiB) is None
    assert len(backend.host_allocs) == 2  # no second attempt after the failure
    assert len([r for r in caplog.records if "pinning" in r.getMessage()]) == 1
    assert first is not None and pool.alloc(256 * KiB) is not None  # old slabs still serve


def test_default_host_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_mod.psutil, "virtual_memory", lambda: _fake_vm(80 * GiB))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_host_limit() == 40 * GiB
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert default_host_limit() == 5 * GiB
    assert default_host_limit(local_world_size=4) == 10 * GiB
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "zero")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='zero'"):
        default_host_limit()


def test_close_frees_slabs_and_invalidates_blocks() -> None:
    pool = make_pool()
    blk = pool.alloc(4 * KiB)
    assert blk is not None
    pool.close()
    assert pool.stats().reserved_bytes == 0 and pool.stats().slabs == 0
    with pytest.raises(RuntimeError, match="does not belong"):
        pool.free(blk)
    assert pool.alloc(4 * KiB) is not None  # usable again


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="limit_bytes"):
        PinnedPool(backend=EmulatedBackend(), limit_bytes=-1)
    with pytest.raises(ValueError, match="nbytes"):
        make_pool().alloc(0)


def test_reserve_pins_what_a_step_of_those_sizes_needs() -> None:
    """A plan's offloads, pinned ahead: the step that makes them pins nothing more."""
    backend = CountingBackend()
    pool = make_pool(limit=16 * MiB, slab=1 * MiB, backend=backend)
    sizes = [300 * KiB, 2 * MiB + 5, 700 * KiB, 64 * KiB]
    reserved = pool.reserve(sizes)
    assert reserved == pool.stats().reserved_bytes >= sum(sizes)
    stats = pool.stats()
    assert stats.in_use_bytes == 0 and stats.high_water_bytes == 0 and stats.allocs == 0
    pinned = len(backend.host_allocs)
    blocks = [pool.alloc(n) for n in sizes]  # the step
    assert all(b is not None for b in blocks)
    assert len(backend.host_allocs) == pinned and pool.stats().reserved_bytes == reserved


def test_reserve_stops_at_the_limit_quietly() -> None:
    pool = make_pool(limit=1 * MiB, slab=256 * KiB)
    assert pool.reserve([512 * KiB, 512 * KiB, 512 * KiB]) == 1 * MiB
    assert pool.stats().failures == 0 and pool.stats().in_use_bytes == 0


def test_engine_prepare_pins_through_the_pool() -> None:
    engine = OffloadEngine(backend=EmulatedBackend(), host_limit_bytes=8 * MiB,
                           prefetch=Prefetch(regions=1), slab_bytes=1 * MiB, host_pressure_bytes=0)
    try:
        assert engine.prepare([3 * MiB, 1 * MiB]) >= 4 * MiB
        before = engine.pool.stats().reserved_bytes
        group = offload_group(engine, [torch.ones(3 * MiB, dtype=torch.uint8)])
        assert group is not None and engine.pool.stats().reserved_bytes == before
    finally:
        engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.prepare([1])


def test_engine_prepare_widens_the_window() -> None:
    """NOTE [Window under a plan]: a wide window lets copies overlap compute; the
    default one makes the producer wait once in-flight bytes exceed it."""
    backend = EmulatedBackend(copy_delay_s=0.02)
    engine = OffloadEngine(backend=backend, host_limit_bytes=8 * MiB, prefetch=Prefetch(regions=1),
                           window_bytes=1 * MiB, slab_bytes=1 * MiB, host_pressure_bytes=0)
    try:
        for i in range(3):
            assert offload_group(engine, [torch.ones(1 * MiB, dtype=torch.uint8)], i) is not None
        assert engine.end_step().window_waits > 0
        engine.prepare([1 * MiB] * 3, window_bytes=3 * MiB)
        assert engine.window_bytes == 3 * MiB
        engine.synchronize()
        for i in range(3):
            assert offload_group(engine, [torch.ones(1 * MiB, dtype=torch.uint8)], i) is not None
        assert engine.end_step().window_waits == 0
        with pytest.raises(ValueError, match="window_bytes=-1 is invalid"):
            engine.prepare([], window_bytes=-1)
    finally:
        engine.close()


def test_released_block_is_handed_back_to_its_size() -> None:
    # NOTE [Idle blocks]: a released block stays carved for the next request of its size,
    # with what its user attached; it counts as free, not in use.
    pool = make_pool(limit=1 * MiB, slab=1 * MiB)
    a = pool.alloc(10 * KiB)
    assert a is not None
    a.slots = "views"
    pool.release(a)
    assert pool.stats().in_use_bytes == 0 and pool.idle_bytes == 10 * KiB
    assert pool.free_ranges() == [[(10 * KiB, 1014 * KiB)]]
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.release(a)
    other = pool.alloc(12 * KiB)  # another size carves fresh memory
    again = pool.alloc(10 * KiB)
    assert again is a and again.slots == "views" and not again.freed
    assert other is not None and other.offset == 10 * KiB
    assert pool.stats().in_use_bytes == 22 * KiB and pool.idle_bytes == 0


def test_idle_blocks_give_way_to_a_request_that_needs_their_room() -> None:
    pool = make_pool(limit=1 * MiB, slab=1 * MiB)
    blocks = [pool.alloc(256 * KiB) for _ in range(4)]
    for b in blocks:
        assert b is not None
        pool.release(b)
    assert pool.idle_bytes == 1 * MiB and pool.free_ranges() == [[]]
    big = pool.alloc(512 * KiB)  # no free range fits: the idle blocks go back first
    assert big is not None and pool.stats().reserved_bytes == 1 * MiB
    assert pool.idle_bytes == 0 and pool.stats().in_use_bytes == 512 * KiB
    pool.free(big)
    assert pool.free_ranges() == [[(0, 1 * MiB)]]
    b = pool.alloc(256 * KiB)
    assert b is not None
    pool.release(b)
    pool.close()
    assert pool.idle_bytes == 0
