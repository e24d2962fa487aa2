"""Planned steps against their prediction and budget, on the three models of this
result's README: a Transformer-XL memory the first step lacks, a DenseNet (every layer
takes every earlier feature map), and blocks whose routing changes every step.

    python docs/results/cpu-2026-12-04c/budget_fidelity.py

Prints, per model and budget (a share of keep's activation peak), each step's phase,
activations held (the runtime's books), the plan's prediction and the budget.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import offrecomp
from tests import models
from tests.offrecomp.test_budgets import _DenseNet, _MemoryBlock, _RoutedBlock


def _keep_peak(model: torch.nn.Module, batch: Callable[[int], torch.Tensor]) -> int:
    m = copy.deepcopy(model)
    with offrecomp.runtime(m, mode="keep", min_bytes=0) as rt:
        for s in range(2):
            m(batch(s)).backward()
    return rt.report().steps[-1].peak_activation_bytes


def run(name: str, make: Callable[[], torch.nn.Module], batch: Callable[[int], torch.Tensor], share: float, steps: int) -> None:
    model = make()
    budget = int(share * _keep_peak(model, batch))
    with offrecomp.runtime(model, budget=budget, min_bytes=0, drift=100.0) as rt:
        for s in range(steps):
            model(batch(s)).backward()
    print(f"{name} at {share:.0%} of keep's peak, budget {budget} B")
    for r in rt.report().steps:
        pred = "" if r.predicted_peak_bytes is None else f" predicted {r.predicted_peak_bytes}"
        print(f"  step {r.step} {r.phase.value:9s} held {r.peak_activation_bytes}{pred} ({r.peak_activation_bytes / budget:.2f}x budget)")


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)

    def memory() -> torch.nn.Module:
        torch.manual_seed(0)
        return models.Stack([_MemoryBlock() for _ in range(4)])

    def dense() -> torch.nn.Module:
        torch.manual_seed(0)
        return _DenseNet(n=10)

    def routed() -> torch.nn.Module:
        torch.manual_seed(0)
        return models.Stack([_RoutedBlock() for _ in range(3)])

    def tokens(s: int) -> torch.Tensor:
        return torch.randn(2, 32, 32, generator=torch.Generator().manual_seed(s))

    def images(s: int) -> torch.Tensor:
        return torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(s))

    def rows(s: int) -> torch.Tensor:
        return torch.randn(64, 32, generator=torch.Generator().manual_seed(s))

    run("memory (Transformer-XL)", memory, tokens, 0.7, 7)
    for share in (0.3, 0.5, 0.7):
        run("DenseNet, 10 layers", dense, images, share, 5)
    run("routed blocks", routed, rows, 0.5, 12)


if __name__ == "__main__":
    main()
