"""The pack hook's fast paths: a forced mode's fixed placement and a planned call's
placement table (NOTE [Placement table] in offrecomp/placement.py) decide exactly what the
placement rules would."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

import offrecomp
from offrecomp.placement import Placements
from tests.helpers import assert_bitwise, make, tight_budget, train, twin


def _count_decisions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kinds of the storages of region calls (not the root) that the placement rules
    decided one by one."""
    kinds: list[str] = []
    original = Placements._rules

    def spy(self: Any, p: Any, call: Any, index: int, nbytes: int, kind: str) -> Any:
        if not call.is_root:
            kinds.append(kind)
        return original(self, p, call, index, nbytes, kind)

    monkeypatch.setattr(Placements, "_rules", spy)
    return kinds


@pytest.mark.parametrize("mode", ["keep", "offload", "recompute"])
def test_a_forced_mode_decides_no_activation(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = _count_decisions(monkeypatch)
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=2)
    m = twin(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    assert_bitwise(ref, train(m, batch, rt, steps=2))
    assert "activation" not in kinds
    saves = [0]

    def count(t: torch.Tensor) -> torch.Tensor:
        saves[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        torch.manual_seed(0)
        model(batch(0)).backward()
    rec = rt.report().steps[-1]
    assert rec.saved_tensors == saves[0] and 0 < rec.storages <= saves[0]  # counted off the save path


@pytest.mark.parametrize("mode", ["offload", "recompute", "auto"])
def test_known_placements_skip_the_decision(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Known placements]: a forced offload's or recompute's activations, and a
    planned call's whose table has their size, are placed without ``Placements.decide``;
    gradients bitwise."""
    decided: list[str] = []
    original = Placements.decide

    def spy(self: Any, p: Any, call: Any, rec: Any, kind: str, t: Any, storage: Any) -> Any:
        if kind == "activation" and not call.is_root and call.recorder is None:
            decided.append(call.name)
        return original(self, p, call, rec, kind, t, storage)

    model, batch = make("gpt_dropout")
    steps = 6
    ref = train(twin(model), batch, steps=steps)
    m = twin(model)
    budget = tight_budget(model, batch) if mode == "auto" else None
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, budget=budget)
    assert_bitwise(ref, train(m, batch, rt, steps=steps))
    monkeypatch.setattr(Placements, "decide", spy)
    with rt:
        m(batch(99)).backward()
    last = rt.report().steps[-1]
    assert last.phase == ("planned" if mode == "auto" else mode)
    assert last.storages > 0 and (last.offloaded_bytes > 0 if mode == "offload" else last.recomputed_bytes > 0)
    assert decided == []


def test_a_storage_the_pool_refuses_asks_it_once_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forced offload whose pinned pool is too small: each storage asks the pool once
    (joined, or refused and counted as a fallback once); gradients bitwise."""
    from offrecomp.offload import OffloadEngine

    asked, added, refused = [0], [0], [0]
    add, not_joined = OffloadEngine.add, Placements.not_joined

    def spy_add(self: Any, *args: Any) -> int:
        asked[0] += 1
        slot = add(self, *args)
        added[0] += slot >= 0
        return slot

    def spy_not_joined(self: Any, call: Any, kind: str, joined: bool | None) -> Any:
        refused[0] += joined is False
        return not_joined(self, call, kind, joined)

    monkeypatch.setattr(OffloadEngine, "add", spy_add)
    monkeypatch.setattr(Placements, "not_joined", spy_not_joined)
    model, _ = make("gpt_dropout")

    def batch(s: int) -> torch.Tensor:  # about 3 MiB of activations: more than the pool takes
        return torch.randint(0, 64, (8, 48), generator=torch.Generator().manual_seed(s))

    ref = train(twin(model), batch, steps=2)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, host_limit="1MiB")
    assert_bitwise(ref, train(m, batch, rt, steps=2))
    assert added[0] > 0 and refused[0] > 0
    assert asked[0] == added[0] + refused[0]
    fallbacks = sum(sum(s.fallbacks.get(k, 0) for k in ("offload_to_recompute", "offload_to_keep"))
                    for s in rt.report().steps)
    assert fallbacks >= refused[0]  # each refusal counted (issue-time refusals add to it)


def test_planned_calls_read_their_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every entry of a planned call's table is what the placement rules say for a
    storage of that size and kind; a planned pass applies the rules one by one only to
    its region inputs; gradients stay bitwise."""
    model, batch = make("gpt_dropout")
    steps = 6
    ref = train(twin(model), batch, steps=steps)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget=tight_budget(model, batch))
    checked = [0]
    original, rules = Placements.build_table, Placements._rules

    def spy_table(self: Any, call: Any) -> None:
        original(self, call)
        if call.table is None:
            return
        kinds = [r.kind for r in call.structure.storage_records]
        for i, (pl, n) in enumerate(zip(call.table, call.table_sizes)):
            kind = "input" if kinds[i] == "input" else "activation"
            assert rules(self, call.pass_state, call, i, n, kind) == pl
            checked[0] += 1

    monkeypatch.setattr(Placements, "build_table", spy_table)
    assert_bitwise(ref, train(m, batch, rt, steps=steps))
    assert checked[0] > 0, "no planned call had a table"
    planned = [s for s in rt.report().steps if s.phase == "planned"]
    assert planned and planned[-1].recomputed_bytes > 0  # the table dropped what the plan drops

    kinds = _count_decisions(monkeypatch)  # one more planned step
    with rt:
        m(batch(99)).backward()
    assert rt.report().steps[-1].phase == "planned"
    assert kinds and set(kinds) == {"input"}  # captured before the call's table is built


def test_a_planned_call_with_another_size_takes_the_full_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planned call's storage whose size is not its table's (here: every table's sizes
    shifted by a byte) misses the table and takes the placement rules, one by one; the
    step stays planned and its gradients bitwise those of a plain twin."""
    model, batch = make("gpt_dropout")
    plain, m = twin(model), twin(model)
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget=tight_budget(model, batch))
    assert_bitwise(train(plain, batch, steps=4), train(m, batch, rt, steps=4))
    missed: list[str] = []  # activations of calls with a table that the rules decided
    rules, tables = Placements._rules, Placements.build_table
    built = [0]

    def spy(self: Any, p: Any, call: Any, index: int, nbytes: int, kind: str) -> Any:
        if kind == "activation" and not call.is_root and call.table is not None:
            missed.append(call.name)
        return rules(self, p, call, index, nbytes, kind)

    def shrunk(self: Any, call: Any) -> None:
        tables(self, call)
        if call.table_sizes:
            built[0] += 1
            call.table_sizes = [n + 1 for n in call.table_sizes]  # no storage matches

    monkeypatch.setattr(Placements, "_rules", spy)
    monkeypatch.setattr(Placements, "build_table", shrunk)
    snaps = []
    for mod, ctx in ((plain, contextlib.nullcontext()), (m, rt)):
        with ctx:
            torch.manual_seed(99)  # dropout draws
            mod(batch(9)).backward()
        snaps.append([{n: p.grad.detach().clone() for n, p in mod.named_parameters() if p.grad is not None}])
    assert rt.report().steps[-1].phase == "planned", rt.report().steps[-1].phase
    assert built[0] > 0 and len(missed) >= built[0], (built, missed)  # every table missed at least once
    assert_bitwise(snaps[0], snaps[1])


def test_offloaded_saves_that_cover_their_storage_join_their_group_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Typed sources]: a save that fills its storage from the first element (in its
    dimensions' order or another) joins its group as an alias of itself with its
    geometry, any other as its storage; gradients stay bitwise."""
    from offrecomp.groups import TYPED_DTYPES, OffloadGroups
    from offrecomp.offload import OffloadEngine
    from offrecomp.transfer import Group, dense_from_start

    added: list[tuple[bool, bool]] = []  # (typed, the source or its base fills its storage densely)
    original, join = OffloadEngine.add, OffloadGroups.join
    joining: list[torch.Tensor] = []  # the save ``OffloadGroups.join`` places (a flat source's tensor)

    def covered(t: torch.Tensor, nbytes: int) -> bool:
        base = t._base
        return t.dtype in TYPED_DTYPES and (
            (dense_from_start(t) and t.nbytes == nbytes)
            or (type(base) is torch.Tensor and base.dtype in TYPED_DTYPES and base.nbytes == nbytes
                and base.storage_offset() == 0 and base.is_contiguous())
        )

    def spy_join(self: OffloadGroups, call: Any, rec: Any, t: torch.Tensor, *args: Any) -> Any:
        joining.append(t)
        try:
            return join(self, call, rec, t, *args)
        finally:
            joining.pop()

    def spy(self: OffloadEngine, group: Group, source: Any, nbytes: int, stride: Any = None) -> int:
        typed = isinstance(source, torch.Tensor)  # else the storage: a flat slot
        if typed:
            covers = covered(source, nbytes)
            assert stride is None or (stride == source.stride() and not source.is_contiguous())
        else:  # the save behind it: one that (or whose base) covers its storage must not go flat
            assert joining, "a flat source added outside OffloadGroups.join"
            covers = covered(joining[-1], nbytes)
        added.append((typed, covers))
        return original(self, group, source, nbytes, stride)

    monkeypatch.setattr(OffloadEngine, "add", spy)
    monkeypatch.setattr(OffloadGroups, "join", spy_join)
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=2)
    m = twin(model)
    assert_bitwise(ref, train(m, batch, offrecomp.runtime(m, mode="offload", min_bytes=0), steps=2))
    assert added and all(typed == covers for typed, covers in added), added
    assert any(typed for typed, _ in added)


class _ViewsBlock(torch.nn.Module):
    """Saves views whose own geometry does not cover their storage but whose base does:
    parts of a split (attention's q, k and v of one projection) and a transposed
    activation (as a matrix product saves a transposed weight under autocast); and
    attention's output, made with permuted strides (no base)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(16, dim=-1)
        h = q * torch.sigmoid(k) + v  # saves q and k: strided parts of one storage
        w = self.proj(h)
        h = h + torch.mm(h, w.t()).tanh() @ w / 16  # saves w.t(): a permuted view
        heads = [t.unflatten(-1, (2, 8)).transpose(0, 1).unsqueeze(0) for t in (q, k, v)]  # (1, 2, 6, 8)
        a = torch.nn.functional.scaled_dot_product_attention(*heads)
        return h + a.squeeze(0).transpose(0, 1).flatten(-2).sin()


def test_saved_views_and_permuted_saves_join_their_group_typed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NOTE [Typed sources]: a save that is a view of part of its storage, or a permuted
    one, over a base that covers the storage contiguously joins its group as an alias of
    the base, and one that fills its storage in a permuted order as itself with its
    strides (no flat tensor made at issue); gradients stay bitwise."""
    from offrecomp.offload import OffloadEngine
    from offrecomp.transfer import Group
    from tests.models import Stack

    added: list[tuple[Any, Any, Any]] = []  # (source, shape, stride)
    original = OffloadEngine.add

    def spy(self: OffloadEngine, group: Group, source: Any, nbytes: int, stride: Any = None) -> int:
        shape = source.shape if isinstance(source, torch.Tensor) else None  # the slot's (None: flat)
        added.append((source, shape, stride))
        if shape is not None:  # typed: the alias covers its storage
            assert source.nbytes == nbytes
            assert source.is_contiguous() if stride is None else stride == source.stride()
        return original(self, group, source, nbytes, stride)

    monkeypatch.setattr(OffloadEngine, "add", spy)
    torch.manual_seed(0)
    model = Stack([_ViewsBlock() for _ in range(2)])

    def batch(step: int) -> torch.Tensor:
        return torch.randn(6, 16, generator=torch.Generator().manual_seed(step))

    ref = train(twin(model), batch, steps=2)
    m = twin(model)
    assert_bitwise(ref, train(m, batch, offrecomp.runtime(m, mode="offload", min_bytes=0), steps=2))
    assert added
    assert all(shape is not None for _, shape, _ in added), [(type(s).__name__, sh) for s, sh, _ in added]
    qkv_out = [s for s, shape, _ in added if tuple(shape) == (6, 48)]  # the split's base, once per call
    assert len(qkv_out) == 2 * 2  # two blocks, two steps
    assert any(stride is not None for _, _, stride in added)  # attention's output, permuted


class _ByteViews(torch.autograd.Function):
    """Saves two views of one uint8 storage whose bytes are not 0/1: a ``view_dtype`` of
    it first, then the uint8 tensor the backward reads."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, first: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(first, u)
        return x * u.float()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        first, u = ctx.saved_tensors
        return g * u.float() * first.view(torch.uint8).float(), None, None


class _ByteViewBlock(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        u = (h.detach().abs() * 40).to(torch.uint8)  # bytes 0..255
        return _ByteViews.apply(h, u.view(self.dtype), u)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint4])
def test_a_save_whose_dtype_copy_changes_or_lacks_bytes_travels_flat(dtype: torch.dtype) -> None:
    """NOTE [Typed sources]: a bool copy writes 1 for every nonzero byte (the uint8 view
    of the same storage would come back changed) and a sub-byte dtype has no copy
    kernel; such a save's storage is copied as bytes, and gradients stay bitwise."""
    from tests.models import Stack

    torch.manual_seed(0)
    model = Stack([_ByteViewBlock(dtype) for _ in range(2)])

    def batch(step: int) -> torch.Tensor:
        return torch.randn(4, 16, generator=torch.Generator().manual_seed(step), requires_grad=True)

    ref = train(twin(model), batch, steps=2)
    m = twin(model)
    assert_bitwise(ref, train(m, batch, offrecomp.runtime(m, mode="offload", min_bytes=0), steps=2))


class _TanhBlock(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.l = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.l(x))


def test_a_double_backward_reads_a_root_group_the_pool_refused() -> None:
    """NOTE [Double backward]: the root saves made between two backwards form a group that
    the first unpack issues; when the pool refuses it (host memory short), its storages
    are kept and the unpack must read them as kept, not fetch the freed group."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(_TanhBlock(16), _TanhBlock(16))
    x = torch.randn(4, 16)

    def step() -> torch.Tensor:
        loss = m(x).pow(2).sum()
        (g,) = torch.autograd.grad(loss, [m[0].l.weight], create_graph=True)
        (g * g).sum().backward()
        grad = m[0].l.weight.grad
        assert grad is not None
        m.zero_grad(set_to_none=True)
        return grad

    ref = step()
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_TanhBlock)
    with rt:
        engine = rt._groups.get_engine()
        engine.pool.pressure_bytes = 1 << 62  # every new slab would leave too little host memory
        got = step()
        assert engine.pool.in_use_bytes == 0
    assert torch.equal(ref, got)
    fallbacks = rt.report().steps[-1].fallbacks
    assert fallbacks.get("offload_to_keep", 0) >= 1, fallbacks


def test_storages_of_a_group_refused_at_issue_stop_counting_when_they_die() -> None:
    """NOTE [Resident bytes]: the offload fast path makes its records without a callback
    at their storage's death; a group the pool refuses at issue keeps its storages, which
    then count as resident until they die, as a kept save's do."""
    import gc

    from offrecomp.handles import TypedHandle
    from offrecomp.hooks import Placer

    torch.manual_seed(0)
    m = torch.nn.Sequential(_TanhBlock(16), _TanhBlock(16))
    x = torch.randn(4, 16)
    ref = torch.autograd.grad(m(x).pow(2).sum(), list(m.parameters()))
    typed = [0]
    offload_new = Placer._offload_new

    def spy(self: Placer, *args: Any) -> Any:
        h = offload_new(self, *args)
        typed[0] += type(h) is TypedHandle
        return h

    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_TanhBlock)
    with rt:
        rt._groups.get_engine().pool.pressure_bytes = 1 << 62  # every new slab would leave too little host memory
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Placer, "_offload_new", spy)
            loss = m(x).pow(2).sum()
        p = rt.current_pass
        assert p is not None and typed[0] >= 2
        assert p.stats.fallbacks.get("offload_to_keep", 0) >= 1 and p.stats.resident_bytes > 0
        got = torch.autograd.grad(loss, list(m.parameters()))
        del loss
        gc.collect()
        recs = [r for c in p.all_calls() for r in c.storages]
        dead = [r for r in recs if r() is None]  # the activations; the input and the root's kept output live
        assert dead and not any(r.resident for r in dead)
        assert p.stats.resident_bytes == sum(r.nbytes for r in recs if r.resident)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))


class _HoldSaved(torch.autograd.Function):
    """tanh whose backward also keeps the saved output it unpacked (in ``held``), or
    with ``storage`` set only its storage object and bytes."""

    held: list[Any] = []
    storage = False

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        if _HoldSaved.held is not None:
            _HoldSaved.held.append((y.untyped_storage(), bytes(y.untyped_storage())) if _HoldSaved.storage else y)
        return g * (1 - y * y)


class _HoldBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _HoldSaved.apply(self.l(x))


def test_an_unpacked_tensor_kept_past_backward_keeps_its_reload() -> None:
    """NOTE [Reused reload buffers]: saved tensors a backward keeps beyond the step stay
    intact while later steps reload the same positions; gradients stay bitwise."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[_HoldBlock() for _ in range(3)])
    xs = [torch.randn(4, 16) for _ in range(4)]

    def steps(rt: Any = None) -> list[torch.Tensor]:
        grads = []
        with rt if rt is not None else contextlib.nullcontext():
            for i, x in enumerate(xs):
                _HoldSaved.held = [] if i == 0 else None  # type: ignore[assignment]
                m(x).sum().backward()
                if i == 0:
                    kept = [(t, t.clone()) for t in _HoldSaved.held]
                grads += [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]
                m.zero_grad(set_to_none=True)
        assert len(kept) == 3 and all(torch.equal(t, c) for t, c in kept)
        return grads

    ref = steps()
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_HoldBlock)
    got = steps(rt)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert rt.report().steps[-1].offloaded_bytes > 0


class _SaveOddStrides(torch.autograd.Function):
    """Saves a contiguous tensor that covers its storage but whose size-1 dimension has
    a stride no contiguous layout would give it; backward checks what comes back."""

    seen: list[tuple[tuple[int, ...], tuple[int, ...], int]] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        odd = torch.empty_strided((4, 1, 8), (8, 99, 1)).copy_(x.view(4, 1, 8))
        assert odd.is_contiguous() and odd.nbytes == odd.untyped_storage().nbytes()
        ctx.save_for_backward(odd)
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (odd,) = ctx.saved_tensors
        _SaveOddStrides.seen.append((tuple(odd.shape), odd.stride(), odd.storage_offset()))
        return g * 2 + odd.reshape(32) * 0


class _OddBlock(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SaveOddStrides.apply(x)


def test_an_offloaded_save_comes_back_with_its_own_strides() -> None:
    """NOTE [Typed sources]: a save that joins its group typed comes back with its size,
    strides and storage offset as saved, step after step (NOTE [Reused reload
    buffers])."""
    m = torch.nn.Sequential(_OddBlock(), _OddBlock())
    _SaveOddStrides.seen = []
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_OddBlock)
    with rt:
        for _ in range(3):
            x = torch.randn(32, requires_grad=True)
            m(x).sum().backward()
            assert torch.equal(x.grad, torch.full((32,), 4.0))  # type: ignore[arg-type]
    assert rt.report().steps[-1].offloaded_bytes >= 2 * 128
    assert len(_SaveOddStrides.seen) == 6
    assert set(_SaveOddStrides.seen) == {((4, 1, 8), (8, 99, 1), 0)}


def test_a_storage_object_kept_past_backward_keeps_its_reload() -> None:
    """NOTE [Reused reload buffers]: holding only the storage object of an unpacked saved
    tensor (which adds no use to the storage) still keeps its reload buffer from being
    emptied or reloaded into by later steps."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[_HoldBlock() for _ in range(3)])
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_HoldBlock)
    _HoldSaved.storage = True
    try:
        with rt:
            for i in range(4):
                _HoldSaved.held = [] if i == 0 else None  # type: ignore[assignment]
                m(torch.randn(4, 16)).sum().backward()
                if i == 0:
                    kept = _HoldSaved.held
    finally:
        _HoldSaved.storage = False
    assert rt.report().steps[-1].offloaded_bytes > 0
    assert len(kept) == 3
    assert all(s.nbytes() == len(b) and bytes(s) == b for s, b in kept)


def test_every_reload_reuses_its_positions_buffer_step_after_step() -> None:
    """NOTE [Reused reload buffers]: once warm, no reload takes a fresh buffer, also with
    root saves between the region calls (their groups have positions of their own)."""
    from offrecomp.backends import EmulatedBackend

    torch.manual_seed(0)
    m = torch.nn.Sequential(*[_TanhBlock(16) for _ in range(4)])
    fresh = [0]
    alloc = EmulatedBackend.alloc_device

    def counting(self: Any, nbytes: int, device: Any, stream: Any, storage: Any = None) -> torch.Tensor:
        fresh[0] += storage is None
        return alloc(self, nbytes, device, stream, storage)

    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_TanhBlock)
    with rt, pytest.MonkeyPatch.context() as mp:
        mp.setattr(EmulatedBackend, "alloc_device", counting)
        for i in range(4):
            x = torch.randn(4, 16)
            m(x * 2).exp().sum().backward()  # root saves before, between none, and after
            if i == 1:
                fresh[0] = 0
    assert rt.report().steps[-1].offloaded_bytes > 0
    assert fresh[0] == 0


class _RootResave(torch.nn.Module):
    """Saves ``x`` at the root, lets a region call issue that root run, writes ``x`` in
    place (legal: the node that saved it is gone) and saves it again."""

    def __init__(self) -> None:
        super().__init__()
        self.b1, self.b2 = _TanhBlock(8), _TanhBlock(8)
        self.engine: Any = None

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        x = a * 2
        k = (a * 5).tanh()  # another root save of the run
        u = x.sin()  # saves x
        h = self.b1(a)  # issues the root run
        if self.engine is not None:
            self.engine.synchronize()  # its copy lands, as on a GPU it may
        x.mul_(3)
        del u
        v = x.cos()  # saves x again, at version 1
        return (self.b2(h) * v * k).sum()


def test_a_root_storage_saved_again_after_its_run_was_issued_is_copied_again() -> None:
    """NOTE [Offload groups]: the first copy holds the bytes of before the write; the
    second save must not come back from it."""
    torch.manual_seed(0)
    m = _RootResave()
    a = torch.randn(4, 8, requires_grad=True)

    def grads(rt: Any = None) -> list[torch.Tensor]:
        m.zero_grad(set_to_none=True)
        a.grad = None
        with rt if rt is not None else contextlib.nullcontext():
            m(a).backward()
        return [a.grad.clone()] + [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]

    ref = grads()
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_TanhBlock)
    m.engine = rt._groups.get_engine()
    for _ in range(3):
        got = grads(rt)
        assert [torch.equal(r, g) for r, g in zip(ref, got)] == [True] * len(ref)
    assert rt.report().steps[-1].offloaded_bytes > 0


@pytest.mark.parametrize("slow", ["seal", "refused"])
def test_backwards_on_two_threads_wait_for_the_root_runs_issue(slow: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Offload groups]: one thread's backward issues the forward's last root run
    while another's unpacks a save of it. The second waits for the issue (slowed here:
    its layout, or a pool that refuses it) instead of reading a group not laid out yet,
    or a freed one under a placement not final yet."""
    import threading
    import time

    from offrecomp import pool, transfer

    torch.manual_seed(0)
    m = torch.nn.Sequential(_TanhBlock(8), _TanhBlock(8))
    params = list(m.parameters())
    x = torch.randn(4, 8)

    def losses() -> tuple[torch.Tensor, torch.Tensor]:
        h = m(x)
        return h.exp().sum(), h.sin().sum()  # root saves after the last region call

    ref = [torch.autograd.grad(loss, params, retain_graph=True) for loss in losses()]
    if slow == "seal":
        seal = transfer.Group.seal

        def slow_seal(self: Any) -> None:
            time.sleep(0.2)
            seal(self)

        monkeypatch.setattr(transfer.Group, "seal", slow_seal)
    else:

        def refusing_alloc(self: Any, nbytes: int) -> None:
            time.sleep(0.2)
            self.last_failure = "pressure"

        monkeypatch.setattr(pool.PinnedPool, "alloc", refusing_alloc)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_TanhBlock)
    got: list[Any] = [None, None]
    errors: list[BaseException] = []
    with rt:
        pair = losses()

        def backward(j: int, delay: float) -> None:
            time.sleep(delay)
            try:
                got[j] = torch.autograd.grad(pair[j], params, retain_graph=True)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=backward, args=(j, 0.05 * j)) for j in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    for r, g in zip(ref, got):
        assert g is not None and all(torch.equal(a, b) for a, b in zip(r, g))


class _WritesSaved(torch.nn.Module):
    """Writes in place a tensor tanh saved, which dies at the region's exit (plain
    autograd raises in backward); with ``legal`` the node that saved it is gone first."""

    legal = False

    def __init__(self) -> None:
        super().__init__()
        self.l = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.l(x))  # tanh saves h
        out = (self.l(x) if self.legal else h) * 3  # legal: the loss does not reach tanh
        h.mul_(0.5)  # h dies at the region's exit
        return out


@pytest.mark.parametrize("refused", [False, True], ids=["offloaded", "refused_at_issue"])
@pytest.mark.parametrize("legal", [False, True], ids=["illegal", "legal"])
def test_a_write_to_a_typed_offloaded_save_after_it_died_raises_like_plain(refused: bool, legal: bool) -> None:
    """NOTE [Writes after a save]: the saved tensor is gone by backward, its group's
    source still shows the write; a write after every node that saved it is gone is
    legal and trains as plain does."""
    torch.manual_seed(0)
    _WritesSaved.legal = legal
    try:
        m = torch.nn.Sequential(_WritesSaved(), _WritesSaved())
        x = torch.randn(4, 8)
        plain_error = None
        try:
            m(x).sum().backward()
        except RuntimeError as exc:
            plain_error = exc
        assert (plain_error is None) == legal
        ref = [p.grad.clone() for p in m.parameters()] if legal else None  # type: ignore[union-attr]
        m.zero_grad(set_to_none=True)
        rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_WritesSaved)
        with rt:
            if refused:
                rt._groups.get_engine().pool.pressure_bytes = 1 << 62
            if legal:
                m(x).sum().backward()
                assert [torch.equal(r, p.grad) for r, p in zip(ref, m.parameters())] == [True] * 4  # type: ignore[arg-type]
            else:
                with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                    m(x).sum().backward()
        step = rt.report().steps[-1] if rt.report().steps else None
        if refused and step is not None:
            assert step.fallbacks.get("offload_to_keep", 0) >= 1
    finally:
        _WritesSaved.legal = False


class _SaveKeepAlias(torch.autograd.Function):
    """Saves ``2x`` and hands out a detached alias of it (same version counter); the
    saved tensor itself dies at the region's exit."""

    aliases: list[torch.Tensor] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        t = x * 2
        ctx.save_for_backward(t)
        _SaveKeepAlias.aliases.append(t.detach())
        return x * 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (t,) = ctx.saved_tensors
        return g * t


class _AliasBlock(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SaveKeepAlias.apply(x)


def test_a_write_to_a_typed_offloaded_save_while_its_copy_is_in_flight_raises_like_plain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NOTE [Writes after a save]: a write after the region's exit, through an alias
    that outlives the saved tensor, while the group's sources are still held (emulated
    copies that start only when the host waits for them): the fetch sees it."""
    from offrecomp import backends

    monkeypatch.setattr(backends, "START_DELAY_S", 3600.0)
    m = torch.nn.Sequential(_AliasBlock(), _AliasBlock())
    x = torch.randn(4, 8, requires_grad=True)
    _SaveKeepAlias.aliases = []
    loss = m(x).sum()
    _SaveKeepAlias.aliases[0].add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()  # plain
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_AliasBlock)
    with rt:
        _SaveKeepAlias.aliases = []
        m(x).sum().backward()  # clean: no write
        _SaveKeepAlias.aliases = []
        loss = m(x).sum()
        _SaveKeepAlias.aliases[-1].add_(1)  # the last group's: fetched first, its copy not run yet
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
    _SaveKeepAlias.aliases = []


def _offloaded_pair(block: type[torch.nn.Module]) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, offrecomp.Runtime]:
    """Two ``block``s in sequence, an input, its gradient from a plain run, and a forced
    offload runtime with the blocks as regions."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(block(), block())
    x = torch.randn(4, 8, requires_grad=True)
    m(x).sum().backward()
    ref = x.grad.clone()  # type: ignore[union-attr]
    x.grad = None
    return m, x, ref, offrecomp.runtime(m, mode="offload", min_bytes=0, regions=block)


class _TwoAliasBlock(torch.nn.Module):
    """Two saves in one group; backward reads the second first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SaveKeepAlias.apply(_SaveKeepAlias.apply(x))  # type: ignore[no-any-return]


def test_warm_offloaded_saves_take_the_fast_paths_and_still_see_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Offload fast path]: once reload buffers are reused, no save of a region goes
    to the general pack path and only each group's first unpack (its fetch) to the
    general unpack path; a save handed out on the fast path still raises on a write
    after it (through an alias that outlives it), as plain autograd does."""
    from offrecomp import backends
    from offrecomp.hooks import Placer

    monkeypatch.setattr(backends, "START_DELAY_S", 3600.0)  # copies run when a wait needs them
    general = {"pack": 0, "unpack": 0}
    new_storage, reload_view = Placer._new_storage, Placer._reload_view

    def spy_pack(self: Any, *args: Any) -> Any:
        general["pack"] += 1
        return new_storage(self, *args)

    def spy_unpack(self: Any, *args: Any) -> Any:
        general["unpack"] += 1
        return reload_view(self, *args)

    monkeypatch.setattr(Placer, "_new_storage", spy_pack)
    monkeypatch.setattr(Placer, "_reload_view", spy_unpack)
    m, x, ref, rt = _offloaded_pair(_TwoAliasBlock)
    with rt:
        for _ in range(3):
            x.grad = None
            _SaveKeepAlias.aliases = []
            general["pack"] = general["unpack"] = 0
            m(x).sum().backward()
            assert torch.equal(x.grad, ref)  # type: ignore[arg-type]
        assert rt.report().steps[-1].offloaded_bytes > 0
        assert general == {"pack": 0, "unpack": 2}  # four saves in two groups
        _SaveKeepAlias.aliases = []
        loss = m(x).sum()
        _SaveKeepAlias.aliases[0].add_(1)  # the first block's first save: unpacked second in its group
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
    _SaveKeepAlias.aliases = []


class _TanhTanh(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.tanh(x))


@pytest.mark.parametrize("change", ["rows", "dtype"])
def test_a_reused_reload_buffer_hands_no_alias_of_another_layout(change: str) -> None:
    """NOTE [Reused reload buffers]: a typed save's cached alias is known by its slot and
    strides, valid while the groups its buffer takes keep their slots' offsets, shapes and
    dtypes (``ReloadBuffer.views_for``); a step whose saves have other shapes (rows: the
    same strides and slot offsets) or another dtype gets new aliases, gradients bitwise."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(_TanhTanh(), _TanhTanh())
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0, regions=_TanhTanh)
    for rows, dtype in [(4, torch.float32)] * 3 + [(5, torch.float32) if change == "rows" else (4, torch.float64)] * 2:
        x = torch.randn(rows, 16, dtype=dtype, requires_grad=True)
        m(x).sum().backward()
        ref = x.grad
        x.grad = None
        with rt:
            m(x).sum().backward()
        assert torch.equal(x.grad, ref)  # type: ignore[arg-type]
    assert rt.report().steps[-1].offloaded_bytes > 0


def _typed_handles(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The list every TypedHandle the offload fast path (``Placer._offload_new``) makes
    from now on is appended to."""
    from offrecomp.handles import TypedHandle
    from offrecomp.hooks import Placer

    handles: list[Any] = []
    offload_new = Placer._offload_new

    def spy(self: Placer, *args: Any) -> Any:
        h = offload_new(self, *args)
        if type(h) is TypedHandle:
            handles.append(h)
        return h

    monkeypatch.setattr(Placer, "_offload_new", spy)
    return handles


def test_offloaded_saves_share_one_tuple_per_geometry(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Interned geometry]: the typed saves of every step hold the same shape and
    stride objects (the fresh ones die at once), and gradients stay bitwise."""
    handles = _typed_handles(monkeypatch)
    m, x, ref, rt = _offloaded_pair(_TwoAliasBlock)
    steps = []
    with rt:
        for _ in range(3):
            x.grad = None
            handles.clear()
            _SaveKeepAlias.aliases = []
            loss = m(x).sum()
            steps.append([(h.size, h.stride) for h in handles])
            loss.backward()
            assert torch.equal(x.grad, ref)  # type: ignore[arg-type]
    _SaveKeepAlias.aliases = []
    assert [len(step) for step in steps[1:]] == [4, 4]  # every warm save typed: two per block
    for step in steps:
        for size, stride in step:
            assert size is step[0][0] and stride is step[0][1]  # one geometry, one pair of objects
    assert steps[2][0][0] is steps[0][0][0] and steps[2][0][1] is steps[0][0][1]


def test_interned_geometry_tables_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from offrecomp import handles

    monkeypatch.setattr(handles, "INTERNED_MAX", 2)
    monkeypatch.setattr(handles, "INTERNED_STRIDES", {})
    monkeypatch.setattr(handles, "INTERNED_SHAPES", {})
    first = handles.interned_stride((4, 1))
    assert handles.interned_stride(tuple([4, 1])) is first
    for i in range(5):
        handles.interned_stride((i, 7))
        handles.interned_shape(torch.Size([i, 7]))
        assert len(handles.INTERNED_STRIDES) <= 2 and len(handles.INTERNED_SHAPES) <= 2
    assert type(handles.interned_shape(torch.Size([3]))) is torch.Size
    unhashable = [[1], 2]  # as a symbolic size is: kept as it is
    assert handles.interned_stride(unhashable) is unhashable  # type: ignore[arg-type]


class _SavesMask(torch.autograd.Function):
    """Saves a tensor that needs no gradient and, as AOT autograd's compiled backward
    does, frees its saved variables right after reading them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        mask = (x > 0).to(x.dtype)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (mask,) = ctx.saved_tensors
        ctx.maybe_clear_saved_tensors()  # the handles die: the call's group is freed now
        return g * mask


class _MaskBlock(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SavesMask.apply(x)  # type: ignore[no-any-return]


def test_an_unpacked_save_keeps_its_reused_buffer_after_its_handles_die() -> None:
    """NOTE [Reused reload buffers]: autograd passes a saved tensor that needs no gradient
    on as unpack returned it; each unpack hands out a tensor of its own, whose use of the
    reload's storage keeps the buffer from being emptied while the backward still reads
    it, also once the saved variables are freed early."""
    m, x, ref, rt = _offloaded_pair(_MaskBlock)
    with rt:
        for _ in range(4):  # from the second step on, the reloads reuse their buffers
            x.grad = None
            m(x).sum().backward()
            assert torch.equal(x.grad, ref)  # type: ignore[arg-type]
    assert rt.report().steps[-1].offloaded_bytes > 0


class _ExpSin(torch.nn.Module):
    """Two activations of 16 x 32 float32 (2 KiB each) that backward reads where the
    input requires grad: ``exp``'s output (saved by exp and by sin) and ``sin``'s (saved
    by mul for the scale's gradient); only the latter where it does not."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(torch.exp(x)) * self.w


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_dropped_storages_are_booked_in_the_pack_hook(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Drop fast path]: a storage its call drops before any rule runs (a forced
    recompute, or a plan's table) is booked without ``_new_storage``, with the bytes it
    would book: under recompute two activations of 2 KiB in each block but the first
    (whose input needs no grad: one), under auto those its plan drops; gradients bitwise."""
    from offrecomp.hooks import Placer
    from tests.models import Stack

    torch.manual_seed(0)
    model = Stack([_ExpSin() for _ in range(3)])

    def batch(s: int) -> torch.Tensor:
        return torch.randn(16, 32, generator=torch.Generator().manual_seed(s))

    steps = 6
    ref = train(twin(model), batch, steps=steps)
    m = twin(model)
    budget = 1 if mode == "auto" else None  # below every plan's peak: the most frugal drops all
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, budget=budget)
    assert_bitwise(ref, train(m, batch, rt, steps=steps))
    general: list[Any] = []
    original = Placer._new_storage

    def spy(self: Any, p: Any, call: Any, t: Any, ptr: int, storage: Any, base: Any, nbytes: int, placement: Any) -> Any:
        rec = original(self, p, call, t, ptr, storage, base, nbytes, placement)
        if not call.is_root and call.recorder is None:  # what it ended as, not what it came with
            general.append((call.name, placement, rec.placement))
        return rec

    monkeypatch.setattr(Placer, "_new_storage", spy)
    with rt:
        m(batch(99)).square().mean().backward()
    last = rt.report().steps[-1]
    assert last.phase == ("planned" if mode == "auto" else mode), last.phase
    if mode == "recompute":
        dropped = (1 + 2 + 2) * 16 * 32 * 4
    else:  # the bytes of the storages the plan drops, by its profile
        entry = rt.planner.entries[last.signature]
        assert entry.plan is not None and entry.profile is not None
        sizes = {(r.name, r.call_index, i): st.nbytes for r in entry.profile.regions for i, st in enumerate(r.storages)}
        dropped = sum(sizes[k] for k, pl in entry.plan.placements.items() if pl is offrecomp.Placement.RECOMPUTE)
    assert last.recomputed_bytes == dropped > 0, (last.recomputed_bytes, dropped)
    # no storage dropped on this step went through ``_new_storage``: neither one that came
    # there placed RECOMPUTE nor one placed None that the rules then dropped
    assert [g for g in general if offrecomp.Placement.RECOMPUTE in g[1:]] == [], general


def test_the_offload_fast_path_sets_every_field_its_record_and_handle_have(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Offload fast path]: ``Placer._offload_new`` makes a StorageRec and its
    TypedHandle field by field, inline, rather than through ``StorageRec.__new__``: every
    slot of either class must be readable on what it made (a slot added to the class and
    not set there would raise on first read), and the record's fields equal those
    ``StorageRec.__new__`` sets for the same storage."""
    from offrecomp.handles import TypedHandle
    from offrecomp.state import StorageRec

    handles = _typed_handles(monkeypatch)
    m, x, ref, rt = _offloaded_pair(_TwoAliasBlock)
    with rt:
        for _ in range(2):
            x.grad = None
            _SaveKeepAlias.aliases = []
            loss = m(x).sum()
            assert handles  # the fast path ran
            for h in handles:
                for cls in (TypedHandle, StorageRec):
                    obj = h if cls is TypedHandle else h.rec
                    for name in (n for k in cls.__mro__ for n in getattr(k, "__slots__", ()) if n not in ("__dict__", "__weakref__")):
                        getattr(obj, name)  # raises where the fast path left it unset
                rec = h.rec
                made = StorageRec(rec(), rec.call, rec.index, rec.nbytes, rec.ptr, rec.placement)
                fields = ("call", "index", "nbytes", "ptr", "placement", "resident")
                assert [getattr(rec, n) for n in fields] == [getattr(made, n) for n in fields]
            handles.clear()
            loss.backward()
            assert torch.equal(x.grad, ref)  # type: ignore[arg-type]
    _SaveKeepAlias.aliases = []
