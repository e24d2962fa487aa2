"""A capture that follows an earlier one (NOTE [Capture reuse] in offrecomp/arg_state.py)
records what a full walk records, whatever changed in between."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch import nn

from offrecomp import arg_state, arguments
from offrecomp.arg_state import ArgState


class _Obj:
    """A plain object whose attributes a forward may rebind."""

    def __init__(self, **kw: Any) -> None:
        vars(self).update(kw)


def _state(rng: random.Random) -> _Obj:
    """A cache-like tree: an object holding a list of layer objects, a dict, numbers."""
    layers = [_Obj(keys=None, values=None, ready=False) for _ in range(rng.randint(1, 6))]
    return _Obj(layers=layers, meta={"step": 0, "t": torch.zeros(2)}, depth=_Obj(inner=[_Obj(x=[_Obj(y=1)])]))


def _containers(root: Any) -> list[Any]:
    out, todo, seen = [], [root], set()
    while todo:
        x = todo.pop()
        if id(x) in seen or not isinstance(x, (list, dict, _Obj)):
            continue
        seen.add(id(x))
        out.append(x)
        todo.extend(x if isinstance(x, list) else x.values() if isinstance(x, dict) else vars(x).values())
    return out


def _mutate(root: _Obj, rng: random.Random) -> None:
    """One change of the kinds a forward or its caller makes."""
    c = rng.choice(_containers(root))
    t = torch.randn(3)
    change = rng.randrange(7)
    if isinstance(c, list):
        if change == 0 and c:
            c.pop()
        elif change == 1:
            c.append(_Obj(keys=t, values=None, ready=True))
        elif c:
            c[rng.randrange(len(c))] = t if change == 2 else c[0]  # a tensor, or a reorder
        return
    d = c if isinstance(c, dict) else vars(c)
    key = rng.choice(list(d) or ["k"])
    if change == 0:
        d[key] = t  # rebound to a tensor
    elif change == 1:
        d[f"new{rng.randrange(3)}"] = [] if rng.random() < 0.5 else 5  # a new container, or a number
    elif change == 2 and d:
        del d[key]
    elif change == 3 and isinstance(d.get(key), torch.Tensor):
        d[key].add_(1)  # written in place: only its version moves
    elif change == 4:
        d[key] = _Obj(z=t)  # another container below it
    elif change == 5:
        d.pop(key, None)
        d[key] = d.get(key, 7)  # the same keys in another order
    # 6: nothing changed


def _assert_same_record(a: ArgState, b: ArgState) -> None:
    assert a.complete == b.complete
    assert len(a.entries) == len(b.entries)
    for (oa, ka, ca), (ob, kb, cb) in zip(a.entries, b.entries):
        assert oa is ob and ka == kb
        assert len(ca) == len(cb) and (ka == "list" or list(ca) == list(cb))
        va = ca if ka == "list" else list(ca.values())
        vb = cb if kb == "list" else list(cb.values())
        assert all(x is y for x, y in zip(va, vb, strict=True))
    assert [(id(t), v, p) for t, v, p in a.tensors] == [(id(t), v, p) for t, v, p in b.tensors]
    assert a.same(b) and b.same(a)


@pytest.mark.parametrize("seed", range(40))
def test_a_capture_that_follows_an_earlier_one_records_what_a_walk_records(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    followed_at = []
    follow = arg_state._follow

    def counted(*a: Any) -> ArgState | None:
        out = follow(*a)
        followed_at.append(out is not None)
        return out

    monkeypatch.setattr(arg_state, "_follow", counted)
    rng = random.Random(seed)
    root = _state(rng)
    limit = rng.choice([12, 40, 512])
    prev = ArgState.capture([root], limit)
    for _ in range(30):
        for _ in range(rng.randint(0, 2)):
            _mutate(root, rng)
        walked = ArgState.capture([root], limit)
        followed = ArgState.capture([root], limit, prev=prev)
        _assert_same_record(walked, followed)
        prev = followed if rng.random() < 0.7 else walked
    if limit == 512:  # complete captures: most follow (the others walk again)
        assert sum(followed_at) >= 10, followed_at


def test_a_capture_follows_only_a_capture_of_the_same_objects() -> None:
    a, b = _Obj(x=[1]), _Obj(x=[1])
    prev = ArgState.capture([a])
    assert ArgState.capture([b], prev=prev).entries[0][0] is b
    m = nn.BatchNorm1d(2)
    prev = ArgState.capture([m, a])
    m.register_buffer("extra", torch.zeros(1))
    assert [k for _, k, _ in ArgState.capture([m, a], prev=prev).entries].count("buffers") == 1
    assert any("extra" in c for _, k, c in ArgState.capture([m, a], prev=prev).entries if k == "buffers")


def test_a_replay_sees_the_entry_bindings_and_leaves_the_ones_it_found() -> None:
    rng = random.Random(0)
    root = _state(rng)
    entry = ArgState.capture([root])
    snapshot = [(c, list(c) if isinstance(c, list) else dict(c) if isinstance(c, dict) else dict(vars(c))) for c in _containers(root)]
    for _ in range(5):
        _mutate(root, rng)
    found = ArgState.capture([root])
    with entry.at_entry():
        for c, before in snapshot:
            now = c if isinstance(c, (list, dict)) else vars(c)
            assert list(now) == list(before) and all(x is y for x, y in zip(
                now if isinstance(now, list) else now.values(),
                before if isinstance(before, list) else before.values(),
            ))
        root.layers.append(_Obj(keys=None))  # the replay's own writes
        vars(root)["added"] = 1
    assert found.same(ArgState.capture([root]))


_T = torch.zeros(2)


@pytest.mark.parametrize(
    ("args", "kwargs", "own"),
    [
        ((_T,), {}, True),
        ((_T, nn.Parameter(torch.ones(1))), {}, True),
        ((_T,), {"mask": None, "pos": _T, "use_cache": False, "emb": (_T, _T), "ids": [1, 2], "name": "x"}, True),
        ((_T, (None, 3.0)), {"emb": (_T, _T)}, True),
        ((_T,), {"nested": ((_T,), _T)}, False),  # deeper than one level: pytree's walk
        ((_T,), {"d": {"a": _T}}, False),
        ((torch.Size([2, 3]),), {}, False),  # a tuple subclass
        ((), {}, True),
    ],
)
def test_arguments_flatten_as_pytree_does(args: tuple[Any, ...], kwargs: dict[str, Any], own: bool) -> None:
    """Plain structures are flattened without pytree's walk, to its leaves and spec."""
    want_leaves, want_spec = arguments.tree_flatten((args, kwargs))
    for _ in range(2):  # the structure met first, then its kept spec
        leaves, spec = arguments._flatten_arguments(args, kwargs)
        assert len(leaves) == len(want_leaves) and all(a is b for a, b in zip(leaves, want_leaves))
        assert spec == want_spec
        assert arguments.tree_unflatten(leaves, spec) == (args, kwargs)  # the same objects back
    key = arguments._structure(args, kwargs)
    assert (key is not None and arguments._SPECS.get(key) is not None) == own
