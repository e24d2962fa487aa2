"""The offload engine on a real GPU: data, races made visible with torch.cuda._sleep,
bandwidth against a raw pinned copy, and peak memory under the stash window.

Each race test delays one stream with ``_torch_compat.cuda_sleep`` so that a missing ordering
edge corrupts the result, checks the engine gets it right, then removes exactly that
edge and checks the corruption appears (so the test is known to guard the edge).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from offrecomp._torch_compat import cuda_sleep
from offrecomp.backends import CudaBackend
from offrecomp.config import Prefetch
from offrecomp.offload import Edge, OffloadEngine
from offrecomp.transfer import Group
from tests.helpers import offload_group

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DELAY_MS = 60.0  # how long a delayed stream sleeps: far longer than any copy here


@functools.lru_cache(maxsize=1)
def cycles_per_ms() -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cuda_sleep(1_000_000)  # warm the clocks up
    start.record()
    cuda_sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def delay(stream: torch.cuda.Stream | None = None, ms: float = DELAY_MS) -> None:
    """Enqueue a sleep on ``stream`` (the current stream by default)."""
    cycles = int(cycles_per_ms() * ms)
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        cuda_sleep(cycles)


def make_engine(**kwargs: Any) -> OffloadEngine:
    options: dict[str, Any] = {
        "backend": CudaBackend(), "host_limit_bytes": 2 * GiB, "prefetch": Prefetch(regions=1),
        "window_bytes": 256 * MiB, "slab_bytes": 64 * MiB, "host_pressure_bytes": 0,
    }
    options.update(kwargs)
    return OffloadEngine(**options)


@contextlib.contextmanager
def engine_ctx(**kwargs: Any) -> Iterator[OffloadEngine]:
    eng = make_engine(**kwargs)
    try:
        yield eng
    finally:
        eng.close()
        torch.cuda.synchronize()


@contextlib.contextmanager
def without_edge(engine: OffloadEngine, edge: Edge) -> Iterator[None]:
    original = engine._wait_edge

    def patched(name: Edge, stream: Any, event: Any) -> None:
        if name != edge:
            original(name, stream, event)

    setattr(engine, "_wait_edge", patched)  # noqa: B010 (an instance attribute shadows the method)
    try:
        yield
    finally:
        del engine._wait_edge


DEV = torch.device("cuda")
N = 8 * MiB


def offload(eng: OffloadEngine, sources: list[torch.Tensor], ordinal: int = 0) -> Group:
    group = offload_group(eng, sources, ordinal)
    assert group is not None
    return group


def slot(buf: torch.Tensor, group: Group, i: int = 0) -> torch.Tensor:
    return buf[group.offsets[i] : group.offsets[i] + group.sizes[i]]


def warm(eng: OffloadEngine, value: int = 1) -> None:
    """Create the streams, pin a slab and warm the allocator, so that a race scenario
    runs no pinning or cudaMalloc (either may synchronize the device). The block used
    here, left holding ``value``, is the one the next group of N bytes gets (first fit)."""
    group = offload(eng, [torch.full((N,), value, dtype=torch.uint8, device=DEV)], ordinal=-1)
    eng.fetch(group)
    eng.release_device(group)
    eng.synchronize()
    eng.free(group)
    eng.synchronize()
    eng.end_step()


def test_round_trip_bitwise() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    tensors = [
        torch.randn(1000, 257, device=DEV, generator=gen),
        torch.randn(4096, 1024, device=DEV, generator=gen).to(torch.bfloat16),
        torch.randint(0, 255, (12_345,), device=DEV, dtype=torch.uint8, generator=gen),
        torch.randn(3, device=DEV, generator=gen, dtype=torch.float64),
        torch.randn(8 * MiB // 4, device=DEV, generator=gen),
    ]
    expected = [t.clone() for t in tensors]
    with engine_ctx(prefetch=Prefetch(regions=2)) as eng:
        groups = [offload(eng, tensors[:2], 0), offload(eng, tensors[2:4], 1), offload(eng, tensors[4:], 2)]
        del tensors
        members = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
        for want, (g, i) in reversed(list(zip(expected, members))):
            buf = eng.fetch(groups[g])
            got = slot(buf, groups[g], i).view(want.dtype).view(want.shape)
            assert torch.equal(got, want)
        for g in groups:
            eng.release_device(g)
            eng.free(g)
        eng.synchronize()
        stats = eng.end_step()
        assert stats.backend == "cuda" and stats.groups_reloaded == 3 and stats.live_groups == 0
        assert stats.bytes_d2h == stats.bytes_h2d == sum(w.untyped_storage().nbytes() for w in expected)
        assert stats.d2h_gbps is not None and stats.h2d_gbps is not None


def host_seconds(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def produce_then_offload(eng: OffloadEngine) -> torch.Tensor:
    warm(eng, value=1)
    x = torch.full((N,), 1, dtype=torch.uint8, device=DEV)
    torch.cuda.synchronize()
    delay()  # the producer is still queued when the region exits
    x.fill_(2)
    group, seconds = host_seconds(lambda: offload(eng, [x]))
    assert seconds < DELAY_MS / 1000 / 2, "offload waited on the device"
    eng.synchronize()
    return slot(eng.fetch(group), group).clone()


def test_d2h_waits_on_the_producer() -> None:
    with engine_ctx() as eng:
        assert bool((produce_then_offload(eng) == 2).all())
    with engine_ctx() as eng, without_edge(eng, "d2h_after_produce"):
        assert bool((produce_then_offload(eng) == 1).all())  # copied before the producer ran


def test_producer_on_a_user_stream() -> None:
    # Inside `with torch.cuda.stream(s)` the producer is s: the engine must look it up live.
    user = torch.cuda.Stream()
    with engine_ctx() as eng:
        warm(eng)
        with torch.cuda.stream(user):
            x = torch.full((N,), 1, dtype=torch.uint8, device=DEV)
            delay()
            x.fill_(3)
            group = offload(eng, [x], 1)
        eng.synchronize()
        assert bool((slot(eng.fetch(group), group) == 3).all())


def reload_before_offload_landed(eng: OffloadEngine) -> torch.Tensor:
    warm(eng, value=7)  # the block the next group gets holds 7s
    d2h, _ = eng.copy_streams(DEV)
    x = torch.full((N,), 3, dtype=torch.uint8, device=DEV)
    delay(d2h)  # the D2H copy is late
    group = offload(eng, [x], 1)
    buf, seconds = host_seconds(lambda: eng.fetch(group))
    assert seconds < DELAY_MS / 1000 / 2, "fetch waited on the device"
    out = slot(buf, group).clone()
    torch.cuda.synchronize()
    return out


def test_h2d_waits_on_its_own_d2h() -> None:
    with engine_ctx() as eng:
        assert bool((reload_before_offload_landed(eng) == 3).all())
    with engine_ctx() as eng, without_edge(eng, "h2d_after_d2h"):
        assert bool((reload_before_offload_landed(eng) == 7).all())  # stale block


def read_during_slow_reload(eng: OffloadEngine) -> torch.Tensor:
    warm(eng)
    group = offload(eng, [torch.full((N,), 4, dtype=torch.uint8, device=DEV)])
    eng.synchronize()
    _, h2d = eng.copy_streams(DEV)
    torch.cuda.empty_cache()
    poison = torch.full((N,), 0xEE, dtype=torch.uint8, device=DEV)  # a block of poison in
    torch.cuda.synchronize()  # compute's pool, where the reload buffer comes from
    del poison
    delay(h2d)  # the H2D copy is late
    out = slot(eng.fetch(group), group).clone()  # the caller reads at once
    torch.cuda.synchronize()
    return out


def test_compute_waits_on_h2d() -> None:
    with engine_ctx() as eng:
        assert bool((read_during_slow_reload(eng) == 4).all())
        stats = eng.end_step()
        assert stats.stall_seconds >= DELAY_MS / 1000 * 0.5  # measured by timing events
    with engine_ctx() as eng, without_edge(eng, "compute_after_h2d"):
        assert not bool((read_during_slow_reload(eng) == 4).all())


def reload_into_a_block_compute_still_reads(eng: OffloadEngine) -> torch.Tensor:
    warm(eng)
    group = offload(eng, [torch.full((N,), 4, dtype=torch.uint8, device=DEV)])
    eng.synchronize()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    x = torch.full((N,), 5, dtype=torch.uint8, device=DEV)
    torch.cuda.synchronize()
    delay()  # compute's read of x is late
    y = x + 0
    del x  # its block may go to the next allocation on compute: the reload buffer
    eng.fetch(group)
    torch.cuda.synchronize()
    return y


def test_h2d_waits_on_the_allocation() -> None:
    with engine_ctx() as eng:
        assert bool((reload_into_a_block_compute_still_reads(eng) == 5).all())
    with engine_ctx() as eng, without_edge(eng, "h2d_after_alloc"):
        assert bool((reload_into_a_block_compute_still_reads(eng) == 4).all())  # overwritten


def late_offload(eng: OffloadEngine) -> Group:
    """A group of one source of N fives whose D2H copy is late, the engine's the only
    reference to the source: its block, once let go of, is the only cached block a new
    N-byte tensor can reuse on this stream."""
    warm(eng)
    d2h, _ = eng.copy_streams(DEV)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    x = torch.full((N,), 5, dtype=torch.uint8, device=DEV)
    torch.cuda.synchronize()
    delay(d2h)  # the D2H copy is late
    return offload(eng, [x])


def reuse_source_memory(eng: OffloadEngine) -> torch.Tensor:
    group = late_offload(eng)
    y = torch.empty(N, dtype=torch.uint8, device=DEV)
    y.fill_(9)
    eng.synchronize()
    return slot(eng.fetch(group), group).clone()


@pytest.mark.parametrize("window", [0, 256 * MiB], ids=["window", "stash"])
def test_source_outlives_its_copy(window: int) -> None:
    with engine_ctx(window_bytes=window) as eng:
        assert bool((reuse_source_memory(eng) == 5).all())
    if window == 0:
        with engine_ctx(window_bytes=window) as eng, without_edge(eng, "compute_after_d2h"):
            assert bool((reuse_source_memory(eng) == 9).all())


def release_served_source(eng: OffloadEngine) -> torch.Tensor:
    """A group still held at its fetch is served (NOTE [Served groups] in transfer.py);
    released, its source's block is reused on compute while the late D2H copy still has
    to read it."""
    group = late_offload(eng)
    assert eng.fetch(group, serve=True) is None and group.served is not None  # no reload
    eng.release_device(group)  # its saves were read: the engine lets go of the source
    y = torch.empty(N, dtype=torch.uint8, device=DEV)
    y.fill_(9)
    eng.synchronize()
    return slot(eng.fetch(group), group).clone()


@pytest.mark.serve_held
def test_a_served_source_outlives_its_copy() -> None:
    with engine_ctx() as eng:
        assert bool((release_served_source(eng) == 5).all())
    with engine_ctx() as eng, without_edge(eng, "compute_after_d2h"):
        assert bool((release_served_source(eng) == 9).all())


def free_late_group(eng: OffloadEngine) -> tuple[torch.Tensor, float]:
    """A group freed while its D2H copy is late (its graph dropped): what its host block
    holds once the copy landed, after a new N-byte tensor on compute was written, and
    the seconds compute took to write it."""
    group = late_offload(eng)
    host = slot(group.block.tensor, group)  # type: ignore[union-attr]
    eng.free(group)  # NOTE [Freed sources]: the engine lets go of the source at once
    assert eng.stash_bytes == 0
    start = time.perf_counter()
    y = torch.empty(N, dtype=torch.uint8, device=DEV)
    y.fill_(9)
    torch.cuda.current_stream(DEV).synchronize()
    took = time.perf_counter() - start
    torch.cuda.synchronize()
    return host.clone(), took


def test_a_freed_source_outlives_its_copy_without_a_wait() -> None:
    """NOTE [Freed sources]: on CUDA a freed group's late sources are recorded on the D2H
    stream, so their block is not reused under the copy, and compute does not wait on
    the copy of a dead graph."""
    with engine_ctx() as eng:
        copied, took = free_late_group(eng)
        assert bool((copied == 5).all())
        assert took < DELAY_MS / 1000 / 2, f"compute took {took * 1000:.1f} ms: it waited on the late copy"


def timed(fn: Any, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def test_bandwidth_close_to_raw_pinned_copy() -> None:
    count, size, per_group = 32, 8 * MiB, 4  # 256 MiB in all, 8 groups of 32 MiB
    srcs = [torch.randint(0, 255, (size,), dtype=torch.uint8, device=DEV) for _ in range(count)]
    host = torch.empty(count * size, dtype=torch.uint8, pin_memory=True)
    dsts = [torch.empty(size * per_group, dtype=torch.uint8, device=DEV) for _ in range(count // per_group)]
    side = torch.cuda.Stream()

    def raw_d2h() -> None:
        with torch.cuda.stream(side):
            for i, s in enumerate(srcs):
                host[i * size : (i + 1) * size].copy_(s, non_blocking=True)

    def raw_h2d() -> None:
        chunk = size * per_group
        with torch.cuda.stream(side):
            for i, d in enumerate(dsts):
                d.copy_(host[i * chunk : (i + 1) * chunk], non_blocking=True)

    raw_d2h_s, raw_h2d_s = timed(raw_d2h), timed(raw_h2d)

    with engine_ctx(host_limit_bytes=1 * GiB, window_bytes=1 * GiB,
                    prefetch=Prefetch(nbytes=512 * MiB)) as eng:
        groups: list[Group] = []

        def engine_d2h() -> None:
            for g in groups:
                eng.free(g)
            groups.clear()
            eng.synchronize()
            eng.end_step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(0, count, per_group):
                groups.append(offload(eng, srcs[i : i + per_group], i // per_group))
            eng.synchronize()
            times.append(time.perf_counter() - t0)

        def engine_h2d() -> None:
            for g in groups:
                eng.release_device(g)
            eng.synchronize()
            t0 = time.perf_counter()
            for g in reversed(groups):
                eng.fetch(g)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)

        times: list[float] = []
        for _ in range(3):  # the first round pins the slabs
            engine_d2h()
        eng_d2h_s = min(times[1:])
        times = []
        for _ in range(3):
            engine_h2d()
        eng_h2d_s = min(times)
        eng.synchronize()
        stats = eng.end_step()
        for g, group in enumerate(groups):  # the data survived the benchmark
            buf = eng.fetch(group)
            for i in range(per_group):
                assert torch.equal(slot(buf, group, i), srcs[g * per_group + i])

    total = count * size
    report = (f"raw D2H {total / raw_d2h_s / 1e9:.1f} GB/s, engine {total / eng_d2h_s / 1e9:.1f}; "
              f"raw H2D {total / raw_h2d_s / 1e9:.1f} GB/s, engine {total / eng_h2d_s / 1e9:.1f}; "
              f"event-timed engine H2D {stats.h2d_gbps}")
    print(report)
    assert raw_d2h_s / eng_d2h_s >= 0.8, report
    assert raw_h2d_s / eng_h2d_s >= 0.8, report


def test_peak_memory_bounded_by_window() -> None:
    window, count = 64 * MiB, 48
    with engine_ctx(window_bytes=window) as eng:
        first = [offload(eng, [torch.ones(N, dtype=torch.uint8, device=DEV)], -1)
                 for _ in range(count)]  # create the streams and pin every slab up front
        eng.synchronize()
        for w in first:
            eng.free(w)
        eng.synchronize()
        eng.end_step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        d2h, _ = eng.copy_streams(DEV)
        delay(d2h, ms=20)  # copies start late: the stash must fill and hit the window
        groups: list[Group] = []
        for i in range(count):
            x = torch.empty(N, dtype=torch.uint8, device=DEV).fill_(i)
            groups.append(offload(eng, [x], i))
            del x
        peak = torch.cuda.max_memory_allocated() - base
        stats = eng.end_step()
        assert stats.window_waits > 0
        assert peak <= window + N, f"peak {peak / MiB:.0f} MiB > window + one tensor"
        for i in (0, count // 2, count - 1):
            assert bool((slot(eng.fetch(groups[i]), groups[i]) == i).all())
