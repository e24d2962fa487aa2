"""The runtime's saved-tensor hooks come off the thread's stack while a backward runs.

NOTE [Hooks off in backward]
Autograd's engine evaluates each node of a backward under the thread-local state it
captured when the backward began, the saved-tensor hook stack included, and puts the
thread's previous state back after the node. Each of those copies takes a reference to
every hook on the stack, and each reference is taken under the GIL, which the engine's
threads do not hold: about 1 µs per node per hook pair on a CPU host
(benchmarks/bench_host_overhead.py, the ``keep`` row), in every backward the runtime's
pair is installed around. A backward does not need the pair on the stack: the saved
tensors of the forward are unpacked through the hooks each saved variable holds. The
stack is read only for tensors saved while the backward runs, which the pack hook takes
as they are (a tensor saved inside backward belongs to no forward).

So while a runtime is installed, the function every Python backward goes through
(``torch.autograd.backward`` and ``torch.autograd.grad`` call it, ``backward_entry`` in
_torch_compat.py) is wrapped: when the runtime's pair is the only pair on the calling
thread's stack and the backward makes no graph, the pair comes off for the backward and
goes back on when it returns or raises. The pair stays on
- for a backward that makes a graph (``create_graph=True``): its saves belong to the pass
  it differentiates (NOTE [Double backward] in lifecycle.py);
- when another pair lies beneath the runtime's: with the runtime's off, that pair would
  take the saves of the backward (a reentrant checkpoint's recomputation);
- on a thread whose top pair is not a runtime's (a runtime entered on another thread,
  a region call saving natively, NOTE [Native keep]).
A backward entered another way (C++, TorchScript) runs with the pair on. The
wrapper goes when the last runtime is uninstalled, unless something wrapped it in turn:
then it stays in that chain and passes every call through while no runtime is installed,
as it does for a backward on another thread that looked it up just before it went. A
runtime installed after another patch dropped or wrapped the wrapper places a new one.
The pair goes back on from what the stack holds, not from a flag, so an interrupt
(Ctrl-C) between the pop and the push cannot leave it off.

The wrapper also notes, per thread, while a backward that keeps its graph runs
(``retain_graph``, ``create_graph``): its saved tensors outlive it (``keeping_graph``).

NOTE [Compiled autograd]
Compiled autograd traces a backward with dynamo, the unpack hooks of its saved tensors
included; the runtime's hooks reload, replay and keep books, which dynamo cannot trace
(it fails at their first engine callback). So while a runtime is installed, a backward
entered through the wrapper while compiled autograd is on runs without it, with a
warning once: gradients are those of the eager backward, and the forward's own
compilation stays.

The wrapper also tells each installed runtime, before it runs, of every backward that
accumulates into ``.grad`` (``backward()``, not ``autograd.grad``), whatever the stack
holds: one run inside a region's forward must never run again in a replay (NOTE
[Accumulating backward in a forward] in calls.py); and of every backward that makes a
graph while another pair is on top (a penalty's ``autograd.grad(create_graph=True)``
under ``save_on_cpu``), whose saves the runtime's pack hook never sees: its pass awaits
the backward that differentiates that graph (NOTE [Double backward] in lifecycle.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from offrecomp import _torch_compat as tc
from offrecomp.diagnostics import warn_once

__all__ = ["disown", "keeping_graph", "own", "owned"]

_thread = threading.local()


def keeping_graph() -> bool:
    """A backward that keeps its graph runs on this thread, entered through the
    wrapper."""
    return getattr(_thread, "keeping", 0) > 0

_lock = threading.Lock()
#: The pack hooks of the installed runtimes' pairs (a runtime installed twice: twice).
_packs: list[Any] = []
#: What each installed runtime runs before a backward that accumulates (as ``_packs``).
_watchers: list[Callable[[], None]] = []
#: ... and before one that makes a graph under another pair than a runtime's.
_makers: list[Callable[[], None]] = []
#: The wrapper this module last made torch's entry, while some runtime is installed.
_placed: Callable[..., Any] | None = None


def _say_eager_backward() -> None:
    warn_once(
        "compiled-autograd",
        "offrecomp: compiled autograd is on; backwards run without it while a runtime is "
        "installed, as it cannot trace the runtime's saved-tensor hooks (the forward's "
        "compilation stays)",
    )


def _wrap(inner: Callable[..., Any]) -> Callable[..., Any]:
    """A wrapper of ``inner``. Each holds its own: a backward on another thread that
    looked one up just before the last runtime took it out still has its entry, and a
    wrapper placed over a chain that holds an earlier one never calls itself."""

    def entry(outputs: Any, *args: Any, **kwargs: Any) -> Any:
        if not tc.backward_keeps_graph(args, kwargs):
            return _run(inner, outputs, *args, **kwargs)
        _thread.keeping = getattr(_thread, "keeping", 0) + 1
        try:
            return _run(inner, outputs, *args, **kwargs)
        finally:
            _thread.keeping -= 1

    entry.inner = inner  # type: ignore[attr-defined]
    return entry


def _run(inner: Callable[..., Any], outputs: Any, *args: Any, **kwargs: Any) -> Any:
    """A wrapper's body around ``inner``: a module function, where a closure calling
    itself would be a reference cycle through its own cell, one per wrapper made."""
    if tc.compiled_autograd_on():  # NOTE [Compiled autograd]
        _say_eager_backward()
        with tc.compiled_autograd_off():
            return _run(inner, outputs, *args, **kwargs)
    if _watchers and tc.backward_accumulates(args, kwargs):
        for watch in list(_watchers):
            watch()
    top = tc.top_saved_tensors_hooks()
    creates = tc.backward_creates_graph(args, kwargs)
    if top is None or top[0] not in _packs or creates:
        if creates and _makers and top is not None and top[0] not in _packs:
            for made in list(_makers):
                made()
        return inner(outputs, *args, **kwargs)
    try:
        tc.pop_sole_saved_tensors_hooks(top)
        return inner(outputs, *args, **kwargs)
    finally:
        # From the stack, not from a flag, and again after an interrupt (Ctrl-C, a
        # signal handler's exception) that lands on the way: one may come anywhere
        # between the pop and the push.
        interrupt: BaseException | None = None
        while True:
            try:
                now = tc.top_saved_tensors_hooks()
                if now is None or now[0] is not top[0]:
                    tc.push_saved_tensors_hooks(*top)
                break
            except BaseException as e:  # raised once the pair is back
                interrupt = e
        if interrupt is not None:
            raise interrupt


def own(pack: Any, watch: Callable[[], None], made: Callable[[], None]) -> None:
    """A runtime installed a pair with ``pack``: backwards run with it off, ``watch``
    runs before each backward that accumulates into ``.grad`` and ``made`` before each
    that makes a graph under another pair."""
    global _placed
    with _lock:
        _packs.append(pack)
        _watchers.append(watch)
        _makers.append(made)
        if _placed is None or tc.backward_entry() is not _placed:
            # none placed, or another patch of the entry dropped or wrapped ours
            _placed = _wrap(tc.backward_entry())
            tc.set_backward_entry(_placed)


def disown(pack: Any, watch: Callable[[], None], made: Callable[[], None]) -> None:
    """The pair with ``pack`` (and ``watch``, ``made``) is uninstalled; the last one takes
    the wrapper out, unless another wrapper took the entry over it (that one keeps
    calling it, and it passes every call through while no runtime is installed)."""
    global _placed
    with _lock:
        if pack in _packs:
            _packs.remove(pack)
        if watch in _watchers:
            _watchers.remove(watch)
        if made in _makers:
            _makers.remove(made)
        if _packs or _placed is None:
            return
        if tc.backward_entry() is _placed:
            tc.set_backward_entry(_placed.inner)  # type: ignore[attr-defined]
        _placed = None


def owned() -> bool:
    """Is a runtime installed, with this module's wrapper torch's entry?"""
    return bool(_packs) and _placed is not None and tc.backward_entry() is _placed
