"""The cache-argument benchmark runs and writes its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_cache_args
from tests.benchmarks.refused import refused, started

pytest.importorskip("transformers")


def test_cache_args_benchmark_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cache.json"
    assert bench_cache_args.main(["--layers", "3", "--seq", "8", "--rounds", "2", "--warmup", "1", "--out", str(out)]) == 0
    assert "the cache adds" in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert set(res["ms_per_step"]) == {"cache", "no cache"} and all(v > 0 for v in res["ms_per_step"].values())


def test_cache_args_benchmark_names_a_bad_option() -> None:
    with pytest.raises(SystemExit):
        bench_cache_args.main(["--layers", "0"])


def test_cache_args_benchmark_names_an_out_file_it_cannot_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_cache_args, "_model", started)
    said = refused(bench_cache_args.main, ["--layers", "1", "--rounds", "1", "--warmup", "0", "--out", str(tmp_path)], capsys)
    assert f"argument --out: '{tmp_path}' is a folder; accepted: the path of a file to write" in said
