"""Blocks alternating between two forms every step (a flag flipped by the loop, as an
attention processor swapped every other step); the second form saves an (n, n) product.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-06l/repro_two_forms.py BUDGET STEPS [D N]

Prints each step's phase, booked activation peak and budget, and the worst planned
peak over the budget. D x N: the block width and the rows (32 x 256 by default: every
storage of the first form under min_bytes; 64 x 1024: above it).
"""
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import offrecomp
torch.manual_seed(0)
class Block(nn.Module):
    def __init__(s, d):
        super().__init__(); s.a = nn.Linear(d, d); s.b = nn.Linear(d, d); s.classic = False
    def forward(s, x):
        h = torch.tanh(s.a(x))
        if s.classic:  # saves an (n, n) matrix, as explicit attention does
            w = torch.softmax(h @ h.transpose(-1, -2), -1)
            h = w @ h
        return x + s.b(torch.relu(h))
class M(nn.Module):
    def __init__(s, d, n):
        super().__init__(); s.blocks = nn.ModuleList([Block(d) for _ in range(n)])
    def forward(s, x):
        for b in s.blocks: x = b(x)
        return x.sum()
d, n = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (32, 256)
m = M(d, 6)
x = torch.randn(n, d)
budget = int(sys.argv[1]) if len(sys.argv) > 1 else 600_000
with offrecomp.runtime(m, budget=budget) as rt:
    for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 16):
        for b in m.blocks: b.classic = bool(i % 2)
        m(x).backward()
worst = 0
for s in rt.report().steps:
    print(s.step, s.phase.value, s.peak_activation_bytes, s.budget_bytes, s.notes[:1])
    if s.phase.value == "planned": worst = max(worst, s.peak_activation_bytes / s.budget_bytes)
print("worst planned peak / budget", round(worst, 3))
