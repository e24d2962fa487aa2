"""The replay check runs on CPU: each replay of a settled plan beside its prediction,
with the ops the profile predicts and those the replay ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import replay_check
from tests.benchmarks.refused import refused, started

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


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--budget-fraction", "1.5"], "argument --budget-fraction: '1.5' is invalid; accepted: a number in (0, 1]"),
        (["--heads", "3"], "--hidden 64 is not a multiple of --heads 3"),
        (["--batch", "0"], "argument --batch: '0' is invalid; accepted: an integer, 1 or more"),
        (["--out", "."], "argument --out: '.' is a folder; accepted: the path of a file to write"),
    ],
)
def test_a_bad_argument_is_named(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(replay_check, "start_run", started)
    assert said in refused(replay_check.main, [*TINY, *argv], capsys)
