"""CostModel.update with identical profiles does not leave the estimate equal to that
profile: the moving average (1-a)*x + a*x is not x in floating point, so times move by an
ulp or so, drift() of the same profile is ~1e-16 instead of 0, and (part 2) a plan solved
on the estimate can differ from the plan on the profile itself. On fuzz seed 20191 (36
storages, budget below every plan's peak) the infeasible "most frugal" pick flips between
two plans whose peaks differ by 2.3 KB of 7.6 GB, with steps 0.655 s vs 3.146 s (4.8x).
Where: scheduler/cost_model.py _ema / CostModel.update (no short cut for equal values);
the flip itself: the simulated peak moves by 636 KB under ulp changes (events at equal
times reorder) and solve() picks the infeasible plan by peak alone (api.py solve, _pick).
Exits 1 while the estimate differs from the profile or the plan flips.
Run: cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/repro_costmodel_ulps.py
"""
import copy
import logging
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gen.py beside this script
logging.disable(logging.WARNING)
from scheduler import CostModel, OpRecord, Plan, Profile, RegionRecord, StorageRecord, predict, simulate, solve

bad = []
# part 1: one region, one op of 0.1 s
p = Profile(signature="s", forward_seconds=0.1, backward_seconds=0.2, regions=[RegionRecord(
    name="l0", call_index=0, start_seconds=0.0, forward_seconds=0.1, backward_seconds=0.2,
    ops=[OpRecord(seconds=0.1, skippable=True, outputs=(0,))],
    storages=[StorageRecord(nbytes=100, producer_op=0, first_save_op=1, last_save_op=1, offset_seconds=0.1)])])
cm = CostModel(alpha=0.3)
cm.update(copy.deepcopy(p))
cm.update(copy.deepcopy(p))
est = cm.estimate()
print("part 1: estimate == profile:", est == p, "; l0 forward", repr(est.regions[0].forward_seconds), "vs", p.regions[0].forward_seconds,
      "; drift", repr(cm.drift(p)))
if est != p or cm.drift(p) != 0.0:
    bad.append("identical updates change the estimate / drift != 0")

# part 2: fuzz seed 20191 (gen.py beside this script)
from gen import gen_profile
p = gen_profile(20191, max_regions=8, max_storages=6, max_ops=8, mode="wide")
cm = CostModel(alpha=0.3)
for _ in range(30):
    cm.update(copy.deepcopy(p))
est = cm.estimate()
b = simulate(p, Plan()).peak_bytes // 2
a1, a2 = solve(p, budget_bytes=b), solve(est, budget_bytes=b)
print(f"part 2: budget {b}: on the profile feasible={a1.feasible} step={a1.predicted_step_seconds:.4f} peak={a1.predicted_peak_bytes}; "
      f"on the estimate feasible={a2.feasible} step={a2.predicted_step_seconds:.4f} peak={a2.predicted_peak_bytes}")
print(f"        profile's plan simulated on the estimate: peak {predict(est, a1).peak_bytes} (on the profile {a1.predicted_peak_bytes})")
if a1.placements != a2.placements:
    bad.append(f"plan on the estimate differs (step {a1.predicted_step_seconds:.4f} -> {a2.predicted_step_seconds:.4f})")
if bad:
    print("VIOLATION:", "; ".join(bad))
    sys.exit(1)
print("ok")
