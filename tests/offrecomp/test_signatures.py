"""NOTE [Pass signatures]: a pass of several root forwards is planned for all of them;
a pass without a root forward is named by its first region call."""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from offrecomp.signatures import MAX_DEPARTURES, Combinations, combine, signature_of
from tests.helpers import assert_bitwise, make, settled_phases, twin

Snap = dict[str, torch.Tensor]
Body = Callable[[nn.Module, int], torch.Tensor]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _tokens(seed: int, t: int) -> torch.Tensor:
    return torch.randint(0, 64, (2, t), generator=torch.Generator().manual_seed(3000 + seed))


def _sig(t: int) -> str:
    return f"train|(2, {t}):int64:cpu"


def _train(model: nn.Module, body: Body, steps: int, rt: offrecomp.Runtime | None = None) -> list[Snap]:
    """``steps`` SGD steps of ``body(model, step) -> loss``, inside ``rt``; the gradients
    and the loss of each step."""
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    with rt if rt is not None else torch.enable_grad():
        for i in range(steps):
            loss = body(model, i)
            loss.backward()
            snap = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            snap["loss"] = loss.detach().clone()
            out.append(snap)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return out


def _run_auto(model: nn.Module, body: Body, steps: int, fraction: float = 0.4, **kw: Any) -> tuple[offrecomp.Runtime, int]:
    """``body`` under auto with ``fraction`` of keep's activation peak as the budget,
    bitwise against a plain run; the runtime and the budget."""
    ref = _train(twin(model), body, steps)
    probe = twin(model)
    keep = offrecomp.runtime(probe, mode="keep", min_bytes=0)
    _train(probe, body, 2, keep)
    budget = int(fraction * max(s.peak_activation_bytes for s in keep.report().steps))
    m = twin(model)
    kw.setdefault("drift", 100.0)  # a loaded host's step times must not re-plan: plans are asserted
    rt = offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0, **kw)
    # a collection in a calibration pass would send it back (NOTE [Host pauses]): the
    # phases asserted are the ones planning alone decides
    gc.collect()
    gc.disable()
    try:
        assert_bitwise(ref, _train(m, body, steps, rt))
    finally:
        gc.enable()
    return rt, budget


def _query_and_document(lengths: list[int]) -> Body:
    """A query of fixed length and a document whose length is ``lengths[step]``: two
    forwards of the model in one pass."""

    def body(model: nn.Module, i: int) -> torch.Tensor:
        q = model(_tokens(i, 16))
        d = model(_tokens(100 + i, lengths[i]))
        return q + d

    return body


def test_two_forwards_of_alternating_shapes_are_planned_together() -> None:
    """The second forward's length alternates between 24 and 12. Each combination is its
    own signature; the passes of the shorter one run the longer one's plan (chosen at
    the first forward, which cannot tell them apart), which bounds them: every step from
    the first planned one on stays within the budget, and no region is taken for code
    that branches on the data."""
    model = make("gpt_dropout")[0]
    lengths = [24, 12] * 6
    rt, budget = _run_auto(model, _query_and_document(lengths), len(lengths))
    steps = rt.report().steps
    long, short = f"{_sig(16)} + {_sig(24)}", f"{_sig(16)} + {_sig(12)}"
    assert [s.signature for s in steps] == [long, short] * 6
    phases = [s.phase for s in steps]
    # measured (its first forward chose the forward alone: it goes on measuring what
    # ran); the short pass departs from the long one's calibration; the long calibrates
    assert phases[:3] == ["measure", "recompute", "calibrate"], phases
    assert phases[3:] == ["borrowed", "planned"] * 4 + ["borrowed"], phases
    entries = rt.planner.entries
    assert sorted(entries) == [long], sorted(entries)  # no entry left for the choice alone
    plan = entries[long].plan
    assert plan is not None and all(s.plan_id == plan.plan_id for s in steps[3:])
    assert all(s.peak_activation_bytes <= budget for s in steps), [s.peak_activation_bytes for s in steps]
    assert not any(r.variable for r in rt._regions)  # type: ignore[attr-defined]


def test_a_combination_larger_than_any_seen_measures_at_its_next_pass() -> None:
    """A longer document after a planned run of shorter ones: the pass planned for the
    short combination departs from it with storages larger than its plan's, drops those
    calls (gradients stay exact), and the next pass beginning with the same query
    chooses the longer combination and measures it; the shorter ones borrow its plan.
    (At half of keep's peak: the longer combination's most frugal plan, its attention
    replays' transients counted, holds 0.44 of it.)"""
    model = make("gpt_dropout")[0]
    lengths = [12, 12, 12, 24, 24, 24, 12, 24]
    rt, budget = _run_auto(model, _query_and_document(lengths), len(lengths), fraction=0.5)
    steps = rt.report().steps
    phases = [s.phase for s in steps]
    assert phases == ["measure", "calibrate", "planned", "borrowed", "measure", "calibrate", "borrowed", "planned"]
    assert steps[3].recomputed_bytes > steps[2].recomputed_bytes  # the larger calls dropped
    assert all(s.peak_activation_bytes <= budget for s in steps[6:]), [s.peak_activation_bytes for s in steps]


def test_two_forwards_of_one_shape_measure_calibrate_and_plan() -> None:
    """The first pass chose the first forward alone and measures both; no pass is lost."""
    model = make("gpt_dropout")[0]
    rt, budget = _run_auto(model, _query_and_document([16] * 4), 4)
    steps = rt.report().steps
    assert [s.phase for s in steps] == ["measure", "calibrate", "planned", "planned"]
    assert {s.signature for s in steps} == {f"{_sig(16)} + {_sig(16)}"}
    assert steps[-1].peak_activation_bytes <= budget


class _Recursive(nn.Module):
    """A model whose forward calls the model again on the same input."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = make("gpt_dropout")[0]

    def forward(self, idx: torch.Tensor, inner: bool = False) -> torch.Tensor:
        return self.gpt(idx) if inner else self(idx, inner=True)


def test_a_root_forward_inside_another_adds_nothing_to_the_signature() -> None:
    model = _Recursive()
    rt, _ = _run_auto(model, lambda m, i: m(_tokens(i, 16)), 3)
    assert [s.signature for s in rt.report().steps] == [_sig(16)] * 3
    assert [s.phase for s in rt.report().steps] == ["measure", "calibrate", "planned"]


class _LossOnly(nn.Module):
    """A model trained through ``compute_loss``, which calls the submodules itself: the
    model's forward never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = make("gpt_dropout")[0]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the loop never calls it")

    def compute_loss(self, idx: torch.Tensor) -> torch.Tensor:
        g = self.gpt
        x = g.emb(idx)
        for blk in g.blocks:
            x = blk(x)
        return F.cross_entropy(g.head(g.ln(x)).flatten(0, 1), idx.flatten())


def test_a_loop_without_a_root_forward_is_named_by_its_first_region_call() -> None:
    """Not "unknown" for every pass: each length is its own signature, read from the
    first block's inputs, and plans."""
    model = _LossOnly()
    lengths = [16, 24] * 4
    rt, budget = _run_auto(model, lambda m, i: m.compute_loss(_tokens(i, lengths[i])), len(lengths))
    steps = rt.report().steps
    sig = "train|gpt.blocks.0:(2, {}, 32):float32:cpu"
    assert [s.signature for s in steps] == [sig.format(t) for t in lengths]
    phases = settled_phases(steps)
    assert phases == ["measure"] * 2 + ["calibrate"] * 2 + ["planned"] * (len(phases) - 4), phases
    assert len(phases) >= 6 and all(s.peak_activation_bytes <= budget for s in steps if s.phase == "planned")


def test_each_call_of_the_naming_region_outside_a_forward_is_a_part() -> None:
    """``compute_loss`` called twice in a pass (a fixed query, a document of alternating
    length): both calls name the pass, so each combination plans instead of every pass
    measuring again because its second call outgrew the profile."""
    model = _LossOnly()
    lengths = [24, 12] * 6

    def body(m: nn.Module, i: int) -> torch.Tensor:
        return m.compute_loss(_tokens(i, 16)) + m.compute_loss(_tokens(100 + i, lengths[i]))

    rt, budget = _run_auto(model, body, len(lengths))
    steps = rt.report().steps
    sig = "train|gpt.blocks.0:(2, {}, 32):float32:cpu"
    assert steps[-1].signature == f"{sig.format(16)} + {sig.format(lengths[-1])}"
    assert {s.phase for s in steps[6:]} <= {"planned", "borrowed"}, [s.phase for s in steps]
    assert all(s.peak_activation_bytes <= budget for s in steps[6:])


class _LossAndForward(_LossOnly):
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.compute_loss(idx)


def test_a_region_call_outside_the_forward_after_it_is_a_part() -> None:
    """``model(q) + model.compute_loss(d)``: the blocks called after the root forward,
    outside it, are a part of the signature, so each length of ``d`` plans within the
    budget instead of running on the plan of another."""
    model = _LossAndForward()
    lengths = [12, 12, 12, 20] * 4

    def body(m: nn.Module, i: int) -> torch.Tensor:
        return m(_tokens(i, 16)) + m.compute_loss(_tokens(100 + i, lengths[i]))

    rt, budget = _run_auto(model, body, len(lengths), fraction=0.8)
    steps = rt.report().steps
    assert all(s.signature.endswith(f"blocks.0:(2, {t}, 32):float32:cpu") for s, t in zip(steps, lengths)), [
        s.signature for s in steps
    ]
    assert all(s.peak_activation_bytes <= budget for s in steps), [s.peak_activation_bytes for s in steps]


def test_a_dropped_graph_of_a_region_named_pass_ends_it() -> None:
    """NOTE [Dropped graphs] for a pass without a root forward: a metric
    ``compute_loss`` with grad whose graph is dropped is a pass of its own, not the first
    part of the training pass that follows."""
    model = _LossOnly()

    def body(m: nn.Module, i: int) -> torch.Tensor:
        m.compute_loss(_tokens(500 + i, 16)).detach()  # the metric: its graph goes at once
        return m.compute_loss(_tokens(i, 16))

    rt, _ = _run_auto(model, body, 8)
    steps = rt.report().steps
    assert all(" + " not in s.signature for s in steps), [s.signature for s in steps]
    assert {s.phase for s in steps[4:]} == {"planned"}, [s.phase for s in steps]


def test_a_region_named_signature_under_a_forced_mode() -> None:
    """Under keep too (no planner): the step records name the signature."""
    model = _LossOnly()
    rt = offrecomp.runtime(model, mode="keep", min_bytes=0)
    _train(model, lambda m, i: m.compute_loss(_tokens(i, 16)), 2, rt)
    assert [s.signature for s in rt.report().steps] == ["train|gpt.blocks.0:(2, 16, 32):float32:cpu"] * 2


def test_the_choice_is_the_largest_recent_combination() -> None:
    a = b16 = signature_of((torch.zeros(2, 16),), {}, True)
    b24 = signature_of((torch.zeros(2, 24),), {}, True)
    combos = Combinations()
    assert combos.choose(a) == (a,)  # nothing seen: the forward alone
    combos.note((a, b16))
    combos.note((a, b24))
    combos.note((a, b16))
    assert combos.choose(a) == (a, b24)
    # a first forward of the same family, never seen: its own part, then the largest rest
    c = signature_of((torch.zeros(2, 8),), {}, True)
    assert combos.choose(c) == (c, b24)
    sig, family, dims = combine((a, b24))
    assert sig == f"{a[0]} + {b24[0]}" and family == f"{a[1]} + {b24[1]}" and dims == (2, 16, 2, 24)
    assert combine((a,)) == a


def test_a_combination_passes_keep_departing_from_is_chosen_no_more_until_it_runs() -> None:
    a = signature_of((torch.zeros(2, 16),), {}, True)
    b = signature_of((torch.zeros(2, 24),), {}, True)
    combos = Combinations()
    combos.note((a, b))
    combos.note((a,))
    for _ in range(MAX_DEPARTURES):
        assert combos.choose(a) == (a, b)
        combos.departed((a, b))
        combos.note((a,))
    assert combos.choose(a) == (a,)
    combos.note((a, b))  # it ran again: chosen again
    assert combos.choose(a) == (a, b)
    # seen twice in the window: chosen however many passes depart from it between runs
    for _ in range(2 * MAX_DEPARTURES):
        combos.departed((a, b))
        combos.note((a,))
    assert combos.choose(a) == (a, b)


def test_a_loss_kept_once_without_backward_costs_a_few_passes_not_a_window() -> None:
    """A forward whose loss is kept and never differentiated (a step skipped on a NaN
    check, its loss held for logging) joins the next step's forwards: one pass of two
    forwards, never seen again. Passes beginning like it stop choosing it after
    MAX_DEPARTURES departures, not after WINDOW passes, and plan again; gradients stay
    bitwise."""
    model = make("gpt_dropout")[0]
    held: list[torch.Tensor] = []

    def body(m: nn.Module, i: int) -> torch.Tensor:
        if i == 4:
            held.append(m(_tokens(900, 16)))  # kept, never differentiated
        elif i == 6:
            held.clear()
        return m(_tokens(i, 16))

    steps = 4 + 1 + MAX_DEPARTURES + 6
    rt, _ = _run_auto(model, body, steps)
    phases = settled_phases(rt.report().steps)
    assert phases[:4] == ["measure", "calibrate", "planned", "planned"], phases
    assert phases[-4:] == ["planned"] * 4, phases
    assert phases.count("recompute") <= MAX_DEPARTURES, phases


def test_the_largest_combination_is_the_one_with_more_elements() -> None:
    """NOTE [Pass signatures]: 8 x 16 tokens save more than 2 x 24, though their sizes sum
    to less; the choice must cover the larger, or that pass runs over the budget on a
    plan made for the smaller one."""
    a = signature_of((torch.zeros(2, 16),), {}, True)
    wide = signature_of((torch.zeros(2, 24),), {}, True)
    tall = signature_of((torch.zeros(8, 16),), {}, True)
    combos = Combinations()
    combos.note((a, tall))
    combos.note((a, wide))  # the most recent
    assert combos.choose(a) == (a, tall)


def test_a_pass_outgrowing_its_borrowed_plan_mid_way_makes_no_entry_for_its_first_forwards() -> None:
    """Three forwards in a changing order: a pass that departs from its choice at its
    second forward borrows, and one of its storages outgrows that plan; the entry it
    measures under next is made when the pass ends, for all three forwards, never for
    the two it had run so far (such entries would evict real ones from the plan cache;
    a first pass's entry for its first forward alone is made, and dropped when it
    departs)."""
    model, _ = make("gpt_dropout")
    shuffle = random.Random(5)
    orders = [shuffle.sample([8, 16, 24], 3) for _ in range(24)]

    def body(model: nn.Module, i: int) -> torch.Tensor:
        return sum((model(_tokens(10 * i + k, t)) for k, t in enumerate(orders[i])), torch.zeros(()))

    made: list[str] = []
    from offrecomp.planning.entries import PlanCache

    original = PlanCache.entry

    def spy(self: PlanCache, signature: str, p: Any = None) -> Any:
        if signature not in self.entries:
            made.append(signature)
        return original(self, signature, p)

    PlanCache.entry = spy  # type: ignore[method-assign]
    try:
        _run_auto(model, body, 24, plan_cache_size=32)
    finally:
        PlanCache.entry = original  # type: ignore[method-assign]
    assert made and not [sig for sig in made if sig.count(" + ") == 1], made


class _Mlp(nn.Module):
    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


def _unfrozen_at(step: int, mode: str, steps: int, how: str = "requires_grad", **kw: Any) -> offrecomp.Runtime:
    """A stack of four blocks frozen until ``step`` (only the head trains), then trained
    whole, under ``mode``; unfrozen by ``requires_grad_`` or by new Parameter objects
    under the same names (weights re-initialised or swapped in)."""
    torch.manual_seed(0)
    blocks = nn.Sequential(*[_Mlp() for _ in range(4)])
    model = nn.Sequential(blocks, nn.Linear(32, 1))
    blocks.requires_grad_(False)
    rt = offrecomp.runtime(model, mode=mode, min_bytes=0, **kw)
    with rt:
        for i in range(steps):
            if i == step and how == "requires_grad":
                blocks.requires_grad_(True)
            elif i == step:
                for mod in blocks.modules():
                    for name, q in list(mod.named_parameters(recurse=False)):
                        setattr(mod, name, nn.Parameter(q.detach().clone()))
            model(torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(i))).sum().backward()
    return rt


@pytest.mark.parametrize("how", ["requires_grad", "new_parameters"])
def test_unfreezing_between_steps_is_a_new_signature(how: str) -> None:
    """NOTE [Frozen parameters]: the frozen passes save a sixteenth of what the trained
    ones do at the same input shapes. Keep's books of a frozen pass (NOTE [Native keep])
    would report the trained passes' bytes that low, and auto would run the frozen
    passes' plan on the first trained one (everything kept, 1.7x the budget). New
    Parameter objects under the old names moved no structure epoch, so the frozen
    flags, read once per epoch, stayed. (The budget is 0.6 of keep's peak: the most
    frugal plan, the replays' transients counted, holds 0.52 of it.)"""
    keep = _unfrozen_at(2, "keep", 4, how).report().steps
    whole = _unfrozen_at(0, "keep", 2).report().steps
    assert keep[0].peak_activation_bytes < whole[0].peak_activation_bytes
    assert [s.peak_activation_bytes for s in keep[2:]] == [whole[0].peak_activation_bytes] * 2
    assert "frozen:" in keep[0].signature and "frozen:" not in keep[2].signature

    budget = whole[0].peak_activation_bytes * 3 // 5
    steps = _unfrozen_at(4, "auto", 9, how, budget=budget, drift=100.0).report().steps
    assert [s.phase for s in steps[4:6]] == ["measure", "calibrate"]
    assert all(s.peak_activation_bytes <= 1.05 * budget for s in steps), [s.peak_activation_bytes for s in steps]


def _maml(model: nn.Module, steps: int) -> list[list[torch.Tensor]]:
    """MAML's step: an inner loss through the parameters, its gradient with a graph, and
    an outer loss through fast weights made of them (``functional_call``)."""
    grads = []
    for s in range(steps):
        x = torch.randn(8, 32, generator=torch.Generator().manual_seed(s))
        params = dict(model.named_parameters())
        inner = torch.func.functional_call(model, params, (x,)).square().mean()
        g = torch.autograd.grad(inner, list(params.values()), create_graph=True)
        fast = {k: v - 0.1 * d for (k, v), d in zip(params.items(), g)}
        torch.func.functional_call(model, fast, (x + 1,)).square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])  # type: ignore[union-attr]
        model.zero_grad(set_to_none=True)
    return grads


def test_fast_weights_in_the_parameter_slots_are_a_signature_of_their_own(caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Frozen parameters]: the outer pass of a MAML step saves its fast weights
    (activations) where the inner pass saves nothing of its parameters; at the same input
    shapes they shared a signature, and auto took the blocks for regions that vary (plain
    replays, a warning of data-dependent branches)."""
    import logging

    torch.manual_seed(0)
    model = nn.Sequential(*[_Mlp() for _ in range(3)])
    plain = _maml(twin(model), 6)
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(model, mode="auto", min_bytes=0) as rt:
        got = _maml(model, 6)
    assert len(plain) == len(got) and all(torch.equal(a, b) for pa, ga in zip(plain, got) for a, b in zip(pa, ga))
    assert not [r for r in caplog.records if "other tensors than its profile" in r.getMessage()]
    signatures = {s.signature for s in rt.report().steps}
    assert len(signatures) == 2 and sum("substituted:" in s for s in signatures) == 1, signatures
