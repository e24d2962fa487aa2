"""The profile summary tool runs on CPU and summarises every part it promises."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from benchmarks import profile_step
from tests.benchmarks.refused import refused, started

TINY = ["--preset", "cpu-tiny", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "64"]
TINY += ["--batch", "1"]


def test_cpu_run_profiles_an_offloading_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, trace = tmp_path / "p.json", tmp_path / "trace.json.gz"
    assert profile_step.main([*TINY, "--out", str(out), "--trace", str(trace)]) == 0
    data = json.loads(out.read_text())
    sel = data["selection"]
    # auto planned first (measure, calibrate, planned); off a GPU it never offloads, so the
    # profiled step is the labelled fallback
    assert sel["phases_before"][-1].startswith("planned:")
    assert sel["mode"] == "offload" and sel["why"].startswith("fallback:")
    assert sel["offloaded_bytes"] > 0
    assert sel["regions"] == ["blocks.0", "blocks.1"]
    regions = {r["region"]: r for r in data["regions"]}
    for name in sel["regions"]:
        assert regions[name]["calls"] == 1
        assert regions[name]["forward_ms"] > 0 and regions[name]["backward_ms"] > 0
    assert data["offload"]["storages_offloaded"] > 0 and data["offload"]["groups_offloaded"] > 0
    assert data["offload"]["backend"] == "emulated"
    assert data["offload"]["release_waits"] == 0  # forced offload: no plan, no planned release
    assert data["cuda"] is None  # CPU activities only
    assert len(data["top_host_costs"]) == 3
    assert all(c["ms"] >= 0 for c in data["top_host_costs"])
    assert trace.stat().st_size > 0
    py = data["runtime_python"]  # the runtime's own functions, from a step under the Python tracer
    forward = {f["function"].split(": ")[-1] for f in py["forward"]["functions"]}
    rest = {f["function"].split(": ")[-1] for f in py["rest"]["functions"]}
    assert {"pack", "enter", "exit"} <= forward and {"unpack", "fetch"} <= rest, (forward, rest)
    assert "_drain" not in rest  # the emulated copy workers are no part of the step's host time
    assert all(f["function"].startswith(("offrecomp/", "scheduler/")) for p in ("forward", "rest") for f in py[p]["functions"])
    assert py["forward"]["self_ms"] > 0 and py["rest"]["self_ms"] > 0
    assert py["forward"]["self_ms"] + py["rest"]["self_ms"] < py["step_host_ms"]
    # beside them, library Python inside the runtime's calls, never the model's own
    library = [f["function"] for part in ("forward", "rest") for f in py[part]["library"]]
    assert library and py["forward"]["library_ms"] >= 0
    assert not any(n.startswith(("offrecomp/", "scheduler/")) for n in library), library
    assert not any("models.py" in n or "torch/nn/modules/" in n for n in library), library
    printed = capsys.readouterr().out
    assert "largest host costs" in printed and "per offloaded storage n/a" in printed
    assert "the runtime's Python" in printed and "library Python it calls" in printed


def test_forced_offload_is_labelled(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    assert profile_step.main([*TINY, "--force-offload", "--out", str(out)]) == 0
    sel = json.loads(out.read_text())["selection"]
    assert sel == {**sel, "mode": "offload", "why": "--force-offload", "phases_before": []}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--max-steps", "0"], "argument --max-steps: '0' is invalid; accepted: an integer, 1 or more"),
        (["--budget-fraction", "0"], "argument --budget-fraction: '0' is invalid; accepted: a number in (0, 1]"),
        (["--device", "tpu"], "--device 'tpu' is invalid; accepted: auto, cpu, cuda"),
        (["--preset", "x"], "--preset 'x' is invalid; accepted: cpu-tiny, "),
        (["--seq", "0"], "argument --seq: '0' is invalid; accepted: an integer, 1 or more"),
        (["--batch", "0"], "argument --batch: '0' is invalid; accepted: an integer, 1 or more"),
        (["--layers", "0"], "argument --layers: '0' is invalid; accepted: an integer, 1 or more"),
        (["--threads", "0"], "argument --threads: '0' is invalid; accepted: an integer, 1 or more"),
        (["--heads", "3"], "--hidden 32 is not a multiple of --heads 3; accepted: a head count that divides the width"),
        (["--hidden", "30", "--heads", "4"], "--hidden 30 is not a multiple of --heads 4"),
        (["--gbps", "0"], "argument --gbps: '0' is invalid; accepted: a number > 0"),
        (["--trace", "/no/such/folder/t.json"], "argument --trace: '/no/such/folder/t.json': its folder"),
    ],
)
def test_bad_arguments_are_refused(
    argv: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(profile_step, "build_model", started)
    assert said in refused(profile_step.main, [*TINY, *argv, "--out", str(tmp_path / "p.json")], capsys)


def test_a_preset_head_count_the_width_does_not_divide_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    said = refused(profile_step.main, ["--preset", "cpu-tiny", "--heads", "3"], capsys)
    assert "--hidden 128 (preset cpu-tiny's) is not a multiple of --heads 3" in said


class _Kineto:
    def __init__(self, stream: int, start_us: float, dur_us: float, name: str) -> None:
        self._v = (stream, int(start_us * 1e3), int(dur_us * 1e3), name)

    def device_type(self) -> Any:
        return torch.autograd.DeviceType.CUDA

    def device_resource_id(self) -> int:
        return self._v[0]

    def start_ns(self) -> int:
        return self._v[1]

    def duration_ns(self) -> int:
        return self._v[2]

    def name(self) -> str:
        return self._v[3]

    def is_user_annotation(self) -> bool:
        return self._v[3].startswith("profile_step::")


def _event(name: str, start: float, end: float) -> Any:
    return SimpleNamespace(
        name=name,
        device_type=torch.autograd.DeviceType.CPU,
        time_range=SimpleNamespace(start=start, end=end),
        cpu_time_total=end - start,
    )


def test_cuda_summary_counts_calls_syncs_and_stream_gaps() -> None:
    # Runtime calls per offloaded storage, the syncs inside forward only, and the idle
    # time of the stream with the most kernels (stream 7; stream 9 is a copy stream).
    events = [
        _event(profile_step.FORWARD, 0, 100),
        _event("cudaLaunchKernel", 1, 2),
        _event("cudaMemcpyAsync", 3, 4),
        _event("cudaStreamSynchronize", 50, 60),
        _event("cuLaunchKernel", 70, 71),
        _event("cudaDeviceSynchronize", 150, 160),  # after forward
        _event("cutlass_gemm", 5, 6),  # not a runtime call
    ]
    kineto = [
        _Kineto(7, 0, 10, "k1"),
        _Kineto(7, 15, 5, "k2"),  # 5 us gap
        _Kineto(7, 18, 2, "k3"),  # overlaps k2
        _Kineto(7, 40, 10, "k4"),  # 20 us gap
        _Kineto(9, 0, 100, "memcpy"),
        *(_Kineto(7, 0, 60, profile_step.FORWARD) for _ in range(3)),  # not device work
    ]
    got = profile_step._cuda_summary(
        events, kineto, {"storages_offloaded": 2, "groups_offloaded": 1}
    )
    assert got["runtime_calls"] == 5
    assert got["per_offloaded_storage"] == 2.5 and got["per_offloaded_group"] == 5
    assert got["syncs_in_forward"] == {"cudaStreamSynchronize": 1}
    gaps = got["compute_stream_gaps"]
    assert gaps["stream"] == 7 and gaps["device_events"] == 4
    assert gaps["idle_ms"] == pytest.approx(0.025) and gaps["span_ms"] == pytest.approx(0.05)
    assert gaps["gaps_over_10us"] == 1
    assert gaps["largest_gaps_us"][0] == {"us": 20.0, "before": "k4"}


def test_auto_profiles_again_until_the_step_offloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a GPU the step after one that offloaded may run the offload trial's plan, which
    # does not offload: the tool profiles again (a CPU run stands in for the planner).
    records = iter([SimpleNamespace(phase="planned", offloaded_bytes=b) for b in (0, 0, 7)])
    profiled: list[int] = []
    real = profile_step._profiled_step

    def counting(s: Any, rt: Any) -> Any:
        profiled.append(1)
        return real(s, rt)

    monkeypatch.setattr(profile_step, "_reach_plan", lambda s, rt, n: (True, ["planned:7"]))
    monkeypatch.setattr(profile_step, "_last_record", lambda rt: next(records))
    monkeypatch.setattr(profile_step, "_profiled_step", counting)
    out = tmp_path / "p.json"
    assert profile_step.main([*TINY, "--out", str(out)]) == 0
    sel = json.loads(out.read_text())["selection"]
    assert len(profiled) == 3
    assert sel["mode"] == "auto" and sel["offloaded_bytes"] == 7


def test_the_profiled_step_follows_two_steps_of_one_plan_and_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the profiled step comes after two offloading steps in a row with one plan
    and one pinned pool: a re-plan solves and pins at its first step's start."""
    records = iter([
        ("measure", 0, "", 0), ("calibrate", 0, "", 0),
        ("planned", 5, "a", 10), ("planned", 5, "b", 10),  # re-planned
        ("planned", 5, "b", 20),  # the pool grew
        ("planned", 5, "b", 20), ("planned", 5, "b", 20),
    ])
    seen: dict[str, Any] = {}
    monkeypatch.setattr(profile_step, "train_step", lambda s, **kw: seen.update(rec=next(records)))
    monkeypatch.setattr(profile_step, "_last_record", lambda rt: SimpleNamespace(
        phase=seen["rec"][0], offloaded_bytes=seen["rec"][1], plan_id=seen["rec"][2],
        pool_reserved_bytes=seen["rec"][3],
    ))
    setup: Any = SimpleNamespace(device=torch.device("cuda"))
    reached, phases = profile_step._reach_plan(setup, None, 10)
    assert reached and len(phases) == 6, phases
    records = iter([("planned", 0, "a", 0)] * 3)  # never offloads: not reached
    assert profile_step._reach_plan(setup, None, 3) == (False, ["planned:0"] * 3)
