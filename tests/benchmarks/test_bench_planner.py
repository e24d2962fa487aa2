"""The planner benchmark checks auto's budget on the allocator's peak, rotates the order
of its strategies each round, and exits non-zero when a check fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_planner
from tests.benchmarks.refused import refused, started

ARGS = ["--layers", "2", "--hidden", "32", "--seq", "32", "--warmup", "3", "--repeats", "4", "--dropout", "0"]


def test_checks_on_the_allocator_peak_and_rotates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    firsts: list[str] = []
    ctx = bench_planner.Strategy.ctx

    def seen(self: bench_planner.Strategy) -> Any:
        firsts.append(self.name)
        return ctx(self)

    monkeypatch.setattr(bench_planner.Strategy, "ctx", seen)
    out = tmp_path / "planner.json"
    rc = bench_planner.main([*ARGS, "--out", str(out)])
    res = json.loads(out.read_text())
    checks = res["checks"]
    assert "auto_allocator_peak_within_budget_x1.05" in checks
    assert rc == (0 if all(checks.values()) else 1)
    assert "check auto_allocator_peak_within_budget_x1.05: " in capsys.readouterr().out
    # 4 warm-up contexts, then 4 timed rounds of 4 (the first of each round), then 4 peaks
    rounds = [firsts[4 + 4 * r : 8 + 4 * r] for r in range(4)]
    assert [r[0] for r in rounds] == ["plain", "keep", "recompute", "auto"], rounds


@pytest.mark.parametrize(
    ("auto_peak", "within"),
    [(400, True), (1450, True), (1451, False), (2000, False)],
)
def test_allocator_within_budget_allows_the_rest_plus_the_budget_and_five_percent(auto_peak: int, within: bool) -> None:
    # the baseline peaked at 1000 B with 600 B of activations: 400 B of the rest of a
    # step; auto may hold its 1000 B budget and 5% on top of that: 1450 B at most
    assert bench_planner.allocator_within_budget(auto_peak, 1000, 600, 1000) is within


def test_a_failed_check_exits_non_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_planner, "allocator_within_budget", lambda *a: False)
    assert bench_planner.main(ARGS) == 1


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--layers", "0"], "argument --layers: '0' is invalid; accepted: an integer, 1 or more"),
        (["--batch", "0"], "argument --batch: '0' is invalid; accepted: an integer, 1 or more"),
        (["--heads", "3"], "--hidden 32 is not a multiple of --heads 3; accepted: a head count that divides the width"),
        (["--dropout", "1"], "argument --dropout: '1' is invalid; accepted: a number in [0, 1)"),
        (["--budget-fraction", "0"], "argument --budget-fraction: '0' is invalid; accepted: a number in (0, 1]"),
        (["--budget-fraction", "1.5"], "argument --budget-fraction: '1.5' is invalid; accepted: a number in (0, 1]"),
        (["--repeats", "0"], "argument --repeats: '0' is invalid; accepted: an integer, 1 or more"),
        (["--warmup", "-1"], "argument --warmup: '-1' is invalid; accepted: an integer, 0 or more"),
        (["--min-bytes", "64XB"], "argument --min-bytes: '64XB' is invalid; accepted: an integer byte count or a number with a unit"),
        (["--device", "tpu"], "--device 'tpu' is invalid; accepted: cpu, cuda, cuda:N"),
        (["--out", "/no/such/folder/p.json"], "argument --out: '/no/such/folder/p.json': its folder '/no/such/folder' does not exist"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_planner, "build_model", started)
    assert said in refused(bench_planner.main, [*ARGS, *argv], capsys)
