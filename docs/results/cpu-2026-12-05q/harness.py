"""Hook sweep harness: each case built fresh per run (seed 0), trained plainly, under
torch.utils.checkpoint(use_reentrant=False) (reference) and under the six zoo variants;
gradients/buffers/loss/extras compared bitwise with plain, hook counts compared with
plain, report peaks checked flat."""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import signal
import sys
from pathlib import Path
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from torch import nn

import offrecomp
from tests.helpers import ZOO_VARIANTS, _bits, check_variant_report, variant_runtime

H = 16
LOGS: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        LOGS.append(f"{record.levelname} {record.name}: {record.getMessage()[:300]}")


logging.getLogger("offrecomp").addHandler(_Collect(logging.WARNING))
logging.getLogger("offrecomp").propagate = False
logging.captureWarnings(True)
logging.getLogger("py.warnings").addHandler(_Collect(logging.WARNING))
logging.getLogger("py.warnings").propagate = False
warnings.simplefilter("always")


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _loss(x: torch.Tensor) -> torch.Tensor:
    w = torch.arange(x.numel(), dtype=x.dtype).sin().view_as(x)
    return x.square().mean() + (x * w).mean()


class Block(nn.Module):
    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc1 = nn.Linear(H, 2 * H)
        self.act = nn.GELU()
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(2 * H, H)

    def inner(self, h: torch.Tensor) -> torch.Tensor:  # cases override
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(self.ln(x)))
        h = self.inner(h)
        return x + self.fc2(self.drop(h))


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.stem = nn.Linear(H, H)
        self.blocks = nn.ModuleList(blocks)
        self.ckpt = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = cp.checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        return _loss(x)


@dataclass
class Case:
    model: nn.Module
    counts: collections.Counter = field(default_factory=collections.Counter)
    before: Callable[[int, nn.Module], None] | None = None  # before each step's forward
    after_backward: Callable[[int, nn.Module], dict[str, torch.Tensor]] | None = None  # extras to compare
    between: Callable[[int, nn.Module, Any], Any] | None = None  # after opt.step; may return a new optimizer
    after_create: Callable[[nn.Module], None] | None = None  # after the runtime is made, before entering
    batch: Callable[[int], torch.Tensor] = lambda s: torch.randn(4, 6, H, generator=_gen(s))
    lists: Callable[[], dict[str, int]] | None = None  # lengths of user lists (leak check)
    cleanup: Callable[[], None] | None = None
    mid: Callable[[int, nn.Module], None] | None = None  # after forward, before backward


def seed(s: int) -> None:
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)


def train(case: Case, ctx: Any = None, steps: int = 4) -> tuple[list[dict], list[dict]]:
    model = case.model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    snaps, counts = [], []
    try:
        return _train(case, ctx, steps, model, opt, snaps, counts)
    finally:
        if case.cleanup:
            case.cleanup()


def _train(case, ctx, steps, model, opt, snaps, counts):
    with ctx if ctx is not None else contextlib.nullcontext():
        for step in range(steps):
            seed(10 * step)
            if case.before:
                case.before(step, model)
            loss = model(case.batch(10 * step))
            if case.mid:
                case.mid(step, model)
            loss.backward()
            snap = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            snap.update({f"buf.{n}": b.detach().clone() for n, b in model.named_buffers()})
            snap["loss"] = loss.detach().clone()
            if case.after_backward:
                snap.update(case.after_backward(step, model))
            c = dict(case.counts)
            if case.lists:
                c.update({f"len.{k}": v for k, v in case.lists().items()})
            counts.append(c)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if case.between:
                new = case.between(step, model, opt)
                if new is not None:
                    opt = new
            snap.update({f"param.{n}": p.detach().clone() for n, p in model.named_parameters()})
            snaps.append(snap)
    return snaps, counts


def compare(ref: list[dict], got: list[dict]) -> list[str]:
    bad = []
    for step, (a, b) in enumerate(zip(ref, got)):
        if a.keys() != b.keys():
            bad.append(f"step {step}: keys differ {sorted(a.keys() ^ b.keys())[:6]}")
            continue
        for k in a:
            x, y = a[k], b[k]
            if x is None or y is None:
                if (x is None) != (y is None):
                    bad.append(f"step {step}: {k} None vs {type(y).__name__}")
                continue
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(_bits(x), _bits(y)):
                d = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else float("nan")
                bad.append(f"step {step}: {k} ({d:.3g})")
    return bad


class Timeout(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise Timeout("hang: > 180 s")


signal.signal(signal.SIGALRM, _alarm)


def run_one(name: str, factory: Callable[[], Case], variant: str, ref, ref_counts, budget) -> tuple[str, str]:
    seed(0)
    case = factory()
    LOGS.clear()
    signal.alarm(180)
    try:
        if variant == "ckpt":
            case.model.ckpt = True
            got, counts = train(case)
            rt = None
        else:
            rt = variant_runtime(case.model, variant, budget)
            if case.after_create:
                case.after_create(case.model)
            got, counts = train(case, rt)
    except Exception as e:
        signal.alarm(0)
        tb = traceback.format_exc()
        return "ERROR", f"{type(e).__name__}: {str(e)[:300]}\n" + "\n".join(tb.splitlines()[-8:])
    finally:
        signal.alarm(0)
    notes = []
    bad = compare(ref, got)
    if bad:
        notes.append("NOT BITWISE: " + "; ".join(bad[:5]) + (f" (+{len(bad) - 5})" if len(bad) > 5 else ""))
    cdiff = []
    for step, (a, b) in enumerate(zip(ref_counts, counts)):
        for k in sorted(set(a) | set(b)):
            if a.get(k, 0) != b.get(k, 0):
                cdiff.append(f"s{step}:{k} {a.get(k, 0)}->{b.get(k, 0)}")
    if cdiff:
        notes.append("COUNTS: " + ", ".join(cdiff[-6:]))
    if rt is not None:
        recs = rt.report().steps
        try:
            check_variant_report(recs, variant, n_steps=len(ref))
        except AssertionError as e:
            notes.append(f"REPORT: {str(e)[:200]} phases={[s.phase for s in recs]}")
        if variant in ("keep", "recompute", "offload"):
            peaks = [(s.peak_activation_bytes, s.kept_bytes) for s in recs[1:]]
        else:
            peaks = [(s.peak_activation_bytes, s.kept_bytes) for s in recs[-2:]]
        if len(set(peaks)) > 1:
            notes.append(f"PEAKS VARY: {[(s.peak_activation_bytes, s.kept_bytes) for s in recs]}")
        with contextlib.suppress(Exception):
            rt.close()
    logs = sorted(set(LOGS))
    detail = "; ".join(notes)
    if logs:
        detail += ("\n" if detail else "") + "\n".join("    LOG " + l for l in logs)
    return ("FAIL" if notes else "PASS"), detail


def main(cases: dict[str, Callable[[], Case]]) -> None:
    argv = [a for a in sys.argv[1:]]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ["ckpt", *ZOO_VARIANTS]
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, factory in cases.items():
        if only and name not in only:
            continue
        seed(0)
        c = factory()
        try:
            ref, ref_counts = train(c)
            seed(0)
            c2 = factory()
            ref2, _ = train(c2)
            det = "" if not compare(ref, ref2) else " (PLAIN NONDETERMINISTIC)"
        except Exception as e:
            print(f"PLAINERR {name}: {type(e).__name__}: {e}", flush=True)
            continue
        # tight budget: half keep's step-0 peak, on a fresh build
        seed(0)
        probe = factory()
        LOGS.clear()
        try:
            krt = variant_runtime(probe.model, "keep")
            if probe.after_create:
                probe.after_create(probe.model)
            train(probe, krt, steps=1)
            budget = max(1, krt.report().steps[0].peak_activation_bytes // 2)
        except Exception as e:
            budget = None
            print(f"PROBEERR {name}: {type(e).__name__}: {e}")
        print(f"== {name}{det} plain counts(last step)={ref_counts[-1]}", flush=True)
        for v in variants:
            t0 = time.time()
            status, detail = run_one(name, factory, v, ref, ref_counts, budget)
            tally[v][status] += 1
            print(f"{status:5s} {name:24s} {v:10s} {time.time() - t0:5.1f}s {detail}", flush=True)
    print("TALLY " + "  ".join(f"{v}: {dict(c)}" for v, c in tally.items()))
