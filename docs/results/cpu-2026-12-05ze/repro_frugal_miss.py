"""solve() reports a budget infeasible that exhaustive_solve() meets: its "most
memory-frugal plan" (and min_feasible_budget_bytes) is 53 B where a 45 B plan exists.
Shrunk from fuzz seed 3 (mode small). No ops recorded (each region's replay costs its
forward time); 100 B/s link each way; two root storages, one saved near forward's end.
tests/scheduler/test_solver.py::test_matches_exhaustive_search asserts feasibility and
min_feasible agree with exhaustive search; docs/planner.md says solve matched it on all
pairs of its benchmark. Exits 1 while solve's min feasible > exhaustive's.
Run: cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/repro_frugal_miss.py
"""
import logging
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
logging.disable(logging.WARNING)
from scheduler import Profile, RegionRecord, StorageRecord, exhaustive_solve, solve

def reg(name, fwd, bwd, storages):
    return RegionRecord(name=name, call_index=0, start_seconds=0.0, forward_seconds=fwd,
                        backward_seconds=bwd, storages=storages)

A = lambda n, off=0.0: StorageRecord(nbytes=n, offset_seconds=off)
p = Profile(
    signature="repro", forward_seconds=10.5, backward_seconds=0.0, d2h_gbps=1e-7, h2d_gbps=1e-7,
    regions=[
        reg("blk.0", 1.0, 1.0, [StorageRecord(nbytes=5, kind="input"), A(40)]),
        reg("blk.1", 2.0, 10.0, [A(5, 2.0)]),
        reg("blk.2", 2.0, 0.0, [A(3), A(5)]),
    ],
    root=[A(8, 0.0), A(40, 10.25)],
)
ex = exhaustive_solve(p, 0)
s = solve(p, budget_bytes=0)
print("exhaustive most frugal peak:", ex.min_feasible_budget_bytes, {k: v.name for k, v in ex.placements.items()})
print("solve      most frugal peak:", s.min_feasible_budget_bytes, {k: v.name for k, v in s.placements.items()})
b = ex.min_feasible_budget_bytes
at = solve(p, budget_bytes=b)
ex_b = exhaustive_solve(p, b)
print(f"budget {b}: exhaustive feasible={ex_b.feasible} step={ex_b.predicted_step_seconds}; solve feasible={at.feasible} peak={at.predicted_peak_bytes}")
if s.min_feasible_budget_bytes > ex.min_feasible_budget_bytes:
    print(f"VIOLATION: solve's min feasible budget {s.min_feasible_budget_bytes} > exhaustive's {ex.min_feasible_budget_bytes}")
    sys.exit(1)
print("ok")
