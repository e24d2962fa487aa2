"""SOAK sweep: long training runs under offrecomp, looking for anything that grows, drifts
or breaks over hundreds of steps.

Every case trains a small GPT (tests/models.GPT: 3 pre-LN blocks in an nn.ModuleList,
width 32, 4 heads, dropout 0.1, vocab 64; AdamW lr 1e-3) plainly and under one variant
(keep, recompute, offload, auto, auto_tight = auto with a budget of half a keep run's
step-0 peak_activation_bytes at the case's base shape (cycle8, rand30: at the longest
length of the run); min_bytes=0 everywhere, as
tests/helpers.variant_runtime builds them), from identical deep copies and per-step seeds
(torch.manual_seed(step) before each forward; batch tokens from a generator seeded by the
step). Compared BITWISE: the loss of every step (and every eval loss), and gradients,
parameters, buffers after optimizer steps 1, 10, 100 and the last. "plain2" as variant
runs a second plain run against the first (determinism of the plain loop).

Tracked (every PROBE steps, after gc.collect(), for the plain run too): process RSS
(psutil), len(gc.get_objects()), live torch.Tensor objects (gc scan), and for the runtime:
every container reachable from the Runtime object (walk of __dict__/__slots__, dicts,
lists, deques, sets; paths with dict/list members aggregated as {} / []), the number of
objects and tensors (and their bytes) reachable from it, len(rt.report().steps),
planner entries / sightings, offload pool stats. Host step time per step (forward,
backward, optimizer step), median of steps 20-39 against the last 20.

Cases (name: what the loop does):
  fixed      300 steps, batch (2, 32).
  cycle8     300 steps, sequence length cycling through 8 values (8..64 step 8).
  rand30     300 steps, sequence length drawn (seeded) from 30 values 8..66 step 2.
  evalint    200 steps; after every 5th step model.eval() + torch.no_grad() forward on a
             held-out batch (its loss compared), then model.train().
  newsize    200 steps of (2, 32); every 10th step a batch of a new, never-seen length
             (33 + step // 10).
  fail20     200 steps; every 20th step the middle block raises RuntimeError inside its
             forward (a global flag, not module state); the loop catches it, zero_grad,
             skips the step.
  recreate   200 steps; the runtime is exited and a NEW runtime entered every 20 steps
             (the old one dropped: del rt).
  accum4     200 optimizer steps of 4 micro-batches each (800 forwards/backwards).
  envreport  fixed, 300 steps with OFFRECOMP_REPORT=<tmp file> and OFFRECOMP_LOG=INFO
             (a logging handler writing to a StringIO) set.

Command (one case x variant per process; each under ~3 minutes):
  cd /work/main && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python /tmp/sweep_soak/soak.py CASE VARIANT
  e.g. /tmp/sweep_soak/run_all.sh runs every case x variant into out_<case>_<variant>.txt
"""

from __future__ import annotations

import collections
import contextlib
import copy
import gc
import io
import json
import logging
import os
import statistics
import sys
import time
import types
import weakref

sys.path.insert(0, "/work/main")
import psutil  # noqa: E402
import torch  # noqa: E402

import offrecomp  # noqa: E402
from tests import models  # noqa: E402
from tests.helpers import variant_runtime  # noqa: E402

PROBE = 10
from offrecomp.lifecycle import REPORT_MAX_STEPS as REPORT_MAX  # noqa: E402
FAIL = {"on": False}


class FailBlock(models.Block):
    def forward(self, x):  # raises midway (after some saves) when the global flag is set
        b, t, h = x.shape
        y = self.qkv(self.ln1(x))
        if FAIL["on"]:
            raise RuntimeError("injected failure")
        return super().forward(x) + 0 * y.sum()


def build(fail: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    m = models.GPT(layers=3, h=32, heads=4, p=0.1)
    if fail:
        torch.manual_seed(1)
        blk = FailBlock(32, 4, 0.1)
        blk.load_state_dict(m.blocks[1].state_dict())
        m.blocks[1] = blk
    return m


def batch(step: int, b: int, t: int) -> torch.Tensor:
    return torch.randint(0, 64, (b, t), generator=torch.Generator().manual_seed(1000 + step))


# ----------------------------------------------------------------- case definitions
CYCLE = [8, 16, 24, 32, 40, 48, 56, 64]
RAND = list(range(8, 68, 2))  # 30 values
_rng = torch.Generator().manual_seed(7)
RAND_SEQ = [RAND[i] for i in torch.randint(0, 30, (5000,), generator=_rng).tolist()]

CASES = {
    "fixed": dict(steps=300, shape=lambda s: (2, 32)),
    "cycle8": dict(steps=300, shape=lambda s: (2, CYCLE[s % 8]), budget_at_max=True),
    "rand30": dict(steps=300, shape=lambda s: (2, RAND_SEQ[s]), budget_at_max=True),
    "evalint": dict(steps=200, shape=lambda s: (2, 32), eval_every=5),
    "newsize": dict(steps=200, shape=lambda s: (2, 33 + s // 10) if s % 10 == 9 else (2, 32)),
    "fail20": dict(steps=200, shape=lambda s: (2, 32), fail_every=20, fail=True),
    "recreate": dict(steps=200, shape=lambda s: (2, 32), recreate_every=20),
    "accum4": dict(steps=200, shape=lambda s: (2, 32), accumulate=4),
    "envreport": dict(steps=300, shape=lambda s: (2, 32), env=True),
}


# ----------------------------------------------------------------- measurement
SKIP_TYPES = (
    torch.nn.Module, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
    types.MethodType, logging.Logger, weakref.ref, str, bytes, int, float, bool, type(None),
    torch.dtype, torch.device, torch.Generator,
)


def walk(root, max_depth: int = 14):
    """Containers reachable from ``root``: {path: total len}; objects, tensors, tensor bytes."""
    seen: set[int] = set()
    storages: set[int] = set()
    sizes: collections.Counter = collections.Counter()
    n_obj = n_tensor = tensor_bytes = 0
    stack = [(root, "rt", 0)]
    while stack:
        o, path, d = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            n_tensor += 1
            try:
                st = o.untyped_storage()
                if st.data_ptr() not in storages:
                    storages.add(st.data_ptr())
                    tensor_bytes += st.nbytes()
            except Exception:
                pass
            continue
        if isinstance(o, SKIP_TYPES) or isinstance(o, weakref.WeakSet.__mro__[0]) and False:
            continue
        n_obj += 1
        if d >= max_depth:
            continue
        if isinstance(o, dict):
            sizes[path + "{}"] += len(o)
            for v in list(o.values()):
                stack.append((v, path + "{}", d + 1))
            for k in list(o.keys()):
                if not isinstance(k, (str, int)):
                    stack.append((k, path + "{k}", d + 1))
        elif isinstance(o, collections.deque) and o.maxlen == REPORT_MAX:
            sizes["REPORT(rt._life.steps)[]"] += len(o)  # documented bound; records not walked
        elif isinstance(o, (list, tuple, collections.deque, set, frozenset)):
            sizes[path + "[]"] += len(o)
            for v in list(o):
                stack.append((v, path + "[]", d + 1))
        elif isinstance(o, (weakref.WeakSet, weakref.WeakValueDictionary, weakref.WeakKeyDictionary)):
            sizes[path + "(weak)"] += len(o)
        else:
            attrs = {}
            if hasattr(o, "__dict__"):
                try:
                    attrs.update(vars(o))
                except TypeError:
                    pass
            for cls in type(o).__mro__:
                for s in getattr(cls, "__slots__", ()):
                    if s not in ("__dict__", "__weakref__") and hasattr(o, s):
                        try:
                            attrs[s] = getattr(o, s)
                        except Exception:
                            pass
            for k, v in attrs.items():
                stack.append((v, f"{path}.{k}", d + 1))
    return sizes, n_obj, n_tensor, tensor_bytes


def gc_reachable(root) -> int:
    """gc-tracked objects reachable from ``root`` (the report's records), itself excluded."""
    seen = {id(root)}
    stack = list(gc.get_referents(root))
    n = 0
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType)):
            continue
        seen.add(id(o))
        if gc.is_tracked(o):
            n += 1
            stack.extend(gc.get_referents(o))
    return n


def live_tensors() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def probe(rt, proc, harness) -> dict:
    gc.collect()
    rec = {
        "rss": proc.memory_info().rss,
        "objects": len(gc.get_objects()) - gc_reachable(harness),
        "tensors": live_tensors(),
    }
    if rt is not None:
        sizes, n_obj, n_t, t_bytes = walk(rt)
        rec.update(rt_objects=n_obj, rt_tensors=n_t, rt_tensor_bytes=t_bytes, containers=dict(sizes))
        rec["report_steps"] = len(rt._life.steps)
        rec["report_gc_objects"] = gc_reachable(rt._life.steps)
        rec["objects_minus_report"] = rec["objects"] - rec["report_gc_objects"]
        pl = rt.planner
        rec["plan_entries"] = len(pl.entries)
        rec["sightings"] = len(getattr(pl.cache, "sightings", {}))
        eng = rt.offload_engine
        if eng is not None:
            st = eng.pool.stats()
            rec.update(pool_reserved=st.reserved_bytes, pool_in_use=st.in_use_bytes, pool_slabs=st.slabs,
                       pool_allocs=st.allocs, live_groups=rt.offload_groups_held)
    return rec


# ----------------------------------------------------------------- the loop
CHECK = None  # filled per case: 1-based optimizer steps to snapshot


def frozen(t: torch.Tensor):
    """A tensor kept as (dtype, shape, raw bytes): no torch.Tensor object stays alive, so the
    live-tensor counts measure offrecomp and the model, not this harness."""
    shape = tuple(t.shape)
    t = t.detach().contiguous().reshape(-1)
    return (t.dtype, shape, t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def thaw(f) -> torch.Tensor:
    dtype, shape, raw = f
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


def snapshot(model, grads: bool) -> dict:
    out = {}
    if grads:
        out.update({f"grad.{n}": frozen(p.grad) for n, p in model.named_parameters() if p.grad is not None})
    else:
        out.update({f"param.{n}": frozen(p) for n, p in model.named_parameters()})
        out.update({f"buf.{n}": frozen(b) for n, b in model.named_buffers()})
    return out


def run(case: str, variant: str | None, budget: int | None, proc) -> dict:
    cfg = CASES[case]
    steps = int(os.environ.get("SOAK_STEPS", cfg["steps"]))
    accumulate = cfg.get("accumulate", 1)
    checks = {1, 10, 100, steps}
    model = build(cfg.get("fail", False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    make_rt = (lambda: variant_runtime(model, variant, budget)) if variant else (lambda: None)
    rt = make_rt()
    losses, eval_losses, snaps, times, probes, errors = [], [], {}, [], {}, []
    runtimes = weakref.WeakSet()
    ctx = rt if rt is not None else contextlib.nullcontext()
    ctx.__enter__()
    if rt is not None:
        runtimes.add(rt)
    try:
        for step in range(steps):
            if cfg.get("recreate_every") and rt is not None and step > 0 and step % cfg["recreate_every"] == 0:
                rt.__exit__(None, None, None)
                del rt, ctx
                rt = make_rt()
                runtimes.add(rt)
                ctx = rt
                ctx.__enter__()
            b, t = cfg["shape"](step)
            t0 = time.perf_counter()
            failed = False
            for micro in range(accumulate):
                torch.manual_seed(10 * step + micro)
                FAIL["on"] = bool(cfg.get("fail_every")) and step % cfg["fail_every"] == cfg["fail_every"] - 1
                try:
                    loss = model(batch(10 * step + micro, b, t))
                    loss.backward()
                    losses.append(frozen(loss))
                except RuntimeError as e:
                    if "injected" not in str(e):
                        raise
                    errors.append(step)
                    failed = True
                    loss = None
                    break
                finally:
                    FAIL["on"] = False
            if failed:
                opt.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - t0)
                continue
            if step + 1 in checks:
                snaps[step + 1] = snapshot(model, True)
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
            if step + 1 in checks:
                snaps[step + 1].update(snapshot(model, False))
            if cfg.get("eval_every") and (step + 1) % cfg["eval_every"] == 0:
                model.eval()
                with torch.no_grad():
                    eval_losses.append(frozen(model(batch(99999, 2, 32))))
                model.train()
            del loss
            if (step + 1) % PROBE == 0 or step == 0:
                probes[step + 1] = probe(rt, proc, (snaps, probes, losses, eval_losses, errors))
    finally:
        ctx.__exit__(None, None, None)
    report = None
    if rt is not None:
        report = rt.report().steps
    del ctx
    gc.collect()
    after = {"runtimes_alive": len(runtimes)}
    return dict(losses=losses, eval_losses=eval_losses, snaps=snaps, times=times, probes=probes,
                errors=errors, report=report, rt=rt, after=after)


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32) if x.dtype == torch.float32 else x


def compare(ref: dict, got: dict) -> list[str]:
    bad = []
    if len(ref["losses"]) != len(got["losses"]):
        bad.append(f"loss count {len(ref['losses'])} vs {len(got['losses'])}")
    for i, (a, b) in enumerate(zip(ref["losses"], got["losses"])):
        if a != b:
            bad.append(f"loss {i}: {thaw(a).item()!r} vs {thaw(b).item()!r}")
            break
    for i, (a, b) in enumerate(zip(ref["eval_losses"], got["eval_losses"])):
        if a != b:
            bad.append(f"eval loss {i}: {thaw(a).item()!r} vs {thaw(b).item()!r}")
            break
    if len(ref["eval_losses"]) != len(got["eval_losses"]):
        bad.append("eval count")
    if ref["errors"] != got["errors"]:
        bad.append(f"errors {ref['errors']} vs {got['errors']}")
    for s, snap in ref["snaps"].items():
        other = got["snaps"].get(s)
        if other is None or other.keys() != snap.keys():
            bad.append(f"snapshot {s} keys")
            continue
        diffs = [k for k in snap if snap[k] != other[k]]
        if diffs:
            mx = max((thaw(snap[k]).double() - thaw(other[k]).double()).abs().max().item() for k in diffs)
            bad.append(f"step {s}: {len(diffs)} tensors differ ({diffs[:3]}...), max {mx:.3g}")
    return bad


def growth(probes: dict, key: str, start: int):
    """(value at start, at mid, at end, slope per step over start..end) for probes[key]."""
    xs = sorted(s for s in probes if s >= start and key in probes[s])
    if len(xs) < 3:
        return None
    mid = xs[len(xs) // 2]
    v0, vm, v1 = probes[xs[0]][key], probes[mid][key], probes[xs[-1]][key]
    return v0, vm, v1, (v1 - v0) / (xs[-1] - xs[0]), xs[0], mid, xs[-1]


def summarize(name: str, res: dict, steps: int, out) -> list[str]:
    flags = []
    pr = res["probes"]
    start = 50 if steps >= 200 else 30
    p = lambda *a: print(*a, file=out)  # noqa: E731
    for key in ("rss", "objects", "objects_minus_report", "report_gc_objects", "tensors", "rt_objects", "rt_tensors", "rt_tensor_bytes", "report_steps",
                "plan_entries", "sightings", "pool_reserved", "pool_in_use", "pool_slabs", "live_groups"):
        g = growth(pr, key, start)
        if g is None:
            continue
        v0, vm, v1, slope, s0, sm, s1 = g
        p(f"  {name} {key:16s} @{s0}={v0} @{sm}={vm} @{s1}={v1} slope/step={slope:.3g}")
        steady = vm - v0 > 0 and v1 - vm > 0
        if key == "rss":
            if v1 - v0 > 4 << 20 and steady:
                flags.append(f"{key} grows {slope:.0f} B/step")
        elif key in ("report_steps", "report_gc_objects") or (key == "objects" and "objects_minus_report" in pr[s1]):
            pass
        elif steady and v1 > v0:
            flags.append(f"{key} grows {slope:.3g}/step ({v0}->{v1})")
    for key in ("rss", "objects_minus_report", "rt_objects"):
        ks = sorted(k for k in pr if key in pr[k])
        if ks:
            vals = [pr[k][key] for k in ks]
            if key == "rss":
                vals = [round(v / 1024) for v in vals]
            p(f"  {name} series {key}{' (KiB)' if key == 'rss' else ''} @{ks[0]}..@{ks[-1]} every {PROBE}: {vals}")
    # containers
    xs = sorted(s for s in pr if s >= start and "containers" in pr[s])
    if xs:
        c0, cm, c1 = pr[xs[0]]["containers"], pr[xs[len(xs) // 2]]["containers"], pr[xs[-1]]["containers"]
        for path in sorted(set(c0) | set(c1)):
            a, m, b = c0.get(path, 0), cm.get(path, 0), c1.get(path, 0)
            if b > a and m > a and b > m:
                p(f"  {name} container GROWS {path}: @{xs[0]}={a} @{xs[len(xs)//2]}={m} @{xs[-1]}={b}")
                if not path.startswith("REPORT("):
                    flags.append(f"container {path} {a}->{m}->{b}")
            elif b != a:
                p(f"  {name} container changes {path}: @{xs[0]}={a} @{xs[len(xs)//2]}={m} @{xs[-1]}={b}")
    t = res["times"]
    if len(t) >= 60:
        early, late = statistics.median(t[20:40]), statistics.median(t[-20:])
        p(f"  {name} host step time median steps 20-39: {early*1e3:.2f} ms, last 20: {late*1e3:.2f} ms (x{late/early:.2f})")
    return flags


def keep_budget(case: str) -> int:
    cfg = CASES[case]
    m = build(cfg.get("fail", False))
    rt = variant_runtime(m, "keep")
    b, t = cfg["shape"](0)
    if cfg.get("budget_at_max"):  # varying lengths: half keep's peak at the longest one
        b, t = max((cfg["shape"](s) for s in range(cfg["steps"])), key=lambda x: x[0] * x[1])
    with rt:
        torch.manual_seed(0)
        m(batch(0, b, t)).backward()
    return rt.report().steps[0].peak_activation_bytes // 2


def main() -> int:
    case, variant = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    out = sys.stdout
    cfg = CASES[case]
    log_buf = None
    if cfg.get("env"):
        os.environ["OFFRECOMP_REPORT"] = f"/tmp/sweep_soak/envreport_{variant}.jsonl"
        if os.path.exists(os.environ["OFFRECOMP_REPORT"]):
            os.remove(os.environ["OFFRECOMP_REPORT"])
        os.environ["OFFRECOMP_LOG"] = "INFO"
        log_buf = io.StringIO()
        logging.getLogger("offrecomp").addHandler(logging.StreamHandler(log_buf))
    proc = psutil.Process()
    t0 = time.time()
    ref = run(case, None, None, proc)
    print(f"[{case}/{variant}] plain done in {time.time()-t0:.1f}s", file=out)
    budget = keep_budget(case) if variant == "auto_tight" else None
    t1 = time.time()
    got = run(case, None if variant == "plain2" else variant, budget, proc)
    print(f"[{case}/{variant}] variant done in {time.time()-t1:.1f}s budget={budget}", file=out)
    bad = compare(ref, got)
    steps = int(os.environ.get("SOAK_STEPS", cfg["steps"]))
    summarize("plain", ref, steps, out)
    flags = summarize(variant, got, steps, out)
    if got["report"] is not None:
        rep = got["report"]
        phases = collections.Counter(s.phase for s in rep)
        print(f"  report: {len(rep)} records, phases {dict(phases)}", file=out)
        if budget:
            planned = [s for s in rep if s.phase in ("planned", "borrowed")]
            over = [s for s in planned if s.peak_activation_bytes > budget * 1.05]
            print(f"  planned/borrowed {len(planned)}, over 1.05x budget: {len(over)}"
                  + (f" max x{max(s.peak_activation_bytes for s in over)/budget:.2f}" if over else ""), file=out)
            if over:
                flags.append(f"{len(over)} planned steps over 1.05x budget")
        peaks = [s.peak_activation_bytes for s in rep]
        print(f"  peak_activation_bytes first/median/last: {peaks[0]}/{statistics.median(peaks)}/{peaks[-1]}", file=out)
        exp = steps
        if len(rep) != exp and not cfg.get("fail_every") and not cfg.get("recreate_every"):
            flags.append(f"report has {len(rep)} records, expected {exp}")
    print(f"  after: {got['after']}", file=out)
    if cfg.get("recreate_every") and variant != "plain2" and got["after"]["runtimes_alive"] > 1:
        flags.append(f"{got['after']['runtimes_alive']} runtimes still alive after gc")
    if log_buf is not None:
        text = log_buf.getvalue()
        print(f"  log: {len(text.splitlines())} lines, {len(text)} chars", file=out)
        path = os.environ["OFFRECOMP_REPORT"]
        if variant != "plain2":
            n = len(open(path).read().splitlines()) if os.path.exists(path) else 0
            print(f"  report file lines: {n}", file=out)
    status = "PASS" if not bad and not flags else ("FAIL" if bad else "FLAG")
    print(f"RESULT {case} {variant} {status} bitwise={'ok' if not bad else bad} flags={flags}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
