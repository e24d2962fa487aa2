"""The ``plan`` command line, driven through scheduler.cli.main."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from scheduler import StorageRecord, gpt_profile, parse_bytes
from scheduler.cli import main, parse_model
from scheduler.units import format_bytes

MODEL = "layers=4,hidden=1024,heads=8,seq=4096,batch=1"


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = main(list(argv), out=out)
    return rc, out.getvalue()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("20GiB", 20 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("4096", 4096),
        ("2 tib", 2 * 2**40),
        ("1e3", 1000),
        ("10kB", 10_000),
        ("24G", 24 * 2**30),  # accepted by the runtime's OFFRECOMP_BUDGET too (scheduler.units)
        (123, 123),
    ],
)
def test_parse_bytes(text: str | int, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "20 parsecs", "-5GiB", "1..5GB", "20GiBs", "0.5B", "1.5", "0.0001KiB"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="accepted: an integer byte count or a number with a unit"):
        parse_bytes(text)


def test_format_bytes_says_a_size_that_is_no_number() -> None:
    """A message naming a NaN or infinite size said nothing: format_bytes raised."""
    assert format_bytes(float("nan")) == "nan B" and format_bytes(float("inf")) == "inf B"
    assert format_bytes(1536) == "1.50 KiB" and format_bytes(-512) == "-512 B"


def test_parse_model() -> None:
    spec = parse_model(
        "layers=80,hidden=8192,heads=64,seq=131072,batch=1,fused_attention=false,mfu=0.4"
    )
    assert spec == {
        "layers": 80,
        "hidden": 8192,
        "heads": 64,
        "seq": 131072,
        "batch": 1,
        "fused_attention": False,
        "mfu": 0.4,
    }
    with pytest.raises(ValueError, match="unknown; accepted: layers"):
        parse_model("layers=2,depth=3")
    with pytest.raises(ValueError, match="missing hidden, heads, seq, batch"):
        parse_model("layers=2")
    with pytest.raises(ValueError, match="gives layers twice"):  # not the last one silently
        parse_model("layers=2,hidden=64,layers=3")
    for layers in (0, 100_000):  # a profile the planner would build for minutes, or until memory ran out
        with pytest.raises(ValueError, match=f"layers={layers} is invalid; accepted: 1 to 4096"):
            parse_model(f"layers={layers},hidden=64,heads=2,seq=128,batch=1")


def test_model_form_prints_a_summary() -> None:
    rc, text = run(
        "plan",
        "--model",
        MODEL,
        "--device-tflops",
        "990",
        "--d2h-gbps",
        "50",
        "--h2d-gbps",
        "50",
        "--budget",
        "600MiB",
    )
    assert rc == 0
    assert "regions" in text and "layers.0" in text
    assert "predicted step" in text and "predicted peak" in text and "lower bound" in text
    assert "replay dispatch 0 us/op" in text  # what-if profiles: free unless --replay-op-us


def test_profile_form_with_json_output(tmp_path: Path) -> None:
    p = gpt_profile(
        layers=4, hidden=1024, heads=8, seq=4096, batch=1, device_tflops=990, d2h_gbps=0, h2d_gbps=0
    )
    path = tmp_path / "prof.json"
    p.save(path)
    rc, text = run(
        "plan", str(path), "--budget", "300MiB", "--d2h-gbps", "50", "--h2d-gbps", "50", "--json"
    )
    assert rc == 0
    doc = json.loads(text)
    assert doc["feasible"] and doc["predicted_peak_bytes"] <= 300 * 2**20
    assert doc["lower_bound_seconds"] <= doc["predicted_step_seconds"]
    assert len(doc["placements"]) == sum(len(r.storages) for r in p.regions)
    assert [r["name"] for r in doc["regions"]] == [r.name for r in p.regions]
    assert (
        sum(r["keep_bytes"] + r["offload_bytes"] + r["recompute_bytes"] for r in doc["regions"])
        == p.activation_bytes
    )


def test_replay_op_cost_slows_partial_replays(tmp_path: Path) -> None:
    """--replay-op-us prices replays under the dispatch mode: with a high cost per op the
    same budget gets slower (a cheap partial replay now costs more, or a plain one)."""
    p = gpt_profile(
        layers=4, hidden=1024, heads=8, seq=4096, batch=1, device_tflops=990, d2h_gbps=0, h2d_gbps=0
    )
    path = tmp_path / "prof.json"
    p.save(path)
    times = []
    for us in ("0", "200"):
        rc, text = run("plan", str(path), "--budget", "500MiB", "--replay-op-us", us, "--json")
        assert rc == 0
        times.append(json.loads(text)["predicted_step_seconds"])
    assert times[1] > times[0]


def test_host_costs_from_the_command_line(tmp_path: Path) -> None:
    """--pack-us and friends set the runtime's host costs (NOTE [Host time]): a host cost
    per save lengthens every plan's step."""
    p = gpt_profile(
        layers=4, hidden=1024, heads=8, seq=4096, batch=1, device_tflops=990, d2h_gbps=50, h2d_gbps=50
    )
    path = tmp_path / "prof.json"
    p.save(path)
    times = []
    for us in ("0", "500"):
        rc, text = run("plan", str(path), "--budget", "2GiB", "--pack-us", us, "--offload-us", us, "--json")
        assert rc == 0
        times.append(json.loads(text)["predicted_step_seconds"])
    assert times[1] > times[0]


def test_native_keep_from_the_command_line(tmp_path: Path) -> None:
    """--native-keep: a plan that keeps every region whole pays no pack cost for their
    saves, so with an ample budget the step is the one without hooks."""
    p = gpt_profile(
        layers=4, hidden=1024, heads=8, seq=4096, batch=1, device_tflops=990, d2h_gbps=50, h2d_gbps=50
    )
    path = tmp_path / "prof.json"
    p.save(path)

    def step(*flags: str) -> float:
        rc, text = run("plan", str(path), "--budget", "1TiB", *flags, "--json")
        assert rc == 0
        return float(json.loads(text)["predicted_step_seconds"])

    bare = step()
    assert step("--pack-us", "500", "--no-native-keep") > bare
    assert step("--pack-us", "500", "--native-keep") == pytest.approx(bare)


def test_min_budget() -> None:
    rc, text = run(
        "plan",
        "--model",
        MODEL,
        "--device-tflops",
        "990",
        "--max-overhead",
        "0.05",
        "--min-budget",
        "--json",
    )
    assert rc == 0
    doc = json.loads(text)
    assert doc["max_overhead"] == 0.05 and doc["min_budget_bytes"] > 0
    rc, text = run(
        "plan",
        "--model",
        MODEL,
        "--device-tflops",
        "990",
        "--budget",
        str(doc["min_budget_bytes"]),
        "--json",
    )
    assert rc == 0 and json.loads(text)["feasible"]


def test_infeasible_budget_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    rc, text = run("plan", "--model", MODEL, "--device-tflops", "990", "--budget", "1MiB")
    assert rc == 1 and "note: budget 1.00 MiB cannot be met" in text
    rc, _ = run(
        "plan",
        "--model",
        MODEL,
        "--device-tflops",
        "990",
        "--budget",
        "1MiB",
        "--infeasible",
        "error",
    )
    assert rc == 1 and "smallest feasible budget" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--model", MODEL, "--budget", "1GiB"], "--model needs --device-tflops"),
        (
            ["plan", "--model", MODEL, "--device-tflops", "990", "--budget", "lots"],
            "--budget='lots' is invalid",
        ),
        (
            ["plan", "--device-tflops", "990", "--budget", "1GiB"],
            "either a profile JSON path or --model",
        ),
        (["plan", "/nonexistent/prof.json", "--budget", "1GiB"], "cannot read profile"),
        (["plan", "--model", MODEL, "--device-tflops", "990"], "give --budget"),
        (
            ["plan", "--model", MODEL, "--device-tflops", "990", "--budget", "1GiB",
             "--replay-op-us", "-3"],
            "--replay-op-us='-3' is invalid",
        ),
        (
            ["plan", "--model", MODEL, "--device-tflops", "990", "--budget", "1GiB",
             "--offload-us", "-1"],
            "--offload-us='-1' is invalid",
        ),
        (
            ["plan", "--model", MODEL, "--device-tflops", "990", "--budget", "1GiB",
             "--d2h-gbps", "10"],
            "--model with --d2h-gbps alone",
        ),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _ = run(*argv)
    assert rc == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "a profile must be a JSON object, got list"),
        ("5", "a profile must be a JSON object, got int"),
        ('{"signature": "s", "regions": [{"name": "b", "storages": [null]}]}', "storage 0 of region 0 must be a JSON object"),
        ('{"signature": "s", "regions": {}}', "a profile's regions must be a JSON list"),
        ('{"signature": "s", "forward_seconds": "fast"}', "profile forward_seconds = 'fast' is invalid"),
        ('{"signature": "s", "d2h_gbps": null}', "profile d2h_gbps = None is invalid"),
    ],
)
def test_a_profile_of_the_wrong_shape_is_a_usage_error(
    content: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 naming what is wrong, not a traceback (nor exit 1, the infeasible budget's)."""
    path = tmp_path / "profile.json"
    path.write_text(content)
    rc, _ = run("plan", str(path), "--budget", "1MiB")
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("saves", 10**30, "storage 0 of region {label} saves = {value} is invalid; accepted: an int from 0 to 2**63 - 1"),
        ("first_save_op", 2**63, "storage 0 of region {label} first_save_op = {value} is invalid; accepted: an int"),
        ("last_save_op", 10**30, "storage 0 of region {label} last_save_op = {value} is invalid; accepted: an int"),
        ("shared_with", "x", "storage 0 of region {label} shared_with = 'x' is invalid; accepted: null or a [region"),
        ("shared_with", ["a", 0], "storage 0 of region {label} shared_with = ['a', 0] is invalid"),
        ("shared_with", ["a", "b", 0], "storage 0 of region {label} shared_with = ['a', 'b', 0] is invalid"),
        ("host_limit_bytes", 10**30, "profile host_limit_bytes = {value} is invalid; accepted: a whole number of bytes"),
        ("fixed_bytes", 2**63, "profile fixed_bytes = {value} is invalid; accepted: a whole number of bytes"),
        ("device_capacity_bytes", -1, "profile device_capacity_bytes = -1 is invalid"),
    ],
)
def test_an_out_of_range_profile_value_is_a_usage_error(
    field: str, value: object, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hand-edited value beyond what int64 holds, or a ``shared_with`` that is no plan
    key: exit 2 naming the field and the value, not a traceback with exit 1."""
    p = gpt_profile(layers=2, hidden=64, heads=2, seq=128, batch=1, device_tflops=990, d2h_gbps=10, h2d_gbps=10)
    doc = p.to_dict()
    target = doc["regions"][0]["storages"][0] if field in StorageRecord.__dataclass_fields__ else doc
    target[field] = value
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    rc, _ = run("plan", str(path), "--budget", "2MiB")
    err = capsys.readouterr().err
    label = f"{p.regions[0].name}#{p.regions[0].call_index}"
    assert rc == 2 and message.format(label=label, value=value) in err, err
    target[field] = 2**63 - 1 if isinstance(value, int) else [p.regions[0].name, 0, 0]
    path.write_text(json.dumps(doc))
    assert run("plan", str(path), "--budget", "2MiB")[0] in (0, 1)  # the largest int64 plans


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-overhead", "-1"], "--max-overhead='-1' is invalid; accepted: a fraction of step time from 0 to 10"),
        (["--max-overhead", "50"], "--max-overhead='50' is invalid"),
        (["--d2h-gbps", "0", "--h2d-gbps", "50"],
         "--d2h-gbps='0' is invalid; accepted: a number of GB/s from 1e-6 to 1e6 (50); --no-offload plans without"),
        (["--h2d-gbps", "-1", "--d2h-gbps", "50"], "--h2d-gbps='-1' is invalid"),
        (["--prefetch-regions", "0"], "--prefetch-regions='0' is invalid; accepted: a number of regions, 1 or more"),
        (["--mfu", "2"], "--mfu='2' is invalid; accepted: a fraction of peak FLOP/s"),
        (["--device-tflops", "-990"], "--device-tflops='-990' is invalid; accepted: dense TFLOP/s"),
        (["--infeasible", "ignore"], "argument --infeasible: invalid choice: 'ignore'"),
    ],
)
def test_errors_name_the_flag(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Not the Python parameter the value goes on to (``max_overhead``), nor ``None``."""
    rc, _ = run("plan", "--model", MODEL, "--device-tflops", "990", "--budget", "1GiB", *extra)
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    for word in ("max_overhead", "d2h_gbps", "h2d_gbps", "prefetch_regions", "device_tflops", "None"):
        assert word not in err, err


def test_a_model_spec_error_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _ = run("plan", "--model", "layers=2,hidden=100,heads=3,seq=64,batch=1", "--device-tflops", "990",
                "--budget", "1GiB")
    assert rc == 2 and "--model 'layers=2,hidden=100,heads=3,seq=64,batch=1': hidden = 100" in capsys.readouterr().err


def test_an_infeasible_budget_error_names_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _ = run("plan", "--model", MODEL, "--device-tflops", "990", "--budget", "1MiB", "--infeasible", "ERROR")
    err = capsys.readouterr().err
    assert rc == 1 and "Raise --budget, or leave out --infeasible error" in err, err
    assert "infeasible='warn'" not in err


@pytest.mark.parametrize(
    ("extra", "named"),
    [(["--budget", "1GiB"], "--budget"), (["--infeasible", "error"], "--infeasible"),
     (["--budget", "1GiB", "--infeasible", "warn"], "--budget or --infeasible")],
)
def test_min_budget_refuses_the_flags_it_would_not_read(
    extra: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--min-budget`` plans for no budget: a budget or an infeasible policy beside it
    is a usage error naming them, not silently dropped."""
    rc, text = run("plan", "--model", MODEL, "--device-tflops", "990", "--min-budget", *extra)
    err = capsys.readouterr().err
    message = f"--min-budget finds the smallest budget within --max-overhead and takes no {named};"
    assert rc == 2 and not text and message in err, err


def test_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("plan", "--frobnicate")[0] == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_warmup_compiles_what_a_solve_runs() -> None:
    """In a fresh process, after `warmup` no planner kernel needs another signature
    (compiled, or loaded from numba's cache) for another profile's solves."""
    import subprocess
    import sys

    code = """
import io
from numba.core.registry import CPUDispatcher
import sys
from scheduler import gpt_profile, solve
from scheduler.cli import warmup
def sigs():
    mods = [m for n, m in sys.modules.items() if n == "scheduler" or n.startswith("scheduler.")]
    return {(m.__name__, n): len(f.signatures) for m in mods for n, f in vars(m).items() if isinstance(f, CPUDispatcher)}
before = sigs()
out = io.StringIO()
warmup(out)
assert "compiled and cached" in out.getvalue()
warm = sigs()
assert sum(warm.values()) > sum(before.values()), (before, warm)
prof = gpt_profile(layers=6, hidden=256, heads=4, seq=512, batch=2, device_tflops=300.0, d2h_gbps=20.0, h2d_gbps=25.0)
solve(prof, budget_bytes=prof.activation_bytes // 3, prefetch_regions=2, allow_offload=True)
solve(prof, budget_bytes=None, max_overhead=0.1, prefetch_regions=1, allow_offload=False)
after = sigs()
assert after == warm, {n: (warm[n], after[n]) for n in after if after[n] != warm[n]}
print("ok", sum(warm.values()))
"""
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("ok")


def test_warmup_command_takes_no_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from offrecomp.__main__ import main as offrecomp_main

    assert offrecomp_main(["warmup", "now"]) == 2
    assert "takes no arguments" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-overhead", "5%"],
         "--max-overhead='5%' is invalid; accepted: a fraction of step time from 0 to 10 (0.05 = 5%); for 5% give 0.05"),
        (["--max-overhead", "lots"], "--max-overhead='lots' is invalid; accepted: a fraction of step time"),
        (["--mfu", "50%"], "--mfu='50%' is invalid; accepted: a fraction of peak FLOP/s from 1e-6 to 1 (0.5); for 50% give 0.5"),
        (["--d2h-gbps", "abc", "--h2d-gbps", "50"], "--d2h-gbps='abc' is invalid; accepted: a number of GB/s from 1e-6 to 1e6 (50)"),
        (["--h2d-gbps", "fast", "--d2h-gbps", "50"], "--h2d-gbps='fast' is invalid; accepted: a number of GB/s"),
        (["--replay-op-us", "25us"], "--replay-op-us='25us' is invalid; accepted: microseconds per op"),
        (["--pack-us", "x"], "--pack-us='x' is invalid; accepted: microseconds, a number from 0 to 1e6"),
        (["--prefetch-regions", "two"], "--prefetch-regions='two' is invalid; accepted: a number of regions, 1 or more"),
        (["--prefetch-regions", "2.5"], "--prefetch-regions='2.5' is invalid; accepted: a number of regions"),
        (["--budget", "20parsecs"], "--budget='20parsecs' is invalid; accepted: an integer byte count or a number with a unit"),
        (["--budget", "abc%"], "--budget='abc%' is invalid; accepted: an integer byte count or a number with a unit"),
        (["--budget", "120%"], "--budget='120%' is invalid; accepted: an integer byte count or a number with a unit"),
    ],
)
def test_a_malformed_number_names_the_flag_the_value_and_the_forms(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value that is no number (``5%`` for 0.05, a word, a size with an unknown unit)
    is told as one out of range is, with the forms accepted, not as argparse's "invalid
    float value"; exit 2. ``--no-offload``'s hint comes only with a link of 0 or less."""
    argv = ["plan", "--model", MODEL, "--device-tflops", "990", "--budget", "1GiB", *extra]
    rc, _ = run(*argv)
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    assert "invalid float value" not in err and "invalid int value" not in err and "--no-offload" not in err, err


def test_numbers_given_as_text_plan_as_numbers() -> None:
    """The flags take what they took as numbers: exponents, whole and decimal values."""
    rc, out = run(
        "plan", "--model", MODEL, "--device-tflops", "9.9e2", "--mfu", "0.4", "--d2h-gbps", "50",
        "--h2d-gbps", "5e1", "--max-overhead", "0.1", "--prefetch-regions", "3", "--replay-op-us", "0", "--json",
    )
    doc = json.loads(out)
    assert rc in (0, 1) and doc["budget_bytes"] is None and doc["predicted_step_seconds"] > 0


def test_plan_chooses_the_prefetch_depth_unless_given() -> None:
    """NOTE [Chosen prefetch]: without ``--prefetch-regions`` the plan of long layers
    against a budget they fill reloads one group ahead, and says so; given, that depth."""
    model = "layers=6,hidden=8192,heads=64,seq=65536,batch=1"
    flags = ("--model", model, "--device-tflops", "990", "--d2h-gbps", "50", "--h2d-gbps", "50", "--budget", "30GiB")
    rc, out = run("plan", *flags)
    assert rc == 0 and "prefetch 1 regions (the faster of 2 and 1)" in out, out
    docs = [json.loads(run("plan", *flags, *extra, "--json")[1]) for extra in ((), ("--prefetch-regions", "2"))]
    assert [d["prefetch_regions"] for d in docs] == [1, 2]
    assert docs[0]["predicted_step_seconds"] < docs[1]["predicted_step_seconds"]


def test_a_budget_as_a_share_of_the_profiles_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--budget 60%`` is a share of the profile's ``device_capacity_bytes``, as the
    runtime's ``budget="60%"`` is; refused out of (0%, 100%], and where the profile has
    no capacity."""
    p = gpt_profile(layers=4, hidden=1024, heads=8, seq=4096, batch=1, device_tflops=990, d2h_gbps=0, h2d_gbps=0)
    p.device_capacity_bytes = 2 * p.activation_bytes
    path = tmp_path / "prof.json"
    p.save(path)
    rc, text = run("plan", str(path), "--budget", "25%", "--json")
    assert rc == 0 and json.loads(text)["budget_bytes"] == int(0.25 * p.device_capacity_bytes)
    rc, _ = run("plan", str(path), "--budget", "0%")
    assert rc == 2 and "--budget='0%' is invalid; accepted" in capsys.readouterr().err
    p.device_capacity_bytes = 0
    p.save(path)
    rc, _ = run("plan", str(path), "--budget", "25%")
    assert rc == 2 and "needs a profile with device_capacity_bytes" in capsys.readouterr().err


def test_a_report_given_for_a_profile_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run's report (``Report.to_json()``, or ``OFFRECOMP_REPORT``'s JSON lines) given
    to ``plan`` says so and which command reads it."""
    for name, content in (("rep.json", '{"steps": [], "config": {}}'), ("run.jsonl", '{"step": 0}\n{"step": 1}\n')):
        path = tmp_path / name
        path.write_text(content)
        rc, _ = run("plan", str(path), "--budget", "1MiB")
        err = capsys.readouterr().err
        assert rc == 2 and "looks like a run's report, which `python -m offrecomp report FILE` reads" in err, err


def test_an_unknown_flag_shows_the_plan_command_s_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse tells arguments no subcommand knows with the top level's usage line, which
    lists neither plan's flags nor the other commands: the plan command's is shown."""
    rc, _ = run("plan", "--model", MODEL, "--budget", "1GiB", "--bogus")
    err = capsys.readouterr().err
    assert rc == 2 and "usage: python -m offrecomp plan [-h]" in err and "unrecognized arguments: --bogus" in err, err
