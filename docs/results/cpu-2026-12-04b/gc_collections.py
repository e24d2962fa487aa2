"""Python's collections per step by mode, on bench_host_overhead.py's model.

    python docs/results/cpu-2026-12-04b/gc_collections.py MODE SAVES_PER_REGION
        (MODE: plain, keep, offload, recompute or auto)

20 steps of warm-up, then 300 counted: collections by generation and the milliseconds
they took, and the step time.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch

import offrecomp
from benchmarks.bench_host_overhead import _Model

mode, per_region = sys.argv[1], int(sys.argv[2])
model = _Model(200, blocks=max(1, 200 // per_region))
x = torch.randn(16)
counts: collections.Counter[int] = collections.Counter()
seconds: collections.Counter[int] = collections.Counter()
started = [0.0]


def on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        counts[info["generation"]] += 1
        seconds[info["generation"]] += time.perf_counter() - started[0]


ctx = contextlib.nullcontext() if mode == "plain" else offrecomp.runtime(model, mode=mode, min_bytes=0)


def run(n: int) -> None:
    with ctx:
        for _ in range(n):
            model(x).backward()


run(20)
gc.callbacks.append(on_gc)
t0 = time.perf_counter()
run(300)
elapsed = time.perf_counter() - t0
print(f"{mode} {per_region} saves per region, 300 steps: collections by generation {dict(sorted(counts.items()))}, "
      f"ms {({g: round(s * 1e3, 1) for g, s in sorted(seconds.items())})}, {elapsed / 300 * 1e3:.2f} ms per step, "
      f"{len(gc.get_objects())} objects")
