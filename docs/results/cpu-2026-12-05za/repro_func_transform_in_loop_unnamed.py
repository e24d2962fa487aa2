"""Documented limit, kept as a usability repro: inside `with offrecomp.runtime(...)`, any
torch.func.grad / vjp / jacrev / hessian called from the training loop (not from a
forward) -- even on a function that never touches the model -- fails with torch's own
message, which names neither offrecomp nor the runtime; the same applies to
torch.autograd.graph.disable_saved_tensors_hooks, whose error is the caller's own string.
docs/reliability.md (Known limits, "torch.func transforms") documents both ("call them
outside `with rt:`"); the in-forward case is wrapped by diagnostics.refused_transform with
a message naming the region, the loop-level case is not (the runtime's saved-tensor hook
pair stays registered for the whole `with` block, between forwards too).
Nothing is computed wrongly: the call raises.

Command: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05za/repro_func_transform_in_loop_unnamed.py
Exits 1 while the loop-level messages do not mention offrecomp."""
import sys

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import torch
from torch import nn

import offrecomp

m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
unnamed = 0
with offrecomp.runtime(m, mode="recompute", min_bytes=0):
    for what, fn in [
        ("torch.func.grad of sin (no model)", lambda: torch.func.grad(lambda a: a.sin().sum())(torch.randn(3))),
        ("torch.func.jacrev of the model", lambda: torch.func.jacrev(m)(torch.randn(8))),
        ("torch.func.vjp of the model", lambda: torch.func.vjp(m, torch.randn(8))),
        ("disable_saved_tensors_hooks around a forward", lambda: torch.autograd.graph.disable_saved_tensors_hooks("my message").__enter__()),
    ]:
        try:
            fn()
            print(f"{what}: ran")
        except RuntimeError as e:
            named = "offrecomp" in str(e)
            unnamed += not named
            print(f"{what}: RuntimeError{'' if named else ' (offrecomp not named)'}: {str(e)[:140]}")
sys.exit(1 if unnamed else 0)
