"""What a region call captures of its arguments so it can be replayed: the tensors as
detached aliases (NOTE [Replay inputs]), everything else as it is, the generators among
them, and the attribute bindings of the plain Python objects they reach (NOTE [Stateful
arguments]); and the arguments a replay runs with.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from offrecomp._torch_compat import TreeSpec, tree_flatten, tree_unflatten

__all__ = ["ARG_STATE_MAX_ITEMS", "ARG_STATE_PER_REGION", "ArgState", "CapturedInputs", "capture_inputs", "replay_arguments"]


# ---------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class _Slot:
    """Stands in for tensor argument ``i`` inside the captured argument structure."""

    i: int


@dataclass
class CapturedInputs:
    """A region call's arguments, tensors held apart (see NOTE [Replay inputs])."""

    leaves: list[Any]
    """``(args, kwargs)`` flattened, a ``_Slot`` in place of each tensor. The structure is
    rebuilt only with tensors in place: containers whose constructors check their
    contents (``PackedSequence``) would reject the slots."""
    spec: TreeSpec
    tensors: list[torch.Tensor | None]
    """Detached alias of every tensor argument in flatten order (None once offloaded)."""
    requires_grad: list[bool]
    versions: list[int]
    devices_seen: set[torch.device]
    objects: list[Any]
    """The plain Python objects among the arguments (NOTE [Stateful arguments])."""
    watches: dict[int, torch.Tensor] = field(default_factory=dict)
    """For an input sent to host memory (no longer held), a storage-free alias that shares
    its version counter: a later write to it still shows (``tc.version_watch``)."""
    copied: set[int] = field(default_factory=set)
    """Inputs the forward wrote: ``tensors`` holds a copy of their entry values (NOTE
    [State written by its region])."""
    generators: list[torch.Generator] = field(default_factory=list)
    """The generators among the arguments (NOTE [Private generators] in replay.py)."""

    def devices(self) -> set[torch.device]:
        return set(self.devices_seen)

    def plain_values(self) -> tuple[Any, ...]:
        """The arguments that are not tensors: numbers, strings and None as they are, any
        other object by its type (NOTE [Stale recordings] in regenerate.py)."""
        return tuple(
            x if x is None or isinstance(x, (int, float, bool, str)) else type(x)
            for x in self.leaves
            if not isinstance(x, _Slot)
        )

    def keep_copy(self, i: int) -> None:
        """Input ``i`` is about to be written by the forward: hold its values as they are."""
        t = self.tensors[i]
        if i in self.copied or t is None:
            return
        copy = t.clone(memory_format=torch.preserve_format)
        self.tensors[i] = copy
        self.versions[i] = int(copy._version)
        self.copied.add(i)


# NOTE [Replay inputs]
# The capture holds a detached alias of every tensor argument: it shares storage and
# version counter with the original but not its grad_fn, so holding it does not pin the
# previous layers' graph, and replay builds a throwaway graph rooted at fresh leaves. The
# alias records requires_grad so code that branches on it replays the same way. The
# version recorded here is compared before replay: an input modified in place after the
# region ran would replay wrong, so that is an error, never a silent difference. Inputs
# placed OFFLOAD are dropped from the capture once the region's forward returns and come
# back from host memory for the replay; each leaves a storage-free alias sharing its
# version counter (``watches``), so a write after the region is still an error.


def capture_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> CapturedInputs:
    tensors: list[torch.Tensor | None] = []
    flags: list[bool] = []
    versions: list[int] = []

    objects: list[Any] = []
    generators: list[torch.Generator] = []

    def grab(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            tensors.append(x.detach())
            flags.append(bool(x.requires_grad))
            versions.append(int(x._version))
            return _Slot(len(tensors) - 1)
        if isinstance(x, torch.Generator):
            generators.append(x)
        elif _stateful(x):
            objects.append(x)
        return x

    flat, spec = _flatten_arguments(args, kwargs)
    leaves = [grab(x) for x in flat]
    devices = {t.device for t in tensors if t is not None}
    return CapturedInputs(leaves, spec, tensors, flags, versions, devices, objects, generators=generators)


#: TreeSpecs of argument lists made of tensors alone, by (positional count, keywords):
#: pytree flattening costs tens of microseconds per region call, for a block's `(x,)`.
_TENSOR_SPECS: dict[tuple[int, tuple[str, ...]], TreeSpec] = {}


def _flatten_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], TreeSpec]:
    """``tree_flatten((args, kwargs))``, without pytree's walk when every argument is a
    plain tensor or parameter (a pytree leaf: the spec depends only on the count and the
    keywords). Subclasses take pytree's path: some register as pytree nodes."""
    flat = [*args, *kwargs.values()] if kwargs else list(args)
    if all(type(x) is torch.Tensor or type(x) is nn.Parameter for x in flat):
        key = (len(args), tuple(kwargs))
        spec = _TENSOR_SPECS.get(key)
        if spec is None:
            if len(_TENSOR_SPECS) > 256:
                _TENSOR_SPECS.clear()
            spec = _TENSOR_SPECS[key] = tree_flatten((args, kwargs))[1]
        return flat, spec
    return tree_flatten((args, kwargs))


# NOTE [Stateful arguments]
# A region may receive a plain Python object whose state its forward changes: the
# key/value cache a transformers decoder layer appends its keys to (training with
# `use_cache=True`), a counter, a memo. A replay that calls the forward again on the same
# object sees the state after the forward, not the one the forward saw: the cache
# appends the keys a second time, the replay computes attention over both copies, and
# the dispatch-mode replay finds another op sequence than the recorded one. The capture
# therefore records the attribute bindings of such objects (their `__dict__`, and the
# items of the lists, dicts and objects reachable from it, a few levels deep, by
# reference: no tensor is copied). The caller may change them too after the region
# returned (a memory carried to the next block, `state.mem = x`). So the replay puts the
# entry bindings back where the bindings it finds differ, runs, then restores the
# bindings it found. A tensor among the bindings written in place after the forward
# returned is an error at replay, as for a tensor argument (NOTE [Replay inputs]). The
# walk records at most ARG_STATE_MAX_ITEMS bindings
# plus ARG_STATE_PER_REGION per region of the model: a key/value cache passed to every
# block holds about 8 per block. A call whose state is larger than that is never
# replayed: it keeps (or offloads) what it saves, and when the state did change, its
# region does so from then on, with a warning.

ARG_STATE_MAX_ITEMS = 512
ARG_STATE_PER_REGION = 16
_ARG_STATE_DEPTH = 4
_ATOMIC = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size)


def _stateful(x: Any) -> bool:
    """A plain Python object whose attributes a forward could rebind."""
    return (
        hasattr(x, "__dict__")
        and not isinstance(x, (torch.Tensor, nn.Module, type, _ATOMIC))
        and not callable(x)
        and not isinstance(x, enum.Enum)
    )


@dataclass(eq=False)
class ArgState:
    """The bindings reachable from a region call's object arguments (NOTE [Stateful
    arguments]): per container, its kind and a shallow copy of its contents."""

    entries: list[tuple[Any, str, Any]]
    complete: bool
    limit: int = ARG_STATE_MAX_ITEMS
    versions: list[tuple[torch.Tensor, int, str]] = field(default_factory=list)
    """The tensors among the recorded bindings, with their versions when the forward
    returned and where they were found (``seal``)."""

    @staticmethod
    def capture(roots: list[Any], limit: int = ARG_STATE_MAX_ITEMS) -> ArgState:
        """At most ``limit`` bindings; ``complete`` False when there were more."""
        entries: list[tuple[Any, str, Any]] = []
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
            if isinstance(obj, list):
                kind, content, children = "list", list(obj), list(obj)
            elif isinstance(obj, dict):
                kind, content, children = "dict", dict(obj), list(obj.values())
            else:
                d = vars(obj)
                kind, content, children = "attrs", dict(d), list(d.values())
            count += len(content)
            if count > limit:
                complete = False
                break
            entries.append((obj, kind, content))
            if depth + 1 < _ARG_STATE_DEPTH:
                for c in children:
                    if isinstance(c, (list, dict)) or _stateful(c):
                        todo.append((c, depth + 1))
        return ArgState(entries, complete, limit)

    def same(self, other: ArgState) -> bool:
        """The same containers with the same contents, by identity."""
        if len(self.entries) != len(other.entries):
            return False
        for (a, ka, ca), (b, kb, cb) in zip(self.entries, other.entries):
            if a is not b or ka != kb or len(ca) != len(cb):
                return False
            if ka == "list":
                if any(x is not y for x, y in zip(ca, cb)):
                    return False
            elif ca.keys() != cb.keys() or any(ca[k] is not cb[k] for k in ca):
                return False
        return True

    def seal(self) -> None:
        """The forward returned: note the versions of the tensors among the bindings, which
        a replay reads as the forward did (``check``)."""
        out = []
        for obj, kind, content in self.entries:
            items = enumerate(content) if kind == "list" else content.items()
            for key, v in items:
                if isinstance(v, torch.Tensor):
                    name = type(obj).__name__
                    out.append((v, int(v._version), f"{name}.{key}" if kind == "attrs" else f"{name}[{key!r}]"))
        self.versions = out

    def check(self, region_name: str) -> None:
        """Raise if a tensor among the bindings was written in place since the forward
        returned: a replay reading it would differ from the forward (NOTE [Replay
        inputs])."""
        for t, v, where in self.versions:
            if int(t._version) != v:
                raise RuntimeError(
                    f"offrecomp: {where}, a tensor reached through an argument of region "
                    f"{region_name!r}, was modified in place after the region's forward "
                    f"(version {v} -> {int(t._version)}), so replaying it would produce wrong "
                    "activations. Hint: avoid in-place ops on state a block reads, or exclude "
                    "the block with regions=."
                )

    def restore(self) -> None:
        """Put every recorded binding back."""
        for obj, kind, content in self.entries:
            if kind == "list":
                obj[:] = content
            elif kind == "dict":
                obj.clear()
                obj.update(content)
            else:
                d = vars(obj)
                d.clear()
                d.update(content)


def replay_arguments(
    cap: CapturedInputs,
    region_name: str,
    tensors: list[torch.Tensor] | None = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Fresh leaves for one replay; raises if an input changed since the forward.

    ``tensors`` replaces the captured tensors (inputs that came back from host memory).
    """
    src = tensors if tensors is not None else cap.tensors
    for i, t in enumerate(cap.tensors):
        if t is None and i not in cap.copied:
            t = cap.watches.get(i)  # sent to host memory: its version watch
        if t is not None and int(t._version) != cap.versions[i]:
            raise RuntimeError(
                f"offrecomp: input {i} of region {region_name!r} was modified in place after "
                f"the region's forward began (version {cap.versions[i]} -> {int(t._version)}), "
                "so replaying it would produce wrong activations. Hint: avoid in-place ops "
                "on a block's inputs, or exclude the block with regions=."
            )

    def fresh(x: Any) -> Any:
        if isinstance(x, _Slot):
            t = src[x.i]
            if t is None:
                raise RuntimeError(f"offrecomp: input {x.i} of region {region_name!r} is gone")
            leaf = t.detach()
            if cap.requires_grad[x.i] and (leaf.is_floating_point() or leaf.is_complex()):
                leaf.requires_grad_(True)
            if x.i in cap.copied:
                # the forward writes it in place: a copy, not a leaf (autograd forbids
                # in-place writes to a leaf that requires grad), so the held copy stays
                # as it was for any later replay; backward runs with grad disabled
                with torch.enable_grad():
                    leaf = leaf.clone(memory_format=torch.preserve_format)
            return leaf
        return x

    args, kwargs = tree_unflatten([fresh(x) for x in cap.leaves], cap.spec)
    return tuple(args), kwargs
