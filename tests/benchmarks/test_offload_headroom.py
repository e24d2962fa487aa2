"""benchmarks/offload_headroom.py on a saved profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import offload_headroom
from scheduler import gpt_profile


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


def test_bad_figures_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        offload_headroom.main(["--mfu", "2"])
    assert "--mfu 2.0" in capsys.readouterr().err
