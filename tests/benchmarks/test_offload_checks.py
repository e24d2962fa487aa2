"""benchmarks/offload_checks.py judges each criterion by its figures, and
benchmarks/device_offload.sh runs end to end in its CPU dry-run mode."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks.offload_checks import checks, main
from scheduler import gpt_profile
from tests.benchmarks.dry_run import ROOT, archived, dry_run, needs_bash_and_tar
from tests.benchmarks.refused import refused

GIB = 2**30


def _row(
    strategy: str, ms: float, peak_gib: float, steps: list[tuple[float, float, int]] | None = None,
    *, pauses: dict[int, float] | None = None,
) -> dict[str, Any]:
    """A long_seq row; ``steps``: (measured s, predicted s, offloaded bytes) per planned
    step of one plan (the first left out of the prediction criterion); ``pauses``: host
    pause seconds by index in ``steps``."""
    extras: dict[str, Any] = {}
    if steps is not None:
        records = [{"phase": "measure", "step_seconds": 1.0, "predicted_step_seconds": None, "offloaded_bytes": 0}]
        records += [
            {"phase": "planned", "step_seconds": m, "predicted_step_seconds": p, "offloaded_bytes": b,
             "plan_id": "a", "pause_seconds": (pauses or {}).get(i, 0.0)}
            for i, (m, p, b) in enumerate(steps)
        ]
        extras = {"report": {"config": {}, "steps": records}, "median_offloaded_bytes": max((b for *_, b in steps), default=0)}
    return {"strategy": strategy, "seq": 8192, "status": "ok", "median_ms": ms, "peak_bytes": int(peak_gib * GIB),
            "extras": extras}


def _verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {c.name: c.verdict for c in checks({"rows": rows})}


def test_every_criterion_passes_and_fails_by_its_threshold() -> None:
    good = [
        _row("none", 100.0, 20),
        _row("offrecomp_keep", 100.9, 20, []),
        _row("offrecomp_auto@50%", 110.0, 12, [(0.11, 0.105, GIB), (0.11, 0.104, GIB), (0.2, 0.1, 0)]),
        _row("offrecomp_auto_no_offload@50%", 116.0, 12, [(0.116, 0.11, 0)]),
        _row("ckpt_block", 122.0, 8),  # below auto's memory, slower
        _row("sac_matmul", 105.0, 15),  # faster, but above auto's memory: not a rival
    ]
    assert _verdicts(good) == {
        "keep": "pass",
        "auto@50% offloads": "pass",
        "auto@50% prediction": "pass",  # neither the plan's first step nor the non-offloading one judged
        "auto@50% vs no offload": "pass",
        "auto@50% vs peers": "pass",
    }
    bad = [
        _row("none", 100.0, 20),
        _row("offrecomp_keep", 101.5, 20, []),
        _row("offrecomp_auto@50%", 110.0, 12, [(0.13, 0.1, GIB), (0.13, 0.1, GIB)]),
        _row("offrecomp_auto_no_offload@50%", 114.0, 12, [(0.114, 0.11, 0)]),
        _row("ckpt_block", 109.0, 8),
    ]
    assert _verdicts(bad) == {
        "keep": "fail",
        "auto@50% offloads": "pass",
        "auto@50% prediction": "fail",
        "auto@50% vs no offload": "fail",  # 0.965: not 5% faster
        "auto@50% vs peers": "fail",
    }


def test_prediction_judges_steady_steps_and_gives_every_steps_figure() -> None:
    """A plan's first step (one-time costs) and a step a host pause distorted are left
    out of the prediction criterion; its line also gives the median over every
    offloading step, and says n/a where no steady one is left."""
    steps = [(0.13, 0.1, GIB), (0.1, 0.1, GIB), (0.33, 0.1, GIB), (0.102, 0.1, GIB)]
    rows = [_row("offrecomp_auto@50%", 110.0, 12, steps, pauses={2: 0.2})]
    found = {c.name: (c.verdict, c.detail) for c in checks({"rows": rows})}
    assert found["auto@50% prediction"] == (
        "pass", "measured/predicted 1.010 over 2 steady offloading steps (within 10%; 1.160 over all 4)"
    )
    rows = [_row("offrecomp_auto@50%", 110.0, 12, [(0.13, 0.1, GIB), (0.33, 0.1, GIB)], pauses={1: 0.2})]
    verdict, detail = {c.name: (c.verdict, c.detail) for c in checks({"rows": rows})}["auto@50% prediction"]
    assert verdict == "n/a" and detail.startswith("no steady offloading step (2 offloading steps")


def test_vs_no_offload_gives_the_predicted_ratio() -> None:
    """The line of the 5% criterion also says what the planner predicted for both plans
    (the medians of their planned steps' predictions), or that it could not."""
    rows = [
        _row("offrecomp_auto@50%", 110.0, 12, [(0.11, 0.105, GIB), (0.11, 0.103, GIB), (0.2, 0.101, 0)]),
        _row("offrecomp_auto_no_offload@50%", 116.0, 12, [(0.116, 0.1, 0), (0.117, 0.11, 0)]),
        _row("offrecomp_auto@25%", 120.0, 6, [(0.12, 0.12, GIB)]),
        _row("offrecomp_auto_no_offload@25%", 121.0, 6),
    ]
    found = {c.name: c.detail for c in checks({"rows": rows})}
    assert found["auto@50% vs no offload"] == "110.0 / 116.0 ms = 0.948 (<= 0.95); predicted 0.981"  # 0.103 / 0.105
    assert found["auto@25% vs no offload"].endswith("; predicted: n/a")


def test_a_plan_that_never_offloads_and_missing_runs() -> None:
    rows = [_row("none", 100.0, 20), _row("offrecomp_auto@25%", 120.0, 6, [(0.12, 0.12, 0)])]
    found = {c.name: (c.verdict, c.detail) for c in checks({"rows": rows})}
    assert found["auto@25% offloads"][0] == "fail"
    assert found["auto@25% prediction"][0] == "n/a"
    assert found["auto@25% vs no offload"] == ("n/a", "offrecomp_auto_no_offload@25% did not run")
    assert found["auto@25% vs peers"] == ("n/a", "no peer ran")
    assert found["keep"][0] == "n/a"


def test_cli_prints_and_exits_by_the_verdicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"rows": [_row("none", 100.0, 20), _row("offrecomp_keep", 100.5, 20, [])]}))
    assert main([str(path), "--out", str(tmp_path / "c.json")]) == 0
    assert "2 checks: 1 pass, 0 fail, 1 n/a" in capsys.readouterr().out
    assert json.loads((tmp_path / "c.json").read_text())[0]["verdict"] == "pass"
    path.write_text(json.dumps({"rows": [_row("none", 100.0, 20), _row("offrecomp_keep", 103.0, 20, [])]}))
    assert main([str(path)]) == 1


def test_a_file_that_is_no_results_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "prof.json"  # what OFFRECOMP_PROFILE saves: no rows to judge
    gpt_profile(layers=1, hidden=64, heads=2, seq=16, batch=1, device_tflops=1.0, d2h_gbps=1.0, h2d_gbps=1.0).save(profile)
    said = refused(main, [str(profile)], capsys)
    assert f"results '{profile}' is not a results file of `python -m benchmarks.long_seq`" in said
    assert "it looks like a planner profile (what OFFRECOMP_PROFILE saves)" in said
    planner = tmp_path / "planner.json"  # bench_planner.py's --out: rows without a seq
    planner.write_text(json.dumps({"args": {}, "rows": [{"strategy": "auto", "median_step_s": 0.1}]}))
    assert "it looks like a JSON object with keys args, rows" in refused(main, [str(planner)], capsys)
    missing = tmp_path / "missing.json"
    said = refused(main, [str(missing)], capsys)
    assert f"results '{missing}': cannot read it: No such file or directory" in said
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"rows": [_row("none", 100.0, 20)]}))
    said = refused(main, [str(results), "--out", str(tmp_path / "no" / "c.json")], capsys)
    assert f"argument --out: '{tmp_path / 'no' / 'c.json'}': its folder '{tmp_path / 'no'}' does not exist" in said


#: The steps device_offload.sh runs in its dry run (SEQS=128, SHORT=64), each once.
DRY_RUN_STEPS = (
    "warmup", "cuda_tests", "profile_step", "region_calls", "issue_primitives",
    "long_seq_128", "headroom_128", "headroom_free_128", "long_seq_64", "headroom_64", "headroom_free_64",
    "replay_check_128",
)  # fmt: skip


@pytest.mark.slow
@needs_bash_and_tar
def test_device_offload_dry_run_writes_every_result(tmp_path: Path, warm_python: str) -> None:
    out, log = dry_run("device_offload.sh", tmp_path, 600, python=warm_python)
    ran = re.findall(r"\[(\w+): exit (\d+)", log)  # every step's marker, as device_lib.sh's step() prints it
    assert sorted(name for name, _ in ran) == sorted(DRY_RUN_STEPS), (ran, log[-3000:])
    assert [(name, rc) for name, rc in ran if rc != "0"] == [], log[-3000:]
    names = {Path(n).name for n in archived(out)}
    for seq in (64, 128):
        assert f"checks_long_seq_{seq}.json" in names and f"fit_long_seq_{seq}.json" in names
    assert {"profile_step.json", "env.txt", "replay_check_128.json", "region_calls.json", "issue_primitives.json"} <= names
    assert "[region_calls: exit 0]" in log and "[issue_primitives: exit 0]" in log
    assert "[replay_check_128: exit 0]" in log
    for seq in (64, 128):
        assert f"headroom_{seq}.log" in names and f"[headroom_{seq}: exit 0]" in log
        assert f"headroom_free_{seq}.log" in names and f"[headroom_free_{seq}: exit 0]" in log
    assert (out / "profile_trace_64.json.gz").exists()


@needs_bash_and_tar
def test_device_offload_keeps_to_its_budget(tmp_path: Path, warm_python: str) -> None:
    """With no DEVICE_BUDGET_S left, every step says it was skipped (none runs past the
    device tool's limit) and the script still ends, packed, with exit status 0."""
    out, log = dry_run("device_offload.sh", tmp_path, 120, python=warm_python, DEVICE_BUDGET_S="0")
    skipped = [line for line in log.splitlines() if ": skipped, " in line]
    assert len(skipped) >= 8 and all("of DEVICE_BUDGET_S=0 left" in line for line in skipped), log[-3000:]
    assert "[warmup: skipped" in log and "[long_seq_64: skipped" in log and "[replay_check_128: skipped" in log
    assert not re.findall(r"\[\w+: exit \d+", log), log[-3000:]  # no step ran
    assert "[judge long_seq_128: no results.json to judge]" in log and "Traceback" not in log
    assert re.search(r"^== [\d:]+ done$", log, re.MULTILINE) and (out / "results.tgz").exists()


@needs_bash_and_tar
def test_device_offload_runs_the_steps_it_is_told(tmp_path: Path, warm_python: str) -> None:
    """STEPS names the numbered steps to run (the planner's kernels compiled first
    whatever it names); another value, or a budget that is no whole number of seconds,
    is refused, naming the accepted ones."""
    out, log = dry_run("device_offload.sh", tmp_path, 120, python=warm_python, STEPS="5")
    ran = re.findall(r"\[(\w+): exit \d+", log)
    assert ran == ["warmup", "replay_check_128"], log[-3000:]
    assert all(f"{n}. skipped: STEPS=5" in log for n in (1, 2, 3, 4)), log[-3000:]
    assert set(archived(out)) >= {"env.txt", "warmup.log", "replay_check_128.json"}
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "device_offload.sh"), "--dry-run"],
        env={**os.environ, "OUT": str(tmp_path / "bad"), "STEPS": "3,6"}, capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 2 and "STEPS=3,6 is invalid; accepted: step numbers from 1 to 5" in res.stderr
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "device_offload.sh"), "--dry-run"],
        env={**os.environ, "OUT": str(tmp_path / "bad"), "DEVICE_BUDGET_S": "10m"}, capture_output=True, text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "DEVICE_BUDGET_S=10m is invalid; accepted: a whole number of seconds" in res.stderr
