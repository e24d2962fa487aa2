"""Shared machinery of the sweep: run a case under plain / keep / recompute /
torch.utils.checkpoint / auto(B) and measure each step's allocator peak independently
(torch.profiler profile_memory=True, as tests/offrecomp/test_memory.allocator_peak)."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import offrecomp  # noqa: E402


def allocator_peak(fn: Callable[[], None]) -> int:
    """Same as tests/offrecomp/test_memory.py::allocator_peak: peak of the running sum of
    [memory] events from the window's start (= allocator level at the step's start)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        if e.name() == "[memory]":
            cur += e.nbytes()
            peak = max(peak, cur)
    return peak


@dataclass
class Case:
    name: str
    build: Callable[[], nn.Module]  # forward(batch) -> scalar loss
    batch: Callable[[int], Any]
    accumulate: int = 1
    autocast: bool = False
    opts: dict[str, Any] = field(default_factory=dict)  # extra runtime options (min_bytes, regions)
    ckpt: Callable[[nn.Module], None] | None = None  # puts torch.utils.checkpoint around blocks
    steps: int = 8
    note: str = ""


class CkptWrap(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *a: Any, **k: Any) -> Any:
        return checkpoint(self.inner, *a, use_reentrant=False, **k)


def ckpt_children(path: str) -> Callable[[nn.Module], None]:
    """Wrap every child of the container at ``path`` (dotted, may be several separated by ',')."""

    def apply(model: nn.Module) -> None:
        for p in path.split(","):
            cont = model.get_submodule(p)
            for name, child in list(cont.named_children()):
                setattr(cont, name, CkptWrap(child)) if not isinstance(cont, nn.ModuleList) else cont.__setitem__(int(name), CkptWrap(child))

    return apply


class Catcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.msgs: list[tuple[int, str]] = []
        self.step = -1

    def emit(self, record: logging.LogRecord) -> None:
        self.msgs.append((self.step, record.getMessage()))


def _batch_of(case: Case, s: int) -> Any:
    return case.batch(s)


def run(case: Case, variant: str, budget: int | None = None, steps: int | None = None) -> dict[str, Any]:
    """Train a fresh copy of the case's model (same init) for ``steps`` SGD steps under
    ``variant`` (plain, ckpt, keep, recompute, auto); per step: allocator peak of the
    step's forward(s)+backward(s), grads, and the runtime's record."""
    steps = steps or case.steps
    torch.manual_seed(0)
    model = case.build()
    if variant == "ckpt":
        assert case.ckpt is not None
        case.ckpt(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    catcher = Catcher()
    lg = logging.getLogger("offrecomp")
    lg.addHandler(catcher)
    rt = None
    if variant in ("keep", "recompute", "auto"):
        kw = dict(case.opts)
        if budget is not None:
            kw["budget"] = budget
        rt = offrecomp.runtime(model, mode=variant, **kw)
    out: dict[str, Any] = {"variant": variant, "budget": budget, "steps": []}
    try:
        with rt if rt is not None else contextlib.nullcontext():
            for step in range(steps):
                catcher.step = step

                def fwdbwd() -> None:
                    for micro in range(case.accumulate):
                        torch.manual_seed(1000 * step + micro)
                        b = _batch_of(case, 10 * step + micro)
                        if case.autocast:
                            with torch.autocast("cpu", dtype=torch.bfloat16):
                                loss = model(b)
                        else:
                            loss = model(b)
                        (loss / case.accumulate if case.accumulate > 1 else loss).backward()

                peak = allocator_peak(fwdbwd)
                grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in params}
                opt.step()
                opt.zero_grad(set_to_none=False)
                out["steps"].append({"step": step, "alloc": peak, "grads": grads})
    finally:
        lg.removeHandler(catcher)
    if rt is not None:
        recs = rt.report().steps
        for i, r in enumerate(recs):
            if i < len(out["steps"]):
                out["steps"][i].update(
                    phase=r.phase, books=r.peak_activation_bytes, pred=r.predicted_peak_bytes,
                    budget_rec=r.budget_bytes, kept=r.kept_bytes, recomputed=r.recomputed_bytes,
                    inputs=r.input_bytes, replays=r.replays, offloaded=r.offloaded_bytes, passes=r.passes,
                )
        out["n_records"] = len(recs)
    out["warnings"] = catcher.msgs
    return out


def grads_equal(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    bad = []
    for k in a:
        x, y = a[k], b.get(k)
        if x is None and y is None:
            continue
        if x is None or y is None or x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
            bad.append(k)
    return bad


def med(xs: list[int]) -> int:
    return int(statistics.median(xs)) if xs else 0


def fmt(n: float | int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.3f}M"


FRACS = (0.3, 0.5, 0.75)
SLACK = 1.05  # "a few percent"


def sweep_case(case: Case, out_dir: str) -> dict[str, Any]:
    plain = run(case, "plain")
    keep = run(case, "keep", steps=4)
    rec = run(case, "recompute", steps=4)
    ck = None
    if case.ckpt is not None:
        try:
            ck = run(case, "ckpt", steps=4)
        except Exception as e:  # noqa: BLE001
            ck = {"error": repr(e)[:300]}
    keep_books = keep["steps"][-1]["books"]
    rec_books = rec["steps"][-1]["books"]
    keep_alloc = med([s["alloc"] for s in keep["steps"][1:]])
    rec_alloc = med([s["alloc"] for s in rec["steps"][1:]])
    plain_alloc = med([s["alloc"] for s in plain["steps"][1:]])
    ck_alloc = med([s["alloc"] for s in ck["steps"][1:]]) if ck and "steps" in ck else None
    res: dict[str, Any] = {
        "case": case.name, "note": case.note, "keep_books": keep_books, "rec_books": rec_books,
        "keep_alloc": keep_alloc, "rec_alloc": rec_alloc, "plain_alloc": plain_alloc, "ckpt_alloc": ck_alloc,
        "ckpt_error": ck.get("error") if ck else None,
        "keep_warn": keep["warnings"], "rec_warn": rec["warnings"],
        "keep_bitwise": all(not grads_equal(p["grads"], s["grads"]) for p, s in zip(plain["steps"], keep["steps"])),
        "rec_bitwise": all(not grads_equal(p["grads"], s["grads"]) for p, s in zip(plain["steps"], rec["steps"])),
        "runs": [],
    }
    lines = [f"== {case.name}  ({case.note})",
             f"plain alloc {fmt(plain_alloc)} | keep books {fmt(keep_books)} alloc {fmt(keep_alloc)} | "
             f"recompute books {fmt(rec_books)} alloc {fmt(rec_alloc)} | ckpt alloc {fmt(ck_alloc)}"
             + (f" (ckpt error {res['ckpt_error']})" if res["ckpt_error"] else ""),
             f"keep overhead (alloc-books) {fmt(keep_alloc - keep_books)}; recompute overhead {fmt(rec_alloc - rec_books)};"
             f" keep bitwise {res['keep_bitwise']}, recompute bitwise {res['rec_bitwise']}",
             ]
    if keep["warnings"] or rec["warnings"]:
        lines.append(f"warnings keep/recompute: {[m[:160] for _, m in keep['warnings'] + rec['warnings']]}")
    lines.append(f"{'frac':>5} {'B':>9} {'step':>4} {'phase':>9} {'books':>9} {'pred':>9} {'alloc':>9} "
                 f"{'keep-(Kb-B)':>11} {'ratio':>6} {'rec+(B-Rb)':>10} {'hidden':>8} {'bitw':>4} flags")
    for frac in FRACS:
        B = int(rec_books + frac * (keep_books - rec_books))
        a = run(case, "auto", budget=B)
        exp_keep = keep_alloc - (keep_books - B)
        allowed_rec = rec_alloc + (B - rec_books) + 0.05 * B
        runinfo = {"frac": frac, "B": B, "warnings": a["warnings"], "steps": []}
        for ps, s in zip(plain["steps"], a["steps"]):
            bad = grads_equal(ps["grads"], s["grads"])
            books = s.get("books")
            warned = [m for st, m in a["warnings"] if st <= s["step"]]
            flags = []
            if s.get("phase") == "planned":
                if books is not None and books > 1.05 * B and not warned:
                    flags.append("BOOKS>B_SILENT")
                elif books is not None and books > B and not warned:
                    flags.append("books>B(within5%)")
                if s["alloc"] > SLACK * exp_keep and not warned:
                    flags.append("ALLOC>KEEP-SAVING_SILENT")
                elif s["alloc"] > SLACK * exp_keep:
                    flags.append("alloc>keep-saving(warned)")
                if s["alloc"] > allowed_rec:
                    flags.append("alloc>rec-bound")
                if books is not None and books <= B and any("planned step held" in m for st, m in a["warnings"] if st == s["step"]):
                    flags.append("warn-on-fine-step")
            if bad:
                flags.append(f"GRADS_DIFF:{bad[:3]}")
            # hidden: real memory above what the books imply (keep's non-activation overhead + books)
            hidden = s["alloc"] - (keep_alloc - keep_books + (books or 0))
            runinfo["steps"].append({k: v for k, v in s.items() if k != "grads"} | {
                "exp_keep": exp_keep, "allowed_rec": allowed_rec, "hidden": hidden, "flags": flags, "bitwise": not bad})
            lines.append(
                f"{frac:>5} {fmt(B):>9} {s['step']:>4} {s.get('phase', '?'):>9} {fmt(books):>9} {fmt(s.get('pred')):>9} "
                f"{fmt(s['alloc']):>9} {fmt(exp_keep):>11} {s['alloc'] / exp_keep if exp_keep > 0 else float('nan'):>6.3f} "
                f"{fmt(allowed_rec):>10} {fmt(hidden):>8} {('Y' if not bad else 'N'):>4} {' '.join(flags)}")
        for st, m in a["warnings"]:
            lines.append(f"      warning@step{st}: {m[:400]}")
        res["runs"].append(runinfo)
    txt = "\n".join(lines) + "\n"
    print(txt, flush=True)
    with open(f"{out_dir}/{case.name}.txt", "w") as f:
        f.write(txt)
    with open(f"{out_dir}/{case.name}.json", "w") as f:
        json.dump(res, f, default=str, indent=1)
    return res
