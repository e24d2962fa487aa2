"""Reused reload buffers on and off, interleaved in one process (thread clock).

    python ab_reuse.py [--rounds 11] [--steps 40] [--no-gc]

The offload variant of benchmarks/bench_host_overhead.py (200 tanh saves a step in
regions of 16, every save offloaded on the emulated backend) run by two runtimes: one as
it is, one whose engine never reuses a reload buffer (every reload allocates a fresh
buffer and every unpack makes a view, as before NOTE [Reused reload buffers]). Prints µs
per saved tensor over plain, median and fastest round. ``--no-gc`` disables the
collector while timing: a full collection (about 0.1 s here, every ~200 steps) lands in
some rounds and not others, which is most of the noise between runs.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

import torch

import offrecomp
from benchmarks.bench_host_overhead import _Model
from offrecomp.transfer import ReloadBuffers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--no-gc", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(16)

    def steps(m: torch.nn.Module, rt: offrecomp.Runtime | None) -> Callable[[], None]:
        def run() -> None:
            if rt is None:
                for _ in range(args.steps):
                    m(x).backward()
                return
            with rt:
                for _ in range(args.steps):
                    m(x).backward()

        return run

    def warm(m: torch.nn.Module) -> offrecomp.Runtime:
        rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
        with rt:
            for _ in range(20):
                m(x).backward()
        return rt

    reuse = ReloadBuffers.alloc
    plain_m, on_m, off_m = _Model(200, blocks=12), _Model(200, blocks=12), _Model(200, blocks=12)
    on, off = steps(on_m, warm(on_m)), steps(off_m, warm(off_m))

    def without_reuse() -> None:
        ReloadBuffers.alloc = lambda self, backend, group, stream: (  # type: ignore[method-assign]
            backend.alloc_device(group.nbytes, group.device, stream), None)
        try:
            off()
        finally:
            ReloadBuffers.alloc = reuse  # type: ignore[method-assign]

    variants = {"plain": steps(plain_m, None), "reuse on": on, "reuse off": without_reuse}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            gc.collect()
            if args.no_gc:
                gc.disable()
            t0 = time.thread_time()
            fn()
            times[name].append((time.thread_time() - t0) / args.steps)
            gc.enable()
    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    saves = 201
    print(f"{args.rounds} rounds of {args.steps} steps, {saves} saves a step, gc {'off' if args.no_gc else 'on'}, "
          f"torch {torch.__version__}")
    for name in ("reuse on", "reuse off"):
        print(f"{name:10s} {(med[name] - med['plain']) / saves * 1e6:7.2f} us per save over plain "
              f"(fastest {(low[name] - low['plain']) / saves * 1e6:.2f})")


if __name__ == "__main__":
    main()
