"""The dynamic-padding benchmark runs, meets auto's budget, and borrows plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_dynamic_shapes


def test_dynamic_shapes_benchmark_borrows_within_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dyn.json"
    rc = bench_dynamic_shapes.main([
        "--layers", "4", "--hidden", "64", "--min-seq", "16", "--max-seq", "64",
        "--steps", "12", "--rounds", "1", "--out", str(out),
    ])
    assert rc == 0
    text = capsys.readouterr().out
    assert "check auto_peak_within_budget_x1.05: PASS" in text
    res = json.loads(out.read_text())
    assert set(res["strategies"]) == {"plain", "ckpt_block", "recompute", "auto"}
    assert res["auto_phases"].get("borrowed", 0) > 0
    assert res["strategies"]["auto"]["peak_activation_bytes"] <= res["budget_bytes"] * 1.05


def test_dynamic_shapes_benchmark_rejects_bad_lengths() -> None:
    with pytest.raises(SystemExit):
        bench_dynamic_shapes.main(["--min-seq", "50", "--max-seq", "10"])
