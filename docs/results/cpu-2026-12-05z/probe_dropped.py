"""Exploratory probe (see README.md). Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05z/probe_dropped.py"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py, sweep_z.py
import harness, sweep_z, torch, offrecomp, gc
m = sweep_z.Net()
rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
with rt:
    for step in range(3):
        junk = m(sweep_z.xin(step + 500)).pow(2).mean()
        eng = rt.offload_engine
        print("after junk fwd: live", eng.live_groups, "held", rt.offload_groups_held, "dev", eng.device_bytes)
        del junk
        print("after del junk: live", eng.live_groups, "held", rt.offload_groups_held, "dev", eng.device_bytes)
        loss = m(sweep_z.xin(step)).pow(2).mean()
        print("after 2nd fwd: live", eng.live_groups, "held", rt.offload_groups_held, "dev", eng.device_bytes)
        loss.backward()
        print("after bwd: live", eng.live_groups, "held", rt.offload_groups_held, "dev", eng.device_bytes)
for s in rt.report().steps:
    print(s.step, s.passes, s.phases, s.peak_activation_bytes, s.offloaded_bytes, s.d2h_bytes, s.h2d_bytes, s.saved_tensors, s.notes)
