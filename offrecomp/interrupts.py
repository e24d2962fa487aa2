"""Cleanup that an interrupt does not cut short.

NOTE [Interrupts in cleanup]
A KeyboardInterrupt (Ctrl-C), or the exception of another signal's handler, is raised
on the main thread between two bytecodes: at the first instruction of a Python function,
right after a call returns or at a loop's back edge, so also at the start of a
``finally`` block or an ``__exit__``. One landing in the runtime's own cleanup stops that cleanup where it lands,
and what it left undone would stay so for every later step: the runtime's hook pair off
the thread's stack after a region call saved natively (NOTE [Native keep]), so that the
runtime's exit pops an empty stack; a replay's contexts still entered (NOTE [Replay]),
grad mode and the replay depth among them. The cleanup later steps depend on therefore
runs through ``finish``: it runs its step to the end, again after each interrupt that
lands in it, and raises the first interrupt once the step has ended. So do the
runtime's uninstall, a native call's return of the pair, a replay's exits and its
setting back of the caller's random states. A ``finally`` block runs its step once
inside a ``try`` of its own and hands an interrupt to ``finish`` from the ``except``:
called first, ``finish`` itself could be cut short at its first instruction.

A step run so either picks up where an interrupted run of it stopped
(``ExitStack.close`` does: an exit it has run is no longer on the stack) or sets state
from what it reads rather than from a flag (the hook pair goes back on when the stack's
top is not it, and comes off only when it is), so a second run redoes nothing and an
interrupt between an effect and its bookkeeping cannot double the effect.

What remains: an interrupt between a context's entry and its registration for exit, or
between an exit's removal from an ``ExitStack`` and its call, skips that one exit (a
generator-based context runs it when its generator is collected, once the interrupt's
traceback is freed); a replay therefore also sets grad mode and its depth back itself
(replay.py). An interrupt on the few bytecodes between a region call's start and its
``try``, or at the start of the call that puts the pair back in its ``finally``, leaves
a natively saving call's pair off: the runtime's model forward, raising on its way out,
and the runtime's exit put it back (install.py). A second interrupt landing at the start
of ``finish`` or on its loop's back edge escapes it.

A finaliser's cleanup (a region call's release when autograd drops its last handle,
NOTE [Call leases] in handles.py) runs to its end the same way, and the interrupt then
leaves the finaliser, where Python prints and drops it, as it does whatever a finaliser
raises.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MAX_RUNS", "finish"]

#: A step raising this many times running is given up: its error is not an interrupt.
MAX_RUNS = 32


def finish(step: Callable[[], object], first: BaseException | None = None) -> None:
    """Run ``step`` to its end, again after each exception that lands in it, and then
    raise ``first`` (an exception a run of ``step`` before this one raised), else the
    first one here (NOTE [Interrupts in cleanup]). ``step`` must redo nothing when run
    again."""
    runs = 0
    while runs < MAX_RUNS:
        runs += 1
        try:
            step()
            break
        except BaseException as e:  # an interrupt: run the rest of the step
            if first is None:
                first = e
    if first is not None:
        raise first

