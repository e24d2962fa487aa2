"""What the region's dispatch modes see, and the base they share.

Ops offrecomp issues itself (inside its hooks) are hidden from the modes (``internal``),
and user code offrecomp runs on the user's behalf (a replayed forward) is seen again
(``user_code``). ``_RegionMode`` is the base of every mode that watches a region's ops.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from torch.utils import flop_counter

from offrecomp import _torch_compat as tc


class ThreadDepth(threading.local):
    """A per-thread nesting depth. The class default answers threads that never set it
    (``getattr`` with a default costs an exception on every miss, on every op)."""

    depth = 0


_tls = ThreadDepth()  # internal() nesting on this thread


class _Depth:
    """``internal()``'s and ``user_code()``'s context: a class, not a generator, as the
    replay's save hook enters one per save."""

    __slots__ = ("saved", "to")

    def __init__(self, to: int | None) -> None:
        self.to = to  # None: one level deeper; else the depth to set
        self.saved = 0

    def __enter__(self) -> None:
        self.saved = depth = _tls.depth
        _tls.depth = depth + 1 if self.to is None else self.to

    def __exit__(self, *exc: object) -> None:
        _tls.depth = self.saved


def internal() -> contextlib.AbstractContextManager[None]:
    """Ops offrecomp itself issues (inside its hooks) are invisible to the modes below."""
    return _Depth(None)


def user_code() -> contextlib.AbstractContextManager[None]:
    """Undo ``internal()`` while offrecomp runs user code (a replayed forward)."""
    return _Depth(0)


def _is_internal() -> bool:
    return _tls.depth > 0


class _RegionMode(tc.TorchDispatchMode):
    """What the recorder and the replay's serving mode share about code they do not see
    op by op.

    Higher-order operators (flex_attention, cond) reach the mode as one op; without
    ``supports_higher_order_operators`` they raise NotImplementedError. The recorder
    records one as one op, which makes the region opaque (see build_structure); the
    serving mode, which never runs on an opaque region, reports one as a divergence.

    Both step aside while dynamo compiles (``ignore_compile_internals``). Otherwise
    dynamo falls back to eager under the mode, gives up on that code for good, and code
    compiled with fullgraph=True raises (eager flex_attention compiles its own wrapper
    that way). Compiled code then runs compiled in the recording and the replay alike:
    the kernels of a compiled graph are seen by neither, and a value they make is read
    from outside the recording, which turns placeholders off."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class PassiveMode(_RegionMode):
    """Runs every op as it is. Some composite ops take another path, saving other
    tensors, whenever any dispatch mode is active (``ctc_loss`` with tensor lengths saves
    them too); a forward or replay that must save what one under the recorder or the
    watch saved runs under this (NOTE [Replay], step 7)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


#: Dispatch modes known to leave every value as it is (they count): a replay outside one
#: computes what the forward under it did. ``FlopCounterMode`` pushes a private mode.
_VALUE_PRESERVING: tuple[type, ...] = tuple(
    getattr(flop_counter, n) for n in ("_FlopCounterMode", "FlopCounterMode") if hasattr(flop_counter, n)
)


def user_dispatch_modes() -> list[str]:
    """Class names of the dispatch modes active now that are not the runtime's and may
    change values."""
    if not tc.dispatch_modes_active():
        return []
    return [
        type(m).__name__ for m in tc.dispatch_mode_stack()
        if not isinstance(m, _RegionMode) and not isinstance(m, _VALUE_PRESERVING)
    ]
