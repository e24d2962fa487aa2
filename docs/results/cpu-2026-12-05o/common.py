"""Shared loop for the sweeps of this folder: like docs/results/cpu-2026-12-05/sweep.py run(), plus
the memory books of the last step, a flag when a tight-budget planned step books above its
budget, and offrecomp WARNING records printed."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
import time
import traceback
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05b"))

import torch
from torch import nn

from tests.helpers import ZOO_VARIANTS, check_variant, deterministic_plain


class _Print(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        print(f"LOG  {record.name}: {record.getMessage()[:400]}", flush=True)


logging.getLogger("offrecomp").addHandler(_Print(logging.WARNING))


def gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def run(models: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any]]],
        skip: Callable[[str, str], bool] = lambda n, v: False,
        varying: frozenset[str] = frozenset()) -> int:
    argv = [a for a in sys.argv[1:] if not a.startswith("-")]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ZOO_VARIANTS
    failed = 0
    for name, entry in models.items():
        factory, batch = entry[0], entry[1]
        kw = entry[2] if len(entry) > 2 else {}
        if only and name not in only:
            continue
        if "--det" in sys.argv:
            torch.manual_seed(0)
            m = factory().train()
            t0 = time.time()
            ok = deterministic_plain(m, batch, 4) is not None
            print(f"PLAIN-DET {name:16s} {'deterministic' if ok else 'NONDETERMINISTIC'} {time.time() - t0:5.1f}s", flush=True)
            continue
        for v in variants:
            if skip(name, v):
                continue
            t0 = time.time()
            try:
                torch.manual_seed(0)
                model = factory().train()
                rt, _ = check_variant(model, batch, v, steps=4, stable=name not in varying, **kw)
                st = rt.report().steps
                last = st[-1]
                info = (f"peak={last.peak_activation_bytes} kept={last.kept_bytes} rec={last.recomputed_bytes} "
                        f"off={last.offloaded_bytes} in={last.input_bytes} budget={last.budget_bytes} "
                        f"pred_peak={last.predicted_peak_bytes} phases={[getattr(s.phase, 'value', s.phase) for s in st]} regions={len(rt.regions)}")
                flag = ""
                if last.budget_bytes and last.phase in ("planned", "borrowed") and last.peak_activation_bytes > last.budget_bytes:
                    flag = " MEMFLAG(peak>budget)"
                if last.predicted_peak_bytes is not None and last.peak_activation_bytes > 1.05 * last.predicted_peak_bytes + 4096:
                    flag += " MEMFLAG(peak>predicted)"
                print(f"PASS {name:16s} {v:12s} {time.time() - t0:5.1f}s  {info}{flag}", flush=True)
            except Exception as e:
                failed += 1
                print(f"FAIL {name:16s} {v:12s} {type(e).__name__}: {str(e)[:600]}", flush=True)
                if "-v" in sys.argv:
                    traceback.print_exc(file=sys.stdout)
    return 1 if failed else 0
