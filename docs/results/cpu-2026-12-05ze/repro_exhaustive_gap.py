"""solve() is slower than exhaustive_solve() on tiny profiles (docs/planner.md: matched on
all pairs; tests/scheduler/test_solver.py GAP = 1e-9, "none beyond rounding").
Part A (shrunk from fuzz seed 5846, host_limit_bytes=1): 7 storages, no ops; solve
18.01 s vs exhaustive 18.0 s at budget 90 (exhaustive offloads a 0-byte storage of blk.0
next to the 1-byte root offload so the root's reload is issued early; solve drops it).
Part B (unshrunk, gen.py beside this script; no host limit, asymmetric links): seeds 3491
(5.0%), 3565 (4.3%), 7070 (1.0%) and 5846 (8.8%, host limit 1 B).
Exits 1 while any gap > 1e-9 remains.
Run: cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/repro_exhaustive_gap.py
"""
import logging
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gen.py beside this script
logging.disable(logging.WARNING)
from scheduler import Profile, RegionRecord, StorageRecord, exhaustive_solve, solve

A = lambda n, off=0.0: StorageRecord(nbytes=n, offset_seconds=off)
p = Profile(
    signature="gap", d2h_gbps=5e-9, h2d_gbps=1e-7, host_limit_bytes=1,
    regions=[
        RegionRecord(name="blk.0", call_index=0, start_seconds=0.0, forward_seconds=2.0, backward_seconds=10.0,
                     storages=[A(0, 2.5), A(1, 3.0), A(1, 3.0)]),
        RegionRecord(name="blk.1", call_index=0, start_seconds=0.0, forward_seconds=2.0, backward_seconds=2.0,
                     storages=[A(70, 2.0), A(10, 2.0)]),
    ],
    root=[A(1), A(10)],
)
bad = []


def compare(label, prof, budget, prefetch=2):
    ex = exhaustive_solve(prof, budget, prefetch_regions=prefetch)
    s = solve(prof, budget_bytes=budget, prefetch_regions=prefetch)
    gap = s.predicted_step_seconds / ex.predicted_step_seconds - 1
    print(f"{label}: budget {budget}: solve {s.predicted_step_seconds!r} (peak {s.predicted_peak_bytes}) "
          f"exhaustive {ex.predicted_step_seconds!r} (peak {ex.predicted_peak_bytes}) gap {gap:.4%}")
    print("   solve     :", {k: v.name for k, v in s.placements.items()})
    print("   exhaustive:", {k: v.name for k, v in ex.placements.items()})
    if ex.feasible and s.feasible and gap > 1e-9:
        bad.append(f"{label} gap {gap:.4%}")


compare("A (hand-built)", p, 90)
from gen import gen_profile
for seed, budget in ((3491, 141), (3565, 192), (7070, 175), (5846, 90)):
    q = gen_profile(seed, max_regions=3, max_storages=3, max_ops=4, mode="tiny", total_storage_cap=7)
    compare(f"B seed {seed} (host_limit {q.host_limit_bytes}, link {q.d2h_gbps}/{q.h2d_gbps} GB/s)", q, budget)
if bad:
    print("VIOLATION:", "; ".join(bad))
    sys.exit(1)
print("ok")
