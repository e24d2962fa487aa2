"""Under mode="keep", the step records of the second and later steps (native keep, NOTE
[Native keep] in offrecomp/native.py) count the saves of region calls whose graph the
forward dropped right away (a DEQ solver iterating with grad on and ``.detach()``ing each
iterate) as held until the end of the pass; the first step, which runs with the hooks,
and every step with ``native_keep=False`` count them freed. Identical steps book 4.3x
more from step 1 on. The same calls make auto's books: under ``budget=120KiB`` the
planner calls the budget infeasible ("smallest feasible 136 KiB", the measuring pass's
books) and ``infeasible="error"`` raises, while keep itself holds 48 KiB (the dropped
iterates are freed for real: weak references to them die in the forward, in every mode).

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05j/repro_native_keep_books_dropped_graphs.py

torch + offrecomp only. Gradients stay bitwise; only the books (peak_activation_bytes)
are off.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from torch import nn

import offrecomp


class Block(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(z) + u)


class DEQ(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.enc = nn.Linear(d, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(2))

    def f(self, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            z = layer(z, u)
        return 0.5 * z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.enc(x)
        z = torch.zeros_like(u)
        for _ in range(12):  # solver with grad on: each iterate's graph is dropped at once
            z = self.f(z, u).detach()
        return self.f(z, u).pow(2).mean()


def peaks(**kw: object) -> list[int]:
    torch.manual_seed(0)
    m = DEQ()
    rt = offrecomp.runtime(m, mode="keep", min_bytes=0, **kw)
    with rt:
        for s in range(4):
            m(torch.randn(32, 64, generator=torch.Generator().manual_seed(s))).backward()
            m.zero_grad()
    return [s.peak_activation_bytes for s in rt.report().steps]


native = peaks()
hooks = peaks(native_keep=False)
print("keep, native keep (default):", native)
print("keep, native_keep=False    :", hooks)
try:
    torch.manual_seed(0)
    m = DEQ()
    with offrecomp.runtime(m, mode="auto", min_bytes=0, budget=120 * 1024, infeasible="error"):
        for s in range(4):
            m(torch.randn(32, 64, generator=torch.Generator().manual_seed(s))).backward()
            m.zero_grad()
    print("auto, budget 120 KiB, infeasible='error': ran")
except Exception as e:
    print(f"auto, budget 120 KiB, infeasible='error': {type(e).__name__}: {e}")
assert native == hooks, "BUG: identical steps book other peaks under native keep"
