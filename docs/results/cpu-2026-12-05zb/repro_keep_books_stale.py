"""Repro: under mode="keep" (native keep on, the default), a region whose saves change
while the runtime is entered, by a change that moves no structure epoch (a parameter
widened through ``.data``, a plain flag that adds an op, a block cast to another dtype),
keeps being booked from the record of the signature's first pass: every later step's
peak_activation_bytes / kept_bytes are the old ones. The same loop with
native_keep=False (the hooks see every save) books the real bytes.

Gradients are unaffected; only the books (rt.report().steps) are wrong.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zb/repro_keep_books_stale.py
Exits 1 while the defect exists.
"""

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
        self.gate = False

    def forward(self, x):
        dt = self.fc1.weight.dtype
        h = F.gelu(self.fc1(x.to(dt)))
        if self.gate:
            h = h * torch.sigmoid(h)
        return (x.to(dt) + self.fc2(h)).to(x.dtype)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def widen(m):
    b = m.blocks[1]
    b.fc1.weight.data = torch.randn(256, 32) * 0.1
    b.fc1.bias.data = torch.randn(256) * 0.1
    b.fc2.weight.data = torch.randn(32, 256) * 0.1


CHANGES = {
    "widen via .data (64 -> 256)": widen,
    "plain flag adds an op": lambda m: setattr(m.blocks[1], "gate", True),
    "block cast to float64": lambda m: m.blocks[1].double(),
}


def books(change, native):
    torch.manual_seed(0)
    m = Net()
    rt = offrecomp.runtime(m, mode="keep", min_bytes=0, native_keep=native)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    with rt:
        for step in range(6):
            if step == 3:
                change(m)
            x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(step))
            m(x).backward()
            opt.step()
            opt.zero_grad()
    return [(r.peak_activation_bytes, r.kept_bytes) for r in rt.report().steps]


bad = False
for name, change in CHANGES.items():
    native = books(change, True)
    hooked = books(change, False)
    print(f"{name}:")
    print(f"  keep, native_keep=True  (peak, kept) per step: {native}")
    print(f"  keep, native_keep=False (peak, kept) per step: {hooked}")
    if native[3:] != hooked[3:]:
        bad = True
        print(f"  WRONG BOOKS: after the change native keep books {native[-1][0]} B peak, the hooks see {hooked[-1][0]} B "
              f"({hooked[-1][0] / native[-1][0]:.2f}x)")
    if native[:3] != hooked[:3]:
        print("  (the books differ even before the change)")
sys.exit(1 if bad else 0)
