"""benchmarks/device_long.sh runs end to end in its CPU dry-run mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.dry_run import archived, dry_run, needs_bash_and_tar


@pytest.mark.slow
@needs_bash_and_tar
def test_dry_run_writes_every_result(tmp_path: Path, warm_python: str) -> None:
    out, log = dry_run(
        "device_long.sh", tmp_path, 900, python=warm_python, WHEELS=str(tmp_path / "no_wheels_here")
    )
    assert "== " in log and "done" in log
    for name in ("warmup", "compile_warm", "long_seq_64", "long_seq_128", "long_seq_256",
                 "search_6MiB", "profile_step"):  # fmt: skip
        assert f"[{name}: exit 0]" in log, name
    assert "torchtune and torchao: NOT installed" in log  # said, not skipped silently

    files = archived(out)
    for path in (
        "env.txt",
        "optional_packages.txt",
        "compile_warm/results.json",
        "long_seq_64/results.json",
        "long_seq_128/results.csv",
        "long_seq_256/results.json",
        "search_6MiB/longest_seq.csv",
        "search_6MiB/results.json",
        "profile_step.json",
    ):
        assert path in files, path
    compare = json.loads(files["long_seq_128/results.json"])
    longest = json.loads(files["long_seq_256/results.json"])
    search = json.loads(files["search_6MiB/results.json"])
    profile = json.loads(files["profile_step.json"])
    peers = {r["strategy"] for r in compare["rows"]}
    assert peers == {  # compile_budget runs in compile_warm and the search in a dry run
        "none", "ckpt_block", "ckpt_sqrt", "sac_matmul", "save_on_cpu",
        "torchtune_offload", "offrecomp_keep", "offrecomp_recompute", "offrecomp_auto@50%",
        "offrecomp_auto@25%",
    }  # fmt: skip
    assert {r["seq"] for r in compare["rows"]} == {128}
    assert compare["meta"]["model"]["max_seq"] == longest["meta"]["model"]["max_seq"]
    ok = {r["strategy"] for r in compare["rows"] if r["status"].startswith("ok")}
    assert {"none", "ckpt_block", "offrecomp_auto@25%"} <= ok
    assert {r["strategy"] for r in longest["rows"]} >= {"none", "ckpt_block", "offrecomp_auto@25%"}
    assert (out / "profile_trace.json.gz").stat().st_size > 0
    found = {s["strategy"]: s for s in search["search"]}
    assert set(found) == {"none", "ckpt_block", "sac_matmul", "torchtune_offload", "compile_budget",
                          "offrecomp_auto@budget"}  # fmt: skip
    assert found["ckpt_block"]["longest_seq"] and found["offrecomp_auto@budget"]["status"] == "ok"
    assert profile["selection"]["offloaded_bytes"] > 0 and profile["top_host_costs"]
