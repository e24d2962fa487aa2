"""Measured against predicted step time of auto on the host-overhead benchmark's model
(200 tanh ops on 16 elements, regions of 16 saves, an ample budget: every call kept
whole, so saved natively but one pass in 8). Run from the repository root:

    OMP_NUM_THREADS=1 python predict_tiny.py [--steps 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")

import torch  # noqa: E402

import offrecomp  # noqa: E402
from bench_host_overhead import _Model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = _Model(200, blocks=200 // 16)
    x = torch.randn(16)
    rt = offrecomp.runtime(model, mode="auto", min_bytes=0)
    with rt:
        for _ in range(args.steps):
            model(x).backward()
    rows = [r for r in rt.report().steps if r.phase == "planned"]
    for r in rows:
        print(
            f"step {r.step:3d} measured {r.step_seconds * 1e3:.3f} ms predicted "
            f"{r.predicted_step_seconds * 1e3:.3f} ms ratio {r.step_seconds / r.predicted_step_seconds:.2f} "
            f"{' '.join(r.notes)}"
        )
    replans = sum("drift: re-plan" in r.notes for r in rows)
    last = [r.step_seconds / r.predicted_step_seconds for r in rows[-24:]]
    print(f"re-plans for drift: {replans}; median measured/predicted, last 24 planned steps: {statistics.median(last):.3f}")


if __name__ == "__main__":
    main()
