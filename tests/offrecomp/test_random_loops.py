"""Random training loops (tests/random_loops.py) over random models: the loop zoo's
features drawn together, bitwise equal to the same loop run plainly."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers import assert_bitwise, recalibrated, tight_budget, variant_runtime
from tests.random_loops import ENDS, describe_loop, random_loop, run_loop
from tests.random_models import TOKENS, WIDTH, describe, random_batch, random_model


def _batch(n: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, TOKENS, WIDTH, generator=torch.Generator().manual_seed(1000 + n))


@pytest.mark.parametrize("seed", [11, 16, 32])  # LBFGS, AdamW, SGD; entered once, per step, by rt.step(); EMA, reloads, rebinds
@pytest.mark.parametrize("variant", ["recompute", "offload", "auto_serve"])
def test_random_loops_train_bitwise(seed: int, variant: str) -> None:
    model = random_model(seed).train()
    loop = random_loop(seed)
    ref = run_loop(copy.deepcopy(model), _batch, loop)
    budget = tight_budget(model, random_batch) if variant == "auto_serve" else None
    rt = variant_runtime(model, variant, budget)
    try:
        assert_bitwise(ref, run_loop(model, _batch, loop, rt))
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {describe_loop(loop)} || {describe(model)}") from exc
    steps = rt.report().steps
    if variant == "recompute":
        assert any(s.replays and s.recomputed_bytes for s in steps), [(s.replays, s.recomputed_bytes) for s in steps]
    elif variant == "offload":
        assert any(s.offloaded_bytes for s in steps), [s.offloaded_bytes for s in steps]
    elif seed != 16 and not recalibrated(steps):  # seed 16's loop never runs a plan (it measures and calibrates only)
        planned = [s for s in steps if s.phase in ("planned", "borrowed")]
        assert any(s.recomputed_bytes > 0 for s in planned), [(s.phase, s.recomputed_bytes) for s in steps]


def test_random_loops_cover_the_features() -> None:
    """The seeds the sweep runs (docs/results) draw every feature."""
    seen: set[str] = set()
    for seed in range(60):
        loop = random_loop(seed)
        seen |= {loop.optimizer, f"enter={loop.enter}", f"clip={loop.clip}", f"to_none={loop.to_none}"}
        for step in loop.steps:
            seen |= {k for k in ("eval_mode", "restore", "ema") if getattr(step, k)}
            seen |= {k for k in ("flip", "rebind") if getattr(step, k) is not None}
            for m in step.micros:
                seen |= {m.end, f"before={m.before}", f"boom={m.boom}", f"autocast={m.autocast}"}
    want = {"sgd", "adamw", "lbfgs", "enter=once", "enter=per_step", "enter=step_ctx", "clip=True",
            "to_none=False", "eval_mode", "restore", "ema", "flip", "rebind", "before=no_grad",
            "before=inference", "before=eval_no_grad", "boom=forward", "boom=backward", "autocast=True", *ENDS}
    assert want <= seen, sorted(want - seen)
