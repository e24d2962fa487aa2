"""What a region call captures of its arguments so it can be replayed: the tensors as
detached aliases (NOTE [Replay inputs]), everything else as it is, the generators among
them, and the objects whose state arg_state.py records (NOTE [Stateful arguments]); and
the arguments a replay runs with.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from offrecomp._torch_compat import TreeSpec, tree_flatten, tree_unflatten, version_of
from offrecomp.arg_state import stateful
from offrecomp.host_rng import is_private

__all__ = ["CapturedInputs", "capture_inputs", "replay_arguments"]


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
    not_leaves: set[int] = field(default_factory=set)
    """Inputs that require grad and were no leaves in the forward (or were views): a
    replay hands each strided float32 one to the forward as a view of its fresh leaf
    (NOTE [Replay inputs])."""
    copied: set[int] = field(default_factory=set)
    """Inputs the forward wrote: ``tensors`` holds a copy of their entry values (NOTE
    [State written by its region])."""
    generators: list[torch.Generator] = field(default_factory=list)
    """The generators among the arguments (NOTE [Private generators] in replay.py)."""
    host_rngs: list[Any] = field(default_factory=list)
    """Python's and numpy's RNG objects among the arguments (NOTE [Host random states])."""
    parametrize_cache: dict[Any, Any] | None = None
    """The parametrization cache the call entered with, where ``parametrize.cached()`` was
    on (NOTE [Cached parametrizations] in _torch_compat.py): what it read besides them."""

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
        self.versions[i] = version_of(copy)
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
# A strided float32 input that requires grad and was no leaf in the forward (a previous
# block's output), or was a view, reaches the replayed forward as a view of its fresh
# leaf, made before the replay enters any mode (none sees the op): autocast caches its
# casts of a float32 leaf that requires grad and is no view, and casts any other tensor
# at each use (NOTE [Autocast cache] in trace/ops.py), so the replay casts its inputs
# as often as the forward did. The view shares the leaf's storage and data pointer: its
# saves are booked as the input's.


def capture_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> CapturedInputs:
    tensors: list[torch.Tensor | None] = []
    flags: list[bool] = []
    versions: list[int] = []
    not_leaves: set[int] = set()

    objects: list[Any] = []
    generators: list[torch.Generator] = []
    host_rngs: list[Any] = []

    def grab(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            i = len(tensors)
            alias = x.detach()
            tensors.append(alias)
            grad = bool(x.requires_grad)
            flags.append(grad)
            versions.append(version_of(alias))  # the alias's, as a replay reads it (NOTE [Inference tensors])
            if grad and (not x.is_leaf or x._is_view()):
                not_leaves.add(i)
            return _Slot(i)
        if type(x) in _PLAIN_LEAVES:  # a mask of None, a flag: no state (isinstance on a Generator is slow)
            return x
        if isinstance(x, torch.Generator):
            generators.append(x)
        elif is_private(x):  # NOTE [Host random states]
            host_rngs.append(x)
        elif stateful(x) or isinstance(x, nn.Module):  # NOTE [Modules among the arguments]
            objects.append(x)
        return x

    flat, spec = _flatten_arguments(args, kwargs)
    leaves = [grab(x) for x in flat]
    devices = {t.device for t in tensors if t is not None}
    return CapturedInputs(
        leaves, spec, tensors, flags, versions, devices, objects, not_leaves=not_leaves,
        generators=generators, host_rngs=host_rngs,
    )


#: Argument leaves that hold no state a replay needs.
_PLAIN_LEAVES = frozenset({type(None), bool, int, float, str})

#: TreeSpecs of argument lists by their structure (``_structure``), or None for a
#: structure pytree flattens otherwise: pytree's walk costs tens of microseconds per
#: region call, for a block's ``(x,)`` or a transformers layer's keywords.
_SPECS: dict[Any, TreeSpec | None] = {}
#: Leaf types whose values ``_flatten_arguments`` flattens itself (pytree's leaves too).
_LEAVES = frozenset({torch.Tensor, nn.Parameter, type(None), bool, int, float, str})


def _structure(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What the TreeSpec of ``(args, kwargs)`` depends on, where every argument is a leaf
    of ``_LEAVES`` or a tuple or list of such leaves; None otherwise."""
    codes: list[Any] = []
    for v in itertools.chain(args, kwargs.values()):
        t = type(v)
        if t in _LEAVES:
            codes.append(t)
        elif (t is tuple or t is list) and all(type(x) in _LEAVES for x in v):
            codes.append((t, len(v)))
        else:
            return None
    return len(args), tuple(kwargs), tuple(codes)


_UNSEEN: Any = object()


def _flatten_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], TreeSpec]:
    """``tree_flatten((args, kwargs))``, without pytree's walk where the arguments are
    leaves (tensors, numbers, strings, None) or tuples and lists of leaves: the spec then
    depends only on that structure, and the one pytree gave for it the first time
    (checked then to list the same leaves) serves. Subclasses and other containers take
    pytree's path: some register as pytree nodes."""
    key = _structure(args, kwargs)
    spec = _SPECS.get(key, _UNSEEN) if key is not None else None
    if spec is None:
        return tree_flatten((args, kwargs))
    flat: list[Any] = []
    for v in itertools.chain(args, kwargs.values()):
        if type(v) is tuple or type(v) is list:
            flat.extend(v)
        else:
            flat.append(v)
    if spec is _UNSEEN:
        if len(_SPECS) > 256:
            _SPECS.clear()
        leaves, spec = tree_flatten((args, kwargs))
        same = len(leaves) == len(flat) and all(map(operator.is_, leaves, flat))
        _SPECS[key] = spec if same else None  # None: pytree flattens it otherwise, always its walk
        if not same:
            return leaves, spec
    return flat, spec


def replay_arguments(
    cap: CapturedInputs,
    region_name: str,
    tensors: list[torch.Tensor] | None = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Fresh leaves for one replay, each a view of its leaf where the forward's input was
    no leaf (NOTE [Replay inputs]); raises if an input changed since the forward.

    ``tensors`` replaces the captured tensors (inputs that came back from host memory).
    """
    src = tensors if tensors is not None else cap.tensors
    for i, t in enumerate(cap.tensors):
        if t is None and i not in cap.copied:
            t = cap.watches.get(i)  # sent to host memory: its version watch
        if t is not None and version_of(t) != cap.versions[i]:
            raise RuntimeError(
                f"offrecomp: input {i} of region {region_name!r} was modified in place after "
                f"the region's forward began (version {cap.versions[i]} -> {version_of(t)}), "
                "so replaying it would produce wrong activations. Hint: avoid in-place ops "
                "on a block's inputs, or exclude the block with regions=."
            )

    def fresh(x: Any) -> Any:
        if isinstance(x, _Slot):
            t = src[x.i]
            if t is None:
                raise RuntimeError(f"offrecomp: input {x.i} of region {region_name!r} is gone")
            leaf = t.detach()
            if not cap.requires_grad[x.i] or not (leaf.is_floating_point() or leaf.is_complex()):
                return leaf
            leaf.requires_grad_(True)
            copied = x.i in cap.copied
            if not copied and not (x.i in cap.not_leaves and leaf.dtype == torch.float32 and leaf.layout == torch.strided):
                return leaf  # autocast caches casts of strided float32 tensors only
            # backward runs with grad disabled, maybe under inference_mode
            inference = torch.inference_mode(False) if torch.is_inference_mode_enabled() else contextlib.nullcontext()
            with inference, torch.enable_grad():
                if copied:
                    # the forward writes it in place: a copy, not a leaf (autograd forbids
                    # in-place writes to a leaf that requires grad), so the held copy stays
                    # as it was for any later replay
                    return leaf.clone(memory_format=torch.preserve_format)
                return leaf.view_as(leaf)  # no leaf, as in the forward (NOTE [Replay inputs])
        return x

    args, kwargs = tree_unflatten([fresh(x) for x in cap.leaves], cap.spec)
    return tuple(args), kwargs
