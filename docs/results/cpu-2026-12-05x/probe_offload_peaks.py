"""Offload peaks under the emulated backend, 8 runs of one plain case: do they vary from
step to step, and with the backend's start delay at 0 (workers start at once)?
Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/probe_offload_peaks.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py
from harness import *
import cases_sub as cs
from tests.helpers import variant_runtime
import offrecomp.backends as be
for delay in (None, 0.0):
    if delay is not None:
        be.START_DELAY_S = delay
    vary = 0
    for r in range(8):
        reset_globals(); seed(0); c = cs.psub_plain()
        rt = variant_runtime(c.model, "offload")
        train(c, rt, steps=4)
        peaks = [s.peak_activation_bytes for s in rt.report().steps]
        vary += len(set(peaks[1:])) > 1
        print("start_delay", delay, peaks, "offloaded", [s.offloaded_bytes for s in rt.report().steps][-1])
        rt.close()
    print("runs with varying peaks:", vary, "of 8")
