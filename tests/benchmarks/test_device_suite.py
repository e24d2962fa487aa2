"""benchmarks/device_suite.sh runs end to end in its CPU dry-run mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.dry_run import archived, dry_run, needs_bash_and_tar

STEPS = (
    "warmup", "cuda_tests", "bench_offload", "long_seq", "bench_dynamic_shapes", "bench_host_overhead",
    "bench_host_overhead_thread", "profile_step", "cuda_tests_compiled",
)  # fmt: skip


@pytest.mark.slow
@needs_bash_and_tar
def test_dry_run_writes_every_result(tmp_path: Path, warm_python: str) -> None:
    out, log = dry_run("device_suite.sh", tmp_path, 900, python=warm_python)
    assert "dry run: 1" in log and "done" in log
    for name in STEPS:
        assert f"[{name}: exit 0]" in log, name
    # the planner benchmark exits 1 when one of its checks fails, as at these tiny sizes
    # (a budget of half of keep's bytes is below the most frugal plan's): it ran to its end
    assert "[bench_planner_32: exit 0]" in log or "[bench_planner_32: exit 1]" in log

    files = archived(out)
    for path in (
        "env.txt",
        "bench_planner_32.json",
        "bench_planner_profile_32.json",
        "cuda_tests.log",
        "bench_offload.json",
        "long_seq/results.json",
        "bench_dynamic_shapes.json",
        "bench_host_overhead.json",
        "bench_host_overhead_thread.json",
        "profile_step.json",
        "cuda_tests_compiled.log",
    ):
        assert path in files, path
    planner = json.loads(files["bench_planner_32.json"])
    long_seq = json.loads(files["long_seq/results.json"])
    compiled = files["cuda_tests_compiled.log"].decode()
    assert planner["checks"] and "auto" in {r["strategy"] for r in planner["rows"]}
    assert {r["strategy"] for r in long_seq["rows"]} == {
        "none", "ckpt_block", "offrecomp_recompute", "offrecomp_auto@50%"
    }  # fmt: skip
    assert "skipped" in compiled and "deselected" in compiled  # compiled tests selected, then skipped
    assert (out / "profile_trace.json.gz").stat().st_size > 0
