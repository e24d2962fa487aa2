"""Edge cases, invalid numbers, the cost model and solve() timing for scheduler/.

Parts (argv[1]): edge | nan | costmodel | timing
  edge       empty profile, one storage of each kind, all-zero times, enormous storages,
             budgets 0 / exactly frugal / exactly keep, each through solve, exhaustive_solve,
             simulate, lower_bound; results checked as in fuzz.py (feasible peak <= budget,
             prediction == simulation, lb <= step)
  nan        NaN / inf / negative / wrong-type values in every numeric field of a valid
             profile (and in solve's arguments): each must raise ValueError/TypeError naming
             the field; a returned plan (silent acceptance) is reported
  costmodel  CostModel.update with N identical copies of random profiles (fuzz gen,
             alpha random): estimate == profile?, drift == 0?, same plan as the profile?
  timing     solve() wall time on the bench_solver GPT profiles (1k, 10k storages) and on
             random gen.py profiles of ~1k / ~10k storages
Command: cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/edge.py PART > docs/results/cpu-2026-12-05ze/out_PART.txt
"""

from __future__ import annotations

import copy
import logging
import math
import random
import statistics
import sys
from pathlib import Path
import time
import traceback

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gen.py beside this script

from gen import gen_profile, n_storages
from scheduler import (
    CostModel,
    OpRecord,
    Plan,
    Profile,
    RegionRecord,
    StorageRecord,
    exhaustive_solve,
    gpt_profile,
    lower_bound,
    predict,
    simulate,
    solve,
)

logging.getLogger("scheduler.solver").setLevel(logging.ERROR)
problems: list[str] = []


def report(msg: str) -> None:
    problems.append(msg)
    print("PROBLEM:", msg)


def consistent(p: Profile, label: str, budgets=None) -> None:
    try:
        keep = simulate(p, Plan())
        s0 = solve(p, budget_bytes=0)
        frugal = s0.predicted_peak_bytes
        bl = budgets if budgets is not None else sorted({0, frugal, max(frugal - 1, 0), keep.peak_bytes, max(keep.peak_bytes - 1, 0)})
        for b in bl:
            pl = solve(p, budget_bytes=b)
            pr = predict(p, pl)
            if (pr.step_seconds, pr.peak_bytes) != (pl.predicted_step_seconds, pl.predicted_peak_bytes):
                report(f"{label} b={b}: predict {pr.step_seconds},{pr.peak_bytes} != plan {pl.predicted_step_seconds},{pl.predicted_peak_bytes}")
            if pl.feasible and pr.peak_bytes > b:
                report(f"{label} b={b}: feasible but peak {pr.peak_bytes}")
            if pl.feasible:
                lb = lower_bound(p, b)
                if lb > pl.predicted_step_seconds * (1 + 1e-9) + 1e-12:
                    report(f"{label} b={b}: lb {lb} > step {pl.predicted_step_seconds}")
            if not (math.isfinite(pl.predicted_step_seconds) and pl.predicted_peak_bytes >= 0):
                report(f"{label} b={b}: non-finite/negative prediction {pl.predicted_step_seconds} {pl.predicted_peak_bytes}")
            try:
                ex = exhaustive_solve(p, b, max_plans=20000)
                if ex.feasible != pl.feasible:
                    report(f"{label} b={b}: exhaustive feasible {ex.feasible} solve {pl.feasible}")
                elif ex.feasible and pl.predicted_step_seconds > ex.predicted_step_seconds * (1 + 1e-9) + 1e-12:
                    report(f"{label} b={b}: solve {pl.predicted_step_seconds} > exhaustive {ex.predicted_step_seconds}")
            except ValueError:
                pass
        print(f"ok-checked {label}: keep peak {keep.peak_bytes} step {keep.step_seconds} frugal {frugal} budgets {bl}")
        for x in (0.0, 0.1):
            solve(p, budget_bytes=None, max_overhead=x)
    except Exception as e:  # noqa: BLE001
        report(f"{label}: raised {type(e).__name__}: {e}\n{traceback.format_exc()[-600:]}")


def region(name="l0", nbytes=100, kind="activation", fwd=1.0, bwd=2.0, ops=True, **kw) -> RegionRecord:
    o = [OpRecord(seconds=fwd, skippable=True, outputs=(0,), reads=())] if ops else []
    prod = 0 if (ops and kind == "activation") else -1
    return RegionRecord(
        name=name, call_index=0, start_seconds=0.0, forward_seconds=fwd, backward_seconds=bwd, ops=o,
        storages=[StorageRecord(nbytes=nbytes, kind=kind, producer_op=prod, first_save_op=1 if ops else 0,
                                last_save_op=1 if ops else 0, offset_seconds=fwd)],
        **kw,
    )


def part_edge() -> None:
    consistent(Profile(signature="empty"), "empty profile (no regions)")
    consistent(Profile(signature="empty-link", d2h_gbps=10, h2d_gbps=10, forward_seconds=1.0), "empty profile with link")
    consistent(Profile(signature="r0", regions=[RegionRecord(name="a", call_index=0, start_seconds=0, forward_seconds=0, backward_seconds=0)]), "one region without storages")
    for kind in ("activation", "input", "external"):
        for link in (0.0, 1e-7):
            consistent(Profile(signature="one", d2h_gbps=link, h2d_gbps=link, regions=[region(kind=kind)]), f"one {kind} storage link={link}")
    consistent(Profile(signature="root", d2h_gbps=1e-7, h2d_gbps=1e-7, root=[StorageRecord(nbytes=100)]), "root storage only, link")
    consistent(Profile(signature="root0", root=[StorageRecord(nbytes=100)]), "root storage only, no link")
    # all-zero times
    for link in (0.0, 10.0):
        p = gen_profile(11, max_regions=3, max_storages=3, max_ops=4, mode="tiny")
        for r in p.regions:
            r.forward_seconds = r.backward_seconds = r.start_seconds = 0.0
            for o in r.ops:
                o.seconds = 0.0
            for s in r.storages:
                s.offset_seconds = 0.0
        for s in p.root:
            s.offset_seconds = 0.0
        p.forward_seconds = p.backward_seconds = 0.0
        p.d2h_gbps = p.h2d_gbps = link
        consistent(p, f"all-zero times link={link}")
    # zero-byte storages only
    consistent(Profile(signature="z", d2h_gbps=1.0, h2d_gbps=1.0, regions=[region(nbytes=0), region(name="l1", nbytes=0)]), "zero-byte storages")
    # enormous storages
    for nb in (8 * 10**9, 2**40, 2**53 + 1, 2**62):
        consistent(Profile(signature="big", d2h_gbps=50, h2d_gbps=50, regions=[region(nbytes=nb), region(name="l1", nbytes=100)]), f"enormous storage {nb}")
    # int64 overflow of the total
    p = Profile(signature="ovf", regions=[region(name=f"l{i}", nbytes=2**62) for i in range(3)])
    try:
        t = simulate(p, Plan())
        tot = p.activation_bytes
        if t.peak_bytes != tot:
            report(f"three storages of 2**62 B (total {tot}): simulate(keep).peak_bytes = {t.peak_bytes} (no error)")
        pl = solve(p, budget_bytes=2**62)
        print("ovf plan", pl.feasible, pl.predicted_peak_bytes)
    except Exception as e:  # noqa: BLE001
        print(f"three storages of 2**62 B: raised {type(e).__name__}: {e}")
    for nb in (2**63, 2**64):
        try:
            simulate(Profile(signature="b", regions=[region(nbytes=nb)]), Plan())
            report(f"nbytes={nb}: accepted")
        except Exception as e:  # noqa: BLE001
            print(f"nbytes={nb}: {type(e).__name__}: {e}")
            if not isinstance(e, (ValueError, TypeError, OverflowError)) or not str(e):
                report(f"nbytes={nb} rejected unclearly: {type(e).__name__}: {e!r}")
    # random profiles at exactly the frugal / keep budgets and budget 0 (also in fuzz.py)
    for seed in range(40):
        p = gen_profile(10_000 + seed, max_regions=5, max_storages=4, max_ops=6, mode="tiny", total_storage_cap=7)
        consistent(p, f"gen seed {10_000 + seed}")


def nan_cases():
    """(label, mutate(profile)) pairs; the profile: gpt-like small profile with a link."""
    bad = [math.nan, math.inf, -math.inf, -1.0]
    prof_fields = ["forward_seconds", "backward_seconds", "d2h_gbps", "h2d_gbps", "replay_op_seconds",
                   "pack_host_seconds", "unpack_host_seconds", "capture_host_seconds",
                   "offload_host_seconds", "reload_host_seconds", "replay_host_seconds", "host_limit_bytes"]
    for f in prof_fields:
        for v in bad:
            yield f"profile.{f}={v}", (lambda p, f=f, v=v: setattr(p, f, v))
    yield "profile.host_limit_bytes=1.5", (lambda p: setattr(p, "host_limit_bytes", 1.5))
    reg_fields = ["forward_seconds", "backward_seconds", "start_seconds", "host_seconds", "backward_host_seconds"]
    for f in reg_fields:
        for v in bad:
            yield f"region.{f}={v}", (lambda p, f=f, v=v: setattr(p.regions[1], f, v))
    for v in bad:
        yield f"op.seconds={v}", (lambda p, v=v: setattr(p.regions[1].ops[2], "seconds", v))
        yield f"storage.offset_seconds={v}", (lambda p, v=v: setattr(p.regions[1].storages[2], "offset_seconds", v))
        yield f"root.offset_seconds={v}", (lambda p, v=v: setattr(p.root[0], "offset_seconds", v))
        yield f"storage.nbytes={v}", (lambda p, v=v: setattr(p.regions[1].storages[2], "nbytes", v))
        yield f"root.nbytes={v}", (lambda p, v=v: setattr(p.root[0], "nbytes", v))
        yield f"storage.saves={v}", (lambda p, v=v: setattr(p.regions[1].storages[2], "saves", v))
    for f in ("nbytes", "first_save_op", "last_save_op", "producer_op", "saves"):
        yield f"storage.{f}=2.0(float)", (lambda p, f=f: setattr(p.regions[1].storages[2], f, 2.0))
        yield f"storage.{f}=-5", (lambda p, f=f: setattr(p.regions[1].storages[2], f, -5))
        yield f"storage.{f}=10**6", (lambda p, f=f: setattr(p.regions[1].storages[2], f, 10**6))
    yield "storage.first_save_op > last_save_op", (lambda p: setattr(p.regions[1].storages[2], "first_save_op", p.regions[1].storages[2].last_save_op + 3))
    yield "storage.producer_op >= last_save_op", (lambda p: setattr(p.regions[1].storages[2], "producer_op", len(p.regions[1].ops) - 1) or setattr(p.regions[1].storages[2], "last_save_op", 0))
    yield "storage.kind=None", (lambda p: setattr(p.regions[1].storages[2], "kind", None))
    yield "op.reads=(99,)", (lambda p: setattr(p.regions[1].ops[2], "reads", (99,)))
    yield "op.reads=(5,) later op", (lambda p: setattr(p.regions[1].ops[2], "reads", (5,)))
    yield "op.reads=(2,) itself", (lambda p: setattr(p.regions[1].ops[2], "reads", (2,)))
    yield "op.outputs=(99,)", (lambda p: setattr(p.regions[1].ops[2], "outputs", (99,)))
    yield "storage.shared_with=(nonexistent)", (lambda p: setattr(p.regions[1].storages[0], "shared_with", ("nope", 0, 0)))
    yield "storage.shared_with=(later region)", (lambda p: setattr(p.regions[1].storages[0], "shared_with", (p.regions[3].name, 0, 0)))
    yield "storage.shared_with=(itself)", (lambda p: setattr(p.regions[1].storages[0], "shared_with", (p.regions[1].name, 0, 0)))
    yield "region.call_index=-1", (lambda p: setattr(p.regions[1], "call_index", -1))


def base_profile() -> Profile:
    p = gpt_profile(layers=4, hidden=256, heads=4, seq=128, batch=1, device_tflops=100, d2h_gbps=10, h2d_gbps=10)
    p.root = [StorageRecord(nbytes=1000, offset_seconds=0.0)]
    return p


def part_nan() -> None:
    base = base_profile()
    budget = base.activation_bytes // 3
    ref = solve(base, budget_bytes=budget)
    print(f"base: {n_storages(base)} storages, budget {budget}, plan feasible {ref.feasible} step {ref.predicted_step_seconds}")
    rows = []
    for label, mut in nan_cases():
        p = copy.deepcopy(base)
        mut(p)
        outcome = {}
        for fn_name, fn in (("solve", lambda q: solve(q, budget_bytes=budget)), ("simulate", lambda q: simulate(q, Plan())),
                            ("lower_bound", lambda q: lower_bound(q, budget))):
            try:
                r = fn(p)
                if fn_name == "solve":
                    desc = f"RETURNED plan feasible={r.feasible} step={r.predicted_step_seconds!r} peak={r.predicted_peak_bytes} lb={r.lower_bound_seconds!r} same_as_base={r.placements == ref.placements}"
                elif fn_name == "simulate":
                    desc = f"RETURNED step={r.step_seconds!r} peak={r.peak_bytes}"
                else:
                    desc = f"RETURNED {r!r}"
                outcome[fn_name] = ("accepted", desc)
            except (ValueError, TypeError) as e:
                outcome[fn_name] = ("rejected", f"{type(e).__name__}: {str(e)[:150]}")
            except Exception as e:  # noqa: BLE001
                outcome[fn_name] = ("crash", f"{type(e).__name__}: {str(e)[:150]!r}")
        rows.append((label, outcome))
        status = {k: v[0] for k, v in outcome.items()}
        print(f"{label:45s} {status}")
        for k, (st, d) in outcome.items():
            if st != "rejected":
                print(f"      {k}: {d}")
            else:
                print(f"      {k}: {d[:120]}")
    # solve's arguments
    for label, kw in (("budget_bytes=nan", {"budget_bytes": math.nan}), ("budget_bytes=inf", {"budget_bytes": math.inf}),
                      ("budget_bytes=1e9 float", {"budget_bytes": 1e9}), ("max_overhead=nan", {"budget_bytes": None, "max_overhead": math.nan}),
                      ("max_overhead=inf", {"budget_bytes": None, "max_overhead": math.inf}),
                      ("prefetch_regions=-1", {"budget_bytes": budget, "prefetch_regions": -1}),
                      ("prefetch_regions=1.5", {"budget_bytes": budget, "prefetch_regions": 1.5}),
                      ("prefetch_regions=nan", {"budget_bytes": budget, "prefetch_regions": math.nan}),
                      ("budget_bytes=True", {"budget_bytes": True}), ("max_overhead=True", {"budget_bytes": None, "max_overhead": True})):
        try:
            r = solve(base, **kw)
            print(f"solve({label}): RETURNED feasible={r.feasible} step={r.predicted_step_seconds}")
        except (ValueError, TypeError) as e:
            print(f"solve({label}): rejected {type(e).__name__}: {str(e)[:120]}")
        except Exception as e:  # noqa: BLE001
            print(f"solve({label}): CRASH {type(e).__name__}: {e!r}"[:200])
    for label, b in (("lower_bound(budget=nan)", math.nan), ("lower_bound(budget=-1)", -1), ("lower_bound(budget=1.5)", 1.5)):
        try:
            print(label, "RETURNED", lower_bound(base, b))
        except (ValueError, TypeError) as e:
            print(label, "rejected", type(e).__name__, str(e)[:100])


def part_costmodel() -> None:
    rng = random.Random(7)
    n_inst = 0
    not_equal = drift_nonzero = plan_diff = 0
    worst_rel = 0.0
    for seed in range(200):
        p = gen_profile(20_000 + seed, max_regions=8, max_storages=6, max_ops=8, mode="wide" if seed % 2 else "tiny")
        alpha = rng.choice([0.3, 0.1, 0.5, 1.0, rng.uniform(0.01, 1.0)])
        cm = CostModel(alpha=alpha)
        for _ in range(rng.choice([2, 5, 30])):
            cm.update(copy.deepcopy(p))
        est = cm.estimate()
        n_inst += 1
        d = cm.drift(p)
        if est != p:
            not_equal += 1
            # largest relative difference over times
            diffs = [abs(a - b) / max(abs(b), 1e-300) for a, b in _times(est, p)]
            worst_rel = max(worst_rel, max(diffs) if diffs else 0.0)
        if d != 0.0:
            drift_nonzero += 1
            if drift_nonzero <= 5:
                print(f"seed {20_000 + seed} alpha {alpha}: drift of an identical profile = {d!r}")
        keep = simulate(p, Plan()).peak_bytes
        for b in (keep // 2, keep // 4):
            a1 = solve(p, budget_bytes=b)
            a2 = solve(est, budget_bytes=b)
            if a1.placements != a2.placements:
                plan_diff += 1
                if plan_diff <= 5:
                    print(f"seed {20_000 + seed} alpha {alpha} budget {b}: plan from estimate differs: step {a1.predicted_step_seconds!r} vs {a2.predicted_step_seconds!r}")
    print(f"costmodel: {n_inst} instances; estimate != profile in {not_equal} (worst relative time diff {worst_rel:.3g}); "
          f"drift != 0 in {drift_nonzero}; plan from estimate differs in {plan_diff} of {2 * n_inst} solves")
    # drift on NaN / negative times
    p = base_profile()
    cm = CostModel()
    cm.update(p)
    q = copy.deepcopy(p)
    q.regions[0].forward_seconds = math.nan
    print("drift with a NaN region time:", cm.drift(q))
    q = copy.deepcopy(p)
    q.regions[0].forward_seconds = math.inf
    print("drift with an inf region time:", cm.drift(q))
    try:
        cm.update(q)
        print("update with an inf region time: accepted; estimate forward of region 0 =", cm.estimate().regions[0].forward_seconds)
        q2 = copy.deepcopy(p)
        q2.regions[0].forward_seconds = math.nan
        cm.update(q2)
        print("update with a NaN region time: accepted; estimate region 0 forward =", cm.estimate().regions[0].forward_seconds)
        for _ in range(20):
            cm.update(copy.deepcopy(p))
        print("after 20 clean updates: region 0 forward =", cm.estimate().regions[0].forward_seconds, "drift(clean) =", cm.drift(p))
    except Exception as e:  # noqa: BLE001
        print("update raised", type(e).__name__, e)


def _times(a: Profile, b: Profile):
    yield a.forward_seconds, b.forward_seconds
    yield a.backward_seconds, b.backward_seconds
    for ra, rb in zip(a.regions, b.regions):
        yield ra.forward_seconds, rb.forward_seconds
        yield ra.backward_seconds, rb.backward_seconds
        yield ra.start_seconds, rb.start_seconds
        for oa, ob in zip(ra.ops, rb.ops):
            yield oa.seconds, ob.seconds
        for sa, sb in zip(ra.storages, rb.storages):
            yield sa.offset_seconds, sb.offset_seconds


def part_timing() -> None:
    rows = []
    for label, layers in (("gpt-1k", 67), ("gpt-10k", 667)):
        p = gpt_profile(layers=layers, hidden=4096, heads=32, seq=8192, batch=1, device_tflops=990, d2h_gbps=50, h2d_gbps=50)
        b = int(p.activation_bytes * 0.3)
        solve(p, budget_bytes=b)
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            pl = solve(p, budget_bytes=b)
            ts.append(time.perf_counter() - t)
        rows.append((label, n_storages(p), statistics.median(ts), min(ts), pl.predicted_step_seconds / pl.lower_bound_seconds - 1))
    for target, cap, seeds in (("rand-1k", 1000, range(30_000, 30_012)), ("rand-10k", 10_000, range(31_000, 31_006))):
        for seed in seeds:
            p = gen_profile(seed, max_regions=400 if cap > 1000 else 60, max_storages=50, max_ops=40, mode="wide", total_storage_cap=cap)
            keep = simulate(p, Plan()).peak_bytes
            ts = []
            for frac in (0.3, 0.6):
                t = time.perf_counter()
                pl = solve(p, budget_bytes=int(keep * frac))
                ts.append(time.perf_counter() - t)
            rows.append((f"{target} seed {seed}", n_storages(p), max(ts), min(ts), float("nan")))
    print(f"{'profile':22s} {'storages':>8s} {'median/max s':>12s} {'min s':>8s} {'vs bound':>8s}")
    for r in rows:
        print(f"{r[0]:22s} {r[1]:8d} {r[2]:12.4f} {r[3]:8.4f} {r[4]:8.4f}")


if __name__ == "__main__":
    {"edge": part_edge, "nan": part_nan, "costmodel": part_costmodel, "timing": part_timing}[sys.argv[1]]()
    print(f"\n{len(problems)} problem(s)")
    for m in problems:
        print(" -", m.splitlines()[0])
