"""Probe: wall time of a case's loop (12 steps) plain vs under keep / recompute / auto, and
auto's phases (does auto ever plan?).
Command: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05za/probe_time.py CASE[,CASE] [steps]"""
import sys, copy, time, logging
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, sweep_autograd.py
import torch
import sweep_autograd as S
from tests.helpers import variant_runtime
logging.getLogger("offrecomp").setLevel(logging.ERROR)
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
for name in sys.argv[1].split(","):
    factory, loop, _ = S.CASES[name]
    torch.manual_seed(0)
    m = factory().train()
    for v in ["plain", "keep", "recompute", "auto", "plain"]:
        mm = copy.deepcopy(m)
        rt = None if v == "plain" else variant_runtime(mm, v)
        t0 = time.perf_counter()
        loop(mm, rt, steps)
        dt = time.perf_counter() - t0
        ph = "" if rt is None else " ".join(sorted({(r.phases or r.phase) + f"x{sum(1 for q in rt.report().steps if (q.phases or q.phase) == (r.phases or r.phase))}" for r in rt.report().steps}))
        last = "" if rt is None else f" last-4 step_seconds {[round(r.step_seconds*1e3,1) for r in rt.report().steps[-4:]]} ms"
        print(f"{name:26s} {v:10s} {dt*1e3/steps:7.1f} ms/step  {ph}{last}", flush=True)
