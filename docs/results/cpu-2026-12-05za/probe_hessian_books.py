"""Probe: books of a vectorised Hessian (vec, loop, grad_only = is_grads_batched, fwd = forward-over-reverse)
followed by a training step, under keep/recompute/offload; explains the books_table flag on
functional_hessian_vec (the last record is a different pass, not a defect).
Command: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05za/probe_hessian_books.py vec,loop,grad_only,fwd,fwd_nostep"""
import sys, copy, logging
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, sweep_autograd.py
import torch, warnings
warnings.simplefilter("ignore")
logging.getLogger("offrecomp").setLevel(logging.ERROR)
from common import Net, X
from tests.helpers import variant_runtime
torch.manual_seed(0)
base = Net(p=0.0)
def step(m, s, which):
    x = X(s, (1, 2, 16))
    f = lambda xx: m(xx).square().mean()
    if which == "vec":
        H = torch.autograd.functional.hessian(f, x, vectorize=True)
    elif which == "loop":
        H = torch.autograd.functional.hessian(f, x)
    elif which == "fwd":
        H = torch.autograd.functional.hessian(f, x, vectorize=True, outer_jacobian_strategy="forward-mode")
    elif which == "fwd_nostep":
        H = torch.autograd.functional.hessian(f, x, vectorize=True, outer_jacobian_strategy="forward-mode")
        return
    elif which == "grad_only":
        xx = x.requires_grad_(True); g, = torch.autograd.grad(f(xx), xx, create_graph=True)
        H, = torch.autograd.grad(g, xx, torch.eye(32).reshape(32, 1, 2, 16), is_grads_batched=True)
    loss = (m(X(s + 1)) ** 2).mean(); loss.backward()
    m.zero_grad()
for which in sys.argv[1].split(","):
    for v in ["keep", "recompute", "offload"]:
        m = copy.deepcopy(base); rt = variant_runtime(m, v)
        with rt:
            for s in range(3):
                step(m, s, which)
        if not rt.report().steps:
            print(which, v, "no records"); continue
        for r in rt.report().steps[-1:]:
          print(which, v, len(rt.report().steps), "peak", r.peak_activation_bytes, "kept", r.kept_bytes, "recomp", r.recomputed_bytes, "off", r.offloaded_bytes, "replays", r.replays, "passes", r.passes, r.phases or r.phase)
