"""replay_seconds: the replay cost rule of scheduler.profile, case by case."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import (
    OpRecord,
    Placement,
    Plan,
    RegionRecord,
    StorageRecord,
    predict,
    replay_seconds,
)
from scheduler.simulate import Workspace, flatten
from tests.scheduler.instances import random_profile

K, OFF, R = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE


def region(
    ops: list[OpRecord], last_saves: list[int], *, opaque: bool = False, fwd: float = 10.0
) -> RegionRecord:
    storages = [StorageRecord(nbytes=8, last_save_op=k, first_save_op=k) for k in last_saves]
    return RegionRecord(
        name="layers.0",
        call_index=0,
        start_seconds=0.0,
        forward_seconds=fwd,
        backward_seconds=2 * fwd,
        ops=ops,
        storages=storages,
        opaque=opaque,
    )


# op0 -> s0, op1 -> s1 (its other output is unsaved), op2 (not skippable) -> s2, op3 -> s3
OPS = [
    OpRecord(seconds=1.0, skippable=True, outputs=(0,)),
    OpRecord(seconds=2.0, skippable=True, outputs=(1, -1)),
    OpRecord(seconds=4.0, skippable=False, outputs=(2,)),
    OpRecord(seconds=8.0, skippable=True, outputs=(3,)),
]
SAVES = [1, 2, 3, 4]


def test_nothing_dropped_costs_nothing() -> None:
    assert replay_seconds(region(OPS, SAVES), [K, OFF, K, OFF]) == 0.0


def test_prefix_stops_at_last_save_of_last_dropped_storage() -> None:
    r = region(OPS, SAVES)
    # dropping s0 (last save after op 0): only op0 replays, and it must run
    assert replay_seconds(r, [R, K, K, K]) == 1.0
    # dropping s3 (last save after op 3): op0 is served (s0 kept), op1 runs (-1 output),
    # op2 runs (not skippable), op3 runs (its output is dropped)
    assert replay_seconds(r, [K, K, K, R]) == 2.0 + 4.0 + 8.0


def test_served_needs_every_output_held() -> None:
    r = region(OPS, SAVES)
    # s0 offloaded: op0 is served from the region's reload, as when s0 is kept
    assert replay_seconds(r, [OFF, K, R, K]) == 2.0 + 4.0
    assert replay_seconds(r, [K, K, R, K]) == 2.0 + 4.0
    # s0 dropped too: op0 runs
    assert replay_seconds(r, [R, K, R, K]) == 1.0 + 2.0 + 4.0


def test_unsaved_output_always_runs_inside_the_prefix() -> None:
    ops = [
        OpRecord(seconds=3.0, skippable=True, outputs=(-1,)),
        OpRecord(seconds=1.0, skippable=True, outputs=(0,)),
    ]
    r = region(ops, [2])
    assert replay_seconds(r, [R]) == 4.0
    ops[0].outputs = ()
    # an op without tensor outputs and skippable is served
    assert replay_seconds(region(ops, [2]), [R]) == 1.0


def test_opaque_region_reruns_whole_prefix() -> None:
    r = region(OPS, SAVES, opaque=True)
    assert replay_seconds(r, [R, K, K, K]) == 1.0
    assert replay_seconds(r, [K, K, K, R]) == 15.0


def test_region_without_ops_costs_its_forward() -> None:
    r = region([], [0, 0], fwd=7.5)
    assert replay_seconds(r, [R, K]) == 7.5
    assert replay_seconds(r, [K, OFF]) == 0.0


def test_prefix_beyond_the_op_list_is_clamped() -> None:
    assert replay_seconds(region(OPS[:2], [9]), [R]) == 3.0


def test_mapping_and_strings_are_accepted() -> None:
    r = region(OPS, SAVES)
    assert replay_seconds(r, {3: "recompute"}) == 14.0
    assert replay_seconds(r, {}) == 0.0


def test_bad_arguments_are_rejected() -> None:
    r = region(OPS, SAVES)
    with pytest.raises(ValueError, match="4 storages but 2 placements"):
        replay_seconds(r, [K, K])
    with pytest.raises(ValueError, match=r"accepted: 0\.\.3"):
        replay_seconds(r, {7: R})
    with pytest.raises(ValueError, match="accepted: keep, offload, recompute"):
        replay_seconds(r, ["drop", K, K, K])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), data=st.data())
def test_simulator_replays_as_replay_seconds(seed: int, data: st.DataObject) -> None:
    """The numba kernel and the reference rule agree on random regions and plans."""
    profile = random_profile(seed)
    flat = flatten(profile)
    place = np.zeros(flat.n_storages, dtype=np.int8)
    for i in range(flat.n_storages):
        allowed = [p for p in (0, 2) if flat.legal[i] & (1 << p)]
        place[i] = data.draw(st.sampled_from(allowed))
    ws = Workspace(flat)
    ws.run(place, 2)
    for r_idx, reg in enumerate(profile.regions):
        u = 2 * r_idx + 1
        mine = [Placement(int(p)) for p in place[flat.st_ptr[u] : flat.st_ptr[u + 1]]]
        assert ws.replay[u] == pytest.approx(replay_seconds(reg, mine), abs=1e-12)
    plan = Plan(placements={k: Placement(int(p)) for k, p in zip(flat.keys, place)})
    total = sum(
        replay_seconds(
            reg, [plan.placement((reg.name, reg.call_index, i)) for i in range(len(reg.storages))]
        )
        for reg in profile.regions
    )
    assert predict(profile, plan).recompute_seconds == pytest.approx(total, abs=1e-9)
