"""The op recorder's and the serving mode's argument walk (NOTE [Op leaves] in trace/ops.py):
the same leaves, in the same order, as pytree, for what the dispatcher hands a mode and
for anything else."""

from __future__ import annotations

import collections
import random
import threading
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from offrecomp.trace import _is_internal, internal, op_leaves, op_name, user_code

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
