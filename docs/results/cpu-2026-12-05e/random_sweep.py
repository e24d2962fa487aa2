"""Random models (tests/random_models.py) under every zoo variant, gradients compared
bitwise with plain training (tests/helpers.check_variant).

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05e/random_sweep.py FIRST LAST [VARIANT,...] [-v] [--autocast]

Seeds FIRST to LAST - 1, 4 steps each, on the CPU; prints PASS/FAIL per seed and
variant (a failure with the model's layout and block programs) and the count of
failures, and returns 1 when any failed. ``--autocast`` runs each model's forward
under bf16 autocast (its loss in float32).
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from torch import nn

from tests.helpers import ZOO_VARIANTS, check_variant
from tests.random_models import describe, random_batch, random_model, varies


class Autocast(nn.Module):
    """``model``'s forward under bf16 autocast on the CPU, its loss in float32."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(x).float()


def main() -> int:
    argv = [a for a in sys.argv[1:] if a not in ("-v", "--autocast")]
    autocast = "--autocast" in sys.argv
    first, last = int(argv[0]), int(argv[1])
    variants = argv[2].split(",") if len(argv) > 2 else ZOO_VARIANTS
    logging.disable(logging.WARNING)  # budget and stale-recording notices
    failed = 0
    for seed in range(first, last):
        for v in variants:
            model = random_model(seed).train()
            t0 = time.time()
            try:
                run = Autocast(model) if autocast else model
                check_variant(run, random_batch, v, steps=4, stable=not varies(model))
                print(f"PASS {seed:4d} {v:11s} {time.time() - t0:4.1f}s", flush=True)
            except Exception as e:
                failed += 1
                print(f"FAIL {seed:4d} {v:11s} {type(e).__name__}: {str(e)[:250]} || {describe(model)}", flush=True)
                if "-v" in sys.argv:
                    traceback.print_exc()
    print(f"{failed} failed of {(last - first) * len(variants)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
