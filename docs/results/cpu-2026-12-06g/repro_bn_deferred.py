"""Buffers written unseen (a5d7d97) on a device whose comparisons are read later
(CUDA): simulated on the CPU by deferring the exit comparisons (compares_later) and by a
device that has not caught up by the forward's end (PendingCompare.ready -> False).
The writer's comparison is then applied at the reader's... or not at all before the
reader's replay, so the eval call's replay reads the train call's statistics."""
import sys, copy
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch
from torch import nn
import offrecomp
import offrecomp.buffers as B

B.compares_later = lambda d: True
B.PendingCompare.ready = lambda self: False

channels = 20000

class ScaleNormBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, channels))
        self.bn = nn.BatchNorm1d(channels)
    def forward(self, x):
        return x + torch.relu(self.bn(x * self.scale))

def step(m, s):
    g = torch.Generator().manual_seed(s)
    x1, x2 = torch.randn(4, channels, generator=g), torch.randn(4, channels, generator=g)
    m.eval(); l1 = m(x1).square().mean()
    m.train(); l2 = m(x2).square().mean()
    (l1 + l2).backward()
    out = [p.grad.clone() for p in m.parameters()] + [b.clone() for b in m.buffers()]
    m.zero_grad()
    return out

torch.manual_seed(0)
base = nn.Sequential(*[ScaleNormBlock() for _ in range(3)])
ref_m = copy.deepcopy(base)
ref = [step(ref_m, s) for s in range(3)]
bad = False
for mode in ("recompute",):
    m = copy.deepcopy(base)
    with offrecomp.runtime(m, mode=mode, min_bytes=0):
        got = [step(m, s) for s in range(3)]
    for i, (a, b) in enumerate(zip(ref, got)):
        diff = max((x - y).abs().max().item() for x, y in zip(a, b))
        print(mode, "step", i, "max diff", diff)
        if diff != 0:
            bad = True
print("BUG" if bad else "ok")
sys.exit(1 if bad else 0)
