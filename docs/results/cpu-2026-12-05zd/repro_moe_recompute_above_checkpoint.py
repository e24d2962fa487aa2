"""Repro (minor): a stack of top-1 routed MoE blocks (data-dependent row selection with
nonzero/index_add) under mode="recompute" peaks above torch.utils.checkpoint per block
by the allocator, where docs/reliability.md says recompute's allocator peak is <=
torch.utils.checkpoint's. Prints both peaks over 5 steps (torch.profiler
profile_memory=True, as tests/offrecomp/test_memory.allocator_peak); exits 1 while
recompute's median is over 1.02x checkpoint's.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/repro_moe_recompute_above_checkpoint.py
"""
import copy
import statistics
from pathlib import Path
import sys

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import offrecomp  # noqa: E402


def allocator_peak(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = peak = 0
    for e in sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns()):
        if e.name() == "[memory]":
            cur += e.nbytes()
            peak = max(peak, cur)
    return peak


class MoEBlock(nn.Module):
    def __init__(self, d=64, experts=4):
        super().__init__()
        self.ln, self.gate = nn.LayerNorm(d), nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(experts))

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln(x).reshape(-1, d)
        w, idx = torch.softmax(self.gate(h), -1).max(-1)
        y = torch.zeros_like(h)
        for e, ex in enumerate(self.experts):
            rows = (idx == e).nonzero().squeeze(-1)
            if rows.numel():
                y = y.index_add(0, rows, ex(h[rows]) * w[rows, None])
        return x + y.reshape(b, t, d)


class Ckpt(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False)


class Stack(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


torch.manual_seed(0)
base = Stack([MoEBlock() for _ in range(4)])


def peaks(m, rt=None):
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    out = []
    with rt if rt is not None else torch.enable_grad():
        for s in range(6):
            x = torch.randn(8, 64, 64, generator=torch.Generator().manual_seed(s))
            torch.manual_seed(s)
            out.append(allocator_peak(lambda: m(x).backward()))
            opt.step()
            opt.zero_grad(set_to_none=False)
    return out[1:]


ck = copy.deepcopy(base)
ck.blocks = nn.ModuleList(Ckpt(b) for b in ck.blocks)
c = peaks(ck)
m = copy.deepcopy(base)
r = peaks(m, offrecomp.runtime(m, mode="recompute"))
print("torch.utils.checkpoint allocator peaks:", c)
print("offrecomp recompute allocator peaks:   ", r)
ratio = statistics.median(r) / statistics.median(c)
print(f"recompute / checkpoint (medians): {ratio:.3f} ({statistics.median(r) - statistics.median(c)} bytes)")
if ratio > 1.02:
    print("WRONG: recompute holds more than torch.utils.checkpoint")
    sys.exit(1)
print("ok")
