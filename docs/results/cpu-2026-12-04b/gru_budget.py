"""A 2-cell GRU in a ModuleList, called at every time step: auto's planned steps against
their budget and prediction (NOTE [Inputs counted once], [Activations counted once]).

    python docs/results/cpu-2026-12-04b/gru_budget.py WIDTH STEPS fp|bf16 SHARE

Budget: SHARE of keep's booked peak; 6 steps under auto, the planned ones printed.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from torch import nn

import offrecomp

H, T, DTYPE, SHARE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])


class Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x = nn.Linear(H, 3 * H)
        self.h = nn.Linear(H, 3 * H)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        r, z, n = (self.x(x) + self.h(h)).chunk(3, -1)
        r, z = torch.sigmoid(r), torch.sigmoid(z)
        return (1 - z) * torch.tanh(n * r) + z * h


class GRU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, H)
        self.cells = nn.ModuleList([Cell(), Cell()])

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        hs = [torch.zeros(seq.shape[0], H) for _ in self.cells]
        e = self.inp(seq)
        for t in range(T):
            x = e[:, t]
            for i, cell in enumerate(self.cells):
                hs[i] = x = cell(x, hs[i])
        return x.float().pow(2).mean()


def autocast() -> contextlib.AbstractContextManager[None]:
    return torch.autocast("cpu", dtype=torch.bfloat16) if DTYPE == "bf16" else contextlib.nullcontext()


torch.manual_seed(0)
model = GRU()
x = torch.randn(8, T, 8)
with offrecomp.runtime(model, mode="keep", min_bytes=0) as rt:
    with autocast():
        loss = model(x)
    loss.backward()
keep = rt.report().steps[0].peak_activation_bytes
budget = int(keep * SHARE)
auto = offrecomp.runtime(model, mode="auto", budget=budget, min_bytes=0)
with auto:
    for _ in range(6):
        with autocast():
            loss = model(x)
        loss.backward()
planned = [s for s in auto.report().steps if s.phase == "planned"]
print(f"width {H}, {T} steps, {DTYPE}, budget {SHARE:.0%} of keep's {keep} B = {budget} B")
for s in planned:
    print(f"  planned: held {s.peak_activation_bytes} B ({s.peak_activation_bytes / budget:.2f} of the budget), "
          f"predicted {s.predicted_peak_bytes} B")
