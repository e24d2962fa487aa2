"""Shared harness of sweep_z (the offload engine under stress, on the emulated backend).

``compare(name, factory, loop, variant, steps, **rt_kw)`` builds one model with
``torch.manual_seed(0)``, deep-copies it twice, runs ``loop(model, step)`` for ``steps``
steps plainly and under ``offrecomp.runtime(copy, mode=..., min_bytes=0, **rt_kw)``
(identical seeds per step), snapshots after each step every grad (None counted),
parameter, buffer and whatever tensors ``loop`` returns (losses), then takes one SGD step
and zeroes the grads; everything compared bitwise (torch.equal on the raw bits).

Variants: ``offload`` (mode="offload"), ``user_mix`` (mode="auto" with ``rt.set_plan``:
OFFLOAD by default, RECOMPUTE storages 1 and 3 of each region's calls 0 and 1; auto never
offloads on CPU, docs/design.md), ``auto_fast`` (mode="auto", budget = half of the
keep run's first-step peak, d2h/h2d at 1000 GB/s so that offloading is cheap for the
planner).

Books checked after each run (a failed check makes the case FAIL with a ``BOOKS:`` line):
 - every step has a record; offload: offloaded_bytes > 0 unless ``expect_offload=False``
 - offload, ordinary loops (``one_backward=True``): h2d_bytes == d2h_bytes (each group
   reloaded exactly once), no negative counters;
 - after the last step and after exit: the engine holds no live groups, no stash, no
   outstanding/fetched reload bytes (``engine.device_bytes == 0``), offload_groups_held == 0
 - pool_reserved_bytes of the last step <= 2x that of the second step (no unbounded growth)
 - offloaded_bytes never exceeds ``expected_max`` when the case gives one.
Errors: when plain raises, the runtime must raise the same type (message compared on the
"modified by an inplace operation" phrase); a runtime error where plain runs is a FAIL.
"""

from __future__ import annotations

import copy
import gc
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

import torch
from torch import nn

import offrecomp

torch.set_num_threads(1)

_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16, torch.complex64: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.dtype in _BITS:
        return t.contiguous().view(_BITS[t.dtype])
    return t


def snapshot(model: nn.Module, extra: Any) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for n, p in model.named_parameters():
        s[f"grad.{n}"] = None if p.grad is None else p.grad.detach().clone()
        s[f"param.{n}"] = p.detach().clone()
    for n, b in model.named_buffers():
        s[f"buf.{n}"] = b.detach().clone()
    if extra is not None:
        for i, t in enumerate(extra if isinstance(extra, (list, tuple)) else [extra]):
            s[f"out.{i}"] = t.detach().clone() if isinstance(t, torch.Tensor) else t
    return s


def diff(a: dict, b: dict) -> list[str]:
    bad = []
    if a.keys() != b.keys():
        return [f"keys differ: {sorted(a.keys() ^ b.keys())}"]
    for k in a:
        x, y = a[k], b[k]
        if x is None or y is None:
            if (x is None) != (y is None):
                bad.append(f"{k}: None vs {type(y).__name__}")
            continue
        if not isinstance(x, torch.Tensor):
            if x != y:
                bad.append(f"{k}: {x} vs {y}")
            continue
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(bits(x), bits(y)):
            d = ((x.double() if not x.is_complex() else x) - (y.double() if not y.is_complex() else y)).abs().max().item() \
                if x.shape == y.shape and x.numel() else float("nan")
            bad.append(f"{k} (max abs diff {d:.3g})")
    return bad


def run_loop(model: nn.Module, loop: Callable, steps: int, ctx: Any, lr: float = 0.05) -> tuple[list, BaseException | None]:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    snaps = []
    err = None
    try:
        with ctx:
            for step in range(steps):
                torch.manual_seed(100 + step)
                extra = loop(model, step)
                snaps.append(snapshot(model, extra))
                opt.step()
                opt.zero_grad(set_to_none=True)
    except Exception as e:  # noqa: BLE001
        # keep no traceback: its frames would hold the failed step's graph (and groups)
        err = type(e)(str(e)) if type(e) in (RuntimeError, ValueError, TypeError) else RuntimeError(f"{type(e).__name__}: {e}")
        err.__cause__ = None
        tb_text = "".join(traceback.format_exception(e))
        err.tb_text = tb_text
        del e
    return snaps, err


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def mix_plan(rt):
    """A user plan: OFFLOAD by default, RECOMPUTE storages 1 and 3 of each region's first
    two calls (replays then read offloaded neighbours from their reloads)."""
    from scheduler.plan import Placement, Plan

    pl = {(r, c, i): Placement.RECOMPUTE for r in rt.regions for c in (0, 1) for i in (1, 3)}
    return Plan(placements=pl, default=Placement.OFFLOAD)


def keep_peak(model: nn.Module, loop: Callable, **kw: Any) -> int:
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="keep", min_bytes=0, native_keep=False, **kw)
    run_loop(m, loop, 1, rt)
    st = rt.report().steps
    rt.close()
    return max(1, st[0].peak_activation_bytes // 2) if st else 1 << 20


def fmt_steps(steps: list) -> str:
    out = []
    for s in steps:
        fb = {k: v for k, v in (s.fallbacks or {}).items() if v}
        out.append(
            f"  step {s.step} {s.phases or s.phase:>20s} peak={s.peak_activation_bytes} kept={s.kept_bytes} "
            f"off={s.offloaded_bytes} rec={s.recomputed_bytes} d2h={s.d2h_bytes} h2d={s.h2d_bytes} "
            f"pool={s.pool_reserved_bytes}/{s.pool_high_water_bytes} saved={s.saved_tensors} storages={s.storages}"
            + (f" fb={fb}" if fb else "")
        )
    return "\n".join(out)


RESULTS: list[tuple[str, str, str]] = []


def compare(
    name: str,
    factory: Callable[[], nn.Module],
    loop: Callable[[nn.Module, int], Any],
    variant: str = "offload",
    steps: int = 4,
    *,
    expect_offload: bool = True,
    one_backward: bool = True,
    expected_max: int | None = None,
    extra_check: Callable[[Any, list], list[str]] | None = None,
    verbose: bool = True,
    documented: dict | None = None,
    **rt_kw: Any,
) -> bool:
    t0 = time.time()
    torch.manual_seed(0)
    model = factory().train()
    plain = copy.deepcopy(model)
    ours = copy.deepcopy(model)
    ref, ref_err = run_loop(plain, loop, steps, _Null())
    kw = dict(min_bytes=0)
    kw.update(rt_kw)
    if variant == "offload":
        kw["mode"] = "offload"
    elif variant == "auto_fast":
        kw.setdefault("budget", keep_peak(model, loop))
        kw.setdefault("d2h_gbps", 1000.0)
        kw.setdefault("h2d_gbps", 1000.0)
        kw["mode"] = "auto"
    elif variant == "user_mix":
        kw["mode"] = "auto"
    else:
        kw["mode"] = variant
    problems: list[str] = []
    rt = None
    try:
        rt = offrecomp.runtime(ours, **kw)
        if variant == "user_mix":
            rt.set_plan(mix_plan(rt))
    except Exception as e:  # noqa: BLE001
        problems.append(f"runtime() raised {type(e).__name__}: {e}")
    if rt is not None:
        got, err = run_loop(ours, loop, steps, rt)
        if ref_err is not None or err is not None:
            if ref_err is None:
                problems.append(f"runtime raised where plain did not: {type(err).__name__}: {str(err)[:400]}")
                if verbose:
                    print(err.tb_text)
            elif err is None:
                problems.append(f"plain raised {type(ref_err).__name__} but runtime did not: {str(ref_err)[:200]}")
            else:
                # offrecomp's own documented replay error ("modified in place ... replaying") counts
                # as the same kind (docs/reliability.md: a region input modified after the region ran)
                def kind(e):
                    m = str(e)
                    return "inplace" if ("inplace operation" in m or "modified in place" in m) else m[:60]
                same = type(err) is type(ref_err) and kind(err) == kind(ref_err)
                if not same:
                    print(err.tb_text)
                    problems.append(f"errors differ: plain {type(ref_err).__name__}: {str(ref_err)[:200]} | "
                                    f"runtime {type(err).__name__}: {str(err)[:200]}")
        if len(ref) != len(got):
            problems.append(f"steps completed differ: plain {len(ref)} runtime {len(got)}")
        for i, (a, b) in enumerate(zip(ref, got)):
            bad = diff(a, b)
            if bad:
                problems.append(f"step {i}: NOT BITWISE: " + ", ".join(bad[:6]) + (f" (+{len(bad)-6})" if len(bad) > 6 else ""))
                break
        recs = rt.report().steps
        eng = rt.offload_engine
        if err is None and ref_err is None:
            if len(recs) != steps:
                problems.append(f"BOOKS: {len(recs)} records for {steps} steps")
            for s in recs:
                for f in ("peak_activation_bytes", "kept_bytes", "offloaded_bytes", "recomputed_bytes",
                          "d2h_bytes", "h2d_bytes", "pool_reserved_bytes", "input_bytes"):
                    if getattr(s, f) < 0:
                        problems.append(f"BOOKS: step {s.step} {f}={getattr(s, f)} < 0")
                if variant == "user_mix" and s.phase == "user-plan":
                    if expect_offload and s.offloaded_bytes <= 0:
                        problems.append(f"BOOKS: step {s.step} (user plan) offloaded nothing")
                    if one_backward and s.h2d_bytes != s.d2h_bytes:
                        problems.append(f"BOOKS: step {s.step} h2d {s.h2d_bytes} != d2h {s.d2h_bytes}")
                if variant == "offload":
                    if expect_offload and s.offloaded_bytes <= 0:
                        problems.append(f"BOOKS: step {s.step} offloaded nothing")
                    if one_backward and s.h2d_bytes != s.d2h_bytes:
                        problems.append(f"BOOKS: step {s.step} h2d {s.h2d_bytes} != d2h {s.d2h_bytes}")
                if expected_max is not None and s.offloaded_bytes > expected_max:
                    problems.append(f"BOOKS: step {s.step} offloaded {s.offloaded_bytes} > expected max {expected_max}")
            if len(recs) >= 3 and recs[1].pool_reserved_bytes and recs[-1].pool_reserved_bytes > 2 * recs[1].pool_reserved_bytes:
                problems.append(f"BOOKS: pool grew {recs[1].pool_reserved_bytes} -> {recs[-1].pool_reserved_bytes}")
            if variant == "auto_fast" and recs and recs[-1].phase not in ("planned", "borrowed"):
                problems.append(f"NOTE: last phase {recs[-1].phase}")
        if extra_check is not None:
            problems += extra_check(rt, recs)
        gc.collect()
        if eng is not None and not eng.closed:
            if eng.live_groups or eng.stash_bytes or eng.device_bytes:
                problems.append(f"BOOKS: after exit engine live_groups={eng.live_groups} stash={eng.stash_bytes} "
                                f"device_bytes={eng.device_bytes}")
        if rt.offload_groups_held:
            problems.append(f"BOOKS: after exit offload_groups_held={rt.offload_groups_held}")
        books = fmt_steps(recs)
        rt.close()
    else:
        books = ""
    hard = [p for p in problems if not p.startswith("NOTE")]
    status = "FAIL" if hard else "PASS"
    if hard and documented and variant in documented:
        status = "DOC "
        problems.append(f"NOTE: documented: {documented[variant]}")
    errnote = f" (both raised {type(ref_err).__name__})" if ref_err is not None else ""
    line = f"{status} {name:34s} {variant:9s} {time.time() - t0:5.1f}s{errnote}"
    print(line, flush=True)
    for p in problems:
        print("    " + p, flush=True)
    if verbose or hard:
        print(books, flush=True)
    RESULTS.append((status, name, variant))
    return not hard


def summary() -> int:
    n = len(RESULTS)
    f = [r for r in RESULTS if r[0] == "FAIL"]
    d = [r for r in RESULTS if r[0] == "DOC "]
    print(f"\n{n} runs, {n - len(f) - len(d)} PASS, {len(d)} DOC (failed as documented), {len(f)} FAIL")
    for r in f:
        print("  FAIL", r[1], r[2])
    return 1 if f else 0


def plain_saves(factory: Callable[[], nn.Module], loop: Callable, step: int = 0) -> list[tuple[int, int, bool, torch.dtype]]:
    """Every distinct storage a plain step saves for backward: (ptr, nbytes, is_parameter, dtype)."""
    torch.manual_seed(0)
    model = factory().train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[int, int, bool, torch.dtype]] = {}

    def pack(t):
        try:
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if ptr not in seen:
                seen[ptr] = (ptr, s.nbytes(), ptr in params, t.dtype)
        except Exception:  # noqa: BLE001
            pass
        return t

    torch.manual_seed(100 + step)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loop(model, step)
    return list(seen.values())
