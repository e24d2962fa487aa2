"""benchmarks/offload_headroom.py on a saved profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import offload_headroom
from scheduler import gpt_profile
from scheduler.cost_model import HOST_COSTS


def test_a_saved_profile_gets_both_budgets_with_the_link_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "profile.json"
    gpt_profile(
        layers=8, hidden=512, heads=8, seq=4096, batch=1, device_tflops=100.0, d2h_gbps=0.001, h2d_gbps=0.001
    ).save(path)
    assert offload_headroom.main(["--profile", str(path), "--gbps", "50"]) == 0
    out = capsys.readouterr().out
    assert "link 50/50 GB/s" in out
    rows = [line.split() for line in out.splitlines() if line.lstrip().startswith("-")]
    assert [r[1] for r in rows] == ["50%", "25%"]
    for r in rows:
        auto_over_no, bound_over_no = float(r[5]), float(r[9])
        assert bound_over_no <= auto_over_no <= 1.0


def test_no_host_cost_lets_offloading_gain_what_the_link_allows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A saved profile whose runtime host costs are dear enough that no plan offloads:
    with them set to zero the plan that may offload beats the one that may not at some
    budget, and loses at none."""
    path = tmp_path / "profile.json"
    profile = gpt_profile(
        layers=8, hidden=1024, heads=8, seq=4096, batch=1, device_tflops=400.0, d2h_gbps=25.0, h2d_gbps=25.0
    )
    for field in HOST_COSTS:
        setattr(profile, field, 0.05)  # 50 ms a save, a group...: offloading never pays
    profile.save(path)
    ratios = {}
    for flag in ([], ["--no-host-cost"]):
        assert offload_headroom.main(["--profile", str(path), *flag]) == 0
        out = capsys.readouterr().out
        assert ("set to zero (--no-host-cost)" in out) == bool(flag), out
        rows = [line.split() for line in out.splitlines() if line.lstrip().startswith("-")]
        ratios[bool(flag)] = [float(r[5]) for r in rows]
    assert ratios[False] == [1.0, 1.0], ratios
    assert min(ratios[True]) < 1.0 and all(r <= 1.0 for r in ratios[True]), ratios


def test_bad_figures_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        offload_headroom.main(["--mfu", "2"])
    assert "--mfu 2.0" in capsys.readouterr().err
