"""Fuzz scheduler/ (offrecomp's planner) with random and adversarial profiles.

Checked per instance (gen.py builds the profiles; every instance is seeded):
  no_raise       solve() raises only documented errors (InfeasibleBudgetError under
                 infeasible="error"); exhaustive_solve/simulate/lower_bound do not raise
  keys           placements name every storage key of the profile, nothing else
  legal          external -> KEEP only; input/root -> never RECOMPUTE; replayable=False ->
                 never RECOMPUTE; no link or allow_offload=False -> never OFFLOAD
  predict        predict(profile, plan) == the plan's predicted step/peak/fwd/rec/stall
  feasible_peak  feasible plan -> predicted (and simulated) peak <= budget
  infeasible     infeasible plan -> min_feasible <= its peak <= min_feasible * (1 +
                 FRUGAL_SLACK), the most frugal plan being the fastest that close to the
                 smallest peak (since 2026-12-05); solve(min_feasible) feasible;
                 infeasible="error" raises InfeasibleBudgetError with that number
  host_limit     simulated d2h_bytes <= host_limit_bytes (when > 0)
  lb_solve       lower_bound(profile, budget) <= solve's step (feasible plans);
                 plan.lower_bound_seconds == lower_bound(profile, budget)
  deterministic  a second solve on a deep copy gives the same placements and plan_id
  json           Profile.from_json(to_json) == profile and solves to the same plan
  monotone       over increasing budgets, feasibility never lost and step never grows
  offload_ge     solve(allow_offload=True) step <= solve(allow_offload=False) step
  overhead       budget None + max_overhead x: step <= keep*(1+x)(1+1e-12); peak
                 non-increasing in x; budget + max_overhead gives the same plan as budget
  (small only)   exhaustive: feasibility agrees, min_feasible agrees, solve step <=
                 exhaustive step * (1+1e-9) + 1e-12 (docs: matched on all pairs), lb <= exh
Modes:
  small  tiny profiles (<= 7 storages) against exhaustive_solve
  wide   1-60 regions, 0-50 storages per call, bytes 0..8 GB
Command (one process at a time; argv: MODE FIRST_SEED END_SEED [SECONDS]):
  cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/fuzz.py small 0 3000 330 > docs/results/cpu-2026-12-05ze/out_small_0.txt
  ... fuzz.py small 3000 100000 330 (out_small_1.txt); fuzz.py wide 0 100000 330 (out_wide_0.txt)
"""

from __future__ import annotations

import collections
import copy
import json
import logging
import math
import sys
from pathlib import Path
import time
import traceback

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gen.py beside this script

import numpy as np

from gen import gen_profile, n_storages
from scheduler.solver.api import FRUGAL_SLACK
from scheduler import (
    ROOT,
    InfeasibleBudgetError,
    Placement,
    Plan,
    Profile,
    exhaustive_solve,
    lower_bound,
    predict,
    simulate,
    solve,
)
from scheduler.flat import flatten

logging.getLogger("scheduler.solver").setLevel(logging.ERROR)

checks: collections.Counter[str] = collections.Counter()
fails: collections.Counter[str] = collections.Counter()
examples: dict[str, list[str]] = collections.defaultdict(list)
gaps: list[tuple[float, int, int | None]] = []
lb_gaps: list[float] = []


def check(name: str, ok: bool, msg: str = "") -> bool:
    checks[name] += 1
    if not ok:
        fails[name] += 1
        if len(examples[name]) < 8:
            examples[name].append(msg)
    return ok


def keys_of(p: Profile) -> set:
    ks = {(r.name, r.call_index, i) for r in p.regions for i in range(len(r.storages))}
    ks |= {(ROOT, 0, i) for i in range(len(p.root))}
    return ks


def check_plan(p: Profile, plan: Plan, budget, tag: str, allow_offload=True, prefetch=2) -> None:
    check("keys", set(plan.placements) == keys_of(p), f"{tag} keys differ")
    has_link = p.d2h_gbps > 0 and p.h2d_gbps > 0
    bad = []
    for r in p.regions:
        for i, s in enumerate(r.storages):
            pl = plan.placement((r.name, r.call_index, i))
            if s.kind == "external" and pl != Placement.KEEP:
                bad.append(("external", r.key, i, pl.name))
            if s.kind == "input" and pl == Placement.RECOMPUTE:
                bad.append(("input", r.key, i, pl.name))
            if not r.replayable and pl == Placement.RECOMPUTE:
                bad.append(("replayable=False", r.key, i, pl.name))
            if (not has_link or not allow_offload) and pl == Placement.OFFLOAD:
                bad.append(("no-offload", r.key, i, pl.name))
    for i in range(len(p.root)):
        pl = plan.placement((ROOT, 0, i))
        if pl == Placement.RECOMPUTE or ((not has_link or not allow_offload) and pl == Placement.OFFLOAD):
            bad.append(("root", i, pl.name))
    check("legal", not bad, f"{tag} {bad[:3]}")
    pr = predict(p, plan, prefetch_regions=prefetch)
    same = (pr.step_seconds, pr.peak_bytes, pr.forward_seconds, pr.recompute_seconds, pr.stall_seconds) == (
        plan.predicted_step_seconds, plan.predicted_peak_bytes, plan.predicted_forward_seconds,
        plan.predicted_recompute_seconds, plan.predicted_stall_seconds)
    check("predict", same, f"{tag} predict {pr} vs plan step={plan.predicted_step_seconds} peak={plan.predicted_peak_bytes}")
    check("finite", math.isfinite(plan.predicted_step_seconds) and plan.predicted_peak_bytes >= 0,
          f"{tag} step={plan.predicted_step_seconds} peak={plan.predicted_peak_bytes}")
    if budget is not None:
        if plan.feasible:
            check("feasible_peak", pr.peak_bytes <= budget, f"{tag} peak {pr.peak_bytes} > budget {budget}")
        else:
            # the most frugal plan: the fastest within FRUGAL_SLACK of the smallest peak
            low = plan.min_feasible_budget_bytes
            check("infeasible_min", low is not None and low > budget
                  and low <= plan.predicted_peak_bytes <= low + low * FRUGAL_SLACK,
                  f"{tag} min_feasible {low} peak {plan.predicted_peak_bytes} budget {budget}")
    if p.host_limit_bytes > 0:
        check("host_limit", pr.d2h_bytes <= p.host_limit_bytes, f"{tag} d2h {pr.d2h_bytes} > host_limit {p.host_limit_bytes}")


def lb_check(p: Profile, plan: Plan, budget, tag: str) -> None:
    if budget is None or not plan.feasible:
        return
    lb = lower_bound(p, budget)
    check("lb_field", plan.lower_bound_seconds == lb, f"{tag} plan.lower_bound {plan.lower_bound_seconds} vs {lb}")
    st = plan.predicted_step_seconds
    check("lb_solve", lb <= st * (1 + 1e-9) + 1e-12, f"{tag} lb {lb!r} > solve step {st!r} (rel {lb / st - 1 if st else lb:.3e})")
    if st > 0 and math.isfinite(lb):
        lb_gaps.append(st / lb - 1 if lb > 0 else 0.0)


def solve_checked(p, tag, **kw):
    try:
        return solve(p, log_infeasible=False, **kw)
    except InfeasibleBudgetError:
        raise
    except Exception as e:  # noqa: BLE001
        check("no_raise", False, f"{tag} solve({kw}) raised {type(e).__name__}: {e}\n{traceback.format_exc()[-800:]}")
        return None


def budgets_for(p: Profile, keep_peak: int, floor: int, rng) -> list[int]:
    bs = {0, max(floor - 1, 0), floor, keep_peak, keep_peak + 1, max(keep_peak - 1, 0)}
    for _ in range(4):
        bs.add(int(floor + (keep_peak - floor) * rng.random()) if keep_peak > floor else floor)
    return sorted(bs)


def run_instance(seed: int, mode: str) -> None:
    rng = np.random.default_rng(seed)
    if mode == "small":
        p = gen_profile(seed, max_regions=3, max_storages=3, max_ops=4, mode="tiny", total_storage_cap=7)
    else:
        p = gen_profile(seed, max_regions=60, max_storages=50, max_ops=40, mode="wide", total_storage_cap=3000)
    tag0 = f"[{mode} seed={seed} n_st={n_storages(p)} regions={len(p.regions)}]"
    prefetch = int(rng.choice([2, 2, 2, 0, 1, 4]))
    try:
        keep = simulate(p, Plan(), prefetch_regions=prefetch)
    except Exception as e:  # noqa: BLE001
        check("no_raise", False, f"{tag0} simulate(keep) raised {type(e).__name__}: {e}")
        return
    # the floor from solve(budget=0)
    p0 = solve_checked(p, tag0 + " b=0", budget_bytes=0, prefetch_regions=prefetch)
    if p0 is None:
        return
    check_plan(p, p0, 0, tag0 + " b=0", prefetch=prefetch)
    floor = p0.min_feasible_budget_bytes if not p0.feasible else p0.predicted_peak_bytes
    budgets = budgets_for(p, keep.peak_bytes, floor, rng)
    plans = {}
    for b in budgets:
        tag = f"{tag0} prefetch={prefetch} budget={b}"
        pl = solve_checked(p, tag, budget_bytes=b, prefetch_regions=prefetch)
        if pl is None:
            continue
        plans[b] = pl
        check_plan(p, pl, b, tag, prefetch=prefetch)
        try:
            lb_check(p, pl, b, tag) if prefetch == 2 else None
        except Exception as e:  # noqa: BLE001
            check("no_raise", False, f"{tag} lower_bound raised {type(e).__name__}: {e}")
        if not pl.feasible:
            try:
                solve(p, budget_bytes=b, prefetch_regions=prefetch, infeasible="error")
                check("infeasible_error", False, f"{tag} infeasible='error' did not raise")
            except InfeasibleBudgetError as e:
                check("infeasible_error", e.min_feasible_bytes == pl.min_feasible_budget_bytes, f"{tag} error says {e.min_feasible_bytes}")
            again = solve_checked(p, tag, budget_bytes=pl.min_feasible_budget_bytes, prefetch_regions=prefetch)
            if again is not None:
                check("min_feasible_is_feasible", again.feasible, f"{tag} solve(min_feasible={pl.min_feasible_budget_bytes}) infeasible, peak {again.predicted_peak_bytes}")
        # no-offload never faster
        if p.d2h_gbps > 0 and p.h2d_gbps > 0:
            no = solve_checked(p, tag, budget_bytes=b, prefetch_regions=prefetch, allow_offload=False)
            if no is not None:
                check_plan(p, no, b, tag + " no-offload", allow_offload=False, prefetch=prefetch)
                if no.feasible:
                    check("offload_ge", pl.feasible and pl.predicted_step_seconds <= no.predicted_step_seconds,
                          f"{tag} may-offload feasible={pl.feasible} step={pl.predicted_step_seconds!r} > no-offload step={no.predicted_step_seconds!r}")
    # monotone in budget
    prev = None
    for b in sorted(plans):
        pl = plans[b]
        if prev is not None:
            pb, pp = prev
            if pp.feasible:
                check("monotone", pl.feasible and pl.predicted_step_seconds <= pp.predicted_step_seconds,
                      f"{tag0} prefetch={prefetch} budget {pb}->{b}: step {pp.predicted_step_seconds!r} -> {pl.predicted_step_seconds!r} feasible {pl.feasible}")
        prev = (b, pl)
    # determinism + json on one budget in the middle
    bmid = budgets[len(budgets) // 2]
    if bmid in plans:
        q = copy.deepcopy(p)
        again = solve_checked(q, tag0 + " det", budget_bytes=bmid, prefetch_regions=prefetch)
        if again is not None:
            check("deterministic", again.placements == plans[bmid].placements and again.plan_id == plans[bmid].plan_id,
                  f"{tag0} budget={bmid} second solve differs")
        try:
            rt = Profile.from_json(p.to_json())
            check("json_eq", rt == p, f"{tag0} round trip differs")
            pj = solve_checked(rt, tag0 + " json", budget_bytes=bmid, prefetch_regions=prefetch)
            if pj is not None:
                check("json_plan", pj.placements == plans[bmid].placements and pj.plan_id == plans[bmid].plan_id,
                      f"{tag0} budget={bmid} plan after JSON differs")
        except Exception as e:  # noqa: BLE001
            check("no_raise", False, f"{tag0} json raised {type(e).__name__}: {e}")
    # max_overhead
    peaks_prev = None
    for x in (0.0, 0.01, 0.1, 0.5, 2.0):
        tag = f"{tag0} prefetch={prefetch} budget=None max_overhead={x}"
        pl = solve_checked(p, tag, budget_bytes=None, max_overhead=x, prefetch_regions=prefetch)
        if pl is None:
            continue
        check_plan(p, pl, None, tag, prefetch=prefetch)
        check("overhead_limit", pl.predicted_step_seconds <= keep.step_seconds * (1 + x) * (1 + 1e-9) + 1e-15,
              f"{tag} step {pl.predicted_step_seconds!r} > keep {keep.step_seconds!r} * {1 + x}")
        if peaks_prev is not None:
            check("overhead_monotone", pl.predicted_peak_bytes <= peaks_prev, f"{tag} peak {pl.predicted_peak_bytes} > {peaks_prev} at smaller overhead")
        peaks_prev = pl.predicted_peak_bytes
    if bmid in plans:
        x = float(rng.choice([0.0, 0.05, 1.0]))
        pl = solve_checked(p, tag0 + " b+ovh", budget_bytes=bmid, max_overhead=x, prefetch_regions=prefetch)
        if pl is not None:
            check("overhead_budget_same", pl.placements == plans[bmid].placements, f"{tag0} budget={bmid} max_overhead={x} changes the plan")
    # exhaustive
    if mode == "small":
        for b in budgets:
            if b not in plans:
                continue
            pl = plans[b]
            tag = f"{tag0} prefetch={prefetch} budget={b}"
            try:
                ex = exhaustive_solve(p, b, prefetch_regions=prefetch)
            except ValueError as e:
                check("exh_size", False, f"{tag} {e}")
                continue
            check("exh_feasible_agree", ex.feasible == pl.feasible, f"{tag} exhaustive feasible={ex.feasible} (peak {ex.predicted_peak_bytes}) solve feasible={pl.feasible} (peak {pl.predicted_peak_bytes})")
            if ex.feasible and pl.feasible:
                es, ss = ex.predicted_step_seconds, pl.predicted_step_seconds
                ok = ss <= es * (1 + 1e-9) + 1e-12
                check("exh_gap", ok, f"{tag} solve step {ss!r} > exhaustive {es!r} (gap {ss / es - 1 if es else ss:.4g})")
                gaps.append(((ss / es - 1) if es > 0 else (0.0 if ss == 0 else math.inf), seed, b))
                if prefetch == 2:
                    lb = lower_bound(p, b)
                    check("lb_exh", lb <= es * (1 + 1e-9) + 1e-12, f"{tag} lb {lb!r} > exhaustive {es!r}")
            elif not ex.feasible and not pl.feasible:
                check("exh_min_feasible", ex.min_feasible_budget_bytes == pl.min_feasible_budget_bytes,
                      f"{tag} min_feasible exhaustive {ex.min_feasible_budget_bytes} solve {pl.min_feasible_budget_bytes}")
        # no-offload exhaustive too
        if p.d2h_gbps > 0 and p.h2d_gbps > 0:
            b = budgets[len(budgets) // 2]
            ex = exhaustive_solve(p, b, prefetch_regions=prefetch, allow_offload=False)
            pl = solve(p, budget_bytes=b, prefetch_regions=prefetch, allow_offload=False, log_infeasible=False)
            check("exh_noofl_feasible_agree", ex.feasible == pl.feasible, f"{tag0} no-offload budget={b} ex {ex.feasible} solve {pl.feasible}")
            if ex.feasible and pl.feasible:
                check("exh_noofl_gap", pl.predicted_step_seconds <= ex.predicted_step_seconds * (1 + 1e-9) + 1e-12,
                      f"{tag0} no-offload budget={b} solve {pl.predicted_step_seconds!r} > exh {ex.predicted_step_seconds!r}")


def main() -> None:
    mode, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    t_end = time.time() + float(sys.argv[4]) if len(sys.argv) > 4 else math.inf
    t0 = time.time()
    done = 0
    for seed in range(lo, hi):
        if time.time() > t_end:
            break
        try:
            run_instance(seed, mode)
        except Exception as e:  # noqa: BLE001
            check("no_raise", False, f"[{mode} seed={seed}] harness: {type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}")
        done += 1
    print(f"mode={mode} seeds {lo}..{lo + done - 1} ({done} instances) in {time.time() - t0:.1f} s")
    print("invariant                      checks   violations")
    for k in sorted(checks):
        print(f"{k:28s} {checks[k]:8d} {fails[k]:8d}")
    if gaps:
        g = np.asarray([x[0] for x in gaps])
        print(f"\nexhaustive gap (solve/exh - 1) over {len(g)} feasible pairs: exact(<=1e-9) {np.sum(g <= 1e-9)}, "
              f">1e-9 {np.sum(g > 1e-9)}, >1% {np.sum(g > 0.01)}, >10% {np.sum(g > 0.1)}, max {g.max():.4g}")
        worst = sorted(gaps, key=lambda x: -x[0])[:10]
        print("worst gaps:", [(round(a, 5), s, b) for a, s, b in worst if a > 1e-9])
    if lb_gaps:
        g = np.asarray(lb_gaps)
        print(f"\nsolve/lower_bound - 1 over {len(g)} feasible plans: median {np.median(g):.4g}, p90 {np.quantile(g, 0.9):.4g}, max {g.max():.4g}")
    for k, ex in examples.items():
        print(f"\n== {k}: {fails[k]} violation(s); first {len(ex)}:")
        for m in ex:
            print("  ", m)


if __name__ == "__main__":
    main()
