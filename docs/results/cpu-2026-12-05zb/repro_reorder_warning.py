"""Repro (diagnostics only): reordering the blocks of the ModuleList while the runtime is
entered (``blocks[0], blocks[2] = blocks[2], blocks[0]``, or wrapping a block:
``blocks[1] = Wrapper(blocks[1])``) logs "region(s) blocks.0, blocks.2 are no longer the
model's modules at those names ...; the runtime manages the modules it found then, so the
new ones run plainly and their activations are kept". But the modules now at those names
ARE the runtime's regions (the same objects) and are still recomputed: replays per step
and recomputed bytes are unchanged. The warning tells the user something false (that
memory is now kept and that a new runtime is needed), and the runtime's region names
(rt.regions, explain(), plan keys) keep the old positions. Gradients are bitwise.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zb/repro_reorder_warning.py
Exits 1 while the defect exists.
"""

import logging
import sys

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


class Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.msgs = []

    def emit(self, r):
        self.msgs.append(r.getMessage())


torch.manual_seed(0)
m = Net()
rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
catch = Catch()
logging.getLogger("offrecomp").addHandler(catch)
with rt:
    for s in range(4):
        if s == 2:
            m.blocks[0], m.blocks[2] = m.blocks[2], m.blocks[0]
        m(torch.randn(4, 8, 32)).backward()
recs = rt.report().steps
print("(replays, recomputed bytes) per step:", [(r.replays, r.recomputed_bytes) for r in recs])
print("warnings:", catch.msgs)
print("rt.regions:", list(rt.regions))
print("ids of modules at blocks.0..2 now:", [id(b) for b in m.blocks])
claims_plain = any("run plainly" in x for x in catch.msgs)
still_recomputed = recs[-1].replays == recs[0].replays and recs[-1].recomputed_bytes == recs[0].recomputed_bytes
if claims_plain and still_recomputed:
    print("DEFECT: the warning says the reordered blocks run plainly with their activations kept, "
          "but they are still replayed (same replays and recomputed bytes every step)")
    sys.exit(1)
sys.exit(0)
