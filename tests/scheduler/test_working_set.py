"""NOTE [Replay transients]: what a replay holds beyond the storages it brings back, in
the simulator (worked out by hand) and in the books' form of it (the same numbers)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import OpRecord, Placement, Plan, Profile, RegionRecord, StorageRecord, simulate
from scheduler.flat import flatten, placement_array
from scheduler.working_set import (
    forward_transient_bytes,
    replay_transient_bytes,
    unit_forward_transient,
    unit_replay_transient,
)
from tests.scheduler.instances import random_dataflow_profile

K, R = Placement.KEEP, Placement.RECOMPUTE


def _region(transients: tuple[int, int, int]) -> RegionRecord:
    """op0 makes s0 (100 B, saved after op0); op1 makes nothing saved; op2 makes s1
    (200 B, saved after op2). 1 s each; ``transients``: each op's transient bytes."""
    return RegionRecord(
        name="l0",
        call_index=0,
        start_seconds=0.0,
        forward_seconds=3.0,
        backward_seconds=3.0,
        ops=[
            OpRecord(seconds=1.0, skippable=False, outputs=(0,), transient_bytes=transients[0]),
            OpRecord(seconds=1.0, skippable=False, outputs=(-1,), transient_bytes=transients[1]),
            OpRecord(seconds=1.0, skippable=False, outputs=(1,), transient_bytes=transients[2]),
        ],
        storages=[
            StorageRecord(nbytes=100, producer_op=0, first_save_op=1, last_save_op=1, offset_seconds=1.0),
            StorageRecord(nbytes=200, producer_op=2, first_save_op=3, last_save_op=3, offset_seconds=3.0),
        ],
    )


def _profile(transients: tuple[int, int, int] = (0, 500, 0)) -> Profile:
    return Profile(signature="hand", forward_seconds=3.0, backward_seconds=3.0, regions=[_region(transients)])


def _plan(s0: Placement, s1: Placement) -> Plan:
    return Plan(placements={("l0", 0, 0): s0, ("l0", 0, 1): s1})


def test_a_replay_holds_its_transients_from_its_start_to_its_end() -> None:
    """Dropping s1 replays ops 0..2 plainly (3 s) at backward's start (3 s). After op1
    it holds s0 (kept), its copy of s0 (op1 is the op that saved it) and op1's 500 B:
    700 B, 400 B beyond s0 and s1, which the unit counts from the replay's start. Those
    400 B go when the replay ends at 6 s; the unit's backward holds the saves alone. The
    forward holds s0 and op1's 500 B after op1, and s1, dropped, after op2: 600 B at
    its largest, 500 B beyond s0 (saved before its end; s1 is not held), from its start
    to its end (NOTE [Forward transients])."""
    tl = simulate(_profile(), _plan(K, R))
    assert tl.peak_bytes == 700
    assert tl.memory == [(0.0, 500), (1.0, 600), (3.0, 700), (6.0, 300), (9.0, 0)]
    assert tl.peak_time_seconds == 3.0


def test_without_a_replay_the_forward_holds_its_own_transient() -> None:
    """NOTE [Forward transients]: after op1 the forward holds s0 and op1's 500 B, 600 B,
    held from its start less s0 and beside s0 from its save: its end frees it before s1,
    saved there, comes."""
    tl = simulate(_profile(), Plan())
    assert tl.peak_bytes == 600
    assert tl.memory == [(0.0, 500), (1.0, 600), (3.0, 300), (6.0, 0)]
    assert simulate(_profile((0, 0, 0)), Plan()).peak_bytes == 300


def test_a_replay_stopping_before_the_transient_holds_none_of_it() -> None:
    """Dropping s0 replays op0 only: op1's transient is past the prefix, and the replay's
    peak is s1 at backward's start. The step's is the forward's after op1: s0, which op1
    reads, and op1's 500 B (NOTE [Forward transients])."""
    assert simulate(_profile(), _plan(R, K)).peak_bytes == 600
    assert simulate(_profile((0, 0, 0)), _plan(R, K)).peak_bytes == 200


def test_the_books_take_a_forward_s_largest_point_beyond_its_held_storages() -> None:
    """NOTE [Forward transients], the books' form: after op1 the forward holds s0 (read
    by op1, dropped or not) and op1's 500 B; after op2 s0 and s1."""
    ops, sts = _region((0, 500, 0)).ops, _region((0, 500, 0)).storages
    assert forward_transient_bytes(ops, sts, [False, False]) == 600 - 300
    assert forward_transient_bytes(ops, sts, [False, True]) == 600 - 100  # s1 held by none
    assert forward_transient_bytes(ops, sts, [True, False]) == 600 - 200
    sts[0].freed_op = 1  # the recorded forward let go of s0 after op0
    assert forward_transient_bytes(ops, sts, [True, False]) == 500 - 200
    assert simulate(_profile(), _plan(R, K)).peak_bytes == 600  # (an unknown death: op1's end)


def test_a_transient_below_the_dropped_storages_adds_nothing() -> None:
    """The replay's working set after op0 is s0 and 50 B: below s0 and s1 together at
    its end, which the unit counts anyway."""
    assert simulate(_profile((50, 0, 0)), _plan(R, R)).peak_bytes == 300


def test_a_plain_replay_counts_what_it_makes_again_of_held_storages() -> None:
    """A plain replay of ops 0..2 makes s0 again beside the kept one, until op1 (its
    first save's op) has run: op1's 500 B and that copy, 400 B beyond the dropped s1. A
    replay under the dispatch mode serves s0: 300 B beyond it."""
    prof = _profile()
    flat = flatten(prof)
    place = placement_array(flat, _plan(K, R))
    level = np.zeros(3, dtype=np.int64)
    args = (place, flat.st_ptr, flat.nbytes, flat.st_prod, flat.first_save, flat.st_freed, flat.op_ptr, flat.op_tr, level)
    assert unit_replay_transient(1, 3, True, *args) == 400
    assert unit_replay_transient(1, 3, False, *args) == 300
    recs = prof.regions[0]
    assert replay_transient_bytes(recs.ops, recs.storages, [False, True], 3, plain=True) == 400
    assert replay_transient_bytes(recs.ops, recs.storages, [False, True], 3, plain=False) == 300


def test_a_plain_replay_holds_its_copy_of_a_held_storage_until_the_forward_let_go_of_it() -> None:
    """NOTE [Replay transients]: a plain replay's copy of the kept s0 lives as long as the
    recorded forward held s0 (``freed_op``), not only to its first save's op. Op2 makes
    500 B no op saves: with s0's copy gone after op1, s1 and those 500 B (500 B beyond
    s1); with the forward holding s0 to its end, s0's copy beside them (600 B)."""
    prof = _profile((0, 0, 500))
    recs = prof.regions[0]
    assert replay_transient_bytes(recs.ops, recs.storages, [False, True], 3, plain=True) == 500
    recs.storages[0].freed_op = 3
    assert replay_transient_bytes(recs.ops, recs.storages, [False, True], 3, plain=True) == 600
    assert replay_transient_bytes(recs.ops, recs.storages, [False, True], 3, plain=False) == 500
    assert simulate(prof, _plan(K, R)).peak_bytes == 100 + 200 + 600


def test_a_dropped_storage_outliving_its_call_is_held_to_the_forward_s_end() -> None:
    """NOTE [Forward transients]: s0, dropped, is still alive when l0's forward returns
    (autocast's cache holds a weight's cast so): from l0's end (4 s) to the forward's
    (5 s, after the final gap) the step holds it beside s1; backward regenerates it.
    Without the mark the forward lets go of it at l0's end."""
    prof = _profile((0, 0, 0))
    prof.forward_seconds = 5.0
    region = prof.regions[0]
    region.start_seconds = 1.0
    region.storages[0].freed_op = 3  # alive at the end of l0's ops
    assert simulate(prof, _plan(R, K)).memory == [(0.0, 0), (1.0, 300), (4.0, 200), (5.0, 100), (9.0, 0)]
    region.storages[0].outlives_call = True
    assert simulate(prof, _plan(R, K)).memory == [(0.0, 0), (1.0, 300), (4.0, 300), (5.0, 100), (9.0, 0)]
    assert simulate(prof, _plan(K, K)).memory == [(0.0, 0), (2.0, 100), (4.0, 300), (8.0, 0)]  # kept: as ever


def test_a_dropped_storage_outliving_its_call_is_never_offloaded_by_the_solver() -> None:
    """A copy to the host frees nothing of a storage something beyond its call holds
    until the forward's end: the solver chooses KEEP or RECOMPUTE for it."""
    prof = _profile((0, 0, 0))
    prof.regions[0].storages[0].outlives_call = True
    flat = flatten(prof)
    assert list(flat.choice) == [flat.legal[0] & ~2, flat.legal[1]]


def test_a_profile_keeps_its_transients_through_json() -> None:
    prof = _profile((1, 2, 3))
    again = Profile.from_json(prof.to_json())
    assert [op.transient_bytes for op in again.regions[0].ops] == [1, 2, 3]


@pytest.mark.parametrize("bad", [-1, 1.5, "8", 2**53])
def test_bad_transient_bytes_are_named(bad: object) -> None:
    prof = _profile()
    prof.regions[0].ops[1].transient_bytes = bad  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"op 1 of region l0#0 transient_bytes"):
        flatten(prof)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), plain=st.booleans())
def test_the_books_count_what_the_simulator_counts(seed: int, plain: bool) -> None:
    """Random regions, transients, forward lifetimes and placements: the books'
    ``replay_transient_bytes`` equals the kernel's figure for every prefix, and
    ``forward_transient_bytes`` the forward's excess over its held storages."""
    prof = random_dataflow_profile(seed)
    rng = random.Random(seed)
    for r in prof.regions:
        for op in r.ops:
            op.transient_bytes = rng.choice([0, 5, 10, 40])
        for rec in r.storages:
            rec.freed_op = rng.choice([-1, rng.randint(0, len(r.ops))])
    flat = flatten(prof)
    place = np.zeros(flat.n_storages, dtype=np.int8)
    for i in range(flat.n_storages):
        if flat.legal[i] & 4 and rng.random() < 0.5:
            place[i] = 2
    level = np.zeros(max(flat.max_unit_ops, 1), dtype=np.int64)
    for k, r in enumerate(prof.regions):
        u = 2 * k + 1
        lo = int(flat.st_ptr[u])
        dropped = [bool(place[lo + i] == 2) for i in range(len(r.storages))]
        for prefix in range(len(r.ops) + 2):
            got = unit_replay_transient(
                u, prefix, plain, place, flat.st_ptr, flat.nbytes, flat.st_prod, flat.first_save,
                flat.st_freed, flat.op_ptr, flat.op_tr, level,
            )
            assert got == replay_transient_bytes(r.ops, r.storages, dropped, prefix, plain=plain)
        forward = unit_forward_transient(
            u, place, flat.st_ptr, flat.nbytes, flat.st_prod, flat.st_freed, flat.last_save, flat.op_ptr, flat.op_tr,
            level,
        )
        held = sum(s.nbytes for s, d in zip(r.storages, dropped) if not d and s.producer_op >= 0)
        assert max(0, forward - held) == forward_transient_bytes(r.ops, r.storages, dropped)
