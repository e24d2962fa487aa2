"""The chain's drop cache (NOTE [drop cache] in scheduler/solver/chain.py) changes no plan."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import numpy as np
import pytest

import scheduler.solver.chain as chain_mod
import scheduler.solver.family as family_mod
from scheduler import Plan, Profile, gpt_profile, solve
from scheduler.simulate import OFFLOAD_BIT, SimResult, Workspace, flatten
from scheduler.solver import _build_family
from tests.scheduler.instances import random_dataflow_profile, random_profile

FRACTIONS = (0.2, 0.3, 0.5, 0.8)


def _fields(plan: Plan) -> tuple[object, ...]:
    return (
        plan.placements,
        plan.plan_id,
        plan.predicted_step_seconds,
        plan.predicted_peak_bytes,
        plan.lower_bound_seconds,
        plan.feasible,
        plan.min_feasible_budget_bytes,
        plan.notes,
    )


def _plans(profile: Profile, **kw: object) -> list[tuple[object, ...]]:
    """Plans at several budgets (a share of all-KEEP's peak) and without one."""
    keep = solve(profile, budget_bytes=None).predicted_peak_bytes or 0
    out = [
        _fields(solve(profile, budget_bytes=int(keep * f), log_infeasible=False, **kw))  # type: ignore[arg-type]
        for f in FRACTIONS
    ]
    if profile.forward_seconds + profile.backward_seconds > 0:
        out.append(_fields(solve(profile, budget_bytes=None, max_overhead=0.05, **kw)))  # type: ignore[arg-type]
    return out


def _random_profiles() -> Iterator[Profile]:
    """Small and mid-sized random profiles: both replay rules, links on and off, with and
    without the dispatch mode's per-op seconds; sizes where steps overshoot (side plans)
    and where they are many small ones."""
    for seed in range(400):
        rng = random.Random(seed)
        regions, storages = rng.choice([(3, 3), (6, 5), (12, 8), (30, 12), (60, 20)])
        make = random_dataflow_profile if seed % 2 == 0 else random_profile
        profile = make(seed, max_regions=regions, max_storages=storages)
        profile.replay_op_seconds = rng.choice([0.0, 0.0, rng.uniform(0.0, 0.5)])
        yield profile


def _gpt_profiles() -> Iterator[Profile]:
    for layers, link, dropout in ((4, 50.0, True), (24, 50.0, True), (24, 0.0, False), (60, 50.0, False)):
        yield gpt_profile(
            layers=layers,
            hidden=1024,
            heads=16,
            seq=2048,
            batch=1,
            device_tflops=990,
            d2h_gbps=link,
            h2d_gbps=link,
            dropout=dropout,
        )


def _with_and_without_cache(
    monkeypatch: pytest.MonkeyPatch, profile: Profile, **kw: object
) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    monkeypatch.setattr(family_mod, "_DROP_CACHE", True)
    cached = _plans(profile, **kw)
    monkeypatch.setattr(family_mod, "_DROP_CACHE", False)
    fresh = _plans(profile, **kw)
    return cached, fresh


def _family(profile: Profile, allow_offload: bool) -> tuple[list[bytes], list[SimResult]]:
    flat = flatten(profile)
    ws = Workspace(flat)
    keep_res = ws.run(np.zeros(flat.n_storages, dtype=np.int8), 2)
    legal = flat.legal.copy()
    if not allow_offload or not flat.has_link:
        legal &= ~OFFLOAD_BIT
    fam = _build_family(flat, ws, legal, 2, keep_res)
    return [p.tobytes() for p in fam.places], fam.results


def test_random_profiles_same_family_with_and_without_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every chain step is the same: the whole family (with offloads, which holds the
    family without them: NOTE [Offload families]). The local search is off (it would
    only add members and take time)."""
    monkeypatch.setattr(family_mod, "REFINE_MAX_STORAGES", 0)
    for profile in _random_profiles():
        monkeypatch.setattr(family_mod, "_DROP_CACHE", True)
        cached = _family(profile, True)
        monkeypatch.setattr(family_mod, "_DROP_CACHE", False)
        assert cached == _family(profile, True), profile.signature


def test_random_profiles_same_plans_with_and_without_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every third random profile through ``solve`` (local search off, as above)."""
    monkeypatch.setattr(family_mod, "REFINE_MAX_STORAGES", 0)
    for profile in itertools.islice(_random_profiles(), 0, None, 3):
        cached, fresh = _with_and_without_cache(monkeypatch, profile)
        assert cached == fresh, profile.signature


@pytest.mark.parametrize("kw", [{}, {"allow_offload": False}, {"prefetch_regions": 1}])
def test_gpt_profiles_same_plans_with_and_without_cache(
    monkeypatch: pytest.MonkeyPatch, kw: dict[str, object]
) -> None:
    for profile in _gpt_profiles():
        cached, fresh = _with_and_without_cache(monkeypatch, profile, **kw)
        assert cached == fresh, (profile.signature, kw)


def test_cache_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chain prices fewer regions with the cache than without (the chain step runs
    as Python here so that its calls of ``_region_drops`` can be counted)."""
    profile = list(_gpt_profiles())[1]
    keep = solve(profile, budget_bytes=None).predicted_peak_bytes or 0
    inner = chain_mod._region_drops
    priced = [0]

    def counting(todo, *args):  # type: ignore[no-untyped-def]
        if not args[1]:  # want_side: the side plan prices again, cache or not
            priced[0] += len(todo)
        return inner(todo, *args)

    monkeypatch.setattr(family_mod, "_chain_step", chain_mod._chain_step.py_func)
    monkeypatch.setattr(chain_mod, "_region_drops", counting)
    counts = {}
    for enabled in (True, False):
        monkeypatch.setattr(family_mod, "_DROP_CACHE", enabled)
        priced[0] = 0
        solve(profile, budget_bytes=int(keep * 0.3))
        counts[enabled] = priced[0]
    assert 0 < counts[True] < counts[False] / 2, counts
