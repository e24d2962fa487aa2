"""Config: every variable parsed in one place; bad values name the variable and the forms."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import re

import numpy as np
import pytest
from torch import nn

import offrecomp
from offrecomp.config import ENV_VARS, Budget, Config, Prefetch, format_bytes, parse_bytes


def test_defaults_without_environment() -> None:
    cfg = Config.resolve({}, environ={})
    assert cfg.mode == "auto" and cfg.budget is None and not cfg.disable
    assert all(src == "default" for k, src in cfg.sources.items() if k != "regions")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", 0), ("512", 512), ("1KiB", 1024), ("1.5GB", 1_500_000_000), ("24GiB", 24 << 30),
     ("2 MiB", 2 << 20), ("3m", 3 << 20), (" 7 ", 7)],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text, name="X") == expected


@pytest.mark.parametrize(
    ("var", "value", "field", "expected"),
    [
        ("OFFRECOMP_MODE", "RECOMPUTE", "mode", "recompute"),
        ("OFFRECOMP_BUDGET", "40GiB", "budget", Budget(nbytes=40 << 30)),
        ("OFFRECOMP_BUDGET", "70%", "budget", Budget(fraction=0.7)),
        ("OFFRECOMP_BUDGET", "auto", "budget", None),
        ("OFFRECOMP_HOST_LIMIT", "50%", "host_limit", Budget(fraction=0.5)),
        ("OFFRECOMP_MIN_BYTES", "1MiB", "min_bytes", 1 << 20),
        ("OFFRECOMP_PREFETCH", "3", "prefetch", Prefetch(regions=3)),
        ("OFFRECOMP_PREFETCH", "256MiB", "prefetch", Prefetch(nbytes=256 << 20)),
        ("OFFRECOMP_REPORT", "run.jsonl", "report_path", "run.jsonl"),
        ("OFFRECOMP_VERIFY", "yes", "verify", True),
        ("OFFRECOMP_LOG", "info", "log_level", "INFO"),
        ("OFFRECOMP_MAX_OVERHEAD", "0.05", "max_overhead", 0.05),
        ("OFFRECOMP_PROFILE", "p.json", "profile_path", "p.json"),
        ("OFFRECOMP_D2H_GBPS", "50", "d2h_gbps", 50.0),
        ("OFFRECOMP_H2D_GBPS", "25.5", "h2d_gbps", 25.5),
        ("OFFRECOMP_BUDGET_MARGIN", "0.1", "budget_margin", 0.1),
        ("OFFRECOMP_INFEASIBLE", "error", "infeasible", "error"),
        ("OFFRECOMP_DRIFT", "0.5", "drift", 0.5),
        ("OFFRECOMP_PLAN_CACHE", "4", "plan_cache_size", 4),
        ("OFFRECOMP_DISABLE", "1", "disable", True),
    ],
)
def test_each_variable(var: str, value: str, field: str, expected: object) -> None:
    cfg = Config.resolve({}, environ={var: value})
    assert getattr(cfg, field) == expected
    assert cfg.sources[field] == "env"


@pytest.mark.parametrize(
    ("var", "value", "accepted"),
    [
        ("OFFRECOMP_MODE", "fast", "auto, keep, offload, recompute, off"),
        ("OFFRECOMP_BUDGET", "lots", "percentage"),
        ("OFFRECOMP_BUDGET", "150%", "(0%, 100%]"),
        ("OFFRECOMP_BUDGET", "-5", "byte count"),
        ("OFFRECOMP_HOST_LIMIT", "12 parsecs", "unit"),
        ("OFFRECOMP_MIN_BYTES", "1.5.2", "unit"),
        ("OFFRECOMP_PREFETCH", "0", "number of regions"),
        ("OFFRECOMP_VERIFY", "maybe", "true, false"),
        ("OFFRECOMP_LOG", "LOUD", "DEBUG, INFO"),
        ("OFFRECOMP_MAX_OVERHEAD", "-1", "fraction"),
        ("OFFRECOMP_D2H_GBPS", "0", "from 1e-6 to 1e6"),
        ("OFFRECOMP_INFEASIBLE", "ignore", "warn, error"),
        ("OFFRECOMP_PLAN_CACHE", "0", ">= 1"),
        ("OFFRECOMP_DISABLE", "2", "1, 0"),
    ],
)
def test_bad_values_name_variable_value_and_forms(var: str, value: str, accepted: str) -> None:
    with pytest.raises(ValueError) as err:
        Config.resolve({}, environ={var: value})
    msg = str(err.value)
    assert var in msg and repr(value) in msg and accepted in msg


def test_argument_beats_environment() -> None:
    cfg = Config.resolve({"mode": "keep", "budget": "1GiB"}, environ={"OFFRECOMP_MODE": "recompute",
                                                                      "OFFRECOMP_BUDGET": "2GiB"})
    assert cfg.mode == "keep" and cfg.budget == Budget(nbytes=1 << 30)
    assert cfg.sources["mode"] == "argument"


def test_disable_always_wins() -> None:
    cfg = Config.resolve({"disable": False, "mode": "recompute"}, environ={"OFFRECOMP_DISABLE": "1"})
    assert cfg.disable and not cfg.active


def test_bad_argument_names_the_argument() -> None:
    with pytest.raises(ValueError, match=r"mode='quick'.*accepted: auto, keep"):
        offrecomp.runtime(None, mode="quick")
    with pytest.raises(ValueError, match="budget="):
        offrecomp.runtime(None, budget="a lot")
    with pytest.raises(TypeError, match=r"unknown offrecomp option.*budgett"):
        offrecomp.runtime(None, budgett="1GiB")


def test_every_env_var_is_documented() -> None:
    import pathlib

    text = (pathlib.Path(__file__).parents[2] / "docs" / "tuning.md").read_text()
    missing = [v for v in ENV_VARS if v not in text]
    assert not missing, f"undocumented in docs/tuning.md: {missing}"


def test_config_fields_are_frozen() -> None:
    """A change of the public knobs shows up here, in review."""
    assert [f.name for f in dataclasses.fields(Config)] == [
        "disable", "mode", "budget", "host_limit", "min_bytes", "prefetch", "report_path",
        "verify", "native_keep", "log_level", "max_overhead", "profile_path", "d2h_gbps", "h2d_gbps",
        "budget_margin", "infeasible", "drift", "plan_cache_size", "replay_op_us", "regions", "sources",
        "_parsed",
    ]


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 << 30) == "3.00 GiB"
    assert format_bytes(1023.4) == "1023 B" and format_bytes(1023.7) == "1.00 KiB"
    assert format_bytes(-2048) == "-2.00 KiB"


def test_one_parser_and_one_formatter_for_bytes() -> None:
    """The runtime, the planner's command line and the benchmarks share scheduler.units."""
    import scheduler
    import scheduler.cli
    import scheduler.units
    from benchmarks.long_seq import output

    assert parse_bytes is scheduler.units.parse_bytes is scheduler.parse_bytes is scheduler.cli.parse_bytes
    assert format_bytes is scheduler.units.format_bytes is scheduler.format_bytes
    assert output.format_bytes(1536) == format_bytes(1536) and output.format_bytes(None) == "-"


@pytest.mark.parametrize(
    "kw",
    [{"budget": "0.5"}, {"min_bytes": "1.5"}, {"min_bytes": "0.5B"}, {"prefetch": 2.0}, {"prefetch": "1.5"},
     {"prefetch": "1.5B"}, {"drift": True}, {"d2h_gbps": False}],
    ids=["budget_fraction_of_a_byte", "min_bytes_fraction", "min_bytes_fraction_in_b", "prefetch_float",
         "prefetch_bare_fraction", "prefetch_fraction_in_b", "drift_bool", "gbps_bool"],
)
def test_values_that_would_be_rounded_or_misread_are_rejected(kw: dict[str, object]) -> None:
    """A number of bytes, bare or in B, must be whole ("0.5" and "0.5B" were read as 0 B);
    a float prefetch is neither a count of regions nor a size with a unit (2.0 was read as
    2 bytes); a bool is no number."""
    name, value = next(iter(kw.items()))
    with pytest.raises(ValueError, match=rf"{name}={value!r} is invalid; accepted: "):
        Config.resolve(kw)


def test_a_bad_local_world_size_fails_when_the_runtime_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not at the first offload of the first step, where the pool reads it."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "abc")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='abc' is invalid"):
        offrecomp.runtime(None)


def test_an_argument_given_as_none_leaves_the_setting_to_the_environment() -> None:
    """``runtime(m, max_overhead=args.max_overhead)`` with an argparse default of None must
    not discard ``OFFRECOMP_MAX_OVERHEAD``: None is never an argument."""
    env = {"OFFRECOMP_MAX_OVERHEAD": "0.05", "OFFRECOMP_HOST_LIMIT": "1GiB"}
    cfg = Config.resolve({"max_overhead": None, "host_limit": None, "budget": None}, environ=env)
    assert cfg.max_overhead == 0.05 and cfg.sources["max_overhead"] == "env"
    assert cfg.host_limit is not None and cfg.host_limit.nbytes == 1 << 30 and cfg.sources["host_limit"] == "env"
    assert cfg.budget is None and cfg.sources["budget"] == "default"


def test_an_empty_budget_argument_leaves_the_setting_to_the_environment() -> None:
    """``budget=""`` is not given, as an empty variable is unset; ``"none"`` and ``"auto"``
    choose the automatic budget, over ``OFFRECOMP_BUDGET`` too (an argument wins)."""
    env = {"OFFRECOMP_BUDGET": "2GiB"}
    for empty in ("", "  "):
        cfg = Config.resolve({"budget": empty}, environ=env)
        assert cfg.budget == Budget(nbytes=2 << 30) and cfg.sources["budget"] == "env"
    assert Config.resolve({"budget": ""}, environ={}).sources["budget"] == "default"
    for auto in ("none", "None", "auto", "AUTO"):
        cfg = Config.resolve({"budget": auto}, environ=env)
        assert cfg.budget is None and cfg.sources["budget"] == "argument"
        assert Config.resolve({}, environ={"OFFRECOMP_BUDGET": auto}).budget is None
    text = (pathlib.Path(__file__).parents[2] / "docs" / "tuning.md").read_text()
    assert "`none`" in text and 'budget=""' in text


@pytest.mark.parametrize("value", ["150%", "0%", "-5%", "x%", "lots"])
def test_a_bad_budget_lists_every_accepted_form(value: str) -> None:
    """A bad percentage names the other forms too: bytes, a unit, auto."""
    with pytest.raises(ValueError) as err:
        Config.resolve({"budget": value}, environ={})
    msg = str(err.value)
    assert msg.startswith(f"budget={value!r} is invalid; accepted: ")
    for form in ("auto", "none", "integer byte count", "24GiB", "percentage", "(0%, 100%]", "60%"):
        assert form in msg, msg


@pytest.mark.parametrize(
    ("value", "stored"),
    [(logging.INFO, "INFO"), (logging.DEBUG, "DEBUG"), (40, "ERROR"), ("20", "INFO"), ("warning", "WARNING"),
     (" Critical ", "CRITICAL"), (15, "15"), (" 15 ", "15"), (0, "NOTSET"), ("0", "NOTSET"), ("notset", "NOTSET"), (55, "55")],
)
def test_log_level_takes_logging_numbers_and_names(value: object, stored: str) -> None:
    """Any level number >= 0 is a level, as ``logging`` takes it; one without a name is
    kept as its digits (and parses again to itself)."""
    cfg = Config.resolve({"log_level": value}, environ={})
    assert cfg.log_level == stored and cfg.sources["log_level"] == "argument"
    assert Config.resolve({}, environ={"OFFRECOMP_LOG": str(value)}).log_level == stored
    assert Config.resolve({"log_level": stored}, environ={}).log_level == stored


@pytest.mark.parametrize("value", [-10, "-10", True, 20.0, "LOUD", "1e3"])
def test_log_level_rejects_what_logging_does_not_name(value: object) -> None:
    with pytest.raises(ValueError, match=r"log_level=.* is invalid; accepted: DEBUG, INFO, WARNING, ERROR, "
                                         r"CRITICAL \(any case\), or a level number >= 0 such as "
                                         r"logging.INFO \(20\)"):
        Config.resolve({"log_level": value}, environ={})


@pytest.mark.parametrize("level", [logging.ERROR, 15, "15"])
def test_a_log_level_number_sets_the_logger(level: object) -> None:
    logger = logging.getLogger("offrecomp")
    before = logger.level
    try:
        offrecomp.runtime(None, log_level=level)
        assert logger.level == int(level)  # type: ignore[call-overload]
    finally:
        logger.setLevel(before)


# (runtime argument, plan flag, value, whether both accept it): one range each
_SHARED_KNOBS = [
    ("max_overhead", "--max-overhead", value, ok)
    for value, ok in (("0", True), ("0.05", True), ("10", True), ("50", False), ("-1", False), ("nan", False),
                      ("inf", False))
] + [
    (field, flag, value, ok)
    for field, flag in (("d2h_gbps", "--d2h-gbps"), ("h2d_gbps", "--h2d-gbps"))
    for value, ok in (("50", True), ("1e-6", True), ("0", False), ("-1", False), ("2e6", False))
] + [
    ("replay_op_us", "--replay-op-us", value, ok)
    for value, ok in (("0", True), ("25", True), ("-1", False), ("2e6", False))
] + [
    ("prefetch", "--prefetch-regions", value, ok) for value, ok in (("1", True), ("3", True), ("0", False))
] + [
    ("infeasible", "--infeasible", value, ok)
    for value, ok in (("warn", True), ("ERROR", True), ("Warn", True), ("ignore", False))
]


@pytest.mark.parametrize(("field", "flag", "value", "ok"), _SHARED_KNOBS)
def test_runtime_and_plan_command_accept_the_same_values(
    field: str, flag: str, value: str, ok: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A knob both take (OFFRECOMP_MAX_OVERHEAD and --max-overhead, ...) has one range,
    and either names itself when the value is out of it."""
    import io

    from scheduler.cli import main as plan_main

    if ok:
        Config.resolve({field: value}, environ={})
    else:
        with pytest.raises(ValueError, match=rf"{field}={value!r} is invalid; accepted: "):
            Config.resolve({field: value}, environ={})
    argv = ["plan", "--model", "layers=2,hidden=64,heads=2,seq=64,batch=1", "--device-tflops", "10",
            "--budget", "1GiB", flag, value]
    if flag in ("--d2h-gbps", "--h2d-gbps"):  # with --model, the link needs both
        other = "--h2d-gbps" if flag == "--d2h-gbps" else "--d2h-gbps"
        argv += [other, "50"]
    rc = plan_main(argv, out=io.StringIO())
    err = capsys.readouterr().err
    assert rc == (0 if ok else 2), err
    if not ok:
        assert flag in err and f"{field}=" not in err and f"{field} =" not in err and "None" not in err, err


def test_a_config_built_directly_is_read_as_arguments_are() -> None:
    """``Runtime(model, Config(...))``: fields given raw are parsed (a unit string, a
    number of regions), and a bad one is refused naming it, before any step runs."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    rt = offrecomp.Runtime(model, Config(budget="4MiB", prefetch=3, min_bytes="1KiB"))  # type: ignore[arg-type]
    assert rt.config.budget == Budget(nbytes=4 << 20)
    assert rt.config.prefetch == Prefetch(regions=3) and rt.config.min_bytes == 1024
    for kw, accepted in (({"mode": "fast"}, "auto, keep"), ({"prefetch": 0}, "a number of regions")):
        with pytest.raises(ValueError, match=rf"{next(iter(kw))}=.* is invalid; accepted: {accepted}"):
            offrecomp.Runtime(model, Config(**kw))  # type: ignore[arg-type]


def test_a_bad_variable_an_argument_overrides_is_still_told(caplog: pytest.LogCaptureFixture) -> None:
    """The argument wins, and the variable's mistake is said, not passed over in silence."""
    env = {"OFFRECOMP_BUDGET": "24GB%", "OFFRECOMP_MODE": "fast", "OFFRECOMP_MIN_BYTES": "1KiB"}
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        cfg = Config.resolve({"budget": "1GiB", "mode": "keep", "min_bytes": 0}, environ=env)
    assert cfg.budget == Budget(nbytes=1 << 30) and cfg.mode == "keep" and cfg.min_bytes == 0
    said = [r.getMessage() for r in caplog.records]
    assert any("OFFRECOMP_BUDGET='24GB%' is invalid" in m and "budget='1GiB' is used" in m for m in said), said
    assert any("OFFRECOMP_MODE='fast' is invalid" in m for m in said), said
    assert not any("OFFRECOMP_MIN_BYTES" in m for m in said), said  # a good one overridden says nothing


def test_resolved_fields_are_not_parsed_again(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``runtime()`` resolves the arguments, and the runtime checks its config: a value
    a parser gave is not parsed again (a path's check opens its file), while one set
    since (``dataclasses.replace``, an attribute written) is."""
    from offrecomp import config as config_mod

    var, parse = config_mod._FIELD_PARSERS["report_path"]
    calls: list[object] = []

    def counting(value: object, *, name: str) -> object:
        calls.append(value)
        return parse(value, name=name)

    monkeypatch.setitem(config_mod._FIELD_PARSERS, "report_path", (var, counting))
    path = str(tmp_path / "steps.jsonl")
    cfg = Config.resolve({"report_path": path, "budget": "4MiB"}, environ={})
    assert calls == [path]
    checked = cfg.checked()
    assert calls == [path] and checked.report_path == path and checked.checked().budget == cfg.budget
    replaced = dataclasses.replace(cfg, budget="8MiB").checked()
    assert replaced.budget == Config.resolve({"budget": "8MiB"}, environ={}).budget
    assert len(calls) == 2  # a replaced config holds no parsed values: all are checked
    cfg.budget = "x"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="budget"):
        cfg.checked()


def _two_linears() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


def test_disable_wins_over_a_config_built_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OFFRECOMP_DISABLE=1`` is the rollback switch: a Config the user built is off too."""
    monkeypatch.setenv("OFFRECOMP_DISABLE", "1")
    rt = offrecomp.Runtime(_two_linears(), Config(mode="keep"))
    assert rt.config.disable and not rt.config.active and rt.config.sources["disable"] == "env"
    with rt:
        assert not rt.active
    resolved = Config.resolve({"mode": "keep"}, environ={})  # resolved apart from this environment
    assert not offrecomp.Runtime(_two_linears(), resolved).config.active
    monkeypatch.setenv("OFFRECOMP_DISABLE", "maybe")
    with pytest.raises(ValueError, match=r"OFFRECOMP_DISABLE='maybe' is invalid"):
        offrecomp.Runtime(_two_linears(), Config(mode="keep"))


def test_a_bad_disable_variable_is_refused_without_a_warning_that_the_argument_wins(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The variable beats the argument, so a bad one is an error whatever disable= says: no
    warning first that the argument is used instead."""
    monkeypatch.setenv("OFFRECOMP_DISABLE", "maybe")
    with caplog.at_level(logging.WARNING, logger="offrecomp"), pytest.raises(ValueError, match=r"OFFRECOMP_DISABLE='maybe'"):
        offrecomp.runtime(_two_linears(), disable=True)
    assert not [r for r in caplog.records if "used instead" in r.getMessage()]


def test_a_config_built_directly_takes_the_environment_where_it_holds_defaults(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its fields are arguments: one set wins over the variable, one left at its default
    is filled from the environment as ``runtime()`` fills an argument not given; a bad
    variable is refused (or, overridden, warned about) as for ``runtime()``."""
    monkeypatch.setenv("OFFRECOMP_MODE", "recompute")
    monkeypatch.setenv("OFFRECOMP_BUDGET", "8MiB")
    cfg = offrecomp.Runtime(_two_linears(), Config(budget="4MiB")).config  # type: ignore[arg-type]
    assert cfg.budget == Budget(nbytes=4 << 20) and cfg.sources["budget"] == "argument"
    assert cfg.mode == "recompute" and cfg.sources["mode"] == "env"
    assert cfg.min_bytes == 64 * 1024 and cfg.sources["min_bytes"] == "default"
    monkeypatch.setenv("OFFRECOMP_MIN_BYTES", "lots")
    with pytest.raises(ValueError, match=r"OFFRECOMP_MIN_BYTES='lots' is invalid"):
        offrecomp.Runtime(_two_linears(), Config(mode="keep"))
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        cfg = offrecomp.Runtime(_two_linears(), Config(mode="keep", min_bytes=1024)).config
    assert cfg.min_bytes == 1024 and cfg.mode == "keep"
    assert any("OFFRECOMP_MIN_BYTES='lots' is invalid" in r.getMessage() for r in caplog.records)


def test_a_config_built_directly_says_its_fields_are_arguments(caplog: pytest.LogCaptureFixture) -> None:
    """The startup line names where each setting came from: set on the object is an
    argument, as a keyword of ``runtime()`` is; one replaced in a resolved config too."""
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        rt = offrecomp.Runtime(
            _two_linears(), Config(budget="4MiB", mode="keep", log_level="INFO")  # type: ignore[arg-type]
        )
    line = next(r.getMessage() for r in caplog.records if "mode=keep" in r.getMessage())
    for part in ("mode=keep (argument)", "budget=4.00 MiB (argument)", "log_level=INFO (argument)",
                 "min_bytes=65536 (default)"):
        assert part in line, line
    assert rt.config.sources["mode"] == "argument"
    resolved = Config.resolve({}, environ={"OFFRECOMP_MODE": "offload"})
    replaced = offrecomp.Runtime(_two_linears(), dataclasses.replace(resolved, mode="keep")).config
    assert replaced.mode == "keep" and replaced.sources["mode"] == "argument"
    assert resolved.sources["mode"] == "env"  # the original's books are its own


def test_options_a_mode_ignores_are_told(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``budget=`` and the planner's other knobs do nothing under keep/offload/recompute
    (``prefetch`` and ``host_limit`` apply to a plan ``set_plan`` gives), and every option
    nothing under ``mode="off"``: given as arguments (or on a Config), one warning names
    them; from the environment, INFO. ``OFFRECOMP_DISABLE=1`` says nothing."""
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        offrecomp.runtime(_two_linears(), mode="keep", budget="4MiB", drift=0.5, min_bytes=0)
        offrecomp.Runtime(_two_linears(), Config(mode="offload", max_overhead=0.1, plan_cache_size=4, prefetch=3))
        offrecomp.runtime(_two_linears(), mode="recompute", prefetch=1, host_limit="1GiB", verify=True)
        offrecomp.runtime(_two_linears(), mode="off", budget="4MiB", min_bytes=0, log_level="INFO")
        offrecomp.runtime(_two_linears(), budget="4MiB", infeasible="error", prefetch=3)  # auto: all apply
    said = [(r.levelno, r.getMessage()) for r in caplog.records if " ignores " in r.getMessage()]
    warned = [m for level, m in said if level == logging.WARNING]
    assert len(warned) == len(said) == 3, said
    assert "budget=4.00 MiB, drift=0.5" in warned[0], warned
    assert "mode='keep'" in warned[0] and "min_bytes" not in warned[0], warned
    assert "options of mode='auto' only" in warned[0], warned
    assert "max_overhead=0.1, plan_cache_size=4" in warned[1] and "mode='offload'" in warned[1], warned
    assert "prefetch" not in warned[1] and "options of mode='auto' only" in warned[1], warned
    assert "mode='off' ignores budget=4.00 MiB, min_bytes=0: it installs no hooks" in warned[2], warned
    caplog.clear()
    monkeypatch.setenv("OFFRECOMP_BUDGET", "4MiB")
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        offrecomp.runtime(_two_linears(), mode="recompute")
    said = [(r.levelno, r.getMessage()) for r in caplog.records if " ignores " in r.getMessage()]
    assert len(said) == 1 and said[0][0] == logging.INFO and "OFFRECOMP_BUDGET" in said[0][1], said
    caplog.clear()
    monkeypatch.setenv("OFFRECOMP_DISABLE", "1")
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        offrecomp.runtime(_two_linears(), mode="keep", budget="4MiB")
    assert not [r for r in caplog.records if " ignores " in r.getMessage()]


@pytest.mark.parametrize("value", [0, "0", "0B", "0GiB", "0%", Budget(nbytes=0), Budget(fraction=0.0)])
def test_a_host_limit_of_zero_is_refused(value: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool that may hold no bytes turns every offload away, and auto's planner reads
    a host limit of 0 as none at all, so it would plan offloads the pool refuses: 0 is
    refused, as an argument, on a Config, or as the variable, with the value and the
    accepted forms (and how to offload nothing); the smallest limit above it is not."""
    with pytest.raises(ValueError) as err:
        Config.resolve({"host_limit": value}, environ={})
    msg = str(err.value)
    for part in (f"host_limit={value!r} is invalid", "above 0", "(0%, 100%]", "mode='keep'"):
        assert part in msg, msg
    with pytest.raises(ValueError, match=r"host_limit=.* is invalid"):
        offrecomp.Runtime(_two_linears(), Config(host_limit=value))  # type: ignore[arg-type]
    if not isinstance(value, Budget):
        monkeypatch.setenv("OFFRECOMP_HOST_LIMIT", str(value))
        with pytest.raises(ValueError, match=re.escape(f"OFFRECOMP_HOST_LIMIT={str(value)!r} is invalid")):
            offrecomp.runtime(_two_linears())
        monkeypatch.delenv("OFFRECOMP_HOST_LIMIT")
    assert Config.resolve({"host_limit": "1B"}, environ={}).host_limit == Budget(nbytes=1)


def test_the_pool_limit_is_never_zero() -> None:
    """The figure the pool and the planner share is never 0, the planner's "no limit"."""
    from offrecomp.pool import host_limit_of

    with pytest.raises(ValueError, match="host_limit=0 is invalid"):
        host_limit_of(Budget(nbytes=0))
    assert host_limit_of(Budget(nbytes=1)) == 1
    assert host_limit_of(Budget(fraction=1e-30)) == 1
    assert host_limit_of(None) >= 1


def test_one_file_for_the_report_and_the_profile_is_refused(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The profile save rewrites its file and would wipe the report's lines: the same file
    (by another spelling too) is refused when the config is checked, naming both settings."""
    path = tmp_path / "out.jsonl"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        offrecomp.runtime(_two_linears(), report_path=str(path), profile_path="./out.jsonl")
    msg = str(err.value)
    for part in (f"report_path={str(path)!r}", "profile_path='./out.jsonl'", "the same file", str(path)):
        assert part in msg, msg
    env = {"OFFRECOMP_REPORT": str(path), "OFFRECOMP_PROFILE": str(path)}
    with pytest.raises(ValueError, match=r"OFFRECOMP_REPORT=.* and OFFRECOMP_PROFILE=.* name the same file"):
        Config.resolve({}, environ=env)
    with pytest.raises(ValueError, match=r"report_path=.* and OFFRECOMP_PROFILE=.* name the same file"):
        Config.resolve({"report_path": str(path)}, environ={"OFFRECOMP_PROFILE": str(path)})
    cfg = Config.resolve({"report_path": str(path)}, environ={})
    with pytest.raises(ValueError, match=r"report_path=.* and profile_path=.* name the same file"):
        dataclasses.replace(cfg, profile_path=str(path)).checked(environ={})
    assert Config.resolve({"report_path": str(path), "profile_path": str(tmp_path / "p.json")}, environ={})


def test_numpy_integers_are_counts_and_bools_are_not() -> None:
    """A size or count computed with numpy (``np.int64``) is read as the int it holds, as
    a numpy float already is; a bool stays refused, as before."""
    import numpy as np

    cfg = Config.resolve(
        {"budget": np.int64(10**9), "min_bytes": np.int64(4096), "prefetch": np.int64(2),
         "plan_cache_size": np.int32(3), "host_limit": np.uint64(1 << 30)},
        environ={},
    )
    assert cfg.budget == Budget(nbytes=10**9) and type(cfg.budget.nbytes) is int
    assert cfg.min_bytes == 4096 and type(cfg.min_bytes) is int
    assert cfg.prefetch == Prefetch(regions=2) and type(cfg.prefetch.regions) is int
    assert cfg.plan_cache_size == 3 and type(cfg.plan_cache_size) is int
    assert cfg.host_limit == Budget(nbytes=1 << 30)
    assert parse_bytes(np.int16(7)) == 7
    for kw in ({"budget": np.int64(-1)}, {"prefetch": np.int64(0)}, {"plan_cache_size": np.int64(0)},
               {"min_bytes": True}, {"prefetch": True}, {"plan_cache_size": False}, {"budget": True}):
        name, value = next(iter(kw.items()))
        with pytest.raises(ValueError, match=rf"{name}={re.escape(repr(value))} is invalid"):
            Config.resolve(kw, environ={})


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("budget", Budget(nbytes=-5), "budget=-5"),
        ("budget", Budget(fraction=7.0), "budget=Budget(nbytes=None, fraction=7.0)"),
        ("budget", Budget(), "budget=Budget(nbytes=None, fraction=None)"),
        ("prefetch", Prefetch(regions=0), "prefetch=0"),
        ("prefetch", Prefetch(nbytes=-1), "prefetch=Prefetch(regions=None, nbytes=-1)"),
        ("budget", Budget(nbytes="1GiB"), "budget=Budget(nbytes='1GiB', fraction=None)"),  # type: ignore[arg-type]
        ("prefetch", Prefetch(regions="2"), "prefetch=Prefetch(regions='2', nbytes=None)"),  # type: ignore[arg-type]
    ],
)
def test_budget_and_prefetch_objects_are_checked_as_the_values_they_stand_for(field: str, value: object, shown: str) -> None:
    """A ``Budget`` or ``Prefetch`` given for its field is refused where the number,
    percentage or window it stands for is (a negative budget ran two steps, then failed
    in the solver without naming ``budget``; 700% and 0 regions ran)."""
    with pytest.raises(ValueError, match=re.escape(shown) + " is invalid; accepted"):
        Config.resolve({field: value}, environ={})
    assert Config.resolve({"budget": Budget(fraction=0.5)}, environ={}).budget == Budget(fraction=0.5)
    assert Config.resolve({"budget": Budget(nbytes=np.int64(4096))}, environ={}).budget == Budget(nbytes=4096)


@pytest.mark.parametrize(
    ("rank", "world", "path", "want"),
    [(0, 1, "run.jsonl", "run.jsonl"), (0, 2, "run.jsonl", "run.jsonl"), (1, 2, "run.jsonl", "run.rank1.jsonl"),
     (3, 4, "/a/b/prof", "/a/b/prof.rank3"), (2, 4, "/a.b/prof.json", "/a.b/prof.rank2.json")],
)
def test_each_rank_writes_files_of_its_own(
    rank: int, world: int, path: str, want: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [Files per rank]: ranks appending to one report interleaved their steps, and
    profiles written over each other at once left invalid JSON."""
    from offrecomp import _torch_compat as tc

    monkeypatch.setattr(tc, "process_rank", lambda: (rank, world))
    assert tc.per_rank_path(path) == want


def test_a_rank_torchrun_set_names_its_files_before_the_group_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Files per rank]: the report opens at the first entry, which may come before
    ``init_process_group``; torchrun's ``RANK`` and ``WORLD_SIZE`` tell the rank then."""
    from offrecomp import _torch_compat as tc

    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert tc.process_rank() == (2, 4) and tc.per_rank_path("run.jsonl") == "run.rank2.jsonl"
    monkeypatch.setenv("RANK", "x")
    assert tc.process_rank() == (0, 1)
