"""benchmarks/bench_solver.py refuses a bad command line before it solves anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_solver
from tests.benchmarks.refused import refused, started


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--repeats", "0"], "argument --repeats: '0' is invalid; accepted: an integer, 1 or more"),
        (["--repeats", "-3"], "argument --repeats: '-3' is invalid; accepted: an integer, 1 or more"),
        (["--json", "/no/such/folder/s.json"], "argument --json: '/no/such/folder/s.json': its folder '/no/such/folder' does not exist"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_solver, "gpt_profile", started)
    assert said in refused(bench_solver.main, argv, capsys)


def test_a_folder_is_no_json_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    said = refused(bench_solver.main, ["--json", str(tmp_path)], capsys)
    assert f"argument --json: '{tmp_path}' is a folder; accepted: the path of a file to write" in said
