"""The loop the sweeps of this folder share: each model under each zoo variant, gradients
compared bitwise with plain training (tests/helpers.check_variant).

Arguments of a sweep script: ``[NAME,NAME ...|all] [VARIANT,VARIANT ...] [-v]``; prints
PASS/FAIL per model and variant, and returns 1 when any failed."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from torch import nn

from tests.helpers import ZOO_VARIANTS, check_variant


def run(
    models: dict[str, Callable[[], nn.Module]],
    batch: Callable[[str, nn.Module], Callable[[int], Any]],
    skip: Callable[[str, str], bool] = lambda name, variant: False,
    varying: frozenset[str] = frozenset(),
) -> int:
    """Every model of ``models`` (name -> factory) under every variant the command line
    names, on the batches ``batch(name, model)`` gives; ``skip(name, variant)`` leaves a
    pair out; the models in ``varying`` change shapes from step to step (auto may still
    be measuring at the last step)."""
    argv = [a for a in sys.argv[1:] if a != "-v"]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ZOO_VARIANTS
    failed = 0
    for name, factory in models.items():
        if only and name not in only:
            continue
        for v in variants:
            if skip(name, v):
                continue
            t0 = time.time()
            try:
                torch.manual_seed(0)
                model = factory().train()
                check_variant(model, batch(name, model), v, steps=4, stable=name not in varying)
                print(f"PASS {name:16s} {v:12s} {time.time() - t0:5.1f}s", flush=True)
            except Exception as e:
                failed += 1
                print(f"FAIL {name:16s} {v:12s} {type(e).__name__}: {str(e)[:300]}", flush=True)
                if "-v" in sys.argv:
                    traceback.print_exc()
    return 1 if failed else 0


class BF16Autocast(nn.Module):
    """A model's forward (and its loss) under CPU bf16 autocast (the sweeps' ``--bf16``)."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, *a: Any, **k: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.m(*a, **k)
