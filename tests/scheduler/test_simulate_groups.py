"""The simulator's offload groups and host time (NOTE [Offload groups], NOTE [Host time]
in scheduler/timeline.py), against timelines worked out by hand."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import (
    Placement,
    Plan,
    Profile,
    StorageRecord,
    exhaustive_solve,
    lower_bound,
    simulate,
    solve,
)
from scheduler.profile import INPUT_LOOKBACK
from tests.scheduler.instances import random_profile
from tests.scheduler.test_simulate import block, two_blocks

K, OFF, R = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE


def four_blocks() -> Profile:
    # blocks 3 s forward, 6 s backward; links of 100 B/s
    return Profile(
        signature="hand",
        forward_seconds=12.0,
        backward_seconds=24.0,
        d2h_gbps=1e-7,
        h2d_gbps=1e-7,
        regions=[block(f"l{i}", 3.0 * i) for i in range(4)],
    )


def test_a_group_is_copied_as_one_at_its_region_exit() -> None:
    plan = Plan(placements={("l0", 0, 0): OFF, ("l0", 0, 1): OFF})
    t = simulate(two_blocks(), plan)
    # both storages stay on the device until l0 exits at 3; one 300-byte copy 3..6
    assert [(i.start, i.end, i.label) for i in t.d2h] == [(3.0, 6.0, "l0#0")]
    # nothing issues l0's reload before it is reached (12): its first unpack does
    assert [(i.start, i.end) for i in t.h2d] == [(12.0, 15.0)]
    assert t.stall_seconds == 3.0
    assert t.step_seconds == 21.0
    assert t.memory == [
        (0.0, 0),
        (1.0, 100),
        (3.0, 300),
        (4.0, 400),
        (6.0, 300),  # the group lands (-300) as l1/s1 is saved (+200)
        (12.0, 300),  # l1 released (-300), l0's group reloaded (+300)
        (21.0, 0),
    ]
    assert (t.peak_bytes, t.peak_time_seconds) == (400, 4.0)


def test_backward_start_waits_for_the_copies_still_in_flight() -> None:
    """A copy that lands after forward's end is waited for at backward's start, where
    its group is freed (NOTE [Planned release] in offrecomp/groups.py)."""
    p = two_blocks()
    p.regions[0].storages[1].nbytes = 800  # an 8 s copy from l0's exit: 3..11
    plan = Plan(placements={("l0", 0, 1): OFF})
    t = simulate(p, plan)
    assert [(i.start, i.end) for i in t.d2h] == [(3.0, 11.0)]
    assert t.forward_seconds == 6.0
    compute = [(i.start, i.end, i.label) for i in t.compute]
    assert (6.0, 11.0, "wait for copies") in compute
    assert (11.0, 17.0, "backward l1#0") in compute
    # l0's reload is issued when backward reaches it (17): 17..25, all of it stall
    assert [(i.start, i.end) for i in t.h2d] == [(17.0, 25.0)]
    assert t.stall_seconds == 8.0
    # l0/s1 (800 B) is on the device from its save (2) until backward's start (11)
    assert (11.0, 400) in t.memory and max(b for _, b in t.memory) == 1200
    # the plan's releases: every unit frees its own (nothing), l0's group at the last unit
    assert t.releases[1] == len(t.releases) - 1


def test_a_group_is_freed_at_the_end_of_the_first_unit_after_its_copy_lands() -> None:
    """Not at the landing itself: the runtime lets go of sources at unit ends."""
    p = two_blocks()
    p.regions[0].storages[1].nbytes = 150  # a 1.5 s copy from l0's exit: 3..4.5
    plan = Plan(placements={("l0", 0, 1): OFF})
    t = simulate(p, plan)
    assert [(i.start, i.end) for i in t.d2h] == [(3.0, 4.5)]
    assert not any(i.label == "wait for copies" for i in t.compute)
    assert not any(when == 4.5 for when, _ in t.memory)  # nothing happens at the landing
    before = dict(t.memory)[4.0]  # l1/s0 saved
    assert dict(t.memory)[6.0] == before - 150 + 200  # l1's end: l0's group goes, l1/s1 comes
    assert t.releases == (0, 3, 2, 3, 4)  # l0's group at l1's end; the rest their own


def test_first_unpack_reloads_and_prefetches_the_next_offloading_groups() -> None:
    plan = Plan(placements={("l0", 0, 0): OFF, ("l2", 0, 0): OFF, ("l3", 0, 0): OFF})
    t = simulate(four_blocks(), plan, prefetch_regions=1)
    # copies at the exits of l0 (3), l2 (9), l3 (12)
    assert [(i.start, i.end) for i in t.d2h] == [(3.0, 4.0), (9.0, 10.0), (12.0, 13.0)]
    # backward's start waits for l3's copy (12..13); reaching l3 (13): its own reload
    # and l2's; reaching l2 (20): the next group that offloads is l0's (l1 offloads
    # nothing)
    assert [(i.start, i.end, i.label) for i in t.h2d] == [
        (13.0, 14.0, "l3#0"),
        (14.0, 15.0, "l2#0"),
        (20.0, 21.0, "l0#0"),
    ]
    assert t.stall_seconds == 1.0
    assert [(i.start, i.end, i.label) for i in t.compute if i.start >= 12.0][:2] == [
        (12.0, 13.0, "wait for copies"),
        (13.0, 14.0, "stall l3#0"),
    ]
    assert [(i.start, i.end) for i in t.compute if i.label.startswith("backward")] == [
        (14.0, 20.0),
        (20.0, 26.0),
        (26.0, 32.0),
        (32.0, 38.0),
    ]
    # a group is freed at the end of the first unit to end after its copy lands: l0's
    # (landed at 4) at l1's end (6), l2's (10) at l3's end (12), l3's at backward's start
    # (13), where its reload begins, so it never leaves. A reloaded group is resident
    # from its reload's issue until its unit's backward ends: l2's from 13, l0's from 20
    assert t.releases == (0, 3, 2, 3, 4, 7, 6, 8, 8)
    assert t.memory == [
        (0.0, 0),
        (1.0, 100),
        (3.0, 300),
        (4.0, 400),
        (6.0, 500),
        (7.0, 600),
        (9.0, 800),
        (10.0, 900),
        (12.0, 1000),
        (13.0, 1100),
        (20.0, 900),
        (26.0, 600),
        (32.0, 300),
        (38.0, 0),
    ]


def test_prefetch_depth_counts_offloading_groups() -> None:
    plan = Plan(placements={("l0", 0, 0): OFF, ("l2", 0, 0): OFF, ("l3", 0, 0): OFF})
    t = simulate(four_blocks(), plan, prefetch_regions=2)
    # reaching l3 issues l3, then the next two groups that offload: l2 and l0
    assert [(i.start, i.label) for i in t.h2d] == [(13.0, "l3#0"), (14.0, "l2#0"), (15.0, "l0#0")]
    t0 = simulate(four_blocks(), plan, prefetch_regions=0)
    # no prefetch: every group is reloaded when reached, and waited for (l3's after
    # backward's start waited 12..13 for its copy)
    assert [(i.start, i.label) for i in t0.h2d] == [(13.0, "l3#0"), (20.0, "l2#0"), (33.0, "l0#0")]
    assert t0.stall_seconds == 3.0


def test_a_root_run_is_a_group_of_its_own() -> None:
    from scheduler import ROOT, StorageRecord

    p = two_blocks(forward_seconds=8.0)  # 2 s of root work after l1: a gap 6..8
    p.root = [StorageRecord(nbytes=100, offset_seconds=6.5), StorageRecord(nbytes=100, offset_seconds=7.0)]
    plan = Plan(placements={(ROOT, 0, 0): OFF, (ROOT, 0, 1): OFF, ("l1", 0, 0): OFF})
    t = simulate(p, plan)
    # l1's group at its exit (6); the root run's when backward begins (8), one copy of 200 B
    assert [(i.start, i.end, i.label) for i in t.d2h] == [
        (6.0, 7.0, "l1#0"),
        (8.0, 10.0, "(root) before unit 5"),
    ]


def test_host_time_makes_a_host_bound_unit_longer() -> None:
    p = two_blocks(pack_host_seconds=0.5)  # two saves a block: 1 s of hooks each
    p.regions[0].host_seconds = 5.0  # l0's host work outlasts its 3 s on the device
    t = simulate(p, Plan())
    assert [(i.start, i.end) for i in t.compute if i.label.startswith("forward")] == [
        (0.0, 6.0),  # max(3, 5 + 1)
        (6.0, 10.0),  # max(3, 3 + 1): on the host's own clock the hooks add
    ]
    assert (t.forward_seconds, t.step_seconds) == (10.0, 22.0)
    # the saves move with their units: l1's at 6 + 1 and 6 + 3
    assert [m for m in t.memory if m[0] < 10.0] == [(0.0, 0), (1.0, 100), (3.0, 300), (7.0, 400), (9.0, 600)]

    # issuing l0's group offload costs 2 s of host at its exit; reloading it 1 s in backward
    p.offload_host_seconds = 2.0
    p.reload_host_seconds = 1.0
    t = simulate(p, Plan(placements={("l0", 0, 0): OFF}))
    assert [(i.start, i.end) for i in t.compute if i.label.startswith("forward")] == [
        (0.0, 8.0),
        (8.0, 12.0),
    ]
    assert [(i.start, i.end) for i in t.d2h] == [(8.0, 9.0)]
    assert [(i.start, i.end) for i in t.h2d] == [(18.0, 19.0)]
    # l0's backward: 6 s on the device, 6 + 1 on the host
    assert (19.0, 26.0, "backward l0#0") in [(i.start, i.end, i.label) for i in t.compute]
    assert t.step_seconds == 26.0


def test_the_host_runs_ahead_of_the_device_in_forward() -> None:
    """NOTE [Host time]: a unit whose host time outlasts its device time holds the
    device up only by what the host's lead from the units before does not cover."""
    p = two_blocks(pack_host_seconds=0.5)  # two saves a block: 1 s of hooks each
    p.regions[0].host_seconds = 1.0  # l0: 2 s of host on 3 s of device, 1 s ahead
    p.regions[1].host_seconds = 3.0  # l1: 4 s of host on 3 s of device
    t = simulate(p, Plan())
    # l1's host ends at 2 + 4 = 6, its device at 3 + 3: the lead covers its extra second
    assert [(i.start, i.end) for i in t.compute if i.label.startswith("forward")] == [(0.0, 3.0), (3.0, 6.0)]
    assert t.forward_seconds == 6.0
    # issuing l1's group takes 2 s more of host: 1 s of lead covers 1 of its 3 s over
    p.offload_host_seconds = 2.0
    t = simulate(p, Plan(placements={("l1", 0, 0): OFF}))
    assert [(i.start, i.end) for i in t.compute if i.label.startswith("forward")] == [(0.0, 3.0), (3.0, 8.0)]
    assert t.forward_seconds == 8.0 and t.d2h[0].start == 8.0
    assert lower_bound(p, None) <= simulate(p, Plan()).step_seconds


def test_native_keep_charges_the_hooks_only_to_regions_not_kept_whole() -> None:
    """Under ``Profile.native_keep`` a region the plan keeps whole saves without the
    hooks (the runtime's NOTE [Native keep]); one that drops or offloads a storage pays
    them for all its saves, in forward and in backward."""
    p = two_blocks(pack_host_seconds=0.5, unpack_host_seconds=1.0)  # two saves a block
    p.native_keep = True
    t = simulate(p, Plan())
    assert [(i.start, i.end) for i in t.compute if i.label.startswith("forward")] == [(0.0, 3.0), (3.0, 6.0)]
    bare = two_blocks()
    assert (t.forward_seconds, t.step_seconds) == (6.0, simulate(bare, Plan()).step_seconds)
    # l0 drops a storage: its two saves pay 1 s of pack on its 3 s of forward and 2 s of
    # unpack on its 6 s of backward; l1, kept whole, pays neither
    p.regions[0].host_seconds = 3.0
    t = simulate(p, Plan(placements={("l0", 0, 1): R}))
    assert [(i.start, i.end, i.label) for i in t.compute] == [
        (0.0, 4.0, "forward l0#0"),
        (4.0, 7.0, "forward l1#0"),
        (7.0, 13.0, "backward l1#0"),
        (13.0, 15.0, "replay l0#0"),
        (15.0, 23.0, "backward l0#0"),
    ]
    # without native keep every region pays: l1 too
    p.native_keep = False
    t = simulate(p, Plan(placements={("l0", 0, 1): R}))
    assert [(i.start, i.end) for i in t.compute if i.label.startswith("forward")] == [(0.0, 4.0), (4.0, 8.0)]


def test_a_checkpoint_is_paid_by_each_region_not_kept_whole() -> None:
    """``Profile.capture_host_seconds``: a region call a plan keeps whole takes no replay
    checkpoint; one that drops or offloads any storage pays it in its forward, with or
    without native keep."""
    for native in (True, False):
        p = two_blocks(capture_host_seconds=1.5)
        p.native_keep = native
        assert simulate(p, Plan()).step_seconds == simulate(two_blocks(), Plan()).step_seconds
        t = simulate(p, Plan(placements={("l0", 0, 1): R}))
        assert [(i.start, i.end) for i in t.compute if i.label.startswith("forward")] == [(0.0, 4.5), (4.5, 7.5)]
        assert t.forward_seconds == 7.5


def test_storages_saved_after_a_replays_prefix_are_freed_before_it() -> None:
    """NOTE [Frees before a replay]: l0 drops s0 (saved after op0): its replay, plain (no
    dispatch mode is cheaper for one op), runs op0 when backward first reads s0, after
    the node that saved s1 ran and freed it. So at
    l0's backward only the replayed 100 B are resident, not s1's 200 B with them; a
    profile without first saves (0) keeps the old, later free. l0's forward holds s0,
    dropped, beside s1 once op1 (which reads s0) has made it: 300 B from its start to
    its end (NOTE [Forward transients] in scheduler/working_set.py)."""
    p = two_blocks(d2h_gbps=0.0, h2d_gbps=0.0)
    plan = Plan(placements={("l0", 0, 0): R})
    t = simulate(p, plan)
    assert t.memory == [(0.0, 300), (3.0, 200), (4.0, 300), (6.0, 500), (12.0, 100), (19.0, 0)]
    for rec in p.regions[0].storages:
        rec.first_save_op = 0
    assert simulate(p, plan).memory[-2] == (12.0, 300)
    # saved at the very end of the forward, at T0: counted before it is freed again
    q = two_blocks(d2h_gbps=0.0, h2d_gbps=0.0)
    q.regions[1].storages[1].offset_seconds = 3.0
    t = simulate(q, Plan(placements={("l1", 0, 0): R}))
    # l0 300 + l1 s1 200 at T0, then s1 goes and the replay comes; l1's forward holds
    # l0's 300 and its s0, dropped, beside s1 after op1: 600
    assert t.peak_bytes == 600


def test_replay_host_time_is_paid_once_per_replaying_unit() -> None:
    p = two_blocks(replay_host_seconds=0.5)
    t = simulate(p, Plan(placements={("l0", 0, 1): R}))
    # l0 replays op1 (2 s; op0's output is kept); its backward takes 2 + 6 + 0.5
    assert t.recompute_seconds == 2.0
    assert t.step_seconds == 18.0 + 2.0 + 0.5


def test_no_host_costs_is_the_device_timeline() -> None:
    p = random_profile(7)
    q = random_profile(7)
    for r in q.regions:
        r.host_seconds = r.forward_seconds  # measured, and equal to the device's
    plan = Plan()
    assert simulate(p, plan) == simulate(q, plan)


def _with_host_costs(profile: Profile, seed: int) -> Profile:
    rng = random.Random(seed)
    scale = profile.forward_seconds or 1.0
    profile.pack_host_seconds = rng.choice([0.0, 0.01, 0.05]) * scale
    profile.unpack_host_seconds = rng.choice([0.0, 0.01]) * scale
    profile.capture_host_seconds = rng.choice([0.0, 0.02, 0.2]) * scale
    profile.offload_host_seconds = rng.choice([0.0, 0.1, 0.3]) * scale
    profile.reload_host_seconds = rng.choice([0.0, 0.1]) * scale
    profile.replay_host_seconds = rng.choice([0.0, 0.05]) * scale
    profile.native_keep = rng.random() < 0.5
    for r in profile.regions:
        if rng.random() < 0.5:
            r.host_seconds = r.forward_seconds * rng.uniform(0.2, 2.0)
        if rng.random() < 0.3:
            r.backward_host_seconds = r.backward_seconds * rng.uniform(0.2, 2.0)
    return profile


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), frac=st.floats(0.0, 1.0))
def test_lower_bound_holds_with_host_costs(seed: int, frac: float) -> None:
    profile = _with_host_costs(random_profile(seed), seed)
    _bound_below_the_optimum(profile, frac)
    assert lower_bound(profile, None) <= simulate(profile, Plan()).step_seconds * (1 + 1e-12)


def _bound_below_the_optimum(profile: Profile, frac: float) -> Plan | None:
    """The exhaustive optimum at ``frac`` of keep's peak, checked against the lower bound
    (None: infeasible)."""
    budget = int(simulate(profile, Plan()).peak_bytes * frac)
    best = exhaustive_solve(profile, budget)
    if not best.feasible:
        return None
    assert best.predicted_step_seconds is not None
    assert lower_bound(profile, budget) <= best.predicted_step_seconds * (1 + 1e-9) + 1e-12
    return best


def _with_shared_inputs(profile: Profile, seed: int) -> Profile:
    """Link each region's first storage, as an input, to a storage of the region before
    (``StorageRecord.shared_with``: an allocation an earlier call saved)."""
    rng = random.Random(seed)
    profile.native_keep = rng.random() < 0.5
    for k in range(1, len(profile.regions)):
        before, r = profile.regions[k - 1], profile.regions[k]
        if before.storages and r.storages and rng.random() < 0.7:
            j = rng.randrange(len(before.storages))
            r.storages[0].kind = "input"
            r.storages[0].nbytes = before.storages[j].nbytes
            r.storages[0].shared_with = (before.name, before.call_index, j)
    return profile


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), frac=st.floats(0.0, 1.0))
def test_shared_inputs_count_once_and_the_bound_holds(seed: int, frac: float) -> None:
    """NOTE [Inputs counted once]: a shared input never adds to a plan's peak over the
    same profile without the link, and the lower bound stays below the exhaustive
    optimum."""
    linked = _with_shared_inputs(random_profile(seed), seed)
    plain = linked.copy()
    for r in plain.regions:
        for rec in r.storages:
            rec.shared_with = None
    best = _bound_below_the_optimum(linked, frac)
    if best is not None:
        assert simulate(linked, best).peak_bytes <= simulate(plain, best).peak_bytes


def test_a_kept_input_of_a_kept_earlier_record_counts_once_where_the_runtime_does() -> None:
    """l1's first storage is the allocation l0 saved as its second (200 B). Counted once
    when l1 takes a replay checkpoint (it drops something) and l0 has records (it runs
    the hooks, or native keep is off); twice where the runtime's books count it twice: l1
    kept whole (no input record), or l0 kept whole under native keep (no records)."""
    p = two_blocks(d2h_gbps=0.0, h2d_gbps=0.0)
    p.regions[1].storages[0].nbytes = 200
    p.regions[1].storages[0].kind = "input"
    p.regions[1].storages[0].shared_with = ("l0", 0, 1)
    drop = Plan(placements={("l1", 0, 1): R})
    assert simulate(p, Plan()).peak_bytes == 700  # l1 kept whole: its input counted again
    assert simulate(p, drop).peak_bytes == 500  # l0's 300, then l1's replay of s1 (200) at T0
    p.native_keep = True
    assert simulate(p, drop).peak_bytes == 700  # l0 kept whole saves natively: no record to count it
    assert simulate(p, Plan(placements={("l1", 0, 1): R, ("l0", 0, 0): R})).peak_bytes == 400


def test_a_root_save_of_an_allocation_a_unit_kept_counts_once_where_the_runtime_does() -> None:
    """A root storage saved after l1 ran, naming l1's second record (``shared_with``: the
    loop's code saves a tensor the block saved, or took as its input): counted nothing
    where that record is kept in a unit the plan does not keep whole, as the runtime's
    books count it (NOTE [Activations counted once] in offrecomp/shared.py, the root
    sharing under any plan); counted where l1 is kept whole (its records share nothing)."""
    p = two_blocks(d2h_gbps=0.0, h2d_gbps=0.0, forward_seconds=7.0)
    p.root = [StorageRecord(nbytes=200, offset_seconds=6.5, shared_with=("l1", 0, 1))]
    plain = p.copy()
    plain.root[0].shared_with = None
    drop = Plan(placements={("l1", 0, 0): R})
    assert simulate(plain, drop).peak_bytes == 700  # l0's 300, l1's s1 and the root's 200
    # l0's 300, and l1's s0, dropped, beside s1 in l1's forward (NOTE [Forward transients])
    assert simulate(p, drop).peak_bytes == 600
    assert simulate(p, Plan()).peak_bytes == simulate(plain, Plan()).peak_bytes == 800


def test_an_input_no_op_saves_counts_nothing_in_a_unit_kept_whole() -> None:
    """A region input held only for a replay (``saves`` 0): a unit kept whole takes no
    checkpoint, so nothing holds it there (the runtime has no record); a unit that drops
    something holds it."""
    p = two_blocks(d2h_gbps=0.0, h2d_gbps=0.0)
    s0 = p.regions[1].storages[0]
    s0.kind, s0.saves, s0.nbytes = "input", 0, 200
    assert simulate(p, Plan()).peak_bytes == 500  # l1 kept whole: l0's 300 and l1's s1
    s0.saves = 1  # an op saves it: held
    assert simulate(p, Plan()).peak_bytes == 700


def _with_snapshot(p: Profile, region: int, nbytes: int) -> Profile:
    q = p.copy()
    q.regions[region].storages.append(StorageRecord(nbytes=nbytes, kind="snapshot", saves=0))
    return q


def test_a_snapshot_counts_only_where_its_unit_takes_a_checkpoint() -> None:
    """The copies of the buffers a region call's forward writes (kind ``snapshot``, NOTE
    [Replay and module state] in offrecomp/buffers.py) are held from the call's start
    until its backward ends where the plan drops or offloads something of it, and not at
    all where it keeps the call whole (no checkpoint). A plan may only keep them; the
    solver counts them, and the lower bound leaves them out (a plan keeping the call
    whole holds none)."""
    p = two_blocks()
    q = _with_snapshot(p, 1, 1000)
    assert q.activation_bytes == p.activation_bytes == 600
    assert simulate(q, Plan()).memory == simulate(p, Plan()).memory  # l1 kept whole
    drop = Plan(placements={("l1", 0, 1): R})
    assert simulate(q, drop).peak_bytes == simulate(p, drop).peak_bytes + 1000 == 1600
    held = dict(simulate(q, drop).memory)
    assert held[3.0] - dict(simulate(p, drop).memory)[3.0] == 1000  # from l1's start
    assert simulate(q, drop).memory[-1] == simulate(p, drop).memory[-1]  # gone by the end
    off = Plan(placements={("l1", 0, 0): OFF})
    assert simulate(q, off).peak_bytes > simulate(p, off).peak_bytes  # offloading takes a checkpoint too
    for bad in (R, OFF):
        with pytest.raises(ValueError, match="snapshot"):
            simulate(q, Plan(placements={("l1", 0, 2): bad}))
    assert lower_bound(q, 500) == lower_bound(p, 500)
    # with them the fastest plan within 500 B keeps l1 whole (without them it does too: a
    # drop in l1 holds the dropped storage beside the rest in l1's forward, NOTE [Forward
    # transients] in scheduler/working_set.py)
    budget = 500
    assert all(exhaustive_solve(p, budget).placement(("l1", 0, i)) is K for i in range(2))
    plan = exhaustive_solve(q, budget)
    assert plan.feasible and simulate(q, plan).peak_bytes <= budget
    assert all(plan.placement(("l1", 0, i)) is K for i in range(3))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_snapshots_add_at_most_their_bytes_and_only_to_plans_that_hook_their_unit(seed: int) -> None:
    """Random profiles with a snapshot in some regions: under any plan the peak grows by
    at most the snapshots of the units the plan does not keep whole, and not at all
    under all-KEEP; the solver keeps every snapshot and meets a budget it calls met."""
    p = random_profile(seed)
    rng = random.Random(seed)
    q = p.copy()
    for r in q.regions:
        if rng.random() < 0.5:
            r.storages.append(StorageRecord(nbytes=rng.randint(1, 10) * 10, kind="snapshot", saves=0))
    assert simulate(q, Plan()).peak_bytes == simulate(p, Plan()).peak_bytes
    legal = [
        (r.name, r.call_index, i) for r in p.regions for i, s in enumerate(r.storages)
        if s.kind == "activation" and r.replayable
    ]
    for _ in range(3):
        plan = Plan(placements={k: R for k in legal if rng.random() < 0.5})
        hooked = {k[:2] for k in plan.placements}
        extra = sum(
            s.nbytes for r in q.regions if r.key in hooked for s in r.storages if s.kind == "snapshot"
        )
        base, got = simulate(p, plan).peak_bytes, simulate(q, plan).peak_bytes
        assert base <= got <= base + extra, (base, got, extra)
    budget = max(1, simulate(q, Plan()).peak_bytes // 2)
    solved = solve(q, budget_bytes=budget, log_infeasible=False)
    for r in q.regions:
        for i, s in enumerate(r.storages):
            if s.kind == "snapshot":
                assert solved.placement((r.name, r.call_index, i)) is K
    if solved.feasible:
        assert simulate(q, solved).peak_bytes <= budget


def _feature_chain(n: int, native: bool) -> Profile:
    """A DenseNet's feature map: block l0's input (50 B, no op saves it) is an input of
    every later block too, each of which names l0's record (``shared_with``)."""
    blocks = [block(f"l{i}", 3.0 * i) for i in range(n)]
    for b in blocks:
        b.storages.append(StorageRecord(nbytes=50, kind="input", saves=0, shared_with=("l0", 0, 2)))
    blocks[0].storages[-1].shared_with = None
    return Profile(
        signature="chain", regions=blocks, forward_seconds=3.0 * n, backward_seconds=6.0 * n,
        native_keep=native,
    )


@pytest.mark.parametrize("native", [True, False])
def test_an_input_every_block_takes_counts_once_after_a_block_kept_whole(native: bool) -> None:
    """The runtime looks a kept input up in the records of the INPUT_LOOKBACK calls
    before (and the root): l0, kept whole, has none, so l1's input record counts the
    feature map, and every later block's finds a record of it that counts: 50 bytes once,
    however many blocks (beyond INPUT_LOOKBACK too)."""
    n = INPUT_LOOKBACK + 4
    p = _feature_chain(n, native)
    drop = Plan(placements={(f"l{i}", 0, 1): R for i in range(1, n)})
    without = p.copy()
    for r in without.regions:
        r.storages[-1].nbytes = 0
    assert simulate(p, drop).peak_bytes - simulate(without, drop).peak_bytes == 50

    def in_l0(profile: Profile) -> int:  # the most held while l0 runs its forward
        return max(b for t, b in simulate(profile, drop).memory if t < 3.0)

    assert in_l0(p) == in_l0(without)  # l0 holds no record of it
