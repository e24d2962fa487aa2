"""The op recorder's and the serving mode's argument walk (NOTE [Op leaves] in trace/ops.py):
the same leaves, in the same order, as pytree, for what the dispatcher hands a mode and
for anything else; and what ``build_structure`` makes of a recording (NOTE [Which ops
replay runs] in trace/structure.py)."""

from __future__ import annotations

import collections
import random
import threading
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from offrecomp.trace import (
    OpRecorder,
    RegionStructure,
    SaveInfo,
    _is_internal,
    build_structure,
    internal,
    op_leaves,
    op_name,
    user_code,
)

Pair = collections.namedtuple("Pair", "a b")


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(type(x) is type(y) and (x is y or x == y) for x, y in zip(a, b))


def _random_tree(rng: random.Random, depth: int = 0) -> Any:
    leaves = [
        lambda: torch.zeros(rng.randint(0, 3)),
        lambda: rng.randint(-5, 5),
        lambda: rng.random(),
        lambda: rng.random() < 0.5,
        lambda: None,
        lambda: "s",
        lambda: 1j,
        lambda: torch.float16,
        lambda: torch.device("cpu"),
        lambda: torch.strided,
        lambda: torch.channels_last,
        lambda: torch.nn.Parameter(torch.ones(2)),
        lambda: slice(1, 2),  # no node: a leaf for both
    ]
    if depth >= 3 or rng.random() < 0.4:
        return rng.choice(leaves)()
    n = rng.randint(0, 4)
    kids = [_random_tree(rng, depth + 1) for _ in range(n)]
    kind = rng.randrange(7)
    if kind == 0:
        return tuple(kids)
    if kind == 1:
        return list(kids)
    if kind == 2:
        return {f"k{rng.randint(0, 99)}_{i}": k for i, k in enumerate(kids)}
    if kind == 3:
        return torch.Size(rng.randint(0, 4) for _ in range(n))
    if kind == 4:
        return Pair(kids[0] if kids else None, kids)
    if kind == 5:
        return collections.OrderedDict((f"z{i}", k) for i, k in enumerate(reversed(kids)))
    return collections.deque(kids)


def test_op_leaves_match_pytree_on_random_trees() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        tree = _random_tree(rng)
        assert _same(op_leaves(tree), tree_flatten(tree)[0]), tree


def test_op_leaves_match_pytree_for_every_op_of_a_model() -> None:
    """Arguments and results of every op a transformer layer's forward and backward
    dispatch, with lists of tensors, optional tensors and keyword arguments."""
    checked: list[str] = []

    class Check(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            assert _same(op_leaves((args, kwargs)), tree_flatten((args, kwargs))[0]), func
            out = func(*args, **kwargs)
            assert _same(op_leaves(out), tree_flatten(out)[0]), func
            checked.append(op_name(func))
            assert op_name(func) == str(func)
            return out

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    x = torch.randn(2, 5, 16, requires_grad=True)
    with Check():
        y = layer(x)
        torch.stack(list(y.split(2, 1)[:2]), 0).max(0).values.sum().backward()
        y.new_zeros(3, dtype=torch.float16).index_put_((torch.tensor([1]),), torch.ones(1, dtype=torch.float16))
    assert len(checked) > 50
    assert "aten.index_put_.default" in checked and "aten.split.Tensor" in checked


def test_internal_depth_is_per_thread() -> None:
    """``internal()`` hides ops on its own thread only; a thread that never entered it
    reads depth 0 (the class default)."""
    seen: list[bool] = []
    t = threading.Thread(target=lambda: seen.append(_is_internal()))
    with internal():
        assert _is_internal()
        with user_code():
            assert not _is_internal()
        assert _is_internal()
        t.start()
        t.join()
    assert not _is_internal()
    assert seen == [False]


def _structure(*, w_known: bool) -> RegionStructure:
    """A recorded region ``(x @ w) * rand_like`` viewed and written in place; its
    storages are x and w (inputs) and the matmul's output (saved after op 1)."""
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    known = [x] + ([w] if w_known else [])
    rec = OpRecorder(
        use_cuda_events=False,
        cuda_devices=[],
        known_ptrs=frozenset(t.untyped_storage().data_ptr() for t in known),
    )
    with rec:
        h = x @ w
        r = torch.rand_like(h)
        v = (h * r).view(-1)
        v.add_(1)
    sids = [rec.storage_id(t) for t in (x, w, h)]
    saves = [SaveInfo(storage=2, ops_before=1, time=0.5)]
    kinds = ["input", "input", "activation"]
    return build_structure(rec, saves, sids, [128, 256, 128], kinds, [1e-6] * len(rec.ops), 0.25)


def test_build_structure_tells_sinks_views_and_servable_ops_apart() -> None:
    st = _structure(w_known=True)
    assert st.op_names == [
        "aten.mm.default",
        "aten.rand_like.default",
        "aten.mul.Tensor",
        "aten.view.default",
        "aten.add_.Tensor",
    ]
    assert not st.opaque and st.placeholders_ok
    ops = st.op_records
    # the matmul's output is a saved storage never written in place: servable
    assert ops[0].skippable and not ops[0].sink and ops[0].outputs == (2,)
    assert ops[1].sink and not ops[1].skippable and ops[1].reads == ()  # random; reads shape only
    assert not ops[2].sink and not ops[2].skippable and ops[2].reads == (0, 1)
    assert ops[3].view and not ops[3].sink
    assert ops[4].sink and ops[4].reads == (2,)  # in place, on the view of the mul's storage
    assert st.servable == [True, False, False, False, False]
    assert st.view_ops == [False, False, False, True, False]
    assert st.outputs[3] is None and st.outputs[4] is None  # an alias cannot be rebuilt
    act = st.storage_records[2]
    assert (act.kind, act.producer_op, act.first_save_op, act.saves) == ("activation", 0, 1, 1)
    assert act.offset_seconds == 0.25
    assert [s.kind for s in st.storage_records[:2]] == ["input", "input"]
    assert st.save_ops == [1]


def test_build_structure_without_placeholders_when_a_read_comes_from_outside() -> None:
    """A tensor read that is neither made in the region nor a known input: replay hands
    out no placeholders, serves no op its geometry may reach (the op reading it, and
    those reading what that made: NOTE [Which ops replay runs]), and the planner sees
    no dataflow."""
    st = _structure(w_known=False)
    assert not st.opaque and not st.placeholders_ok
    assert all(r.reads is None for r in st.op_records)
    assert not st.servable[0]


def test_empty_allocations_alive_at_once_keep_their_ids() -> None:
    """Every empty allocation has data pointer 0: two alive at once (a cache's first keys
    and values) must not take each other's ids, or a later read of the first looks like
    a value from outside the region."""
    rec = OpRecorder(use_cuda_events=False, cuda_devices=[], known_ptrs=frozenset())
    a, b = torch.empty(0), torch.empty(0, 3)
    ia, ib = rec.storage_id(a), rec.storage_id(b)
    assert ia != ib
    assert rec.storage_id(a) == ia and rec.storage_id(b) == ib


def test_a_tensor_built_from_python_data_leaves_placeholders_on() -> None:
    """NOTE [Lifted constants]: ``torch.tensor([])`` twice, then concatenated to values of
    the region (a Hugging Face cache's first update): the lifts make what they lift, so
    no read comes from outside and replay keeps its placeholders and dataflow."""
    x = torch.randn(4, 8)
    rec = OpRecorder(
        use_cuda_events=False, cuda_devices=[], known_ptrs=frozenset({x.untyped_storage().data_ptr()})
    )
    with rec:
        h = x * 2
        keys = torch.tensor([], dtype=x.dtype)
        values = torch.tensor([], dtype=x.dtype)
        keys = torch.cat([keys, h])
        values = torch.cat([values, h + 1])
        out = keys * values
    assert [n for n in (op.name for op in rec.ops) if "lift" in n] == ["aten.lift_fresh.default"] * 2
    sids = [rec.storage_id(t) for t in (x, out)]
    saves = [SaveInfo(storage=1, ops_before=len(rec.ops), time=0.5)]
    st = build_structure(rec, saves, sids, [128, 128], ["input", "activation"], [1e-6] * len(rec.ops), 0.25)
    assert not st.opaque and st.placeholders_ok
    assert all(r.reads is not None for r in st.op_records)


class _RoundsMatmuls(TorchDispatchMode):
    """Rounds each addmm output to bf16 precision with ``.to()``, which below autograd
    reaches the modes beneath as ``aten.to.dtype`` (a schema that may alias) and copies."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.addmm.default:
            out = out.to(torch.bfloat16).to(torch.float32)
        return out


class _RoundingBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(16)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with _RoundsMatmuls():
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


@pytest.mark.parametrize("variant", ["auto", "auto_serve"])
def test_an_op_whose_schema_may_alias_but_copied_is_recorded_as_computing(variant: str) -> None:
    """A dispatch mode inside a block post-processing matmul outputs with ``.to()``: the
    recording took ``aten.to.dtype`` for a view, gave the matmul a placeholder, and the
    serving replay's cast read it (other gradients under auto, NaN at times)."""
    from tests.helpers import check_variant

    class _Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(_RoundingBlock() for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return x.square().mean()

    torch.manual_seed(0)
    check_variant(_Model(), lambda s: torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(s)), variant)
