"""The dynamic-padding benchmark runs, meets auto's budget, and borrows plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_dynamic_shapes
from tests.benchmarks.refused import refused, started


def test_dynamic_shapes_benchmark_borrows_within_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dyn.json"
    rc = bench_dynamic_shapes.main([
        "--layers", "4", "--hidden", "64", "--min-seq", "16", "--max-seq", "64",
        "--steps", "12", "--rounds", "1", "--out", str(out),
    ])
    assert rc == 0
    text = capsys.readouterr().out
    assert "check auto_peak_within_budget_x1.05: PASS" in text
    assert "check auto_allocator_peak_within_budget_x1.05: PASS" in text
    res = json.loads(out.read_text())
    assert set(res["strategies"]) == {"plain", "ckpt_block", "recompute", "auto"}
    assert res["auto_phases"].get("borrowed", 0) > 0
    assert res["strategies"]["auto"]["peak_activation_bytes"] <= res["budget_bytes"] * 1.05
    assert res["checks"]["auto_allocator_peak_within_budget_x1.05"]


def test_the_allocator_check_fails_over_the_budget_and_passes_within_it() -> None:
    """The check the benchmark runs (bench_planner's): a baseline's peak less its
    activations, plus the budget and 5% of it."""
    check = bench_dynamic_shapes.allocator_within_budget
    assert check(1450, 1000, 600, 1000) and check(400, 1000, 600, 1000)
    assert not check(1451, 1000, 600, 1000) and not check(1100, 1000, 0, 95)


def test_dynamic_shapes_benchmark_fails_on_the_allocator_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory the runtime's books miss shows in the allocator's peak: the check fails,
    and the benchmark exits non-zero."""
    monkeypatch.setattr(bench_dynamic_shapes, "allocator_within_budget", lambda *a: False)
    rc = bench_dynamic_shapes.main([
        "--layers", "2", "--hidden", "32", "--min-seq", "16", "--max-seq", "32", "--steps", "6", "--rounds", "1",
    ])
    assert rc == 1


def test_dynamic_shapes_benchmark_rejects_bad_lengths() -> None:
    with pytest.raises(SystemExit):
        bench_dynamic_shapes.main(["--min-seq", "50", "--max-seq", "10"])


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--layers", "0"], "argument --layers: '0' is invalid; accepted: an integer, 1 or more"),
        (["--batch", "0"], "argument --batch: '0' is invalid; accepted: an integer, 1 or more"),
        (["--hidden", "30", "--heads", "4"], "--hidden 30 is not a multiple of --heads 4; accepted: a head count that divides the width"),
        (["--steps", "0"], "argument --steps: '0' is invalid; accepted: an integer, 1 or more"),
        (["--rounds", "0"], "argument --rounds: '0' is invalid; accepted: an integer, 1 or more"),
        (["--budget-fraction", "0"], "argument --budget-fraction: '0' is invalid; accepted: a number in (0, 1]"),
        (["--budget-fraction", "2"], "argument --budget-fraction: '2' is invalid; accepted: a number in (0, 1]"),
        (["--device", "tpu"], "--device 'tpu' is invalid; accepted: cpu, cuda, cuda:N"),
        (["--out", "/no/such/folder/d.json"], "argument --out: '/no/such/folder/d.json': its folder '/no/such/folder' does not exist"),
    ],
)
def test_dynamic_shapes_benchmark_names_a_bad_argument(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_dynamic_shapes, "build_model", started)
    assert said in refused(bench_dynamic_shapes.main, ["--layers", "1", "--steps", "2", "--rounds", "1", *argv], capsys)
