"""Shared harness for the "model changes while the runtime is entered" sweep.

A case is a ``Case`` object: a model factory, a batch, and hooks called at fixed points of
a hand-written loop (``before`` a step, ``micro`` before each micro-batch forward,
``between`` a forward and its backward, ``after_backward`` after each micro-batch
backward). ``run_loop`` runs the loop plainly (rt=None) or under a runtime, from a deep
copy of one model, with identical seeds, and snapshots after every step: every gradient
(None marked), every parameter and buffer (before the optimizer step), the loss, the
input's gradient; the final parameters too. ``compare`` checks them bitwise;
``check_books`` checks the runtime's step records.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

import torch
import torch.nn.functional as F
from torch import nn

import offrecomp  # noqa: E402
from tests.helpers import variant_runtime, _bits  # noqa: E402

D = 32
V = 50
VARIANTS = ["keep", "recompute", "offload", "auto", "auto_tight", "auto_serve"]


# ----------------------------------------------------------------------------- models
class Block(nn.Module):
    def __init__(self, d: int = D, p: float = 0.1) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(2 * d, d)
        self.gate = False  # a plain flag: one more op when True
        self.act_name = ""  # a plain string: "silu" swaps the activation functionally

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = self.ln.weight.dtype  # a block cast to another dtype runs in its own
        y = x.to(dt)
        h = self.fc1(self.ln(y))
        h = F.silu(h) if self.act_name == "silu" else self.act(h)
        if self.gate:
            h = h * torch.sigmoid(h)
        out = y + self.fc2(self.drop(h))
        return out.to(x.dtype)


class Net(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(D, D)
        self.blocks = nn.ModuleList([Block() for _ in range(n)])
        self.head = nn.Linear(D, D)
        self.layerdrop = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if self.layerdrop and self.training:
            skip = (torch.rand(len(self.blocks)) < self.layerdrop).tolist()
        else:
            skip = [False] * len(self.blocks)
        for b, s in zip(self.blocks, skip):
            if not s:
                h = b(h)
        out = self.head(h).square().mean()
        if "heads" in self._modules:
            for hd in self.heads.values():
                out = out + hd(h).square().mean()
        return out


class TokNet(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([Block() for _ in range(n)])
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, xy: torch.Tensor) -> torch.Tensor:
        x, y = xy[0], xy[1]
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


class ConvBlock(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.relu(self.bn1(self.conv1(x))))


class ConvNet(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList([ConvBlock() for _ in range(n)])
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h.mean((2, 3))).square().mean()


def float_batch(step: int, micro: int, ctx: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + 10 * step + micro)
    return torch.randn(4, 8, D, generator=g)


def tok_batch(step: int, micro: int, ctx: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + 10 * step + micro)
    return torch.randint(0, V, (2, 4, 8), generator=g)


def img_batch(step: int, micro: int, ctx: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + 10 * step + micro)
    return torch.randn(4, 3, 8, 8, generator=g)


# ----------------------------------------------------------------------------- cases
def _nop(*a: Any) -> None:
    return None


@dataclass
class Case:
    name: str
    doc: str
    build: Callable[[], nn.Module] = Net
    batch: Callable[[int, int, Any], Any] = float_batch
    steps: int = 10
    before: Callable[[nn.Module, int, Any], None] = _nop
    micro: Callable[[nn.Module, int, int, Any], None] = _nop
    between: Callable[[nn.Module, int, int, Any], None] = _nop
    after_backward: Callable[[nn.Module, int, int, Any], None] = _nop
    forward: Callable[[nn.Module, Any, int, int, Any], torch.Tensor] | None = None
    make_opt: Callable[[nn.Module], torch.optim.Optimizer] = lambda m: torch.optim.SGD(m.parameters(), lr=0.05)
    regions_gone: bool = False  # the change leaves (some) steps without managed regions: skip "every step replays"
    opt_steps: bool = True


def new_ctx(case: Case, model: nn.Module) -> SimpleNamespace:
    return SimpleNamespace(opt=case.make_opt(model), accum=1, set_to_none=True, dtype=None,
                           memfmt=None, input_grad=False, store={}, case=case)


def run_loop(case: Case, model: nn.Module, rt: Any, steps: int | None = None) -> list[dict[str, Any]]:
    ctx = new_ctx(case, model)
    out: list[dict[str, Any]] = []
    n = case.steps if steps is None else steps
    with rt if rt is not None else contextlib.nullcontext():
        for step in range(n):
            case.before(model, step, ctx)
            xs_grad = []
            for mi in range(ctx.accum):
                case.micro(model, step, mi, ctx)
                torch.manual_seed(10 * step + mi)
                x = case.batch(step, mi, ctx)
                if ctx.dtype is not None and x.is_floating_point():
                    x = x.to(ctx.dtype)
                if ctx.memfmt is not None:
                    x = x.contiguous(memory_format=ctx.memfmt)
                if ctx.input_grad:
                    x.requires_grad_(True)
                    xs_grad.append(x)
                loss = case.forward(model, x, step, mi, ctx) if case.forward else model(x)
                case.between(model, step, mi, ctx)
                (loss / ctx.accum if ctx.accum > 1 else loss).backward()
                case.after_backward(model, step, mi, ctx)
            snap: dict[str, Any] = {}
            for nme, p in model.named_parameters():
                snap[f"grad.{nme}"] = None if p.grad is None else p.grad.detach().clone()
                snap[f"param.{nme}"] = p.detach().clone()
            for nme, b in model.named_buffers():
                snap[f"buf.{nme}"] = b.detach().clone()
            snap["loss"] = loss.detach().clone()
            for i, x in enumerate(xs_grad):
                snap[f"xgrad{i}"] = None if x.grad is None else x.grad.clone()
            out.append(snap)
            loss = x = None  # hold no graph past the step (a .data change of shape needs it)
            xs_grad = []
            if case.opt_steps:
                ctx.opt.step()
            ctx.opt.zero_grad(set_to_none=ctx.set_to_none)
        final = {f"final.{k}": v.detach().clone() for k, v in model.state_dict().items()}
        out.append(final)
    return out


def compare(ref: list[dict[str, Any]], got: list[dict[str, Any]]) -> str | None:
    """None when bitwise equal, else the first differing step and entries."""
    if len(ref) != len(got):
        return f"{len(ref)} snapshots vs {len(got)}"
    for step, (a, b) in enumerate(zip(ref, got)):
        if a.keys() != b.keys():
            return f"step {step}: keys differ {sorted(a.keys() ^ b.keys())[:6]}"
        bad = []
        for k in a:
            x, y = a[k], b[k]
            if x is None or y is None:
                if (x is None) != (y is None):
                    bad.append(f"{k} (None vs tensor: {x is None}/{y is None})")
                continue
            if x.dtype != y.dtype or x.shape != y.shape:
                bad.append(f"{k} ({x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)})")
            elif not torch.equal(_bits(x), _bits(y)):
                d = (x.double() - y.double()).abs().max().item()
                bad.append(f"{k} (max abs diff {d:.3g})")
        if bad:
            return f"step {step}: " + ", ".join(bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
    return None


class LogCatch(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.msgs: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.msgs.append(record.getMessage())


def tight_budget(case: Case, model: nn.Module) -> int:
    probe = copy.deepcopy(model)
    rt = variant_runtime(probe, "keep")
    run_loop(case, probe, rt, steps=2)
    return max(1, rt.report().steps[0].peak_activation_bytes // 2)


def check_books(case: Case, variant: str, rt: Any, budget: int | None, msgs: list[str]) -> list[str]:
    recs = rt.report().steps
    probs = []
    if len(recs) != case.steps:
        probs.append(f"{len(recs)} records for {case.steps} steps")
    if variant == "recompute" and not case.regions_gone:
        no = [r.step for r in recs if r.replays == 0 or r.recomputed_bytes == 0]
        if no:
            probs.append(f"recompute: no replays at steps {no}")
    if variant == "offload" and not case.regions_gone:
        no = [r.step for r in recs if r.offloaded_bytes == 0]
        if no:
            probs.append(f"offload: nothing offloaded at steps {no}")
    if variant in ("auto_tight", "auto_serve") and budget:
        warned = any("budget" in m.lower() or "infeasible" in m.lower() for m in msgs)
        over = [(r.step, r.phase, round(r.peak_activation_bytes / budget, 2)) for r in recs
                if r.phase in ("planned", "borrowed") and r.peak_activation_bytes > 1.05 * budget]
        if over:
            probs.append(f"planned steps over budget {budget}B (step, phase, x budget): {over}"
                         + (" [warned]" if warned else " [SILENT]"))
    return probs


def phases(rt: Any) -> str:
    return " ".join(f"{r.phase[:4]}:{r.peak_activation_bytes}" + (f"/r{r.replays}" if r.replays else "")
                    for r in rt.report().steps)


def run_case(case: Case, variants: list[str], out: Any, verbose: bool = True) -> dict[str, str]:
    """Returns variant -> PASS / FAIL-GRAD / FAIL-ERR / FAIL-BOOKS / PLAIN-NONDET."""
    res: dict[str, str] = {}
    if case.doc:
        print(f"NOTE       {case.name:28s} {case.doc}", file=out, flush=True)
    torch.manual_seed(0)
    model = case.build().train()
    try:
        ref = run_loop(case, copy.deepcopy(model), None)
        ref2 = run_loop(case, copy.deepcopy(model), None)
    except Exception as e:  # the plain loop itself fails: case bug
        print(f"PLAIN-ERROR {case.name}: {type(e).__name__}: {e}", file=out, flush=True)
        traceback.print_exc(file=out)
        return {v: "PLAIN-ERROR" for v in variants}
    if compare(ref, ref2) is not None:
        print(f"PLAIN-NONDET {case.name}: {compare(ref, ref2)}", file=out, flush=True)
        return {v: "PLAIN-NONDET" for v in variants}
    budget = None
    for v in variants:
        t0 = time.time()
        if v in ("auto_tight", "auto_serve") and budget is None:
            budget = tight_budget(case, model)
        m = copy.deepcopy(model)
        catch = LogCatch()
        lg = logging.getLogger("offrecomp")
        lg.addHandler(catch)
        rt = None
        status, detail, probs = "PASS", "", []
        try:
            with warnings.catch_warnings(record=True) as wl:
                warnings.simplefilter("always")
                rt = variant_runtime(m, v, budget if v.startswith("auto_") else None)
                got = run_loop(case, m, rt)
            msgs = catch.msgs + [str(w.message) for w in wl]
            diff = compare(ref, got)
            if diff:
                status, detail = "FAIL-GRAD", diff
            else:
                probs = check_books(case, v, rt, budget, msgs)
                if probs:
                    status, detail = "FAIL-BOOKS", "; ".join(probs)
        except Exception as e:
            msgs = catch.msgs
            status, detail = "FAIL-ERR", f"{type(e).__name__}: {str(e)[:400]}"
            if verbose:
                detail += "\n" + "".join(traceback.format_exc().splitlines(True)[-8:])
        finally:
            lg.removeHandler(catch)
        res[v] = status
        print(f"{status:10s} {case.name:28s} {v:11s} {time.time() - t0:5.1f}s {detail}", file=out, flush=True)
        if verbose:
            if rt is not None and rt.report().steps:
                print(f"    books: {phases(rt)}" + (f"  budget={budget}" if v.startswith('auto_') else ""), file=out)
            uniq = list(dict.fromkeys(m_[:220] for m_ in msgs))
            for m_ in uniq[:6]:
                print(f"    warn: {m_}", file=out)
            out.flush()
    return res
