"""Python's and numpy's global random states, for regions whose forward draws from them.

# NOTE [Host random states]
# A replay restores torch's generators to their state at the call's entry (NOTE [Replay],
# step 2), so a dropout mask comes out the same. A forward may also draw from Python's
# ``random`` (a layer dropped on ``random.random() < p``, a scale drawn per call) or from
# numpy's global RNG (noise made with ``np.random`` and ``torch.from_numpy``): a replay
# that drew again would run other ops (a divergence) or compute other values from the
# same ops (gradients silently wrong), and would move the caller's states on, so the
# training loop's next draws would differ from a plain run's. Capturing those states at
# every call costs about 10 us for ``random`` and 40 us for numpy on a 2.5 GHz host,
# more than a call's other bookkeeping, so the first PROBES calls of a region that take
# a replay checkpoint compare both states at their exit with their entry's (a forward
# may draw only in some calls: a block dropped on a torch draw before it draws from
# numpy). A region seen drawing from one (``Region.host_rng``, bits ``PY`` and
# ``NUMPY``) captures that one at each later call's entry, the probed call keeps the
# entry states it compared with, and its replays run from them and set the caller's
# back afterwards, as for torch's. A draw that becomes an op's number (a scale)
# differs from the recording's, which another call made: a serving replay that
# diverges there makes the recording stale, and the region replays plainly from then on
# (NOTE [Stale recordings] in regenerate.py). Not covered (docs/reliability.md): a
# region that draws in none of its first PROBES calls and later does, and private RNG
# objects (``random.Random()``, ``np.random.default_rng()``) held by the model, which a
# replay cannot tell from the model's other Python state. The states are global: a
# thread drawing from them while a replay runs draws from the replay's.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["ALL", "NUMPY", "PROBES", "PY", "HostStates", "capture", "drawn", "only", "restore"]

PY = 1
"""``Region.host_rng`` bit: its forward draws from Python's ``random``."""
NUMPY = 2
"""``Region.host_rng`` bit: its forward draws from numpy's global RNG."""
ALL = PY | NUMPY
PROBES = 8
"""A region's calls whose states are compared at exit (NOTE [Host random states])."""


@dataclass(frozen=True)
class HostStates:
    """The states of the global RNGs ``kinds`` names (None: not captured)."""

    kinds: int
    py: Any = None
    numpy: Any = None


def _np_random() -> Any:
    """numpy's random module where it is loaded (nothing drew from it otherwise)."""
    return sys.modules.get("numpy.random")


def capture(kinds: int) -> HostStates | None:
    """The states of the global RNGs ``kinds`` names (None for none)."""
    if not kinds:
        return None
    npr = _np_random() if kinds & NUMPY else None
    if npr is None:
        kinds &= ~NUMPY
        if not kinds:
            return None
    return HostStates(kinds, random.getstate() if kinds & PY else None, npr.get_state() if npr is not None else None)


def restore(states: HostStates) -> None:
    if states.py is not None:
        random.setstate(states.py)
    if states.numpy is not None:
        npr = _np_random()
        if npr is not None:
            npr.set_state(states.numpy)


def drawn(before: HostStates) -> int:
    """The bits of the RNGs of ``before`` whose state has moved since."""
    kinds = 0
    if before.py is not None and random.getstate() != before.py:
        kinds |= PY
    npr = _np_random()
    if before.numpy is not None and npr is not None and not _same_numpy(before.numpy, npr.get_state()):
        kinds |= NUMPY
    return kinds


def only(states: HostStates, kinds: int) -> HostStates | None:
    """``states`` limited to the RNGs ``kinds`` names."""
    kinds &= states.kinds
    if not kinds:
        return None
    return HostStates(kinds, states.py if kinds & PY else None, states.numpy if kinds & NUMPY else None)


def _same_numpy(a: Any, b: Any) -> bool:
    # the legacy state: ('MT19937', keys (624 uint32), pos, has_gauss, cached_gaussian)
    return bool(a[0] == b[0] and tuple(a[2:]) == tuple(b[2:]) and (a[1] == b[1]).all())
