"""A KeyboardInterrupt (Ctrl-C) landing in the runtime's own cleanup reaches the loop and
leaves the process sane: the runtime exits, grad mode and the thread's hook stack are as
before, and later steps train bitwise (NOTE [Interrupts in cleanup]); one landing while
numba loads the planner's kernels leaves later plans working (NOTE [kernel loads]).

The interrupt is raised from a trace function at a chosen event of a chosen function: at
its first instruction ("call"), where a signal is handled on entry, or as it returns to
its caller ("return"), where one is handled right after the call."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
import torch

import offrecomp
from offrecomp import _torch_compat as tc
from offrecomp import replay
from offrecomp.install import Installer
from offrecomp.native import NativeKeep
from tests.helpers import assert_bitwise, make, train, twin

ROOT = Path(__file__).resolve().parents[2]


class _InterruptAt:
    """While entered, raise KeyboardInterrupt once, at the first ``event`` ("call",
    "line" or "return") of a frame running ``code`` for which ``when(frame, arg)`` holds
    (``arg``: the value returned, for "return")."""

    def __init__(self, code: CodeType, event: str, when: Callable[[FrameType, Any], bool] = lambda f, a: True):
        self.code = code
        self.event = event
        self.when = when
        self.fired = False

    def __enter__(self) -> _InterruptAt:
        self._outer = sys.gettrace()
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._outer)

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.fired or frame.f_code is not self.code:
            return None
        if self.event == "call":
            self._maybe_fire(frame, None)
            return None
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == self.event:
            self._maybe_fire(frame, arg)
        return self._local

    def _maybe_fire(self, frame: FrameType, arg: Any) -> None:
        if not self.fired and self.when(frame, arg):
            self.fired = True
            sys.settrace(None)
            raise KeyboardInterrupt


def _assert_sane(rt: offrecomp.Runtime) -> None:
    assert not rt.active
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert tc.top_saved_tensors_hooks() is None
    assert not tc.dispatch_modes_active()
    assert not offrecomp.in_replay() and replay.replayed_regions() == ()


# ------------------------------------------------------------------ native keep

_NATIVE_POINTS = {
    # the defect's instant: the region call returned, its exit not begun
    "exit": (Installer._end_region.__code__, "call", lambda f, a: f.f_locals["call"].native),
    # the pair just popped, before the look for another pair beneath it
    "pop": (tc.top_saved_tensors_hooks.__code__, "call",
            lambda f, a: f.f_back is not None and f.f_back.f_code is tc.pop_sole_saved_tensors_hooks.__code__),
    # the pair off, before the region's wrapper enters its try
    "entry": (NativeKeep.enter.__code__, "return", lambda f, a: a is True),
}


@pytest.mark.parametrize("point", sorted(_NATIVE_POINTS))
def test_an_interrupt_around_a_native_call_leaves_the_hooks_right(point: str) -> None:
    """NOTE [Native keep]: the pair is back on the stack when the interrupt reaches the
    loop, the runtime exits, and the same runtime trains on bitwise."""
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=2)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="keep")
    with rt:  # the signature's first pass records each call's books: later ones save natively
        m(batch(0)).backward()
    m.zero_grad(set_to_none=True)
    code, event, when = _NATIVE_POINTS[point]
    with pytest.raises(KeyboardInterrupt), rt, _InterruptAt(code, event, when) as at:
        m(batch(0))
    assert at.fired
    _assert_sane(rt)
    got = train(m, batch, rt, steps=2)
    assert_bitwise(ref, got)
    _assert_sane(rt)


# ----------------------------------------------------------------------- entry


def _wrap_lines() -> list[int]:
    code = Installer._wrap_forward.__code__
    return sorted({line for _, _, line in code.co_lines() if line is not None and line > code.co_firstlineno})


@pytest.mark.parametrize("line", _wrap_lines())
def test_an_interrupt_while_forwards_are_wrapped_leaves_no_wrapper(line: int) -> None:
    """An interrupt (a watchdog's SIGALRM handler raising) landing at any line of a
    region's forward wrapping: the failed entry leaves no wrapper in any module, and the
    same runtime trains on bitwise, leaving none at its exits either."""
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=2)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="recompute")
    code = Installer._wrap_forward.__code__
    with pytest.raises(KeyboardInterrupt), _InterruptAt(code, "line", lambda f, a: f.f_lineno == line) as at, rt:
        pass
    assert at.fired
    _assert_sane(rt)
    assert [n for n, mod in m.named_modules() if "forward" in mod.__dict__] == []
    got = train(m, batch, rt, steps=2)
    assert_bitwise(ref, got)
    assert [n for n, mod in m.named_modules() if "forward" in mod.__dict__] == []


# ----------------------------------------------------------------------- replay

_REPLAY_POINTS = {
    # the defect's instant: the replayed forward ended, its contexts' exits not begun
    "unwind": (contextlib.ExitStack.__exit__.__code__, "call", lambda f, a: offrecomp.in_replay()),
    # grad mode on, before the stack holds the context that turns it back
    "entered": (torch.enable_grad.__enter__.__code__, "return", lambda f, a: offrecomp.in_replay()),
}


@pytest.mark.parametrize("point", sorted(_REPLAY_POINTS))
@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_an_interrupt_in_a_replays_contexts_leaves_grad_mode_on(mode: str, point: str) -> None:
    """NOTE [Replay]: grad mode, the replay depth and the module's parameters are as before
    once the interrupt reaches the loop, and the same runtime trains on bitwise."""
    model, batch = make("gpt_dropout")
    ref = train(twin(model), batch, steps=2)
    m = twin(model)
    params = list(m.parameters())
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    code, event, when = _REPLAY_POINTS[point]
    with pytest.raises(KeyboardInterrupt), rt:
        torch.manual_seed(0)
        loss = m(batch(0))
        with _InterruptAt(code, event, when) as at:
            loss.backward()
    assert at.fired
    del loss
    _assert_sane(rt)
    assert all(p is q for p, q in zip(m.parameters(), params, strict=True))
    m.zero_grad(set_to_none=True)
    got = train(m, batch, rt, steps=2)
    assert_bitwise(ref, got)
    _assert_sane(rt)


# ------------------------------------------------------------------------ numba

_CHILD = """
import signal, sys
# a parent run in the background by a non-interactive shell ignores SIGINT, and a child
# inherits that: the Ctrl-C below needs Python's own handler
signal.signal(signal.SIGINT, signal.default_int_handler)
{setup}
file, name, n = {file!r}, {name!r}, {n}
seen = 0
def trace(frame, event, arg):
    global seen
    code = frame.f_code
    if event == "call" and code.co_filename.endswith(file) and name in ("", code.co_name):
        seen += 1
        if seen == n:
            sys.settrace(None)
            signal.raise_signal(signal.SIGINT)  # Ctrl-C
    return None
sys.settrace(trace)
try:
    {run}
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted")
sys.settrace(None)
{run}
print("then ok")
"""


def _child(setup: str, run: str, file: str, name: str, n: int) -> subprocess.CompletedProcess[str]:
    code = _CHILD.format(setup=setup, run=run, file=file, name=name, n=n)
    return subprocess.run(  # a process of its own: numba loads its contexts once per process
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600, cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("file", "name", "n"),
    [
        ("numba/cpython/unicode.py", "", 10),  # importing an implementation module
        ("numba/core/utils.py", "sublist_iterator", 40),  # reading a registry
    ],
    ids=["import", "registry"],
)
def test_an_interrupt_in_numbas_first_refresh_leaves_kernels_loadable(file: str, name: str, n: int) -> None:
    """NOTE [kernel loads]: a Ctrl-C in the refresh numba runs before its first kernel
    load reaches the caller once the refresh ends, and the kernel then loads."""
    out = _child(
        "import numpy as np\nfrom scheduler.kernels import argsort\nkeys = np.array([3.0, 1.0, 2.0])",
        "assert list(argsort(keys)) == [1, 2, 0]",
        file, name, n,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["interrupted", "then", "ok"], out.stdout + out.stderr[-3000:]


@pytest.mark.slow
def test_an_interrupt_while_the_first_plan_loads_kernels_leaves_planning_working() -> None:
    """The interrupt lands in the first planned pass's kernel loads; a new runtime then
    plans and trains bitwise."""
    setup = """
        import offrecomp
        from tests.helpers import assert_bitwise, make, train, twin
        model, batch = make("gpt_dropout")
        ref = train(twin(model), batch, steps=4)
        def run():
            m = twin(model)
            rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget="8KiB")
            assert_bitwise(ref, train(m, batch, rt, steps=4))
            assert rt.report().steps[-1].phase.value == "planned"
    """
    out = _child(textwrap.dedent(setup), "run()", "numba/core/utils.py", "sublist_iterator", 40)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["interrupted", "then", "ok"], out.stdout + out.stderr[-3000:]
