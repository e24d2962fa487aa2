"""The state a region call's argument objects carry, which its forward may change: the
attribute bindings of the plain Python objects its arguments reach (NOTE [Stateful
arguments]), the buffer tables of modules among them (NOTE [Modules among the
arguments]), and the tensors there that the forward writes (NOTE [State written by the
forward]); a replay runs with them as they were at the call's entry.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import operator
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from offrecomp._torch_compat import version_of

__all__ = [
    "ARG_COPY_MAX_BYTES", "ARG_MODULES_MAX", "ARG_STATE_MAX_ITEMS", "ARG_STATE_PER_REGION", "ArgState", "Position",
    "holding", "stateful",
]


# NOTE [State written by the forward]
# A forward may write in place a tensor its argument objects hold: a Mamba-2 layer adds
# its tokens to its cache layer's counter, a block advances an offset it read. A replay
# runs that forward again: it would read the written value where the forward read the
# one before, and write it a second time. So, as for the region's buffers (NOTE [Replay
# and module state] in regions.py), the tensors the forward wrote hold their values of
# its entry while a replay runs, and the values found are put back afterwards (their
# versions move with the swap; a later write still shows). The values of entry come
# from a copy: at each call's entry, of the tensors at the positions (container and key
# in the capture) that the region's earlier calls wrote, up to ARG_COPY_MAX_BYTES each
# (counters and offsets; a larger one keeps the call's activations); on a region's
# first call, taken by its watch just before the write (NOTE [State written by its
# region] in call_state.py). A tensor written with no copy (state of another layout, a call
# the watch did not see) stops the call's replay with an error rather than a replay of
# other values; its position is copied at the region's later calls.

# NOTE [State written after the forward]
# The objects a region call's arguments hold are often shared by every call: a cache
# passed to each layer holds each layer's state, and the calls after this one write
# theirs in place (a Mamba-2 layer adds its tokens to its cache layer's counter, a 0-dim
# tensor). Such a write comes after this call's forward returned, yet this call's replay
# never reads that tensor. So a tensor among the bindings written since the forward
# returned stops a replay only if the replay reads it: the replay runs under the guard
# that watches parameters written since the forward (NOTE [Replay and parameters] in
# params.py), which raises at the first op that reads one. Compiled code runs unseen by
# the guard, so for a compiled region any such write is an error at the replay's start.

# NOTE [Stateful arguments]
# A region may receive a plain Python object whose state its forward changes: the
# key/value cache a transformers decoder layer appends its keys to (training with
# `use_cache=True`), a counter, a memo. A replay that calls the forward again on the same
# object sees the state after the forward, not the one the forward saw: the cache
# appends the keys a second time, the replay computes attention over both copies, and
# the dispatch-mode replay finds another op sequence than the recorded one. The capture
# therefore records the attribute bindings of such objects (their `__dict__` and slots,
# and the items of the lists, dicts, tuples and objects reachable from them, a few
# levels deep, by reference: no tensor is copied; a tuple binds nothing new, but what it
# holds may change). The caller may change them too after the region
# returned (a memory carried to the next block, `state.mem = x`). So the replay puts the
# entry bindings back where the bindings it finds differ, runs, then restores the
# bindings it found. A tensor among the bindings written in place after the forward
# returned is an error at replay, as for a tensor argument (NOTE [Replay inputs]). The
# walk records at most ARG_STATE_MAX_ITEMS bindings
# plus ARG_STATE_PER_REGION per region of the model: a key/value cache passed to every
# block holds about 8 per block. A call whose state is larger than that is never
# replayed: it keeps (or offloads) what it saves, and when the state did change, its
# region does so from then on, with a warning.

# NOTE [Modules among the arguments]
# A region may be handed a module to call: x-transformers passes each attention layer
# the model's ALiBi bias module, which computes its bias at its first call and keeps it
# in a buffer it rebinds (register_buffer), so later calls slice the kept bias. The
# first layer's first forward builds the bias; a replay of that call would find it
# built and run other ops than its forward did. So the capture records, for a module
# among the arguments, the buffer tables of it and its submodules (their bindings, by
# reference), and a replay puts them back as at entry, as for any other argument
# object. Their tensors' values are left to the first-call watch of writes to tensors
# the region does not own (NOTE [State written by its region] in call_state.py). A call
# whose forward rebinds such a buffer built state on first use: a serving replay that
# follows its recording would diverge in the later steps, which find the state built,
# so such a recording is measured again at the first divergence (NOTE [Stale
# recordings] in regenerate.py). A module argument of more than ARG_MODULES_MAX modules
# (a whole model handed to each block) is passed over: walking it at every call would
# cost more than such state is worth, and its buffers would count against the bindings
# a call may record, beyond which its activations are kept.

#: Modules (a module argument and its submodules) beyond which its buffers are not recorded.
ARG_MODULES_MAX = 64
ARG_STATE_MAX_ITEMS = 512
ARG_STATE_PER_REGION = 16
_ARG_STATE_DEPTH = 4
#: Tensors among the bindings up to this size are copied at entry where the region's
#: forward wrote them before (NOTE [State written by the forward]); a larger one keeps
#: the call's activations.
ARG_COPY_MAX_BYTES = 64 << 10

Position = tuple[int, Any]
"""Where a binding is in a capture: its container's index among the entries, and its key
or index there (the same for each call of a region over state of the same layout)."""


@contextlib.contextmanager
def holding(pairs: list[tuple[Any, Any]]) -> Iterator[None]:
    """Each target of ``pairs`` (a tensor or a storage) holds the value paired with it
    while the block runs, and its own again afterwards (a replay's view of state its
    forward saw)."""
    if not pairs:
        yield
        return
    with torch.no_grad():
        found = [t.clone() for t, _ in pairs]
        for t, value in pairs:
            t.copy_(value)
    try:
        yield
    finally:
        with torch.no_grad():
            for (t, _), now in zip(pairs, found):
                t.copy_(now)


_ATOMIC = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size)
_PLAIN = frozenset(_ATOMIC)  # exact types a capture passes over at once


def stateful(x: Any) -> bool:
    """A plain Python object whose attributes a forward could rebind (in its ``__dict__``,
    or its slots: a ``@dataclass(slots=True)``; a tuple subclass with either too)."""
    return (
        (hasattr(x, "__dict__") or bool(_slot_names(type(x))))
        and not isinstance(x, (torch.Tensor, nn.Module, type, _ATOMIC))
        and not callable(x)
        and not isinstance(x, enum.Enum)
    )


_SLOT_NAMES: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()  # classes made at run time go


def _slot_names(cls: type) -> tuple[str, ...]:
    """The attribute names the slots of ``cls`` and its bases hold (mangled where
    private) and that still name a slot on ``cls`` (not a subclass's property of the
    same name), once per class."""
    names = _SLOT_NAMES.get(cls)
    if names is None:
        found: list[str] = []
        for k in cls.__mro__:
            slots = k.__dict__.get("__slots__", ())
            for n in (slots,) if isinstance(slots, str) else slots:
                if n in ("__dict__", "__weakref__"):
                    continue
                if n.startswith("__") and not n.endswith("__"):
                    n = f"_{k.__name__.lstrip('_')}{n}"
                owner = next((c.__dict__[n] for c in cls.__mro__ if n in c.__dict__), None)
                if isinstance(owner, types.MemberDescriptorType):
                    found.append(n)
        names = _SLOT_NAMES[cls] = tuple(dict.fromkeys(found))
    return names


def _attrs(obj: Any) -> dict[str, Any]:
    """What ``obj`` binds by name: its ``__dict__`` and its set slots."""
    slots = _slot_names(type(obj))
    d = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    for n in slots:
        try:
            d[n] = object.__getattribute__(obj, n)
        except AttributeError:  # a slot never set
            continue
    return d


# NOTE [Capture reuse]
# A key/value cache handed to every layer is walked at each layer call's entry and exit:
# a model of L layers walks O(L) containers per call, a quarter of a millisecond at 48
# layers on a 2.5 GHz host. Between two captures almost every container is as it was (a
# layer rebinds its own cache entry), so a capture follows an earlier one of the same
# objects (the previous call's entry, for an entry; the call's entry, for its exit):
# where every container it recorded still holds the same containers below it, in the
# same order, the walk would meet the same containers in the same order, so each
# container is only compared with its recording, by identity at C speed, and read again
# where its bindings changed; recordings are shared, never written. Anything else (other
# containers below one, a module among the arguments) walks again. A replay walks
# nothing: it copies the current bindings of the containers its call recorded, to put
# back afterwards (``ArgState.at_entry``).


@dataclass(frozen=True, eq=False)
class _Walk:
    """What a capture's walk found in one container."""

    deeper: bool
    """The containers below it were walked (it lies above the depth limit)."""
    tensors: tuple[Any, ...]
    """The keys (indices, for a list) of its tensors."""
    children: tuple[Any, ...]
    """The containers below it, in the order the walk took them."""


_NOT_WALKED = _Walk(False, (), ())  # a module's buffer table


def _unchanged(obj: Any, kind: str, content: Any) -> bool:
    """``obj`` binds the same objects, in the same order, as ``content`` recorded."""
    if kind == "list":
        return len(obj) == len(content) and all(map(operator.is_, obj, content))
    if kind == "tuple":
        return True  # binds what it bound when made; what it holds is recorded below it
    d = (_attrs(obj) if _slot_names(type(obj)) else vars(obj)) if kind == "attrs" else obj
    return (
        len(d) == len(content) and all(map(operator.is_, d, content))
        and all(map(operator.is_, d.values(), content.values()))
    )


def _bindings(obj: Any, kind: str) -> Any:
    """A shallow copy of what container ``obj`` binds."""
    if kind == "tuple":
        return obj
    return list(obj) if kind == "list" else _attrs(obj) if kind == "attrs" else dict(obj)


@dataclass(eq=False)
class ArgState:
    """The bindings reachable from a region call's object arguments (NOTE [Stateful
    arguments]): per container, its kind and a shallow copy of its contents."""

    entries: list[tuple[Any, str, Any]]
    complete: bool
    limit: int = ARG_STATE_MAX_ITEMS
    versions: list[tuple[torch.Tensor, int, Position]] = field(default_factory=list)
    """The tensors among the recorded bindings, with their versions when the forward
    returned and their positions (``seal``; ``_where`` names one for a message)."""
    tensors: list[tuple[torch.Tensor, int, Position]] = field(default_factory=list)
    """The tensors among the bindings at entry, with their versions then and their
    positions (NOTE [State written by the forward])."""
    copies: dict[int, torch.Tensor] = field(default_factory=dict)
    """Entry values of tensors (by index in ``tensors``) the forward may write: taken at
    entry for the positions its region's calls wrote before, or by the first call's
    watch just before the write."""
    swapped: list[int] = field(default_factory=list)
    """Tensors the forward wrote that a replay runs on their entry values (``seal``)."""
    unseen: list[str] = field(default_factory=list)
    """Tensors the forward wrote with no entry value kept: no replay can run (``seal``)."""
    uncopied: bool = False
    """A tensor at a position the region's forward wrote before is larger than
    ARG_COPY_MAX_BYTES: not copied, so the call keeps its activations."""
    rebound: bool = False
    """The forward rebound a buffer of a module among the arguments (``seal``): state
    built on first use (NOTE [Modules among the arguments])."""
    roots: tuple[Any, ...] = ()
    """The objects the walk started from."""
    walks: list[_Walk] = field(default_factory=list)
    """Per entry, what the walk found in it (NOTE [Capture reuse])."""

    @staticmethod
    def capture(
        roots: list[Any], limit: int = ARG_STATE_MAX_ITEMS, written: frozenset[Position] = frozenset(),
        prev: ArgState | None = None,
    ) -> ArgState:
        """At most ``limit`` bindings; ``complete`` False when there were more. The
        tensors at ``written`` positions are copied as they are now (NOTE [State written
        by the forward]). ``prev``: an earlier capture of the same objects, whose walk
        this one follows where it can (NOTE [Capture reuse])."""
        state = (_follow(prev, roots, limit) if prev is not None else None) or _walk(roots, limit)
        if written:
            for i, (t, _, position) in enumerate(state.tensors):
                if position in written:
                    if t.nbytes <= ARG_COPY_MAX_BYTES:
                        state.keep_copy(i)
                    else:
                        state.uncopied = True
        return state

    def keep_copy(self, i: int) -> None:
        """Tensor ``i`` may be written by the forward: hold its value as it is (once)."""
        if i not in self.copies:
            with torch.no_grad():
                self.copies[i] = self.tensors[i][0].clone(memory_format=torch.preserve_format)

    def same(self, other: ArgState) -> bool:
        """The same containers with the same contents, by identity."""
        if len(self.entries) != len(other.entries):
            return False
        # _same_bindings inline for tables: this runs at every call's exit and replay (a
        # key/value cache's hundreds of containers), where a call per container costs more
        for (a, ka, ca), (b, kb, cb) in zip(self.entries, other.entries):
            if ca is cb and a is b:
                continue  # one recording shared (NOTE [Capture reuse])
            if a is not b or ka != kb or len(ca) != len(cb):
                return False
            if ka == "list":
                if any(x is not y for x, y in zip(ca, cb)):
                    return False
            elif ca.keys() != cb.keys() or any(ca[k] is not cb[k] for k in ca):
                return False
        return True

    def seal(self, now: ArgState | None = None) -> set[Position]:
        """The forward returned: note the versions of the tensors among the bindings, which
        a replay reads as the forward did (``check``), and those the forward wrote
        (``swapped``, or ``unseen`` where no entry value was kept); returns the positions
        it wrote (NOTE [State written by the forward]). ``now``: the bindings as the
        forward left them, where they differ from these."""
        if now is not None:
            later = {id(obj): content for obj, kind, content in now.entries if kind == "buffers"}
            self.rebound = any(
                kind == "buffers" and id(obj) in later and not _same_bindings(content, later[id(obj)])
                for obj, kind, content in self.entries
            )
        self.versions = [(t, version_of(t), position) for t, _, position in self.tensors]
        written: set[Position] = set()
        for i, (t, v, position) in enumerate(self.tensors):
            if version_of(t) != v:
                written.add(position)
                if i in self.copies:
                    self.swapped.append(i)
                else:
                    self.unseen.append(self._where(position))
        for i in [i for i in self.copies if i not in self.swapped]:
            del self.copies[i]  # not written: its value is the forward's
        return written

    def _where(self, position: Position) -> str:
        """The binding at ``position``, as a message names it."""
        obj, kind, _ = self.entries[position[0]]
        key = position[1]
        return f"{type(obj).__name__}.{key}" if kind == "attrs" else f"{type(obj).__name__}[{key!r}]"

    @contextlib.contextmanager
    def as_entry(self, region_name: str, bound: frozenset[int] = frozenset()) -> Iterator[None]:
        """The tensors the forward wrote hold their entry values while a replay runs, and
        the values found afterwards (NOTE [State written by the forward]); not those
        (``bound``: indices in ``tensors``) the replay reads through a tensor argument
        of its own instead (NOTE [Aliased arguments] in arguments.py)."""
        if self.unseen:
            raise RuntimeError(
                f"offrecomp: {', '.join(self.unseen[:3])}, reached through an argument of "
                f"region {region_name!r}, was written in place by the region's forward where no "
                "copy of its value before the write was kept, so a replay would read the "
                "written value. Hint: exclude the block with regions=, or keep such state out "
                "of its arguments (for a transformers model in training: use_cache=False)."
            )
        held = [i for i in self.swapped if i not in bound] if bound else self.swapped
        if not held:
            yield
            return
        try:
            with holding([(self.tensors[i][0], self.copies[i]) for i in held]):
                yield
        finally:
            swapped = {id(self.tensors[i][0]) for i in held}
            # the swap wrote them: their versions now are the ones after the forward
            self.versions = [(t, version_of(t) if id(t) in swapped else v, w) for t, v, w in self.versions]

    def check(self, region_name: str) -> None:
        """Raise if a tensor among the bindings was written in place since the forward
        returned: a replay reading it would differ from the forward (NOTE [Replay
        inputs]). For a replay no guard watches (compiled code): ``modified`` otherwise."""
        for t, v, position in self.versions:
            if version_of(t) != v:
                raise RuntimeError(
                    f"offrecomp: {self._where(position)}, a tensor reached through an argument of region "
                    f"{region_name!r}, was modified in place after the region's forward "
                    f"(version {v} -> {version_of(t)}), so replaying it would produce wrong "
                    "activations. Hint: avoid in-place ops on state a block reads, or exclude "
                    "the block with regions=."
                )

    def modified(self) -> dict[int, str]:
        """Storages (data pointer -> description) of the tensors among the bindings written
        in place since the forward returned: a replay that reads one stops (NOTE [State
        written after the forward]); one that does not read it replays as the forward ran."""
        out: dict[int, str] = {}
        swapped = {id(self.tensors[i][0]) for i in self.swapped}  # a replay reads their entry values
        for t, v, position in self.versions:
            if version_of(t) != v and t.layout == torch.strided and id(t) not in swapped:
                out[int(t.untyped_storage().data_ptr())] = (
                    f"{self._where(position)} (a tensor reached through an argument, version {v} -> {version_of(t)})"
                )
        return out

    @contextlib.contextmanager
    def at_entry(self) -> Iterator[None]:
        """Every recorded container binds what it bound at entry while the block runs,
        and what it binds now afterwards (a replay's view of the state its forward saw:
        NOTE [Stateful arguments])."""
        entries = self.entries
        if all(_unchanged(obj, kind, content) for obj, kind, content in entries):
            yield
            return
        found = [_bindings(obj, kind) for obj, kind, _ in entries]
        _rebind(entries)
        try:
            yield
        finally:
            _rebind([(obj, kind, now) for (obj, kind, _), now in zip(entries, found)])

    @contextlib.contextmanager
    def bound(self, pairs: list[tuple[Position, Any]]) -> Iterator[None]:
        """Each position of ``pairs`` binds the value paired with it while the block runs,
        and what it bound before afterwards; a tuple, which binds nothing new, is bound
        anew with those items where its container binds it (NOTE [Aliased arguments] in
        arguments.py)."""
        done: list[tuple[Any, str, Any, Any]] = []
        items: dict[int, list[Any]] = {}  # entry index -> the items of a tuple to build anew
        made: dict[int, Any] = {}  # entry index -> the tuple last built for it
        pending: set[int] = set()
        try:
            for (at, key), value in pairs:
                obj, kind, _ = self.entries[at]
                if kind == "tuple":
                    items.setdefault(at, list(obj))[key] = value
                    pending.add(at)
                    continue
                done.append((obj, kind, key, _bound_at(obj, kind, key)))
                _bind_at(obj, kind, key, value)
            while pending:
                # deepest first, as the walk usually records a container before what it
                # holds; a tuple reached again (one more container of it, recorded
                # later) is built again with every item it takes, and bound again
                at = max(pending)
                pending.discard(at)
                old = self.entries[at][0]
                new = _tuple_like(old, items[at])
                if new is None:
                    continue
                was = made.get(at, old)
                made[at] = new
                for up, (obj, kind, content) in enumerate(self.entries):
                    if up == at:
                        continue
                    for key in _keys_of(kind, content, old):  # every container of it, wherever recorded
                        if kind == "tuple":
                            items.setdefault(up, list(obj))[key] = new
                            pending.add(up)
                        elif _bound_at(obj, kind, key) is was:
                            done.append((obj, kind, key, was))
                            _bind_at(obj, kind, key, new)
            yield
        finally:
            for obj, kind, key, before in reversed(done):
                _bind_at(obj, kind, key, before)


def _tuple_like(t: tuple[Any, ...], items: list[Any]) -> tuple[Any, ...] | None:
    """A tuple of ``t``'s type holding ``items``: a plain tuple or a named one; None for
    another subclass, whose constructor may take other arguments."""
    if type(t) is tuple:
        return tuple(items)
    make = getattr(type(t), "_make", None)
    return make(items) if make is not None and not stateful(t) else None


def _keys_of(kind: str, content: Any, obj: Any) -> list[Any]:
    """The keys (indices) at which a recorded ``content`` binds ``obj``."""
    if kind == "buffers":
        return []
    items = enumerate(content) if kind in ("list", "tuple") else content.items()
    return [k for k, v in items if v is obj]


def _bound_at(obj: Any, kind: str, key: Any) -> Any:
    """What container ``obj`` binds at ``key``."""
    if kind == "attrs":
        return object.__getattribute__(obj, key) if key in _slot_names(type(obj)) else vars(obj)[key]
    return obj[key]


def _bind_at(obj: Any, kind: str, key: Any, value: Any) -> None:
    """Container ``obj`` binds ``value`` at ``key``, past any ``__setattr__``."""
    if kind != "attrs":
        obj[key] = value
    elif key in _slot_names(type(obj)):
        object.__setattr__(obj, key, value)
    else:
        vars(obj)[key] = value


def _rebind(entries: list[tuple[Any, str, Any]]) -> None:
    """Each container binds what its entry records."""
    for obj, kind, content in entries:
        if kind == "list":
            obj[:] = content
        elif kind == "attrs":
            _rebind_attrs(obj, content)
        elif kind != "tuple":  # a dict, or a module's buffer table
            obj.clear()
            obj.update(content)


def _rebind_attrs(obj: Any, content: dict[str, Any]) -> None:
    """``obj`` binds ``content`` by name: in its ``__dict__``, and in its slots past any
    ``__setattr__`` (a frozen dataclass's)."""
    slots = _slot_names(type(obj))
    if hasattr(obj, "__dict__"):
        d = vars(obj)
        d.clear()
        d.update({k: v for k, v in content.items() if k not in slots} if slots else content)
    for n in slots:
        if n in content:
            object.__setattr__(obj, n, content[n])
        else:
            with contextlib.suppress(AttributeError):
                object.__delattr__(obj, n)


def _walk(roots: list[Any], limit: int) -> ArgState:
    """``ArgState.capture``'s walk: at most ``limit`` bindings reached from ``roots``."""
    entries: list[tuple[Any, str, Any]] = []
    walks: list[_Walk] = []
    tensors: list[tuple[torch.Tensor, int, Position]] = []
    seen: set[int] = set()
    count = 0
    complete = True
    todo: list[tuple[Any, int]] = [(r, 0) for r in roots]
    while todo:
        obj, depth = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        content: Any
        if isinstance(obj, nn.Module):  # NOTE [Modules among the arguments]
            modules = list(itertools.islice(obj.modules(), ARG_MODULES_MAX + 1))
            if len(modules) > ARG_MODULES_MAX:
                continue  # a whole model handed to a block: passed over
            for m in modules:
                if m is not obj and id(m) in seen:
                    continue
                seen.add(id(m))
                count += len(m._buffers)
                if count > limit:
                    complete = False
                    break
                entries.append((m._buffers, "buffers", dict(m._buffers)))
                walks.append(_NOT_WALKED)
            if not complete:
                break
            continue
        parts: list[tuple[str, Any]]
        if isinstance(obj, list):
            parts = [("list", list(obj))]
        elif isinstance(obj, dict):
            parts = [("dict", dict(obj))]
        elif isinstance(obj, tuple):  # nothing to rebind, but what it holds may change
            parts = [("tuple", obj)]
            if stateful(obj):  # a tuple subclass with attributes of its own
                parts.append(("attrs", _attrs(obj)))
        else:
            parts = [("attrs", _attrs(obj))]
        for kind, content in parts:
            count += len(content)
            if count > limit:
                complete = False
                break
            at = len(entries)
            entries.append((obj, kind, content))
            walk = _look_in(kind, content, depth + 1 < _ARG_STATE_DEPTH)
            walks.append(walk)
            tensors.extend((content[key], version_of(content[key]), (at, key)) for key in walk.tensors)
            todo.extend((c, depth + 1) for c in walk.children)
        if not complete:
            break
    return ArgState(entries, complete, limit, tensors=tensors, roots=tuple(roots), walks=walks)


def _look_in(kind: str, content: Any, deeper: bool) -> _Walk:
    """The tensors of a container's recorded ``content``, and the containers below it
    where ``deeper``."""
    keys: list[Any] = []
    children: list[Any] = []
    for key, v in enumerate(content) if kind in ("list", "tuple") else content.items():
        if type(v) in _PLAIN:
            continue
        if isinstance(v, torch.Tensor):
            keys.append(key)
        elif deeper and (
            isinstance(v, (list, dict)) or (isinstance(v, tuple) and not _plain_tuple(v)) or stateful(v)
        ):
            children.append(v)
    return _Walk(deeper, tuple(keys), tuple(children))


def _plain_tuple(t: tuple[Any, ...]) -> bool:
    """A tuple of plain values (a kernel size, a shape): nothing below it to record."""
    return all(type(v) in _PLAIN for v in t)


def _follow(prev: ArgState, roots: list[Any], limit: int) -> ArgState | None:
    """``_walk(roots, limit)`` taken from ``prev``, a complete capture of the same roots,
    where every container it recorded holds the same containers below it, in the same
    order, as then: only those whose bindings changed are read again (NOTE [Capture
    reuse]). None otherwise."""
    if (
        not prev.complete or len(roots) != len(prev.roots) or not all(map(operator.is_, roots, prev.roots))
        or any(w is _NOT_WALKED for w in prev.walks)
    ):
        return None
    entries = prev.entries
    walks = prev.walks
    count = 0
    for j, (obj, kind, content) in enumerate(prev.entries):
        if not _unchanged(obj, kind, content):
            walk = walks[j]
            content = _bindings(obj, kind)
            now = _look_in(kind, content, walk.deeper)
            if len(now.children) != len(walk.children) or not all(map(operator.is_, now.children, walk.children)):
                return None  # other containers below it: walk again
            if entries is prev.entries:
                entries, walks = list(entries), list(walks)
            entries[j] = (obj, kind, content)
            walks[j] = now
        count += len(content)
    if count > limit:
        return None
    tensors = [
        (content[key], version_of(content[key]), (at, key))
        for at, ((_, _, content), walk) in enumerate(zip(entries, walks))
        for key in walk.tensors
    ]
    return ArgState(entries, True, limit, tensors=tensors, roots=prev.roots, walks=walks)


def _same_bindings(a: dict[Any, Any], b: dict[Any, Any]) -> bool:
    """Two recorded tables bind the same names to the same objects."""
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
