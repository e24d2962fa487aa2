"""What a local search at the budget would add to scheduler.solve(), and what it breaks.

    python docs/results/cpu-2026-12-04b/budget_polish.py

Polish: from the solver's plan, change one storage at a time (keep, then drop, then
offload, in storage order), keeping a change when the plan stays within the budget and
gets faster, until no change helps. Part 1 polishes the plan that may offload and the
plan without offloading on the what-if gpu-1.3b GPTs of benchmarks/offload_headroom.py.
Part 2 polishes the plans of 40 budgets on 8-layer GPTs and counts the adjacent budget
pairs where the larger budget's polished plan is predicted slower (the solver's own
picks never are: test_larger_budget_never_slower_on_gpt).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from scheduler import Placement, Plan, gpt_profile, simulate, solve
from scheduler.flat import OFFLOAD_BIT, FlatProfile, flatten
from scheduler.timeline import SimResult, Workspace

CODE = {Placement.KEEP: 0, Placement.OFFLOAD: 1, Placement.RECOMPUTE: 2}
PREFETCH = 2  # solve()'s default prefetch_regions


def polish(flat: FlatProfile, ws: Workspace, place: np.ndarray, budget: int, legal: np.ndarray) -> tuple[SimResult, int]:
    cur = place.copy()
    best = ws.run(cur, PREFETCH)
    sims = 0
    improved = True
    while improved:
        improved = False
        for s in range(flat.n_storages):
            for q in (0, 2, 1):
                if q == cur[s] or not legal[s] & (1 << q):
                    continue
                old, cur[s] = cur[s], q
                sims += 1
                r = ws.run(cur, PREFETCH)
                if r.peak <= budget and r.step < best.step * (1 - 1e-9):
                    best, improved = r, True
                else:
                    cur[s] = old
    return best, sims


def places(flat: FlatProfile, plan: Plan) -> np.ndarray:
    return np.array([CODE[plan.placement(k)] for k in flat.keys], dtype=np.int8)


def part1() -> None:
    print("part 1: gpu-1.3b what-if GPT (24 x 2048), 55 GB/s; step of the polished plan / the solver's")
    print(f"{'tokens':>6} {'dropout':>7} {'budget':>6} {'auto/no':>7} {'polished auto/no':>16} {'auto':>7} {'no offload':>10} {'sims':>6} {'ms':>5}")
    for seq in (4096, 8192, 16384):
        for dropout in (False, True):
            prof = gpt_profile(layers=24, hidden=2048, heads=16, seq=seq, batch=1, device_tflops=989,
                               d2h_gbps=55, h2d_gbps=55, mfu=0.5, dropout=dropout)
            keep = simulate(prof, Plan())
            flat = flatten(prof)
            ws = Workspace(flat)
            for share in (0.5, 0.25):
                budget = int(keep.peak_bytes * share)
                out = []
                for offload in (True, False):
                    plan = solve(prof, budget_bytes=budget, allow_offload=offload, log_infeasible=False)
                    legal = flat.legal if offload else flat.legal & ~OFFLOAD_BIT
                    t0 = time.perf_counter()
                    res, sims = polish(flat, ws, places(flat, plan), budget, legal)
                    out.append((plan.predicted_step_seconds or 0.0, res.step, sims, time.perf_counter() - t0))
                (a0, a1, sims, secs), (n0, n1, _, _) = out
                print(f"{seq:>6} {'yes' if dropout else 'no':>7} {share:>6.0%} {a0 / n0:>7.3f} {a1 / n1:>16.3f} "
                      f"{a1 / a0:>7.4f} {n1 / n0:>10.4f} {sims:>6} {secs * 1e3:>5.0f}", flush=True)


def part2() -> None:
    print("\npart 2: 8-layer GPTs (1024 wide), 50 GB/s, 40 budgets from 12% to 95% of keep's peak")
    bad = total = 0
    for seq, dropout in ((2048, True), (4096, False), (8192, True)):
        prof = gpt_profile(layers=8, hidden=1024, heads=8, seq=seq, batch=1, device_tflops=990,
                           d2h_gbps=50, h2d_gbps=50, dropout=dropout)
        keep = simulate(prof, Plan())
        flat = flatten(prof)
        ws = Workspace(flat)
        prev: tuple[float, float] | None = None
        for share in np.linspace(0.12, 0.95, 40):
            budget = int(keep.peak_bytes * share)
            plan = solve(prof, budget_bytes=budget, log_infeasible=False)
            if not plan.feasible:
                continue
            res, _ = polish(flat, ws, places(flat, plan), budget, flat.legal)
            total += 1
            if prev is not None and res.step > prev[1] * (1 + 1e-12):
                bad += 1
                print(f"  {seq} tokens, dropout {dropout}: budget {prev[0]:.3f} -> {share:.3f} of keep: polished "
                      f"{prev[1] * 1e3:.3f} -> {res.step * 1e3:.3f} ms (solver {plan.predicted_step_seconds * 1e3:.3f})")
            prev = (share, res.step)
    print(f"larger budget, slower polished plan: {bad} of {total} budgets")


if __name__ == "__main__":
    part1()
    part2()
