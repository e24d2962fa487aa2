"""offrecomp's planner counts what a region's forward saved as held until backward, even
when a backward inside that forward (a Langevin or force step: ``autograd.grad`` without
``retain_graph`` on a detached copy of the input) has already freed it. Under
``budget=160KiB`` the plan says the budget "cannot be met; the smallest feasible budget
is 352.00 KiB" (above keep's own 192 KiB) while every planned step books 128 KiB, and
``infeasible="error"`` raises ``InfeasibleBudgetError``.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05j/repro_inner_backward_peak.py

torch + offrecomp only. Gradients stay bitwise; only the memory model is off.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from torch import nn

import offrecomp


class LangevinBlock(nn.Module):
    """A Langevin step on an energy of its own (its graph freed inside the forward), then
    an MLP whose activations stay for the pass's backward."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.energy = nn.Sequential(nn.Linear(d, 4 * d), nn.Tanh(), nn.Linear(4 * d, 1))
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xd = x.detach().requires_grad_(True)
        g = torch.autograd.grad(self.energy(xd).sum(), xd)[0]  # frees the energy's saves
        return x + self.mlp(x - 0.1 * g)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(LangevinBlock() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.pow(2).mean()


def steps(model: nn.Module, rt: offrecomp.Runtime, n: int = 4) -> list:
    with rt:
        for s in range(n):
            torch.manual_seed(s)
            model(torch.randn(64, 64, generator=torch.Generator().manual_seed(s))).backward()
            model.zero_grad()
    return rt.report().steps


torch.manual_seed(0)
base = Model()


def run(mode: str, n: int = 4, **kw: object) -> list:
    m = copy.deepcopy(base)
    return steps(m, offrecomp.runtime(m, mode=mode, min_bytes=0, **kw), n=n)


keep = run("keep", native_keep=False)
rec = run("recompute")
budget = 160 * 1024  # under keep's peak, over what recompute holds
m = copy.deepcopy(base)
rt = offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0)
auto = steps(m, rt, n=5)
print("keep peak (hooks on)  :", keep[-1].peak_activation_bytes)
print("recompute peak        :", rec[-1].peak_activation_bytes)
print("budget                :", budget)
print("auto phases and peaks :", [(s.phase.value, s.peak_activation_bytes) for s in auto])
print("\n".join(rt.explain().splitlines()[:3]))
try:
    run("auto", n=5, budget=budget, infeasible="error")
    print("infeasible='error': ran")
except Exception as e:
    print(f"infeasible='error': {type(e).__name__}: {e}")
assert auto[-1].peak_activation_bytes <= budget < keep[-1].peak_activation_bytes
assert "cannot be met" not in rt.explain(), "BUG: a budget every planned step meets called infeasible"
