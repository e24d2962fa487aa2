"""The host-overhead benchmark runs and reports every row against its floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_host_overhead
from tests.benchmarks.refused import refused, started


def test_host_overhead_benchmark_reports_every_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "host.json"
    assert bench_host_overhead.main(["--ops", "20", "--rounds", "1", "--reps", "2", "--clock", "thread",
                                     "--gc-freeze", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for row in ("identity hook pair (floor)", "offrecomp keep", "offrecomp keep, 12 buffers per region",
                "offrecomp keep, hooks on", "grouped hook pair, no copies (floor)",
                "grouped hook pair, copies (lean bound)",
                "offrecomp offload, 16 saves per region", "offrecomp recompute, 16 per region, replays",
                "offrecomp auto, 16 per region, kept",
                "bare dispatch mode (floor)",
                "replay dispatch mode, every op run", "op recorder (measuring pass)"):
        assert row in text
    res = json.loads(out.read_text())
    assert res["ops"] == 20 and res["saves"] == 21  # 20 tanh outputs and the scaled input
    assert len(res["us_over_plain"]) == 12 and res["clock"] == "thread" and res["gc_freeze"]
    assert set(res["gc_us_per_step"]) >= {
        "plain step", "offrecomp keep", "offrecomp offload", "offrecomp recompute", "offrecomp auto"
    }
    assert "measure" in res["auto_phases"]
    assert res["emulated_device_work_us"] is None
    assert res["plain_op_us"] > 0 and "plain ops" in text


def test_host_overhead_emulated_split_names_the_offload_rows_device_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The offload variant waits on its copies, so some of the emulated backend's work
    runs on the timed thread; keep offloads nothing, and the backend is left unwrapped."""
    from offrecomp.backends import EmulatedBackend

    run = EmulatedBackend._run
    out = tmp_path / "host.json"
    assert bench_host_overhead.main(["--ops", "32", "--rounds", "1", "--reps", "3", "--clock", "thread",
                                     "--emulated-split", "--out", str(out)]) == 0
    assert "emulated" in capsys.readouterr().out
    assert EmulatedBackend._run is run
    work = json.loads(out.read_text())["emulated_device_work_us"]
    assert work["per saved tensor: offrecomp offload, 16 saves per region"] > 0
    assert work["per saved tensor: offrecomp keep"] == 0


def test_the_lean_bound_pair_moves_the_bytes_and_gives_plains_gradients_step_after_step() -> None:
    """The lean bound copies each block's storages out and back through a host block it
    keeps from step to step: its gradients are plain's at every step, so its figure is
    that of a pair that really moves the bytes."""
    import torch

    torch.manual_seed(0)
    plain = bench_host_overhead._Model(48, blocks=3)
    lean = bench_host_overhead._Model(48, blocks=3)
    lean.load_state_dict(plain.state_dict())
    pair = bench_host_overhead._GroupedCopies(lean)
    for step in range(3):
        x = torch.randn(16, generator=torch.Generator().manual_seed(step))
        plain.w.grad = lean.w.grad = None
        plain(x).backward()
        with torch.autograd.graph.saved_tensors_hooks(pair.pack, pair.unpack):
            lean(x).backward()
        assert torch.equal(plain.w.grad, lean.w.grad)
    assert len(pair._blocks) == 3  # one host block per block, kept from step to step


def test_host_overhead_benchmark_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        bench_host_overhead.main(["--ops", "1"])
    with pytest.raises(SystemExit):
        bench_host_overhead.main(["--clock", "gpu"])
    with pytest.raises(SystemExit):
        bench_host_overhead.main(["--region-saves", "0"])


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--device", "tpu"], "--device 'tpu' is invalid; accepted: cpu, cuda, cuda:N"),
        (["--out", "/no/such/folder/h.json"], "argument --out: '/no/such/folder/h.json': its folder '/no/such/folder' does not exist"),
    ],
)
def test_host_overhead_benchmark_names_a_bad_device_or_out_file(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_host_overhead, "_Model", started)
    assert said in refused(bench_host_overhead.main, ["--ops", "8", "--rounds", "1", "--reps", "1", *argv], capsys)
