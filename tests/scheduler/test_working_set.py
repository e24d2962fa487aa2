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
from scheduler.working_set import replay_transient_bytes, unit_replay_transient
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
    400 B go when the replay ends at 6 s; the unit's backward holds the saves alone."""
    tl = simulate(_profile(), _plan(K, R))
    assert tl.peak_bytes == 700
    assert tl.memory == [(0.0, 0), (1.0, 100), (3.0, 700), (6.0, 300), (9.0, 0)]
    assert tl.peak_time_seconds == 3.0


def test_no_replay_no_transient() -> None:
    assert simulate(_profile(), Plan()).peak_bytes == 300


def test_a_replay_stopping_before_the_transient_holds_none_of_it() -> None:
    """Dropping s0 replays op0 only: op1's transient is past the prefix. The peak is s1
    at forward's end."""
    assert simulate(_profile(), _plan(R, K)).peak_bytes == 200


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
    args = (place, flat.st_ptr, flat.nbytes, flat.st_prod, flat.first_save, flat.op_ptr, flat.op_tr, level)
    assert unit_replay_transient(1, 3, True, *args) == 400
    assert unit_replay_transient(1, 3, False, *args) == 300
    recs = prof.regions[0]
    assert replay_transient_bytes(recs.ops, recs.storages, [False, True], 3, plain=True) == 400
    assert replay_transient_bytes(recs.ops, recs.storages, [False, True], 3, plain=False) == 300


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
    """Random regions, transients and placements: the books' ``replay_transient_bytes``
    equals the kernel's figure for every prefix."""
    prof = random_dataflow_profile(seed)
    rng = random.Random(seed)
    for r in prof.regions:
        for op in r.ops:
            op.transient_bytes = rng.choice([0, 5, 10, 40])
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
                flat.op_ptr, flat.op_tr, level,
            )
            assert got == replay_transient_bytes(r.ops, r.storages, dropped, prefix, plain=plain)
