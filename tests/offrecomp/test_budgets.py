"""auto against its budget: the most frugal plan, infeasible budgets, and planned steps
measured by the allocator (independently of the runtime's own accounting)."""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp import Placement
from tests import models
from tests.helpers import assert_bitwise, train
from tests.offrecomp.test_memory import allocator_peak

KIB = 1024


def _mlp_blocks() -> nn.Module:
    """The issue's model: small activations, most of each block's saves under min_bytes."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.GELU()) for _ in range(8)]
    return models.Stack(blocks)


def _batch(s: int) -> torch.Tensor:
    return torch.randn(32, 64, generator=torch.Generator().manual_seed(s))


def _peaks(model: nn.Module, mode: str) -> int:
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode=mode)  # the default min_bytes
    train(m, _batch, rt, steps=1)
    return rt.report().steps[0].peak_activation_bytes


def _messages(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


def test_the_most_frugal_plan_drops_small_storages(caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Small storages]: with every storage under min_bytes, a budget between full
    recompute and keep is met (the frugal end drops them as forced recompute does), and
    is not called infeasible."""
    model = _mlp_blocks()
    keep, recompute = _peaks(model, "keep"), _peaks(model, "recompute")
    budget = 392 * KIB
    assert recompute < budget < keep, (recompute, keep)
    ref = train(copy.deepcopy(model), _batch, steps=6)
    m = copy.deepcopy(model)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = offrecomp.runtime(m, budget=budget, drift=100.0)
        got = train(m, _batch, rt, steps=6)
    assert_bitwise(ref, got)
    planned = [s for s in rt.report().steps if s.phase == "planned"]
    assert planned, [s.phase for s in rt.report().steps]
    assert all(s.peak_activation_bytes <= budget for s in planned), [s.peak_activation_bytes for s in planned]
    assert _messages(caplog, "cannot be met") == []
    assert _messages(caplog, "a planned step held") == []
    # predicted again under each new estimate as it was solved, small storages droppable
    # (on the profile as measured the plan would not place: no live prediction)
    entry = rt.planner.last_entry
    assert entry is not None and entry.plan is not None and entry.profile is not None and entry.live is not None
    keys = [(r.name, r.call_index, i) for r, i in entry.small_externals(entry.profile)]
    assert any(entry.plan.placement(k) is not Placement.KEEP for k in keys)
    rt.planner.solver.solve_borrow_plan(entry)  # another plan solved so: this one still predicts
    assert entry.predict(entry.profile, entry.plan, prefetch_regions=2).step_seconds > 0


def test_passes_borrowing_a_plan_may_drop_small_storages_too() -> None:
    """NOTE [Small storages], NOTE [Borrowed plans]: the plan that passes of a smaller
    batch borrow is solved with plain replays; where that does not fit the budget while
    small storages stay, it is solved again with them droppable, as the donor's own
    frugal end is, so the smaller batches borrow within the budget."""
    model = _mlp_blocks()
    budget = 392 * KIB

    def batches(s: int) -> torch.Tensor:
        return torch.randn(32 if s < 30 else 24, 64, generator=torch.Generator().manual_seed(s))  # s: 10 x step

    ref = train(copy.deepcopy(model), batches, steps=6)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, budget=budget, drift=100.0, plan_cache_size=1)  # a seen signature borrows again
    assert_bitwise(ref, train(m, batches, rt, steps=6))
    steps = rt.report().steps
    assert [s.phase for s in steps] == ["measure", "calibrate", "planned", "borrowed", "borrowed", "borrowed"]
    assert all(s.peak_activation_bytes <= budget for s in steps[2:]), [s.peak_activation_bytes for s in steps]
    donor = rt.planner.entries[steps[0].signature]
    assert donor.borrow_plan is not None and donor.borrow_plan.feasible


def test_an_infeasible_budget_names_a_budget_the_steps_met(caplog: pytest.LogCaptureFixture) -> None:
    """A budget no plan meets warns once, naming the smallest budget the solver accepts
    (no larger than what the measuring step held), and not also as a planned step over
    its budget; that budget runs with infeasible='error' (the planned step's peak can be
    a little under the frugal plan's prediction, which 'error' would reject)."""
    model = _mlp_blocks()
    m = copy.deepcopy(model)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = offrecomp.runtime(m, budget=1, drift=100.0)
        train(m, _batch, rt, steps=5)
    steps = rt.report().steps
    assert [s.phase for s in steps][-1] == "planned"
    msgs = _messages(caplog, "cannot be met")
    assert len(msgs) == 1, msgs
    named = int(re.search(r"smallest feasible budget is [^(]*\((\d+) bytes\)", msgs[0]).group(1))  # type: ignore[union-attr]
    assert named <= steps[0].peak_activation_bytes, (named, [s.peak_activation_bytes for s in steps])
    assert _messages(caplog, "a planned step held") == []
    plan = rt.planner.last_entry.plan  # type: ignore[union-attr]
    assert not plan.feasible and plan.min_feasible_budget_bytes == named
    m = copy.deepcopy(model)
    train(m, _batch, offrecomp.runtime(m, budget=named, infeasible="error", drift=100.0), steps=4)


def test_a_budget_the_measuring_steps_met_is_not_an_error() -> None:
    """infeasible='error' raises only for a budget that full recompute did not meet."""
    model = _mlp_blocks()
    m = copy.deepcopy(model)
    train(m, _batch, offrecomp.runtime(m, budget=392 * KIB, infeasible="error", drift=100.0), steps=4)
    m = copy.deepcopy(model)
    with pytest.raises(ValueError, match=r"the smallest feasible budget is .*\((\d+) bytes\)"):
        train(m, _batch, offrecomp.runtime(m, budget=64 * KIB, infeasible="error"), steps=4)


def _step(model: nn.Module, batch: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        torch.manual_seed(1)
        model(batch).backward()

    return run


@pytest.mark.parametrize("case", ["gpt", "small_blocks"])
def test_planned_auto_steps_stay_within_the_budget_by_the_allocator(case: str) -> None:
    """The allocator's peak of a planned auto step exceeds full recompute's by at most
    what the budget allows over recompute's activations (plus a 5% margin of the
    budget): memory the runtime's accounting misses (region inputs held for replay, say)
    shows here even when the runtime's own records say the budget was met."""
    if case == "gpt":
        torch.manual_seed(0)
        model: nn.Module = models.GPT(layers=6, h=64, heads=4, p=0.1)
        batch = torch.randint(0, 64, (4, 96))
        kw: dict[str, object] = {"min_bytes": 0}
    else:
        model, batch, kw = _mlp_blocks(), _batch(0), {}
    peaks = {}
    acts = {}
    for mode in ("keep", "recompute"):
        m = copy.deepcopy(model)
        with offrecomp.runtime(m, mode=mode, **kw) as rt:  # type: ignore[arg-type]
            _step(m, batch)()
            peaks[mode] = allocator_peak(_step(m, batch))
        acts[mode] = rt.report().steps[-1].peak_activation_bytes
    budget = (acts["keep"] + acts["recompute"]) // 2
    m = copy.deepcopy(model)
    with offrecomp.runtime(m, budget=budget, drift=100.0, **kw) as rt:  # type: ignore[arg-type]
        for _ in range(4):
            _step(m, batch)()
        assert rt.report().steps[-1].phase == "planned"
        ours = allocator_peak(_step(m, batch))
    rec = rt.report().steps[-1]
    assert rec.phase == "planned" and rec.peak_activation_bytes <= budget * 1.05
    allowed = peaks["recompute"] + (budget - acts["recompute"]) + 0.05 * budget
    assert ours <= allowed, (ours, allowed, peaks, acts, budget)
    assert ours < peaks["keep"], (ours, peaks)


@pytest.mark.parametrize("budget", ["ample", "half"])
def test_calls_a_plan_keeps_whole_take_no_checkpoint(budget: str) -> None:
    """NOTE [Kept planned calls]: a planned call whose plan keeps all of it takes no
    replay checkpoint (its region inputs are not booked), the others still do, and the
    gradients equal the plain run's."""
    model = _mlp_blocks()
    ref = train(copy.deepcopy(model), _batch, steps=6)
    kw = {}
    if budget == "half":
        probe = copy.deepcopy(model)
        keep = offrecomp.runtime(probe, mode="keep", min_bytes=0)
        train(probe, _batch, keep, steps=1)
        kw["budget"] = keep.report().steps[0].peak_activation_bytes // 2
    rt = offrecomp.runtime(model, mode="auto", min_bytes=0, **kw)
    assert_bitwise(ref, train(model, _batch, rt, steps=6))
    steps = rt.report().steps
    measured = steps[0].input_bytes  # the measuring pass checkpoints every call
    planned = [(s.input_bytes, s.recomputed_bytes) for s in steps if s.phase == "planned"]
    assert measured > 0 and planned, [(s.phase, s.input_bytes) for s in steps]
    if budget == "ample":
        assert planned == [(0, 0)] * len(planned), planned
    else:  # some calls drop (and checkpoint), the others are kept whole
        assert all(0 < b < measured and r > 0 for b, r in planned), (measured, planned)


def test_max_overhead_with_the_automatic_budget_buys_memory() -> None:
    """docs/tuning.md: with ``budget=None``, ``max_overhead`` buys as much memory as that
    step-time overhead allows, not only what the automatic budget needs (it keeps
    everything that fits)."""
    model = _mlp_blocks()
    runs = {}
    for overhead in (None, 1.0):
        m = copy.deepcopy(model)
        rt = offrecomp.runtime(m, max_overhead=overhead, drift=100.0, min_bytes=0)
        train(m, _batch, rt, steps=4)
        runs[overhead] = rt.report().steps[-1]
    assert runs[None].phase == "planned" and runs[None].recomputed_bytes == 0
    bought = runs[1.0]
    assert bought.phase == "planned" and bought.recomputed_bytes > 0
    assert bought.peak_activation_bytes < runs[None].peak_activation_bytes
    plan = rt.planner.last_entry.plan  # type: ignore[union-attr]
    assert plan is not None and any("within max_overhead" in n for n in plan.notes), plan.notes


def test_a_kept_input_that_the_block_before_kept_counts_once() -> None:
    """NOTE [Inputs counted once] (shared.py): each block's input is the block before's
    last ReLU output, which that block keeps too. Under a plan that drops each block's
    first ReLU output, the pass holds the model's input and the four blocks' outputs at
    the end of its forward, once each: 5 x 8 KiB, not 8 KiB more per shared input. (The
    ReLUs run in place on the Linears' outputs: a replay holds nothing beyond what it
    regenerates, NOTE [Replay transients] in scheduler/working_set.py.) The last block's
    forward holds its first ReLU output, dropped, beside its second Linear's output
    until that Linear has returned: 8 KiB more at that point, as the model counts it
    (NOTE [Forward transients])."""

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(32, 32), nn.ReLU(inplace=True), nn.Linear(32, 32), nn.ReLU(inplace=True))
                for _ in range(4)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return x.sum()

    from scheduler import Placement, Plan

    torch.manual_seed(0)
    base = Chain()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(64, 32, generator=torch.Generator().manual_seed(s))

    m = copy.deepcopy(base)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0)
    rt.set_plan(Plan(placements={(f"blocks.{i}", 0, 1): Placement.RECOMPUTE for i in range(4)}))
    assert_bitwise(train(copy.deepcopy(base), batch, steps=3), train(m, batch, rt, steps=3))
    planned = [s for s in rt.report().steps if s.phase == "user-plan"]
    assert planned and all(s.recomputed_bytes == 4 * 8 * KIB for s in planned)
    assert {s.peak_activation_bytes for s in planned} == {6 * 8 * KIB}, [s.peak_activation_bytes for s in planned]


def test_an_input_every_call_takes_counts_once_however_many_calls() -> None:
    """NOTE [Inputs counted once]: two cells called in turn on one tensor (as an RNN's
    cells read its embedded sequence): each call's input record finds an earlier call's,
    which counts nothing itself beyond the first, and follows it to the record that
    counts the bytes. Under recompute every call keeps its input, and the pass counts
    the tensor once at any number of calls (also beyond INPUT_LOOKBACK)."""

    class Cell(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(x))

    class Over(nn.Module):
        def __init__(self, calls: int) -> None:
            super().__init__()
            self.inp = nn.Linear(8, 32)
            self.cells = nn.ModuleList([Cell(), Cell()])
            self.calls = calls

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            e = self.inp(x)
            out = e
            for i in range(self.calls):
                out = out + self.cells[i % 2](e)
            return out.sum()

    peaks = {}
    for calls in (3, 12):
        torch.manual_seed(0)
        m = Over(calls)
        rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
        train(m, lambda s: torch.randn(64, 8, generator=torch.Generator().manual_seed(s)), rt, steps=2)
        peaks[calls] = rt.report().steps[-1].peak_activation_bytes
    assert peaks[3] == peaks[12], peaks


def test_an_input_held_past_its_calls_counts_once_however_many_iterations() -> None:
    """NOTE [Inputs counted once]: a solver iterating with grad on and detaching each
    iterate (a DEQ) drops each iteration's graph in the forward, and its calls' replay
    checkpoints with it; the encoding every call takes stays alive, held by the program.
    A released input record counted it on until the pass ended, so the next iteration's
    calls, finding no live record before them, counted it again: 8 KiB more booked per
    iteration under recompute (139 KiB at 12 iterations where 40 KiB are held)."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(64, 64)

        def forward(self, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(z) + u)

    class Solver(nn.Module):
        def __init__(self, iterations: int) -> None:
            super().__init__()
            self.enc = nn.Linear(64, 64)
            self.layers = nn.ModuleList(Block() for _ in range(2))
            self.iterations = iterations

        def f(self, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                z = layer(z, u)
            return 0.5 * z

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            u = self.enc(x)
            z = torch.zeros_like(u)
            for _ in range(self.iterations):
                z = self.f(z, u).detach()
            return self.f(z, u).square().mean()

    peaks = {}
    for iterations in (0, 1, 8):
        torch.manual_seed(0)
        m = Solver(iterations)
        rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
        train(m, lambda s: torch.randn(32, 64, generator=torch.Generator().manual_seed(s)), rt, steps=2)
        peaks[iterations] = rt.report().steps[-1].peak_activation_bytes
    assert peaks[0] == peaks[1] == peaks[8], peaks


def test_a_weight_cast_the_calls_share_counts_once() -> None:
    """NOTE [Activations counted once]: under autocast each cell's bf16 weight casts are
    made by its first call and saved by every call over the time steps; the pass counts
    each cast once (its later records are shared), under recompute as under a plan that
    drops in every call, and the planner's model counts them as the books do."""
    h, steps = 32, 6

    class Cell(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.x = nn.Linear(h, 3 * h)
            self.h = nn.Linear(h, 3 * h)

        def forward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
            r, z, n = (self.x(x) + self.h(state)).chunk(3, -1)
            return (1 - torch.sigmoid(z)) * torch.tanh(n * torch.sigmoid(r)) + torch.sigmoid(z) * state

    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(8, h)
            self.cells = nn.ModuleList([Cell(), Cell()])

        def forward(self, seq: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                states = [torch.zeros(seq.shape[0], h) for _ in self.cells]
                e = self.inp(seq)
                for t in range(steps):
                    x = e[:, t]
                    for i, cell in enumerate(self.cells):
                        states[i] = x = cell(x, states[i])
                return x.float().square().mean()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, steps, 8, generator=torch.Generator().manual_seed(s))

    cast = 3 * h * h * 2  # a bf16 weight of one cell's Linear
    torch.manual_seed(0)
    base = Recurrent()
    probe = copy.deepcopy(base)
    keep = offrecomp.runtime(probe, mode="keep", min_bytes=0)
    train(probe, batch, keep, steps=1)
    budget = keep.report().steps[0].peak_activation_bytes // 2
    ref = train(copy.deepcopy(base), batch, steps=5)
    m = copy.deepcopy(base)
    rt = offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0)
    assert_bitwise(ref, train(m, batch, rt, steps=5))
    with rt:
        loss = m(batch(9))
        p = rt.current_pass
        assert p is not None
        # a replay casts again (NOTE [Autocast cache]): the first call's cast may drop, the
        # later calls' (made outside them) only keep; calls the plan keeps whole save
        # natively, without records
        # each cast counted by one record at most, which of them following the plan (and
        # so measured times); a call the plan keeps whole counts its own records, as the
        # planner's model does (NOTE [Activations counted once])
        kept: list[object] = []
        counted: dict[int, int] = {}
        for c in p.calls:
            for rec in c.storages:
                if rec.nbytes == cast and rec.placement is Placement.KEEP:
                    kept.append(rec)
                    if not c.kept_whole:
                        counted[id(rec())] = counted.get(id(rec()), 0) + (not rec.shared)
        loss.backward()
    assert len(kept) > 8, kept
    assert len(counted) <= 4 and max(counted.values()) <= 1, counted
    planned = [r for r in rt.report().steps if r.phase == "planned"]
    assert planned and all(r.peak_activation_bytes <= budget for r in planned), (budget, planned)
    for r in planned:
        assert r.predicted_peak_bytes is not None
        assert abs(r.peak_activation_bytes - r.predicted_peak_bytes) <= 0.05 * r.predicted_peak_bytes, r


def test_the_most_frugal_plan_over_its_budget_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Small storages] (solving.py): under bf16 autocast a GRU stack's measuring
    pass drops saves no plan may drop (each block's weight casts, made outside its call;
    the gate storages, which untracked aliases share), so the most frugal plan holds
    more than it (which held, beyond its kept saves, the casts autocast's cache keeps:
    NOTE [Forward transients] in scheduler/working_set.py) and than the budget, 0.36 of
    keep's. (An LSTM is no such model everywhere: on a CPU with
    bf16 instructions it runs as one oneDNN op saving one workspace.) The warning says that this plan is
    already the most frugal, not to plan with a lower budget, and the smallest budget it
    names is one the planned steps met."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(16, 16, batch_first=True)
            self.ln = nn.LayerNorm(16)
            self.ff = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y, _ = self.rnn(self.ln(x))
            return x + torch.tanh(self.ff(y))

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(8, 16)
            self.blocks = nn.ModuleList([Block() for _ in range(4)])

        def forward(self, seq: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = self.inp(seq)
                for b in self.blocks:
                    h = b(h)
                return h[:, -1].float().square().mean()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(s))

    torch.manual_seed(0)
    base = Stack()
    probe = copy.deepcopy(base)
    keep = offrecomp.runtime(probe, mode="keep", min_bytes=0)
    train(probe, batch, keep, steps=1)
    budget = int(0.36 * keep.report().steps[0].peak_activation_bytes)
    m = copy.deepcopy(base)
    rt = offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        assert_bitwise(train(copy.deepcopy(base), batch, steps=4), train(m, batch, rt, steps=4))
    steps = rt.report().steps
    planned = [s for s in steps if s.phase == "planned"]
    assert planned and all(s.peak_activation_bytes > max(budget, steps[0].peak_activation_bytes) for s in planned)
    assert "is the most memory-frugal plan" in caplog.text
    assert "Plan with a budget lower" not in caplog.text
    named = re.search(r"smallest feasible budget is [^(]*\((\d+) bytes\)", caplog.text)
    assert named is not None and all(s.peak_activation_bytes <= int(named.group(1)) for s in planned)


class _MemoryBlock(nn.Module):
    """Transformer-XL style: attends over the previous step's hidden states (``self.mem``,
    detached), which the first step lacks; the signature cannot tell the steps apart."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.q, self.kv, self.o = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.mem: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = x if self.mem is None else torch.cat([self.mem, x], 1)
        k, v = self.kv(ctx).chunk(2, -1)
        att = torch.softmax(self.q(x) @ k.transpose(1, 2), -1)
        self.mem = x[:, -8:].detach()
        return x + self.o(torch.tanh(att @ v))


def _memory_model() -> nn.Module:
    torch.manual_seed(0)
    return models.Stack([_MemoryBlock() for _ in range(4)])


def _tokens(s: int) -> torch.Tensor:
    return torch.randn(2, 32, 32, generator=torch.Generator().manual_seed(s))


def test_a_calibration_pass_with_larger_saves_measures_again_before_planning() -> None:
    """NOTE [Calibration sizes]: the measuring pass of step 0 saw no memory, the
    calibration pass does; planning from step 0's recording booked too little (the first
    planned step over the budget), so the signature measures again, and every planned
    step keeps to the budget, its calls without a passive dispatch mode; gradients
    bitwise."""
    model = _memory_model()
    keep = copy.deepcopy(model)
    with offrecomp.runtime(keep, mode="keep", min_bytes=0) as rt:
        for s in range(2):
            keep(_tokens(s)).backward()
    budget = int(0.7 * rt.report().steps[-1].peak_activation_bytes)
    ref = train(copy.deepcopy(model), _tokens, steps=7)
    rt = offrecomp.runtime(model, budget=budget, min_bytes=0, drift=100.0)
    assert_bitwise(ref, train(model, _tokens, rt, steps=7))
    steps = rt.report().steps
    assert [s.phase for s in steps[:5]] == ["measure", "calibrate", "measure", "calibrate", "planned"]
    planned = [s for s in steps if s.phase == "planned"]
    assert len(planned) == 3
    for s in planned:
        assert s.peak_activation_bytes <= budget, (s.step, s.peak_activation_bytes, budget)
        assert s.peak_activation_bytes == s.predicted_peak_bytes
    # the second calibration matched: no region runs its calls under a passive mode
    assert not any(r.mode_sensitive for r in rt.planner.host.regions)


class _RoutedBlock(nn.Module):
    """Runs its second layer on the rows the data picks (a mixture of experts' routing):
    the sizes of its saves change from step to step under one signature."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, 1), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = (self.gate(x).squeeze(-1) > 0).nonzero().squeeze(-1)
        y = torch.zeros_like(x).index_add(0, rows, self.down(torch.relu(self.up(x[rows]))))
        return x + y


def _routed() -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    """Three routed blocks and their batches."""
    torch.manual_seed(0)
    model = models.Stack([_RoutedBlock() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(64, 32, generator=torch.Generator().manual_seed(s))

    return model, batch


def test_calls_that_differ_at_every_calibration_vary_and_the_signature_plans(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Routing that changes every step: the signature measures again once for its
    calibration (NOTE [Calibration sizes]); the second calibration that differs counts
    toward the regions' mismatches, so the first planned pass that differs makes them
    variable (placed by position, replayed plainly: NOTE [Regions that vary]), and the
    signature plans for good, from that pass on: it keeps its profile, which grows,
    rather than measuring a third time (another recording would not describe the calls
    either, and the grown profile was lost); gradients bitwise."""
    model, batch = _routed()
    ref = train(copy.deepcopy(model), batch, steps=12)
    rt = offrecomp.runtime(model, budget=1, min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        assert_bitwise(ref, train(model, batch, rt, steps=12))
    phases = [s.phase for s in rt.report().steps]
    assert phases[:4] == ["measure", "calibrate"] * 2 and phases[4:] == ["planned"] * 8, phases
    assert len(_messages(caplog, "saved other tensors than its profile")) == 3


def test_regions_that_vary_are_recomputed_to_hold_the_budget(caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Regions that vary] (placement.py): once the routed blocks are known to vary,
    a budget between recompute's peak and keep's is held by dropping their saves by
    position and replaying them plainly (keeping them whole held keep's peak, 1.6x this
    budget, under the infeasible-budget warning); planned steps hold about the
    prediction; gradients bitwise."""
    model, batch = _routed()
    ref = train(copy.deepcopy(model), batch, steps=14)
    budget = 70_000  # keep holds 93-110 KB, recompute 49-54 KB
    rt = offrecomp.runtime(model, budget=budget, min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        assert_bitwise(ref, train(model, batch, rt, steps=14))
    assert all(r.variable for r in rt.planner.host.regions)
    assert not _messages(caplog, "cannot be met")
    planned = [s for s in rt.report().steps[-5:] if s.phase == "planned"]
    assert len(planned) == 5, [s.phase for s in rt.report().steps]
    for s in planned:
        assert s.recomputed_bytes > 0 and s.replays > 0, s
        assert s.predicted_peak_bytes is not None
        assert s.peak_activation_bytes <= 1.1 * budget, (s.peak_activation_bytes, budget)
        assert s.peak_activation_bytes <= 1.1 * s.predicted_peak_bytes, s
    assert "placed by position, a replay reruns its forward" in rt.explain()


class _RowsBlock(nn.Module):
    """Runs a wide layer on the rows whose first feature is positive (a routing the
    batch sets), and leaves that feature as it is, so every block routes the same rows."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, 32 * d), nn.Linear(32 * d, d)
        self.register_buffer("others", torch.ones(d).index_fill(0, torch.tensor([0]), 0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = (x[:, 0] > 0).nonzero().squeeze(-1)
        y = torch.zeros_like(x).index_add(0, rows, self.down(torch.tanh(self.up(x[rows]))))
        return x + y * self.others


def test_calls_kept_whole_whose_routing_grows_vary_and_the_profile_grows_to_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NOTE [Sizes of regions that vary] (differences.py): the routing takes 8 rows of 64
    but every fourth step 32, so the plan of the profile (8 rows) keeps the blocks whole
    and a 32-row step holds 3.8x its prediction. A call kept whole that saved more bytes
    than its recording counts as a call that differs: the second makes its region vary,
    and each planned pass then grows the profile to what the blocks saved, so from then
    on the 32-row steps hold at most their prediction and the budget (they held 3.8x
    for good when only the count of storages was compared); gradients bitwise."""
    torch.manual_seed(0)
    model = models.Stack([_RowsBlock() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(s))
        x[:, 0] = -1.0
        x[: 32 if (s // 10) % 4 == 3 else 8, 0] = 1.0  # train() draws batch 10 * step
        return x

    budget = 100_000  # keep: 55 KB at 8 rows, 209 KB at 32; recompute: 82 KB at 32
    ref = train(copy.deepcopy(model), batch, steps=24)
    rt = offrecomp.runtime(model, budget=budget, min_bytes=0, native_keep=False)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        assert_bitwise(ref, train(model, batch, rt, steps=24))
    assert all(r.variable for r in rt.planner.host.regions)
    steps = rt.report().steps
    assert steps[3].peak_activation_bytes > 3 * steps[3].predicted_peak_bytes  # the profile's routing, kept whole
    late = [s for s in steps[12:] if s.step % 4 == 3]
    assert late and all(s.phase == "planned" for s in steps[12:]), [s.phase for s in steps]
    for s in late:
        assert s.predicted_peak_bytes is not None
        assert s.peak_activation_bytes <= min(budget, s.predicted_peak_bytes), (s.step, s.peak_activation_bytes, s.predicted_peak_bytes)


class _ScheduledBlock(nn.Module):
    """Its hidden width is set by the loop before each step (``width``): its saves change
    size at the steps the schedule says, under one signature."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.width = 4 * d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(torch.relu(self.up(x)[..., : self.width]))
        return x + self.down(nn.functional.pad(y, (0, 4 * x.shape[-1] - self.width)))


def test_a_region_found_variable_by_a_calibration_is_kept_by_the_plan_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A planned pass that differs (step 4), then a calibration that differs (step 6):
    the regions branch on their state, found after the profile of step 5 was measured.
    The plan of step 7 is solved with them not replayable (NOTE [Calibration sizes]), so
    it books what the step holds, where a plan that drops their saves booked 106 KB for
    254 KB held; gradients bitwise."""
    torch.manual_seed(0)
    model = models.Stack([_ScheduledBlock() for _ in range(3)])
    widths = [64, 96, 96, 96, 112, 112, 80, 80, 80, 80]

    def batches(m: nn.Module) -> Callable[[int], torch.Tensor]:
        def batch(s: int) -> torch.Tensor:
            for b in m.blocks:  # type: ignore[union-attr]
                b.width = widths[s // 10]  # train() draws batch 10 * step
            return torch.randn(64, 32, generator=torch.Generator().manual_seed(s))

        return batch

    plain = copy.deepcopy(model)
    ref = train(plain, batches(plain), steps=10)
    rt = offrecomp.runtime(model, budget=100_000, min_bytes=0, drift=100.0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        assert_bitwise(ref, train(model, batches(model), rt, steps=10))
    steps = rt.report().steps
    assert [s.phase for s in steps[4:]] == ["planned", "measure", "calibrate"] + ["planned"] * 3
    assert len(_messages(caplog, "saved other tensors than its profile")) == 3
    assert not _messages(caplog, "that the placement rules keep")
    for s in steps[7:]:
        assert s.predicted_peak_bytes is not None and s.peak_activation_bytes <= s.predicted_peak_bytes, s


class _DenseLayer(nn.Module):
    """torchvision's DenseNet layer: it takes every earlier feature map (a list) and
    concatenates them, so each map is an input of every later layer; no op saves the
    inputs themselves."""

    def __init__(self, cin: int, growth: int = 4) -> None:
        super().__init__()
        self.bn1, self.c1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, 2 * growth, 1, bias=False)
        self.bn2, self.c2 = nn.BatchNorm2d(2 * growth), nn.Conv2d(2 * growth, growth, 3, padding=1, bias=False)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        h = self.c1(torch.relu(self.bn1(torch.cat(feats, 1))))
        return self.c2(torch.relu(self.bn2(h)))


class _DenseNet(nn.Module):
    def __init__(self, n: int = 10, c0: int = 6, growth: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c0, 3, padding=1)
        self.layers = nn.ModuleList([_DenseLayer(c0 + i * growth, growth) for i in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [self.stem(x)]
        for layer in self.layers:
            feats.append(layer(feats))
        return torch.cat(feats, 1).square().mean()


@pytest.mark.parametrize("frac", [0.5, 0.7])
def test_feature_maps_every_later_layer_takes_are_predicted_as_booked(frac: float) -> None:
    """A DenseNet's planned steps book what the model predicts (NOTE [Inputs counted
    once]): a feature map counts once however many layers take it, also after a layer
    kept whole (which holds no record to find), and not in a layer kept whole, which
    holds no input."""
    torch.manual_seed(0)
    model = _DenseNet()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(s))

    keep = copy.deepcopy(model)
    with offrecomp.runtime(keep, mode="keep", min_bytes=0) as rt:
        keep(batch(0)).backward()
    budget = int(frac * rt.report().steps[-1].peak_activation_bytes)
    ref = train(copy.deepcopy(model), batch, steps=6)
    rt = offrecomp.runtime(model, budget=budget, min_bytes=0, drift=100.0)
    assert_bitwise(ref, train(model, batch, rt, steps=6))
    planned = [s for s in rt.report().steps if s.phase == "planned"]
    assert len(planned) >= 2  # a host pause may send the calibration back once
    for s in planned:
        assert s.peak_activation_bytes == s.predicted_peak_bytes <= budget, (s.peak_activation_bytes, s.predicted_peak_bytes, budget)


def test_a_plan_that_offloads_regions_that_vary_stops_measuring() -> None:
    """NOTE [Regions that vary] (placement.py): under a plan that offloads blocks whose
    routing changes every step, once the blocks are known to vary their storages take
    the plan's placements by position and never send the signature to measure again, so
    the plan runs every step from then on; gradients bitwise."""
    model, batch = _routed()
    ref = train(copy.deepcopy(model), batch, steps=14)
    rt = offrecomp.runtime(model, min_bytes=0, d2h_gbps=5, h2d_gbps=5)
    rt.set_plan(offrecomp.Plan(default=Placement.OFFLOAD))
    assert_bitwise(ref, train(model, batch, rt, steps=14))
    steps = rt.report().steps
    assert all(r.variable for r in rt.planner.host.regions)
    assert [s.phase for s in steps[-5:]] == ["user-plan"] * 5, [s.phase for s in steps]
    assert all(s.offloaded_bytes > 0 for s in steps[-5:])


class _LangevinBlock(nn.Module):
    """A Langevin step on an energy of its own, whose graph a backward inside the forward
    frees, then an MLP whose activations stay for the pass's backward."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.energy = nn.Sequential(nn.Linear(d, 4 * d), nn.Tanh(), nn.Linear(4 * d, 1))
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xd = x.detach().requires_grad_(True)
        g = torch.autograd.grad(self.energy(xd).sum(), xd)[0]
        return x + self.mlp(x - 0.1 * g)


def test_a_budget_the_measuring_pass_met_with_a_backward_inside_the_forward_is_not_an_error() -> None:
    """Saves a backward inside a region's forward reads are kept by every plan and freed by
    that backward: the measuring pass holds no less than a plan does there, so a budget
    it met runs with infeasible='error', within the budget. (The measuring pass books
    320 KiB: its replays rerun the inner backward, whose gradients no op saves, NOTE
    [Replay transients] in scheduler/working_set.py.)"""
    torch.manual_seed(0)
    model = models.Stack([_LangevinBlock() for _ in range(4)])
    budget = 330 * KIB
    rt = offrecomp.runtime(model, mode="auto", budget=budget, min_bytes=0, infeasible="error")
    train(model, lambda s: torch.randn(64, 64, generator=torch.Generator().manual_seed(s)), rt, steps=5)
    steps = rt.report().steps
    assert steps[-1].phase == "planned" and all(s.peak_activation_bytes <= budget for s in steps), steps
