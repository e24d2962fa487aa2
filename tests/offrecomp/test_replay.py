"""Replay: cheap partial recompute, divergence and in-place detection, verification."""

from __future__ import annotations

import contextlib
import copy
import logging
import types
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import offrecomp
import offrecomp.diagnostics
from offrecomp import Placement, Plan
from offrecomp.regions import READ_SNAPSHOT_MAX_BYTES
from tests import models
from tests.helpers import assert_bitwise, check_variant, tight_budget, train, train_bitwise, twin


@pytest.fixture(autouse=True)
def _always_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """These models are tiny: let the dispatch mode pay off whatever it skips, so the
    mechanism itself is what is tested (NOTE [Serving overhead] has its own test)."""
    monkeypatch.setenv("OFFRECOMP_REPLAY_OP_US", "0")


def _gpt() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return models.GPT(layers=3, h=32, heads=4, p=0.0), torch.randint(0, 64, (2, 32))


class MatmulFlops(TorchDispatchMode):
    """Counts matmul and attention FLOPs (an independent count, not the runtime's)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        name = func.__name__
        if name.startswith(("mm", "addmm", "bmm")):
            a, b = args[-2], args[-1]
            self.flops += 2 * a.numel() * b.shape[-1]
        elif "scaled_dot_product" in name:
            q, k = args[0], args[1]
            self.flops += 4 * q.numel() * k.shape[-2]
        return out


def _backward_flops(model: nn.Module, idx: torch.Tensor) -> int:
    loss = model(idx)
    with MatmulFlops() as fc:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return fc.flops


def _storage_of(rt: offrecomp.Runtime, region: str, op: str) -> list[int]:
    entry = next(iter(rt.planner.entries.values()))
    st = entry.structures[(region, 0)]
    return [
        i
        for i, s in enumerate(st.storage_records)
        if s.producer_op >= 0 and op in st.op_names[s.producer_op] and s.kind == "activation"
    ]


def test_dropping_a_late_cheap_tensor_costs_that_op_only() -> None:
    """GELU output dropped, everything else kept: replay runs GELU and no matmul."""
    model, idx = _gpt()
    plain = _backward_flops(twin(model), idx)
    m = twin(model)
    with offrecomp.runtime(m, mode="auto", min_bytes=0) as rt:
        full = _backward_flops(m, idx)  # measuring pass: full recompute
        gelu = _storage_of(rt, "blocks.1", "gelu")
        assert len(gelu) == 1
        rt.set_plan(
            Plan(
                placements={(f"blocks.{b}", 0, gelu[0]): Placement.RECOMPUTE for b in range(3)},
                default=Placement.KEEP,
                plan_id="gelu",
            )
        )
        partial = _backward_flops(m, idx)
    steps = rt.report().steps
    assert steps[-1].replays == 3
    assert steps[-1].rerun_ops == 3  # one GELU per block, nothing else computed
    assert steps[-1].served_ops > 20
    assert partial == plain  # no matmul or attention recomputed
    assert full > plain * 1.2  # full recompute reruns every block's matmuls


def test_dropping_norm_output_reruns_the_norm_only() -> None:
    model, idx = _gpt()
    plain = _backward_flops(twin(model), idx)
    m = twin(model)
    with offrecomp.runtime(m, mode="auto", min_bytes=0) as rt:
        _backward_flops(m, idx)
        lns = _storage_of(rt, "blocks.0", "native_layer_norm")
        big = [i for i in lns if rt.planner.entries[next(iter(rt.planner.entries))].structures[("blocks.0", 0)].storage_records[i].nbytes >= 4096]
        assert len(big) == 2
        rt.set_plan(
            Plan(
                placements={(f"blocks.{b}", 0, i): Placement.RECOMPUTE for b in range(3) for i in big},
                default=Placement.KEEP,
            )
        )
        partial = _backward_flops(m, idx)
    assert partial == plain
    assert rt.report().steps[-1].rerun_ops == 6  # two layer norms per block


def test_partial_plans_keep_gradients_bitwise() -> None:
    model, idx = _gpt()
    ref = twin(model)
    ref(idx).backward()
    m = twin(model)
    with offrecomp.runtime(m, mode="auto", min_bytes=0) as rt:
        m(idx).backward()
        m.zero_grad(set_to_none=True)
        n = len(rt.planner.entries[next(iter(rt.planner.entries))].structures[("blocks.0", 0)].storage_records)
        for start in range(1, 4):
            rt.set_plan(
                Plan(
                    placements={(f"blocks.{b}", 0, i): Placement.RECOMPUTE for b in range(3) for i in range(start, n, 3)},
                    default=Placement.KEEP,
                )
            )
            m(idx).backward()
            for (name, p), q in zip(ref.named_parameters(), m.parameters()):
                assert torch.equal(p.grad, q.grad), (start, name)
            m.zero_grad(set_to_none=True)


class Flaky(nn.Module):
    """Its forward depends on a Python flag that changes between forward and backward."""

    flag = True

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.lin(x))  # saved by tanh's backward: replay can serve it
        y = h * (1.0 if Flaky.flag else 2.0)
        return y.sin()


def _flaky_model() -> nn.Module:
    return nn.Sequential(Flaky(), Flaky())


@pytest.mark.parametrize("mode", ["auto", "verify"])
def test_nondeterministic_region_is_detected(mode: str) -> None:
    torch.manual_seed(0)
    m = _flaky_model()
    x = torch.randn(4, 16, requires_grad=True)
    kw = {"mode": "auto"} if mode == "auto" else {"mode": "recompute", "verify": True}
    with offrecomp.runtime(m, min_bytes=0, **kw) as rt:
        Flaky.flag = True
        m(x).sum().backward()  # measuring pass (auto) / a normal step
        if mode == "auto":
            # drop only what the scaling produced: replay serves the matmul and reruns the
            # scaling, where the op check sees the other factor
            entry = next(iter(rt.planner.entries.values()))
            drop = {}
            for (name, ci), st in entry.structures.items():
                for i, rec in enumerate(st.storage_records):
                    if rec.producer_op >= 0 and "mul" in st.op_names[rec.producer_op]:
                        drop[(name, ci, i)] = Placement.RECOMPUTE
            assert drop
            rt.set_plan(Plan(placements=drop, default=Placement.KEEP))
        else:
            rt.set_plan(Plan(default=Placement.RECOMPUTE))  # drop everything from now on
        Flaky.flag = True
        loss = m(x).sum()
        Flaky.flag = False
        try:
            # backward replays the last region first, and it diverges first
            error = offrecomp.ReplayDivergedError if mode == "auto" else offrecomp.ReplayMismatchError
            said = r"replay of region '1'.*state the region reads changed .*not a deterministic function"
            with pytest.raises(error, match=said):
                loss.backward()
        finally:
            Flaky.flag = True


class _Processed(nn.Module):
    """Applies a processor it finds on a config object it holds (two steps from the
    module: a replay does not restore it, NOTE [Attributes at entry]); the two
    processors save results of other shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.cfg: Any = types.SimpleNamespace(processor=torch.tanh)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.cfg.processor(self.fc(x))


def _split_tanh(h: torch.Tensor) -> torch.Tensor:
    return torch.tanh(h.unflatten(-1, (2, 8))).flatten(-2)


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_state_switched_before_the_backward_is_named_beside_nondeterminism(mode: str) -> None:
    """A processor swapped between a forward and its backward: the replay runs the new
    one, which saves other shapes. The error names both causes (state changed between
    the forward and its backward, or a forward that is not deterministic), the Known
    limits and OFFRECOMP_VERIFY, not a nondeterministic forward alone."""
    torch.manual_seed(0)
    m = nn.Sequential(_Processed(), _Processed())
    x = torch.randn(4, 16)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, budget=1 if mode == "auto" else None)
    with rt, pytest.raises(RuntimeError) as err:
        for _ in range(4):  # auto: measure, calibrate, planned
            for blk in m:
                blk.cfg.processor = torch.tanh
            loss = m(x).square().sum()
            for blk in m:
                blk.cfg.processor = _split_tanh
            loss.backward()
    said = str(err.value)
    assert "state the region reads changed between its forward and its backward" in said, said
    assert "not a deterministic function of its inputs" in said and "an attention processor" in said
    assert "OFFRECOMP_VERIFY=1" in said and "docs/reliability.md, Known limits" in said


class _OwnProcessor(nn.Module):
    """Holds its processor in a plain attribute, as diffusers' attention layers do
    (``set_attn_processor``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.processor: Any = torch.tanh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.processor(self.fc(x))


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_processor_attribute_swapped_before_the_backward_replays_as_read(mode: str) -> None:
    """NOTE [Attributes at entry]: the replay runs the processor the forward ran."""
    torch.manual_seed(0)
    m = nn.Sequential(_OwnProcessor(), _OwnProcessor())
    ref = twin(m)

    def step(model: nn.Module, i: int) -> list[torch.Tensor]:
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(i))
        for blk in model:
            blk.processor = torch.tanh
        loss = model(x).square().sum()
        for blk in model:
            blk.processor = _split_tanh
        model.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    with offrecomp.runtime(m, mode=mode, min_bytes=0, budget=1 if mode == "auto" else None) as rt:
        got = [step(m, i) for i in range(4)]
    want = [step(ref, i) for i in range(4)]
    assert all(torch.equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))
    assert sum(s.replays for s in rt.report().steps) > 0


class _Overflows(nn.Module):
    """Saves tensors holding NaN, +inf and -inf (an overflowing fp16 step)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h = torch.where(h > 1.5, float("inf"), torch.where(h < -1.5, float("-inf"), h))
        return torch.nan_to_num(torch.sigmoid(h) * h, nan=0.0, posinf=1.0)


def test_verify_takes_saves_with_non_finite_values_for_what_they_are() -> None:
    """OFFRECOMP_VERIFY: a save holding NaN, or both infinities, fingerprinted NaN, which
    equals nothing: every replay of it raised ReplayMismatchError. Non-finite values are
    counted, by position, apart from the finite ones: the replay passes, and a NaN moved
    to another position still shows."""
    from offrecomp.verify import fingerprint

    torch.manual_seed(0)
    m = nn.Sequential(*[_Overflows() for _ in range(3)])
    ref = copy.deepcopy(m)
    x = torch.randn(4, 8) * 3
    ref(x).sum().backward()
    with offrecomp.runtime(m, mode="recompute", min_bytes=0, verify=True) as rt:
        m(x).sum().backward()
    assert rt.report().steps[-1].replays == 3
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), m.parameters()))  # type: ignore[arg-type]
    a, b = torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([float("nan"), 1.0, 2.0])
    assert torch.equal(fingerprint(a), fingerprint(a.clone())) and not torch.equal(fingerprint(a), fingerprint(b))


class SavesLess(nn.Module):
    """Its second exp (and the save it makes) depends on a flag that changes between
    forward and backward."""

    flag = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        return y.exp() if SavesLess.flag else y


def test_a_replay_that_saves_less_than_its_forward_is_an_error() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(SavesLess(), SavesLess())
    x = torch.randn(4, 16, requires_grad=True)
    with offrecomp.runtime(m, min_bytes=0, mode="recompute"):
        m(x).sum().backward()
        loss = m(x).sum()
        SavesLess.flag = False
        try:
            with pytest.raises(
                offrecomp.ReplayDivergedError,
                match=r"replay of region '1' \(call 0\) saved 1 tensors but the forward saved at least 2",
            ):
                loss.backward()
        finally:
            SavesLess.flag = True


@pytest.mark.parametrize("mode", ["keep", "recompute", "offload"])
def test_inplace_after_save_is_an_error(mode: str) -> None:
    class Exp(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.exp(x * 1.0)  # exp saves its result

    m = nn.Sequential(Exp(), Exp())
    x = torch.randn(64, 64, requires_grad=True)
    with offrecomp.runtime(m, mode=mode, min_bytes=0):
        y = m(x)
        with torch.no_grad():
            y.add_(1.0)  # modifies the tensor exp saved in region '1'
        # autograd's own wording (code matches on it), then where it happened
        with pytest.raises(RuntimeError, match=r"^one of the variables needed for gradient computation "
                           r"has been modified by an inplace operation: offrecomp: .* region '1'"):
            y.sum().backward()


@pytest.mark.parametrize("mode", ["keep", "recompute", "offload", "auto"])
def test_saved_input_detached_in_place_is_an_error(mode: str) -> None:
    """autograd and torch.utils.checkpoint refuse a saved tensor detached in place."""

    class Mul(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * x.sum()  # saves x

    def run() -> None:
        m = nn.Sequential(nn.Linear(8, 8), Mul(), Mul())
        with offrecomp.runtime(m, mode=mode, min_bytes=0):
            h = m[0](torch.randn(4, 8))
            y = m[2](m[1](h))
            h.detach_()
            y.sum().backward()

    with pytest.raises(RuntimeError, match="Trying to use a saved tensor that has been detached in-place"):
        plain = nn.Sequential(nn.Linear(8, 8), Mul())
        h = plain[0](torch.randn(4, 8))
        y = plain[1](h)
        h.detach_()
        y.sum().backward()
    with pytest.raises(RuntimeError, match="Trying to use a saved tensor that has been detached in-place"):
        run()


def test_region_input_modified_after_region_is_an_error() -> None:
    class Lin(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(x))

    m = nn.ModuleList([Lin(), Lin()])
    x = torch.randn(8, 32)
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        h = x.clone().requires_grad_(False)
        h2 = m[0](h)
        out = m[1](h2 * 1.0)
        h.mul_(2.0)  # the input the first region holds for its replay
        with pytest.raises(RuntimeError, match="input 0 of region '0' was modified in place"):
            (out.sum() + h2.sum()).backward()


def test_plain_replay_when_the_dispatch_mode_would_cost_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Serving overhead]: when the skipped ops are cheaper than the mode's per-op
    cost, replay runs plainly; results are the same, only fewer ops are skipped."""
    monkeypatch.setenv("OFFRECOMP_REPLAY_OP_US", "1e6")  # one second per op: never pays
    model, idx = _gpt()
    ref = twin(model)
    ref(idx).backward()
    m = twin(model)
    with offrecomp.runtime(m, mode="auto", min_bytes=0) as rt:
        m(idx).backward()
        m.zero_grad(set_to_none=True)
        gelu = _storage_of(rt, "blocks.1", "gelu")
        rt.set_plan(Plan(placements={(f"blocks.{b}", 0, gelu[0]): Placement.RECOMPUTE for b in range(3)}))
        m(idx).backward()
    last = rt.report().steps[-1]
    assert last.replays == 3 and last.served_ops == 0  # plain replays
    for (n, p), q in zip(ref.named_parameters(), m.parameters()):
        assert torch.equal(p.grad, q.grad), n


class _Branchy(nn.Module):
    def __init__(self, branch: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.branch = branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.lin(x))
        if self.branch and y.sum() > 0:  # the value reaches Python
            y = y * 2
        return y.sin()


@pytest.mark.parametrize("branch", [True, False])
def test_a_region_that_branches_on_data_replays_plainly(branch: bool) -> None:
    """NOTE [Which ops replay runs]: an op that hands Python a data-dependent value makes
    the region opaque (plain replays that follow each pass's own branches)."""
    m = nn.Sequential(_Branchy(branch), _Branchy(branch))
    with offrecomp.runtime(m, mode="auto", min_bytes=0) as rt:
        m(torch.randn(4, 8)).sum().backward()
    entry = rt.planner.last_entry
    assert entry is not None and entry.profile is not None
    assert [r.opaque for r in entry.profile.regions] == [branch, branch]


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_functional_call_replays_with_the_weights_of_its_forward(mode: str) -> None:
    """NOTE [Replay and parameters]: meta-learning's fast weights fill the parameter slots
    for one functional_call only; backward replays the blocks after they are gone, and
    must replay with them, not with the module's own weights."""
    from torch.func import functional_call

    torch.manual_seed(0)
    model, idx = models.GPT(layers=3, h=32, heads=4, p=0.1), torch.randint(0, 64, (2, 32))
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}

    def meta_grads() -> list[torch.Tensor]:
        torch.manual_seed(1)  # dropout: the CPU's fused attention has no double backward
        inner = functional_call(model, params, (idx,))
        g = torch.autograd.grad(inner, list(params.values()), create_graph=True)
        fast = {k: v - 0.5 * gi for (k, v), gi in zip(params.items(), g)}
        outer = functional_call(model, fast, (idx,))
        return list(torch.autograd.grad(outer, list(params.values())))

    ref = meta_grads()
    own = dict(model.named_parameters())
    rt = offrecomp.runtime(model, mode=mode, min_bytes=0, budget=1 if mode == "auto" else None)
    with rt:
        for _ in range(3):  # auto: measure, calibrate, planned
            got = meta_grads()
            for a, b in zip(ref, got):
                assert torch.equal(a, b)
    assert rt.report().steps[-1].replays > 0
    assert dict(model.named_parameters()) == own  # the slots hold the module's own again


class _Rebound(nn.Module):
    """Reads its bias through an add, which saves nothing of it: what plain autograd
    holds of the forward does not change when the bias is rebound through ``.data``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.b = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x) + self.b)


def _relaid(t: torch.Tensor, scale: float, column_major: bool) -> torch.Tensor:
    """A new storage holding ``t * scale``, row- or column-major."""
    return (t.t() * scale).contiguous().t() if column_major else (t * scale).contiguous()


@pytest.mark.parametrize("when", ["before_backward", "between_steps", "both"])
@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_parameter_rebound_through_data_replays_with_the_values_its_forward_read(mode: str, when: str) -> None:
    """NOTE [Replay and parameters]: ``param.data = other`` keeps the Parameter and its
    version and replaces its storage; between a forward and its backward the replay
    reads the storage the forward read, with the strides it had (plain's gradients,
    where reading the slot gave others silently), and the parameter holds the new
    values after. Between steps (a legal pattern) the next forward reads the new values
    and strides, as plain's does, and a replay after another rebinding reads those."""

    def run(m: nn.Module, rt: offrecomp.Runtime | None) -> list[list[torch.Tensor]]:
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            for s in range(4):  # auto: measure, calibrate, planned
                x = torch.randn(8, 8, generator=torch.Generator().manual_seed(s))
                loss = m(x).pow(2).sum()
                if when != "between_steps":
                    for blk in m:
                        blk.fc.bias.data = blk.fc.bias.data + 1.0
                        blk.b.data = _relaid(blk.b.data, 2.0, blk.b.stride(0) == 8)  # the other layout
                loss.backward()
                out.append([p.grad.clone() for p in m.parameters()])
                m.zero_grad()
                if when != "before_backward":
                    for blk in m:
                        blk.fc.bias.data = blk.fc.bias.data - 0.5
                        blk.b.data = _relaid(blk.b.data, 0.5, s % 2 == 0)  # column-major in odd steps
        return out

    torch.manual_seed(0)
    m = nn.Sequential(_Rebound(), _Rebound())
    ref_m = copy.deepcopy(m)
    ref = run(ref_m, None)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, budget=1 if mode == "auto" else None)
    got = run(m, rt)
    for a, b in zip(ref, got):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert rt.report().steps[-1].replays > 0
    for p, q in zip(ref_m.parameters(), m.parameters()):  # the new values, in the module's own
        assert torch.equal(p, q) and p.stride() == q.stride()


def test_a_parameter_written_in_place_and_rebound_stops_a_replay_reading_it() -> None:
    """NOTE [Replay and parameters]: written in place before ``.data =`` replaced it, the
    storage the forward read no longer holds its values: the replay reading it raises,
    naming it, as for a parameter written in place alone."""
    torch.manual_seed(0)
    m = nn.Sequential(_Rebound(), _Rebound())
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        loss = m(torch.randn(8, 8)).pow(2).sum()
        with torch.no_grad():
            m[0].b.add_(1.0)
        m[0].b.data = m[0].b.data.clone()
        with pytest.raises(RuntimeError, match=r"parameter 'b' of _Rebound \(version \d+ -> \d+\) in region '0' was modified"):
            loss.backward()


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x) * self.scale)


@pytest.mark.parametrize("how", ["functional_call", "slot_set", "deepcopy"])
@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_replay_reads_the_buffer_its_forward_read(mode: str, how: str) -> None:
    """NOTE [Replay and buffer slots]: a buffer slot that held another tensor for the
    forward only (functional_call's buffers, or a fast-weight library setting
    ``_buffers``) holds the module's own again when backward replays the block: the
    replay reads the forward's tensor, so gradients are plain's, and no write is
    reported where none was made (a deep copy's buffers start at version 1)."""
    from torch.func import functional_call

    def build() -> nn.Module:
        torch.manual_seed(0)
        m = nn.Sequential(_Scaled(), _Scaled())
        return copy.deepcopy(m) if how == "deepcopy" else m

    def steps(m: nn.Module) -> list[list[torch.Tensor]]:
        out = []
        for s in range(3):  # auto: measure, calibrate, planned
            g = torch.Generator().manual_seed(100 + s)
            x = torch.randn(4, 8, generator=g)
            bufs = {f"{j}.scale": torch.rand(8, generator=g) + 0.5 for j in range(2)}
            if how == "slot_set":
                own = [blk._buffers["scale"] for blk in m]
                for j, blk in enumerate(m):
                    blk._buffers["scale"] = bufs[f"{j}.scale"]
                loss = m(x).pow(2).mean()
                for blk, b in zip(m, own):
                    blk._buffers["scale"] = b
            else:
                loss = functional_call(m, bufs, (x,)).pow(2).mean()
            loss.backward()
            out.append([p.grad.clone() for p in m.parameters()])
            m.zero_grad()
        return out

    ref = steps(build())
    m = build()
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, budget=1 if mode == "auto" else None)
    with rt:
        got = steps(m)
    for a, b in zip(ref, got):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert rt.report().steps[-1].replays > 0
    assert all(torch.equal(blk.scale, torch.ones(8)) for blk in m)  # the module's own, as they were


@pytest.mark.parametrize("kind", ["parameter", "buffer", "small buffer"])
def test_a_parameter_or_buffer_modified_before_its_replay_reads_it(kind: str) -> None:
    """The forward read it and left it as it was; written after the forward, a replay
    reading it would differ from the forward (a buffer: an average a hook updates in
    backward). A small buffer's values at the forward are kept, and the replay reads
    them (NOTE [Buffers written unseen]): plain's gradients. A parameter or a larger
    buffer stops the replay with an error naming it."""
    width = 16 if kind != "buffer" else READ_SNAPSHOT_MAX_BYTES // 4 + 1

    class Biased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if kind == "parameter":
                self.b = nn.Parameter(torch.zeros(width))
            else:
                self.register_buffer("b", torch.zeros(width))
            self.w = nn.Parameter(torch.randn(width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + self.b) * self.w  # the relu mask depends on b

    def grads(m: nn.Module, rt: offrecomp.Runtime | None) -> list[torch.Tensor]:
        with rt if rt is not None else contextlib.nullcontext():
            loss = m(torch.randn(4, width, generator=torch.Generator().manual_seed(1))).square().sum()
            with torch.no_grad():
                m[0].b.add_(1.0)  # plain autograd still uses the forward's relu mask
            loss.backward()
        return [blk.w.grad for blk in m]  # type: ignore[misc]

    torch.manual_seed(0)
    m = nn.Sequential(Biased(), Biased())
    ref = grads(copy.deepcopy(m), None)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    if kind == "small buffer":
        assert all(torch.equal(a, b) for a, b in zip(ref, grads(m, rt)))
        return
    name = "parameter" if kind == "parameter" else "buffer"
    with pytest.raises(RuntimeError, match=rf"{name} 'b' of Biased .* in region '0' was modified in place"):
        grads(m, rt)


class _Shifted(nn.Module):
    """Reads its bias through an add, which saves nothing of it: plain autograd accepts
    the bias stepped between the forward and the backward, and keeps the forward's mask."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.randn(16))
        self.w = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b) * self.w


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_fused_optimizer_step_before_the_backward_stops_a_replay_reading_what_it_stepped(device: str) -> None:
    """NOTE [Steps before the backward]: a fused step writes the parameters in its
    kernels, moving no version, so the replay's version check alone would recompute with
    the new bias (other gradients, silently). The step hook marks what the optimizer
    holds: the replay that reads it raises, naming it. An optimizer over another model
    stepping there changes nothing of the runtime's."""
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(device)

    def grads(m: nn.Module, rt: offrecomp.Runtime | None, opt_of: nn.Module) -> list[torch.Tensor]:
        opt = torch.optim.SGD(opt_of.parameters(), lr=0.5, fused=True)
        with rt if rt is not None else contextlib.nullcontext():
            m(x).square().sum().backward()
            if opt_of is not m:
                opt_of(x).sum().backward()
            loss = m(x).square().sum()
            opt.step()
            loss.backward()
        return [q.grad for q in m.parameters()]  # type: ignore[misc]

    torch.manual_seed(0)
    m = nn.Sequential(_Shifted(), _Shifted()).to(device)
    other = nn.Sequential(_Shifted()).to(device)
    ref = grads(copy.deepcopy(m), None, copy.deepcopy(other))
    got = grads(m, offrecomp.runtime(m, mode="recompute", min_bytes=0), other)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    m2 = copy.deepcopy(m)
    with pytest.raises(RuntimeError, match=r"parameter 'b' of _Shifted \(stepped by an optimizer whose kernels "
                       r"move no version, such as a fused one\) in region '\d' was modified in place"):
        grads(m2, offrecomp.runtime(m2, mode="recompute", min_bytes=0), m2)


@pytest.mark.parametrize("fused", [False, True])
def test_an_optimizer_step_skipping_every_parameter_before_the_backward_stops_no_replay(fused: bool) -> None:
    """NOTE [Steps before the backward]: a step while no parameter has a gradient (the
    first step's ``opt.step()`` moved above its backward) changes nothing, and plain
    autograd runs; the hook marks only parameters with a gradient, so no replay raises."""
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))

    def grads(m: nn.Module, rt: offrecomp.Runtime | None) -> list[torch.Tensor]:
        opt = torch.optim.SGD(m.parameters(), lr=0.5, fused=fused)
        with rt if rt is not None else contextlib.nullcontext():
            loss = m(x).square().sum()
            opt.step()
            loss.backward()
        return [q.grad for q in m.parameters()]  # type: ignore[misc]

    torch.manual_seed(0)
    m = nn.Sequential(_Shifted(), _Shifted())
    ref = grads(copy.deepcopy(m), None)
    got = grads(m, offrecomp.runtime(m, mode="recompute", min_bytes=0))
    assert all(torch.equal(a, b) for a, b in zip(ref, got))


def test_a_fused_step_before_a_backward_of_a_pass_another_forward_ended_stops_its_replay() -> None:
    """NOTE [Steps before the backward]: two forwards, one backward, a forward whose graph
    is dropped (a metric: it ends the first pass), a fused step, the second backward. The
    step marks the calls of every pass a backward may still reach, not only the running
    one's: the second loss's replays raise, where they recomputed with the stepped bias."""
    x = [torch.randn(4, 16, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    torch.manual_seed(0)
    m = nn.Sequential(_Shifted(), _Shifted())
    opt = torch.optim.SGD(m.parameters(), lr=0.5, fused=True)
    for q in m.parameters():
        q.grad = torch.ones_like(q)
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        la = m(x[0]).square().sum()
        lb = m(x[1]).square().sum()
        la.backward()
        m(x[2])
        opt.step()
        with pytest.raises(RuntimeError, match=r"parameter 'b' of _Shifted \(stepped by an optimizer"):
            lb.backward()


class _Freezing(nn.Module):
    """Detaches one of its parameters in place in its forward (compressive-transformer's
    attention does ``to_kv.weight.detach_()``): from then on it requires no grad."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        self.a.weight.detach_()
        return x + torch.tanh(self.b(h))


@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve"])
def test_a_parameter_detached_in_place_by_its_forward_stays_detached_after_a_replay(variant: str) -> None:
    """The replay runs with the parameter's requires_grad of the forward's entry and sets
    it back to what it was before the replay, not toggled: toggled, the replay's own
    detach_() left it requiring grad, and a gradient plain training never makes."""
    torch.manual_seed(0)
    check_variant(models.stack(_Freezing)(), lambda s: torch.randn(4, 16, generator=torch.Generator().manual_seed(s)), variant)


@pytest.mark.parametrize(("channels", "deferred"), [(8, False), (20000, False), (20000, True)])
def test_batchnorm_statistics_updated_between_an_eval_forward_and_its_backward(
    channels: int, deferred: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [Buffers written unseen]: an eval forward with grad, then a train forward
    (the CPU BatchNorm kernel updates the running statistics without moving their
    version), then one backward of both: the eval call's replay reads the statistics it
    read, so gradients and statistics are plain's. 20,000 channels: statistics over
    READ_SNAPSHOT_MAX_BYTES, whose copy the eval call lets go at its exit (it took the
    train call's, which found the write). ``deferred``: the exits' comparisons are read
    later, and not back before the replays (a GPU that lags the host), as the CUDA
    path does (NOTE [Buffer comparisons])."""
    if deferred:
        from offrecomp import buffers

        monkeypatch.setattr(buffers, "compares_later", lambda device: True)
        monkeypatch.setattr(buffers.PendingCompare, "ready", lambda self: False)

    class ScaleNormBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.linspace(0.5, 1.5, channels))
            self.bn = nn.BatchNorm1d(channels)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.relu(self.bn(x * self.scale))

    def step(m: nn.Module, s: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(s)
        x1, x2 = torch.randn(4, channels, generator=g), torch.randn(4, channels, generator=g)
        m.eval()
        l1 = m(x1).square().mean()
        m.train()
        l2 = m(x2).square().mean()
        (l1 + l2).backward()
        out = [p.grad.clone() for p in m.parameters()] + [b.clone() for b in m.buffers()]  # type: ignore[union-attr]
        m.zero_grad()
        return out

    torch.manual_seed(0)
    base = nn.Sequential(*[ScaleNormBlock() for _ in range(3)])
    ref_m = copy.deepcopy(base)
    ref = [step(ref_m, s) for s in range(3)]
    for mode in ("recompute", "auto"):
        m = copy.deepcopy(base)
        with offrecomp.runtime(m, mode=mode, min_bytes=0, budget=1 if mode == "auto" else None):
            got = [step(m, s) for s in range(3)]
        for a, b in zip(ref, got):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), mode


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_batchnorm_statistics_a_no_grad_train_forward_updates_before_the_backward(mode: str) -> None:
    """NOTE [Buffers written unseen]: an eval forward with grad, a train-mode forward under
    ``no_grad`` (pseudo-labels), then the first one's backward: the forward under
    ``no_grad`` is no call of the runtime's, and the eval call's replay read the
    statistics it wrote (over 64 KiB: no copy of its own)."""
    channels = 20000

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.linspace(0.5, 1.5, channels))
            self.bn = nn.BatchNorm1d(channels)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tanh(self.bn(x * self.w))

    def step(m: nn.Module, s: int) -> list[torch.Tensor]:
        x = torch.randn(8, channels, generator=torch.Generator().manual_seed(s))
        m.eval()
        loss = m(x * 0.5).square().mean()
        m.train()
        with torch.no_grad():
            m(x)
        loss.backward()
        out = [p.grad.clone() for p in m.parameters()] + [b.clone() for b in m.buffers()]  # type: ignore[union-attr]
        m.zero_grad()
        return out

    torch.manual_seed(0)
    base = nn.Sequential(Block(), Block())
    ref_m = copy.deepcopy(base)
    ref = [step(ref_m, s) for s in range(3)]
    m = copy.deepcopy(base)
    with offrecomp.runtime(m, mode=mode, min_bytes=0, budget=1 if mode == "auto" else None):
        got = [step(m, s) for s in range(3)]
    for a, b in zip(ref, got):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), mode


def test_an_evaluation_under_no_grad_after_the_steps_copies_no_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The calls that read the statistics were released with their backward: an
    evaluation under ``no_grad`` has no reader to copy them for."""
    from offrecomp import buffers, install

    channels = 20000
    copies: list[int] = []

    def counted(slots: Any) -> Any:
        out = buffers.watch_writes(slots)
        copies.append(len(out))
        return out

    monkeypatch.setattr(install, "watch_writes", counted)
    m = nn.Sequential(nn.BatchNorm1d(channels), nn.BatchNorm1d(channels))
    with offrecomp.runtime(m, mode="recompute", min_bytes=0, regions=[nn.BatchNorm1d]):
        for s in range(3):
            x = torch.randn(8, channels, generator=torch.Generator().manual_seed(s), requires_grad=True)
            m.eval()
            m(x).square().mean().backward()
            with torch.no_grad():
                m(x)
    assert copies and not any(copies), copies


class WritesItsInput(nn.Module):
    """An in-place activation on its input first thing: legal for autograd, since nothing
    saved the input, but a replay from the input would start from the written values."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.leaky_relu_(x, 0.1)
        return x + self.fc(torch.tanh(self.ln(x)))


class RunningMeanInAParameter(nn.Module):
    """Keeps a running mean in a frozen parameter (as some VQ codebooks do), updated in
    place in its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.mean = nn.Parameter(torch.zeros(32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.mean.mul_(0.9).add_(0.1 * x.mean((0, 1)))
        return x + torch.tanh(self.fc(x - self.mean))


class RenormsThroughData(nn.Module):
    """Scales its trained weight through ``.data`` in its forward (as efficient-kan's grid
    update writes its spline weights): a write that moves no version counter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc.weight.data.mul_(0.99)
        return x + torch.tanh(self.fc(x))


@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
@pytest.mark.parametrize(
    ("block", "what"),
    [
        (WritesItsInput, "writes its own inputs"),
        (RunningMeanInAParameter, "writes its parameters"),
        (RenormsThroughData, "writes its parameters"),
    ],
    ids=["input", "parameter", "parameter_data"],
)
def test_a_region_that_writes_its_state_replays_from_a_copy_then_keeps(
    block: type[nn.Module], what: str, variant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """NOTE [State written by its region]: the first call of each region copies an input
    or a parameter just before its forward writes it, so that call replays right (a
    replay must not start from the written input, or read the written parameter and
    write it again); from then on the region's activations are kept (or offloaded) and one
    warning says why."""
    offrecomp.diagnostics.clear_warnings()
    torch.manual_seed(0)
    base = models.Stack([block() for _ in range(3)])
    batch = lambda s: torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(s))  # noqa: E731
    ref = train(twin(base), batch, steps=4)
    budget = tight_budget(base, batch) if variant == "auto_serve" else None
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = train_bitwise(twin(base), batch, variant, budget, ref, steps=4)
    steps = rt.report().steps
    assert steps[0].replays == 3  # every first call, from its copy
    assert all(s.replays == 0 and s.recomputed_bytes == 0 for s in steps[1:])
    warned = [r.getMessage() for r in caplog.records if what in r.getMessage()]
    assert len(warned) == 1 and "'blocks.0'" in warned[0]
    if variant == "auto_serve":
        assert "writes in place state a replay would write again (its inputs, its parameters or a tensor from outside it): never recomputed" in rt.explain()


def test_the_state_warning_comes_once_per_kind_of_block(caplog: pytest.LogCaptureFixture) -> None:
    """One warning for a model's blocks that are alike; another model trained later in
    the same process, whose blocks are of another kind, gets its own (a process-wide
    "once" had silenced it)."""
    offrecomp.diagnostics.clear_warnings()
    batch = lambda s: torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(s))  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        for block in (WritesItsInput, RunningMeanInAParameter, WritesItsInput):
            torch.manual_seed(0)
            m = models.Stack([block() for _ in range(3)])
            train(m, batch, offrecomp.runtime(m, mode="recompute", min_bytes=0), steps=2)
    warned = [r.getMessage() for r in caplog.records if "in place in its forward" in r.getMessage()]
    assert len(warned) == 2, warned
    assert "its own inputs" in warned[0] and "its parameters" in warned[1]


class NoisyBlock(nn.Module):
    """Draws from a generator of its own (not the global RNG) twice: first noise no op
    saves (a serving replay need not run it), then a scale an op saves."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.gen = torch.Generator().manual_seed(7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(x.shape, generator=self.gen)
        h = torch.tanh(self.fc(x))
        return x + 0.1 * noise + h * torch.rand(x.shape, generator=self.gen)


class PoissonBlock(nn.Module):
    """Draws from its own generator through ``poisson``, which takes it by position."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.gen = torch.Generator().manual_seed(7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        counts = torch.poisson(torch.full(x.shape, 2.0), self.gen)
        return x + torch.tanh(self.fc(x)) * counts


@pytest.mark.parametrize("block", [NoisyBlock, PoissonBlock])
@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
def test_a_region_drawing_from_its_own_generator_replays_the_same_draws(variant: str, block: type) -> None:
    """NOTE [Private generators]: the replay sets the block's generator to its state at
    entry, as it does the global RNG, whether an op takes it by keyword or by position;
    a serving replay runs every draw from it (skipping one would shift the next)."""
    torch.manual_seed(0)
    base = models.Stack([block() for _ in range(3)])
    batch = lambda s: torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(s))  # noqa: E731
    # PoissonBlock: the half-keep plan drops each call whole, leaving nothing held to serve from
    check_variant(base, batch, variant, serves=block is NoisyBlock)


class LateNoise(nn.Module):
    """Draws from a generator one step from its attributes (a config's, a list's item)
    only once noise is turned on, after its first call."""

    def __init__(self, holder: str) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        gen = torch.Generator().manual_seed(7)
        self.cfg = types.SimpleNamespace(gen=gen) if holder == "config" else None
        self.gens = [gen] if holder == "list" else []
        self.noisy = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.noisy:
            gen = self.cfg.gen if self.cfg is not None else self.gens[0]
            x = x + torch.randn(x.shape, generator=gen)
        return x + torch.tanh(self.fc(x))


@pytest.mark.parametrize("holder", ["config", "list"])
def test_a_generator_one_step_from_an_attribute_first_drawn_later_replays_the_same_draws(holder: str) -> None:
    """NOTE [Private generators]: a generator in a config or a list, which the first call
    did not draw from, is captured at entry as one held as an attribute is; uncaptured,
    replays would draw new noise from it, silently."""

    def run(m: nn.Module, rt: offrecomp.Runtime | None) -> list[torch.Tensor]:
        grads = []
        with rt if rt is not None else contextlib.nullcontext():
            for step in range(3):
                for b in m.blocks:
                    b.noisy = step >= 1
                m(torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(step))).backward()
                grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
                m.zero_grad()
        return grads

    torch.manual_seed(0)
    base = models.Stack([LateNoise(holder) for _ in range(3)])
    plain, m = twin(base), twin(base)
    assert all(torch.equal(a, b) for a, b in zip(run(plain, None), run(m, offrecomp.runtime(m, mode="recompute", min_bytes=0))))


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_replay_runs_in_the_train_mode_of_its_forward(mode: str) -> None:
    """A ``model.eval()`` between forward and backward (an evaluation forward for
    logging): the replay still runs in training mode, dropout included; in eval mode it
    would diverge (or, with a branch on ``self.training`` that saves the same tensors,
    compute other values)."""

    def step(m: nn.Module) -> list[torch.Tensor]:
        torch.manual_seed(5)
        loss = m(idx)
        m.eval()
        with torch.no_grad():
            m(idx)
        loss.backward()
        m.train()
        return [p.grad.clone() for p in m.parameters()]

    torch.manual_seed(0)
    base, idx = models.GPT(layers=3, h=32, heads=4, p=0.1), torch.randint(0, 64, (2, 32))
    ref = step(twin(base))
    m = twin(base)
    with offrecomp.runtime(m, mode=mode, min_bytes=0) as rt:
        got = step(m)
    assert rt.report().steps[-1].replays > 0
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


class _FilledSaveBlock(nn.Module):
    """Its last save is ``rrelu_with_noise``'s ``noise``: an input autograd saves before
    the op's kernel fills it (``F.rrelu`` makes it with ``empty_like``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.RReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve"])
def test_a_replay_stops_after_the_op_that_made_the_last_needed_save(variant: str) -> None:
    """NOTE [Replay], step 5: stopped inside the pack of the last needed save, the replay
    would hand back ``noise`` before rrelu's kernel wrote it (uninitialised memory)."""
    torch.manual_seed(0)
    check_variant(
        models.stack(_FilledSaveBlock)(), lambda s: torch.randn(4, 8, generator=torch.Generator().manual_seed(s)), variant,
        serves=True,
    )


class _HostReadBlock(nn.Module):
    """Branches on a value read through ``.tolist()`` or ``np.asarray``: no ATen op hands
    it to Python, unlike ``.item()``."""

    def __init__(self, read: str) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.read = read

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        m = h.mean().reshape(1)
        v = float(m.tolist()[0]) if self.read == "tolist" else float(np.asarray(m.detach())[0])
        return x + (torch.tanh(self.b(h)) if v > 0 else torch.sigmoid(self.b(h))) * v


@pytest.mark.parametrize("read", ["tolist", "numpy"])
def test_a_region_reading_values_without_an_op_is_replayed_plainly(read: str) -> None:
    """NOTE [Which ops replay runs]: under the dispatch mode a replay would hand that read
    a placeholder's garbage, and the branch it picks may be the recorded one and not this
    pass's, which no divergence check sees."""
    torch.manual_seed(0)
    model = models.Stack([_HostReadBlock(read) for _ in range(3)])
    rt, _ = check_variant(  # opaque recordings: every replay runs plainly, serving nothing
        model, lambda s: torch.randn(4, 16, generator=torch.Generator().manual_seed(s)), "auto_serve", steps=6,
        serves=False,
    )
    entry = next(iter(rt.planner.entries.values()))
    assert entry.structures and all(st.opaque for st in entry.structures.values())
    assert "tolist" not in vars(torch.Tensor) and "numpy" not in vars(torch.Tensor)  # NOTE [Host reads]


def test_host_read_watch_ends_with_a_recorded_forward_that_raised() -> None:
    def boom(module: nn.Module, args: Any, out: Any) -> None:
        assert "tolist" in vars(torch.Tensor)  # the measuring pass's recorder watches
        raise ValueError("boom")  # inside the region's call, after its host read

    m = models.Stack([_HostReadBlock("tolist") for _ in range(2)])
    m.blocks[1].b.register_forward_hook(boom)
    with offrecomp.runtime(m, mode="auto"), pytest.raises(ValueError, match="boom"):
        m(torch.randn(2, 16))
    assert "tolist" not in vars(torch.Tensor) and "numpy" not in vars(torch.Tensor)
    assert torch.tensor([1.5]).tolist() == [1.5]


class _Tagged(torch.Tensor):
    """A tensor subclass with only ``__torch_function__`` (a tagged activation)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return super().__torch_function__(func, types, args, kwargs or {})


class _TanhGelu(torch.Tensor):
    """A subclass whose override changes what a block computes: gelu's tanh form."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.nn.functional.gelu:
            kwargs["approximate"] = "tanh"
        return super().__torch_function__(func, types, args, kwargs)


class _TanhGeluMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.nn.functional.gelu:
            kwargs["approximate"] = "tanh"
        return func(*args, **kwargs)


class _GeluBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class _SubclassModel(nn.Module):
    """Blocks run on ``kind`` of activations: a subclass (the loss a plain tensor, or the
    subclass as well), or plain tensors under a function mode around the forward only."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.blocks = nn.ModuleList(_GeluBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "mode":
            with _TanhGeluMode():
                return self._blocks(x).square().mean()
        x = x.as_subclass(_Tagged if self.kind == "tagged" else _TanhGelu)
        out = self._blocks(x)
        return (out.as_subclass(torch.Tensor) if self.kind == "tagged" else out).square().mean()

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


@pytest.mark.parametrize("kind", ["tagged", "tanh_gelu", "mode"])
@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
def test_torch_function_overrides_replay_as_in_the_forward(kind: str, variant: str) -> None:
    """NOTE [Torch function state]: a replay runs under the forward's torch-function
    state, though backward entered through a subclass's override (which disables them)
    or outside the forward's function mode; and a subclass's reads are seen by the
    recording (no placeholder of a storage a subclass instance reads is handed out)."""
    torch.manual_seed(0)

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(s))

    # serves=False: each block's plan keeps its input and drops its one activation, so a
    # replay has nothing held to serve from
    check_variant(_SubclassModel(kind), batch, variant, steps=4, serves=False)


class _CtcBlock(nn.Module):
    """``ctc_loss`` with tensor lengths: under any dispatch mode its composite path runs,
    which saves the lengths too."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        lp = torch.nn.functional.log_softmax(h.transpose(0, 1), -1)
        loss = torch.nn.functional.ctc_loss(
            lp, torch.tensor([[1, 2, 3], [4, 5, 5]]), torch.tensor([8, 8]), torch.tensor([3, 2]), reduction="none"
        )
        return x + torch.tanh(h) * loss.reshape(2, 1, 1) * 0.01


@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve"])
def test_a_plain_replay_of_a_forward_under_a_mode_runs_under_one(variant: str) -> None:
    """NOTE [Replay], step 7: the first call's watch and the measuring pass's recorder are
    dispatch modes; a plain replay of such a call runs under a passive one, so an op whose
    path depends on that saves the same tensors. A planned call that saved other storages
    than its recording makes its region's forwards run under one too: after one more
    measuring pass, auto stays planned."""
    torch.manual_seed(0)
    model = models.Stack([_CtcBlock() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(s))

    rt, _ = check_variant(model, batch, variant, steps=7)
    phases = [s.phase for s in rt.report().steps]
    assert variant == "recompute" or (phases[-2:] == ["planned"] * 2 and phases.count("measure") == 2), phases


class _FlopBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc(self.ln(x))))


def test_a_serving_replay_diverging_under_a_callers_dispatch_mode_runs_plainly() -> None:
    """A FlopCounterMode around backward decomposes ops it has no formula for, so a
    serving replay under it would see other ops than its recording (a divergence blamed
    on the model): such a replay is redone plainly."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = models.Stack([_FlopBlock() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(s))

    def run(m: nn.Module, ctx: Any) -> list[torch.Tensor]:
        grads = []
        with ctx:
            for s in range(5):
                loss = m(batch(s))
                with FlopCounterMode(display=False):
                    loss.backward()
                grads += [p.grad.clone() for p in m.parameters()]
                m.zero_grad(set_to_none=True)
        return grads

    want = run(twin(model), contextlib.nullcontext())
    m = twin(model)
    budget = tight_budget(model, batch)
    rt = offrecomp.runtime(m, mode="auto", budget=budget, replay_op_us=0, min_bytes=0)
    got = run(m, rt)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert rt.report().steps[-1].phase == "planned" and rt.report().steps[-1].recomputed_bytes > 0


class _Stash:
    """A plain object holding a dict: two steps from the modules, not restored by a
    replay (NOTE [Attributes at entry] in attr_tables.py)."""

    def __init__(self) -> None:
        self.d: dict[str, Any] = {}


class _StashBlock(nn.Module):
    """The first block stashes a tensor on the model, later blocks read it: a replay of
    the first block (the stash already set) takes the other branch."""

    def __init__(self, owner: _Stash) -> None:
        super().__init__()
        self.owner = owner
        self.ln = nn.LayerNorm(32)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.owner.d.get("first")
        if first is None:
            self.owner.d["first"] = x * 2
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x + first))))


class _StashModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.owner = _Stash()
        self.blocks = nn.ModuleList(_StashBlock(self.owner) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.owner.d.clear()
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def test_a_serving_replay_that_runs_other_ops_raises_whatever_its_program() -> None:
    """A serving replay whose ops differ from the recording's (Python state the replay
    does not restore) raises, also when its program hands out placeholders: only a
    placeholder read or save is redone without placeholders, and a divergence its
    region's modules explain (NOTE [Stale recordings]), as a plain replay is not
    checked and would hand out wrong activations."""
    torch.manual_seed(0)
    model = _StashModel()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(s))

    budget = tight_budget(model, batch)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", budget=budget, replay_op_us=0, min_bytes=0)
    with pytest.raises(offrecomp.ReplayDivergedError, match="not a deterministic function"), rt:
        for s in range(4):
            m(batch(s)).backward()


class _TwiceBlock(_GeluBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x * 2)))  # x itself is never saved


class _WritesABlockInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_TwiceBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](x)
        y = self.blocks[1](x)
        x.add_(1.0)  # legal in a plain run: no op saved x
        return (self.blocks[2](y) ** 2).sum() + x.sum()


@pytest.mark.parametrize("inputs", [Placement.KEEP, Placement.OFFLOAD])
def test_a_region_input_written_after_its_region_is_an_error_also_when_offloaded(inputs: Placement) -> None:
    """A replay would start from the written values: an error, whether the input was kept
    or sent to host memory. The offloaded one is no longer held, so it leaves a
    storage-free alias sharing its version counter that sees the write."""
    torch.manual_seed(0)
    m = _WritesABlockInput()
    plan = Plan(placements={(f"blocks.{b}", 0, 0): inputs for b in range(3)}, default=Placement.RECOMPUTE)
    with offrecomp.runtime(m, mode="recompute", min_bytes=0) as rt:
        rt.set_plan(plan)
        loss = m(torch.randn(8, 16))
        with pytest.raises(RuntimeError, match=r"input 0 of region 'blocks.1' was modified in place"):
            loss.backward()


class _FactoryBlock(nn.Module):
    """Makes a tensor with a factory op (default dtype) that an op saves."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ramp = torch.linspace(0.0, 1.0, 16).to(x.dtype)
        return x + torch.tanh(self.fc(x)) * torch.sin(ramp)


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_default_dtype_changed_before_backward_is_the_forwards_in_replay(mode: str) -> None:
    torch.manual_seed(0)
    base = models.Stack([_FactoryBlock() for _ in range(3)])

    def step(m: nn.Module, rt: Any = None) -> list[torch.Tensor]:
        with rt if rt is not None else contextlib.nullcontext():
            for s in range(3):
                loss = m(torch.randn(4, 16, generator=torch.Generator().manual_seed(s)))
                old = torch.get_default_dtype()
                torch.set_default_dtype(torch.float64)
                try:
                    loss.backward()
                finally:
                    torch.set_default_dtype(old)
        return [p.grad.clone() for p in m.parameters()]

    ref = step(twin(base))
    m = twin(base)
    got = step(m, offrecomp.runtime(m, mode=mode, min_bytes=0, budget=1 if mode == "auto" else None))
    assert all(torch.equal(a, b) for a, b in zip(ref, got))


class _ReadsSavesTwice(torch.autograd.Function):
    """A backward that reads ``ctx.saved_tensors`` once per tensor: each read unpacks
    every save."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w, x.exp())
        return x * w

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = ctx.saved_tensors[0]
        w = ctx.saved_tensors[1]
        return g * w, (g * x).reshape(-1, x.shape[-1]).sum(0)


class _ReadsSavesOnce(_ReadsSavesTwice):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w, _ = ctx.saved_tensors
        return g * w, (g * x).reshape(-1, x.shape[-1]).sum(0)


class _ReadsTwiceBlock(nn.Module):
    def __init__(self, fn: type[torch.autograd.Function] = _ReadsSavesTwice) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.w = nn.Parameter(torch.ones(32))
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fn.apply(torch.tanh(self.fc(x)), self.w)


@pytest.mark.parametrize("retain", [False, True])
def test_a_save_read_twice_by_its_node_is_replayed_once(retain: bool) -> None:
    """NOTE [Saves read twice] (hooks.py): the second read of ``ctx.saved_tensors``
    replayed each block again (8 replays for 4 blocks, and the second replay's tensors on
    top of the first's: the step held more than under keep). One replay per block now,
    gradients bitwise; a backward that keeps its graph holds nothing more for a second
    read, which replays again."""

    def step(m: nn.Module) -> list[torch.Tensor]:
        x = torch.randn(8, 32, generator=torch.Generator().manual_seed(0))
        loss = m(x).square().mean()
        loss.backward(retain_graph=retain)
        grads = [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]
        m.zero_grad(set_to_none=True)
        return grads

    torch.manual_seed(0)
    base = nn.Sequential(*[_ReadsTwiceBlock() for _ in range(4)])
    ref = step(copy.deepcopy(base))
    m = copy.deepcopy(base)
    with offrecomp.runtime(m, mode="recompute", min_bytes=0) as rt:
        got = step(m)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert rt.report().steps[-1].replays == (8 if retain else 4)


def test_reloads_of_a_second_backward_count_in_no_step() -> None:
    """NOTE [Several backwards] in lifecycle.py: a retained graph's second backward counts
    in no step. Its reloads counted in the next step (h2d of two steps' sizes), and the
    last step's nowhere."""
    torch.manual_seed(0)
    m = models.Stack([models.MLPBlock(32) for _ in range(3)])
    with offrecomp.runtime(m, mode="offload", min_bytes=0) as rt:
        for t in (16, 32, 8):
            loss = m(torch.randn(4, t, 32))
            loss.backward(retain_graph=True)
            loss.backward()
            m.zero_grad(set_to_none=True)
    steps = rt.report().steps
    assert len(steps) == 3
    for s in steps:
        assert s.d2h_bytes > 0 and s.h2d_bytes == s.d2h_bytes, (s.step, s.d2h_bytes, s.h2d_bytes)


def test_an_offloaded_save_read_twice_by_its_node_counts_once_toward_its_group() -> None:
    """A group is released when each of its live saves was unpacked once since its
    reload; a node reading ``ctx.saved_tensors`` once per tensor unpacked each twice and
    released the group before its last save, which reloaded it: about twice the reload
    bytes of a backward reading once. Gradients bitwise either way."""

    def run(read_twice: bool) -> tuple[list[torch.Tensor], int, int]:
        torch.manual_seed(0)
        m = nn.Sequential(*[_ReadsTwiceBlock(_ReadsSavesTwice if read_twice else _ReadsSavesOnce) for _ in range(4)])
        x = torch.randn(8, 32, generator=torch.Generator().manual_seed(0))
        with offrecomp.runtime(m, mode="offload", min_bytes=0) as rt:
            for _ in range(2):
                m.zero_grad(set_to_none=True)
                m(x).square().mean().backward()
        s = rt.report().steps[-1]
        assert s.offloaded_bytes > 0
        return [p.grad.clone() for p in m.parameters()], s.d2h_bytes, s.h2d_bytes  # type: ignore[union-attr]

    g_once, d2h_once, h2d_once = run(False)
    g_twice, d2h_twice, h2d_twice = run(True)
    assert all(torch.equal(a, b) for a, b in zip(g_once, g_twice))
    assert d2h_twice == d2h_once
    assert h2d_twice == h2d_once == d2h_once



class _SavesNothing(nn.Module):
    """``x + bias``: autograd saves nothing for it."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


def _each_child(module: nn.Module, name: str) -> bool:
    return name.isdigit()


def test_a_call_that_saved_nothing_sends_no_input_to_host() -> None:
    """NOTE [Calls that saved nothing] (calls.py): a region call's inputs join its group at
    its entry; under a plan offloading by default, one whose forward saved nothing was
    released at its exit after its inputs were copied to host, never to be reloaded (4
    KiB per such call here: d2h above h2d). Every byte sent is reloaded, the step's
    offloaded bytes are the bytes sent, and gradients match plain bitwise."""

    def run(ctx: Any) -> tuple[list[torch.Tensor], Any]:
        torch.manual_seed(0)
        m = nn.Sequential(*(nn.Sequential(nn.Linear(32, 32), nn.Tanh()) if i % 2 == 0 else _SavesNothing() for i in range(5)))
        grads = []
        rt = ctx(m) if ctx is not None else None
        with rt if rt is not None else contextlib.nullcontext():
            for s in range(3):
                m.zero_grad(set_to_none=True)
                m(torch.randn(32, 32, generator=torch.Generator().manual_seed(s))).square().mean().backward()
                grads += [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]
        return grads, rt

    def runtime(m: nn.Module) -> Any:  # a plan that offloads inputs too
        rt = offrecomp.runtime(m, mode="auto", min_bytes=0, regions=_each_child)
        rt.set_plan(Plan(default=Placement.OFFLOAD))
        return rt

    ref, _ = run(None)
    got, rt = run(runtime)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    s = rt.report().steps[-1]
    assert s.d2h_bytes > 0 and s.d2h_bytes == s.h2d_bytes == s.offloaded_bytes, (s.d2h_bytes, s.h2d_bytes, s.offloaded_bytes)


def test_a_replay_stops_early_only_at_a_storage_saved_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Replay], step 5: a needed save without grad at version 0 lets its op finish
    (it may fill it, as ``rrelu_with_noise`` fills its noise) unless an earlier op saved
    that storage. An earlier op's save of another storage at the same address (its
    noise, not needed and freed, the address reused) is no such save: the replay stopped
    at once, before the noise was filled (other gradients, in some runs, under a plan
    keeping the first RReLU's noise). Two storages over one buffer stand for the reuse."""
    import offrecomp.replay as replay

    seq = [1]
    monkeypatch.setattr(replay, "_sequence_nr", lambda: seq[0])
    buf = np.zeros(8, dtype=np.float32)
    first, second = torch.from_numpy(buf), torch.from_numpy(buf)
    assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
    assert first.untyped_storage() is not second.untyped_storage()
    capture = replay._SaveCapture("block", {1}, hold=False)
    try:
        capture.pack(first)  # save #0 (not needed), first op
        seq[0] = 2
        capture.pack(second)  # save #1, the last needed, a later op: it may still fill it
        assert not capture.stopped and capture.complete == 2
        seq[0] = 3
        with pytest.raises(replay._StopReplay):  # the op after it stops the replay
            capture.pack(torch.ones(2))
        same = replay._SaveCapture("block", {1}, hold=False)
        seq[0] = 4
        same.pack(first)
        seq[0] = 5
        with pytest.raises(replay._StopReplay):  # the same storage saved before: at once
            same.pack(first)
    finally:
        capture.end_stop_mode()


class _TwoRReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.rrelu(self.fc(x), training=True)
        return x + nn.functional.rrelu(h * 1.5, training=True)


class _RReLUStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_TwoRReLU() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def test_a_plan_keeping_one_rrelu_noise_replays_the_other_filled() -> None:
    """The case behind the test above, end to end: gradients bitwise under a plan that
    keeps the first RReLU's noise and drops the second's (a few runs, the address reuse
    being the allocator's)."""
    torch.manual_seed(0)
    model = _RReLUStack()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(16, 32, generator=torch.Generator().manual_seed(s))

    ref = train(twin(model), batch, steps=3)
    keep = {(f"blocks.{i}", 0, k): Placement.KEEP for i in range(3) for k in (0, 1, 2)}
    for _ in range(3):
        m = twin(model)
        rt = offrecomp.runtime(m, mode="auto", min_bytes=0)
        rt.set_plan(Plan(default=Placement.RECOMPUTE, placements=keep))
        assert_bitwise(ref, train(m, batch, rt, steps=3))
        assert rt.report().steps[-1].replays == 3
