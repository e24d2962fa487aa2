"""Whether a forward set on a region while the runtime is entered calls the runtime's
wrapper (install.py follows the region's ``forward`` slot).

NOTE [Forwards replaced while entered]
Code that sets a region's ``forward`` while the runtime is entered (a library binding a
forward of its own, ``block.forward = MethodType(fn, block)``, or ``del block.forward``)
takes the runtime's wrapper out of the region's calls: the block would run plainly,
every activation kept, and leave ``explain()``. At each root forward the runtime
compares each region's ``forward`` slot with the value it last saw there (about 0.1 us
a region). A new forward that calls the wrapper (a patch around it:
accelerate's hooks, ``functools.wraps``, a closure over the old ``block.forward``) is
left as it is: the region's calls still go through the wrapper, and a second wrapper
would put the patch's own work inside the region. Any other gets a wrapper of its own,
whose replays call the new forward, and exit puts the new forward back; a patch
undone (``mock.patch``'s exit) puts one of the runtime's own wrappers back, which is
followed as it is. A patch that
calls the old wrapper in a way not followed (a global, an attribute read at call time)
is wrapped too: the old wrapper inside it then runs its forward plainly, as a region
call is running, so the region is the patched forward. A root whose ``forward`` is
replaced so is not followed: its regions' calls then begin its passes (NOTE [Pass
signatures]).
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any

__all__ = ["calls_one_of"]


def calls_one_of(fn: Any, targets: tuple[Any, ...]) -> bool:
    """Does the forward ``fn`` reach one of ``targets`` (NOTE [Forwards replaced while
    entered])? Followed, four levels deep, through ``__wrapped__`` (``functools.wraps``),
    a bound method's function, a partial's function and arguments, and a function's
    closure cells and defaults."""
    todo = [fn]
    for _ in range(4):
        if any(f is t for f in todo for t in targets):
            return True
        todo = [r for f in todo for r in _reached(f)]
    return any(f is t for f in todo for t in targets)


def _reached(f: Any) -> list[Any]:
    """What a callable ``f`` holds that it may call (see ``calls_one_of``)."""
    out: list[Any] = []
    table = getattr(f, "__dict__", None)
    if type(table) is dict and "__wrapped__" in table:
        out.append(table["__wrapped__"])
    if isinstance(f, types.MethodType):
        out.append(f.__func__)
    elif isinstance(f, functools.partial):
        out += [f.func, *f.args, *f.keywords.values()]
    elif isinstance(f, types.FunctionType):
        for cell in f.__closure__ or ():
            with contextlib.suppress(ValueError):  # an empty cell
                out.append(cell.cell_contents)
        out += [*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values()]
    return out
