"""Probe (not a sweep case): offload step times before and after a step aborted by an
exception, per-step `with rt:` entry as in sweep_threads.sigalrm_random.
Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05y/probe_offload_after_fault.py"""
import sys, time, copy
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py
from common import *
from common import make, make_rt, fwd, torch
m = make(); rt = make_rt(m, "offload")
opt = torch.optim.SGD(m.parameters(), lr=0.1)
def step(s, fail=False):
    t0 = time.perf_counter()
    try:
        with rt:
            loss = fwd(m, s)
            if fail:
                raise TimeoutError
            loss.backward()
        opt.step(); opt.zero_grad()
    except TimeoutError:
        opt.zero_grad()
    return (time.perf_counter() - t0) * 1e3
print("normal steps ms:", [round(step(s), 1) for s in range(6)])
for k in range(3):
    print(f"aborted forward {k}: {step(0, True):.1f} ms; next steps ms:", [round(step(s), 1) for s in range(4)])
