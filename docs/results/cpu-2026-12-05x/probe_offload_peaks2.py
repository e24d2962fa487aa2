"""Offload peaks of a plain 3-block stack (no feature of this sweep), 6 runs before and 6
after one auto run in the same process: emulated-backend timing.
Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/probe_offload_peaks2.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py
import threading
from harness import *
from tests.helpers import variant_runtime


def plain_case():
    return Case(Stack([Block() for _ in range(3)]))


def offload_runs(tag):
    vary = 0
    for r in range(6):
        reset_globals(); seed(0); c = plain_case()
        rt = variant_runtime(c.model, "offload")
        train(c, rt, steps=4)
        peaks = [s.peak_activation_bytes for s in rt.report().steps]
        vary += len(set(peaks[1:])) > 1
        rt.close()
        print(tag, peaks, "threads alive:", threading.active_count())
    print(tag, "runs with varying peaks (steps 1-3):", vary, "of 6")


offload_runs("before auto")
reset_globals(); seed(0); c = plain_case()
rt = variant_runtime(c.model, "auto"); train(c, rt, steps=4); rt.close()
offload_runs("after auto")
