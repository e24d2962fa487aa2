"""Greedy shrinker for failing profiles: applies simplifying edits while a predicate holds.

    cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/shrink.py NAME SEED [MODE [BUDGET PREFETCH]]
    (NAME: frugal, cm or gap, the predicates below; prints the shrunk JSON), e.g.
    ... shrink.py frugal 3 small > shrunk_frugal_3.json; ... shrink.py gap 5846 small 90 2 > shrunk_gap_5846.json
"""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gen.py beside this script

from gen import gen_profile
from scheduler import Profile, exhaustive_solve, lower_bound, solve
from scheduler.profile import StorageRecord

logging.getLogger("scheduler.solver").setLevel(logging.ERROR)

HOST = ("pack_host_seconds", "unpack_host_seconds", "capture_host_seconds", "offload_host_seconds",
        "reload_host_seconds", "replay_host_seconds", "replay_op_seconds")


def _fix_shared_region_removed(p: Profile, key: tuple[str, int]) -> None:
    for r in p.regions:
        for s in r.storages:
            if s.shared_with is not None and (s.shared_with[0], s.shared_with[1]) == key:
                s.shared_with = None


def edits(p: Profile):
    """Yield candidate simplified profiles (deep copies)."""
    for i in range(len(p.root)):
        q = copy.deepcopy(p)
        del q.root[i]
        for r in q.regions:
            for s in r.storages:
                if s.shared_with is not None and s.shared_with[0] == "":
                    if s.shared_with[2] == i:
                        s.shared_with = None
                    elif s.shared_with[2] > i:
                        s.shared_with = ("", 0, s.shared_with[2] - 1)
        yield q
    for k in range(len(p.regions)):
        q = copy.deepcopy(p)
        r = q.regions.pop(k)
        _fix_shared_region_removed(q, r.key)
        yield q
    for k, r in enumerate(p.regions):
        for i in range(len(r.storages)):
            q = copy.deepcopy(p)
            rr = q.regions[k]
            del rr.storages[i]
            for op in rr.ops:
                op.outputs = tuple(-1 if o == i else (o - 1 if o > i else o) for o in op.outputs)
            for r2 in q.regions:
                for s in r2.storages:
                    if s.shared_with is not None and (s.shared_with[0], s.shared_with[1]) == rr.key:
                        if s.shared_with[2] == i:
                            s.shared_with = None
                        elif s.shared_with[2] > i:
                            s.shared_with = (s.shared_with[0], s.shared_with[1], s.shared_with[2] - 1)
            yield q
        # drop the last op
        if r.ops:
            q = copy.deepcopy(p)
            rr = q.regions[k]
            n = len(rr.ops) - 1
            rr.ops.pop()
            for op in rr.ops:
                if op.reads is not None:
                    op.reads = tuple(x for x in op.reads if x < n)
            for s in rr.storages:
                if s.producer_op >= n:
                    s.producer_op = -1
                s.last_save_op = min(s.last_save_op, n)
                s.first_save_op = min(s.first_save_op, s.last_save_op)
            rr.forward_seconds = sum(o.seconds for o in rr.ops) if rr.ops else rr.forward_seconds
            yield q
    for name in HOST:
        if getattr(p, name):
            q = copy.deepcopy(p)
            setattr(q, name, 0.0)
            yield q
    for name, val in (("native_keep", False), ("host_limit_bytes", 0), ("backward_seconds", 0.0)):
        if getattr(p, name) != val:
            q = copy.deepcopy(p)
            setattr(q, name, val)
            yield q
    if p.forward_seconds > 0:
        q = copy.deepcopy(p)
        q.forward_seconds = 0.0
        yield q
    for k, r in enumerate(p.regions):
        for attr, val in (("host_seconds", None), ("backward_host_seconds", None), ("opaque", False), ("replayable", True)):
            if getattr(r, attr) != val:
                q = copy.deepcopy(p)
                setattr(q.regions[k], attr, val)
                yield q
        if any(op.reads is not None for op in r.ops):
            q = copy.deepcopy(p)
            for op in q.regions[k].ops:
                op.reads, op.sink, op.view = None, False, False
            yield q
        for j, op in enumerate(r.ops):
            for attr, val in (("sink", False), ("view", False), ("skippable", True), ("seconds", 1.0), ("seconds", 0.0)):
                if getattr(op, attr) != val:
                    q = copy.deepcopy(p)
                    setattr(q.regions[k].ops[j], attr, val)
                    yield q
            if op.reads:
                q = copy.deepcopy(p)
                q.regions[k].ops[j].reads = ()
                yield q
            if -1 in op.outputs:
                q = copy.deepcopy(p)
                q.regions[k].ops[j].outputs = tuple(o for o in op.outputs if o != -1)
                yield q
        for i, s in enumerate(r.storages):
            for attr, val in (("shared_with", None), ("saves", 1), ("kind", "activation")):
                if getattr(s, attr) != val:
                    q = copy.deepcopy(p)
                    setattr(q.regions[k].storages[i], attr, val)
                    yield q
            for nb in (0, 1, s.nbytes // 2, (s.nbytes // 10) * 10):
                if nb < s.nbytes:
                    q = copy.deepcopy(p)
                    q.regions[k].storages[i].nbytes = nb
                    yield q
        if r.start_seconds != 0.0:
            q = copy.deepcopy(p)
            q.regions[k].start_seconds = 0.0
            yield q
    for i, s in enumerate(p.root):
        for nb in (0, 1, s.nbytes // 2):
            if nb < s.nbytes:
                q = copy.deepcopy(p)
                q.root[i].nbytes = nb
                yield q
        if s.offset_seconds:
            q = copy.deepcopy(p)
            q.root[i].offset_seconds = 0.0
            yield q


def shrink(p: Profile, pred) -> Profile:
    changed = True
    while changed:
        changed = False
        for q in edits(p):
            try:
                ok = pred(q)
            except Exception:  # noqa: BLE001 - an invalid edit
                ok = False
            if ok:
                p = q
                changed = True
                break
    return p


# ---------------------------------------------------------------- predicates

def frugal_gap(p: Profile, prefetch: int = 2) -> bool:
    ex = exhaustive_solve(p, 0, prefetch_regions=prefetch)
    s = solve(p, budget_bytes=0, prefetch_regions=prefetch, log_infeasible=False)
    a = ex.predicted_peak_bytes if ex.feasible else ex.min_feasible_budget_bytes
    b = s.predicted_peak_bytes if s.feasible else s.min_feasible_budget_bytes
    return b > a


PREDICATES = {"frugal": frugal_gap}


def cm_plan_differs(p: Profile) -> bool:
    from scheduler import CostModel, Plan, simulate
    cm = CostModel(alpha=0.3)
    for _ in range(30):
        cm.update(copy.deepcopy(p))
    est = cm.estimate()
    keep = simulate(p, Plan()).peak_bytes
    b = keep // 2
    return solve(p, budget_bytes=b).placements != solve(est, budget_bytes=b).placements


PREDICATES["cm"] = cm_plan_differs


def make_gap(budget: int, prefetch: int = 2):
    def gap(p: Profile) -> bool:
        s = solve(p, budget_bytes=budget, prefetch_regions=prefetch, log_infeasible=False)
        if not s.feasible:
            return False
        ex = exhaustive_solve(p, budget, prefetch_regions=prefetch)
        return ex.feasible and s.predicted_step_seconds > ex.predicted_step_seconds * (1 + 1e-6) + 1e-12
    return gap


if __name__ == "__main__":
    name, seed = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "small"
    if mode == "cm":
        p = gen_profile(seed, max_regions=8, max_storages=6, max_ops=8, mode="wide")
        mode = "cm"
    if mode == "cm":
        pass
    elif mode == "small":
        p = gen_profile(seed, max_regions=3, max_storages=3, max_ops=4, mode="tiny", total_storage_cap=7)
    else:
        p = gen_profile(seed, max_regions=60, max_storages=50, max_ops=40, mode="wide", total_storage_cap=3000)
    pred = make_gap(int(sys.argv[4]), int(sys.argv[5])) if name == "gap" else PREDICATES[name]
    assert pred(p), "predicate does not hold on the instance"
    q = shrink(p, pred)
    print(q.to_json(indent=1))

