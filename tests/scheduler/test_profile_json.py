"""Profiles survive a JSON round trip and a copy unchanged (what-if planning reads saved
profiles; the cost model copies one every step)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import CostModel, Profile, StorageRecord, gpt_profile, solve
from scheduler.profile import PROFILE_VERSION
from tests.scheduler.instances import random_profile


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_profiles_round_trip(seed: int) -> None:
    p = random_profile(seed)
    p.meta = {"gpu": "H200", "n": seed}
    assert Profile.from_json(p.to_json()) == p


def test_saved_profile_plans_the_same(tmp_path: Path) -> None:
    p = gpt_profile(
        layers=3,
        hidden=512,
        heads=8,
        seq=1024,
        batch=2,
        device_tflops=300,
        d2h_gbps=25,
        h2d_gbps=25,
    )
    path = tmp_path / "prof.json"
    p.save(path)
    q = Profile.load(path)
    assert q == p
    assert isinstance(q.regions[0].ops[0].outputs, tuple)
    budget = p.activation_bytes // 3
    assert solve(q, budget_bytes=budget).placements == solve(p, budget_bytes=budget).placements


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_copy_is_equal_and_independent(seed: int) -> None:
    p = random_profile(seed)
    p.meta = {"gpu": {"name": "H200"}}
    q = p.copy()
    assert q == p and type(q.regions[0]) is type(p.regions[0])
    # every mutable level is a new object: changing the copy leaves the original alone
    before = p.to_dict()
    q.forward_seconds += 1.0
    q.meta["gpu"]["name"] = "other"
    q.root.append(q.root[0] if q.root else q.regions[0].storages[0])
    for r in q.regions:
        r.forward_seconds += 1.0
        r.ops.extend(r.ops[:1])
        for op in r.ops:
            op.seconds += 1.0
        for s in r.storages:
            s.offset_seconds += 1.0
    assert p.to_dict() == before


def test_cost_model_does_not_alias_its_input() -> None:
    p = random_profile(3)
    cm = CostModel()
    cm.update(p)
    p.regions[0].ops[0].seconds += 5.0
    p.regions[0].storages[0].offset_seconds += 5.0
    est = cm.estimate()
    assert est.regions[0].ops[0].seconds == p.regions[0].ops[0].seconds - 5.0
    est.regions[0].forward_seconds += 1.0
    assert cm.estimate().regions[0].forward_seconds == est.regions[0].forward_seconds - 1.0


def test_cost_model_take_keeps_the_profile_and_averages_into_it() -> None:
    first, second = random_profile(5), random_profile(5)
    for r in second.regions:
        for op in r.ops:
            op.seconds *= 2.0
    cm = CostModel(alpha=0.5)
    cm.update(first)
    cm.update(second, take=True)
    want = [0.5 * a.seconds + 0.5 * 2.0 * a.seconds for r in first.regions for a in r.ops]
    got = [op.seconds for r in second.regions for op in r.ops]
    assert got == want  # averaged in place: the model holds `second` itself
    assert cm.estimate() == second and cm.estimate() is not second


def test_host_costs_round_trip_and_older_files_read_as_free() -> None:
    p = random_profile(3)
    p.pack_host_seconds, p.offload_host_seconds, p.reload_host_seconds = 8e-6, 60e-6, 90e-6
    p.regions[0].host_seconds = 0.5
    p.regions[0].backward_host_seconds = 0.25
    q = Profile.from_json(p.to_json())
    assert q == p and q.regions[0].host_seconds == 0.5
    data = p.to_dict()
    for name in ("pack_host_seconds", "offload_host_seconds", "reload_host_seconds"):
        del data[name]
    for r in data["regions"]:
        del r["host_seconds"], r["backward_host_seconds"]
    old = Profile.from_dict(data)  # a file without them: the runtime costs nothing
    assert old.pack_host_seconds == 0.0 and old.regions[0].host_seconds is None


def test_a_snapshot_storage_round_trips_and_plans_the_same(tmp_path: Path) -> None:
    """A region call's buffer copies (kind ``snapshot``) survive a save and load, and the
    loaded profile plans alike (NOTE [Replay and module state] in offrecomp/buffers.py)."""
    p = gpt_profile(
        layers=3, hidden=512, heads=8, seq=1024, batch=2, device_tflops=300, d2h_gbps=25, h2d_gbps=25
    )
    for r in p.regions:
        r.storages.append(StorageRecord(nbytes=1 << 20, kind="snapshot", saves=0))
    path = tmp_path / "prof.json"
    p.save(path)
    q = Profile.load(path)
    assert q == p and q.regions[0].storages[-1].kind == "snapshot"
    budget = p.activation_bytes // 3
    assert solve(q, budget_bytes=budget).placements == solve(p, budget_bytes=budget).placements


def test_a_profile_says_its_version_and_version_1_files_read_with_the_fields_they_lack() -> None:
    """PROFILE_VERSION 2 adds the transient and lifetime fields (``transient_bytes``,
    ``held``, ``freed_op``, ``outlives_call``), 3 ``returned``: a build reading only an
    earlier version refuses a file with them by its version, not by a field it does not
    know, and a version 1 file reads here with their defaults. A later version is
    refused with the versions this build reads."""
    p = random_profile(5)
    p.regions[0].storages[0].outlives_call = True
    p.regions[0].storages[0].freed_op = 2
    p.regions[0].storages[0].returned = True
    data = p.to_dict()
    assert data["version"] == PROFILE_VERSION == 3
    assert Profile.from_dict(data) == p
    for r in data["regions"]:
        for o in r["ops"]:
            del o["transient_bytes"]
        for s in r["storages"]:
            del s["held"], s["freed_op"], s["outlives_call"], s["returned"]
    for s in data["root"]:
        del s["held"], s["freed_op"], s["outlives_call"], s["returned"]
    data["version"] = 1
    old = Profile.from_dict(data)
    assert old.version == PROFILE_VERSION  # read into this build's format
    assert not old.regions[0].storages[0].outlives_call and old.regions[0].storages[0].freed_op == -1
    assert not old.regions[0].storages[0].returned
    assert all(op.transient_bytes == 0 for r in old.regions for op in r.ops)
    with pytest.raises(ValueError, match="profile version 4 is not supported; this build reads versions 1 to 3"):
        Profile.from_dict({**p.to_dict(), "version": 4})


def test_a_profile_is_written_whole(tmp_path: Path) -> None:
    """Two writers (ranks sharing a path) or a reader never see half a profile: each save
    goes to a file beside it and is moved over it, the old file's mode kept, no temporary
    left behind."""
    import os
    import threading

    p = gpt_profile(layers=6, hidden=256, heads=4, seq=512, batch=2, device_tflops=300, d2h_gbps=25, h2d_gbps=25)
    path = tmp_path / "prof.json"
    p.save(path)
    os.chmod(path, 0o640)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(20):
                p.save(path)
        except BaseException as exc:  # reported below
            errors.append(exc)

    writers = [threading.Thread(target=write) for _ in range(2)]
    for t in writers:
        t.start()
    while any(t.is_alive() for t in writers):
        assert Profile.load(path) == p
    for t in writers:
        t.join()
    assert not errors
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert sorted(f.name for f in tmp_path.iterdir()) == ["prof.json"]


def test_a_profile_written_through_a_symlink_keeps_the_link_and_the_umask(tmp_path: Path) -> None:
    import os

    p = gpt_profile(layers=2, hidden=64, heads=4, seq=32, batch=1, device_tflops=300, d2h_gbps=25, h2d_gbps=25)
    target = tmp_path / "real.json"
    link = tmp_path / "prof.json"
    p.save(target)
    os.symlink(target, link)
    p.save(link)
    assert link.is_symlink() and Profile.load(target) == p
    old = os.umask(0o077)
    try:
        p.save(tmp_path / "new.json")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "new.json").st_mode & 0o777 == 0o600
