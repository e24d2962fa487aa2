"""Repro (minor): auto calls a budget infeasible that its own measuring step (and
mode="recompute") met, and names a "smallest feasible budget" above what that step held.
docs/reliability.md (Resource faults): "An infeasible budget warns once ... naming the
smallest budget the solver accepts (no larger than what the measuring step held ...);
a budget the measuring steps met never is".

Model: 4 regions, each running an nn.LSTMCell over 32 time steps itself (fp32; every
save is 2 KiB, under min_bytes). Budget: 30% of the way from recompute's books to keep's.
Exits 1 while the warning names a budget above the measuring step's books.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/repro_infeasible_above_measured.py
"""
import copy
import logging
import re
from pathlib import Path
import sys

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import offrecomp  # noqa: E402


class CellLoop(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.cell, self.ln = nn.LSTMCell(d, d), nn.LayerNorm(d)

    def forward(self, x):
        h = c = x.new_zeros(x.shape[0], x.shape[2])
        outs = []
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
            outs.append(h)
        return self.ln(x + torch.stack(outs, 1))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(CellLoop() for _ in range(4))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def batch(s):
    return torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(s))


def train(m, rt, steps):
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    with rt:
        for s in range(steps):
            m(batch(s)).backward()
            opt.step()
            opt.zero_grad()
    return rt.report().steps


torch.manual_seed(0)
base = Stack()
books = {}
for mode in ("keep", "recompute"):
    m = copy.deepcopy(base)
    books[mode] = train(m, offrecomp.runtime(m, mode=mode), 2)[-1].peak_activation_bytes
B = int(books["recompute"] + 0.3 * (books["keep"] - books["recompute"]))
msgs = []
h = logging.Handler(logging.WARNING)
h.emit = lambda r: msgs.append(r.getMessage())
logging.getLogger("offrecomp").addHandler(h)
m = copy.deepcopy(base)
steps = train(m, offrecomp.runtime(m, mode="auto", budget=B), 6)
print(f"books: keep {books['keep']}, recompute {books['recompute']}; budget B = {B}")
for s in steps:
    print(f"  step {s.step} {s.phase:9} books {s.peak_activation_bytes} predicted {s.predicted_peak_bytes}")
for x in msgs:
    print("  warning:", x)
named = [int(g) for x in msgs for g in re.findall(r"smallest feasible budget is [^(]*\((\d+) bytes\)", x)]
measured = steps[0].peak_activation_bytes
if steps[0].phase == "measure" and measured <= B and named and named[0] > measured:
    print(f"WRONG: budget {B} met by the measuring step ({measured}) called infeasible; named smallest {named[0]} > {measured}")
    sys.exit(1)
print("ok")
