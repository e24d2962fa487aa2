"""What the planner's own model says offloading can gain over the best plan without it,
and how much host time per offloaded save and per group the runtime may cost before the
gain is gone: GPT 24 x 2048 (the `gpu-1.3b` preset's shape), bf16, an H200-like device
(989 TFLOPS at 45% MFU, 4.8 TB/s), a 55 GB/s link each way (the link the H200 runs of
2026-12-04 measured). Synthetic profiles (scheduler.whatif.gpt_profile), no torch.

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-06/whatif_offload_host.py

Each row: the region's forward host time as a share of its device time (``host/dev``),
the runtime's host cost per offloaded save (pack; unpack is half of it) and per group
(offload issue; a reload is half of it), and the predicted step of the best plan that may
offload over the best plan that may not, at the same budget (a share of keep's bytes).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from scheduler import solve
from scheduler.plan import Placement
from scheduler.whatif import gpt_profile


def ratio(seq: int, share: float, host_share: float, save_us: float, group_us: float) -> tuple[float, int, float]:
    prof = gpt_profile(layers=24, hidden=2048, heads=16, seq=seq, batch=1, device_tflops=989.0,
                       d2h_gbps=55.0, h2d_gbps=55.0, mfu=0.45, dropout=False)
    for r in prof.regions:
        r.host_seconds = host_share * r.forward_seconds
        r.backward_host_seconds = 0.3 * r.backward_seconds
    prof.pack_host_seconds = save_us * 1e-6
    prof.unpack_host_seconds = 0.5 * save_us * 1e-6
    prof.offload_host_seconds = group_us * 1e-6
    prof.reload_host_seconds = 0.5 * group_us * 1e-6
    budget = int(prof.activation_bytes * share)
    without = solve(prof, budget_bytes=budget, prefetch_regions=2, allow_offload=False)
    with_offload = solve(prof, budget_bytes=budget, prefetch_regions=2, allow_offload=True)
    keep = solve(prof, budget_bytes=None, prefetch_regions=2, allow_offload=False)
    assert without.predicted_step_seconds and with_offload.predicted_step_seconds and keep.predicted_step_seconds
    return (
        with_offload.predicted_step_seconds / without.predicted_step_seconds,
        with_offload.counts()[Placement.OFFLOAD],
        without.predicted_step_seconds / keep.predicted_step_seconds,
    )


def main() -> None:
    print("  seq  budget  host/dev  us/save  us/group  offload/none  offloaded  none/keep")
    for seq in (8192, 16384):
        for share in (0.5, 0.25):
            for host_share in (0.5, 0.9):
                for save_us, group_us in ((0, 0), (5, 100), (15, 300), (30, 1000), (60, 2000)):
                    r, n, none = ratio(seq, share, host_share, save_us, group_us)
                    print(f"{seq:5d}  {share:6.0%}  {host_share:8.1f}  {save_us:7d}  {group_us:8d}  "
                          f"{r:12.3f}  {n:9d}  {none:9.3f}")


if __name__ == "__main__":
    main()
