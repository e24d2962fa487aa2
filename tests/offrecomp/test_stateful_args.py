"""Regions whose forward changes the state of an argument object (NOTE [Stateful
arguments] in ``offrecomp/arg_state.py``): the key/value cache of a decoder trained with
``use_cache=True`` is the common case. A replay must see the state the forward saw, and
must leave the object as it found it."""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
import offrecomp.diagnostics
from offrecomp.arg_state import ARG_STATE_MAX_ITEMS, ARG_STATE_PER_REGION, ArgState
from tests.helpers import (
    ZOO_VARIANTS,
    assert_bitwise,
    assert_ends_planned,
    check_variant,
    check_variant_report,
    tight_budget,
    train,
    train_bitwise,
)
from tests.models import Stack

STEPS = 4


class CacheLayer:
    """One layer of a transformers-style dynamic cache: initialised lazily, keys and
    values appended with ``torch.cat`` (rebinding the attributes)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.initialized = False

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.initialized:
            self.keys = torch.tensor([], dtype=k.dtype)  # legacy empty: cat skips it
            self.values = torch.tensor([], dtype=v.dtype)
            self.initialized = True
        assert self.keys is not None and self.values is not None
        self.keys = torch.cat([self.keys, k], dim=1)
        self.values = torch.cat([self.values, v], dim=1)
        return self.keys, self.values


class Cache:
    def __init__(self, n: int) -> None:
        self.layers = [CacheLayer() for _ in range(n)]


class CacheBlock(nn.Module):
    """Attention over every cached key (not causal), scaled by how many there are: a
    replay that appends its keys a second time gives other values, not only other bits."""

    def __init__(self, idx: int, d: int = 32) -> None:
        super().__init__()
        self.idx = idx
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        keys, values = cache.layers[self.idx].update(k, v)
        att = F.softmax(q @ keys.transpose(1, 2) / keys.shape[-1] ** 0.5, dim=-1)
        return x + self.out(att @ values) * (keys.shape[1] / x.shape[1])


class CacheModel(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CacheBlock(i) for i in range(n))
        self.last_cache: Cache | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = Cache(len(self.blocks))
        self.last_cache = cache
        for b in self.blocks:
            x = b(x, cache)
        return x.square().mean()


def _batch(seed: int) -> torch.Tensor:
    return torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", ZOO_VARIANTS)
def test_a_cache_argument_replays_as_the_forward_saw_it(variant: str) -> None:
    torch.manual_seed(0)
    _, m = check_variant(CacheModel(), _batch, variant, steps=STEPS)
    assert isinstance(m, CacheModel)
    # the cache is as the forward left it: each layer holds one copy of its keys
    assert m.last_cache is not None
    assert all(layer.keys is not None and layer.keys.shape[1] == 6 for layer in m.last_cache.layers)


def test_arg_state_records_restores_and_compares_by_identity() -> None:
    cache = Cache(2)
    before = ArgState.capture([cache])
    assert before.complete and before.same(ArgState.capture([cache]))
    k = torch.zeros(1, 3, 4)
    cache.layers[1].update(k, k)
    cache.layers.append(CacheLayer())
    cache.extra = {"seen": 1}  # type: ignore[attr-defined]
    after = ArgState.capture([cache])
    assert not before.same(after)
    with before.at_entry():  # as a replay sees them
        assert len(cache.layers) == 2 and not hasattr(cache, "extra")
        assert cache.layers[1].keys is None and not cache.layers[1].initialized
        cache.layers[0].update(k, k)  # what the replay writes goes too
    assert len(cache.layers) == 3 and cache.extra == {"seen": 1}  # type: ignore[attr-defined]
    assert cache.layers[1].keys is not None and cache.layers[1].keys.shape == (1, 3, 4)
    assert cache.layers[0].keys is None


class Big:
    """More bindings than the runtime tracks for a model of two regions."""

    def __init__(self) -> None:
        self.items = {str(i): i for i in range(ARG_STATE_MAX_ITEMS + 2 * ARG_STATE_PER_REGION + 1)}
        self.count = 1


class BigBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, state: Big) -> torch.Tensor:
        state.count += 1  # a replay seeing the count the forward left would scale otherwise
        return torch.tanh(self.fc(x) * state.count)


class BigModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(BigBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = Big()
        for b in self.blocks:
            x = b(x, state)
        return x.sum()


@pytest.mark.parametrize("changes", [True, False])
def test_state_too_large_to_record_keeps_its_region_when_it_changes(
    changes: bool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [Stateful arguments]: a call whose argument state is too large to record is
    not replayed (it keeps); one that changed it makes its region keep from then on,
    named in a warning, and gradients match plain. A region whose first such call left
    the state as it was recomputes its later calls."""
    offrecomp.diagnostics.clear_warnings()
    if not changes:
        monkeypatch.setattr(BigBlock, "forward", lambda self, x, state: torch.tanh(self.fc(x)))
    torch.manual_seed(0)
    model = BigModel()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(s))

    ref = train(copy.deepcopy(model), batch, steps=3)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        assert_bitwise(ref, train(m, batch, rt, steps=3))
    msgs = [r.getMessage() for r in caplog.records if "changes the state of its arguments" in r.getMessage()]
    recomputed = [s.recomputed_bytes for s in rt.report().steps]
    if changes:
        assert msgs and "Big" in msgs[0] and "use_cache=False" in msgs[0] and "never recomputed" in msgs[0]
        assert recomputed == [0, 0, 0]
    else:
        assert not msgs
        assert recomputed[0] == 0 and recomputed[1] > 0  # the first call of each region keeps


class _SharedStats(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ema", torch.zeros(16))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        self.ema.mul_(0.9).add_(0.1 * y.detach().mean(0))
        return y + self.ema


class _ForeignWriter(nn.Module):
    """Updates a buffer of a module it reaches through a plain attribute, not one of its
    own submodules nor an argument: no snapshot of it exists for a replay."""

    def __init__(self, stats: _SharedStats) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.stats = [stats]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        return x + self.b(self.stats[0](h))


class _ForeignModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stats = _SharedStats()
        self.blocks = nn.ModuleList([_ForeignWriter(self.stats) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve"])
def test_a_region_writing_a_tensor_it_does_not_own_is_kept(variant: str, caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [State written by its region]: a replay would update the shared buffer a second
    time and read its later value. The watched first call keeps what it saves from the
    write on (its replay stops before it), and the region is kept from then on."""
    offrecomp.diagnostics.clear_warnings()
    torch.manual_seed(0)
    model = _ForeignModel()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))

    ref = train(copy.deepcopy(model), batch, steps=4)
    budget = tight_budget(model, batch) if variant != "recompute" else None
    m = copy.deepcopy(model)
    rt = train_bitwise(m, batch, variant, budget, ref, steps=4)  # the buffer is compared too
    assert any("neither owns nor takes" in r.getMessage() for r in caplog.records)
    steps = rt.report().steps
    assert steps[0].replays > 0 and steps[0].recomputed_bytes > 0  # the watched first call: up to the write
    assert all(s.replays == 0 and s.recomputed_bytes == 0 for s in steps[1:]), [  # kept from then on
        (s.replays, s.recomputed_bytes) for s in steps
    ]


@pytest.mark.parametrize("variant", ["recompute", "auto_frugal"])
def test_requires_grad_switched_between_forward_and_backward(variant: str) -> None:
    """NOTE [Replay and parameters]: a block frozen after its forward and before the
    backward is replayed with the flags the forward saw (it saves what the forward saved),
    and the flags are the user's again afterwards."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])

    def run(m: nn.Module, ctx: Any) -> list[torch.Tensor | None]:
        grads: list[torch.Tensor | None] = []
        with ctx:
            for s in range(4):
                x = torch.randn(4, 8, generator=torch.Generator().manual_seed(s))
                loss = m(x).square().sum()
                for p in m[1].parameters():
                    p.requires_grad_(False)
                loss.backward()
                assert not any(p.requires_grad for p in m[1].parameters())
                for p in m[1].parameters():
                    p.requires_grad_(True)
                grads += [None if p.grad is None else p.grad.clone() for p in m.parameters()]
                m.zero_grad(set_to_none=True)
        return grads

    want = run(copy.deepcopy(model), contextlib.nullcontext())
    m = copy.deepcopy(model)
    # auto under a budget it cannot meet: its most frugal plan drops what it can
    kw: dict[str, Any] = {"mode": "recompute"} if variant == "recompute" else {"mode": "auto", "budget": 1}
    got = run(m, offrecomp.runtime(m, min_bytes=0, **kw))
    assert len(want) == len(got)
    assert all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b)) for a, b in zip(want, got))


class _MemoryBlock(nn.Module):
    """A recurrent memory kept as a buffer that starts as None (Transformer-XL style):
    the forward reads the previous step's memory, then sets this step's."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.register_buffer("mem", None, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if self.mem is None else x + self.mem
        self.mem = x.detach()
        return x + self.fc2(torch.tanh(self.fc1(h)))


@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve"])
def test_a_buffer_none_at_entry_replays_as_none(variant: str) -> None:
    """NOTE [Replay and module state]: a buffer slot that was None when the forward began
    is None in its replay, not the tensor the forward set; also when the loop resets the
    memory to None between steps (a document boundary)."""
    torch.manual_seed(0)
    model = Stack([_MemoryBlock() for _ in range(3)])
    training: list[nn.Module] = []

    def batch(s: int) -> torch.Tensor:
        if s == 30 and training:
            for b in training[0].blocks:  # type: ignore[union-attr]
                b.mem = None
        return torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(s))

    budget = tight_budget(copy.deepcopy(model), batch) if variant != "recompute" else None
    training.append(copy.deepcopy(model))
    # seven steps: the memory's first and reset steps save other tensors (auto measures
    # again); the three after the reset reach a plan
    ref = train(training[0], batch, steps=7)
    training[0] = copy.deepcopy(model)
    rt = train_bitwise(training[0], batch, variant, budget, ref, steps=7)
    check_variant_report(rt.report().steps, variant, n_steps=7, stable=False, plans=True)
    if variant != "recompute":
        assert_ends_planned(rt.report().steps)


class _ChunkedModel(nn.Module):
    """Runs its memory blocks over two chunks of its input and clears their memories
    before it returns (a streaming encoder's per-utterance cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_MemoryBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = []
        for chunk in x.chunk(2, dim=1):
            for b in self.blocks:
                chunk = b(chunk)
            out.append(chunk)
        for b in self.blocks:
            b.mem = None
        return torch.cat(out, 1).square().mean()


def test_a_buffer_empty_at_entry_and_cleared_by_the_forward_plans() -> None:
    """A call's layout took the stride of a buffer slot empty at its entry from the slot
    as it was when the layout was read: the tensor the forward set when the recording
    was made, nothing at the replay once the model cleared it. Each replay took the
    recording for stale, the signature measured again every other step and then warned
    of inputs of another layout from step to step. A slot empty at entry now counts as
    empty, as the replay sees it."""
    torch.manual_seed(0)
    model = _ChunkedModel()

    def batch(s: int) -> torch.Tensor:
        return torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(s))

    ref = train(copy.deepcopy(model), batch, steps=6)
    rt = train_bitwise(copy.deepcopy(model), batch, "auto", None, ref, steps=6)
    steps = rt.report().steps
    phases = [s.phase for s in steps]
    # measured once; a collection inside a calibration pass's region, which has no
    # repeated peer, sends that pass back (NOTE [Host pauses]): then planned for good
    assert phases[0] == "measure" and "measure" not in phases[1:], phases
    calibrations = [i for i, ph in enumerate(phases) if ph == "calibrate"]
    assert calibrations and calibrations == list(range(1, calibrations[-1] + 1)), phases
    assert all("calibrating again" in " ".join(steps[i].notes) for i in calibrations[:-1]), phases
    assert phases[calibrations[-1] + 1:] == ["planned"] * (5 - calibrations[-1]), phases


class _Carried:
    def __init__(self, mem: torch.Tensor) -> None:
        self.mem = mem


class _CarriedBlock(nn.Module):
    """Reads a memory the caller carries from block to block through an object."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, st: _Carried) -> torch.Tensor:
        return x + self.l2(torch.tanh(self.l1(x) * torch.sigmoid(st.mem)))


class _CarriedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_CarriedBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        st = _Carried(x)
        for b in self.blocks:
            x = b(x, st)
            st.mem = x  # the caller rebinds it after the call: the next block reads this one's output
        return x.square().mean()


@pytest.mark.parametrize("variant", ZOO_VARIANTS)
def test_a_binding_the_caller_changes_after_the_call_replays_as_the_forward_saw_it(variant: str) -> None:
    """NOTE [Stateful arguments]: the replay puts back the bindings the forward read,
    also where the caller changed them after the call returned."""
    torch.manual_seed(0)
    check_variant(_CarriedModel(), _batch, variant, steps=STEPS)


def test_a_tensor_in_an_argument_object_written_after_the_call_is_an_error() -> None:
    """A tensor reached through an argument object and written in place after the
    region's forward: a replay that reads it would read other values than the forward
    did, so the replay raises at that read, naming it (a tensor argument raises alike;
    NOTE [State written after the forward])."""

    class Biased(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(32, 32)

        def forward(self, x: torch.Tensor, st: _Carried) -> torch.Tensor:
            return x + torch.tanh(self.lin(x) + st.mem)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Biased() for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            st = _Carried(torch.zeros(32))
            for b in self.blocks:
                x = b(x, st)
            with torch.no_grad():
                st.mem.add_(1)  # after every call read it
            return x.square().mean()

    m = Model()
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        loss = m(_batch(0))
        with pytest.raises(RuntimeError, match=r"_Carried\.mem \(a tensor reached through an argument, version 0 -> 1\) in region 'blocks\.1' was modified in place since the region's forward read it, and replaying the region reads it"):
            loss.backward()


class _Offsets:
    """Per-block offsets in one object every block takes (as a Mamba-2 cache holds each
    layer's token counter), or one offset they all share (``shared``)."""

    def __init__(self, n: int, shared: bool, numel: int = 1) -> None:
        one = torch.zeros(numel)
        self.offsets = [one if shared else torch.zeros(numel) for _ in range(n)]


class _OffsetBlock(nn.Module):
    """Reads its offset, then advances it in place (NOTE [State written by the forward]);
    from call ``writes_from`` of the model on (counted by the model)."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.i = i
        self.lin = nn.Linear(32, 32)
        self.writes = True

    def forward(self, x: torch.Tensor, st: _Offsets) -> torch.Tensor:
        off = st.offsets[self.i]
        h = torch.tanh(self.lin(x) + off.mean())
        if self.writes:
            off.add_(1.0)
        return x + h


class _OffsetModel(nn.Module):
    def __init__(self, shared: bool = False, numel: int = 1, writes_from: int = 0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_OffsetBlock(i) for i in range(3))
        self.shared, self.numel, self.writes_from = shared, numel, writes_from
        self.calls = 0
        self.state: _Offsets | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state = st = _Offsets(len(self.blocks), self.shared, self.numel)
        for b in self.blocks:
            b.writes = self.calls >= self.writes_from
            x = b(x, st)
        self.calls += 1
        return x.square().mean()


@pytest.mark.parametrize("variant", ZOO_VARIANTS)
@pytest.mark.parametrize("shared", [False, True])
def test_state_the_forward_writes_replays_from_its_entry_value(variant: str, shared: bool) -> None:
    """NOTE [State written by the forward]: each block reads its offset and advances it
    in place (its own, or one all share, which the later blocks advance again). A replay
    reads the offset the forward read, never the advanced one; the gradients are plain's."""
    torch.manual_seed(0)
    check_variant(_OffsetModel(shared), _batch, variant, steps=STEPS)


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_replay_leaves_the_state_as_the_forward_left_it(mode: str) -> None:
    """The offsets after backward are the forward's: a replay writes them again, and the
    values it found go back (plain runs advance each once per step)."""
    torch.manual_seed(0)
    m = _OffsetModel()
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, **({"budget": 1} if mode == "auto" else {}))
    with rt:
        for step in range(STEPS):
            m(_batch(step)).backward()
            assert m.state is not None
            assert [float(o) for o in m.state.offsets] == [1.0, 1.0, 1.0], (step, m.state.offsets)
    # auto's most frugal plan keeps the last block whole: its replay, at the backward's
    # start, would hold the Linear's output beside the tanh's it brings back (NOTE
    # [Replay transients] in scheduler/working_set.py)
    assert rt.report().steps[-1].replays == (3 if mode == "recompute" else 2)


def test_state_written_too_large_to_copy_keeps_the_calls_activations() -> None:
    """An offset larger than ARG_COPY_MAX_BYTES: the first call's watch copies it before
    the write; the region's later calls keep their activations rather than copy it."""
    from offrecomp.arg_state import ARG_COPY_MAX_BYTES

    torch.manual_seed(0)
    m = _OffsetModel(numel=ARG_COPY_MAX_BYTES // 4 + 1)
    ref = train(copy.deepcopy(m), _batch, steps=3)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    assert_bitwise(ref, train(m, _batch, rt, steps=3))
    steps = rt.report().steps
    assert steps[0].replays == 3 and steps[-1].replays == 0, [s.replays for s in steps]


def test_state_a_later_call_first_writes_stops_its_replay() -> None:
    """A block that writes its offset only from the second step on: the first call's
    watch saw no write, so nothing was copied, and that step's replay would read the
    advanced offset. It raises instead, naming the tensor."""
    torch.manual_seed(0)
    m = _OffsetModel(writes_from=1)
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        m(_batch(0)).backward()
        loss = m(_batch(1))
        with pytest.raises(RuntimeError, match=r"list\[2\], reached through an argument of region 'blocks\.2', was written in place by the region's forward where no copy"):
            loss.backward()


_GLOBAL_OFFSET = [torch.zeros(())]


class _OutsideWriter(nn.Module):
    """Reads a tensor it neither owns nor takes as an argument, then advances it in place
    (``how``: a plain tensor attribute of its own, a global, one reached through a plain
    attribute list); or (``workspace``) overwrites all of one it shares, then reads it."""

    def __init__(self, how: str, shared: list[torch.Tensor]) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.how = how
        self.pos = torch.zeros(())  # not a buffer
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "workspace":
            ws = self.shared[0]
            ws.copy_(x.detach() * 2)  # every block overwrites it, then reads it (unsaved)
            return x + torch.tanh(self.lin(x) + ws)
        t = {"attribute": self.pos, "global": _GLOBAL_OFFSET[0], "reached": self.shared[0]}[self.how]
        h = torch.tanh(self.lin(x) + t)
        t.add_(1.0)
        return x + h


class _OutsideModel(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        shared = [torch.zeros(2, 6, 32) if how == "workspace" else torch.zeros(())]
        self.blocks = nn.ModuleList(_OutsideWriter(how, shared) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


@pytest.mark.parametrize("variant", ["recompute", "auto_tight"])
@pytest.mark.parametrize("how", ["attribute", "global", "reached", "workspace"])
def test_a_tensor_from_outside_the_call_read_then_written_replays_as_read(
    how: str, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [State written by its region]: the first call reads a tensor from outside it,
    then writes it; its watch copied the tensor before the write, and the replay reads the
    copy, not the written value. A workspace overwritten whole before it is read needs no
    copy, even one too large to copy (the call keeps what it saves from its first write
    on, so no replay passes it). Later calls keep their activations."""
    from offrecomp.trace import recorder

    monkeypatch.setattr(recorder, "EXTERNAL_COPY_MAX_BYTES", 16)  # the workspace is larger
    _GLOBAL_OFFSET[0] = torch.zeros(())
    torch.manual_seed(0)
    model = _OutsideModel(how)
    ref = train(copy.deepcopy(model), _batch, steps=3)
    _GLOBAL_OFFSET[0] = torch.zeros(())
    budget = tight_budget(copy.deepcopy(model), _batch) if variant != "recompute" else None
    _GLOBAL_OFFSET[0] = torch.zeros(())
    rt = train_bitwise(model, _batch, variant, budget, ref, steps=3)
    steps = rt.report().steps
    if how != "workspace":
        assert steps[0].replays > 0 and steps[0].recomputed_bytes > 0
    else:  # written first thing: the call keeps everything from there, and no replay runs
        assert steps[0].replays == 0 and steps[0].recomputed_bytes == 0
    # later calls keep their activations
    assert all(s.replays == 0 and s.recomputed_bytes == 0 for s in steps[1:]), [
        (s.replays, s.recomputed_bytes) for s in steps
    ]


def test_a_tensor_from_outside_the_call_too_large_to_copy_stops_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read, then written, and larger than the watch copies: the replay would read the
    written value, so it raises instead."""
    from offrecomp.trace import recorder

    monkeypatch.setattr(recorder, "EXTERNAL_COPY_MAX_BYTES", 0)
    torch.manual_seed(0)
    m = _OutsideModel("attribute")
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        loss = m(_batch(0))
        with pytest.raises(RuntimeError, match="too large to copy before the write"):
            loss.backward()


class _OutsideReader(nn.Module):
    """Reads a tensor from outside its call without writing it (a global scale), or
    (``view``) advances one entry of an outside counter through a view after reading it."""

    def __init__(self, scale: list[torch.Tensor], view: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.scale = scale
        self.view = view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale[0]
        h = torch.tanh(self.lin(x) + s[0])  # an add: plain autograd saves nothing of s
        if self.view:
            s[0] += 1.0  # a select, then an in-place add on the view
        return x + h


def _outside_readers(view: bool, numel: int = 1) -> nn.Module:
    scale = [torch.zeros(numel)]
    return Stack([_OutsideReader(scale, view) for _ in range(3)])


def _train_writing_between(
    model: nn.Module, rt: Any, steps: int = 3, through_data: bool = False
) -> list[dict[str, torch.Tensor]]:
    """Each step writes the readers' shared tensor after the forward, before the backward
    (``through_data``: through ``.data``, which moves no version)."""
    out = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with rt if rt is not None else contextlib.nullcontext():
        for step in range(steps):
            loss = model(_batch(step))
            with torch.no_grad():
                scale = model.blocks[0].scale[0]
                (scale.data if through_data else scale).add_(0.5)
            loss.backward()
            out.append({f"grad.{n}": p.grad.clone() for n, p in model.named_parameters()})
            opt.step()
            opt.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("mode", ["recompute", "auto"])
@pytest.mark.parametrize("view", [False, True])
@pytest.mark.parametrize("through_data", [False, True])
def test_a_tensor_from_outside_written_between_forward_and_backward_replays_as_read(
    mode: str, view: bool, through_data: bool
) -> None:
    """NOTE [State read from outside]: the loop writes a tensor the blocks read (and do
    not save) after the forward: each replay runs on the values its forward read, not
    the written ones. Also where the blocks advance it through a view
    (NOTE [State written by its region]: a view of an outside tensor is not the call's),
    and where the loop writes it through ``.data``, which moves no version: a replay
    holding the copy only where the version moved read the written values."""
    torch.manual_seed(0)
    model = _outside_readers(view)
    ref = _train_writing_between(copy.deepcopy(model), None, through_data=through_data)
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, **({"budget": 1} if mode == "auto" else {}))
    assert_bitwise(ref, _train_writing_between(m, rt, through_data=through_data))
    assert rt.report().steps[0].recomputed_bytes > 0


def test_a_large_tensor_from_outside_written_before_the_backward_stops_the_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Too large to copy at each call: only its version is noted, and a replay that
    reads it after it was written raises, naming it."""
    import offrecomp.call_state

    monkeypatch.setattr(offrecomp.call_state, "READ_SNAPSHOT_MAX_BYTES", 0)
    torch.manual_seed(0)
    m = _outside_readers(False, numel=4)
    with offrecomp.runtime(m, mode="recompute", min_bytes=0):
        loss = m(_batch(0))
        with torch.no_grad():
            m.blocks[0].scale[0].add_(0.5)
        with pytest.raises(RuntimeError, match=r"a \(4,\) tensor from outside the call \(version 0 -> 1\)"):
            loss.backward()


class _Bias(nn.Module):
    """x-transformers' ALiBi bias: computed at the first call with arange, kept in a
    buffer (rebound, not written), sliced at later calls."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", None, persistent=False)

    def forward(self, n: int) -> torch.Tensor:
        if self.bias is not None and self.bias.shape[-1] >= n:
            return self.bias[:n, :n]
        pos = torch.arange(n, dtype=torch.float32)
        self.register_buffer("bias", -(pos[None, :] - pos[:, None]).abs(), persistent=False)
        return self.bias


class _BiasedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qk = nn.Linear(16, 32)
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor, rel_pos: nn.Module) -> torch.Tensor:
        q, k = self.qk(x).chunk(2, dim=-1)
        x = x + torch.softmax(q @ k.transpose(-1, -2) + rel_pos(x.shape[1]), dim=-1) @ x
        return x + self.fc2(F.gelu(self.fc1(x)))


class _BiasedModel(nn.Module):
    """The blocks take the model's bias module as an argument (x-transformers' rel_pos)."""

    def __init__(self) -> None:
        super().__init__()
        self.rel_pos = _Bias()
        self.blocks = nn.ModuleList(_BiasedBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, rel_pos=self.rel_pos)
        return x.square().mean()


@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve"])
def test_a_module_argument_whose_buffer_the_forward_rebinds_replays_as_the_forward_saw_it(variant: str) -> None:
    """NOTE [Modules among the arguments]: the first block's first forward fills the
    bias module's buffer; its replay runs with the buffer as that forward found it (None:
    the same ops) and leaves it filled. The recording of that call ran ops the later
    calls do not (they slice the bias): serving replays measure again instead of
    raising, then serve."""
    torch.manual_seed(0)
    rt, m = check_variant(
        _BiasedModel(), lambda s: torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(s)), variant, steps=8
    )
    assert m.rel_pos.bias is not None and m.rel_pos.bias.shape == (6, 6)
    if variant == "auto_serve":
        assert rt.report().steps[-1].served_ops > 0


class _Steps(nn.Module):
    """Counts its calls in a buffer it rebinds (``self.count = self.count + 1``)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()), persistent=False)

    def forward(self) -> torch.Tensor:
        self.count = self.count + 1
        return self.count


class _CountedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, steps: nn.Module) -> torch.Tensor:
        return x + torch.tanh(self.fc(x)) / steps()


@pytest.mark.parametrize("variant", ["recompute", "auto_tight", "auto_serve"])
def test_a_replay_sees_a_module_arguments_buffers_as_its_forward_did(variant: str) -> None:
    """NOTE [Modules among the arguments]: each block's forward rebinds the counter's
    buffer; a replay reading the count after every block ran would scale by another
    number (gradients silently off), and would count once more."""
    torch.manual_seed(0)
    steps = _Steps()

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.steps = steps
            self.blocks = nn.ModuleList(_CountedBlock() for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x, self.steps)
            return x.square().mean()

    _, m = check_variant(Model(), lambda s: torch.randn(4, 16, generator=torch.Generator().manual_seed(s)), variant,
                         steps=6)
    assert int(m.steps.count) == 3 * 6


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_a_whole_model_handed_to_each_block_is_passed_over(mode: str) -> None:
    """NOTE [Modules among the arguments]: a module argument of more modules than
    ARG_MODULES_MAX (a whole model, here with more buffers than a call may record) is
    not walked at every call; a small one is; the blocks drop and replay, bitwise."""
    from offrecomp.arg_state import ARG_MODULES_MAX

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor, model: nn.Module) -> torch.Tensor:
            return x + torch.tanh(self.fc(x)) * model.scale

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stats = nn.ModuleList(nn.BatchNorm1d(4) for _ in range(200))  # 600 buffers
            self.scale = nn.Parameter(torch.tensor(0.5))
            self.blocks = nn.ModuleList(Block() for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x, self)
            return x.square().mean()

    torch.manual_seed(0)
    model = Model()
    assert len(list(model.modules())) > ARG_MODULES_MAX
    assert ARG_STATE_MAX_ITEMS + 3 * ARG_STATE_PER_REGION < 3 * 200
    assert ArgState.capture([model]).entries == []
    assert [kind for _, kind, _ in ArgState.capture([model.stats[0]]).entries] == ["buffers"]

    def batch(s: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(s))

    ref = train(copy.deepcopy(model), batch, steps=STEPS)
    rt = offrecomp.runtime(model, mode=mode, min_bytes=0, **({"budget": 1} if mode == "auto" else {}))
    assert_bitwise(ref, train(model, batch, rt, steps=STEPS))
    last = rt.report().steps[-1]
    # auto's most frugal plan drops in every block: kept whole, the last block's forward
    # would hold its Linear's and its product's outputs beside every block's saves (NOTE
    # [Forward transients] in scheduler/working_set.py), 1.2x what its replay holds
    assert last.recomputed_bytes > 0 and last.replays == 3, (last.recomputed_bytes, last.replays)
