"""benchmarks/bench_offload.py refuses a bad command line before it copies anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_offload
from tests.benchmarks.refused import refused, started


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--offload-mib", "-1"], "argument --offload-mib: '-1' is invalid; accepted: an integer, 1 or more"),
        (["--offload-mib", "0"], "argument --offload-mib: '0' is invalid; accepted: an integer, 1 or more"),
        (["--device", "tpu"], "--device 'tpu' is invalid; accepted: auto, cpu, cuda, cuda:N"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    argv: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_offload, "bench_raw", started)
    assert said in refused(bench_offload.main, ["--out", str(tmp_path / "o.json"), *argv], capsys)


def test_a_folder_is_no_result_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench_offload, "bench_raw", started)
    said = refused(bench_offload.main, ["--out", str(tmp_path)], capsys)
    assert f"argument --out: '{tmp_path}' is a folder; accepted: the path of a file to write" in said
