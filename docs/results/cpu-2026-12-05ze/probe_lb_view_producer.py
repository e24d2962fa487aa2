"""lower_bound() above the best plan's step when the dropped storage's producer is itself a
view. The bound stays above exhaustive's optimum on fuzz seeds 483 and 1333 after the fix of
repro_lb_view_reads.py (out_small_0_after.txt); in both a view op produces a storage. This
is one such case, hand-built; whether it is the seeds' whole story is not established.

Region l0: op0 (1 s) -> op1 (a view of op0, 0.5 s, produces s0, 100 B); region l1
(replayable=False, 100 B) leaves s0 to drop at budget 100. Dropping s0 replays the view
alone (replay_seconds 0.5 s); with op0 not skippable the bound charges op0 too (1 s more);
with op0 skippable (the control) it does not.
Exits 1 while lower_bound > exhaustive optimum.
Run: cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/probe_lb_view_producer.py
"""
import logging
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
logging.disable(logging.WARNING)
from scheduler import OpRecord, Placement, Profile, RegionRecord, StorageRecord  # noqa: E402
from scheduler import exhaustive_solve, lower_bound, replay_seconds  # noqa: E402

bad = []
for op0_skippable in (False, True):
    ops = [OpRecord(seconds=1.0, skippable=op0_skippable, reads=()),
           OpRecord(seconds=0.5, skippable=False, reads=(0,), view=True, outputs=(0,))]
    region = RegionRecord(name="l0", call_index=0, start_seconds=0.0, forward_seconds=1.5, backward_seconds=4.0, ops=ops,
                          storages=[StorageRecord(nbytes=100, producer_op=1, first_save_op=2, last_save_op=2, offset_seconds=1.5)])
    other = RegionRecord(name="l1", call_index=0, start_seconds=1.5, forward_seconds=1.0, backward_seconds=2.0,
                         ops=[OpRecord(seconds=1.0, skippable=True, reads=(), outputs=(0,))],
                         storages=[StorageRecord(nbytes=100, producer_op=0, first_save_op=1, last_save_op=1, offset_seconds=1.0)],
                         replayable=False)
    p = Profile(signature="view-producer", forward_seconds=2.5, backward_seconds=6.0, regions=[region, other])
    best = exhaustive_solve(p, 100)
    lb = lower_bound(p, 100)
    print(f"op0 skippable={op0_skippable}: replay_seconds(drop s0) = {replay_seconds(region, [Placement.RECOMPUTE])}; "
          f"exhaustive optimum {best.predicted_step_seconds} (feasible {best.feasible}); lower_bound {lb}")
    if best.feasible and lb > best.predicted_step_seconds * (1 + 1e-9) + 1e-12:
        bad.append(f"op0 skippable={op0_skippable}: lower bound {lb} > optimum {best.predicted_step_seconds}")
if bad:
    print("VIOLATION:", "; ".join(bad))
    sys.exit(1)
print("ok")
