"""Shared pieces of the thread/process/runtime sweep (not run on its own).

A tiny model (3 residual blocks in an nn.ModuleList, width 32, dropout), seeded
batches, a step split into ``fwd`` / ``finish`` so that forward and backward can run on
different threads, bitwise comparison (tests.helpers.assert_bitwise), report checks
(tests.helpers.check_variant_report) and a check that the process is clean after a
runtime left (no saved-tensor hook pair on this thread, no active runtime, backward entry
unpatched, no wrapped forwards).
"""

from __future__ import annotations

import copy
import os
import random
import sys
import threading
import time
import traceback
import faulthandler
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch
from torch import nn

import offrecomp
from offrecomp import _torch_compat as tc
from offrecomp import context as octx
from tests.helpers import (
    ZOO_VARIANTS,
    assert_bitwise,
    check_variant_report,
    tight_budget,
    train,
    variant_runtime,
)

torch.set_num_threads(1)

D = 32
IN = 16


class Block(nn.Module):
    def __init__(self, d: int = D, p: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x)))))


class Net(nn.Module):
    def __init__(self, d: int = D, n: int = 3, p: float = 0.1) -> None:
        super().__init__()
        self.inp = nn.Linear(IN, d)
        self.blocks = nn.ModuleList([Block(d, p) for _ in range(n)])
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h).pow(2).mean()


def make(seed: int = 0, p: float = 0.1, n: int = 3) -> Net:
    torch.manual_seed(seed)
    return Net(p=p, n=n).train()


def batch(s: int) -> torch.Tensor:
    return torch.randn(4, 8, IN, generator=torch.Generator().manual_seed(1000 + s))


def batch_b(s: int) -> torch.Tensor:  # another model's batches
    return torch.randn(4, 8, IN, generator=torch.Generator().manual_seed(5000 + s))


def seed_all(k: int) -> None:
    torch.manual_seed(k)
    random.seed(k)
    np.random.seed(k)


def fwd(model: nn.Module, step: int, b=batch):
    seed_all(10 * step)
    return model(b(10 * step))


def snap(model: nn.Module, loss: torch.Tensor) -> dict:
    s = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    s.update({f"buf.{n}": x.detach().clone() for n, x in model.named_buffers()})
    s["loss"] = loss.detach().clone()
    return s


def finish(model, opt, loss) -> dict:
    s = snap(model, loss)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return s


def plain(model: nn.Module, steps: int = 4, b=batch) -> list[dict]:
    """Plain reference on a deep copy (helpers.train's seeding)."""
    return train(copy.deepcopy(model), b, steps=steps)


def plain_det(model: nn.Module, steps: int = 4, b=batch) -> list[dict]:
    """Plain reference, checked deterministic by running it twice."""
    a = plain(model, steps, b)
    c = plain(model, steps, b)
    assert_bitwise(a, c)
    return a


def make_rt(model: nn.Module, variant: str, b=batch, **kw):
    budget = tight_budget(model, b) if variant in ("auto_tight", "auto_serve") else None
    return variant_runtime(model, variant, budget, **kw)


def books(rt, variant: str, n_steps: int, stable: bool = True) -> None:
    steps = rt.report().steps
    check_variant_report(steps, variant, n_steps=n_steps, stable=stable)
    for s in steps:
        assert s.peak_activation_bytes > 0, f"step {s.step}: peak {s.peak_activation_bytes}"
        assert s.saved_tensors > 0, f"step {s.step}: saved_tensors {s.saved_tensors}"


def clean(model: nn.Module | None = None) -> None:
    """Nothing of a runtime left on this thread/process."""
    assert tc.top_saved_tensors_hooks() is None, "a saved-tensor hook pair is left on this thread"
    assert octx._active is None, f"a runtime is still marked active: {octx._active!r}"
    assert not offrecomp.in_replay(), "in_replay() True outside any replay"
    from offrecomp import backward_entry

    assert not backward_entry._packs, f"backward entry still owns packs: {backward_entry._packs}"
    if model is not None:
        wrapped = [n for n, m in model.named_modules() if "forward" in m.__dict__]
        assert not wrapped, f"wrapped forwards left: {wrapped}"


def run_cases(cases, variants_for, argv=None) -> int:
    """cases: list of (name, fn(variant)); each fn raises on failure. Prints PASS/FAIL.
    argv: [NAME,NAME|all] [VARIANT,...]"""
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "-v"]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    vs = argv[1].split(",") if len(argv) > 1 else None
    failed = 0
    counts: dict[str, list[int]] = {}
    for name, fn in cases:
        if only and name not in only:
            continue
        for v in variants_for(name):
            if vs and v not in vs:
                continue
            t0 = time.time()
            faulthandler.dump_traceback_later(150, exit=True)  # a hang is a finding
            try:
                note = fn(v)
                dt = time.time() - t0
                print(f"PASS {name:34s} {v:11s} {dt:5.1f}s {note or ''}", flush=True)
                counts.setdefault(v, [0, 0])[0] += 1
            except Exception as e:
                failed += 1
                counts.setdefault(v, [0, 0])[1] += 1
                print(f"FAIL {name:34s} {v:11s} {type(e).__name__}: {str(e)[:400]}", flush=True)
                if "-v" in sys.argv:
                    traceback.print_exc()
                # leave the process clean for the next case
                if octx._active is not None:
                    try:
                        octx._active.__exit__(None, None, None)
                    except Exception:
                        pass
            finally:
                faulthandler.cancel_dump_traceback_later()
    print("counts (pass, fail) per variant:", {k: tuple(v) for k, v in counts.items()}, flush=True)
    return 1 if failed else 0
