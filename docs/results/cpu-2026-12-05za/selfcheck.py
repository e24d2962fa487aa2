"""Self-check of the sweep harness: a loop that differs only when a runtime is given must FAIL.
Command: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05za/selfcheck.py"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, sweep_autograd.py
import torch
from common import Net, X, run_case, std_loop

def body(m, s):
    loss = (m(X(s)) ** 2).mean()
    loss.backward()
    if torch.autograd.graph.saved_tensors_hooks is not None and m._rt_flag:
        m.head.bias.grad[0] += 1e-7
    return {"loss": loss}

base = std_loop(body)
def loop(model, rt, steps):
    model._rt_flag = rt is not None
    return base(model, rt, steps)
r = run_case("selfcheck", Net, loop, ["keep", "recompute"])
print("harness detects a 1e-7 change:", all(v == "FAIL" for v in r.values()))
