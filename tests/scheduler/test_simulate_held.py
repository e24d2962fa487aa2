"""NOTE [Held past backward]: a storage the program holds past backward's end stays
resident until backward ends under every plan, and the solver only keeps it."""

from __future__ import annotations

from scheduler import (
    ROOT,
    Placement,
    Plan,
    Profile,
    StorageRecord,
    lower_bound,
    predict,
    simulate,
    solve,
)
from tests.scheduler.test_simulate import two_blocks

K, OFF, R = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE
DROP_SECOND = {("l0", 0, 1): R, ("l1", 0, 1): R}


def _with_root(held: bool) -> Profile:
    """Two blocks (300 B each) and a 400-byte root save at forward's end (the loss's)."""
    p = two_blocks()
    p.root = [StorageRecord(nbytes=400, offset_seconds=6.0, held=held)]
    return p


def test_a_held_root_save_stays_until_backward_ends() -> None:
    free = simulate(_with_root(False), Plan())
    held = simulate(_with_root(True), Plan())
    assert free.memory == [(0.0, 0), (1.0, 100), (3.0, 300), (4.0, 400), (6.0, 600), (12.0, 300), (18.0, 0)]
    assert held.memory == [(0.0, 0), (1.0, 100), (3.0, 300), (4.0, 400), (6.0, 1000), (12.0, 700), (18.0, 0)]
    # through the replays too: the blocks' second saves dropped, replayed in backward
    t = simulate(_with_root(True), Plan(placements=DROP_SECOND))
    # l0's forward holds its second save, dropped, beside its first: 200 B from its
    # start to its end (NOTE [Forward transients] in scheduler/working_set.py)
    assert t.memory == [(0.0, 200), (1.0, 300), (3.0, 300), (4.0, 400), (6.0, 800), (14.0, 700), (22.0, 0)]
    assert t.peak_bytes == 800 == simulate(_with_root(False), Plan(placements=DROP_SECOND)).peak_bytes + 400


def test_a_held_region_save_stays_until_backward_ends() -> None:
    p = two_blocks()
    p.regions[1].storages[1].held = True  # l1's 200 B, freed at 12 s when not held
    assert simulate(p, Plan()).memory == [
        (0.0, 0), (1.0, 100), (3.0, 300), (4.0, 400), (6.0, 600), (12.0, 500), (18.0, 0)
    ]


def test_the_solver_only_keeps_a_held_storage() -> None:
    """Not held, 500 B is feasible; held, nothing below 700 B (its 400 B and l1's 300 B,
    dropping or offloading it freeing nothing) is, and that is what the plan holds."""
    free = solve(_with_root(False), budget_bytes=500)
    assert free.feasible and free.predicted_peak_bytes <= 500
    plan = solve(_with_root(True), budget_bytes=500)
    assert not plan.feasible and plan.min_feasible_budget_bytes == 700
    assert plan.placement((ROOT, 0, 0)) is K
    assert predict(_with_root(True), plan).peak_bytes == 700 == simulate(_with_root(True), plan).peak_bytes
    assert lower_bound(_with_root(True), 700) <= plan.predicted_step_seconds
    # a plan that offloads it stays legal (a user's plan, one solved before it was marked)
    t = simulate(_with_root(True), Plan(placements={(ROOT, 0, 0): OFF}))
    assert t.peak_bytes >= 600


def test_old_profiles_load_unheld() -> None:
    p = _with_root(True)
    data = p.to_dict()
    assert Profile.from_dict(data).root[0].held
    del data["root"][0]["held"]
    assert not Profile.from_dict(data).root[0].held
