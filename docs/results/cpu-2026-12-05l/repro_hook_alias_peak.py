"""A forward hook that keeps a detached alias of each Linear's input (as per-sample
gradient / Opacus-style code does) makes auto's first planned step book more
activation bytes than its plan predicted, and offrecomp warns that the step held more
than the budget (half keep's peak); later planned steps meet the prediction exactly.
Without the hook the same loop plans to the same prediction and never warns. Gradients
are bitwise equal either way.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05l/repro_hook_alias_peak.py
"""
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp


class MLPBlock(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 2 * h)
        self.fc2 = nn.Linear(2 * h, h)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def build(hook):
    torch.manual_seed(0)
    m = nn.ModuleDict(dict(blocks=nn.ModuleList(MLPBlock(16) for _ in range(3))))
    store = {}
    if hook:
        for mod in m.modules():
            if isinstance(mod, nn.Linear):
                mod.register_forward_hook(lambda mod, i, o: store.__setitem__(mod, i[0].detach()))
    return m


def train(m, rt, steps=6):
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with rt:
        for s in range(steps):
            torch.manual_seed(s)
            opt.zero_grad()
            x = torch.randn(5, 16)
            for b in m["blocks"]:
                x = b(x)
            x.square().mean().backward()
            opt.step()
    return rt.report().steps


for hook in (False, True):
    k = build(hook)
    budget = train(k, offrecomp.runtime(k, mode="keep", min_bytes=0))[-1].peak_activation_bytes // 2
    m = build(hook)
    st = train(m, offrecomp.runtime(m, mode="auto", min_bytes=0, budget=budget))
    print(f"hook={hook} budget={budget}:",
          [(x.phase.value if hasattr(x.phase, "value") else x.phase, x.peak_activation_bytes, x.predicted_peak_bytes) for x in st])
