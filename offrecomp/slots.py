"""The runtime's wrapper in a module's ``forward`` (or compiled-call) slot, and the
wrappers kept from one entry to the next. ``install`` puts them in and takes them out.

NOTE [Copies of a managed model]
While the runtime is entered, a region's (and the root's) forward slot holds the
runtime's wrapper. A copy of the module made meanwhile (copy.deepcopy(model) for an EMA
or a teacher) would copy that slot too, and a plain function is shared by deepcopy: the
copy would run the original module's forward with the original weights, silently, also
after the runtime exited, and torch.save(model) would fail on it. The slot holds an
Installed instead: it calls the wrapper, and a deep copy or a pickle of it is what the
slot held before (the module's own forward, bound to the copy), so the copy is a plain
module the runtime does not manage. inspect.signature still sees the forward's signature
through __wrapped__, and the code of what it wraps reads through it (``torch.export``
reads ``forward.__code__``); not ``__func__``/``__self__``, whose holders (accelerate's
``prepare``) would rebuild the forward from the class's function, around the wrapper.
A shallow copy (``copy.copy``, ``nn.DataParallel``'s replicas) shares the slot's
wrapper, which runs the original module: the wrapper is called without the module it was
reached through. ``nn.DataParallel`` over several devices in the model is refused.

NOTE [Wrappers kept across entries]
torch.compile(model) traces through each region's ``forward`` slot and guards on the
object there: a new wrapper at each entry (a loop that enters the runtime per step, each
fit() or train() of a trainer) would invalidate the compiled graph each time, and past
dynamo's recompile limit the model would run eagerly, with other numerics. So an entry puts back the
wrapper an earlier entry made for the same region or root where the module, the slot's
value before it (an instance ``forward``, a compiled call), the class's attribute of
that name and whether the model holds compiled code are all as they were. An entry
forgets the wrappers it did not put back (those of a module replaced since, which they
would keep alive).

NOTE [Wrappers and the installer]
The installer keeps the wrappers it made from one entry to the next, and a wrapper calls
back into the installer; its native-keep part and the diagnostics call back for the hook
pair. Held strongly both ways, these would be reference cycles through the model's
modules (a wrapper names its module, the installer the model): a runtime and its model
dropped together would wait for the collector, and never be freed where it does not run
(``gc.disable()``, objects kept by ``gc.freeze()``). So what the installer holds reaches it
through a weak reference (``weak_call``), and a region's wrapper its region too (the
region's attribute tables hold the wrapper, from the module's ``forward`` slot). The
runtime holds the installer while it lives, and an entered runtime is held as the active
one: a wrapper finds its installer gone only once the runtime is, when the installer
would have been inactive, and runs the forward plainly, as an inactive one's does. A call
holds the installer from its start to its end.

NOTE [Class forwards patched while entered]
A wrapper made around a module's class ``forward`` (no instance ``forward`` then) holds
that function bound. Code patching the class while the runtime is entered (``Block.forward
= new``, a library's monkeypatch between steps) would leave the wrapper calling the old
function: plain runs the new one from the next call, so losses and gradients would
differ, silently. Such a wrapper reads the class's ``forward`` at each call (one lookup)
and calls whatever it holds then (``following_class``); a region call keeps the function
it ran for its replays. An instance ``forward`` set while entered is NOTE [Forwards
replaced while entered] in forward_patches.py.
"""

from __future__ import annotations

import copy
import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any, TypeGuard

from torch import nn

__all__ = ["Installed", "KeptWrappers", "following_class", "own_forward", "slot_as_before", "unwrap", "weak_call"]


_READ_THROUGH = frozenset({"__code__"})


class Installed:
    """The runtime's wrapper in a module's ``forward`` (or ``_compiled_call_impl``) slot
    (NOTE [Copies of a managed model])."""

    def __init__(self, fn: Callable[..., Any], module: nn.Module, attr: str, previous: Any) -> None:
        functools.update_wrapper(self, fn)  # __wrapped__, __name__, __doc__: introspection
        self.fn = fn
        self.module = module
        self.attr = attr
        self.previous = previous  # the slot's instance value before, None for the class's

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in _READ_THROUGH:  # NOTE [Copies of a managed model]
            return getattr(inspect.unwrap(self.__dict__["__wrapped__"]), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        copy_of = memo.get(id(self.module))
        if copy_of is None:
            return self  # copied on its own, not as part of its module
        return slot_as_before(copy_of, self.attr, copy.deepcopy(self.previous, memo))

    def __reduce__(self) -> tuple[Any, ...]:
        return (slot_as_before, (self.module, self.attr, self.previous))


def following_class(original: Callable[..., Any]) -> Callable[[], Callable[..., Any]] | None:
    """For ``original``, a module's class ``forward`` bound to it: what returns, at each
    call, the class's ``forward`` then, bound (``original`` while unchanged); None for
    any other callable (NOTE [Class forwards patched while entered])."""
    module = getattr(original, "__self__", None)
    func = getattr(original, "__func__", None)
    if not isinstance(module, nn.Module) or func is None or getattr(type(module), "forward", None) is not func:
        return None

    def now() -> Callable[..., Any]:
        cls = type(module)
        current: Any = getattr(cls, "forward", func)
        if current is func:
            return original
        raw = inspect.getattr_static(cls, "forward", current)  # a staticmethod, a partial, a callable object
        get = getattr(type(raw), "__get__", None)
        return get(raw, module, cls) if get is not None else raw  # type: ignore[no-any-return]

    return now


def own_forward(slot: Any, module: nn.Module) -> TypeGuard[Installed]:
    """``slot`` is a wrapper the runtime put in ``module``'s ``forward`` slot."""
    return type(slot) is Installed and slot.module is module and slot.attr == "forward"


def slot_as_before(module: nn.Module, attr: str, previous: Any) -> Any:
    """What a copy's slot holds: the value before the runtime, or the class's method
    bound to the copy (NOTE [Copies of a managed model])."""
    if previous is not None:
        return previous
    return getattr(type(module), attr).__get__(module)


def unwrap(module: nn.Module, attr: str) -> bool:
    """Put back what a slot held before the runtime's wrapper (False: it held none); the
    wrapper's restore, at exit, then finds nothing to undo."""
    wrapped = module.__dict__.get(attr)
    if not isinstance(wrapped, Installed):
        return False
    if wrapped.previous is None:
        del module.__dict__[attr]
    else:
        setattr(module, attr, wrapped.previous)
    return True


class KeptWrappers:
    """The wrapper each entry put in a slot, per (module, slot), with what it was made for
    (NOTE [Wrappers kept across entries])."""

    def __init__(self) -> None:
        # (owner, slot value before, compiled model, class attribute, wrapper)
        self._kept: dict[tuple[int, str], tuple[Any, Any, bool, Any, Installed]] = {}
        self._used: set[tuple[int, str]] = set()  # the entries this entry put back or made

    def wrapper(
        self, module: nn.Module, slot: str, owner: Any, previous: Any, compiled: bool,
        make: Callable[[], Installed],
    ) -> Installed:
        """The wrapper an earlier entry made for ``owner`` (a region, a root) in ``module``'s
        ``slot``, where nothing it was made for changed; else ``make()``'s, kept for the
        next entry (None ``owner``: made, never kept)."""
        if owner is None:
            return make()
        key = (id(module), slot)
        cls_attr = getattr(type(module), slot, None)
        kept = self._kept.get(key)
        if kept is not None:
            was_owner, was_previous, was_compiled, was_cls_attr, wrapped = kept
            if (
                wrapped.module is module and was_owner == owner and was_previous is previous
                and was_compiled == compiled and was_cls_attr is cls_attr
            ):
                self._used.add(key)
                return wrapped
        wrapped = make()
        self._kept[key] = (owner, previous, compiled, cls_attr, wrapped)
        self._used.add(key)
        return wrapped

    def settle(self) -> None:
        """The entry put its wrappers in: forget those it did not use (a module replaced
        since, which they would keep alive)."""
        for key in [k for k in self._kept if k not in self._used]:
            del self._kept[key]
        self._used = set()


def weak_call(obj: Any, name: str) -> Callable[[], Any]:
    """What calls ``obj``'s method ``name`` through a weak reference to ``obj``: None once
    ``obj`` is gone (NOTE [Wrappers and the installer])."""
    return functools.partial(_call_weakly, weakref.ref(obj), name)


def _call_weakly(ref: weakref.ref[Any], name: str) -> Any:
    obj = ref()
    return None if obj is None else getattr(obj, name)()
