"""NOTE [Aliased arguments]: a region called with one tensor in several places, or with
views of one storage, replays with its arguments aliased as the forward's were: the same
object where the forward got the same object (``q is kv``, ``nn.MultiheadAttention``'s
``query is key is value``), one storage with each view's geometry where the forward's
shared one, a write through one argument seen through the others."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp.arguments import capture_inputs, replay_arguments
from tests.helpers import assert_bitwise, check_variant, train

VARIANTS = ["recompute", "auto", "auto_serve"]


def _batch(*shape: int) -> Any:
    return lambda s: torch.randn(*shape, generator=torch.Generator().manual_seed(1000 + s))


class _Stack(nn.Module):
    """Blocks in a ModuleList (the regions), each called by ``call(block, x)``."""

    def __init__(self, blocks: list[nn.Module], call: Any) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.blocks = nn.ModuleList(blocks)
        self.call = call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = self.call(b, x * 1.0)
        return x.pow(2).sum()


# ------------------------------------------------------------------------- identity


class _IsBlock(nn.Module):
    """Self- or cross-attention by identity, as attention blocks branch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        scale = 1.0 if q is kv else 0.5
        return torch.tanh(self.fc(kv) * scale) + q


@pytest.mark.parametrize("variant", VARIANTS)
def test_identity_branch(variant: str) -> None:
    torch.manual_seed(0)
    model = _Stack([_IsBlock() for _ in range(3)], lambda b, x: b(x, x))
    check_variant(model, _batch(2, 16), variant)


class _NestedIsBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, pair: list[torch.Tensor], *, kv: dict[str, torch.Tensor]) -> torch.Tensor:
        same = pair[0] is pair[1] and pair[1] is kv["v"]
        return torch.tanh(self.fc(kv["v"]) * (1.0 if same else 0.5)) + pair[0]


@pytest.mark.parametrize("variant", ["recompute", "auto"])
def test_identity_nested_in_lists_dicts_and_kwargs(variant: str) -> None:
    torch.manual_seed(0)
    model = _Stack([_NestedIsBlock() for _ in range(3)], lambda b, x: b([x, x], kv={"v": x}))
    check_variant(model, _batch(2, 16), variant)


@dataclasses.dataclass
class _State:
    h: torch.Tensor


class _StateIsBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, q: torch.Tensor, state: _State) -> torch.Tensor:
        scale = 1.0 if q is state.h else 0.5
        return torch.tanh(self.fc(state.h) * scale) + q


@pytest.mark.parametrize("variant", ["recompute", "auto"])
def test_identity_with_a_tensor_an_argument_object_holds(variant: str) -> None:
    torch.manual_seed(0)
    model = _Stack([_StateIsBlock() for _ in range(3)], lambda b, x: b(x, _State(x)))
    check_variant(model, _batch(2, 16), variant)


class _Attention(nn.Module):
    """nn.MultiheadAttention layers in a ModuleList (so each is a region), called for
    self-attention (``query is key is value``: packed in-projection, one transpose under
    batch_first) or cross-attention over a memory (``key is value``)."""

    def __init__(self, cross: bool, batch_first: bool) -> None:
        super().__init__()
        self.cross, self.batch_first = cross, batch_first
        self.attn = nn.ModuleList([nn.MultiheadAttention(16, 2, batch_first=batch_first) for _ in range(3)])
        self.mem = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.batch_first:
            x = x.transpose(0, 1)
        mem = self.mem(x)
        for a in self.attn:
            kv = mem if self.cross else x
            x = x + a(x, kv, kv, need_weights=False)[0]
        return x.pow(2).sum()


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_multihead_attention_regions(variant: str, cross: bool, batch_first: bool) -> None:
    torch.manual_seed(0)
    check_variant(_Attention(cross, batch_first), _batch(2, 5, 16), variant)


class _ThreeBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, q: torch.Tensor, mem: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        scale = 1.0 if q is kv else 0.5
        return torch.tanh(self.fc(kv) * scale) + q + 0.25 * mem


class _Alternating(nn.Module):
    """``block(x, mem, x)`` one step, ``block(x, mem, mem)`` the next: one signature, the
    same tensors and layouts, one tensor in other places (the layout tells them apart)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_ThreeBlock() for _ in range(3)])
        self.mem = nn.Linear(16, 16)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cross = self.calls % 2 == 1
        self.calls += 1
        mem = self.mem(x)
        for b in self.blocks:
            x = b(x, mem, mem if cross else x)
        return x.pow(2).sum()


@pytest.mark.parametrize("variant", ["auto", "auto_serve"])
def test_places_alternating_between_steps(variant: str) -> None:
    torch.manual_seed(0)
    check_variant(_Alternating(), _batch(2, 16), variant, steps=12, stable=False, plans=True)


# -------------------------------------------------------------------- one storage


class _InplaceBlock(nn.Module):
    """Writes one argument in place and reads the other: through one object, or through
    another view of its storage, the read sees the write."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 16)

    def forward(self, h: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        h.mul_(2.0)
        return torch.tanh(self.fc(skip)).mean(0) + h * 0.5


CALLS = {
    "same_object": (16, lambda b, x: b(x, x)),
    "full_view": (16, lambda b, x: b(x, x[:, :])),
    "strided_view": (6, lambda b, x: b(x, x[1:, 3::2][:, :6])),
    "transposed_view": (4, lambda b, x: b(x, x.t())),
    "view_without_grad": (16, lambda b, x: b(x, x.detach()[:, :])),
}


@pytest.mark.parametrize("case", sorted(CALLS))
@pytest.mark.parametrize("variant", ["recompute", "auto"])
def test_write_through_an_aliased_argument(variant: str, case: str) -> None:
    width, call = CALLS[case]
    torch.manual_seed(0)
    model = _Stack([_InplaceBlock(width) for _ in range(3)], call)
    # the first call replays from the watch's copies; the region keeps from then on
    check_variant(model, _batch(4, 16), variant, stable=False)


class _StateWriteBlock(nn.Module):
    """Writes its argument through the argument object that holds it too."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, q: torch.Tensor, state: _State) -> torch.Tensor:
        state.h.mul_(2.0)
        return torch.tanh(self.fc(q)) * (1.0 if q is state.h else 0.5)


class _ReadStateBlock(nn.Module):
    """Writes its argument, reads what its argument object holds on that storage, which
    no op saves (a replay reading other values would regenerate other activations)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16))

    def forward(self, q: torch.Tensor, state: _State) -> torch.Tensor:
        q.mul_(2.0)
        return torch.tanh(state.h[:, :16] * 3.0) * self.w


def _wide(call: Any) -> Any:
    """``call(block, y)`` on ``y``, twice as wide as ``x``."""
    return lambda b, x: call(b, torch.cat([x, x], 1))


class _NestedWriteBlock(nn.Module):
    """Writes one place of a dict, reads the others."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, d: dict[str, Any]) -> torch.Tensor:
        d["a"].add_(1.0)
        return torch.tanh(self.fc(d["b"])) * d["c"][0]


class _OverlapBlock(nn.Module):
    """Writes two overlapping views of one tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 16)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.mul_(3.0)
        b.add_(1.0)
        return torch.tanh(self.fc(torch.cat([a, b], 1)))


WRITERS = {
    "argument_object": (_StateWriteBlock, lambda b, x: b(x, _State(x))),
    "argument_object_view": (_StateWriteBlock, lambda b, x: b(x, _State(x[:, :]))),
    "argument_object_reads_view": (_ReadStateBlock, lambda b, x: b(x, _State(x[:, :]))),
    "argument_object_reads_wider": (_ReadStateBlock, _wide(lambda b, y: b(y[:, :16], _State(y)))),
    "argument_object_reads_beside": (_ReadStateBlock, _wide(lambda b, y: b(y[:, :16], _State(y[:, 16:])))),
    "nested": (_NestedWriteBlock, lambda b, x: b({"a": x, "b": x, "c": [x]})),
    "overlapping_views": (_OverlapBlock, lambda b, x: b(x[:, 0:5], x[:, 3:8])),
}


@pytest.mark.parametrize("case", sorted(WRITERS))
@pytest.mark.parametrize("variant", ["recompute", "auto"])
def test_writes_seen_through_every_alias(variant: str, case: str) -> None:
    block, call = WRITERS[case]
    torch.manual_seed(0)
    check_variant(_Stack([block() for _ in range(3)], call), _batch(4, 16), variant, stable=False)


class _ViewsBlock(nn.Module):
    """Two views of one tensor that reads both and writes neither."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(a) * self.fc(b)) + torch.cat([a, b], 1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_views_of_one_storage_read(variant: str) -> None:
    torch.manual_seed(0)
    model = _Stack([_ViewsBlock() for _ in range(3)], lambda b, x: b(x[:, :8], x[:, 8:]))
    check_variant(model, _batch(4, 16), variant)


@pytest.mark.parametrize("case", ["same_object", "views"])
def test_aliased_arguments_replay_from_their_reload(case: str) -> None:
    """The checkpoint goes to host memory: the replay's arguments alias on the reload."""
    torch.manual_seed(0)
    if case == "same_object":
        model = _Stack([_IsBlock() for _ in range(3)], lambda b, x: b(x, x))
    else:
        model = _Stack([_ViewsBlock() for _ in range(3)], lambda b, x: b(x[:, :8], x[:, 8:]))
    batch = _batch(4, 16)
    ref = train(copy.deepcopy(model), batch)
    rt = offrecomp.runtime(model, mode="recompute", min_bytes=0)
    rt.set_plan(
        offrecomp.Plan(
            placements={(f"blocks.{b}", 0, 0): offrecomp.Placement.OFFLOAD for b in range(3)},
            default=offrecomp.Placement.RECOMPUTE,
        )
    )
    assert_bitwise(ref, train(model, batch, rt))
    last = rt.report().steps[-1]
    assert last.offloaded_bytes == last.input_bytes > 0 and last.replays == 3


# ------------------------------------------------------------------ the capture itself


def test_capture_gives_one_object_one_index() -> None:
    x, y = torch.randn(3, 4, requires_grad=True) * 1.0, torch.randn(3, 4)
    cap = capture_inputs((x, [x, y]), {"kv": x, "other": y})
    assert len(cap.tensors) == 2 and cap.repeated and cap.places() == (0, 0, 1, 0, 1)
    (a, (b, c)), kw = replay_arguments(cap, "r")
    assert a is b is kw["kv"] and c is kw["other"] and a is not c
    assert a.requires_grad and not c.requires_grad
    assert not capture_inputs((x, y), {}).repeated


def test_capture_notes_views_of_one_storage_and_replays_their_geometry() -> None:
    base = torch.randn(4, 16, requires_grad=True) * 1.0
    u, v, w = base[:, 2:10], base.t()[3:5], torch.randn(2)
    cap = capture_inputs((u, w, v), {})
    assert cap.shared == ((0, 2),)
    (ru, rw, rv), _ = replay_arguments(cap, "r")
    assert ru.untyped_storage().data_ptr() == rv.untyped_storage().data_ptr()
    for r, t in ((ru, u), (rv, v)):
        assert (r.shape, r.stride(), r.storage_offset()) == (t.shape, t.stride(), t.storage_offset())
        assert torch.equal(r, t) and r.requires_grad
    assert rw.untyped_storage().data_ptr() != ru.untyped_storage().data_ptr()


def test_a_write_copies_the_views_of_its_storage_once() -> None:
    base = torch.randn(4, 16, requires_grad=True) * 1.0
    u, v = base[:, 2:10], base[:, 6:]
    cap = capture_inputs((u, v), {})
    before = base.detach().clone()
    cap.keep_copy(1)
    assert cap.copied == {0, 1}
    held_u, held_v = cap.tensors
    assert held_u is not None and held_v is not None
    assert held_u.untyped_storage().data_ptr() == held_v.untyped_storage().data_ptr()
    assert held_u.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    with torch.no_grad():
        base.mul_(3.0)  # the forward's write: the held copies stay as they were
    assert torch.equal(held_u, before[:, 2:10]) and torch.equal(held_v, before[:, 6:])
    for _ in range(2):  # a replay writes a copy of them, never the held ones
        (ru, rv), _ = replay_arguments(cap, "r")
        with torch.enable_grad():
            rv.mul_(2.0)
        assert torch.equal(ru[:, 4:], 2 * before[:, 6:10])
        assert torch.equal(held_v, before[:, 6:])


class _CounterBlock(nn.Module):
    """Advances a tensor argument that requires no grad (a counter, a mask) in place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        c.add_(1.0)
        return torch.tanh(self.fc(x) * c)


class _Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_CounterBlock() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = torch.ones(16)
        for b in self.blocks:
            x = b(x, c.clone())
        return x.pow(2).sum()


def test_a_written_input_without_grad_replays_twice_from_its_copy() -> None:
    """Two backwards through one graph replay the call twice: each on a copy of the
    held entry values, which the first replay's write leaves as they were."""
    torch.manual_seed(0)
    model = _Counted()
    x = torch.randn(4, 16)

    def grads(m: nn.Module) -> list[torch.Tensor]:
        loss = m(x)
        loss.backward(retain_graph=True)
        loss.backward()
        return [p.grad.clone() for p in m.parameters()]

    ref = grads(copy.deepcopy(model))
    m = copy.deepcopy(model)
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    with rt:
        got = grads(m)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert rt.report().steps[-1].replays > 0
