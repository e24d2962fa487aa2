"""auto under a caller's dispatch mode around every forward: phases over 12 steps.
Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/probe_calibrate_forever.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py
import time
from harness import *
import cases_modes as cm
from tests.helpers import variant_runtime
for name in ["dround_fwd", "dcount_step"]:
    for v in ["keep", "auto"]:
        reset_globals(); seed(0); c = cm.CASES[name]()
        rt = variant_runtime(c.model, v)
        t0 = time.perf_counter(); train(c, rt, steps=12); dt = time.perf_counter() - t0
        recs = rt.report().steps
        print(name, v, f"{dt:.3f}s", [s.phase.value for s in recs], "replays", [s.replays for s in recs][-3:])
