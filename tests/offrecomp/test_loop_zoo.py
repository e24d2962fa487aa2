"""Invariant 1 on a zoo of training-loop patterns users write: gradients, buffers and
losses under every mode are bitwise equal to a plain run's on the same seeds.

``test_model_zoo.py`` varies the module structure; this file varies the loop around an
ordinary small transformer (pre-LN blocks, fused causal attention with dropout, embedding
dropout at the root). Every loop seeds the RNG once and runs long enough for auto to
reach planned steps (measure, calibrate, planned, ...) on each input signature, under
each variant:

* ``keep``, ``recompute``, ``offload`` (the emulated backend on CPU), ``auto``;
* ``auto_tight``: auto with a budget of half the peak activation bytes keep books in
  step 0 of the same loop;
* ``auto_serve``: the same, with ``replay_op_us=0`` so replay always runs under the
  dispatch mode (serving held outputs, placeholders, the op-sequence check).

The plain run of each loop is computed once per loop and shared by its variants. After
each loop the runtime's report must still work and no offload group may be left held.
The reduced failing cases are at the end of the file.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from offrecomp import backends
from tests import models
from tests.helpers import ZOO_VARIANTS, assert_bitwise, variant_runtime

Snap = dict[str, torch.Tensor]
Loop = Callable[[nn.Module, "offrecomp.Runtime | None"], list[Snap]]

VARIANTS = ZOO_VARIANTS
VOCAB = 64


# ----------------------------------------------------------------------------- model


class Boom(Exception):
    """Raised by a block (or a gradient hook) on purpose: the loop catches it."""


_FAULT: dict[str, Any] = {"block": None, "exc": None}


class Block(nn.Module):
    """Pre-LN GPT block (as tests/models.py), with a fault point between attention and MLP;
    dropout inside fused attention and on both residual branches (``F.dropout``)."""

    def __init__(self, h: int, heads: int, p: float, resid_p: float | None = None) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)
        self.heads = heads
        self.p = p
        self.resid_p = p if resid_p is None else resid_p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.p if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + self._resid_dropout(self.proj(a.transpose(1, 2).reshape(b, t, h)))
        if _FAULT["block"] is self:
            raise (_FAULT["exc"] or Boom)("block failed mid-forward")
        return x + self._resid_dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))))

    def _resid_dropout(self, y: torch.Tensor) -> torch.Tensor:
        return F.dropout(y, self.resid_p, self.training) if self.resid_p else y


class LM(nn.Module):
    """Embedding, blocks (the regions), final LN, head; returns the token loss. The
    embeddings can be passed in instead of computed (gradient w.r.t. the input)."""

    def __init__(self, layers: int = 2, h: int = 32, heads: int = 4, p: float = 0.1) -> None:
        super().__init__()
        self.p = p
        self.emb = nn.Embedding(VOCAB, h)
        self.blocks = nn.ModuleList(Block(h, heads, p) for _ in range(layers))
        self.ln = nn.LayerNorm(h)
        self.head = nn.Linear(h, VOCAB)

    def forward(self, idx: torch.Tensor, embeds: torch.Tensor | None = None) -> torch.Tensor:
        x = self.emb(idx) if embeds is None else embeds
        x = F.dropout(x, self.p, self.training)  # dropout at the root, outside every region
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), idx.flatten())


def _tokens(seed: int, t: int = 16, b: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(3000 + seed))


# --------------------------------------------------------------------------- harness


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny ops: with intra-op threads on a busy host each waits at an OpenMP barrier."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _no_fault() -> Iterator[None]:
    _FAULT.update(block=None, exc=None)
    yield
    _FAULT.update(block=None, exc=None)


def _ctx(rt: offrecomp.Runtime | None) -> Any:
    return rt if rt is not None else contextlib.nullcontext()


def _snap(model: nn.Module, loss: torch.Tensor | None = None, **extra: torch.Tensor) -> Snap:
    s = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    s.update({f"buf.{n}": b.detach().clone() for n, b in model.named_buffers()})
    if loss is not None:
        s["loss"] = loss.detach().clone()
    s.update({k: v.detach().clone() for k, v in extra.items()})
    return s


def _final(model: nn.Module) -> Snap:
    return {f"param.{n}": p.detach().clone() for n, p in model.named_parameters()}


_REFS: dict[str, list[Snap]] = {}
_BUDGETS: dict[str, int] = {}


def _run(
    name: str,
    loop: Loop,
    variant: str,
    *,
    factory: Callable[[], nn.Module] = LM,
    backward_inside: bool = True,
    **kw: Any,
) -> offrecomp.Runtime:
    """Plain run (cached per loop) against the variant; bitwise; then generic report checks.

    ``backward_inside=False``: backward runs after the context exits, so step records
    close before their backward (no replays in them) and auto never completes a
    measuring pass; only equality and cleanliness are checked then."""
    torch.manual_seed(0)
    model = factory()
    if name not in _REFS:
        _REFS[name] = loop(copy.deepcopy(model), None)
    budget = None
    if variant in ("auto_tight", "auto_serve"):
        if name not in _BUDGETS:
            probe = copy.deepcopy(model)
            keep = variant_runtime(probe, "keep", **kw)
            loop(probe, keep)
            _BUDGETS[name] = keep.report().steps[0].peak_activation_bytes // 2
        budget = _BUDGETS[name]
        assert budget > 0
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, budget, **kw)
    got = loop(m, rt)
    assert_bitwise(_REFS[name], got)
    report = rt.report()  # works after the loop, whatever it did
    steps = report.steps
    assert steps, "no step recorded"
    if variant == "keep":
        _BUDGETS.setdefault(name, steps[0].peak_activation_bytes // 2)
    if variant == "recompute" and backward_inside:
        assert steps[-1].replays > 0 and steps[-1].recomputed_bytes > 0
    if variant == "offload":
        assert any(s.offloaded_bytes > 0 for s in steps)
        assert all(s.backend == "emulated" for s in steps if s.offloaded_bytes)
    if variant.startswith("auto") and backward_inside:
        assert steps[0].phase == "measure", [s.phase for s in steps]
        assert "planned" in [s.phase for s in steps], [s.phase for s in steps]
    if variant in ("auto_tight", "auto_serve") and backward_inside:
        assert any(s.phase == "planned" and s.recomputed_bytes > 0 for s in steps), "the budget forced no dropping"
    if variant == "auto_serve" and backward_inside:
        assert any(s.served_ops > 0 for s in steps), "no replay ran under the dispatch mode"
    _assert_no_leak(rt)
    return rt


def _assert_no_leak(rt: offrecomp.Runtime) -> None:
    """Once the loop is over and its graphs are gone, nothing the runtime holds is live."""
    assert not rt.active
    if rt.offload_groups_held:
        gc.collect()  # a graph held by a reference cycle (a traceback) is freed by gc (slow)
    assert rt.offload_groups_held == 0, f"{rt.offload_groups_held} offload groups still held"
    engine = rt.offload_engine
    if engine is not None:
        assert engine.stash_bytes == 0 and engine.outstanding_reload_bytes == 0


def _phases_by_signature(rt: offrecomp.Runtime) -> dict[str, list[str]]:
    """Phases per signature; a calibration pass a host pause sent back (NOTE [Host
    pauses]: it happens when a collection lands in a block with no peer) is left out."""
    out: dict[str, list[str]] = {}
    for s in rt.report().steps:
        if not any("calibrating again" in n for n in s.notes):
            out.setdefault(s.signature, []).append(s.phase)
    return out


def _forward_backward(model: nn.Module, x: torch.Tensor, out: list[Snap]) -> torch.Tensor:
    loss = model(x)
    loss.backward()
    out.append(_snap(model, loss))
    return loss


def _sgd_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, out: list[Snap]) -> torch.Tensor:
    loss = _forward_backward(model, x, out)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


Body = Callable[[int, list[Snap]], object]


def _sgd_loop(model: nn.Module, rt: offrecomp.Runtime | None, steps: int, body: Body) -> list[Snap]:
    """The frame most loops share: seed, plain SGD, one ``with`` around all the steps.
    ``body(i, out)`` runs step ``i``'s forwards and backwards and appends its snapshots;
    then the optimizer steps and the gradients are dropped."""
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out: list[Snap] = []
    with _ctx(rt):
        for i in range(steps):
            body(i, out)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return [*out, _final(model)]


# ----------------------------------------------------------------------------- loops
# Every loop seeds the global RNG once, at its start: dropout draws flow from step to
# step, so a replay that consumed RNG state, or failed to restore it, shows in the steps
# after it.

# 4 passes each of 32, 16 and 24, then a short tail; the longest first, so that the tight
# budget (half of keep's step 0) can be met by every signature
VARLEN = [32, 16, 24, 32, 16, 24, 32, 24, 16, 32, 24, 16, 8]


def loop_variable_length(
    model: nn.Module, rt: offrecomp.Runtime | None, lengths: list[int] = VARLEN, last_batch: int = 1
) -> list[Snap]:
    """Another sequence length every step; the last batch of the epoch is smaller."""

    def step(i: int, out: list[Snap]) -> None:
        b = last_batch if i == len(lengths) - 1 else 2
        _forward_backward(model, _tokens(i, lengths[i], b), out)

    return _sgd_loop(model, rt, len(lengths), step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_variable_length_per_step(variant: str) -> None:
    rt = _run("varlen", loop_variable_length, variant)
    if variant.startswith("auto"):
        by_sig = _phases_by_signature(rt)
        assert len(by_sig) == 4
        # NOTE [Borrowed plans]: 32 comes first and measures; 16, 24 and the smaller
        # last batch first run its plan, and a length seen again measures its own (the
        # plan cache has room)
        assert by_sig["train|(2, 32):int64:cpu"] == ["measure", "calibrate", "planned", "planned"]
        for n in (16, 24):
            phases = by_sig[f"train|(2, {n}):int64:cpu"]
            assert phases == ["borrowed", "measure", "calibrate", "planned"], (n, phases)
        assert by_sig["train|(1, 8):int64:cpu"] == ["borrowed"]


# plan_cache_size=2, shapes (batch, length) none of which covers another (NOTE [Borrowed
# plans]): (1, 40) and (4, 10) get plans, (2, 20) and (3, 15) evict them, then (1, 40)
# and (4, 10) are back and measure again
EVICT = [(1, 40), (4, 10)] * 3 + [(2, 20), (3, 15)] + [(1, 40), (4, 10)] * 3


def loop_evict(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    def step(i: int, out: list[Snap]) -> None:
        b, t = EVICT[i]
        _forward_backward(model, _tokens(i, t, b), out)

    return _sgd_loop(model, rt, len(EVICT), step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_more_signatures_than_the_plan_cache(variant: str) -> None:
    rt = _run("evict", loop_evict, variant, plan_cache_size=2)
    if variant.startswith("auto"):
        by_sig = _phases_by_signature(rt)
        assert len(by_sig) == 4
        for sig, phases in by_sig.items():
            if len(phases) == 1:
                assert phases == ["measure"], (sig, phases)  # (2, 20) and (3, 15)
            else:  # planned, evicted, measured and planned again
                assert phases == ["measure", "calibrate", "planned"] * 2, (sig, phases)


def test_a_covered_signature_borrows_when_the_plan_cache_is_full() -> None:
    """NOTE [Borrowed plans]: with no room for a plan of its own, a signature seen
    before keeps running the plan of a larger one of its family."""
    def loop(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
        return loop_variable_length(model, rt, [40, 32, 40, 32, 40, 16, 16, 16], last_batch=2)

    rt = _run("borrow_full", loop, "auto_tight", plan_cache_size=2)
    by_sig = _phases_by_signature(rt)
    assert by_sig["train|(2, 16):int64:cpu"] == ["borrowed"] * 3
    assert by_sig["train|(2, 40):int64:cpu"] == ["measure", "calibrate", "planned"]
    assert len(rt.planner.entries) == 2
    steps = rt.report().steps
    budget = next(s.budget_bytes for s in steps if s.phase == "planned")
    assert all(s.peak_activation_bytes <= budget for s in steps if s.phase == "borrowed")
    assert any(s.recomputed_bytes > 0 for s in steps if s.phase == "borrowed")


WARMUP = [16, 18, 20, 22, 24, 26, 28, 28, 28, 28]


def loop_length_warmup(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """A sequence-length warmup: the length grows a little every step, then stays."""
    return loop_variable_length(model, rt, WARMUP, last_batch=2)


@pytest.mark.parametrize("variant", ["auto", "auto_tight"])
def test_sequence_length_warmup_measures_only_when_grown_by_a_quarter(variant: str) -> None:
    """NOTE [Borrowed plans]: a new length within 25% of a profiled one runs a plain
    full recompute on first sight, not a measuring pass (a full recompute under the op
    recorder); one grown further measures; the final length plans."""
    rt = _run("warmup", loop_length_warmup, variant)
    phases = [s.phase for s in rt.report().steps]
    assert phases == [
        "measure", "recompute", "recompute", "measure", "recompute", "recompute",
        "measure", "calibrate", "planned", "planned",
    ], phases
    assert all(s.replays > 0 for s, ph in zip(rt.report().steps, phases) if ph == "recompute")


def _read_saved(t: torch.Tensor) -> None:
    """Read every saved tensor of ``t``'s graph, as torchviz's ``show_saved`` does."""
    seen: set[Any] = set()
    stack = [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for name in dir(fn):
            if name.startswith("_saved_"):
                getattr(fn, name)
        stack.extend(f for f, _ in fn.next_functions)


def loop_read_saved(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    first: list[torch.Tensor] = []
    hook = model.blocks[0].register_forward_hook(lambda m, a, o: first.append(o))  # type: ignore[index]

    def step(i: int, out: list[Snap]) -> None:
        loss = model(_tokens(i))
        _read_saved(first.pop())  # the first block's saves, before the later ones
        _read_saved(loss)
        loss.backward()
        out.append(_snap(model, loss))

    try:
        return _sgd_loop(model, rt, 6, step)
    finally:
        hook.remove()


@pytest.mark.parametrize("variant", VARIANTS)
def test_saved_tensors_read_between_forward_and_backward(variant: str) -> None:
    """Reading a graph's saved tensors outside any backward (the first block's first,
    replaying it out of backward order) begins no backward and times no backward
    replay: the step's own backward still ends the pass, and auto goes on to plan."""
    _run("read_saved", loop_read_saved, variant)


EMBEDS_OUTSIDE = [16, 16, 16, 24, 12, 24, 16, 12]


def loop_embeds_outside(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """The embeddings computed before the model's forward (``inputs_embeds=``): the
    pass begins at their save, before the forward that names its signature."""

    def step(i: int, out: list[Snap]) -> None:
        idx = _tokens(i, EMBEDS_OUTSIDE[i])
        loss = model(idx, embeds=model.emb(idx))
        loss.backward()
        out.append(_snap(model, loss))

    return _sgd_loop(model, rt, len(EMBEDS_OUTSIDE), step)


@pytest.mark.parametrize("variant", ["auto", "auto_tight"])
def test_a_pass_begun_before_its_forward_takes_the_forwards_signature(variant: str) -> None:
    """Never the previous batch's: each step is planned for its own length."""
    rt = _run("embeds_outside", loop_embeds_outside, variant)
    sigs = [s.signature for s in rt.report().steps]
    assert all(f"(2, {t})" in sig for sig, t in zip(sigs, EMBEDS_OUTSIDE)), sigs
    # the entry each pass's planning made while it had no signature yet is gone: it
    # would hold a slot of the plan cache for good
    assert "unknown" not in rt.planner.entries, list(rt.planner.entries)


METRIC_LENGTHS = [16, 24, 16, 12, 24, 16, 12, 24, 16]


def loop_metric_forward_with_grad(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """After each optimizer step, a metric forward in eval mode with grad left on, whose
    graph is dropped at once."""
    val = _tokens(999, 20)

    def step(i: int, out: list[Snap]) -> None:
        loss = model(_tokens(i, METRIC_LENGTHS[i]))
        loss.backward()
        out.append(_snap(model, loss))

    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    snaps: list[Snap] = []
    with _ctx(rt):
        for i in range(len(METRIC_LENGTHS)):
            step(i, snaps)
            opt.step()
            opt.zero_grad(set_to_none=True)
            model.eval()
            model(val).item()
            model.train()
    return [*snaps, _final(model)]


@pytest.mark.parametrize("variant", ["auto", "auto_tight"])
def test_a_dropped_metric_forward_does_not_become_the_next_steps_pass(variant: str) -> None:
    """NOTE [Dropped graphs]: the training forward after it begins a pass of its own,
    under its own signature, not the metric's."""
    rt = _run("metric_forward", loop_metric_forward_with_grad, variant)
    sigs = [s.signature for s in rt.report().steps][: len(METRIC_LENGTHS)]
    assert all(sig.startswith("train|") and f"(2, {t})" in sig for sig, t in zip(sigs, METRIC_LENGTHS)), sigs


def loop_backward_in_inference_mode(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    def step(i: int, out: list[Snap]) -> None:
        loss = model(_tokens(i))
        with torch.inference_mode():
            loss.backward()  # backward runs; the replays inside it must save
        out.append(_snap(model, loss))

    return _sgd_loop(model, rt, 4, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_backward_under_inference_mode(variant: str) -> None:
    _run("backward_inference_mode", loop_backward_in_inference_mode, variant)


def test_reloads_of_a_backward_under_inference_mode_copied_on_another_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulated side stream's worker runs every copy (the thread that waits never
    does, and nothing is delayed): buffers and views made for a reload are ordinary
    tensors, as the thread copying into them is not in inference mode."""
    monkeypatch.setattr(backends, "START_DELAY_S", 0.0)
    monkeypatch.setattr(backends.EmulatedBackend, "_help", lambda self, stream: False)
    _run("backward_inference_mode", loop_backward_in_inference_mode, "offload")


def loop_accumulate_mixed_lengths(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    def step(i: int, out: list[Snap]) -> None:
        losses = []
        for micro, t in enumerate((16, 24, 12)):
            loss = model(_tokens(10 * i + micro, t)) / 3
            loss.backward()
            losses.append(loss.detach())
        out.append(_snap(model, torch.stack(losses)))

    return _sgd_loop(model, rt, 4, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_accumulation_micro_batches_of_different_lengths(variant: str) -> None:
    rt = _run("accum_mixed", loop_accumulate_mixed_lengths, variant)
    steps = rt.report().steps
    assert [s.passes for s in steps] == [3] * 4


def loop_eval_between_steps(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """A validation forward under no_grad / inference_mode in eval mode after every
    step, and the runtime's report and explanation logged from inside the loop."""
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out: list[Snap] = []
    val = _tokens(999, 20)
    with _ctx(rt):
        for i in range(6):
            _sgd_step(model, opt, _tokens(i, 16), out)
            model.eval()
            no_grad = torch.no_grad() if i % 2 == 0 else torch.inference_mode()
            with no_grad:
                v = model(val)
            model.train()
            out.append({"val": v.clone()})
            if rt is not None:
                assert len(rt.report().steps) == i + 1
                assert isinstance(rt.explain(), str)
    return [*out, _final(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_eval_no_grad_forward_between_steps(variant: str) -> None:
    rt = _run("eval_between", loop_eval_between_steps, variant)
    assert len(rt.report().steps) == 6  # the eval forwards are no passes


def loop_validation_with_grad(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """Grad left enabled for forwards that are never differentiated: a validation
    forward in eval mode every third step (its graph stays alive until the variable is
    overwritten), and a train-mode batch skipped after its forward every fourth."""
    val = _tokens(999, 20)
    v: torch.Tensor | None = None  # not in step: its graph outlives the step, and the ``with``

    def step(i: int, out: list[Snap]) -> None:
        nonlocal v
        if i % 3 == 1:
            model.eval()
            v = model(val)  # graph built, never used
            model.train()
            out.append({"val": v.detach().clone()})
        if i % 4 == 2:
            skipped = model(_tokens(500 + i, 16))  # "loss looks bad, skip this batch"
            out.append({"skipped": skipped.detach().clone()})
            del skipped
        _forward_backward(model, _tokens(i, 16), out)

    snaps = _sgd_loop(model, rt, 8, step)
    del v
    return snaps


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_with_grad_but_no_backward(variant: str) -> None:
    _run("val_grad", loop_validation_with_grad, variant)


def loop_two_forwards_one_backward(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """Siamese: model(a) + model(b), then one backward. On step 3 the second forward
    fails mid-block; the loop trains on the first loss alone (its graph is intact)."""
    lm: Any = model

    def step(i: int, out: list[Snap]) -> None:
        la = model(_tokens(i, 16))
        _FAULT["block"] = lm.blocks[1] if i == 3 else None
        try:
            lb = model(_tokens(100 + i, 24))  # another length: another shape per call
        except Boom:
            lb = torch.zeros(())
        finally:
            _FAULT["block"] = None
        (la + lb).backward()
        out.append(_snap(model, la, lb=lb))

    return _sgd_loop(model, rt, 6, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_forwards_then_one_backward(variant: str) -> None:
    _run("siamese", loop_two_forwards_one_backward, variant)


def loop_two_forwards_two_backwards(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """Both graphs alive, then each differentiated on its own (multi-task losses)."""

    def step(i: int, out: list[Snap]) -> None:
        la = model(_tokens(i, 16))
        lb = model(_tokens(100 + i, 16))
        la.backward()
        out.append(_snap(model, la))
        lb.backward()  # the pass awaited it (NOTE [Several backwards])
        out.append(_snap(model, lb))

    return _sgd_loop(model, rt, 5, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_forwards_then_two_backwards(variant: str) -> None:
    _run("two_backwards", loop_two_forwards_two_backwards, variant)


_REPLAYS = [0]  # a global: a list the module held would be put back after each replay (NOTE [Attributes at entry])


class _CountedBlock(nn.Module):
    """Counts the replays of its forward (``offrecomp.in_replay()``) in ``_REPLAYS``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _REPLAYS[0] += offrecomp.in_replay()
        return x + self.fc2(F.gelu(self.fc1(x)))


def test_a_one_forward_one_backward_schedule_counts_every_replay() -> None:
    """Micro-batches in a pipeline's 1F1B order (F0 F1 B0 F2 B1 F3 B2 B3): a pass that a
    later forward ended (NOTE [Several backwards]) replays its calls in the backwards after
    its end; the step's record counts those replays too (all 8 a step runs, not the 6
    its passes' ends saw)."""
    _REPLAYS[0] = 0
    torch.manual_seed(0)
    model = models.Stack([_CountedBlock() for _ in range(2)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        for _ in range(2):
            losses = [model(xs[0]), model(xs[1])]
            losses[0].backward()
            losses.append(model(xs[2]))
            losses[1].backward()
            losses.append(model(xs[3]))
            losses[2].backward()
            losses[3].backward()
            opt.step()
            opt.zero_grad()
    steps = rt.report().steps
    assert _REPLAYS[0] == 16 and [s.replays for s in steps] == [8, 8], ([s.replays for s in steps], _REPLAYS)


def loop_retain_graph(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    def step(i: int, out: list[Snap]) -> None:
        loss = model(_tokens(i, 16))
        loss.backward(retain_graph=True)
        out.append(_snap(model))
        (0.5 * loss).backward()  # the same graph again: every saved tensor again
        out.append(_snap(model, loss))

    return _sgd_loop(model, rt, 5, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_backward_twice_with_retain_graph(variant: str) -> None:
    _run("retain_graph", loop_retain_graph, variant)


def loop_autograd_grad(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    params = list(model.parameters())

    def step(i: int, out: list[Snap]) -> None:
        loss = model(_tokens(i, 16))
        grads = torch.autograd.grad(loss, params, create_graph=False)
        for p, g in zip(params, grads):
            p.grad = g
        out.append(_snap(model, loss))

    return _sgd_loop(model, rt, 5, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_autograd_grad_instead_of_backward(variant: str) -> None:
    _run("autograd_grad", loop_autograd_grad, variant)


def loop_backward_subset(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """Every other step only the last block, the final LN and the head get gradients
    (``backward(inputs=...)``): the earlier blocks' saved tensors are never read."""
    lm: Any = model
    top = list(lm.blocks[-1].parameters()) + list(lm.ln.parameters()) + list(lm.head.parameters())

    def step(i: int, out: list[Snap]) -> None:
        loss = model(_tokens(i, 16))
        if i % 2:
            loss.backward(inputs=top)
        else:
            loss.backward()
        out.append(_snap(model, loss))

    return _sgd_loop(model, rt, 6, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_backward_with_inputs_subset(variant: str) -> None:
    _run("backward_subset", loop_backward_subset, variant)


def loop_bf16_autocast(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    def step(i: int, out: list[Snap]) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(_tokens(i, 16))
        loss.backward()  # outside autocast, as recommended
        out.append(_snap(model, loss))

    return _sgd_loop(model, rt, 5, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_bf16_autocast_in_the_loop(variant: str) -> None:
    _run("bf16", loop_bf16_autocast, variant)


def loop_adamw_clip_replace(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """AdamW with weight decay, clip_grad_norm_ between backward and step; at step 3 a
    parameter is replaced by a new nn.Parameter (optimizer rebuilt), at step 5 the
    weights are reloaded with load_state_dict (in place), at step 6 a whole block is
    replaced by a new module (no region of the runtime's)."""
    torch.manual_seed(1)
    lm: Any = model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    saved = copy.deepcopy(model.state_dict())
    out: list[Snap] = []
    with _ctx(rt):
        for i in range(9):
            if i == 3:
                with torch.no_grad():
                    w = lm.blocks[1].fc1.weight
                    lm.blocks[1].fc1.weight = nn.Parameter(w.flip(0).clone())
                opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
            if i == 5:
                model.load_state_dict(saved)
            if i == 6:
                lm.blocks[0] = Block(32, 4, 0.1)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
            loss = model(_tokens(i, 16))
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            out.append(_snap(model, loss, norm=norm))
            opt.step()
            opt.zero_grad(set_to_none=True)
    return [*out, _final(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_adamw_clipping_and_replaced_parameters(variant: str) -> None:
    _run("adamw_clip", loop_adamw_clip_replace, variant)


def loop_two_optimizers(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """Two optimizers over disjoint parameters, each stepping after its own forward and
    backward (GAN-style alternation on one model): two optimizer steps per iteration."""
    torch.manual_seed(1)
    lm: Any = model
    body = list(lm.emb.parameters()) + list(lm.blocks.parameters())
    top = list(lm.ln.parameters()) + list(lm.head.parameters())
    opt_body = torch.optim.SGD(body, lr=0.1, momentum=0.9)
    opt_top = torch.optim.Adam(top, lr=1e-2)
    out: list[Snap] = []
    with _ctx(rt):
        for i in range(4):
            for j, opt in enumerate((opt_body, opt_top)):
                loss = model(_tokens(10 * i + j, 16))
                loss.backward()
                out.append(_snap(model, loss))
                opt.step()
                model.zero_grad(set_to_none=True)
    return [*out, _final(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_optimizers_stepping_alternately(variant: str) -> None:
    rt = _run("two_optimizers", loop_two_optimizers, variant)
    assert len(rt.report().steps) == 8


def loop_optimizer_in_backward(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """One optimizer per parameter, stepped by a post-accumulate-grad hook while backward
    runs (torchtune's ``optimizer_in_bwd``): the optimizer steps inside every backward."""
    torch.manual_seed(1)
    opts = {p: torch.optim.AdamW([p], lr=1e-2) for p in model.parameters()}

    def update(p: torch.Tensor) -> None:
        opts[p].step()
        opts[p].zero_grad(set_to_none=True)

    handles = [p.register_post_accumulate_grad_hook(update) for p in model.parameters()]
    out: list[Snap] = []
    with _ctx(rt):
        for i in range(5):
            loss = model(_tokens(i, 16))
            loss.backward()
            out.append({"loss": loss.detach().clone(), **_final(model)})
    for h in handles:
        h.remove()
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_optimizer_stepping_inside_backward(variant: str) -> None:
    """NOTE [Passes and steps]: each backward is one pass and one step; auto plans."""
    rt = _run("optimizer_in_backward", loop_optimizer_in_backward, variant)
    steps = rt.report().steps
    assert len(steps) == 5
    assert all(s.replays > 0 for s in steps) if variant == "recompute" else True


def test_passes_of_provisional_steps_are_learnt_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Passes and steps]: before the first optimizer step each pass is a step of its
    own, learnt when its times land; the optimizer step merges them into one step, whose
    record lists them again. They are not learnt a second time: the calibration pass's
    check is logged once, and no plan is solved twice (an LBFGS closure's passes, the
    micro-batches of an accumulation's first step)."""
    from offrecomp.planning.learning import Learner

    learnt: list[Any] = []  # the passes themselves: held, their ids are not reused
    original = Learner.learn
    monkeypatch.setattr(Learner, "learn", lambda self, entry, p: (learnt.append(p), original(self, entry, p))[1])
    torch.manual_seed(0)
    model = models.stack(lambda: models.MLPBlock(16), n=4)()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with offrecomp.runtime(model, mode="auto", min_bytes=0) as rt:
        for step in range(3):
            for micro in range(4):
                model(torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(10 * step + micro))).backward()
            opt.step()
            opt.zero_grad()
    steps = rt.report().steps
    assert [s.passes for s in steps] == [4, 4, 4]
    assert len(learnt) == len({id(p) for p in learnt}), "a pass was learnt twice"


FAULT_STEPS = (0, 2, 6)  # auto: the measuring pass, the calibration pass, a planned pass


def loop_exception_mid_forward(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    torch.manual_seed(1)
    lm: Any = model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out: list[Snap] = []
    with _ctx(rt):
        for i in range(10):
            _FAULT["block"] = lm.blocks[1] if i in FAULT_STEPS else None
            try:
                _sgd_step(model, opt, _tokens(i, 16), out)
            except Boom:
                out.append({"boom": torch.tensor(i)})
                opt.zero_grad(set_to_none=True)
            finally:
                _FAULT["block"] = None
    return [*out, _final(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_exception_mid_forward_then_training_continues(variant: str) -> None:
    rt = _run("fault_forward", loop_exception_mid_forward, variant)
    steps = rt.report().steps
    assert sum(s.passes for s in steps) == 10  # a failed pass joins the next step
    if variant.startswith("auto"):
        assert [s.phase for s in steps][-3:] == ["planned"] * 3, [s.phase for s in steps]


def loop_oom_retry(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """A block runs out of memory on steps 1 and 5; the loop catches it and retries the
    batch as two micro-batches of half the size (another signature)."""
    torch.manual_seed(1)
    lm: Any = model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out: list[Snap] = []
    with _ctx(rt):
        for i in range(9):
            x = _tokens(i, 16, 4)
            _FAULT.update(block=lm.blocks[0] if i in (1, 5) else None, exc=torch.OutOfMemoryError)
            try:
                _sgd_step(model, opt, x, out)
            except torch.OutOfMemoryError:
                _FAULT["block"] = None
                opt.zero_grad(set_to_none=True)
                for half in x.chunk(2):
                    (model(half) / 2).backward()
                out.append(_snap(model))
                opt.step()
                opt.zero_grad(set_to_none=True)
            finally:
                _FAULT.update(block=None, exc=None)
    return [*out, _final(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_out_of_memory_then_retry_with_smaller_batches(variant: str) -> None:
    rt = _run("oom_retry", loop_oom_retry, variant)
    if variant.startswith("auto"):
        assert rt.report().steps[-1].phase == "planned"


def loop_exception_mid_backward(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """A gradient hook raises (a NaN guard, say) during backward on some steps."""
    torch.manual_seed(1)
    lm: Any = model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fail = {"on": False}

    def guard(g: torch.Tensor) -> torch.Tensor:
        if fail["on"]:
            raise Boom("gradient guard")
        return g

    handle = lm.blocks[0].fc1.weight.register_hook(guard)
    out: list[Snap] = []
    try:
        with _ctx(rt):
            for i in range(10):
                fail["on"] = i in FAULT_STEPS
                try:
                    _sgd_step(model, opt, _tokens(i, 16), out)
                except Boom:
                    out.append({"boom": torch.tensor(i)})
                    opt.zero_grad(set_to_none=True)
    finally:
        handle.remove()
    return [*out, _final(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_exception_mid_backward_then_training_continues(variant: str) -> None:
    rt = _run("fault_backward", loop_exception_mid_backward, variant)
    if variant.startswith("auto"):
        assert rt.report().steps[-1].phase == "planned"


def loop_enter_per_step(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """One ``with`` per step (the optimizer steps inside on even steps, outside on odd
    ones; an exception leaves the ``with`` mid-forward on step 3 and mid-backward on
    step 5), then a step outside the runtime, ``rt.close()``, and the same runtime again
    around a block of steps."""
    torch.manual_seed(1)
    lm: Any = model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fail = {"on": False}

    def guard(g: torch.Tensor) -> torch.Tensor:
        if fail["on"]:
            raise Boom("gradient guard")
        return g

    handle = lm.blocks[0].fc1.weight.register_hook(guard)
    out: list[Snap] = []
    for i in range(7):
        try:
            with _ctx(rt):
                _FAULT["block"] = lm.blocks[0] if i == 3 else None
                fail["on"] = i == 5
                loss = model(_tokens(i, 16))
                loss.backward()
                out.append(_snap(model, loss))
                if i % 2 == 0:
                    opt.step()
        except Boom:
            out.append({"boom": torch.tensor(i)})
            opt.zero_grad(set_to_none=True)
            continue
        finally:
            _FAULT["block"] = None
            fail["on"] = False
        if i % 2 == 1:
            opt.step()
        opt.zero_grad(set_to_none=True)
    handle.remove()
    for i in range(7, 8):  # no runtime
        _sgd_step(model, opt, _tokens(i, 16), out)
    if rt is not None:
        rt.close()
    with _ctx(rt):
        for i in range(8, 11):
            _sgd_step(model, opt, _tokens(i, 16), out)
    return [*out, _final(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_enter_and_leave_the_runtime_every_step(variant: str) -> None:
    rt = _run("enter_per_step", loop_enter_per_step, variant)
    assert sum(s.passes for s in rt.report().steps) == 10  # the failed pass is counted too
    if variant.startswith("auto"):
        assert rt.report().steps[-1].phase == "planned"


def loop_forward_inside_backward_outside(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """The ``with`` wraps only the forward: backward runs after the runtime has exited.

    Gradients are exact, but each step's record closes at the exit, before its backward
    (a recompute step reports 0 replays), and auto never completes a measuring pass
    (``Planner.end_pass`` discards a pass whose backward had not finished), so every step
    measures again: full recompute under the op recorder, with no warning."""
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out: list[Snap] = []
    for i in range(6):
        with _ctx(rt):
            loss = model(_tokens(i, 16))
        loss.backward()
        out.append(_snap(model, loss))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [*out, _final(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_inside_the_context_backward_outside(variant: str) -> None:
    _run("backward_outside", loop_forward_inside_backward_outside, variant, backward_inside=False)


def _two_models() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    return LM(), LM(layers=3, h=48, heads=4)


def loop_two_models(models: tuple[nn.Module, nn.Module], rts: tuple[Any, Any]) -> list[Snap]:
    torch.manual_seed(1)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    out: list[Snap] = []
    for i in range(5):
        for j, (m, rt, opt) in enumerate(zip(models, rts, opts)):
            with _ctx(rt):
                _sgd_step(m, opt, _tokens(10 * i + j, 16 + 4 * j), out)
    return [*out, _final(models[0]), _final(models[1])]


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_models_with_their_own_runtimes_alternately(variant: str) -> None:
    a, b = _two_models()
    if "two_models" not in _REFS:
        _REFS["two_models"] = loop_two_models((copy.deepcopy(a), copy.deepcopy(b)), (None, None))
    budgets: list[int | None] = [None, None]
    if variant in ("auto_tight", "auto_serve"):
        if "two_models.a" not in _BUDGETS:
            pa, pb = copy.deepcopy(a), copy.deepcopy(b)
            keeps = (variant_runtime(pa, "keep"), variant_runtime(pb, "keep"))
            loop_two_models((pa, pb), keeps)
            for key, k in zip(("two_models.a", "two_models.b"), keeps):
                _BUDGETS[key] = k.report().steps[0].peak_activation_bytes // 2
        budgets = [_BUDGETS["two_models.a"], _BUDGETS["two_models.b"]]
    ma, mb = copy.deepcopy(a), copy.deepcopy(b)
    rts = (variant_runtime(ma, variant, budgets[0]), variant_runtime(mb, variant, budgets[1]))
    got = loop_two_models((ma, mb), rts)
    assert_bitwise(_REFS["two_models"], got)
    for rt in rts:
        steps = rt.report().steps
        assert len(steps) == 5
        if variant.startswith("auto"):
            assert [s.phase for s in steps][:3] == ["measure", "calibrate", "planned"]
            assert steps[-1].phase == "planned"
        _assert_no_leak(rt)


def _two_models_in_one() -> nn.Module:
    a, b = _two_models()
    return nn.ModuleDict({"a": a, "b": b})


def loop_two_models_one_runtime(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """Two models trained together (a GAN's or a distillation's), one runtime over a
    container of both: runtimes do not nest, and the error says to do this."""
    a, b = model["a"], model["b"]  # type: ignore[index]

    def step(i: int, out: list[Snap]) -> None:
        la = a(_tokens(i, 16))
        lb = b(_tokens(100 + i, 20))
        (la + 0.5 * lb).backward()
        out.append(_snap(model, la, lb=lb))

    return _sgd_loop(model, rt, 5, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_models_trained_together_under_one_runtime(variant: str) -> None:
    rt = _run("two_in_one", loop_two_models_one_runtime, variant, factory=_two_models_in_one)
    assert rt.regions == ["a.blocks.0", "a.blocks.1", "b.blocks.0", "b.blocks.1", "b.blocks.2"]


class _Gen(nn.Module):
    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(8, h)
        self.blocks = nn.ModuleList(Block(h, 4, 0.1) for _ in range(2))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.inp(z)
        for blk in self.blocks:
            x = blk(x)
        return x


class _Disc(nn.Module):
    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(h, 4, 0.1) for _ in range(3))
        self.out = nn.Linear(h, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return self.out(x).mean(dim=(1, 2))


def _gan() -> nn.Module:
    torch.manual_seed(0)
    return nn.ModuleDict({"gen": _Gen(), "disc": _Disc()})


def loop_gan(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """A GAN as PyTorch's DCGAN example trains one, one runtime over a container of
    both: per iteration a discriminator pass on real data, one on generated data (the
    generator runs in it), then a generator pass through the discriminator; two
    optimizers. The three passes differ in what runs."""
    gen, disc = model["gen"], model["disc"]  # type: ignore[index]
    torch.manual_seed(1)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.05)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.05)
    out: list[Snap] = []
    with _ctx(rt):
        for i in range(8):
            g = torch.Generator().manual_seed(4000 + i)
            real = torch.randn(4, 12, 32, generator=g)
            z = torch.randn(4, 12, 8, generator=g)
            d_real = F.softplus(-disc(real)).mean()
            d_real.backward()
            fake = gen(z)
            d_fake = F.softplus(disc(fake.detach())).mean()
            d_fake.backward()
            opt_d.step()
            opt_d.zero_grad(set_to_none=True)
            g_loss = F.softplus(-disc(fake)).mean()
            g_loss.backward()
            out.append(_snap(model, g_loss, d=d_real + d_fake))
            opt_g.step()
            opt_g.zero_grad(set_to_none=True)
            disc.zero_grad(set_to_none=True)
    return [*out, _final(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_gan_under_one_runtime(variant: str) -> None:
    """NOTE [Container roots]: each kind of pass has its own signature, named by the
    models it ran (NOTE [Pass signatures]: the pass on generated data runs the generator,
    then the discriminator), and its own plan, rather than one "unknown" profile that each
    pass type extends and one plan solved for the longest."""
    rt = _run("gan", loop_gan, variant, factory=_gan)
    steps = rt.report().steps
    assert len(steps) == 16  # two optimizer steps per iteration
    if variant.startswith("auto"):
        entries = rt.planner.entries
        disc = "train|disc:(4, 12, 32):float32:cpu"
        gen = f"train|gen:(4, 12, 8):float32:cpu + {disc}"
        assert sorted(entries) == [disc, gen]
        assert all(e.plan is not None for e in entries.values())
        assert {k[0] for k in entries[disc].structures} == {"disc.blocks.0", "disc.blocks.1", "disc.blocks.2"}
        assert {k[0] for k in entries[gen].structures} == {
            "gen.blocks.0", "gen.blocks.1", "disc.blocks.0", "disc.blocks.1", "disc.blocks.2"
        }
        assert [s.phase for s in steps][-4:] == ["planned"] * 4


def loop_runtime_replaced(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """A first runtime for five steps, closed; a second one (the same settings) on the
    same model for five more."""
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out: list[Snap] = []
    with _ctx(rt):
        for i in range(4):
            _sgd_step(model, opt, _tokens(i, 16), out)
    second = None
    if rt is not None:
        rt.close()
        second = offrecomp.runtime(model, **_settings(rt))
    with _ctx(second):
        for i in range(4, 8):
            _sgd_step(model, opt, _tokens(i, 16), out)
    if second is not None:
        steps = second.report().steps
        assert len(steps) == 4
        if second.config.mode == "auto":
            assert steps[-1].phase == "planned"
        _assert_no_leak(second)
    return [*out, _final(model)]


def _settings(rt: offrecomp.Runtime) -> dict[str, Any]:
    cfg = rt.config
    kw: dict[str, Any] = {"mode": cfg.mode, "min_bytes": 0}
    if cfg.budget is not None:
        kw["budget"] = cfg.budget.nbytes
    if cfg.replay_op_us is not None:
        kw["replay_op_us"] = cfg.replay_op_us
    return kw


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_new_runtime_on_the_same_model(variant: str) -> None:
    _run("runtime_replaced", loop_runtime_replaced, variant)


def loop_input_requires_grad(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """Steps alternate: tokens in (the input needs no grad), and embeddings as a leaf that
    requires grad (saliency): the gradient w.r.t. the input is compared too.

    offload fails (AssertionError in backward): ``lm.emb(idx)`` saves ``idx`` in a graph
    that dies at once, cross_entropy saves it again; see
    ``test_offload_storage_saved_again_after_its_first_saves_were_freed``."""
    lm: Any = model

    def step(i: int, out: list[Snap]) -> None:
        idx = _tokens(i, 16)
        if i % 2 == 0:
            _forward_backward(model, idx, out)
        else:
            e = lm.emb(idx).detach().requires_grad_(True)  # a leaf
            loss = model(idx, embeds=e)
            loss.backward()
            assert e.grad is not None
            out.append(_snap(model, loss, input_grad=e.grad))

    return _sgd_loop(model, rt, 8, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_input_that_requires_grad(variant: str) -> None:
    _run("input_grad", loop_input_requires_grad, variant)


def loop_adversarial(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """FGSM adversarial training: the gradient w.r.t. the input embeddings only
    (``autograd.grad``, a pass whose backward computes no parameter gradient), then a
    training pass on the perturbed embeddings."""
    lm: Any = model

    def step(i: int, out: list[Snap]) -> None:
        idx = _tokens(i, 16)
        with torch.no_grad():
            e = lm.emb(idx)
        e.requires_grad_(True)
        (g,) = torch.autograd.grad(model(idx, embeds=e), e)
        loss = model(idx, embeds=(e + 0.01 * g.sign()).detach())
        loss.backward()
        out.append(_snap(model, loss, input_grad=g))

    return _sgd_loop(model, rt, 5, step)


@pytest.mark.parametrize("variant", VARIANTS)
def test_adversarial_input_gradient_then_training(variant: str) -> None:
    _run("adversarial", loop_adversarial, variant)


def loop_freeze_midway(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """zero_grad(set_to_none=False) with momentum; block 1 frozen after three steps;
    after six, the whole model is frozen and only a prompt (a learnt bias added to the
    input embeddings, outside the model) trains: prompt tuning."""
    torch.manual_seed(1)
    lm: Any = model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    prompt = nn.Parameter(torch.zeros(16, 32))
    opt_prompt = torch.optim.SGD([prompt], lr=0.1)
    out: list[Snap] = []
    with _ctx(rt):
        for i in range(9):
            if i == 3:
                lm.blocks[1].requires_grad_(False)
            if i == 6:
                model.requires_grad_(False)
                model.zero_grad(set_to_none=True)
                opt = opt_prompt
            idx = _tokens(i, 16)
            if i < 6:
                loss = model(idx)
            else:
                loss = model(idx, embeds=lm.emb(idx) + prompt)
            loss.backward()
            out.append(_snap(model, loss, **({"prompt_grad": prompt.grad} if i >= 6 else {})))
            opt.step()
            opt.zero_grad(set_to_none=False)
    return [*out, _final(model), {"prompt": prompt.detach().clone()}]


@pytest.mark.parametrize("variant", VARIANTS)
def test_zero_grad_to_zero_and_freezing_a_block_midway(variant: str) -> None:
    rt = _run("freeze", loop_freeze_midway, variant)
    if variant.startswith("auto"):
        assert rt.report().steps[-1].phase == "planned"


def loop_manual_update(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    """No torch optimizer: a hand-written SGD update under no_grad (every pass a step)."""
    torch.manual_seed(1)
    out: list[Snap] = []
    with _ctx(rt):
        for i in range(5):
            loss = model(_tokens(i, 16))
            loss.backward()
            out.append(_snap(model, loss))
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
    return [*out, _final(model)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_hand_written_update_without_an_optimizer(variant: str) -> None:
    rt = _run("manual_update", loop_manual_update, variant)
    assert len(rt.report().steps) == 5


# ----------------------------------------------------------- reduced failing cases
# The smallest loops that still fail, reduced from the zoo above.


class ProbeBlock(nn.Module):
    """Runs a probe on ``h`` whose graph is dropped at once, then uses ``h`` for real."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x)
        self.lin(h)  # saves h (for the weight gradient); the result is discarded
        return x + self.lin(h)  # saves h again, in the same region call


@pytest.mark.parametrize("where", ["root", "region"])
def test_offload_storage_saved_again_after_its_first_saves_were_freed(where: str) -> None:
    """input_grad-offload, reduced. ``lm.emb(idx).detach()`` saves ``idx`` (the
    embedding's indices) in a graph that dies at once; cross_entropy then saves ``idx``
    again in the same pass. The first save's storage record was offloaded, and freed
    when its last handle died (its copy gone, ``released``), but it stays in
    ``call.by_ptr`` and its storage is still alive, so the second save is attached to
    the released record: its backward has nothing to fetch (AssertionError in
    ``Placer.unpack``). Both a root storage and a region storage fail."""
    torch.manual_seed(0)
    if where == "root":
        model: nn.Module = nn.Linear(8, 8)
        x = torch.randn(4, 8)

        def step(m: nn.Module) -> None:
            m(x)  # x saved for the weight gradient; the graph is dropped at once
            m(x).sum().backward()  # x saved again in the same pass
    else:
        model = nn.Sequential(ProbeBlock(), ProbeBlock())
        x = torch.randn(4, 8)

        def step(m: nn.Module) -> None:
            m(x).sum().backward()

    ref = copy.deepcopy(model)
    step(ref)
    m = copy.deepcopy(model)
    with offrecomp.runtime(m, mode="offload", min_bytes=0):
        step(m)
    for (n, p), q in zip(ref.named_parameters(), m.parameters()):
        assert q.grad is not None and torch.equal(p.grad, q.grad), n


class DropBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.dropout(self.fc2(torch.tanh(self.fc1(x))), 0.1, self.training)


def test_dispatch_replay_keeps_placeholders_with_dropout(caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Placeholder guard] and dropout. On CPU ``F.dropout`` is
    ``empty_like(y).bernoulli_(1 - p).div_(1 - p)`` then ``y * noise``; only ``noise`` is
    saved, so replaying it needs ``empty_like`` but not the value of ``y`` (fc2's output),
    which gets a placeholder. ``empty_like`` reads only the metadata of its input, so the
    guard lets it take the placeholder: no divergence, and the region keeps its
    placeholders."""
    torch.manual_seed(0)
    model = nn.Sequential(DropBlock(), DropBlock())
    x = torch.randn(4, 8)
    ref = copy.deepcopy(model)
    torch.manual_seed(1)
    ref(x).square().sum().backward()
    m = copy.deepcopy(model)
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(
        m, mode="auto", min_bytes=0, replay_op_us=0
    ):
        torch.manual_seed(1)
        m(x).square().sum().backward()  # the measuring pass: everything dropped, replayed
    for (n, p), q in zip(ref.named_parameters(), m.parameters()):
        assert torch.equal(p.grad, q.grad), n
    diverged = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    assert not diverged, diverged[0]


def _r1_loop(
    model: nn.Module, rt: Any = None, steps: int = 6, hooks: Callable[[], Any] = contextlib.nullcontext
) -> list[dict[str, torch.Tensor]]:
    """A discriminator step with an R1 penalty: the gradient of the output with respect
    to the input, with create_graph (under ``hooks``), then the loss that holds it,
    differentiated again."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dev = next(model.parameters()).device
    out = []
    with rt if rt is not None else contextlib.nullcontext():
        for s in range(steps):
            x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(s)).to(dev).requires_grad_()
            d = model(x)
            with hooks():
                (g,) = torch.autograd.grad(d, x, create_graph=True)
            (d + 10 * g.square().sum()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return out


def _r1_model() -> nn.Module:
    torch.manual_seed(0)
    return models.Stack([models.MLPBlock(32) for _ in range(3)])


@pytest.mark.parametrize("mode", ["recompute", "auto"])
@pytest.mark.parametrize("hooks", ["none", "save_on_cpu"])
def test_gradient_penalty_is_one_pass_with_two_backwards(mode: str, hooks: str) -> None:
    """NOTE [Double backward]: the penalty's first backward does not end the pass, so
    the penalty's ops and the second backward, with its replays, belong to the pass the
    plan saw: each step is one pass, and its replays (one per region in each backward
    under recompute) are counted. Also with that backward under the loop's own
    saved-tensor hooks (``save_on_cpu``), which take its saves: each step made two
    passes, the second of signature "unknown", planned apart."""
    model = _r1_model()
    pair = torch.autograd.graph.save_on_cpu if hooks == "save_on_cpu" else contextlib.nullcontext
    ref = _r1_loop(copy.deepcopy(model), hooks=pair)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    assert_bitwise(ref, _r1_loop(m, rt, hooks=pair))
    recs = rt.report().steps
    assert all(s.passes == 1 for s in recs), [s.passes for s in recs]
    assert len(rt.planner.entries) == (1 if mode == "auto" else 0), list(rt.planner.entries)
    if mode == "recompute":
        assert all(s.replays == 2 * 3 for s in recs)
    else:
        assert [s.phase for s in recs[:2]] == ["measure", "calibrate"]
        assert all(s.phase == "planned" for s in recs[2:])


def test_gradient_penalty_over_budget_says_why(caplog: pytest.LogCaptureFixture) -> None:
    """The graph the first backward makes holds what its replays regenerate, which the
    plan does not count: a tight budget is exceeded, and a warning says why, once."""
    model = _r1_model()
    probe = copy.deepcopy(model)
    keep = offrecomp.runtime(probe, mode="keep", min_bytes=0)
    _r1_loop(probe, keep, steps=1)
    budget = keep.report().steps[0].peak_activation_bytes // 2
    ref = _r1_loop(copy.deepcopy(model), steps=8)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget=budget)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        assert_bitwise(ref, _r1_loop(m, rt, steps=8))
    recs = rt.report().steps
    assert any(s.phase == "planned" and s.peak_activation_bytes > 1.05 * budget for s in recs)
    over = [r for r in caplog.records if "for a budget of" in r.getMessage()]
    assert len(over) == 1 and "second backward" in over[0].getMessage()


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["recompute", "offload", "auto"])
def test_gradient_penalty_on_cuda(mode: str) -> None:
    """NOTE [Double backward] on the GPU, where both backwards run on autograd's device
    thread: one pass per step, bitwise like plain where plain is reproducible."""
    model = _r1_model().cuda()
    ref = _r1_loop(copy.deepcopy(model))
    if not all(torch.equal(a[k], b[k]) for a, b in zip(ref, _r1_loop(copy.deepcopy(model))) for k in a):
        pytest.skip("plain CUDA runs differ run to run (nondeterministic kernels)")
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    assert_bitwise(ref, _r1_loop(m, rt))
    assert all(s.passes == 1 for s in rt.report().steps)


# NOTE [Plan cache growth]: nine shapes of 72 tokens, none covering another, in turn:
# one more than the plan cache holds by default
ROUND_ROBIN = [(b, 72 // b) for b in (1, 2, 3, 4, 6, 8, 9, 12, 18)] * 4


def loop_round_robin(model: nn.Module, rt: offrecomp.Runtime | None) -> list[Snap]:
    def step(i: int, out: list[Snap]) -> None:
        b, t = ROUND_ROBIN[i]
        _forward_backward(model, _tokens(i, t, b), out)

    return _sgd_loop(model, rt, len(ROUND_ROBIN), step)


def test_shapes_recurring_beyond_the_plan_cache_grow_it(caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Plan cache growth]: with the bound of 8 left as it is, the ninth shape's plan
    evicted the next one's, and every step measured again; the first comes back, the
    cache holds 16, and each shape plans from its third round on."""
    with caplog.at_level(logging.INFO, logger="offrecomp"):
        rt = _run("round_robin", loop_round_robin, "auto_tight")
    by_sig = _phases_by_signature(rt)
    assert len(by_sig) == 9
    for sig, phases in by_sig.items():
        assert phases.count("measure") <= 2 and phases[-1] == "planned", (sig, phases)
    assert rt.planner.cache.bound() == 16
    assert sum("the cache now holds up to 16 plans" in r.getMessage() for r in caplog.records) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "plan cache" in r.getMessage()]


def test_shapes_recurring_beyond_a_plan_cache_set_are_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """A bound set stays: the shapes measure again and again (gradients bitwise), and one
    warning names the setting to raise."""
    torch.manual_seed(0)
    model = LM()
    ref = loop_round_robin(copy.deepcopy(model), None)
    rt = variant_runtime(model, "auto", plan_cache_size=8)
    assert_bitwise(ref, loop_round_robin(model, rt))
    assert rt.planner.cache.bound() == 8
    by_sig = _phases_by_signature(rt)
    assert all(phases.count("measure") >= 2 for phases in by_sig.values()), by_sig
    warned = [r.getMessage() for r in caplog.records if "came back after the full plan cache" in r.getMessage()]
    assert len(warned) == 1 and "OFFRECOMP_PLAN_CACHE" in warned[0], warned
