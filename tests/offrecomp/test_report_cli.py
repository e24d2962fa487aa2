"""``python -m offrecomp report``: reads the JSON lines ``OFFRECOMP_REPORT`` writes (two
runs appended to one file), prints a summary per run, and with ``--plot`` writes a PNG."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

import offrecomp
from offrecomp.__main__ import main
from offrecomp.report import StepRecord
from offrecomp.report_cli import load_runs, summarize
from tests.helpers import make, train

STEPS = 4  # measure, calibrate, then planned steps with a predicted step time


@pytest.fixture(scope="module")
def report_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "run.jsonl"
    for _ in range(2):  # the runtime appends: two runs in one file
        model, batch = make("gpt_dropout")
        train(model, batch, offrecomp.runtime(model, report_path=str(path), min_bytes=0), steps=STEPS)
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_report_summary_per_run(report_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = load_runs(report_file)
    assert [[r.step for r in run] for run in runs] == [list(range(STEPS))] * 2
    assert any(r.predicted_step_seconds is not None for r in runs[0])
    code, out, err = _run(["report", str(report_file), "--table"], capsys)
    assert code == 0, err
    assert "run 1 of 2" in out and "run 2 of 2" in out
    assert "phases: measure 1, calibrate 1, planned 2" in out
    assert "measured/predicted" in out
    assert out.count("peak act") >= 4  # each run's phase table and full table


def test_report_plot_writes_png(report_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the bench extra)")
    png = tmp_path / "out.png"
    code, out, err = _run(["report", str(report_file), "--plot", str(png)], capsys)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in out


def test_report_reads_to_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, batch = make("gpt_dropout")
    with offrecomp.runtime(model, mode="recompute") as rt:
        train(model, batch, steps=2)
    path = tmp_path / "report.json"
    path.write_text(rt.report().to_json(indent=2))
    code, out, err = _run(["report", str(path)], capsys)
    assert code == 0, err
    assert "2 steps" in out and "phases: recompute 2" in out


def test_report_counts_every_phase_a_step_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two micro-batches a step: auto's first step measures and then calibrates; the
    summary counts it as such (``StepRecord.phases``), not by its first pass alone."""
    model, batch = make("gpt_dropout")
    with offrecomp.runtime(model, min_bytes=0) as rt:
        train(model, batch, steps=3, accumulate=2)
    assert [s.phases for s in rt.report().steps] == ["measure+calibrate", "planned", "planned"]
    path = tmp_path / "report.json"
    path.write_text(rt.report().to_json())
    code, out, err = _run(["report", str(path)], capsys)
    assert code == 0, err
    assert "phases: measure+calibrate 1, planned 2" in out, out


def test_report_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"step": 0}) + "\nnot json\n" + json.dumps({"step": 1}) + "\n")
    code, _, err = _run(["report", str(bad)], capsys)
    assert code == 2 and f"{bad}:2: not JSON" in err
    bad.write_text(json.dumps({"step": 0}) + "\n" + json.dumps({"step": 1})[:7] + "\n")  # a run killed mid-line
    code, out, err = _run(["report", str(bad)], capsys)
    assert code == 0 and f"{bad}:2: skipped a last line that is not JSON" in err and "1 step" in out
    for line, field in (({"step": 0, "peak_activation_bytes": "abc"}, "peak_activation_bytes"),
                        ({"step": True}, "step"), ({"step": 0, "fallbacks": []}, "fallbacks"),
                        ({"step": 0, "step_seconds": None}, "step_seconds")):  # fmt: skip
        bad.write_text(json.dumps(line) + "\n")
        code, _, err = _run(["report", str(bad)], capsys)
        assert code == 2 and (f"{bad}:1: field {field!r}" in err or "an integer 'step'" in err), err
    bad.write_text(json.dumps({"step": 0, "predicted_step_seconds": None}) + "\n")  # None: no prediction
    code, out, err = _run(["report", str(bad)], capsys)
    assert code == 0 and "no step had a prediction" in out, err
    bad.write_bytes(b"\xff\xfe{}")
    code, _, err = _run(["report", str(bad)], capsys)
    assert code == 2 and "not UTF-8" in err
    bad.write_text(json.dumps({"loss": 1.0}) + "\n")
    code, _, err = _run(["report", str(bad)], capsys)
    assert code == 2 and f"{bad}:1: expected a step record" in err
    code, _, err = _run(["report", str(tmp_path / "missing.jsonl")], capsys)
    assert code == 2 and "cannot read" in err
    bad.write_text("")
    code, _, err = _run(["report", str(bad)], capsys)
    assert code == 2 and "holds no steps" in err


def test_report_plot_without_matplotlib(
    report_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code, _, err = _run(["report", str(report_file), "--plot", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "pip install 'offrecomp[bench]'" in err


def test_report_in_usage() -> None:
    err = io.StringIO()
    sys_stderr, sys.stderr = sys.stderr, err
    try:
        assert main(["nope"]) == 2
    finally:
        sys.stderr = sys_stderr
    assert "accepted: plan, warmup, report" in err.getvalue()


def test_report_plot_names_the_file_it_writes_or_why_not(
    report_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name without a suffix gets .png (matplotlib's default), said as written; a suffix
    without a writer and an empty name are errors naming them."""
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the bench extra)")
    code, out, err = _run(["report", str(report_file), "--plot", str(tmp_path / "noext")], capsys)
    assert code == 0, err
    assert f"wrote {tmp_path / 'noext.png'}" in out and (tmp_path / "noext.png").exists()
    code, out, err = _run(["report", str(report_file), "--plot", str(tmp_path / "out.xyz")], capsys)
    assert code == 2 and "cannot write" in err and "xyz" in err
    code, out, err = _run(["report", str(report_file), "--plot", ""], capsys)
    assert code == 2 and "--plot '' is invalid" in err
    for folder in (str(tmp_path) + "/", str(tmp_path)):  # a directory: matplotlib would write DIR/.png.png
        code, out, err = _run(["report", str(report_file), "--plot", folder], capsys)
        assert code == 2 and "not a directory" in err and out == "", err


@pytest.mark.parametrize(
    ("field", "raw"),
    [("step_seconds", "NaN"), ("recompute_seconds", "-0.5"), ("predicted_step_seconds", "Infinity"),
     ("peak_activation_bytes", "-1"), ("device_peak_bytes", "-4096"), ("budget_bytes", "-1"), ("step", "-3"),
     ("peak_activation_bytes", "1" + "0" * 400)],
)
def test_report_rejects_nan_and_negative_fields(
    field: str, raw: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No step record holds NaN, Infinity or a negative count, size or time (Python's json
    writes and reads NaN): such a file is damaged, and the line and field are named."""
    path = tmp_path / "run.jsonl"
    fields = f'"step": 0, "{field}": {raw}' if field != "step" else f'"step": {raw}'
    path.write_text(json.dumps({"step": 0}) + "\n{" + fields + "}\n")
    code, out, err = _run(["report", str(path)], capsys)
    assert code == 2 and out == "", out
    assert f"{path}:2: field {field!r} is {str(json.loads(raw))[:40]}; expected a finite number >= 0" in err, err


def test_report_says_a_json_file_that_is_no_report_is_not_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A saved profile (pretty-printed JSON, easy to take for the report) is named for
    what it is, not as lines that are not JSON."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"signature": "s", "regions": []}, indent=1))
    code, out, err = _run(["report", str(path)], capsys)
    assert code == 2 and out == "" and "holds a JSON object without a 'steps' list (keys: signature, regions)" in err, err
    assert "not JSON" not in err


def test_report_rejects_a_bad_fallback_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"step": 0, "fallbacks": {"offload_to_keep": -2}}) + "\n")
    code, _, err = _run(["report", str(path)], capsys)
    assert code == 2 and "field 'fallbacks' counts -2 for 'offload_to_keep'; expected an integer >= 0" in err, err


def test_no_command_is_a_usage_error_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """As argparse: no command prints the usage to stderr and exits 2; help goes to stdout
    and exits 0."""
    code, out, err = _run([], capsys)
    assert code == 2 and out == "" and "a command is required; accepted: plan, warmup, report" in err
    assert "usage: python -m offrecomp" in err
    for argv in (["--help"], ["-h"], ["help"]):
        code, out, err = _run(argv, capsys)
        assert code == 0 and err == "" and "usage: python -m offrecomp" in out, argv


@pytest.mark.parametrize("command", ["plan", "warmup", "report"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_takes_help(command: str, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run([command, flag], capsys)
    assert code == 0 and err == "", err
    assert f"usage: python -m offrecomp {command}" in out, out
    code, out, _ = _run(["help", command], capsys)
    assert code == 0 and f"usage: python -m offrecomp {command}" in out


def test_a_bad_report_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["report"], capsys)
    assert code == 2 and "the following arguments are required: path" in err


def test_report_counts_steps_of_the_same_phases_together() -> None:
    """A step whose passes ran ``borrowed`` then ``planned`` and one that ran them the
    other way round are one row of the summary, as the phases a signature meets in."""
    recs = [
        StepRecord(step=i, phase=p.split("+")[0], phases=p, step_seconds=0.1)  # type: ignore[arg-type]
        for i, p in enumerate(["measure", "planned+borrowed", "borrowed+planned", "planned", "borrowed+borrowed"])
    ]
    out = summarize(recs)
    assert "phases: measure 1, planned+borrowed 2, planned 1, borrowed 1" in out, out
