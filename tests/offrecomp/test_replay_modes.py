"""NOTE [Stop mode popped first] (offrecomp/replay.py): the dispatch mode a plain replay
pushes in the middle of the forward comes off torch's dispatch stack from the top,
before the modes the replay entered around the forward exit, and after those the
block's own forward entered."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils import _python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import offrecomp.replay
from offrecomp import _torch_compat as tc
from tests import models
from tests.helpers import check_variant
from tests.offrecomp.test_model_zoo import CASES


def _spy_stop_pops(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per pop of a replay's stop mode: was it on top of the dispatch stack?"""
    pops: list[bool] = []
    leave = tc.leave_modes_entered_since

    def checked_leave(found: Any, bare: Any = None) -> None:
        if bare is not None:
            stack = _get_current_dispatch_mode_stack()
            pops.append(bool(stack) and stack[-1] is bare and type(bare) is offrecomp.replay._StopAtALaterOp)
        leave(found, bare)

    monkeypatch.setattr(tc, "leave_modes_entered_since", checked_leave)
    return pops


def _assert_no_mode_left() -> None:
    """The dispatch stack empty and torch's "in a dispatch mode" flags down, as before
    the step (modes exiting out of order restore those flags wrong)."""
    assert not _get_current_dispatch_mode_stack()
    assert not _python_dispatch._is_in_torch_dispatch_mode
    assert not _python_dispatch._is_in_non_infra_torch_dispatch_mode


def test_the_stop_mode_is_on_top_when_it_is_popped(monkeypatch: pytest.MonkeyPatch) -> None:
    """GRU blocks on the CPU save otherwise under a dispatch mode, so their replays run
    under a PassiveMode, and stop after a later op with the stop mode pushed on top of it.
    Popped after that PassiveMode's exit, the stop mode was popped by it: the PassiveMode
    stayed active, and torch before 2.11 crashed reading it once popped (a freed object)."""
    pops = _spy_stop_pops(monkeypatch)
    case = CASES["gru_lstm"]
    torch.manual_seed(0)
    check_variant(case.factory(), case.batch, "recompute")
    assert pops, "no replay pushed a stop mode"
    assert all(pops), f"{pops.count(False)} of {len(pops)} stop modes were not on top when popped"
    _assert_no_mode_left()


class _Count(TorchDispatchMode):
    """A mode of the user's, entered inside a block's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


class _FillsLater(torch.autograd.Function):
    """Saves a fresh tensor without grad at version 0, which its op could still fill
    (as ``rrelu_with_noise`` fills its noise): a replay needing it stops at the next op,
    under the stop mode."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, torch.ones(a.shape[-1]))
        return a * 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        a, ones = ctx.saved_tensors  # both read: a replay needs both
        return g * 3 * ones + 0 * a


class _ModeBlock(nn.Module):
    """Runs its last ops under a dispatch mode of its own, the op that pushes the stop
    mode among them: the early stop leaves through that mode's exit."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.fc(x))
        with _Count():
            z = _FillsLater.apply(y) * 2  # the last saves: the replay stops at the product
        return x + z


def test_a_dispatch_mode_inside_a_blocks_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop mode goes in beneath the block's own mode: that mode's exit pops itself,
    and the stop mode is on top when the replay pops it."""
    pops = _spy_stop_pops(monkeypatch)
    torch.manual_seed(0)
    model = models.stack(lambda: _ModeBlock(16))()
    check_variant(model, lambda s: torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(s)), "recompute")
    assert pops, "no replay pushed a stop mode"
    assert all(pops), f"{pops.count(False)} of {len(pops)} stop modes were not on top when popped"
    _assert_no_mode_left()


def test_the_stop_mode_goes_in_right_above_the_modes_active_as_the_forward_started() -> None:
    """Counted without infra modes, which torch keeps at the bottom of the stack whenever
    they were entered: one entered by the forward moves no mode's place."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    outer, inner, stop = _Count(), _Count(), _Count()
    with outer:
        depth = len(tc.mode_stacks()[0])  # as the forward starts
        with FunctionalTensorMode(), inner:
            tc.push_dispatch_mode_at(stop, depth)
            stack = _get_current_dispatch_mode_stack()
            assert [m for m in stack if m is outer or m is inner or m is stop] == [outer, stop, inner]
        assert _get_current_dispatch_mode_stack()[-1] is stop
        tc.leave_modes_entered_since(None, stop)
        assert _get_current_dispatch_mode_stack() == [outer]
    _assert_no_mode_left()


class _CountFunctions(torch.overrides.TorchFunctionMode):
    """A function mode of the user's, entered inside a block's forward."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class _BareEnterBlock(nn.Module):
    """Enters modes with a bare ``__enter__()`` and leaves them at the forward's end, with
    no ``finally``: a replay stops before those exits (a user's dispatch mode makes its
    replays plain ones, which stop after the last save; a served replay runs to the end)."""

    def __init__(self, d: int, modes: tuple[type, ...]) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.modes = modes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        modes = [mode() for mode in self.modes]
        for mode in modes:
            mode.__enter__()
        y = torch.tanh(self.fc(x))  # the last save
        out = x + y  # saves nothing: a replay has stopped by now
        for mode in reversed(modes):
            mode.__exit__(None, None, None)
        return out


@pytest.mark.parametrize(
    "modes", [(_Count,), (_CountFunctions, _Count)], ids=["dispatch", "function_and_dispatch"]
)
def test_modes_the_stopped_forward_entered_and_never_left_leave(
    modes: tuple[type, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [Modes a stopped forward left]: each stopped replay leaves the mode stacks as
    it found them (the rest of the backward would run under the leaked modes), and the
    gradients are plain's."""
    stacks: list[tuple[tuple[Any, ...], tuple[Any, ...], bool]] = []
    replay = offrecomp.replay._replay_forward

    def seen() -> tuple[Any, ...]:
        return (*_get_current_dispatch_mode_stack(), *torch.overrides._get_current_function_mode_stack())

    def spied(*args: Any) -> None:
        before = seen()
        try:
            replay(*args)
        finally:
            stacks.append((before, seen(), args[3].stopped))

    monkeypatch.setattr(offrecomp.replay, "_replay_forward", spied)
    torch.manual_seed(0)
    model = models.stack(lambda: _BareEnterBlock(16, modes))()
    check_variant(model, lambda s: torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(s)), "recompute")
    assert any(stopped for *_, stopped in stacks), "no replay stopped early"
    left = [after for before, after, _ in stacks if after != before]
    assert not left, f"{len(left)} of {len(stacks)} replays left modes: {left[0]}"
    assert not torch.overrides._get_current_function_mode_stack()
    _assert_no_mode_left()


def test_modes_entered_since_leave_and_the_bare_one_pops_in_its_place() -> None:
    """The modes entered since the stacks were read leave by their exits, the bare one
    pops bare, those found stay."""
    outer, stop, left = _Count(), _Count(), _Count()
    fn_outer, fn_left = _CountFunctions(), _CountFunctions()
    with outer, fn_outer:
        found = tc.mode_stacks()
        left.__enter__()
        fn_left.__enter__()
        tc.push_dispatch_mode_at(stop, len(found[0]))
        assert _get_current_dispatch_mode_stack() == [outer, stop, left]
        tc.leave_modes_entered_since(found, stop)
        assert _get_current_dispatch_mode_stack() == [outer]
        assert torch.overrides._get_current_function_mode_stack() == [fn_outer]
    _assert_no_mode_left()
    assert not torch.overrides._get_current_function_mode_stack()


def test_a_device_context_entered_since_stops_the_walk() -> None:
    """Its exit rebuilds the whole function stack and insists on its own place: it is
    left, with the modes beneath it, for the code that entered it."""
    fn_outer, fn_left, device = _CountFunctions(), _CountFunctions(), torch.device("cpu")
    with fn_outer:
        found = tc.mode_stacks()
        fn_left.__enter__()
        device.__enter__()
        before = torch.overrides._get_current_function_mode_stack()
        tc.leave_modes_entered_since(found)
        assert torch.overrides._get_current_function_mode_stack() == before
        device.__exit__(None, None, None)
        fn_left.__exit__(None, None, None)
    assert not torch.overrides._get_current_function_mode_stack()


class _ExitRaises(_Count):
    def __exit__(self, *exc: Any) -> None:
        raise RuntimeError("the user's exit fails")


class _ExitLeaves(_Count):
    def __exit__(self, *exc: Any) -> None:
        pass  # pops nothing


@pytest.mark.parametrize("mode", [_ExitRaises, _ExitLeaves])
def test_a_mode_whose_exit_fails_is_popped_bare(mode: type) -> None:
    outer, bad = _Count(), mode()
    with outer:
        found = tc.mode_stacks()
        bad.__enter__()
        tc.leave_modes_entered_since(found)
        assert _get_current_dispatch_mode_stack() == [outer]


def test_before_the_forward_began_only_the_bare_mode_on_top_pops() -> None:
    outer, stop = _Count(), _Count()
    with outer:
        tc.push_dispatch_mode_at(stop, 1)
        tc.leave_modes_entered_since(None, outer)  # not on top: stays
        assert _get_current_dispatch_mode_stack() == [outer, stop]
        tc.leave_modes_entered_since(None, stop)
        assert _get_current_dispatch_mode_stack() == [outer]
