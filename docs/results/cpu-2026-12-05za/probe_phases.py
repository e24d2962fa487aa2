"""Probe: auto's phases over 12 steps for a few cases (books only).
Command: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05za/probe_phases.py CASE[,CASE] [steps]"""
import sys, copy, time, logging
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, sweep_autograd.py
import torch
import sweep_autograd as S
from tests.helpers import variant_runtime
logging.basicConfig(level=getattr(logging, __import__("os").environ.get("LOGLEVEL", "WARNING")))
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
for name in sys.argv[1].split(","):
    factory, loop, _ = S.CASES[name]
    torch.manual_seed(0)
    m = factory().train()
    for v in (sys.argv[3].split(",") if len(sys.argv) > 3 else ["auto"]):
        mm = copy.deepcopy(m)
        budget = None
        if v in ("auto_tight", "auto_serve"):
            probe = copy.deepcopy(m); krt = variant_runtime(probe, "keep"); loop(probe, krt, 1)
            budget = krt.report().steps[0].peak_activation_bytes // 2
            print("budget", budget)
        rt = variant_runtime(mm, v, budget)
        t0 = time.time()
        loop(mm, rt, steps)
        recs = rt.report().steps
        print(name, v, f"{time.time()-t0:.1f}s", len(recs), "records")
        for r in recs:
            print("  ", r.step, r.phases or r.phase, "peak", r.peak_activation_bytes, "repl", r.replays, "pause", round(r.pause_seconds, 4), "passes", r.passes, r.notes[:2])
