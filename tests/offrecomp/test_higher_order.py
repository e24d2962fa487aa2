"""Higher-order operators (flex_attention, cond) and compiled code under the measuring
pass's op recorder, a dispatch mode: such an operator reaches the mode as one op that
runs subgraphs the mode never sees, and torch.compile refuses to compile under a mode
unless the mode steps aside. Neither may raise inside the user's forward."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from offrecomp.trace import OpRecorder, build_structure
from tests import models
from tests.helpers import batch_on, tight_budget, train, train_bitwise


def _recorder() -> OpRecorder:
    return OpRecorder(use_cuda_events=False, cuda_devices=[])


def test_eager_flex_attention_is_recorded_as_one_higher_order_op() -> None:
    """Eager flex_attention compiles a wrapper of its own with fullgraph=True, which
    dynamo refused under the recorder (RuntimeError), and its operator then raised
    NotImplementedError for a mode without a rule. Forward only: CPU has no eager
    flex_attention backward."""
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 2, 128, 16, generator=torch.Generator().manual_seed(0))
    ref = flex_attention(q, q, q)
    rec = _recorder()
    with rec:
        out = flex_attention(q, q, q)
    assert torch.equal(out, ref)
    hops = [op for op in rec.ops if op.higher_order]
    assert [op.name for op in hops] == ["flex_attention"]
    st = build_structure(rec, [], [], [], [], rec.op_seconds(), 0.0)
    assert st.opaque  # its subgraphs' ops are unseen: replay runs the prefix as it is


def test_code_compiled_with_fullgraph_compiles_under_the_recorder() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(8)
    with _recorder():
        y = compiled(x)  # raised "found no compiled frames" under a mode dynamo avoids
    assert torch.equal(y, f(x))


class CondBlock(nn.Module):
    """``torch.cond`` (data-dependent branch as a higher-order operator), then residual
    dropout."""

    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.a = nn.Linear(h, h)
        self.b = nn.Linear(h, h)
        self.out = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln(x)  # the branch reads x: y's mean is ~0 whatever x's sign
        z = torch.cond(x.mean() > 0, lambda t: self.a(t).relu(), lambda t: self.b(t).sigmoid(), (y,))
        return x + F.dropout(self.out(z), 0.1, self.training)


def _cond_batch(s: int) -> torch.Tensor:
    sign = 1.0 if (s // 10) % 2 else -1.0  # train() asks for 10 * step
    return sign + torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(s))


@pytest.fixture(scope="module")
def cond_model_and_plain() -> tuple[nn.Module, list[dict[str, torch.Tensor]]]:
    """A stack of two CondBlocks and its plain run, for every variant (eager torch.cond
    traces its branches on every call, which is slow); each block takes each branch in
    some step of that run."""
    torch.manual_seed(0)
    model = models.Stack([CondBlock() for _ in range(2)])
    taken: dict[int, set[bool]] = {0: set(), 1: set()}
    plain = copy.deepcopy(model)
    for i, blk in enumerate(plain.blocks):  # reads the input only: the run is plain's
        blk.register_forward_pre_hook(lambda _m, args, i=i: taken[i].add(bool(args[0].mean() > 0)))
    ref = train(plain, _cond_batch, steps=4)
    assert taken == {0: {True, False}, 1: {True, False}}, taken
    return model, ref


@pytest.mark.parametrize("variant", ["recompute", "auto_serve", "offload"])
def test_cond_blocks_bitwise_equal_to_plain(
    variant: str, cond_model_and_plain: tuple[nn.Module, list[dict[str, torch.Tensor]]]
) -> None:
    """torch.cond under the measuring pass's recorder raised NotImplementedError; now the
    block is opaque and replays whole. The batch's sign alternates, so both branches run.
    (Few variants, one plain run: eager torch.cond traces its branches on every call.)"""
    model, ref = cond_model_and_plain
    _check_opaque_blocks(model, _cond_batch, variant, ref)


def _check_opaque_blocks(model: nn.Module, batch: Callable[[int], Any], variant: str, ref: list[Any]) -> None:
    """Bitwise against ``ref`` under ``variant``; the two blocks replay whole."""
    budget = tight_budget(model, batch) if variant == "auto_serve" else None
    rt = train_bitwise(copy.deepcopy(model), batch, variant, budget, ref)
    steps = rt.report().steps
    if variant == "recompute":
        assert all(s.replays == 2 for s in steps)
    if variant == "offload":
        assert all(s.offloaded_bytes > 0 and s.replays == 0 for s in steps), steps
    if variant == "auto_serve":
        assert steps[0].phase == "measure"
        assert any(s.phase == "planned" and s.recomputed_bytes > 0 for s in steps)
        assert all(s.served_ops == 0 for s in steps)  # opaque: replayed whole


class FlexBlock(nn.Module):
    """Causal attention through flex_attention (a score_mod), residual MLP."""

    def __init__(self, h: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.fc = nn.Linear(h, h)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        b, t, h = x.shape
        q, k, v = self.qkv(self.ln(x)).split(h, dim=-1)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))

        def causal(score: torch.Tensor, b_: torch.Tensor, h_: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
            return torch.where(qi >= ki, score, -float("inf"))

        a = flex_attention(q, k, v, score_mod=causal)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        return x + F.dropout(self.fc(F.gelu(x)), 0.1, self.training)


class FlexModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 64)
        self.blocks = nn.ModuleList(FlexBlock() for _ in range(2))
        self.head = nn.Linear(64, 64)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), idx.flatten())


@pytest.mark.parametrize("variant", ["recompute", "auto_serve", "offload"])
def test_flex_attention_blocks_with_backward_on_cpu(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """flex_attention's autograd rule runs a backward inside the forward (it traces its
    score_mod's joint graph with torch.autograd.grad on every call): its replays raised
    (NOTE [Backward inside a forward]). torch refuses flex_attention's backward on CPU
    in its argument check alone; past that check its CPU path runs the backward."""
    import torch.nn.attention.flex_attention as fa

    if not hasattr(fa, "_validate_device"):
        pytest.skip("this torch has no flex_attention device check to step past")
    monkeypatch.setattr(fa, "_validate_device", lambda *args, **kwargs: None)
    torch.manual_seed(0)
    model = FlexModel()

    def batch(s: int) -> torch.Tensor:
        return torch.randint(0, 64, (2, 128), generator=torch.Generator().manual_seed(s))

    _check_opaque_blocks(model, batch, variant, train(copy.deepcopy(model), batch, steps=4))


@pytest.mark.cuda
@pytest.mark.parametrize("variant", ["recompute", "auto_serve", "offload"])
def test_flex_attention_blocks_on_cuda(variant: str) -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = FlexModel().to(dev)
    batch = batch_on(dev, lambda s: torch.randint(0, 64, (2, 128), generator=torch.Generator().manual_seed(s)))
    ref = train(copy.deepcopy(model), batch, steps=4)
    again = train(copy.deepcopy(model), batch, steps=4)
    if not all(torch.equal(a[k], b[k]) for a, b in zip(ref, again) for k in a):
        pytest.skip("plain CUDA runs differ run to run (nondeterministic kernels)")
    _check_opaque_blocks(model, batch, variant, ref)


@pytest.mark.parametrize("mode", ["recompute", "auto", "offload"])
def test_blocks_called_under_vmap_keep_their_activations(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """A forward under ``torch.func.vmap``, then an ordinary backward: the region inputs
    are batched tensors of a vmap level that is gone by backward, so no replay can start
    from them; the calls keep their activations (a warning says so) and the gradients are
    plain's."""
    import offrecomp
    import offrecomp.diagnostics

    offrecomp.diagnostics.clear_warnings()  # it comes once per kind of block in a process
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])
    x = torch.randn(5, 4, 8)

    def step(m: nn.Module) -> dict[str, torch.Tensor]:
        torch.func.vmap(m)(x).square().sum().backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        m.zero_grad(set_to_none=True)
        return grads

    ref = copy.deepcopy(model)
    want = [step(ref) for _ in range(3)]
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    with rt:
        got = [step(m) for _ in range(3)]
    for a, b in zip(want, got):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = rt.report().steps
    warned = any("functorch transform" in r.getMessage() for r in caplog.records)
    if mode == "offload":
        # an offload needs no replay: the batched saves go to the host, and nothing warns
        assert not warned and all(s.offloaded_bytes > 0 and s.kept_bytes == 0 for s in steps), steps
    else:
        assert warned and all(s.replays == 0 and s.recomputed_bytes == 0 and s.kept_bytes > 0 for s in steps), steps


class _JacBlock(nn.Module):
    """Differentiates inside its forward with torch.func.jacrev."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.a = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        jac = torch.func.jacrev(lambda a: torch.tanh(self.fc(a)))(self.a)
        return x + x @ jac


class _JacRoot(nn.Module):
    """Calls jacrev in its own forward, outside every region."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        self.a = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x @ torch.func.jacrev(torch.sin)(self.a)


@pytest.mark.parametrize("mode", ["keep", "recompute", "auto"])
@pytest.mark.parametrize("where", ["region", "root"])
def test_torch_func_transforms_that_refuse_the_hooks_are_named(mode: str, where: str) -> None:
    """torch.func.grad/vjp/jacrev/hessian refuse to start while a saved-tensor hook pair is
    registered, with a message naming neither offrecomp nor the module: the error says
    where the transform ran and what runs under the runtime instead, chained to torch's;
    the runtime leaves nothing registered behind it."""
    import offrecomp
    from offrecomp import _torch_compat as tc

    torch.manual_seed(0)
    model = nn.Sequential(_JacBlock(), _JacBlock()) if where == "region" else _JacRoot()
    x = torch.randn(3, 4)
    model(x).sum().backward()  # plainly it trains
    with (
        pytest.raises(RuntimeError, match=r"torch\.func\.grad, vjp, jacrev or hessian") as err,
        offrecomp.runtime(model, mode=mode, min_bytes=0),
    ):
        model(x).sum().backward()
    said = str(err.value)
    assert ("region '0' (" in said and "_JacBlock)" in said) if where == "region" else "the model's forward" in said
    assert "torch.autograd.grad(..., create_graph=True)" in said
    assert isinstance(err.value.__cause__, RuntimeError) and "saved tensor hooks" in str(err.value.__cause__)
    assert tc.top_saved_tensors_hooks() is None
    model(x).sum().backward()


def test_torch_func_transforms_from_the_loop_are_named() -> None:
    """torch.func.grad called from the loop inside ``with rt:`` (a per-sample gradient
    between steps) is refused by torch, whose message names no runtime: the error out of
    ``with rt:`` says the runtime's pair is registered from entry to exit and to call the
    transform outside it, chained to torch's."""
    import offrecomp

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    x = torch.randn(3, 4)
    params = dict(model.named_parameters())

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(model, p, (x,)).sum()

    with (
        pytest.raises(RuntimeError, match=r"code inside `with rt:` calls torch\.func\.grad") as err,
        offrecomp.runtime(model, mode="recompute", min_bytes=0),
    ):
        model(x).sum().backward()
        torch.func.grad(loss)(params)
    assert "outside `with rt:`" in str(err.value)
    assert isinstance(err.value.__cause__, RuntimeError) and "saved tensor hooks" in str(err.value.__cause__)
    torch.func.grad(loss)(params)  # outside, it runs


class _NormBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.ln(x))


@pytest.mark.parametrize("mode", ["keep", "recompute", "offload", "auto"])
def test_blocks_run_under_forward_ad_keep_their_activations(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """Dual numbers through the blocks with grad enabled, then a backward of the primal:
    forward AD saves ZeroTensors (storages without data), saved as they are, and a
    replay outside the dual level would not rebuild the tangents' graph, so the calls keep
    their activations with a warning; tangents and gradients are plain's."""
    import torch.autograd.forward_ad as fwad

    import offrecomp
    import offrecomp.diagnostics

    offrecomp.diagnostics.clear_warnings()
    torch.manual_seed(0)
    model = nn.Sequential(_NormBlock(), _NormBlock(), _NormBlock())
    x = torch.randn(2, 8, 16)

    def step(m: nn.Module) -> list[torch.Tensor]:
        with fwad.dual_level():
            out = m(fwad.make_dual(x, torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))))
            primal, tangent = fwad.unpack_dual(out)
        primal.square().mean().backward()
        grads = [tangent.clone(), *(p.grad.clone() for p in m.parameters() if p.grad is not None)]
        m.zero_grad(set_to_none=True)
        return grads

    want = [step(copy.deepcopy(model)) for _ in range(1)] * 3
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    with rt:
        got = [step(m) for _ in range(3)]
    for a, b in zip(want, got):
        assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))
    if mode in ("recompute", "auto"):
        assert any("forward-mode AD" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("regulariser", ["forward_ad", "dispatch_mode"])
def test_calls_no_pass_can_record_leave_auto_planning(regulariser: str) -> None:
    """NOTE [Calls the profile lacks] (planner.py): each step adds to the training loss a
    second forward of the same blocks under a dual level (a JVP regulariser) or under a
    dispatch mode of the caller's; those calls keep their activations and cannot be
    recorded. Each pass found them missing from the profile and calibrated again, for
    good (every step a full recompute of the ordinary calls); now auto plans."""
    import torch.autograd.forward_ad as fwad
    from torch.utils._python_dispatch import TorchDispatchMode

    import offrecomp

    class _Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    def loop(m: nn.Module, rt: Any) -> list[list[torch.Tensor]]:
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        out = []
        with rt:
            for s in range(8):
                x, v, xb = torch.randn(3, 2, 8, 16, generator=torch.Generator().manual_seed(s)).unbind(0)
                loss = m(xb).square().mean()
                if regulariser == "forward_ad":
                    with fwad.dual_level():
                        _, t = fwad.unpack_dual(m(fwad.make_dual(x, v)))
                else:
                    with _Passthrough():
                        t = m(x)
                (loss + 0.1 * t.square().mean()).backward()
                out.append([p.grad.clone() for p in m.parameters()])  # type: ignore[union-attr]
                opt.step()
                opt.zero_grad(set_to_none=True)
        return out

    torch.manual_seed(0)
    model = nn.Sequential(_NormBlock(), _NormBlock(), _NormBlock())
    ref = loop(copy.deepcopy(model), offrecomp.runtime(copy.deepcopy(model), mode="off"))
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0)
    got = loop(m, rt)
    assert all(torch.equal(a, b) for ga, gb in zip(ref, got) for a, b in zip(ga, gb))
    phases = [s.phase for s in rt.report().steps]
    assert phases[-1] == "planned", phases
