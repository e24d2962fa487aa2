"""torch.compile: a compiled block, wrapped or compiled in place, trains correctly and
replays its compiled graph (handled as opaque); blocks that run inside a compiled model
are kept, and the model still compiles to the graphs it compiles to without the runtime."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

import offrecomp
import offrecomp.diagnostics
from tests import models
from tests.helpers import (
    assert_bitwise,
    batch_on,
    tight_budget,
    train,
    train_bitwise,
    twin,
    variant_runtime,
)


def _compiled_gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    m = models.GPT(layers=2, h=32, heads=4, p=0.0)
    for i, blk in enumerate(m.blocks):
        m.blocks[i] = torch.compile(blk, backend="aot_eager", dynamic=False)
    return m


@pytest.mark.parametrize("mode", ["recompute", "auto", "offload"])
def test_compiled_blocks_train_like_the_plain_compiled_model(mode: str) -> None:
    torch._dynamo.reset()
    model = _compiled_gpt()

    def batch(s: int) -> torch.Tensor:
        return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s))

    ref = train(twin(model), batch, steps=3)
    m = twin(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    assert rt.regions == ["blocks.0", "blocks.1"]
    got = train(m, batch, rt, steps=3)
    assert_bitwise(ref, got)
    if mode == "auto":
        entry = next(iter(rt.planner.entries.values()))
        assert all(st.opaque for st in entry.structures.values())  # compiled code is opaque
    if mode == "recompute":
        assert rt.report().steps[-1].replays == 2
    if mode == "offload":
        assert all(s.offloaded_bytes > 0 and s.replays == 0 for s in rt.report().steps)


def _whole(m: torch.nn.Module) -> torch.nn.Module:
    return torch.compile(m, backend="aot_eager")


def _whole_in_place(m: torch.nn.Module) -> torch.nn.Module:
    m.compile(backend="aot_eager")
    return m


def _blocks_in_place(m: torch.nn.Module, backend: Any = "aot_eager") -> torch.nn.Module:
    for blk in m.blocks:  # type: ignore[union-attr]
        blk.compile(backend=backend)  # as torchtune compiles its layers
    return m


def _forward_compiled(m: torch.nn.Module) -> torch.nn.Module:
    """``model.forward = torch.compile(model.forward)``, as Lightning compiles a module."""
    m.forward = torch.compile(m.forward, backend="aot_eager")  # type: ignore[method-assign]
    return m


def _blocks_and_whole_in_place(m: torch.nn.Module) -> torch.nn.Module:
    return _whole_in_place(_blocks_in_place(m))


class _Counting:
    """A torch.compile backend (aot_eager) that counts the graphs it makes and runs."""

    def __init__(self) -> None:
        self.made = self.runs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        from torch._dynamo.backends.debugging import aot_eager

        self.made += 1
        compiled = aot_eager(gm, example_inputs)

        def run(*args: Any) -> Any:
            self.runs += 1
            return compiled(*args)

        return run


def _batch(s: int) -> torch.Tensor:
    return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s))


@pytest.mark.parametrize("variant", ["recompute", "auto", "auto_serve"])
def test_blocks_compiled_in_place_replay_their_compiled_graph(variant: str) -> None:
    """block.compile() (torchtune's per-layer compile): the runtime wraps the compiled
    call, not the forward inside it, so a replay runs the same compiled graph; dropout
    included, gradients equal the plain compiled model's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.1)
    ref = train(_blocks_in_place(twin(base)), _batch, steps=4)
    torch._dynamo.reset()
    m = _blocks_in_place(twin(base))
    compiled_calls = [blk._compiled_call_impl for blk in m.blocks]  # type: ignore[union-attr]
    budget = tight_budget(twin(base), _batch) if variant == "auto_serve" else None  # copies: eager
    rt = train_bitwise(m, _batch, variant, budget, ref)
    steps = rt.report().steps
    if variant == "recompute":
        assert all(s.replays == 2 for s in steps)
    else:
        entry = next(iter(rt.planner.entries.values()))
        assert all(st.opaque for st in entry.structures.values())  # compiled code is opaque
        assert rt.explain().count("opaque: a replay reruns its forward") == 2
    if variant == "auto_serve":
        assert any(s.phase == "planned" and s.recomputed_bytes > 0 for s in steps)
    assert [blk._compiled_call_impl for blk in m.blocks] == compiled_calls  # type: ignore[union-attr]


def test_a_block_compiled_after_the_runtime_was_built() -> None:
    """The compiled state is read when the runtime is entered, not when it is built."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.0)
    ref = train(_blocks_in_place(twin(base)), _batch, steps=2)
    torch._dynamo.reset()
    m = twin(base)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    _blocks_in_place(m)
    got = train(m, _batch, rt, steps=2)
    assert_bitwise(ref, got)
    assert all(s.replays == 2 for s in rt.report().steps)


def _compiled_midway(variant: str, compile_blocks: Callable[[torch.nn.Module], None], at: int, entries: int = 1) -> Any:
    """Six SGD steps of a 2-block GPT plainly, then under ``variant`` in ``entries``
    entries of one runtime, ``compile_blocks`` applied before step ``at`` in both runs:
    gradients bitwise; the runtime."""
    import copy

    def loop(m: torch.nn.Module, rt: Any) -> list[dict[str, torch.Tensor]]:
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        out = []
        per = 6 // entries
        for entry in range(entries):
            with rt if rt is not None else contextlib.nullcontext():
                for s in range(per * entry, per * entry + per):
                    if s == at:
                        compile_blocks(m)
                    torch.manual_seed(s)
                    m(_batch(s)).backward()
                    out.append({n: q.grad.clone() for n, q in m.named_parameters() if q.grad is not None})
                    opt.step()
                    opt.zero_grad(set_to_none=True)
        return out

    torch._dynamo.reset()
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.1)
    budget = tight_budget(twin(base), _batch) if variant in ("auto_tight", "auto_serve") else None
    ref = loop(copy.deepcopy(base), None)
    torch._dynamo.reset()
    m = copy.deepcopy(base)
    rt = variant_runtime(m, variant, budget)
    assert_bitwise(ref, loop(m, rt))
    return rt


@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve"])
def test_blocks_compiled_in_place_while_entered_still_replay(variant: str) -> None:
    """``block.compile()`` inside ``with rt:`` (after some eager steps): the compiled call
    went past the wrapped forward, so the blocks were no longer replayed (recompute booked
    more, auto's plan ran over its budget, silently). The wrapper moves onto the compiled
    call at the next root forward."""
    steps = _compiled_midway(variant, _blocks_in_place, at=2).report().steps
    if variant == "recompute":
        assert [s.replays for s in steps] == [2] * 6
    else:
        # a budget half the keep peak: the plan replays both blocks, after the compile too
        # (the compile makes a new signature: measure, calibrate, planned again)
        assert steps[-1].phase == "planned", [s.phase for s in steps]
        assert all(s.replays == 2 and s.recomputed_bytes > 0 for s in steps[2:]), [(s.phase, s.replays) for s in steps]


@pytest.mark.parametrize(("variant", "when"), [("recompute", "entered"), ("recompute", "between"), ("auto_serve", "entered")])
def test_blocks_wrapped_while_entered_still_replay(variant: str, when: str) -> None:
    """``model.blocks[i] = torch.compile(block)`` inside ``with rt:`` (after some eager
    steps) or between two entries: the block's wrapper ran inside the compiled frame,
    where it runs the plain forward, so the blocks were never replayed again, silently.
    The compiled wrapper is the region from the next root forward (or entry) on."""
    rt = _compiled_midway(variant, _blocks_wrapped, at=2 if when == "entered" else 3, entries=2)
    steps = rt.report().steps
    if variant == "recompute":
        assert [s.replays for s in steps] == [2] * 6
        assert all(s.recomputed_bytes > 0 for s in steps)
    else:
        assert steps[-1].phase == "planned" and steps[-1].recomputed_bytes > 0, [s.phase for s in steps]
    assert rt.regions == ["blocks.0", "blocks.1"]


def test_a_layer_compiled_in_place_inside_a_block_makes_the_block_opaque() -> None:
    """A submodule compiled in place runs a compiled graph inside an eager block: the
    op recording cannot vouch for it, so the block replays whole."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.1)

    def fc1_in_place(m: torch.nn.Module) -> torch.nn.Module:
        for blk in m.blocks:  # type: ignore[union-attr]
            blk.fc1.compile(backend="aot_eager")
        return m

    ref = train(fc1_in_place(twin(base)), _batch, steps=4)
    torch._dynamo.reset()
    m = fc1_in_place(twin(base))
    rt = train_bitwise(m, _batch, "auto_serve", tight_budget(twin(base), _batch), ref)  # copies: eager
    entry = next(iter(rt.planner.entries.values()))
    assert all(st.opaque for st in entry.structures.values())
    assert all(s.served_ops == 0 for s in rt.report().steps)


def _blocks_wrapped(m: torch.nn.Module, backend: Any = "aot_eager") -> torch.nn.Module:
    for i, blk in enumerate(m.blocks):  # type: ignore[union-attr, arg-type]
        m.blocks[i] = torch.compile(blk, backend=backend)  # type: ignore[index, operator]
    return m


@pytest.mark.parametrize("how", [_whole, _whole_in_place, _blocks_and_whole_in_place, _blocks_in_place, _blocks_wrapped])
def test_the_runtime_adds_no_graph_to_a_compiled_model(how: Callable[..., torch.nn.Module]) -> None:
    """Dynamo compiles the model into the graphs it compiles to without the runtime, and
    every step runs them: the runtime's wrappers and bookkeeping are never traced (no
    graph break, no recompile), and the measuring pass does not make dynamo give up on a
    compiled block (its op recorder is a dispatch mode, under which dynamo would)."""
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.0)

    def graphs(rt_mode: str | None) -> tuple[int, int, int]:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        counting = _Counting()
        per_block = how in (_blocks_in_place, _blocks_wrapped)
        m = how(twin(base), backend=counting) if per_block else _with_backend(how, counting)(twin(base))
        rt = offrecomp.runtime(m, mode=rt_mode, min_bytes=0) if rt_mode else None
        train(m, _batch, rt, steps=4)  # auto: measure, calibrate, planned, planned
        return counting.made, counting.runs, sum(torch._dynamo.utils.counters["graph_break"].values())

    plain_made, plain_runs, plain_breaks = graphs(None)
    assert plain_made >= 1 and plain_runs >= 4
    for mode in ("recompute", "auto"):
        made, runs, breaks = graphs(mode)
        assert made == plain_made, mode
        assert runs >= plain_runs, mode  # and more where a replay reran a compiled block
        assert breaks == plain_breaks, mode


@pytest.mark.parametrize("how", [_whole, _whole_in_place])
@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_compiled_model_entered_per_step_compiles_once(how: Callable[..., torch.nn.Module], mode: str) -> None:
    """NOTE [Wrappers kept across entries]: dynamo guards on each block's ``forward`` slot,
    which holds the runtime's wrapper while entered. Entered per step (a loop that builds
    its runtime once and enters it per step; a trainer's fit() called again), 10 steps:
    one wrapper per block across the entries, so the graphs plain makes, run at every
    step, and the compiled numerics. A new wrapper per entry would recompile at each step
    and, past dynamo's recompile limit (8), run the model eagerly."""
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.0)

    def run(rt_mode: str | None) -> tuple[list[torch.Tensor], int, int]:
        torch._dynamo.reset()
        counting = _Counting()
        m = _with_backend(how, counting)(twin(base))
        rt = offrecomp.runtime(m, mode=rt_mode, min_bytes=0, budget="50%") if rt_mode else None
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        grads: list[torch.Tensor] = []
        for step in range(10):
            with rt if rt is not None else contextlib.nullcontext():
                m(_batch(step)).backward()
            grads += [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]
            opt.step()
            opt.zero_grad()
        return grads, counting.made, counting.runs

    ref, made, runs = run(None)
    got, made_rt, runs_rt = run(mode)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert made_rt == made and runs_rt >= runs >= 10, (made, runs, made_rt, runs_rt)


def _with_backend(how: Callable[..., torch.nn.Module], backend: Any) -> Callable[[torch.nn.Module], torch.nn.Module]:
    def go(m: torch.nn.Module) -> torch.nn.Module:
        if how is _whole:
            return torch.compile(m, backend=backend)
        if how is _whole_in_place:
            m.compile(backend=backend)
            return m
        _blocks_in_place(m, backend)
        m.compile(backend=backend)
        return m

    return go


@pytest.mark.parametrize("in_place", [False, True], ids=["torch.compile(model)", "model.compile()"])
@pytest.mark.parametrize("mode", ["keep", "auto"])
def test_a_model_compiled_whole_with_fullgraph_trains(in_place: bool, mode: str) -> None:
    """The root's wrapper sits outside the model's compiled frame (the wrapper's forward
    slot, the compiled call of a model compiled in place): inside it, dynamo met a
    frame it must not trace, broke the graph there, and ``fullgraph=True`` raised
    Unsupported at the first forward."""

    def compiled(m: torch.nn.Module) -> torch.nn.Module:
        if in_place:
            m.compile(backend="aot_eager", fullgraph=True)
            return m
        return torch.compile(m, backend="aot_eager", fullgraph=True)

    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.0)
    torch._dynamo.reset()
    ref = train(compiled(twin(base)), _batch, steps=3)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    m = compiled(twin(base))
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, budget="50%")
    assert_bitwise(ref, train(m, _batch, rt, steps=3))
    assert not torch._dynamo.utils.counters["graph_break"]
    assert [s.phase for s in rt.report().steps] == (["keep"] * 3 if mode == "keep" else ["measure", "calibrate", "planned"])


@pytest.mark.parametrize(
    ("how", "mode"),
    [
        (_whole, "recompute"),
        (_whole, "auto"),
        (_whole, "offload"),
        (_whole_in_place, "recompute"),
        (_blocks_and_whole_in_place, "recompute"),
        (_forward_compiled, "recompute"),
        (_forward_compiled, "auto"),
    ],
    ids=[
        "whole-recompute", "whole-auto", "whole-offload", "whole_in_place-recompute", "blocks_and_whole-recompute",
        "forward_compiled-recompute", "forward_compiled-auto",
    ],
)
def test_blocks_inside_a_compiled_frame_are_kept_not_replayed(
    how: Callable[[torch.nn.Module], torch.nn.Module], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """torch.compile(model) and model.compile() trace each block's forward into the
    model's graph, whose saves a replay (eager) cannot reproduce: such a region is not a
    region. Its activations are kept (or offloaded), with a warning that says how to
    compile for recompute; gradients equal the plain compiled model's. So too under a
    compiled forward function (``_forward_compiled``), where the root's wrapper runs
    eagerly around it and the blocks' wrappers, traced into its graph, warn."""

    torch._dynamo.reset()
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.0)

    def batch(s: int) -> torch.Tensor:
        return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s))

    ref = train(how(twin(base)), batch, steps=2)
    torch._dynamo.reset()
    m = how(twin(base))
    offrecomp.diagnostics.clear_warnings()
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0, budget="50%")
        got = train(m, batch, rt, steps=2)
    assert_bitwise(ref, got)
    assert all(s.replays == 0 and s.recomputed_bytes == 0 for s in rt.report().steps)
    named = re.compile(r"(?<![\w.])blocks\.0, blocks\.1 run inside a torch\.compile'd frame")
    assert any(named.search(r.getMessage()) for r in caplog.records), [r.getMessage() for r in caplog.records]
    if mode != "auto":  # auto: no plan yet after 2 steps
        assert "blocks.1 ran inside a torch.compile'd caller" in rt.explain(), rt.explain()  # not "called no region"


def test_a_compiled_optimizer_step_does_not_trace_the_runtime() -> None:
    """``torch.compile(opt.step)``: the runtime's global optimizer-step post hook runs
    after the step, where dynamo traced it (one more graph break, some 27 more frames
    converted); it is excluded from tracing and still ends each step."""

    def run(mode: str | None) -> tuple[list[dict[str, torch.Tensor]], dict[str, int], Any]:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        torch.manual_seed(0)
        m = models.GPT(layers=2, h=32, heads=4, p=0.0)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        step = torch.compile(opt.step, backend="aot_eager")
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0) if mode else None
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            for s in range(3):
                m(_batch(s)).backward()
                step()
                opt.zero_grad(set_to_none=True)
                out.append({n: q.detach().clone() for n, q in m.named_parameters()})
        c = torch._dynamo.utils.counters
        return out, {"breaks": sum(c["graph_break"].values()), "frames": c["frames"]["total"]}, rt

    ref, plain, _ = run(None)
    got, counts, rt = run("recompute")
    assert_bitwise(ref, got)
    assert counts == plain
    assert [s.replays for s in rt.report().steps] == [2, 2, 2]  # three steps, each ended by the hook


@pytest.mark.parametrize("how", ["compiled_apart", "compiled_in_place_entered"])
@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_model_compiled_outside_the_runtime_compiles_as_without_it(
    how: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The runtime given the module while the loop calls ``torch.compile(model)`` made
    apart, or the model compiled in place inside ``with rt:``: dynamo traced the root
    wrapper and the runtime's bookkeeping (6 graphs for 1, 27 graph breaks; under auto
    44 graphs). The root wrapper returns the plain forward while traced, as a region's
    does: the graphs without the runtime, ``fullgraph=True`` included, the blocks kept
    with the warning."""
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.0)

    def run(rt_mode: str | None) -> tuple[list[dict[str, torch.Tensor]], int, Any]:
        torch._dynamo.reset()
        counting = _Counting()
        m = twin(base)
        rt = offrecomp.runtime(m, mode=rt_mode, min_bytes=0) if rt_mode else None
        call = m
        if how == "compiled_apart":
            call = torch.compile(m, backend=counting, fullgraph=True)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        out = []
        with rt if rt is not None else contextlib.nullcontext():
            if how == "compiled_in_place_entered":
                m.compile(backend=counting, fullgraph=True)
            for s in range(3):
                call(_batch(s)).backward()
                out.append({n: q.grad.clone() for n, q in m.named_parameters() if q.grad is not None})
                opt.step()
                opt.zero_grad(set_to_none=True)
        return out, counting.made, rt

    ref, plain_made, _ = run(None)
    offrecomp.diagnostics.clear_warnings()
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        got, made, rt = run(mode)
    assert_bitwise(ref, got)
    assert made == plain_made == 1
    assert len(rt.report().steps) == 3 and all(s.replays == 0 for s in rt.report().steps)
    assert any("blocks.0, blocks.1 run inside a torch.compile'd frame" in r.getMessage() for r in caplog.records)


class _StagedGPT(models.GPT):
    """The blocks run as one stage (an nn.Sequential the forward calls)."""

    def __init__(self) -> None:
        super().__init__(layers=2, h=32, heads=4, p=0.0)
        self.blocks = torch.nn.Sequential(*self.blocks)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.emb(idx))
        logits = self.head(self.ln(x))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten())


def test_blocks_inside_a_compiled_stage_are_kept_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A stage compiled in place traces its blocks into its graph: the runtime says so
    when it is entered, and keeps their activations."""

    torch._dynamo.reset()
    torch.manual_seed(0)
    base = _StagedGPT()

    def staged(m: torch.nn.Module) -> torch.nn.Module:
        m.blocks.compile(backend="aot_eager")  # type: ignore[operator]
        return m

    ref = train(staged(twin(base)), _batch, steps=2)
    torch._dynamo.reset()
    m = staged(twin(base))
    offrecomp.diagnostics.clear_warnings()
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
        assert rt.regions == ["blocks.0", "blocks.1"]
        got = train(m, _batch, rt, steps=2)
    assert_bitwise(ref, got)
    assert all(s.replays == 0 for s in rt.report().steps)
    assert [r.getMessage() for r in caplog.records if "blocks.0, blocks.1 run inside" in r.getMessage()]


@pytest.mark.cuda
@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
def test_blocks_compiled_in_place_with_inductor_on_cuda(variant: str) -> None:
    """torchtune's setup on the GPU: layers compiled in place by inductor, with dropout
    (philox in the compiled graph); a replay restores the CUDA generator, so it draws
    what the forward drew. Bitwise against the plain compiled run."""
    dev = torch.device("cuda")
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=64, heads=4, p=0.1).to(dev)
    batch = batch_on(dev, _batch)

    def inductor(m: torch.nn.Module) -> torch.nn.Module:
        return _blocks_in_place(m, "inductor")

    # Compiled after copying: a deep copy of a block compiled in place still calls the
    # original's _call_impl (torch.compile bound it), so helpers that copy are not used.
    ref = train(inductor(twin(base)), batch, steps=4)
    again = train(inductor(twin(base)), batch, steps=4)
    if not all(torch.equal(a[k], b[k]) for a, b in zip(ref, again) for k in a):
        pytest.skip("plain compiled CUDA runs differ run to run (nondeterministic kernels)")
    m = inductor(twin(base))
    budget = tight_budget(twin(base), batch) if variant == "auto_serve" else None
    rt = train_bitwise(m, batch, variant, budget, ref)
    steps = rt.report().steps
    if variant == "recompute":
        assert all(s.replays == 2 for s in steps)
    else:
        assert any(s.phase == "planned" and s.recomputed_bytes > 0 for s in steps)


class _CompiledFnBlock(torch.nn.Module):
    """A block that calls a compiled function (not a compiled module)."""

    def __init__(self, fn: Callable[..., torch.Tensor], h: int = 32) -> None:
        super().__init__()
        self.fn = fn
        self.ln = torch.nn.LayerNorm(h)
        self.fc1 = torch.nn.Linear(h, 4 * h)
        self.fc2 = torch.nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln(x)
        z = self.fn(y, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)
        return x + torch.nn.functional.dropout(z * y, 0.1, self.training)


@pytest.mark.parametrize("variant", ["recompute", "auto", "auto_serve", "offload"])
def test_a_compiled_function_inside_a_block_stays_compiled(variant: str) -> None:
    """The measuring pass's op recorder and the replay's serving mode are dispatch
    modes; dynamo does not compile under one unless the mode steps aside. Were the
    compiled function run eagerly in that pass, dynamo would skip its code for good:
    every later step would run it eagerly (with inductor, other numerics than the plain
    compiled run's)."""
    counting = _Counting()

    def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1)), w2, b2)

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        fn = torch.compile(mlp, backend=counting)
        return models.Stack([_CompiledFnBlock(fn) for _ in range(2)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(s))

    torch._dynamo.reset()
    ref = train(model(), batch, steps=4)
    plain_made, plain_runs = counting.made, counting.runs
    assert plain_made >= 1 and plain_runs >= 8
    budget = tight_budget(model(), batch) if variant == "auto_serve" else None
    torch._dynamo.reset()
    counting.made = counting.runs = 0
    m = model()
    train_bitwise(m, batch, variant, budget, ref)
    assert counting.made == plain_made
    assert counting.runs >= plain_runs  # every forward ran the graph (and replays too)


def _names_of(m: torch.nn.Module, regions: Any = None) -> tuple[list[str], set[str]]:
    """The runtime's region names for ``m``, and the names a ``regions=`` filter that
    picks the blocks is called with."""
    seen: set[str] = set()

    def blocks(module: torch.nn.Module, name: str) -> bool:
        seen.add(name)
        return isinstance(module, models.Block)

    names = offrecomp.runtime(m, mode="keep", regions=regions).regions
    offrecomp.runtime(m, mode="keep", regions=blocks)
    return names, seen


_BLOCKS = ["blocks.0", "blocks.1"]
_NORMS = ["blocks.0.ln1", "blocks.0.ln2", "blocks.1.ln1", "blocks.1.ln2", "ln"]


@pytest.mark.parametrize(
    ("how", "regions", "names"),
    [
        (_whole, None, _BLOCKS),
        (_whole, models.Block, _BLOCKS),
        (_blocks_wrapped, models.Block, _BLOCKS),
        (_blocks_wrapped, torch.nn.LayerNorm, _NORMS),
        (_whole_in_place, None, _BLOCKS),
    ],
    ids=["torch.compile(model)", "torch.compile(model)-by-type", "wrapped-blocks-by-type", "inside-wrapped-blocks",
         "model.compile()"],
)
def test_a_compiled_model_names_its_regions_as_the_plain_model(
    how: Callable[[torch.nn.Module], torch.nn.Module], regions: Any, names: list[str]
) -> None:
    """Region names leave out the ``_orig_mod`` a ``torch.compile`` wrapper holds its
    module as, wherever it stands: the model's own (``_orig_mod.blocks.0``), a block's
    (``blocks.0._orig_mod``), one above a region (``blocks.0._orig_mod.ln1``). The
    regions, and the names a ``regions=`` filter is called with, are the plain model's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.0)
    plain, plain_seen = _names_of(twin(base), regions)
    assert plain == names
    got, seen = _names_of(how(twin(base)), regions)
    assert got == plain
    assert seen == plain_seen, sorted(seen ^ plain_seen)


@pytest.mark.parametrize("variant", ["recompute", "auto_serve"])
def test_wrapped_blocks_chosen_by_type_replay_their_compiled_graph(variant: str) -> None:
    """``regions=Block`` over ``model.blocks[i] = torch.compile(block)``: the block
    inside each wrapper is found at the wrapper's name, so the wrapper, which its calls
    go through, is the region (as automatic discovery picks it): its calls replay the
    compiled graph, gradients bitwise the plain compiled model's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.0)
    ref = train(_blocks_wrapped(twin(base)), _batch, steps=4)
    budget = tight_budget(twin(base), _batch) if variant == "auto_serve" else None
    torch._dynamo.reset()
    m = _blocks_wrapped(twin(base))
    rt = train_bitwise(m, _batch, variant, budget, ref, regions=models.Block)
    assert rt.regions == ["blocks.0", "blocks.1"]
    steps = rt.report().steps
    if variant == "recompute":
        assert all(s.replays == 2 for s in steps)
    else:
        assert any(s.phase == "planned" and s.recomputed_bytes > 0 for s in steps)
    assert "_orig_mod" not in rt.explain()


def test_a_plan_by_the_plain_models_names_places_the_compiled_model(caplog: pytest.LogCaptureFixture) -> None:
    """``rt.set_plan()`` keys made from the plain model's ``explain(storages=True)``
    place the same storages of a runtime given ``torch.compile(model)`` whose loop calls
    the module inside (a trainer that keeps both): the same offloads and replays,
    explain() alike, no key of the plan unknown, gradients bitwise the plain model's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.0)
    plan = offrecomp.Plan(
        placements={("blocks.0", 0, 4): offrecomp.Placement.RECOMPUTE, ("blocks.1", 0, 11): offrecomp.Placement.OFFLOAD},
        default=offrecomp.Placement.KEEP,
    )

    def run(compiled: bool) -> tuple[list[dict[str, torch.Tensor]], Any]:
        m = twin(base)
        rt = offrecomp.runtime(torch.compile(m, backend="eager") if compiled else m, mode="keep", min_bytes=0)
        rt.set_plan(plan)
        return train(m, _batch, rt, steps=2), rt

    ref, rt_plain = run(False)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        got, rt = run(True)
    assert_bitwise(ref, got)
    unknown = [r.getMessage() for r in caplog.records if "does not have" in r.getMessage() or "matched no" in r.getMessage()]
    assert not unknown, unknown
    steps = rt.report().steps
    assert [(s.offloaded_bytes, s.replays, s.recomputed_bytes) for s in steps] == [
        (s.offloaded_bytes, s.replays, s.recomputed_bytes) for s in rt_plain.report().steps
    ]
    assert all(s.offloaded_bytes > 0 and s.replays == 1 for s in steps)
    assert rt.explain(storages=True) == rt_plain.explain(storages=True)
    assert "_orig_mod" not in rt.explain(storages=True)


def test_a_plan_set_on_a_compiled_model_names_no_unknown_region(caplog: pytest.LogCaptureFixture) -> None:
    """``torch.compile(model)`` run whole: a plan keyed by the plain model's region names
    names regions this runtime has (the blocks' saves are the compiled graph's, placed by
    the plan's default), and the warning about the blocks traced into the graph names
    them as the plain model does."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = _whole(models.GPT(layers=2, h=32, heads=4, p=0.0))
    offrecomp.diagnostics.clear_warnings()
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = offrecomp.runtime(m, mode="keep", min_bytes=0)
        rt.set_plan(offrecomp.Plan(placements={("blocks.1", 0, 0): offrecomp.Placement.KEEP}))
        train(m, _batch, rt, steps=1)
    messages = [r.getMessage() for r in caplog.records]
    assert not [t for t in messages if "does not have" in t], messages
    assert any("region(s) blocks.0, blocks.1 run inside" in t for t in messages), messages
    assert not [t for t in messages if "_orig_mod" in t], messages
