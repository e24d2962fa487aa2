"""benchmarks/bench_issue_primitives.py times the calls an offload group's issue is made of."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_issue_primitives
from tests.benchmarks.refused import started


def test_every_call_and_each_way_to_copy_a_group_is_timed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    argv = ["--device", "cpu", "--storages", "3", "--mib", "1", "--reps", "3", "--out", str(out)]
    assert bench_issue_primitives.main(argv) == 0
    result = json.loads(out.read_text())
    rows = result["host_us"]
    for name in ("current_stream", "record_event", "wait_event", "query", "group: per-storage copy_",
                 "group: _foreach_copy_", "group: gathered, views per group", "group: gathered, views made once"):
        assert rows[name] > 0, name  # timed: perf_counter's nanoseconds see even a no-op call
    assert all(us > 0 for us in rows.values()), rows
    assert result["storages"] == 3 and result["dtype"] == "torch.float32"
    assert "group: per-storage copy_" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv", [["--device", "tpu"], ["--storages", "0"], ["--reps", "0"], ["--out", "/no/such/folder/i.json"]]
)
def test_bad_arguments_are_refused(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_issue_primitives, "run", started)
    with pytest.raises(SystemExit) as exc:
        bench_issue_primitives.main([*argv, "--device", "cpu"] if argv[0] != "--device" else argv)
    assert exc.value.code == 2
