"""A training step run under a TorchDispatchMode (here torch.utils.flop_counter.
FlopCounterMode, the usual way to count FLOPs; a no-op mode does the same, and so does
torch.autograd.graph.allow_mutation_on_saved_tensors) with a block that multiplies by a
Python scalar: plain PyTorch trains; under offrecomp.runtime every mode's backward raises
TypeError: _same() missing 1 required positional argument: 't' (keep: first step;
recompute/auto: first three steps)."""
import sys
import torch
from torch import nn
import offrecomp
from torch.utils.flop_counter import FlopCounterMode

D = 8
class B(nn.Module):
    def __init__(s):
        super().__init__(); s.l = nn.Linear(D, D)
    def forward(s, x):
        return x + torch.sigmoid(s.l(x)) * 0.5     # x * <python float>

def step(m, i):
    with FlopCounterMode(display=False):
        m(torch.randn(2, D, generator=torch.Generator().manual_seed(i))).sum().backward()

torch.manual_seed(0)
plain = nn.Sequential(B(), B(), B())
for i in range(4):
    step(plain, i)
print("plain: ok")

bad = False
for mode in ["keep", "offload", "recompute", "auto"]:
    torch.manual_seed(0)
    m = nn.Sequential(B(), B(), B())
    res = []
    with offrecomp.runtime(m, mode=mode, min_bytes=0):
        for i in range(4):
            try:
                step(m, i); res.append("ok")
            except Exception as e:
                bad = True; res.append(f"{type(e).__name__}: {e}")
    print(f"{mode:9s}", res)
sys.exit(1 if bad else 0)
