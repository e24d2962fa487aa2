"""Offload engine benchmark: link bandwidth, engine bandwidth, and overlap with compute.

    python -m benchmarks.bench_offload --out bench_out/offload.json [--quick]

1. raw: pinned ``copy_(non_blocking=True)`` on a side stream, D2H and H2D, 1-256 MiB.
2. engine: the same sizes through ``OffloadEngine.issue`` / ``fetch`` (one group per
   copy); wall time from
   the first call to the last copy landing, and the engine's own event-timed figure,
   each as a share of the raw copy.
3. overlap: a chain of bf16 matmuls alone, the offload of N MiB alone, and both together
   (one chunk offloaded after each matmul); the step time ratio with/without offload.

Prints a table and writes JSON. Without a CUDA device it runs the emulated backend on
tiny sizes and says so: those numbers say nothing about any link.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._args import count, out_file
from benchmarks._args import device as parse_device
from offrecomp.backends import get_backend
from offrecomp.config import Prefetch
from offrecomp.offload import OffloadEngine
from offrecomp.transfer import Group

MiB = 1 << 20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _wall(fn: Callable[[], None], device: torch.device, reps: int) -> float:
    """Best wall time of ``fn`` from an idle device to an idle device."""
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _offload(engine: OffloadEngine, sources: list[torch.Tensor], ordinal: int) -> Group:
    """One region call's offloads, as the runtime makes them: each storage added to the
    call's group if the pool has room, the group issued at the call's exit."""
    group = engine.open_group(ordinal, sources[0].device)
    for src in sources:
        if engine.add(group, src.untyped_storage(), src.untyped_storage().nbytes()) < 0:
            raise RuntimeError("the pool refused a benchmark tensor")
    if not engine.issue(group):
        raise RuntimeError("the pool refused a benchmark group")
    return group


def _copies_per_rep(size: int, total: int) -> int:
    return max(2, min(16, total // size))


def bench_raw(device: torch.device, sizes_mib: list[int], total: int) -> list[dict[str, Any]]:
    rows = []
    cuda = device.type == "cuda"
    side = torch.cuda.Stream(device) if cuda else None
    for mib in sizes_mib:
        size = mib * MiB
        k = _copies_per_rep(size, total)
        src = torch.randint(0, 255, (size,), dtype=torch.uint8, device=device)
        host = torch.empty(k * size, dtype=torch.uint8, pin_memory=cuda)
        dst = torch.empty(size, dtype=torch.uint8, device=device)

        def d2h(
            src: torch.Tensor = src, host: torch.Tensor = host, k: int = k, size: int = size
        ) -> None:
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                for i in range(k):
                    host[i * size : (i + 1) * size].copy_(src, non_blocking=cuda)

        def h2d(
            dst: torch.Tensor = dst, host: torch.Tensor = host, k: int = k, size: int = size
        ) -> None:
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                for i in range(k):
                    dst.copy_(host[i * size : (i + 1) * size], non_blocking=cuda)

        d2h()  # warm-up
        h2d()
        rows.append(
            {
                "size_mib": mib,
                "copies": k,
                "d2h_gbps": k * size / _wall(d2h, device, 3) / 1e9,
                "h2d_gbps": k * size / _wall(h2d, device, 3) / 1e9,
            }
        )
        del src, host, dst
    return rows


def bench_engine(
    device: torch.device, sizes_mib: list[int], total: int, raw: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    rows = []
    raw_by_size = {r["size_mib"]: r for r in raw}
    for mib in sizes_mib:
        size = mib * MiB
        k = _copies_per_rep(size, total)
        srcs = [torch.randint(0, 255, (size,), dtype=torch.uint8, device=device) for _ in range(k)]
        engine = OffloadEngine(
            backend=get_backend(device),
            host_limit_bytes=max(2 * k * size, 256 * MiB),
            prefetch=Prefetch(nbytes=k * size),
            window_bytes=k * size + 1,
            slab_bytes=max(64 * MiB, size),
            host_pressure_bytes=0,
        )
        groups: list[Group] = []
        d2h_times: list[float] = []
        h2d_times: list[float] = []
        try:
            for _ in range(3):  # round 1 pins the slabs and warms the allocator
                for g in groups:
                    engine.free(g)
                groups.clear()
                engine.synchronize()
                engine.end_step()
                _sync(device)
                t0 = time.perf_counter()
                for i, s in enumerate(srcs):  # one group per copy, as the raw copies are
                    groups.append(_offload(engine, [s], i))
                engine.synchronize()
                d2h_times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for g in reversed(groups):
                    engine.fetch(g)
                _sync(device)
                h2d_times.append(time.perf_counter() - t0)
                for g in groups:
                    engine.release_device(g)
            stats = engine.end_step()
            for g, s in zip(groups, srcs):
                got = engine.fetch(g)[: g.sizes[0]]
                assert torch.equal(got, s), "engine returned wrong data"
        finally:
            engine.close()
        nbytes = k * size
        d2h = nbytes / min(d2h_times[1:]) / 1e9
        h2d = nbytes / min(h2d_times[1:]) / 1e9
        ref = raw_by_size.get(mib, {})
        rows.append(
            {
                "size_mib": mib,
                "copies": k,
                "d2h_gbps": d2h,
                "h2d_gbps": h2d,
                "d2h_gbps_events": stats.d2h_gbps,
                "h2d_gbps_events": stats.h2d_gbps,
                "d2h_share_of_raw": d2h / ref["d2h_gbps"] if ref else None,
                "h2d_share_of_raw": h2d / ref["h2d_gbps"] if ref else None,
            }
        )
        del srcs
    return rows


def bench_overlap(
    device: torch.device,
    offload_mib: int,
    dim: int,
    layers: int,
) -> dict[str, Any]:
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(dim, dim, device=device, dtype=dtype)
    w = torch.randn(dim, dim, device=device, dtype=dtype) / dim**0.5
    chunk = max(1, offload_mib * MiB // layers)
    acts = [
        torch.randint(0, 255, (chunk,), dtype=torch.uint8, device=device) for _ in range(layers)
    ]
    engine = OffloadEngine(
        backend=get_backend(device),
        host_limit_bytes=max(2 * layers * chunk, 256 * MiB),
        prefetch=Prefetch(regions=1),
        window_bytes=256 * MiB,
        slab_bytes=64 * MiB,
        host_pressure_bytes=0,
    )
    groups: list[Group] = []

    def compute(offload: bool, matmul: bool = True) -> None:
        for g in groups:
            engine.free(g)
        groups.clear()
        x = a
        for i in range(layers):
            if matmul:
                x = x @ w
            if offload:  # one region call's group at its exit
                groups.append(_offload(engine, [acts[i]], i))
        if offload:
            engine.synchronize()  # the step ends when the last copy landed

    try:
        compute(True)  # warm-up: pins the slabs, tunes the matmul
        compute(False)
        reps = 5
        plain = _wall(lambda: compute(False), device, reps)
        copies = _wall(lambda: compute(True, matmul=False), device, reps)
        both = _wall(lambda: compute(True), device, reps)
        stats = engine.end_step()
    finally:
        engine.close()
    flops = 2 * dim**3 * layers
    return {
        "offload_mib": layers * chunk / MiB,
        "layers": layers,
        "dim": dim,
        "dtype": str(dtype),
        "compute_s": plain,
        "offload_only_s": copies,
        "compute_with_offload_s": both,
        "overhead_ratio": both / plain,
        "ideal_ratio": max(plain, copies) / plain,
        "compute_tflops": flops / plain / 1e12,
        "window_waits": stats.window_waits,
    }


def _table(title: str, rows: list[dict[str, Any]], cols: list[str]) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}" if v < 10 else f"{v:.1f}"
        return str(v)

    lines = [title, "  ".join(f"{c:>18}" for c in cols)]
    lines += ["  ".join(f"{fmt(r.get(c)):>18}" for c in cols) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=out_file(make_folder=True), required=True, help="path of the JSON result file"
    )
    parser.add_argument("--quick", action="store_true", help="fewer sizes, smaller overlap")
    parser.add_argument(
        "--device", default="auto", help="cuda, cuda:N, cpu or auto (default: cuda if present)"
    )
    parser.add_argument(
        "--offload-mib",
        type=count(1),
        default=None,
        help="bytes offloaded in the overlap test (MiB), 1 or more",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    device = parse_device(parser, args.device, auto=True)
    emulated = device.type != "cuda"
    if emulated:
        print(
            "No CUDA device: running the emulated backend on tiny sizes. These numbers "
            "measure host memcpy and thread hand-offs, not any device link."
        )
        sizes = [1, 4] if args.quick else [1, 2, 4, 8]
        total = 16 * MiB
        overlap_args = {"offload_mib": args.offload_mib or 8, "dim": 256, "layers": 8}
    else:
        torch.cuda.init()
        sizes = [1, 16, 256] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]
        total = 256 * MiB
        overlap_args = {
            "offload_mib": args.offload_mib or (512 if args.quick else 1024),
            "dim": 8192,
            "layers": 24,
        }

    raw = bench_raw(device, sizes, total)
    print(_table("raw pinned copy (GB/s)", raw, ["size_mib", "copies", "d2h_gbps", "h2d_gbps"]))
    engine = bench_engine(device, sizes, total, raw)
    print(
        _table(
            "offload engine (GB/s, share of raw)",
            engine,
            [
                "size_mib",
                "d2h_gbps",
                "d2h_share_of_raw",
                "d2h_gbps_events",
                "h2d_gbps",
                "h2d_share_of_raw",
                "h2d_gbps_events",
            ],
        )
    )
    overlap = bench_overlap(device, **overlap_args)
    print(
        _table(
            "overlap: matmul chain with offload (seconds)",
            [overlap],
            [
                "offload_mib",
                "compute_s",
                "offload_only_s",
                "compute_with_offload_s",
                "overhead_ratio",
                "ideal_ratio",
            ],
        )
    )

    result = {
        "benchmark": "offload",
        "emulated": emulated,
        "device": torch.cuda.get_device_name(device) if not emulated else "cpu (emulated)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "quick": args.quick,
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "raw": raw,
        "engine": engine,
        "overlap": overlap,
        "engine_d2h_share_median": statistics.median(
            r["d2h_share_of_raw"] for r in engine if r["d2h_share_of_raw"] is not None
        ),
        "engine_h2d_share_median": statistics.median(
            r["h2d_share_of_raw"] for r in engine if r["h2d_share_of_raw"] is not None
        ),
        "seconds": time.perf_counter() - started,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out} in {result['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
