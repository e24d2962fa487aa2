"""benchmarks/model_fit.py: measured over predicted, part by part, over a run's steady
planned steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.model_fit import fit, main
from scheduler import gpt_profile
from tests.benchmarks.refused import refused


def _step(step: float, fwd: float, replay: float, pred: tuple[float, float, float], **kw: Any) -> dict[str, Any]:
    return {
        "phase": "planned", "plan_id": "a", "step_seconds": step, "forward_seconds": fwd, "recompute_seconds": replay,
        "predicted_step_seconds": pred[0], "predicted_forward_seconds": pred[1], "predicted_recompute_seconds": pred[2],
        "forward_host_seconds": fwd / 2, "stall_seconds": 0.001, "predicted_stall_seconds": 0.002, **kw,
    }


def _row(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"strategy": "offrecomp_auto@50%", "seq": 8192, "status": "ok", "median_ms": 1.0,
            "extras": {"report": {"steps": [{"phase": "measure", "step_seconds": 9.0}, *steps]}}}


def test_the_parts_of_the_steady_steps() -> None:
    pred = (1.0, 0.4, 0.2)
    steps = [
        _step(3.0, 2.0, 0.5, pred),  # the plan's first step: left out
        _step(1.1, 0.36, 0.3, pred),
        _step(5.0, 4.0, 0.5, pred, pause_seconds=1.0),  # a host pause: left out
        _step(0.9, 0.44, 0.1, pred),
    ]
    f = fit(_row(steps))
    assert f is not None and f["steps"] == 2
    assert f["step"] == pytest.approx(1.0)  # 1.1 and 0.9
    assert f["forward"] == pytest.approx(1.0)  # 0.9 and 1.1
    assert f["replay"] == pytest.approx(1.0)  # 1.5 and 0.5
    assert f["rest"] == pytest.approx((0.44 / 0.4 + 0.36 / 0.4) / 2)
    assert (f["stall_ms"], f["predicted_stall_ms"], f["host_per_device_forward"]) == pytest.approx((1.0, 2.0, 0.5))
    assert fit(_row(steps[:1])) is None  # only a first step: nothing steady


def test_cli_prints_a_line_per_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "results.json"
    pred = (1.0, 0.4, 0.2)
    path.write_text(json.dumps({"rows": [_row([_step(1.0, 0.4, 0.2, pred), _step(1.0, 0.4, 0.2, pred)]),
                                         {"strategy": "none", "seq": 8192, "status": "ok", "median_ms": 1.0}]}))
    assert main([str(path), "--out", str(tmp_path / "fit.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[2].split()[:3] == ["offrecomp_auto@50%", "8192", "1.000"]
    assert json.loads((tmp_path / "fit.json").read_text())[0]["steps"] == 1


def test_a_missing_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nonexistent.json"
    said = refused(main, [str(path)], capsys)
    assert f"results '{path}': cannot read it: No such file or directory" in said


@pytest.mark.parametrize(
    ("kind", "looks"),
    [
        ("profile", "it looks like a planner profile (what OFFRECOMP_PROFILE saves), which "
                    "benchmarks/offload_headroom.py --profile reads"),
        ("report", "it looks like a run's report, which `python -m offrecomp report FILE` reads"),
        ("planner", "it looks like a JSON object with keys args, rows"),  # bench_planner.py's --out
        ("text", "it looks like no JSON"),
    ],
)
def test_a_file_that_is_no_results_file_is_refused(
    kind: str, looks: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "file.json"
    if kind == "profile":
        gpt_profile(layers=1, hidden=64, heads=2, seq=16, batch=1, device_tflops=1.0, d2h_gbps=1.0, h2d_gbps=1.0).save(path)
    elif kind == "report":
        path.write_text("".join(json.dumps({"step": i, "phase": "measure", "step_seconds": 0.1}) + "\n" for i in range(2)))
    elif kind == "planner":
        path.write_text(json.dumps({"args": {}, "rows": [{"strategy": "auto", "median_step_s": 0.1}]}))
    else:
        path.write_text("strategy,seq\nnone,64\n")
    said = refused(main, [str(path)], capsys)
    assert f"results '{path}' is not a results file of `python -m benchmarks.long_seq`" in said and looks in said
