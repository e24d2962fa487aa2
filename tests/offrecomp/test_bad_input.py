"""Unusual saved tensors and bad arguments: each gets a clear error or documented behaviour."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp import _torch_compat as tc
from offrecomp.hooks import _Plain
from scheduler.units import format_bytes
from tests.helpers import assert_bitwise, make, train, twin

MODES = ["keep", "recompute", "offload", "auto"]


class OddBlock(nn.Module):
    """Saves a sparse, a complex, a zero-sized and a non-contiguous tensor."""

    def __init__(self, h: int = 16) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(h, h) / h)
        self.register_buffer("mask", (torch.arange(h * h).reshape(h, h) % 5 == 0).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sparse.mm(self.mask.to_sparse(), x.t()).t()  # saves a sparse tensor
        z = (y @ self.w).to(torch.complex64)
        z = (z * z).real  # saves complex tensors
        e = x[:, :0] @ self.w[:0]  # zero-sized saves
        nc = (x.t() * 2.0).t()  # non-contiguous
        return x + torch.tanh(z) + e + torch.sigmoid(nc)


class OddModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([OddBlock(), OddBlock()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


@pytest.mark.parametrize("mode", MODES)
def test_sparse_complex_zero_sized_noncontiguous(mode: str) -> None:
    torch.manual_seed(0)
    model = OddModel()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(8, 16, generator=torch.Generator().manual_seed(s))

    ref = train(twin(model), batch)
    m = twin(model)
    got = train(m, batch, offrecomp.runtime(m, mode=mode, min_bytes=0))
    assert_bitwise(ref, got)


class SparseScale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.5


@pytest.mark.parametrize("mode", MODES)
def test_a_sparse_coo_tensor_into_a_region(mode: str) -> None:
    """A sparse COO tensor with ``requires_grad`` passed to the regions trains like plain
    (the hidden-save check asks no storage of a layout without one)."""

    def run(m: nn.Module, ctx: offrecomp.Runtime | None) -> list[torch.Tensor]:
        grads = []
        with ctx if ctx is not None else contextlib.nullcontext():
            for seed in range(3):
                dense = torch.randn(6, 5, generator=torch.Generator().manual_seed(seed)).relu()
                s = dense.to_sparse().requires_grad_()
                torch.sparse.sum(m(s)).backward()
                grads.append(s.grad.to_dense())
        return grads

    ref = run(nn.Sequential(SparseScale(), SparseScale()), None)
    m = nn.Sequential(SparseScale(), SparseScale())
    got = run(m, offrecomp.runtime(m, mode=mode, min_bytes=0))
    assert len(got) == len(ref) == 3
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


def test_quantized_and_meta_tensors_are_saved_as_they_are() -> None:
    model, _ = make("gpt_dropout")
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    q = torch.quantize_per_tensor(torch.randn(64), 0.1, 0, torch.qint8)
    meta = torch.empty(64, device="meta")
    with rt:
        hooks = tc.top_saved_tensors_hooks()
        assert hooks is not None
        pack, unpack = hooks
        for t in (q, meta):
            h = pack(t)
            assert isinstance(h, _Plain)
            assert unpack(h) is t


def test_budget_below_what_must_stay_warns_with_the_smallest_feasible(caplog: pytest.LogCaptureFixture) -> None:
    model, batch = make("gpt_dropout")
    m = twin(model)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = offrecomp.runtime(m, mode="auto", budget=1, min_bytes=0)
        train(m, batch, rt, steps=3)
    plan = rt.planner.last_entry.plan
    smallest = plan.min_feasible_budget_bytes
    assert not plan.feasible and smallest and smallest > 1
    warned = [r.getMessage() for r in caplog.records if "cannot be met" in r.getMessage()]
    assert len(warned) == 1, caplog.text  # once per signature
    assert "budget 1 B cannot be met" in warned[0]
    assert f"the smallest feasible budget is {format_bytes(smallest)} ({smallest} bytes)" in warned[0], warned


def test_budget_below_what_must_stay_errors_when_asked() -> None:
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", budget="1KiB", min_bytes=0, infeasible="error")
    with pytest.raises(ValueError, match=r"1\.00 KiB|1024"):
        train(m, batch, rt, steps=3)


def test_report_writes_one_json_line_per_step(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.jsonl"
    monkeypatch.setenv("OFFRECOMP_REPORT", str(path))
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", budget="50%", min_bytes=0)
    train(m, batch, rt, steps=4)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2, 3]
    for key in ("peak_activation_bytes", "kept_bytes", "offloaded_bytes", "recomputed_bytes",
                "recompute_seconds", "stall_seconds", "step_seconds", "plan_id", "fallbacks",
                "predicted_step_seconds", "d2h_gbps", "h2d_gbps"):
        assert key in lines[0], key
    assert lines[0]["phase"] == "measure" and lines[-1]["phase"] == "planned"
    assert lines[-1]["predicted_step_seconds"] is not None
    table = str(rt.report())
    assert "peak act" in table and "planned" in table
    data = json.loads(rt.report().to_json())
    assert len(data["steps"]) == 4


def test_explain_names_every_region() -> None:
    model, batch = make("gpt_dropout")
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0)
    assert "no plan yet" in rt.explain()
    train(m, batch, rt, steps=3)
    text = rt.explain()
    for r in rt.regions:
        assert r in text


def test_profile_saved_by_a_run_plans_with_the_cli(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """OFFRECOMP_PROFILE writes the measured profile; `python -m offrecomp plan` reads it."""
    from offrecomp.__main__ import main
    from scheduler import Profile

    path = tmp_path / "prof.json"
    monkeypatch.setenv("OFFRECOMP_PROFILE", str(path))
    model, batch = make("gpt_dropout")
    m = twin(model)
    train(m, batch, offrecomp.runtime(m, mode="auto", min_bytes=0), steps=2)
    prof = Profile.load(path)
    assert [r.name for r in prof.regions] == ["blocks.0", "blocks.1", "blocks.2"]
    assert all(r.ops and r.storages for r in prof.regions)
    half = prof.activation_bytes // 2
    assert main(["plan", str(path), "--budget", str(half), "--json"]) in (0, 1)
    assert main(["plan", str(path), "--budget", str(prof.activation_bytes)]) == 0
    assert main(["bogus"]) == 2


def _two_blocks() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


def test_set_plan_rejects_a_placement_that_is_not_one() -> None:
    """A string or a number would be taken for OFFLOAD on the save path."""
    from offrecomp import Placement, Plan

    rt = offrecomp.runtime(_two_blocks())
    with pytest.raises(TypeError, match=r"plan.default='recompute' is not a placement; accepted: Placement.KEEP"):
        rt.set_plan(Plan(default="recompute"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"plan.placements\[\('0', 0, 1\)\]=2 is not a placement"):
        rt.set_plan(Plan(placements={("0", 0, 1): 2}))  # type: ignore[dict-item]
    rt.set_plan(Plan(placements={("0", 0, 1): Placement.RECOMPUTE}))


@pytest.mark.parametrize("key", [("0",), ("0", "0", 1), ("0", 0, -1), (0, 0, 1), "0"])
def test_set_plan_rejects_a_key_that_is_not_a_storage(key: object) -> None:
    """A key other than (region name, call index, storage index) would never be looked up:
    the placement meant for it silently not applied."""
    from offrecomp import Placement, Plan

    rt = offrecomp.runtime(_two_blocks())
    with pytest.raises(TypeError, match=r"is not \(region name, call index, storage index\)"):
        rt.set_plan(Plan(placements={key: Placement.RECOMPUTE}))  # type: ignore[dict-item]


@pytest.mark.parametrize("depth", ["2", 0, -3, 2.5, True])
def test_set_plan_rejects_a_prefetch_depth_that_is_not_one(depth: object) -> None:
    """A string crashed the first backward inside the engine; 0, -3 and 2.5 ran unremarked."""
    from offrecomp import Placement, Plan

    rt = offrecomp.runtime(_two_blocks())
    with pytest.raises(ValueError, match=r"plan.prefetch_regions=.* is invalid; accepted: None .* 1 or more"):
        rt.set_plan(Plan(default=Placement.OFFLOAD, prefetch_regions=depth))  # type: ignore[arg-type]
    rt.set_plan(Plan(default=Placement.OFFLOAD, prefetch_regions=2))


def test_set_plan_keeps_the_plan_it_checked() -> None:
    """A placement changed on the caller's plan after set_plan() met no check: a string
    placement was taken for OFFLOAD on the save path."""
    from offrecomp import Placement, Plan

    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(2)])
    x = torch.randn(8, 64)
    plan = Plan(placements={("0", 0, 1): Placement.KEEP})
    with offrecomp.runtime(model, mode="keep", min_bytes=0) as rt:
        rt.set_plan(plan)
        plan.placements[("0", 0, 1)] = "keep"  # type: ignore[assignment]
        plan.default = "offload"  # type: ignore[assignment]
        for _ in range(2):
            model(x).sum().backward()
    assert rt.planner.host.user_plan == Plan(placements={("0", 0, 1): Placement.KEEP})
    assert rt.report().steps[-1].offloaded_bytes == 0
    rt.explain()  # the default a string would make no name of


def test_set_plan_under_mode_off_says_it_does_nothing(caplog: pytest.LogCaptureFixture) -> None:
    from offrecomp import Plan

    rt = offrecomp.runtime(_two_blocks(), mode="off")
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt.set_plan(Plan())
    assert any("mode='off'" in r.getMessage() and "no effect" in r.getMessage() for r in caplog.records)


def test_set_plan_names_regions_the_runtime_lacks(caplog: pytest.LogCaptureFixture) -> None:
    from offrecomp import Placement, Plan

    rt = offrecomp.runtime(_two_blocks())
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt.set_plan(Plan(placements={("nope", 0, 0): Placement.KEEP}))
    assert any("'nope'" in r.getMessage() and "does not have" in r.getMessage() for r in caplog.records)


def test_an_unknown_offrecomp_variable_is_named(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("OFFRECOMP_BUDGT_TEST", "1KiB")
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        offrecomp.runtime(_two_blocks())
    msgs = [r.getMessage() for r in caplog.records if "OFFRECOMP_BUDGT_TEST" in r.getMessage()]
    assert msgs and "did you mean OFFRECOMP_BUDGET" in msgs[0]


def test_a_module_instance_as_regions_says_to_pass_its_type() -> None:
    m = _two_blocks()
    with pytest.raises(TypeError, match=r"module instance \(Linear\).*regions=Linear"):
        offrecomp.runtime(m, regions=m[0])  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["mode_off", "disabled"])
def test_a_bad_regions_argument_fails_when_the_runtime_is_off(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error in the configuration does not depend on the runtime being on: mode="off"
    and OFFRECOMP_DISABLE=1 check regions= as an active runtime does, and install nothing."""
    kw: dict[str, Any] = {"mode": "off"} if how == "mode_off" else {}
    if how == "disabled":
        monkeypatch.setenv("OFFRECOMP_DISABLE", "1")
    m = _two_blocks()
    with pytest.raises(TypeError, match=r"module instance \(Linear\).*regions=Linear"):
        offrecomp.runtime(m, regions=m[0], **kw)
    with pytest.raises(TypeError, match=r"regions=\[1\] is invalid \(not every entry is a module type\); accepted: None"):
        offrecomp.runtime(m, regions=[1], **kw)
    with pytest.raises(TypeError, match=r"regions=\[\] is invalid \(it names no module type\);.*non-empty list"):
        offrecomp.runtime(m, regions=[], **kw)
    with pytest.raises(TypeError, match=r"regions=int is invalid \(not an nn.Module subclass\); accepted: None"):
        offrecomp.runtime(m, regions=int, **kw)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"regions=\[<class 'torch.nn.modules.linear.Linear'>, <class 'int'>\] is invalid \(not every"):
        offrecomp.runtime(m, regions=[nn.Linear, int], **kw)
    with pytest.raises(ValueError, match=r"regions=<class '.*Conv2d'> matched no module of Sequential"):
        offrecomp.runtime(m, regions=nn.Conv2d, **kw)

    def broken(module: nn.Module, name: str) -> bool:
        raise RuntimeError("boom")

    with pytest.raises(TypeError, match=r"regions= filter 'broken' raised RuntimeError\('boom'\)"):
        offrecomp.runtime(m, regions=broken, **kw)
    rt = offrecomp.runtime(m, regions=nn.Linear, **kw)
    assert rt.regions == [] and not rt.config.active
    with rt:
        m(torch.randn(2, 4)).sum().backward()
    assert rt.report().steps == []


@pytest.mark.parametrize("var", ["OFFRECOMP_PROFILE", "OFFRECOMP_REPORT"])
def test_a_file_setting_in_a_missing_folder_or_on_a_folder_fails_at_once(
    var: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv(var, str(tmp_path / "no" / "such" / "file.json"))
    with pytest.raises(ValueError, match=rf"{var}=.*does not exist"):
        offrecomp.runtime(_two_blocks())
    monkeypatch.setenv(var, str(tmp_path))
    with pytest.raises(ValueError, match=rf"{var}=.*is a directory"):
        offrecomp.runtime(_two_blocks())
    if os.path.isdir("/proc"):  # a folder no file can be made in, even by root
        monkeypatch.setenv(var, "/proc/offrecomp-probe.json")
        with pytest.raises(ValueError, match=rf"{var}=.*cannot be written"):
            offrecomp.runtime(_two_blocks())
    monkeypatch.setenv(var, str(tmp_path / "fresh.json"))
    offrecomp.runtime(_two_blocks())
    assert not (tmp_path / "fresh.json").exists()  # the check leaves nothing behind


def test_a_profile_that_cannot_be_written_later_is_said_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """OFFRECOMP_PROFILE's folder removed after the runtime checked it: training goes on,
    and the failure is logged once."""
    offrecomp.diagnostics.clear_warnings()
    folder = tmp_path / "gone"
    folder.mkdir()
    monkeypatch.setenv("OFFRECOMP_PROFILE", str(folder / "p.json"))
    m = _two_blocks()
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0)
    folder.rmdir()
    with caplog.at_level(logging.WARNING, logger="offrecomp"), rt:
        for _ in range(4):
            m(torch.randn(4, 4)).sum().backward()
    assert caplog.text.count("cannot write the profile to OFFRECOMP_PROFILE") == 1
    assert [s.phase for s in rt.report().steps][-1] == "planned"


def test_a_budget_of_zero_warns_it_cannot_be_met(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])
    x = torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(m, budget=0, min_bytes=0):
        for _ in range(3):
            m(x).sum().backward()
    assert any("budget 0 B cannot be met" in r.getMessage() for r in caplog.records)


def test_a_plan_of_the_wrong_shape_or_placement_names_it() -> None:
    from scheduler.plan import Placement, Plan

    rt = offrecomp.runtime(_two_blocks(), mode="keep")
    with pytest.raises(TypeError, match=r"plan\.placements=\[.*accepted: a dict"):
        rt.set_plan(Plan(placements=[(("0", 0, 0), Placement.RECOMPUTE)]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"placement True is invalid; accepted: keep, offload, recompute"):
        Placement.parse(True)
    with pytest.raises(ValueError, match=r"placement 5 is invalid; accepted: keep, offload, recompute, or their numbers"):
        Placement.parse(5)
    assert Placement.parse(2) is Placement(2) and Placement.parse(" Keep ") is Placement.KEEP


def test_plan_keys_that_match_no_storage_are_named(caplog: pytest.LogCaptureFixture) -> None:
    """A key of a known region whose call or storage index the model never reaches is
    named once, at the end of the plan's first pass."""
    from scheduler.plan import Placement, Plan

    m = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
    rt = offrecomp.runtime(m, mode="keep", min_bytes=0)
    rt.set_plan(Plan(placements={("0", 0, 99): Placement.RECOMPUTE, ("0", 7, 0): Placement.RECOMPUTE,
                                 ("1", 0, 1): Placement.RECOMPUTE}))
    with caplog.at_level(logging.WARNING, logger="offrecomp"), rt:
        for _ in range(3):
            m(torch.randn(2, 4)).sum().backward()
    assert caplog.text.count("matched no storage of its first pass") == 1
    assert "('0', 0, 99), ('0', 7, 0)" in caplog.text and "('1', 0, 1)" not in caplog.text


def test_every_new_plan_is_checked_even_at_a_collected_plans_address(caplog: pytest.LogCaptureFixture) -> None:
    """Plans set one after another, each dropped after its pass: a new plan often takes
    a collected one's id, and is checked all the same; the planner holds none of them."""
    import gc

    from scheduler.plan import Placement, Plan

    m = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
    rt = offrecomp.runtime(m, mode="keep", min_bytes=0)
    n = 12  # a freed plan's address is usually the next one's: each iteration tries it
    with caplog.at_level(logging.WARNING, logger="offrecomp"), rt:
        for k in range(n):
            rt.set_plan(Plan(placements={("1", 9, k): Placement.RECOMPUTE}))
            m(torch.randn(2, 4)).sum().backward()
            rt.set_plan(None)
            gc.collect()
    assert caplog.text.count("matched no storage of its first pass") == n
    assert len(rt.planner._plans_checked) <= 1  # the last pass, kept for explain(), holds its plan


def test_a_variable_in_the_wrong_case_is_named_with_its_setting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``OFFRECOMP_mode`` is not read (names are upper case): the warning names
    ``OFFRECOMP_MODE``, where the nearest name by spelling was ``OFFRECOMP_LOG``."""
    monkeypatch.setenv("OFFRECOMP_mode", "keep")
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        offrecomp.runtime(_two_blocks())
    msgs = [r.getMessage() for r in caplog.records if "OFFRECOMP_mode" in r.getMessage()]
    assert msgs and "did you mean OFFRECOMP_MODE?" in msgs[0], msgs


@pytest.mark.parametrize("value", ["no", "yes", 1, None])
def test_explain_takes_a_bool(value: object) -> None:
    """``explain(storages="no")`` would list the storages: a non-bool is refused."""
    rt = offrecomp.runtime(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
    with pytest.raises(TypeError, match=rf"explain\(storages={value!r}\) is invalid; accepted: True or False"):
        rt.explain(value)  # type: ignore[arg-type]
    assert isinstance(rt.explain(storages=True), str)
