"""benchmarks/offload_headroom.py on a saved profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import offload_headroom
from scheduler import gpt_profile
from scheduler.cost_model import HOST_COSTS
from tests.benchmarks.refused import refused, started


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


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--mfu", "2"], "argument --mfu: '2' is invalid; accepted: a number in (0, 1]"),
        (["--mfu", "0"], "argument --mfu: '0' is invalid; accepted: a number in (0, 1]"),
        (["--tflops", "0", "--mfu", "0.5"], "argument --tflops: '0' is invalid; accepted: a number > 0"),
        (["--gbps", "-5"], "argument --gbps: '-5' is invalid; accepted: a number > 0"),
    ],
)
def test_bad_figures_are_refused_naming_only_the_bad_flag(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(offload_headroom.main, argv, capsys)
    assert said in line
    others = {"--mfu", "--tflops", "--gbps"} - {said.split()[1].rstrip(":")}
    assert not any(flag in line for flag in others), line  # no figure the user did not give


def test_a_file_that_is_no_profile_is_named_for_what_it_looks_like(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(offload_headroom, "solve", started)
    report = tmp_path / "run.jsonl"  # what OFFRECOMP_REPORT writes: one step record a line
    report.write_text("".join(json.dumps({"step": i, "phase": "measure", "step_seconds": 0.1}) + "\n" for i in range(3)))
    said = refused(offload_headroom.main, ["--profile", str(report)], capsys)
    assert f"--profile '{report}' is not a valid profile JSON; it looks like a run's report, " in said
    assert "which `python -m offrecomp report FILE` reads" in said
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"meta": {}, "rows": [{"strategy": "none", "seq": 64, "status": "ok"}]}))
    said = refused(offload_headroom.main, ["--profile", str(results)], capsys)
    assert "it looks like the results.json of `python -m benchmarks.long_seq`" in said
    said = refused(offload_headroom.main, ["--profile", str(tmp_path / "missing.json")], capsys)
    assert f"--profile '{tmp_path / 'missing.json'}': cannot read it: No such file or directory" in said
