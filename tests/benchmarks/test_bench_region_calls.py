"""benchmarks/bench_region_calls.py times a region call's entry and exit by part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_region_calls
from offrecomp import calls
from offrecomp.backends import EmulatedBackend
from tests.benchmarks.refused import started


def test_entry_exit_and_capture_parts_per_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    argv = ["--layers", "2", "--steps", "2", "--warmup", "3", "--modes", "keep,recompute,offload", "--out", str(out)]
    assert bench_region_calls.main(argv) == 0
    modes = json.loads(out.read_text())["modes"]
    for mode in ("keep", "recompute", "offload"):
        rows = modes[mode]
        assert rows["entry"]["calls_per_step"] == rows["exit"]["calls_per_step"] == 2  # one per block
        assert rows["entry"]["us_per_call"] > 0
    # only a call that may replay keeps what the replay needs; only offload issues groups
    assert "entry: keep what a replay needs" in modes["recompute"] and "  parameters" in modes["recompute"]
    assert "entry: keep what a replay needs" not in modes["keep"] and "entry: keep what a replay needs" not in modes["offload"]
    assert "exit: issue the offload group" in modes["offload"]
    # the engine's issue by part, on the emulated backend here (a part of the CUDA
    # backend has the same row), and a group's fetch in backward
    issue = modes["offload"]["exit: issue the offload group"]
    for part in ("  the engine's issue", "    copies (a group each way)", "    events (both ways)",
                 "    host views of the slots"):
        assert part in modes["offload"] and part not in modes["keep"], part
    copies = modes["offload"]["    copies (a group each way)"]["calls_per_step"]
    assert copies == 2 * issue["calls_per_step"]  # one call per group to host, one per reload
    assert modes["offload"]["backward: fetch a group"]["calls_per_step"] >= 2
    assert "  parameters" in capsys.readouterr().out
    assert calls.RegionCalls.enter.__name__ == "enter"  # the timers are gone after the run
    assert "record_ordering_event" not in vars(EmulatedBackend)  # an inherited one is the base's again


@pytest.mark.parametrize(
    "argv",
    [["--modes", "auto"], ["--steps", "0"], ["--hidden", "33"], ["--device", "tpu"], ["--heads", "0"],
     ["--out", "/no/such/folder/r.json"]],
)
def test_bad_arguments_are_refused(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_region_calls, "run", started)
    with pytest.raises(SystemExit) as exc:
        bench_region_calls.main(argv)
    assert exc.value.code == 2
