"""An interrupt (Ctrl-C, a watchdog handler's exception) caught by the loop, which trains
on with the same runtime entered, leaves no state behind: no region call on the stack
(NOTE [Stale calls] in install.py), the offload engine's lock free (NOTE [Engine lock]),
no copy whose sources went (NOTE [Interrupted issue]), no host block held, and the runtime
then replays, offloads and plans as before, gradients bitwise."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import pytest

import offrecomp
from offrecomp import _torch_compat as tc
from offrecomp.calls import RegionCalls
from offrecomp.install import Installer
from offrecomp.offload import OffloadEngine
from offrecomp.pool import PinnedPool
from tests.helpers import assert_bitwise, make, train, twin
from tests.offrecomp.test_interrupts import _InterruptAt


def _line_of(fn: Callable[..., Any], text: str) -> int:
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(src) if text in line)


def _at_line(line: int) -> Callable[[FrameType, Any], bool]:
    return lambda f, a: f.f_lineno == line


_BEGIN = Installer._begin_region
_REGION_POINTS: dict[str, tuple[CodeType, str, Callable[[FrameType, Any], bool]]] = {
    # between the call's start (on the stack) and its wrapper's try
    "entry noted": (_BEGIN.__code__, "line", _at_line(_line_of(_BEGIN, "self._diag.note_entry("))),
    "modes read": (_BEGIN.__code__, "line", _at_line(_line_of(_BEGIN, "call.under_mode = call.watch"))),
    "native entry": (_BEGIN.__code__, "line", _at_line(_line_of(_BEGIN, "self._native.enter(call, args, kwargs)"))),
    "returned": (_BEGIN.__code__, "line", _at_line(_line_of(_BEGIN, "        return call"))),
    # the call's end, before it leaves the stack
    "end": (Installer._end_region.__code__, "call", lambda f, a: True),
    "exit": (RegionCalls.exit.__code__, "call", lambda f, a: True),
}


@pytest.mark.parametrize("point", sorted(_REGION_POINTS))
@pytest.mark.parametrize("mode", ["recompute", "offload", "auto"])
def test_an_interrupt_at_a_region_calls_start_or_end_leaves_no_stale_call(mode: str, point: str) -> None:
    """Left on the stack, the call made every later call of the runtime run as one nested
    in it: forced recompute replayed nothing (and the next backward diverged), offload
    booked nothing, auto measured every step."""
    model, batch = make("gpt_dropout")
    plain = twin(model)
    train(plain, batch, steps=3)
    ref = train(plain, batch, steps=3)
    m = twin(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    train(m, batch, rt, steps=3)
    code, event, when = _REGION_POINTS[point]
    with rt:
        with pytest.raises(KeyboardInterrupt), _InterruptAt(code, event, when) as at:
            m(batch(0))
        assert at.fired
        assert rt._life.stack.calls == [] and not tc.dispatch_modes_active()
    m.zero_grad(set_to_none=True)
    assert_bitwise(ref, train(m, batch, rt, steps=3))
    last = rt.report().steps[-1]
    if mode == "recompute":
        assert last.replays > 0 and last.recomputed_bytes > 0
    elif mode == "offload":
        assert last.offloaded_bytes > 0 and last.peak_activation_bytes > 0
    else:
        assert last.phase == "planned", [s.phase for s in rt.report().steps]


def _call(code: CodeType) -> tuple[CodeType, str, Callable[[FrameType, Any], bool]]:
    return code, "call", lambda f, a: True


def _line(fn: Callable[..., Any], text: str) -> tuple[CodeType, str, Callable[[FrameType, Any], bool]]:
    return fn.__code__, "line", _at_line(_line_of(fn, text))


_ENGINE_POINTS = {
    "issue": _call(OffloadEngine.issue.__code__),
    "copies out": _call(OffloadEngine._copy_out.__code__),
    "keeps sources": _call(OffloadEngine._keep_sources.__code__),
    "stash appended": _line(OffloadEngine._keep_sources, "self._stash_bytes += entry.nbytes"),
    "in order": _line(OffloadEngine._copy_out, "self._groups.add(group)"),
    "stash bounded": (OffloadEngine._bound_stash.__code__, "return", lambda f, a: True),
    "sources let go": _call(OffloadEngine._drop.__code__),
    "fetch": _call(OffloadEngine.fetch.__code__),
    "releases device": _call(OffloadEngine._release_device.__code__),
    "free": _line(OffloadEngine.free, "if not lock.acquire(blocking=False):"),
    "frees": _call(OffloadEngine._free_now.__code__),
    "polls": _call(OffloadEngine._poll.__code__),
    "returns blocks": _call(OffloadEngine._return_blocks.__code__),
    "returns a block": _call(OffloadEngine._return_block.__code__),
    "pool release": _call(PinnedPool.release.__code__),
    "pool listed": _line(PinnedPool.release, "self.in_use_bytes, self._idle_bytes, block.freed = ("),
}


_KNOWN = {
    "sources let go": "an interrupt at the start of a landed copy's let-go, inside an issue's poll, "
    "leaves that issue's group counted live (reliability.md, Interrupts in cleanup)",
}


@pytest.mark.parametrize(
    "point",
    [pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=_KNOWN[p])) if p in _KNOWN else p
     for p in sorted(_ENGINE_POINTS)],
)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # a finaliser's interrupt, dropped
def test_an_interrupt_in_the_offload_engine_leaves_it_whole(point: str) -> None:
    """The engine's lock was left held (an interrupt at its Python ``__exit__``: every
    later free queued, the pool growing each step, another thread's backward waiting for
    good), a group's block lost (in a free, or in a finaliser's release, where Python
    drops the interrupt), and the next step failed on a copy whose sources had gone. A
    release run again must not count its groups freed twice, an issue cut short must
    leave its group in the engine's order once, and the stash's bytes must add up."""
    model, batch = make("gpt_dropout")
    plain = twin(model)
    train(plain, batch, steps=1)
    ref = train(plain, batch, steps=2)
    m = twin(model)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    train(m, batch, rt, steps=1)
    engine = rt.offload_engine
    assert engine is not None
    with rt:
        code, event, when = _ENGINE_POINTS[point]
        with _InterruptAt(code, event, when) as at:
            loss = None
            try:
                loss = m(batch(0))
                loss.backward()
            except KeyboardInterrupt:
                pass
            loss = None  # the graph goes, a backward cut short too
        assert at.fired
        taken: list[bool] = []
        t = threading.Thread(target=lambda: taken.append(engine._lock.acquire(timeout=5) and not engine._lock.release()))
        t.start()
        t.join()
        assert taken == [True]
    m.zero_grad(set_to_none=True)
    assert_bitwise(ref, train(m, batch, rt, steps=2))
    assert rt.report().steps[-1].offloaded_bytes > 0
    engine.poll()
    assert engine.pool.in_use_bytes == 0 and engine.live_groups == 0 and not engine._pending_frees
    assert rt.offload_groups_held == 0 and engine.stash_bytes == 0
    assert len(engine._order) == len({id(g) for g in engine._order})
