"""What a region keeps from one call's entry to the next is read anew where it changed:
parameters re-registered past torch's hook, storages swapped through ``.data``, flags
flipped, plain tensors in parameter slots (NOTE [Parameters read in a row]); autocast
and torch-function state are read at every call."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp.params import ParamData, capture_params
from tests.helpers import assert_bitwise, twin


def _slots(m: nn.Module) -> tuple[tuple[nn.Module, str], ...]:
    return tuple((sub, n) for sub in m.modules() for n in sub._parameters)


def _same_state(a: object, b: object) -> None:
    """Two ``ParamState`` objects hold the same tensors, versions, flags and storages."""
    for f in ("objects", "entry_versions", "requires_grad"):
        x, y = getattr(a, f), getattr(b, f)
        assert len(x) == len(y) and all(u is v or u == v for u, v in zip(x, y)), f
    for h, k in zip(a.storages, b.storages):  # type: ignore[attr-defined]
        assert (h is None) == (k is None)
        if h is not None:
            assert h[0] is k[0] and h[1][1:] == k[1][1:]


def _fresh(m: nn.Module) -> object:
    return capture_params(_slots(m), ParamData())


def test_a_row_kept_reads_what_a_fresh_capture_reads() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2, bias=False))
    data = ParamData()
    capture_params(_slots(m), data)
    assert data.row is not None  # parameters and an empty slot: kept
    with torch.no_grad():
        m[0].weight.add_(1)  # a version moved
    m[1].bias.requires_grad_(False)  # a flag flipped, no version moved
    state = capture_params(_slots(m), data)
    _same_state(state, _fresh(m))
    assert state.entry_versions[0] == m[0].weight._version  # type: ignore[union-attr]
    assert state.requires_grad[3] is False  # type: ignore[union-attr]


def test_a_parameter_put_in_its_table_past_the_hook_is_read() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    data = ParamData()
    capture_params(_slots(m), data)
    new = nn.Parameter(m[1].weight.detach())  # on the same storage
    m[1]._parameters["weight"] = new  # no registration hook runs
    state = capture_params(_slots(m), data)
    assert state.objects[2] is new  # type: ignore[union-attr]
    _same_state(state, _fresh(m))


def test_a_storage_swapped_through_data_is_read_with_its_geometry() -> None:
    m = nn.Linear(4, 3)
    data = ParamData()
    capture_params(_slots(m), data)
    m.weight.data = torch.randn(4, 3).t()  # another storage, column-major
    state = capture_params(_slots(m), data)
    held = state.storages[0]  # type: ignore[union-attr]
    assert held is not None and held[0] is m.weight.untyped_storage()
    assert held[1][3] == m.weight.stride() == (1, 3)


def test_a_plain_tensor_in_a_slot_is_never_kept() -> None:
    """``functional_call``'s fast weights carry a graph: a row would hold it past the call."""
    m = nn.Linear(4, 4)
    data = ParamData()
    capture_params(_slots(m), data)
    w = torch.randn(4, 4, requires_grad=True)
    fast = w * 2.0
    m._parameters["weight"] = fast  # as functional_call swaps it in
    state = capture_params(_slots(m), data)
    assert state.objects[0] is fast and data.row is None  # type: ignore[union-attr]
    ref = weakref.ref(fast)
    m._parameters["weight"] = nn.Parameter(torch.randn(4, 4))
    del fast, state
    gc.collect()
    assert ref() is None
    capture_params(_slots(m), data)
    assert data.row is not None


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.ln = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.ln(self.fc(x)))


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def _swap(model: nn.Module, step: int, how: str) -> None:
    """Change block 1's parameters before step ``step``'s forward, past torch's hook."""
    fc = model.blocks[1].fc  # type: ignore[index]
    g = torch.Generator().manual_seed(step)
    if how == "table":
        fc._parameters["weight"] = nn.Parameter(torch.randn(16, 16, generator=g) * 0.1)
    elif how == "data":
        fc.weight.data = (torch.randn(16, 16, generator=g) * 0.1).t().contiguous().t()
    else:  # frozen in odd steps
        fc.weight.requires_grad_(step % 2 == 0)


@pytest.mark.parametrize("how", ["table", "data", "flag"])
def test_parameters_changed_between_steps_replay_as_read(how: str) -> None:
    """Each step's replay runs with the parameters its forward read, however they were
    changed since the region's last call (NOTE [Parameters read in a row])."""
    torch.manual_seed(0)
    model = _Stack()
    other = twin(model)
    batch = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))

    def run(m: nn.Module) -> list[dict[str, torch.Tensor]]:
        out = []
        for s in range(4):
            _swap(m, s, how)
            m(batch).backward()
            out.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
            m.zero_grad(set_to_none=True)
        return out

    ref = run(model)
    with offrecomp.runtime(other, mode="recompute", min_bytes=0) as rt:
        got = run(other)
    assert all(s.replays == 3 for s in rt.report().steps)
    assert_bitwise(ref, got)


class _Shared(nn.Module):
    """One block called three times a step: a region whose calls see different states."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.block = nn.ModuleList([_Block()])

    def forward(self, x: torch.Tensor, under: list[object]) -> torch.Tensor:
        x = self.inp(x)
        for ctx in under:
            with ctx:  # type: ignore[attr-defined]
                x = self.block[0](x)
        return x.float().square().mean()


def _replays_each_call_as_run(contexts: Callable[[], list[object]]) -> None:
    """Two steps of ``_Shared``, its three calls under ``contexts()`` (new each step),
    plainly and under forced recompute: three replays a step, gradients bitwise."""
    torch.manual_seed(0)
    model = _Shared()
    other = twin(model)
    batch = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))

    def run(m: nn.Module) -> list[dict[str, torch.Tensor]]:
        out = []
        for _ in range(2):
            m(batch, contexts()).backward()
            out.append({n: p.grad.clone() for n, p in m.named_parameters()})
            m.zero_grad(set_to_none=True)
        return out

    ref = run(model)
    with offrecomp.runtime(other, mode="recompute", min_bytes=0, regions=_Block) as rt:
        got = run(other)
    assert rt.report().steps[-1].replays == 3
    assert_bitwise(ref, got)


def test_autocast_entered_between_two_calls_of_a_region_is_read_at_each() -> None:
    """The autocast state is read at every call's entry (equal ones share an object):
    calls of one region under bf16, without, and under float16 replay each as its forward
    ran; gradients bitwise."""
    from offrecomp.regions import capture_autocast

    a = capture_autocast({"cpu"})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        b = capture_autocast({"cpu"})
    assert a is capture_autocast({"cpu"}) and b != a and ("cpu", True, torch.bfloat16) in b.entries

    _replays_each_call_as_run(
        lambda: [
            torch.autocast("cpu", dtype=torch.bfloat16),
            torch.autocast("cpu", enabled=False),
            torch.autocast("cpu", dtype=torch.float16),
        ]
    )


class _Doubling(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        return out * 2 if func is torch.tanh else out


def test_a_function_mode_entered_between_two_calls_of_a_region_is_read_at_each() -> None:
    """The torch-function state is read at every call's entry: a call under a mode and
    one without replay each as its forward ran; gradients bitwise."""
    from offrecomp import _torch_compat as tc

    assert tc.torch_function_state() is None
    with _Doubling() as mode:
        assert tc.torch_function_state() == (torch._C._TorchFunctionState.ENABLED, (mode,))

    _replays_each_call_as_run(lambda: [_Doubling(), contextlib.nullcontext(), _Doubling()])
