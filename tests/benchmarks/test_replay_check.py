"""The replay check runs on CPU: each replay of a settled plan beside its prediction,
with the ops the profile predicts and those the replay ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import replay_check

TINY = ["--preset", "cpu-tiny", "--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "128", "--batch", "1"]


def test_each_dropping_replay_is_set_beside_its_prediction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert replay_check.main([*TINY, "--budget-fraction", "0.4", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["step"]["phase"] == "planned" and data["phases_before"][-1] == "planned"
    calls = data["calls"]
    assert calls, data["explain"]  # a budget under half of keep's drops something
    for c in calls:
        assert c["predicted_ms"] > 0 and c["measured_ms"] > 0 and c["mode"] in ("serving", "plain")
        assert c["profile_ops"] and c["ran_ops"]
        actions = {o["action"] for o in c["profile_ops"]}
        assert "run" in actions and actions <= {"run", "serve", "stub", "-"}
    printed = capsys.readouterr().out
    assert "furthest off:" in printed and "the ops its replay ran (measured):" in printed


def test_a_bad_budget_fraction_is_named() -> None:
    assert replay_check.main([*TINY, "--budget-fraction", "1.5"]) == 2
