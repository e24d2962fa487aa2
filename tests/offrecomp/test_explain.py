"""rt.explain() in every mode: per region call, what was kept, offloaded or recomputed,
and why, in columns that stay aligned for long region names."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from torch import nn

import offrecomp
from tests import models
from tests.helpers import tight_budget, train


class LongNames(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.decoder_layers_with_a_rather_long_attribute_name = nn.ModuleList(
            models.MLPBlock(32) for _ in range(3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.decoder_layers_with_a_rather_long_attribute_name:
            x = b(x)
        return x.square().mean()


def _batch(s: int) -> torch.Tensor:
    return torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(s))


def _rows(text: str, regions: list[str]) -> list[str]:
    return [line for line in text.splitlines() if any(line.strip().startswith(r + " ") for r in regions)]


def _assert_aligned(text: str, regions: list[str]) -> None:
    """Every row's call number ends where the header's "call" does."""
    lines = text.splitlines()
    header = next(line for line in lines if " call " in line and "region" in line)
    end = header.index(" call") + len(" call")
    rows = _rows(text, regions)
    assert len(rows) == len(regions), text
    for row in rows:
        assert row[end - 1].isdigit() and row[end] == " ", (row, header)


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("keep", "mode='keep' keeps every activation"),
        ("recompute", "mode='recompute' drops its activations and replays its forward in backward"),
        ("offload", "mode='offload' copies its activations to host memory (emulated on CPU: no memory saved)"),
    ],
)
def test_a_forced_mode_says_what_it_did_per_region(mode: str, why: str) -> None:
    torch.manual_seed(0)
    m = LongNames()
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    train(m, _batch, rt, steps=2)
    text = rt.explain()
    assert "no plan yet" not in text and f"mode={mode!r}" in text
    rows = _rows(text, rt.regions)
    assert len(rows) == 3 and all(why in row for row in rows), text
    _assert_aligned(text, rt.regions)
    if mode == "recompute":
        cols = [re.split(r"\s{2,}", row.strip()) for row in rows]
        assert all(c[3] == "0/0 B" and not c[4].startswith("0/") for c in cols), text


def test_auto_says_why_per_region_in_aligned_columns() -> None:
    torch.manual_seed(0)
    m = LongNames()
    rt = offrecomp.runtime(m, min_bytes=0, budget="50%")
    train(m, _batch, rt, steps=3)
    text = rt.explain()
    rows = _rows(text, rt.regions)
    assert len(rows) == 3 and all("kept: the budget holds it" in row for row in rows), text
    _assert_aligned(text, rt.regions)


def test_auto_sets_each_replays_time_beside_its_prediction() -> None:
    """A region call a tight plan drops from shows its replay's predicted seconds and
    those its replays took in a planned pass; a call kept whole predicts 0 and ran none."""
    torch.manual_seed(0)
    m = models.GPT(layers=3)

    def batch(s: int) -> torch.Tensor:
        return torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(s))

    rt = offrecomp.runtime(m, min_bytes=0, budget=tight_budget(m, batch))
    train(m, batch, rt, steps=6)
    text = rt.explain()
    header = next(line for line in text.splitlines() if "region" in line and " call " in line)
    assert "replay s" in header and "ran s" in header, text
    cols = [re.split(r"\s{2,}", row.strip()) for row in _rows(text, rt.regions)]
    dropped = [c for c in cols if not c[4].startswith("0/")]
    kept = [c for c in cols if c[4].startswith("0/")]
    assert dropped, text
    for c in dropped:
        assert float(c[7]) > 0 and float(c[8]) > 0, text
    for c in kept:
        assert float(c[7]) == 0 and c[8] == "-", text


@pytest.mark.parametrize(
    ("how", "said"),
    [("off", "mode='off'"), ("off_env", "OFFRECOMP_MODE=off"), ("disable", "OFFRECOMP_DISABLE=1"),
     ("disable_arg", "disable=True")],
)
def test_off_and_disabled_say_that_nothing_is_installed(how: str, said: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """And name what turned it off, as the user gave it."""
    kw: dict[str, object] = {"mode": "recompute"}
    if how == "disable":
        monkeypatch.setenv("OFFRECOMP_DISABLE", "1")
    elif how == "off_env":
        monkeypatch.setenv("OFFRECOMP_MODE", "off")
        kw = {}
    elif how == "off":
        kw = {"mode": "off"}
    else:
        kw["disable"] = True
    torch.manual_seed(0)
    m = LongNames()
    rt = offrecomp.runtime(m, **kw)  # type: ignore[arg-type]
    train(m, _batch, rt, steps=1)
    text = rt.explain()
    assert "nothing is installed" in text, text
    assert f"offrecomp is off ({said})" in text, text


def test_the_report_says_cpu_offload_is_emulated() -> None:
    torch.manual_seed(0)
    m = LongNames()
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    train(m, _batch, rt, steps=2)
    table = str(rt.report())
    rows = [line for line in table.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert len(rows) == 2 and all("(emulated)" in row for row in rows), table
    assert "save no memory" in table


def test_the_first_step_of_accumulation_shows_that_it_measures_and_calibrates() -> None:
    """Gradient accumulation: the first step's first micro-batch measures and the second
    calibrates; its record says both."""
    torch.manual_seed(0)
    m = LongNames()
    rt = offrecomp.runtime(m, min_bytes=0, budget="50%", drift=100.0)
    train(m, _batch, rt, steps=3, accumulate=2)
    steps = rt.report().steps
    assert steps[0].phase == "measure"  # the first pass's
    phases = [s.phases for s in steps]
    assert phases[0] == "measure+calibrate", phases
    assert phases[-1] == "planned", phases
    assert "measure+calibrate" in str(rt.report())


@pytest.mark.parametrize("mode", ["keep", "auto"])
def test_a_plan_set_by_the_user_is_what_explain_shows(mode: str) -> None:
    """``rt.set_plan()`` places the storages under any mode: explain says so, with what
    the last step did, not a forced mode's reason nor auto's "no plan yet"."""
    torch.manual_seed(0)
    m = LongNames()
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    rt.set_plan(offrecomp.Plan(default=offrecomp.Placement.RECOMPUTE, plan_id="mine"))
    train(m, _batch, rt, steps=2)
    text = rt.explain()
    assert "plan mine set with rt.set_plan()" in text and "RECOMPUTE for the rest" in text, text
    assert "no plan yet" not in text and "keeps every activation" not in text, text
    rows = _rows(text, rt.regions)
    cols = [re.split(r"\s{2,}", row.strip()) for row in rows]
    assert len(rows) == 3 and all(c[-1] == "rt.set_plan()" and not c[4].startswith("0/") for c in cols), text
    _assert_aligned(text, rt.regions)


@pytest.mark.parametrize("mode", ["keep", "auto"])
def test_a_placement_the_rules_refuse_is_logged_once_and_marked(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """A plan that asks to drop a region input (the replay's checkpoint) or to offload a
    storage under min_bytes gets KEEP there: one warning names each such key and why, and
    explain() marks the call; a legal ask of the same plan is carried out."""
    from offrecomp import Placement, Plan

    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2)])
    rt = offrecomp.runtime(m, mode=mode, min_bytes=1024)
    asks = {("0", 0, 0): Placement.RECOMPUTE, ("0", 0, 1): Placement.OFFLOAD, ("1", 0, 1): Placement.RECOMPUTE}
    rt.set_plan(Plan(placements=asks))
    with caplog.at_level(logging.WARNING, logger="offrecomp"), rt:
        for _ in range(4):
            m(torch.randn(4, 8)).sum().backward()
    said = [r.getMessage() for r in caplog.records if "the rules do not allow" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "asks for 2 placement(s)" in said[0]
    assert "('0', 0, 0) RECOMPUTE (a region input is the replay's checkpoint, never dropped)" in said[0]
    assert "('0', 0, 1) OFFLOAD (under min_bytes (1.00 KiB), never offloaded)" in said[0]
    rows = {row.split()[0]: row for row in _rows(rt.explain(), ["0", "1"])}
    assert "2 kept against it: storage 0 RECOMPUTE (a region input" in rows["0"], rt.explain()
    recompute, why = re.split(r"\s{2,}", rows["1"].strip())[4:]
    assert why == "rt.set_plan()" and recompute == "1/128 B", rt.explain()


def test_a_snapshot_of_a_call_kept_whole_is_not_shown_as_kept() -> None:
    """A region call's buffer copies (a ``snapshot`` storage) are held only where the
    plan does not keep the call whole; ``explain()``'s counts and the plan's log line
    counted them as kept for a call kept whole too."""
    from offrecomp.explain import explain_plan
    from scheduler import Plan, Profile, RegionRecord, StorageRecord
    from scheduler.plan import Placement

    def call(i: int) -> RegionRecord:
        return RegionRecord(
            name="b", call_index=i, start_seconds=0.0, forward_seconds=1.0, backward_seconds=1.0,
            storages=[StorageRecord(nbytes=100), StorageRecord(nbytes=50, kind="snapshot", saves=0)],
        )

    profile = Profile(signature="s", forward_seconds=2.0, backward_seconds=2.0, regions=[call(0), call(1)])
    plan = Plan(placements={("b", 1, 0): Placement.RECOMPUTE})
    assert plan.held("b", 0, ["activation", "snapshot"]) == [Placement.KEEP, None]
    assert plan.held("b", 1, ["activation", "snapshot"]) == [Placement.RECOMPUTE, Placement.KEEP]
    rows = [line.split() for line in explain_plan("s", plan, profile, []).splitlines() if line.lstrip().startswith("b ")]
    assert rows[0][2] == "1/100" and rows[1][2] == "1/50", rows  # keep: count/bytes


def test_a_time_under_the_tables_resolution_is_not_shown_as_zero() -> None:
    from offrecomp.explain import _seconds

    assert _seconds(0.0) == "0.00000" and _seconds(0.00028) == "0.00028"
    assert float(_seconds(3.2e-6)) == 3.2e-6  # a replay of a few cheap ops, on a fast host


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_explain_lists_the_storage_keys_set_plan_places(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """``rt.explain(storages=True)`` lists each (region, call, storage) key with its
    placement, size and kind; a plan made of those keys matches every one of them (no
    warning of keys that match no storage) and places them as it says."""
    torch.manual_seed(0)
    model = models.Stack([models.MLPBlock(16) for _ in range(2)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s))

    rt = offrecomp.runtime(model, mode=mode, min_bytes=0, budget=1)
    train(model, batch, rt, steps=4)
    listing = rt.explain(storages=True)
    rows = re.findall(r"\(('blocks\.\d'), (\d+), (\d+)\)\s+(keep|offload|recompute)\s+\S+ \S+\s+(\w+)", listing)
    assert {r[0] for r in rows} == {"'blocks.0'", "'blocks.1'"}, listing
    activations = [(name.strip("'"), int(c), int(i)) for name, c, i, _, kind in rows if kind == "activation"]
    assert activations and any(pl == "recompute" for *_, pl, _ in rows), listing
    key = activations[0]
    rt.set_plan(offrecomp.Plan(placements={key: offrecomp.Placement.RECOMPUTE}, default=offrecomp.Placement.KEEP))
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        train(model, batch, rt, steps=1)
    assert not [r for r in caplog.records if "matched no storage" in r.getMessage()]
    placed = re.findall(r"\(('blocks\.\d'), (\d+), (\d+)\)\s+(keep|offload|recompute)", rt.explain(storages=True))
    assert {(n.strip("'"), int(c), int(i)): pl for n, c, i, pl in placed}[key] == "recompute"


def test_explain_lists_the_storage_keys_once_auto_has_measured() -> None:
    """The keys a user's plan places are known from auto's measuring pass on: listed as
    unplanned until a plan exists (they read "none yet" after the measuring and the
    calibrating step before)."""
    torch.manual_seed(0)
    model = models.Stack([models.MLPBlock(16) for _ in range(2)])
    rt = offrecomp.runtime(model, mode="auto", min_bytes=0)
    assert "none yet" in rt.explain(storages=True)

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s))

    train(model, batch, rt, steps=1)
    listing = rt.explain(storages=True)
    rows = re.findall(r"\('blocks\.\d', \d+, \d+\)\s+unplanned", listing)
    assert rows and "none yet" not in listing, listing


def test_a_region_that_saves_only_its_input_says_it_keeps_it() -> None:
    """A block whose activations a checkpoint inside owns saves only its input through
    offrecomp: its row counted one kept storage while its reason said nothing was saved."""
    import warnings

    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + checkpoint(self.f, x, use_reentrant=False)

    model = nn.Sequential(Checkpointed(), Checkpointed())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
            model(torch.randn(4, 16, requires_grad=True)).sum().backward()
    rows = [line for line in rt.explain().splitlines() if "nothing to place" in line]
    assert rows and all("1/" in r and "1 region input(s) kept" in r for r in rows), rt.explain()
