"""Regions whose saves change with the data: what auto holds against recompute and keep.

    python docs/results/cpu-2026-12-04d/variable_regions.py

The models are the tests' (``tests/offrecomp/test_budgets.py``).

1. Six routed blocks (each runs its MLP on the rows its gate picks: a mixture of
   experts' routing, sizes that change every step), 4096 x 64 tokens: the activation
   peak of the last planned steps, its prediction, and the step time over plain
   (medians of the last 6 of 14 steps, the variants interleaved), gradients
   compared bitwise with plain (accumulated over the steps).
2. Three blocks routing 8 of 64 rows, but 32 every fourth step (a periodic routing the
   measuring pass misses), under a 100 KB budget, hooks on (``native_keep=False``): the
   steps routing 32 rows, held against predicted.
"""

from __future__ import annotations

import copy
import logging
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import offrecomp  # noqa: E402
from tests.models import Stack  # noqa: E402
from tests.offrecomp.test_budgets import _RoutedBlock, _RowsBlock  # noqa: E402

logging.basicConfig(level=logging.ERROR)


def run(model: nn.Module, batch, steps: int, **kw):  # type: ignore[no-untyped-def]
    """``steps`` steps of ``model`` (inside a runtime made with ``kw``, if any)."""
    rt = offrecomp.runtime(model, min_bytes=0, **kw)
    with rt:
        for s in range(steps):
            model(batch(s)).backward()
    return rt


def routed() -> None:
    """The variants interleaved, a step of each in turn, so that the machine's drift
    reaches them alike."""
    torch.manual_seed(0)
    base = Stack([_RoutedBlock(64) for _ in range(6)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4096, 64, generator=torch.Generator().manual_seed(s))

    variants = {
        "plain": {},
        "keep": dict(mode="keep"),
        "recompute": dict(mode="recompute"),
        "auto 12 MB": dict(budget=12_000_000),
        "auto 20 MB": dict(budget=20_000_000),
    }
    models = {k: copy.deepcopy(base) for k in variants}
    rts = {k: offrecomp.runtime(models[k], min_bytes=0, **kw) if kw else None for k, kw in variants.items()}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for s in range(14):
        x = batch(s)
        for k, m in models.items():
            rt = rts[k]
            t = time.perf_counter()
            if rt is None:
                m(x).backward()
            else:
                with rt:
                    m(x).backward()
            times[k].append(time.perf_counter() - t)
    plain = statistics.median(times["plain"][-6:])
    ref = [p.grad for p in models["plain"].parameters() if p.grad is not None]
    print("1. six routed blocks, 4096 x 64 tokens; plain %.1f ms per step (median of the last 6 of 14)" % (1e3 * plain))
    print(f"{'variant':14s} {'bitwise':8s} {'step/plain':>10s}  last 4 steps: held / predicted (bytes)")
    for k, rt in rts.items():
        if rt is None:
            continue
        g = [p.grad for p in models[k].parameters() if p.grad is not None]
        same = len(g) == len(ref) and all(torch.equal(a, b) for a, b in zip(g, ref))
        steps = rt.report().steps[-4:]
        held = ", ".join(f"{s.peak_activation_bytes} / {s.predicted_peak_bytes or '-'}" for s in steps)
        print(f"{k:14s} {str(same):8s} {statistics.median(times[k][-6:]) / plain:10.2f}  {held}")
        if k.startswith("auto"):
            print(f"{'':14s} phases {''.join(s.phase[0] for s in rt.report().steps)}")


def periodic() -> None:
    torch.manual_seed(0)
    base = Stack([_RowsBlock() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(s))
        x[:, 0] = -1.0
        x[: 32 if s % 4 == 3 else 8, 0] = 1.0
        return x

    rt = run(copy.deepcopy(base), batch, 40, budget=100_000, native_keep=False)
    print("2. three blocks routing 8 of 64 rows, 32 every fourth step; budget 100000 B")
    print("   phases " + "".join(s.phase[0] for s in rt.report().steps))
    for s in rt.report().steps:
        if s.step % 4 == 3:
            print(f"   step {s.step:2d} {s.phase:9s} held {s.peak_activation_bytes:6d} predicted {s.predicted_peak_bytes}")
    print("   variable regions:", [r.name for r in rt.planner.host.regions if r.variable])


if __name__ == "__main__":
    routed()
    periodic()
