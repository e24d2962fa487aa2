"""The what-if of whatif_offload_host.py with no runtime host cost, and recompute made
dearer by a per-op replay overhead (``Profile.replay_op_seconds``): the plans without
offloading then cost more over keep (the H200 run measured 1.14x keep at 8K/50%), and
offloading has more recompute to replace.

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-06/whatif_replay_price.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from scheduler import solve
from scheduler.whatif import gpt_profile


def main() -> None:
    print("  seq  replay us/op  budget  none/keep  offload/none")
    for seq in (8192, 16384):
        for replay_op in (0.0, 10e-6, 30e-6, 100e-6):
            prof = gpt_profile(layers=24, hidden=2048, heads=16, seq=seq, batch=1, device_tflops=989.0,
                               d2h_gbps=55.0, h2d_gbps=55.0, mfu=0.45, dropout=False)
            prof.replay_op_seconds = replay_op
            keep = solve(prof, budget_bytes=None, prefetch_regions=2, allow_offload=False)
            for share in (0.5, 0.25):
                budget = int(prof.activation_bytes * share)
                without = solve(prof, budget_bytes=budget, prefetch_regions=2, allow_offload=False)
                offload = solve(prof, budget_bytes=budget, prefetch_regions=2, allow_offload=True)
                assert keep.predicted_step_seconds and without.predicted_step_seconds and offload.predicted_step_seconds
                print(f"{seq:5d}  {1e6 * replay_op:12.0f}  {share:6.0%}  "
                      f"{without.predicted_step_seconds / keep.predicted_step_seconds:9.3f}  "
                      f"{offload.predicted_step_seconds / without.predicted_step_seconds:12.3f}")


if __name__ == "__main__":
    main()
