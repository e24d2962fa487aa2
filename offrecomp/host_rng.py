"""Python's and numpy's random states, for regions whose forward draws from them.

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
# numpy), and one call in REPROBE after them (a forward that starts drawing later: a
# stochastic depth a schedule turns on). A region seen drawing from one
# (``Region.host_rng``, bits ``PY`` and ``NUMPY``) captures that one at each later
# call's entry, and so does every region of its block's class (the blocks of a stack
# run one forward: one whose draws hang on a torch draw, a stochastic depth's, may draw
# in none of its probed calls where its siblings did; blocks of other classes, a
# subclass too, are not told); the probed call keeps the entry
# states it compared with, and its replays run from them and set the caller's back
# afterwards, as for torch's. A region first seen
# drawing after its first PROBES calls gets a warning: the replays of its calls between
# then and its last probe drew anew.
#
# RNG objects of their own (``random.Random(seed)``, ``np.random.default_rng(seed)``, a
# ``RandomState`` or a bit generator) that a region's modules hold as attributes, or
# that its calls take as arguments, are captured at every call's entry (bit ``PRIVATE``):
# a module holds one to draw from it, and the capture costs 1-40 us. So are those one
# step from such an attribute, found at the first call (``private_slots``): an attribute
# of a config or helper object (``self.cfg.rng``), an item of a list or dict, the object
# of a bound method (``self.draw = rng.standard_normal``), a cell of a function's closure
# (a sampler made by a factory). Objects reached further away (two objects deep, a
# global other than the two above) are not known: a replay draws anew from them, as for
# a torch generator its region's first call did not draw from (NOTE [Private
# generators] in replay.py); ``random.SystemRandom`` has no state to restore.
#
# A draw that becomes an op's number (a scale) differs from the recording's, which
# another call made: a serving replay that diverges there makes the recording stale,
# and the region replays plainly from then on (NOTE [Stale recordings] in
# regenerate.py). The global states are global: a thread drawing from them while a
# replay runs draws from the replay's.
"""

from __future__ import annotations

import random
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
from torch import nn

__all__ = [
    "ALL", "NUMPY", "PRIVATE", "PROBES", "PY", "REPROBE", "HostStates", "capture", "drawn", "is_private",
    "Slot", "only", "private_objects", "private_slots", "restore",
]

PY = 1
"""``Region.host_rng`` bit: its forward draws from Python's ``random``."""
NUMPY = 2
"""``Region.host_rng`` bit: its forward draws from numpy's global RNG."""
ALL = PY | NUMPY
"""The global RNGs."""
PRIVATE = 4
"""``Region.host_rng`` bit: its modules hold, or its calls took, RNG objects of their own."""
PROBES = 8
"""A region's first calls whose global states are compared at exit (NOTE [Host random states])."""
REPROBE = 32
"""After its first PROBES calls, one call of a region in REPROBE is compared too."""


@dataclass(frozen=True)
class HostStates:
    """The states of the global RNGs ``kinds`` names (None: not captured), and of the
    RNG objects ``private`` pairs with theirs."""

    kinds: int
    py: Any = None
    numpy: Any = None
    private: tuple[tuple[Any, Any], ...] = ()


def _np_random() -> Any:
    """numpy's random module where it is loaded (nothing drew from it otherwise)."""
    return sys.modules.get("numpy.random")


def capture(kinds: int, private: Iterable[Any] = ()) -> HostStates | None:
    """The states of the global RNGs ``kinds`` names and of the ``private`` RNG objects
    (None for none)."""
    objects = tuple((o, _state_of(o)) for o in private)
    kinds &= ALL
    npr = _np_random() if kinds & NUMPY else None
    if npr is None:
        kinds &= ~NUMPY
    if not kinds and not objects:
        return None
    return HostStates(
        kinds | (PRIVATE if objects else 0),
        random.getstate() if kinds & PY else None,
        npr.get_state() if npr is not None else None,
        objects,
    )


def restore(states: HostStates) -> None:
    if states.py is not None:
        random.setstate(states.py)
    if states.numpy is not None:
        npr = _np_random()
        if npr is not None:
            npr.set_state(states.numpy)
    for o, state in states.private:
        _set_state(o, state)


def drawn(before: HostStates) -> int:
    """The bits of the global RNGs of ``before`` whose state has moved since."""
    kinds = 0
    if before.py is not None and random.getstate() != before.py:
        kinds |= PY
    npr = _np_random()
    if before.numpy is not None and npr is not None and not _same_numpy(before.numpy, npr.get_state()):
        kinds |= NUMPY
    return kinds


def only(states: HostStates, kinds: int, private: tuple[tuple[Any, Any], ...] = ()) -> HostStates | None:
    """The global states of ``states`` that ``kinds`` names, with the RNG objects' states
    ``private``."""
    kinds &= states.kinds & ALL
    if not kinds and not private:
        return None
    return HostStates(
        kinds | (PRIVATE if private else 0), states.py if kinds & PY else None,
        states.numpy if kinds & NUMPY else None, private,
    )


def _same_numpy(a: Any, b: Any) -> bool:
    # the legacy state: ('MT19937', keys (624 uint32), pos, has_gauss, cached_gaussian)
    return bool(a[0] == b[0] and tuple(a[2:]) == tuple(b[2:]) and (a[1] == b[1]).all())


# ------------------------------------------------------------------- RNG objects

#: By type: 1 a ``random.Random``, 2 a numpy ``Generator``, 3 a ``RandomState``, 4 a
#: bit generator, 0 none of them; weak: a forward may make a class per call.
_KINDS: weakref.WeakKeyDictionary[type, int] = weakref.WeakKeyDictionary()


def _kind(x: Any) -> int:
    t = type(x)
    k = _KINDS.get(t)
    if k is None:
        k = 0
        if issubclass(t, random.Random):
            k = 0 if issubclass(t, random.SystemRandom) else 1  # no state to restore
        else:
            npr = _np_random()
            if npr is not None:
                k = (
                    2 if issubclass(t, npr.Generator) else 3 if issubclass(t, npr.RandomState)
                    else 4 if issubclass(t, npr.BitGenerator) else 0
                )
        _KINDS[t] = k
    return k


def is_private(x: Any) -> bool:
    """Is ``x`` an RNG object of Python's or numpy's whose state can be set back?"""
    return _kind(x) != 0


def _state_of(o: Any) -> Any:
    k = _kind(o)
    if k == 1:
        return o.getstate()
    if k == 2:
        return o.bit_generator.state
    if k == 3:
        return o.get_state()
    return o.state


def _set_state(o: Any, state: Any) -> None:
    k = _kind(o)
    if k == 1:
        o.setstate(state)
    elif k == 2:
        o.bit_generator.state = state
    elif k == 3:
        o.set_state(state)
    else:
        o.state = state


#: One step from an object held as a module attribute to an RNG object: ("a", name) an
#: attribute of it, ("i", key) an item, ("s", None) a bound method's object, ("c", i) a
#: cell of a function's closure.
Step: TypeAlias = tuple[str, Any]
Slot: TypeAlias = tuple[nn.Module, str, tuple[Step, ...]]

#: A module's own attributes (parameter, buffer, submodule and hook tables): not looked in.
_MODULE_ATTRS = frozenset(vars(nn.Module()))
#: Attributes or items of one object looked at for RNG objects.
_LOOK = 64


def _steps(v: Any) -> list[tuple[Step, Any]]:
    """What one step from ``v`` reaches: its attributes (a plain object, a config), its
    items (a list, tuple or dict), a bound method's object, a closure's cells. Nothing
    where looking raises (an object whose ``__getattr__`` refuses)."""
    try:
        return _reach(v)
    except Exception:
        return []


def _reach(v: Any) -> list[tuple[Step, Any]]:
    if isinstance(v, (nn.Module, type, type(sys))) or _kind(v) or type(v).__module__ == "torch":
        return []
    if isinstance(v, (list, tuple)):
        return [(("i", i), o) for i, o in enumerate(v[:_LOOK])]
    if isinstance(v, dict):
        return [(("i", k), o) for k, o in list(v.items())[:_LOOK]]
    self = getattr(v, "__self__", None)
    if self is not None and callable(v):
        return [(("s", None), self)]
    cells = getattr(v, "__closure__", None)
    if cells:
        out = []
        for i, c in enumerate(cells[:_LOOK]):
            try:
                out.append((("c", i), c.cell_contents))
            except ValueError:  # a cell not filled yet
                continue
        return out
    try:
        attrs = vars(v)
    except TypeError:  # no __dict__ (slots, builtins)
        return []
    return [(("a", n), o) for n, o in list(attrs.items())[:_LOOK]]


def private_slots(modules: Iterable[nn.Module], is_rng: Callable[[Any], Any] = _kind) -> tuple[Slot, ...]:
    """Where the ``modules`` hold RNG objects (``is_rng``: Python's and numpy's by
    default; ``is_generator`` for torch's): as an attribute, or one step further (an
    attribute of a config object held there, an item of a list or dict, a bound method's
    object such as ``rng.normal``, a cell of a sampler function's closure)."""
    out: list[Slot] = []
    for m in modules:
        for n, v in vars(m).items():
            if is_rng(v):
                out.append((m, n, ()))
            elif n not in _MODULE_ATTRS and v is not None:
                out.extend((m, n, (step,)) for step, o in _steps(v) if is_rng(o))
    return tuple(out)


def is_generator(x: Any) -> bool:
    return isinstance(x, torch.Generator)


def at(slot: Slot) -> Any:
    """The object at ``slot`` now (None where the path no longer leads anywhere)."""
    m, n, path = slot
    o = vars(m).get(n)
    for kind, key in path:
        if o is None:
            return None
        try:
            if kind == "a":
                o = vars(o).get(key)
            elif kind == "i":
                o = o[key]
            elif kind == "s":
                o = getattr(o, "__self__", None)
            else:
                o = o.__closure__[key].cell_contents
        except (LookupError, TypeError, ValueError, AttributeError):
            return None
    return o


def private_objects(slots: Iterable[Slot], arguments: Iterable[Any]) -> list[Any]:
    """The RNG objects at ``slots`` now (one assigned anew there too) and among
    ``arguments``, each once."""
    seen: dict[int, Any] = {}
    for slot in slots:
        o = at(slot)
        if o is not None and _kind(o):
            seen.setdefault(id(o), o)
    for o in arguments:
        seen.setdefault(id(o), o)
    return list(seen.values())
