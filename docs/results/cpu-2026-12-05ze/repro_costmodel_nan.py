"""CostModel accepts a NaN-timed profile, drift() reports 0.0 for it, and the NaN stays in
the estimate for good (an EMA of NaN is NaN): after 20 clean updates the estimate is
still NaN, drift() of the clean profile is 0.0, and solve(estimate) raises.
Where: scheduler/cost_model.py CostModel.update (no check of the numbers it averages) and
CostModel.drift (max(worst, nan) keeps worst, so a NaN difference reads as no drift).
Exits 1 while any of this holds.
Run: cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/repro_costmodel_nan.py
"""
import copy
import math
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
from scheduler import CostModel, Profile, RegionRecord, StorageRecord, solve


def prof(fwd: float) -> Profile:
    return Profile(signature="s", forward_seconds=2.0, backward_seconds=4.0, regions=[
        RegionRecord(name=f"l{i}", call_index=0, start_seconds=float(i), forward_seconds=fwd if i == 0 else 1.0,
                     backward_seconds=2.0, storages=[StorageRecord(nbytes=100, offset_seconds=0.5)])
        for i in range(2)])


bad = []
cm = CostModel(alpha=0.3)
cm.update(prof(1.0))
d = cm.drift(prof(math.nan))
print("drift(profile with a NaN region forward time) =", d)
if d == 0.0:
    bad.append("drift() of a NaN-timed profile is 0.0")
cm.update(prof(math.nan))  # accepted silently
print("update(NaN profile): accepted; estimate l0 forward =", cm.estimate().regions[0].forward_seconds)
for _ in range(20):
    cm.update(prof(1.0))
est = cm.estimate()
print("after 20 clean updates: estimate l0 forward =", est.regions[0].forward_seconds,
      "; drift(clean profile) =", cm.drift(prof(1.0)))
if math.isnan(est.regions[0].forward_seconds):
    bad.append("NaN never leaves the estimate")
if cm.drift(prof(1.0)) == 0.0 and math.isnan(est.regions[0].forward_seconds):
    bad.append("drift() says 0 while the estimate holds NaN")
try:
    solve(est, budget_bytes=100)
    print("solve(estimate): returned a plan")
except ValueError as e:
    print("solve(estimate) raises:", e)
    bad.append("solve(estimate) fails for good after one NaN measurement")
if bad:
    print("VIOLATION:", "; ".join(bad))
    sys.exit(1)
print("ok")
