"""Random training loops (tests/random_loops.py) over random models
(tests/random_models.py) under every zoo variant, compared bitwise with the same loop run
plainly.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-06o/loop_sweep.py FIRST LAST [VARIANT,...] [-v] [--zoo]

Seeds FIRST to LAST - 1 (the model's and the loop's), 5 steps each, on the CPU; prints
PASS/FAIL per seed and variant (a failure with the loop and the model's layout), SKIP
for a seed whose loop fails plainly too, and the count of failures, and returns 1 when
any failed. ``--zoo``: seed N runs its loop on the model zoo's case N modulo their
count (tests/offrecomp/test_model_zoo.py's CASES: MoE, tied weights, dicts and named
tuples, RoPE in complex numbers, GRU and LSTM, packed sequences, an encoder-decoder,
module hooks, parametrizations, ...) instead of a random model, a micro-batch of fewer
rows than the case's batch taking its first rows.
"""

from __future__ import annotations

import copy
import logging
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from torch import nn

from tests.helpers import ZOO_VARIANTS, assert_bitwise, tight_budget, variant_runtime
from tests.random_loops import describe_loop, random_loop, run_loop
from tests.random_models import TOKENS, WIDTH, describe, random_batch, random_model


def batch(n: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, TOKENS, WIDTH, generator=torch.Generator().manual_seed(1000 + n))


class Unfit(Exception):
    """The loop fails plainly on this model (a gradient penalty through an op without a
    double backward): nothing to compare."""


def rows_of(x: Any, rows: int) -> Any:
    """The first ``rows`` rows of each tensor of a batch."""
    if isinstance(x, torch.Tensor):
        return x[:rows] if x.dim() else x
    if isinstance(x, dict):
        return {k: rows_of(v, rows) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(rows_of(v, rows) for v in x)
    return x


def setup(seed: int, zoo: bool) -> tuple[nn.Module, Callable[[int, int], Any], Callable[[int], Any], dict[str, Any], str]:
    """The model, its loop's batch, its batch for a tight budget, runtime options and a
    description."""
    if not zoo:
        model = random_model(seed).train()
        return model, batch, random_batch, {}, describe(model)
    from tests.offrecomp.test_model_zoo import CASES

    name = sorted(CASES)[seed % len(CASES)]
    case = CASES[name]
    torch.manual_seed(seed)
    kw = {"regions": case.regions} if case.regions is not None else {}
    return case.factory().train(), lambda n, rows: rows_of(case.batch(n), rows), case.batch, kw, name


def check(seed: int, variant: str, zoo: bool) -> None:
    model, loop_batch, one_batch, kw, _ = setup(seed, zoo)
    loop = random_loop(seed, rows=2 if zoo else 3)
    try:
        ref = run_loop(copy.deepcopy(model), loop_batch, loop)
    except RuntimeError as e:
        raise Unfit(str(e)[:120]) from e
    budget = tight_budget(model, one_batch, **kw) if variant in ("auto_tight", "auto_serve") else None
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, budget, **kw)
    assert_bitwise(ref, run_loop(m, loop_batch, loop, rt))


def main() -> int:
    argv = [a for a in sys.argv[1:] if a not in ("-v", "--zoo")]
    zoo = "--zoo" in sys.argv
    first, last = int(argv[0]), int(argv[1])
    variants = argv[2].split(",") if len(argv) > 2 else ZOO_VARIANTS
    logging.disable(logging.WARNING)  # budget and stale-recording notices
    failed = ran = skipped = 0
    for seed in range(first, last):
        for v in variants:
            t0 = time.time()
            try:
                check(seed, v, zoo)
                print(f"PASS {seed:4d} {v:11s} {time.time() - t0:4.1f}s", flush=True)
            except Unfit as e:
                skipped += 1
                print(f"SKIP {seed:4d} {v:11s} plainly: {e}", flush=True)
                break
            except Exception as e:
                failed += 1
                print(
                    f"FAIL {seed:4d} {v:11s} {type(e).__name__}: {str(e)[:300]} || "
                    f"{describe_loop(random_loop(seed, rows=2 if zoo else 3))} || {setup(seed, zoo)[4]}",
                    flush=True,
                )
                if "-v" in sys.argv:
                    traceback.print_exc()
    ran = (last - first - skipped) * len(variants)
    print(f"{failed} failed of {ran} ({skipped} seeds skipped)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
