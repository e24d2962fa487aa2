"""Shared machinery of the autograd-API sweep (sweep_autograd.py): the tiny models, the
loop driver (plain twice, then under a runtime variant), the bitwise comparison and the
books check. Not run on its own."""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from offrecomp import _torch_compat as tc
from tests.helpers import _bits, _dense, variant_runtime

torch.set_num_threads(1)

VARIANTS = ["keep", "recompute", "offload", "auto", "auto_tight", "auto_serve"]


# ----------------------------------------------------------------------------- models


class Blk(nn.Module):
    """Pre-LN residual MLP with dropout."""

    def __init__(self, h: int = 32, p: float = 0.1) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 2 * h)
        self.fc2 = nn.Linear(2 * h, h)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln(x)))), self.p, self.training)


class Net(nn.Module):
    """inp -> blocks (the regions) -> head; returns the head's output (B, T, dout)."""

    def __init__(self, din: int = 16, h: int = 32, n: int = 3, p: float = 0.1, dout: int = 4,
                 block: Callable[[], nn.Module] | None = None) -> None:
        super().__init__()
        self.inp = nn.Linear(din, h)
        self.blocks = nn.ModuleList((block() if block else Blk(h, p)) for _ in range(n))
        self.head = nn.Linear(h, dout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)

    def trunk(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The same forward called block by block from outside; returns every block output
        and the head's output last."""
        h = self.inp(x)
        outs = []
        for b in self.blocks:
            h = b(h)
            outs.append(h)
        outs.append(self.head(h))
        return outs


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + seed)


def X(seed: int, shape: tuple[int, ...] = (4, 8, 16)) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed))


# ----------------------------------------------------------------------------- loops

Snap = dict[str, torch.Tensor]


def snapshot(models: dict[str, nn.Module], extras: dict[str, Any]) -> Snap:
    s: Snap = {}
    for tag, m in models.items():
        for n, p in m.named_parameters():
            if p.grad is not None:
                s[f"{tag}grad.{n}"] = _dense(p.grad.detach()).clone()
        for n, b in m.named_buffers():
            s[f"{tag}buf.{n}"] = b.detach().clone()
    for k, v in extras.items():
        if isinstance(v, torch.Tensor):
            s[f"x.{k}"] = _dense(v.detach()).clone()
        elif isinstance(v, (list, tuple)):
            for i, t in enumerate(v):
                if isinstance(t, torch.Tensor):
                    s[f"x.{k}.{i}"] = _dense(t.detach()).clone()
                elif t is None:
                    s[f"x.{k}.{i}"] = torch.tensor(float("nan"))
        elif isinstance(v, (int, float, str, bool)):
            s[f"x.{k}"] = torch.tensor(float(hash(v) % 100000) if isinstance(v, str) else float(v))
    return s


def std_loop(body: Callable[[nn.Module, int], dict[str, Any] | None], *,
             opt: Callable[[nn.Module], Any] | None = None,
             others: Callable[[], dict[str, nn.Module]] | None = None) -> Callable[..., list[Snap]]:
    """A loop of ``steps`` steps: seed, ``body(model, step)`` (which runs the forward(s)
    and backward(s) and returns extra tensors to compare), snapshot grads, buffers and
    extras, optimizer step, snapshot parameters, zero grads. ``others``: models outside
    the runtime the body reaches through ``model._others`` (made afresh per loop)."""

    def loop(model: nn.Module, rt: Any, steps: int) -> list[Snap]:
        oth = others() if others else {}
        model._others = oth  # type: ignore[attr-defined]
        mods = {"": model, **{f"{k}.": v for k, v in oth.items()}}
        opts = opt(model) if opt else [torch.optim.SGD(model.parameters(), lr=0.02)]
        if not isinstance(opts, list):
            opts = [opts]
        for v in oth.values():
            opts.append(torch.optim.SGD(v.parameters(), lr=0.02))
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            for s in range(steps):
                torch.manual_seed(100 + s)
                extras = body(model, s) or {}
                snap = snapshot(mods, extras)
                for o in opts:
                    o.step()
                    o.zero_grad(set_to_none=True)
                for tag, m in mods.items():
                    for n, p in m.named_parameters():
                        snap[f"{tag}param.{n}"] = p.detach().clone()
                out.append(snap)
        del model._others  # type: ignore[attr-defined]
        return out

    return loop


# ----------------------------------------------------------------------------- checks


def diff(a: list[Snap], b: list[Snap]) -> list[str]:
    bad = []
    if len(a) != len(b):
        return [f"steps {len(a)} vs {len(b)}"]
    for step, (x, y) in enumerate(zip(a, b)):
        if x.keys() != y.keys():
            bad.append(f"step {step} keys differ: {sorted(x.keys() ^ y.keys())[:6]}")
            continue
        for k in x:
            u, v = x[k], y[k]
            if u.dtype != v.dtype or u.shape != v.shape or not torch.equal(_bits(u), _bits(v)):
                d = (u.double() - v.double()).abs().max().item() if u.shape == v.shape and u.numel() else float("nan")
                rel = d / max(u.double().abs().max().item(), 1e-30) if u.numel() and u.shape == v.shape else float("nan")
                bad.append(f"step {step} {k} maxabs {d:.3g} rel {rel:.3g}")
    return bad


def books(rt: Any, variant: str, steps: int, budget: int | None, keeps: bool) -> list[str]:
    """Notes on the step records (not failures by themselves: judged by hand)."""
    notes = []
    recs = rt.report().steps
    if len(recs) != steps:
        notes.append(f"{len(recs)} records for {steps} steps")
    for r in recs:
        for f in ("peak_activation_bytes", "kept_bytes", "offloaded_bytes", "recomputed_bytes", "input_bytes", "replays"):
            if getattr(r, f) < 0:
                notes.append(f"step {r.step} {f}={getattr(r, f)} < 0")
    if not recs:
        return notes + ["no records"]
    if not keeps:
        if variant == "recompute" and not all(r.replays > 0 and r.recomputed_bytes > 0 for r in recs):
            notes.append("recompute: steps without replays " + str([(r.replays, r.recomputed_bytes) for r in recs]))
        if variant == "offload" and not all(r.offloaded_bytes > 0 for r in recs):
            notes.append("offload: steps offloading nothing " + str([r.offloaded_bytes for r in recs]))
        if variant.startswith("auto"):
            ph = [r.phase for r in recs]
            if ph[0] != "measure" or ph[-1] not in ("planned", "borrowed"):
                notes.append(f"auto phases {ph}")
        if variant in ("auto_tight", "auto_serve") and recs[-1].recomputed_bytes <= 0:
            notes.append("tight: last step dropped nothing")
    if variant == "auto_serve" and not keeps and not any(r.served_ops > 0 for r in recs):
        notes.append("auto_serve: no op served")
    import gc
    gc.collect()
    if rt.offload_groups_held:
        notes.append(f"{rt.offload_groups_held} offload groups held after the loop")
    eng = rt.offload_engine
    if eng is not None and (eng.stash_bytes or eng.outstanding_reload_bytes):
        notes.append(f"engine stash {eng.stash_bytes} reload {eng.outstanding_reload_bytes}")
    if budget and variant in ("auto_tight", "auto_serve"):
        over = [round(r.peak_activation_bytes / budget, 2) for r in recs if r.phase == "planned"
                and r.peak_activation_bytes > 1.05 * budget]
        if over:
            notes.append(f"planned peaks over budget x{over}")
    return notes


class _Grab(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.msgs: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.msgs.append(record.getMessage())


def _run(loop: Callable[..., list[Snap]], model: nn.Module, rt: Any, steps: int) -> tuple[list[Snap] | None, BaseException | None]:
    try:
        return loop(model, rt, steps), None
    except Exception as e:  # noqa: BLE001
        return None, e


def run_case(name: str, factory: Callable[[], nn.Module], loop: Callable[..., list[Snap]], variants: list[str],
             *, steps: int = 4, keeps: bool = False, verbose: bool = False) -> dict[str, str]:
    torch.manual_seed(0)
    model = factory().train()
    ref, err = _run(loop, copy.deepcopy(model), None, steps)
    ref2, err2 = _run(loop, copy.deepcopy(model), None, steps)
    res = {}
    if err is not None:
        print(f"PLAIN-RAISES {name}: {type(err).__name__}: {str(err)[:300]}", flush=True)
    elif diff(ref, ref2):
        print(f"PLAIN-NONDET {name}: {diff(ref, ref2)[:3]}", flush=True)
        return {v: "plain-nondet" for v in variants}
    for v in variants:
        t0 = time.time()
        budget = None
        grab = _Grab()
        lg = logging.getLogger("offrecomp")
        lg.addHandler(grab)
        try:
            if v in ("auto_tight", "auto_serve"):
                probe = copy.deepcopy(model)
                krt = variant_runtime(probe, "keep")
                _, perr = _run(loop, probe, krt, 1)
                budget = (krt.report().steps[0].peak_activation_bytes // 2) if (perr is None and krt.report().steps) else None
                if not budget:
                    budget = 1 << 14
            m = copy.deepcopy(model)
            rt = variant_runtime(m, v, budget)
            got, gerr = _run(loop, m, rt, steps)
            leaked = tc.top_saved_tensors_hooks() is not None
            if leaked:  # clean up so later runs are not poisoned
                torch._C._autograd._pop_saved_tensors_default_hooks()
        finally:
            lg.removeHandler(grab)
        dt = time.time() - t0
        warn = ("; warned: " + " | ".join(sorted({w[:160] for w in grab.msgs}))) if grab.msgs else ""
        if leaked:
            res[v] = "FAIL"
            print(f"FAIL {name:28s} {v:11s} hooks left registered after exit", flush=True)
            continue
        if err is not None:
            if gerr is not None and type(gerr) is type(err):
                res[v] = "both-raise"
                print(f"BOTH-RAISE {name:22s} {v:11s} {dt:5.1f}s runtime: {type(gerr).__name__}: {str(gerr)[:200]}", flush=True)
            else:
                res[v] = "FAIL"
                print(f"FAIL {name:28s} {v:11s} plain raised {type(err).__name__}, runtime {'ran' if gerr is None else type(gerr).__name__}", flush=True)
            continue
        if gerr is not None:
            res[v] = "RAISE"
            msg = str(gerr).replace("\n", " ")
            cause = f" <- {type(gerr.__cause__).__name__}: {str(gerr.__cause__)[:160]}" if gerr.__cause__ else ""
            print(f"RAISE {name:27s} {v:11s} {dt:5.1f}s {type(gerr).__name__}: {msg[:600]}{cause}", flush=True)
            if verbose:
                traceback.print_exception(gerr)
            continue
        bad = diff(ref, got)
        notes = books(rt, v, steps, budget, keeps)
        if bad:
            res[v] = "FAIL"
            print(f"FAIL {name:28s} {v:11s} {dt:5.1f}s {len(bad)} mismatches: {bad[:4]}{warn}", flush=True)
        else:
            res[v] = "PASS" + ("(books?)" if notes else "")
            print(f"PASS {name:28s} {v:11s} {dt:5.1f}s" + (f" BOOKS: {notes}" if notes else "") + warn, flush=True)
        if verbose:
            print(rt.report())
    return res
