"""The bytecode counter runs every variant, reproduces its counts, and names the save
path's functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import count_hot_path


def test_count_hot_path_reports_every_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "counts.json"
    assert count_hot_path.main(["--ops", "32", "--steps", "2", "--top", "10", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for row in ("identity hook pair (floor)", "grouped hook pair, no copies (floor)", "offrecomp keep", "offrecomp keep, hooks on",
                "offrecomp offload, 16 saves per region", "offrecomp auto, 16 per region, kept"):
        assert row in text
    res = json.loads(out.read_text())
    assert res["saves"] == 33 and res["steps"] == 2
    per_save = res["bytecodes_per_save_over_plain"]
    # the floor runs two one-line lambdas; offload runs the save path in Python
    assert per_save["identity hook pair (floor)"] < 10 < per_save["offrecomp offload, 16 saves per region"]
    # the grouped floor detaches, appends and indexes: more than the identity pair, and
    # far less than the runtime's save path
    grouped = per_save["grouped hook pair, no copies (floor)"]
    assert per_save["identity hook pair (floor)"] < grouped < per_save["offrecomp offload, 16 saves per region"] / 4
    # periodic work aside, two windows count alike
    assert res["unsteady"].get("offrecomp offload, 16 saves per region", 0.0) < 0.02
    # the grouped engine's device calls per group: one copy per storage out (two groups of
    # 16 saves and the root's few) and one back per reload, one reload buffer, a handful
    # of events and waits
    calls = res["offload_device_calls_per_group"]
    assert 8 < calls["copy (per tensor)"] <= 18 and calls["alloc_device"] == 1.0, calls
    assert sum(calls.values()) - calls["copy (per tensor)"] < 30, calls
    assert res["functions_of"] == "offrecomp offload, 16 saves per region"
    names = [f["function"] for f in res["functions"]]
    assert any(name.endswith("Placer.pack") for name in names)
    # another variant's functions: keep with the hooks on runs the general save path
    assert count_hot_path.main(["--ops", "32", "--steps", "1", "--detail", "hooks on", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["functions_of"] == "offrecomp keep, hooks on"
    assert any(f["function"].endswith("Placer._new_storage") for f in res["functions"])


def test_count_hot_path_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        count_hot_path.main(["--ops", "1"])
    with pytest.raises(SystemExit):
        count_hot_path.main(["--steps", "0"])
    with pytest.raises(SystemExit):
        count_hot_path.main(["--ops", "8", "--detail", "no such variant"])
