"""What the emulated backend's own machinery costs the offload figure.

    python docs/results/cpu-2026-12-05/emulation_ab.py base|nofill|sync

Runs benchmarks/bench_host_overhead.py's offload variant (200 saves, regions of 16)
against plain steps of the same model, interleaved, 9 rounds of 20 steps on the thread
clock, and prints µs per save over plain. ``nofill`` leaves reload buffers unpoisoned
(no 0xFF fill); ``sync`` runs every side-stream job at once on the caller (no queue, no
worker thread, no host wait). Each variant runs in a process of its own.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch

import offrecomp
from benchmarks.bench_host_overhead import _Model
from offrecomp import backends

REGION_SAVES, OPS, REPS = 16, 200, 20


def main(variant: str) -> None:
    if variant == "nofill":
        def alloc_device(self, nbytes, device, stream, storage=None):  # type: ignore[no-untyped-def]
            if storage is None:
                return torch.empty((nbytes,), dtype=torch.uint8)
            storage.resize_(nbytes)
            return backends._EMPTY_BYTES.new().set_(storage)

        backends.EmulatedBackend.alloc_device = alloc_device  # type: ignore[method-assign]
    elif variant == "sync":
        def enqueue(self, stream, job):  # type: ignore[no-untyped-def]
            if job is not None:
                self._run(stream, job)

        backends.EmulatedBackend._enqueue = enqueue  # type: ignore[method-assign]
    elif variant != "base":
        raise SystemExit(f"variant {variant!r} is invalid; accepted: base, nofill, sync")
    x = torch.randn(16)
    torch.manual_seed(0)
    model = _Model(OPS, blocks=OPS // REGION_SAVES)
    rt = offrecomp.runtime(model, mode="offload", min_bytes=0)
    plain_model = _Model(OPS, blocks=OPS // REGION_SAVES)

    def offload(k: int = REPS) -> None:
        with rt:
            for _ in range(k):
                model(x).backward()

    def plain(k: int = REPS) -> None:
        for _ in range(k):
            plain_model(x).backward()

    offload(30)
    times: dict[str, list[float]] = {"plain": [], "offload": []}
    for _ in range(9):
        for name, fn in (("plain", plain), ("offload", offload)):
            t0 = time.thread_time()
            fn()
            times[name].append((time.thread_time() - t0) / REPS)
    over = statistics.median(times["offload"]) - statistics.median(times["plain"])
    print(f"{variant}: {over / (OPS + 1) * 1e6:.2f} us/save over plain")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "base")
