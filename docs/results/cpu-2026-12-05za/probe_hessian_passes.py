"""Probe: per-step records of forward-over-reverse Hessian passes (H) and training passes (T) under a variant.
Command: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05za/probe_hessian_passes.py offload HT"""
import sys, copy, logging, gc
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, sweep_autograd.py
import torch, warnings
warnings.simplefilter("ignore")
logging.getLogger("offrecomp").setLevel(logging.ERROR)
from common import Net, X
from tests.helpers import variant_runtime
torch.manual_seed(0)
base = Net(p=0.0)
v = sys.argv[1]
m = copy.deepcopy(base); rt = variant_runtime(m, v)
with rt:
    for s in range(4):
        x = X(s, (1, 2, 16))
        f = lambda xx: m(xx).square().mean()
        if "H" in sys.argv[2]:
            H = torch.autograd.functional.hessian(f, x, vectorize=True, outer_jacobian_strategy="forward-mode")
            del H
        print("after H: groups held", rt.offload_groups_held)
        if "T" in sys.argv[2]:
            loss = (m(X(s + 1)) ** 2).mean(); loss.backward(); del loss
            m.zero_grad()
        gc.collect()
        print("after T: groups held", rt.offload_groups_held)
for r in rt.report().steps:
    print(r.step, r.phases or r.phase, r.signature[:40], "peak", r.peak_activation_bytes, "kept", r.kept_bytes, "off", r.offloaded_bytes, "in", r.input_bytes, "saved", r.saved_tensors)
