"""Time scheduler.solve() on synthetic GPT profiles of about 1k, 10k and 100k storages.

    python benchmarks/bench_solver.py [--repeats 7] [--json out.json]

Each size is solved once to compile (or load) the kernels, then ``--repeats`` times;
the table reports the median and the fastest run. Budget: 30% of all activation bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numba

from benchmarks._args import count, out_file
from scheduler import gpt_profile, solve

# 15 saved storages per GPT layer (micro_ops=True)
SIZES = {"1k": 67, "10k": 667, "100k": 6667}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=count(1), default=7, help="timed solves per size, 1 or more (default 7)")
    ap.add_argument("--json", type=out_file(), help="also write the results to this file")
    args = ap.parse_args(argv)
    rows = []
    for label, layers in SIZES.items():
        profile = gpt_profile(
            layers=layers,
            hidden=4096,
            heads=32,
            seq=8192,
            batch=1,
            device_tflops=990,
            d2h_gbps=50,
            h2d_gbps=50,
        )
        n = sum(len(r.storages) for r in profile.regions)
        budget = int(profile.activation_bytes * 0.3)
        start = time.perf_counter()
        plan = solve(profile, budget_bytes=budget)
        first = time.perf_counter() - start
        runs = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            plan = solve(profile, budget_bytes=budget)
            runs.append(time.perf_counter() - start)
        assert plan.predicted_step_seconds is not None and plan.lower_bound_seconds is not None
        rows.append(
            {
                "size": label,
                "storages": n,
                "regions": len(profile.regions),
                "first_call_ms": first * 1e3,
                "median_ms": statistics.median(runs) * 1e3,
                "min_ms": min(runs) * 1e3,
                "feasible": plan.feasible,
                "overhead_vs_keep": plan.predicted_step_seconds
                / (profile.forward_seconds + profile.backward_seconds)
                - 1,
                "lower_bound_gap": plan.predicted_step_seconds / plan.lower_bound_seconds - 1,
            }
        )
    print(
        f"python {platform.python_version()}, numba {numba.__version__}, {platform.machine()}, {os.cpu_count()} CPUs"
    )
    print(
        f"{'size':>5} {'storages':>9} {'regions':>8} {'first call':>11} {'median':>9} {'min':>9} {'overhead':>9} {'vs bound':>9}"
    )
    for r in rows:
        print(
            f"{r['size']:>5} {r['storages']:>9} {r['regions']:>8} {r['first_call_ms']:>9.0f}ms "
            f"{r['median_ms']:>7.1f}ms {r['min_ms']:>7.1f}ms {r['overhead_vs_keep']:>+8.1%} {r['lower_bound_gap']:>+8.1%}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
