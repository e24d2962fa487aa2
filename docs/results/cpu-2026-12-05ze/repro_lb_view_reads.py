"""lower_bound() exceeds the best plan's simulated step when a dropped storage's
producer reads a view op (docs/planner.md: "no plan whose simulated peak fits is faster").

One dataflow region l0 (and l1, replayable=False, 100 B): op0 (1 s, not skippable) -> op1 (view of op0, 0 s) -> op2 (1 s,
produces s0, 100 B). Dropping s0 replays op2 and the view op1 (the closure never enters
a view, scheduler/profile.py), 1 s in the simulator; the bound charges op0 too (2 s).
Exits 1 while lower_bound > exhaustive optimum.
Run: cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/repro_lb_view_reads.py
"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
from scheduler import OpRecord, Profile, RegionRecord, StorageRecord, Plan, Placement
from scheduler import exhaustive_solve, lower_bound, simulate, replay_seconds

ops = [
    OpRecord(seconds=1.0, skippable=False, reads=()),
    OpRecord(seconds=0.0, skippable=False, reads=(0,), view=True),
    OpRecord(seconds=1.0, skippable=True, reads=(1,), outputs=(0,)),
]
region = RegionRecord(
    name="l0", call_index=0, start_seconds=0.0, forward_seconds=2.0, backward_seconds=4.0,
    ops=ops,
    storages=[StorageRecord(nbytes=100, producer_op=2, first_save_op=3, last_save_op=3, offset_seconds=2.0)],
)
# a second region that must not replay (its storage stays): the budget forces s0 out
other = RegionRecord(
    name="l1", call_index=0, start_seconds=2.0, forward_seconds=1.0, backward_seconds=2.0,
    ops=[OpRecord(seconds=1.0, skippable=True, reads=(), outputs=(0,))],
    storages=[StorageRecord(nbytes=100, producer_op=0, first_save_op=1, last_save_op=1, offset_seconds=1.0)],
    replayable=False,
)
p = Profile(signature="repro", forward_seconds=3.0, backward_seconds=6.0, regions=[region, other])
budget = 100
best = exhaustive_solve(p, budget)
lb = lower_bound(p, budget)
drop = simulate(p, Plan(placements={("l0", 0, 0): Placement.RECOMPUTE}))
print("replay_seconds(drop s0) =", replay_seconds(region, [Placement.RECOMPUTE]))
print("drop-s0 plan: step", drop.step_seconds, "peak", drop.peak_bytes)
print("exhaustive optimum at budget", budget, ":", best.predicted_step_seconds, "feasible", best.feasible)
print("lower_bound(profile, budget)  :", lb)
if best.feasible and lb > best.predicted_step_seconds * (1 + 1e-9) + 1e-12:
    print(f"VIOLATION: lower bound {lb} > optimum {best.predicted_step_seconds}")
    bad1 = True
else:
    bad1 = False

# Second case, through a sink: op0 (1 s) -> view op1 -> sink op2 (1 s); op3 (1 s) makes s0.
# The simulator runs op3, the sink op2 and the view op1 (2 s), never op0;
# flat._fixed_from counts op0 as run by every replay with K >= 3.
ops2 = [
    OpRecord(seconds=1.0, skippable=False, reads=()),
    OpRecord(seconds=0.0, skippable=False, reads=(0,), view=True),
    OpRecord(seconds=1.0, skippable=False, reads=(1,), sink=True),
    OpRecord(seconds=1.0, skippable=True, reads=(), outputs=(0,)),
]
region2 = RegionRecord(
    name="l0", call_index=0, start_seconds=0.0, forward_seconds=3.0, backward_seconds=4.0,
    ops=ops2,
    storages=[StorageRecord(nbytes=100, producer_op=3, first_save_op=4, last_save_op=4, offset_seconds=3.0)],
)
other2 = RegionRecord(
    name="l1", call_index=0, start_seconds=3.0, forward_seconds=1.0, backward_seconds=2.0,
    ops=[OpRecord(seconds=1.0, skippable=True, reads=(), outputs=(0,))],
    storages=[StorageRecord(nbytes=100, producer_op=0, first_save_op=1, last_save_op=1, offset_seconds=1.0)],
    replayable=False,
)
p2 = Profile(signature="repro2", forward_seconds=4.0, backward_seconds=6.0, regions=[region2, other2])
best2 = exhaustive_solve(p2, 100)
lb2 = lower_bound(p2, 100)
print("\ncase 2 (sink reads a view): replay_seconds(drop s0) =", replay_seconds(region2, [Placement.RECOMPUTE]))
print("exhaustive optimum at budget 100:", best2.predicted_step_seconds, "feasible", best2.feasible)
print("lower_bound(profile, 100)      :", lb2)
bad2 = best2.feasible and lb2 > best2.predicted_step_seconds * (1 + 1e-9) + 1e-12
if bad2:
    print(f"VIOLATION: lower bound {lb2} > optimum {best2.predicted_step_seconds}")
if bad1 or bad2:
    sys.exit(1)
print("ok")
