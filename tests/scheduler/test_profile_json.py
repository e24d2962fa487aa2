"""Profiles survive a JSON round trip unchanged (what-if planning reads saved profiles)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import Profile, gpt_profile, solve
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
