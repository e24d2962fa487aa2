"""What a region call captures of its arguments so it can be replayed: the tensors as
detached aliases (NOTE [Replay inputs]), everything else as it is, the generators among
them, and the objects whose state arg_state.py records (NOTE [Stateful arguments]); and
the arguments a replay runs with.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from offrecomp._torch_compat import TreeSpec, tree_flatten, tree_unflatten, version_of
from offrecomp.arg_state import ArgState, stateful
from offrecomp.handles import view_on
from offrecomp.host_rng import is_private
from offrecomp.trace.ops import describable

__all__ = [
    "CapturedInputs", "arguments_in_state", "arguments_with", "capture_inputs", "replay_arguments", "state_links",
]


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
    ids: dict[int, int]
    """The ``id`` of each tensor argument of the forward, to its index: one index per
    object, however many places it fills (NOTE [Aliased arguments])."""
    repeated: bool = False
    """A tensor argument fills more than one place among the arguments."""
    shared: tuple[tuple[int, ...], ...] = ()
    """Indices of distinct tensor arguments on one storage (views of one tensor), one
    tuple per such storage (NOTE [Aliased arguments])."""
    spans: dict[int, tuple[int, int]] | None = None
    """Per storage of the forward's that ``keep_copy`` copied (its StorageImpl): an input
    held on the copy, and the byte of that storage the copy begins at."""
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

    def places(self) -> tuple[int, ...]:
        """The index of the tensor in each place a tensor fills among the arguments."""
        return tuple(x.i for x in self.leaves if isinstance(x, _Slot))

    def keep_copy(self, i: int, reach: list[torch.Tensor] | None = None) -> None:
        """Input ``i`` is about to be written by the forward: hold its values as they are;
        with the other inputs on its storage, on one copy of the bytes they span and those
        ``reach`` (tensors on that storage the call's argument objects hold) span (NOTE
        [Aliased arguments])."""
        t = self.tensors[i]
        if i in self.copied or t is None:
            return
        key = _storage_key(t)
        if key is None:  # no bytes to copy (a wrapper subclass, empty): its values
            held = [(i, t.clone(memory_format=torch.preserve_format))]
        else:
            group = next((g for g in self.shared if i in g), (i,))
            members = [(j, m) for j in group if j not in self.copied and (m := self.tensors[j]) is not None]
            lo, copies = _copied_together([m for _, m in members], reach or ())
            held = [(j, c) for (j, _), c in zip(members, copies)]
            if self.spans is None:
                self.spans = {}
            self.spans[key] = (i, lo)
        for j, copy in held:
            self.tensors[j] = copy
            self.versions[j] = version_of(copy)
            self.copied.add(j)


# NOTE [Replay inputs]
# The capture holds a detached alias of every tensor argument: it shares storage and
# version counter with the original but not its grad_fn, so holding it does not pin the
# previous layers' graph, and replay builds a throwaway graph rooted at fresh leaves. The
# alias records requires_grad so code that branches on it replays the same way. The
# version recorded here is compared before replay: an input modified in place after the
# region ran would replay wrong, so that is an error, never a silent difference. Inputs
# placed OFFLOAD are dropped from the capture once the region's forward returns and come
# back from host memory for the replay; each leaves a storage-free alias sharing its
# version counter (``watches``), so a write after the region is still an error. Not one
# the forward wrote (``copied``: a region's first call under a plan set before it): its
# host copy holds the written values, and the capture holds, on the device, the copy the
# watch took of its entry values, which that call's replay starts from (NOTE [State
# written by its region] in call_state.py).
# A strided float32 input that requires grad and was no leaf in the forward (a previous
# block's output), or was a view, reaches the replayed forward as a view of its fresh
# leaf, made before the replay enters any mode (none sees the op): autocast caches its
# casts of a float32 leaf that requires grad and is no view, and casts any other tensor
# at each use (NOTE [Autocast cache] in trace/ops.py), so the replay casts its inputs
# as often as the forward did. The view shares the leaf's storage and data pointer: its
# saves are booked as the input's.


# NOTE [Aliased arguments]
# A forward may take one tensor in several places (``attn(x, x, x)``, ``block(x, skip=x)``),
# or views of one tensor (``block(x, x[:, :d])``), and the replay must take them so too:
# code branches on identity (``nn.MultiheadAttention`` takes its packed in-projection,
# and with ``batch_first`` one transpose, when ``query is key is value``), and a write
# through one argument shows in every other on its storage (``h.mul_(2)`` then a read of
# ``skip``). So the capture gives each tensor object one index, however many places it
# fills (in lists, dicts and keyword arguments alike: the places are pytree's leaves),
# and a replay hands that index's one tensor to each place; ``layout()`` holds which
# places share an index, so a recording of ``f(x, y, x)`` never serves ``f(x, y, y)``.
# Distinct tensor arguments on one storage are noted at the capture (a storage read per
# tensor, only for a call of two or more). A write the first call's watch sees to an
# input copies the bytes that the inputs on its storage, and the tensors the call's
# argument objects hold there, span, once (``keep_copy``), and each held input becomes
# a view of that copy with its own geometry. A replay builds the inputs of one storage
# on one tensor over those bytes, a leaf where any of them requires grad (over the
# whole copy, and a copy of it, where the forward wrote them: autograd forbids in-place
# writes to a leaf and its views, and the held copy stays as it was for a later replay),
# and hands each as a view of it with its size, strides and offset, detached where it
# required no grad: a write through one is seen by the others, in values and by
# autograd, as in the forward. Each is then a view, as a non-leaf input is anyway (NOTE
# [Replay inputs]); a leaf among them (a model input passed with a slice of it) is cast
# by autocast at each use, as a view is, to the same values. Inputs of one storage in
# several dtypes, or with a conjugate or negative bit, share one storage, each a leaf of
# its own, or, where the forward writes them (``block(z, z.conj())`` then ``z.mul_(2)``),
# a non-leaf over the same bytes (``_apart``). A tensor argument that is one of the
# region's own parameters (``block(x, block.fc.weight)``, a tied head handed the
# embedding's weight) is, in the replay, the tensor that parameter's slot holds there
# (``params_as_arguments`` in replay_state.py): an identity test (``w is
# self.fc.weight``) goes as in the forward, and a write through one is read through the
# other. A tensor an argument object holds (NOTE [Stateful arguments] in
# arg_state.py) that is one of the tensor arguments (``block(x, State(h=x))``) is bound
# there, for the replay, to the replay's tensor of that argument, and one on a storage
# the watch copied (``State(h=x[:, :d])``, ``block(y[:, :d], State(h=y))``) to a view of
# the replay's copy with its geometry; in a tuple (``State(hs=(x, y))``), which binds
# nothing new, a tuple of its type (a plain or a named one) holding those is bound where
# its container binds it; the binding is put back after the replay
# (``arguments_in_state``), and such a tensor is not swapped to its entry values (NOTE
# [State written by the forward] in arg_state.py): the replay's copy holds them.


def capture_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> CapturedInputs:
    tensors: list[torch.Tensor | None] = []
    flags: list[bool] = []
    versions: list[int] = []
    not_leaves: set[int] = set()

    objects: list[Any] = []
    generators: list[torch.Generator] = []
    host_rngs: list[Any] = []

    ids: dict[int, int] = {}
    repeated = False

    def grab(x: Any) -> Any:
        nonlocal repeated
        if isinstance(x, torch.Tensor):
            i = ids.get(id(x))
            if i is not None:  # NOTE [Aliased arguments]: the same object, the same slot
                repeated = True
                return _Slot(i)
            i = ids[id(x)] = len(tensors)
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
        leaves, spec, tensors, flags, versions, devices, objects, ids, repeated=repeated,
        shared=_shared_storages(tensors) if len(tensors) > 1 else (), not_leaves=not_leaves,
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


def _storage_key(t: torch.Tensor) -> int | None:
    """What tells ``t``'s storage apart from others alive (its StorageImpl), for a tensor
    with data; None for others (a wrapper subclass, nested, meta, empty)."""
    if not describable(t) or not t.numel():
        return None
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):  # a functorch-wrapped tensor: no storage to read
        return None


def _shared_storages(tensors: list[torch.Tensor | None]) -> tuple[tuple[int, ...], ...]:
    """The indices of ``tensors`` grouped by storage, for each storage two or more share
    (NOTE [Aliased arguments])."""
    by: dict[int, list[int]] = {}
    for i, t in enumerate(tensors):
        key = _storage_key(t) if t is not None else None
        if key is not None:
            by.setdefault(key, []).append(i)
    return tuple(tuple(g) for g in by.values() if len(g) > 1)


def _byte_span(ts: list[torch.Tensor]) -> tuple[int, int]:
    """The bytes of their storage that ``ts`` reach, from a multiple of 16 (a multiple of
    every element size) to the end of the last element reached."""
    lo, hi = -1, 0
    for t in ts:
        first, end = _bytes_reached(t)
        lo = first if lo < 0 else min(lo, first)
        hi = max(hi, end)
    return lo - lo % 16, hi


def _bytes_reached(t: torch.Tensor) -> tuple[int, int]:
    """The first byte of its storage ``t`` reaches, and the end of its last element."""
    size = t.element_size()
    first = int(t.storage_offset())
    last = first + sum((int(n) - 1) * s for n, s in zip(t.shape, t.stride()))
    return first * size, (last + 1) * size


def _on(storage: Any, t: torch.Tensor, start: int) -> torch.Tensor:
    """A tensor as ``t`` is (dtype, geometry, conjugate and negative bits) on ``storage``,
    whose first byte is byte ``start`` of ``t``'s storage."""
    v = view_on(storage, 0, t.dtype, t.shape, t.stride(), t.storage_offset() - start // t.element_size())
    if t.is_conj():
        v = v.conj()
    if t.is_neg():
        v = v._neg_view()
    return v


def _copied_together(ts: list[torch.Tensor], reach: Sequence[torch.Tensor] = ()) -> tuple[int, list[torch.Tensor]]:
    """Copies of ``ts`` (tensors on one storage) on one new storage holding the bytes
    they and ``reach`` (others on that storage) span, each with its own geometry, and
    the byte of their storage it begins at (NOTE [Aliased arguments])."""
    lo, hi = _byte_span([*ts, *(t for t in reach if _storage_key(t) is not None)])
    with torch.no_grad():
        span = view_on(ts[0].untyped_storage(), 0, torch.uint8, (hi - lo,), (1,), lo).clone()
    return lo, [_on(span.untyped_storage(), t, lo) for t in ts]


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
                raise _gone(region_name, x.i)
            leaf = t.detach()
            copied = x.i in cap.copied
            if not cap.requires_grad[x.i] or not (leaf.is_floating_point() or leaf.is_complex()):
                if not copied:
                    return leaf
                with _unguarded():  # the forward writes it in place: a copy, the held one as it was
                    return leaf.clone(memory_format=torch.preserve_format)
            leaf.requires_grad_(True)
            if not copied and not (x.i in cap.not_leaves and leaf.dtype == torch.float32 and leaf.layout == torch.strided):
                return leaf  # autocast caches casts of strided float32 tensors only
            with _unguarded():
                if copied:
                    # the forward writes it in place: a copy, not a leaf (autograd forbids
                    # in-place writes to a leaf that requires grad), so the held copy stays
                    # as it was for any later replay
                    return leaf.clone(memory_format=torch.preserve_format)
                return leaf.view_as(leaf)  # no leaf, as in the forward (NOTE [Replay inputs])
        return x

    if not (cap.repeated or cap.shared or cap.copied):
        args, kwargs = tree_unflatten([fresh(x) for x in cap.leaves], cap.spec)
        return tuple(args), kwargs
    # NOTE [Aliased arguments]: one tensor per index, those of one storage built together,
    # and one written on a copy of the bytes it spans
    made: dict[int, torch.Tensor] = {}
    alone = tuple((i,) for i in sorted(cap.copied) if not any(i in g for g in cap.shared))
    for group in cap.shared + alone:
        made.update(_fresh_group(cap, group, src, region_name))

    def once(x: Any) -> Any:
        if isinstance(x, _Slot):
            t = made.get(x.i)
            if t is None:
                t = made[x.i] = fresh(x)
            return t
        return x

    args, kwargs = tree_unflatten([once(x) for x in cap.leaves], cap.spec)
    return tuple(args), kwargs


def arguments_with(
    cap: CapturedInputs, args: tuple[Any, ...], kwargs: dict[str, Any], tensors: dict[int, torch.Tensor]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a replay (``replay_arguments``) with ``tensors`` (by index) in
    the places those tensor arguments fill."""
    flat, _ = tree_flatten((args, kwargs))
    flat = [tensors.get(x.i, v) if isinstance(x, _Slot) else v for x, v in zip(cap.leaves, flat)]
    args, kwargs = tree_unflatten(flat, cap.spec)
    return tuple(args), kwargs


def _gone(region_name: str, i: int) -> RuntimeError:
    return RuntimeError(f"offrecomp: input {i} of region {region_name!r} is gone")


@contextlib.contextmanager
def _unguarded() -> Iterator[None]:
    """Grad mode on and inference mode off (backward runs with grad disabled, maybe under
    inference_mode)."""
    inference = torch.inference_mode(False) if torch.is_inference_mode_enabled() else contextlib.nullcontext()
    with inference, torch.enable_grad():
        yield


def _fresh_group(
    cap: CapturedInputs, group: tuple[int, ...], src: Sequence[torch.Tensor | None], region_name: str
) -> dict[int, torch.Tensor]:
    """The inputs of ``group`` (distinct tensors on one storage in the forward) for one
    replay, on one storage as the forward's were (NOTE [Aliased arguments]); none where
    each input as it is does (nothing written, nothing requires grad), or where they are
    held on storages of their own."""
    ts: list[torch.Tensor] = []
    for j in group:
        t = src[j]
        if t is None:
            raise _gone(region_name, j)
        ts.append(t.detach())
    if len(ts) == 1 and (_storage_key(ts[0]) is None or ts[0].is_conj() or ts[0].is_neg()):
        return {}  # no bytes to copy, or bits a view of a plain tensor would not carry: as fresh() makes it
    storage = ts[0].untyped_storage()
    if any(t.untyped_storage()._cdata != storage._cdata for t in ts[1:]):
        return {}
    grads = [cap.requires_grad[j] and (t.is_floating_point() or t.is_complex()) for j, t in zip(group, ts)]
    copied = any(j in cap.copied for j in group)
    if not (copied or any(grads)):
        return {}  # detached aliases on one storage already
    dtype = next((t.dtype for t, g in zip(ts, grads) if g), ts[0].dtype)
    with _unguarded():
        if not all(t.dtype == dtype and not t.is_conj() and not t.is_neg() for t in ts):
            # views in several dtypes, or with a conjugate or negative bit: one storage
            if copied:
                storage = storage.clone()  # the held copy stays as it was
            return {j: _apart(_on(storage, t, 0), g, copied) for j, t, g in zip(group, ts, grads)}
        size = ts[0].element_size()
        # the whole of a held copy (it spans what the argument objects hold there too), or
        # the bytes the inputs reach of the forward's storage
        lo, hi = (0, storage.nbytes() // size * size) if copied else _byte_span(ts)
        root = view_on(storage, 0, dtype, ((hi - lo) // size,), (1,), lo // size).requires_grad_(any(grads))
        base = root.clone() if copied else root  # the forward writes them: a copy, the held one as it was
        shift = lo // size if copied else 0
        return {
            j: (base if g else base.detach()).as_strided(t.shape, t.stride(), t.storage_offset() - shift)
            for j, t, g in zip(group, ts, grads)
        }


def _apart(v: torch.Tensor, grad: bool, written: bool) -> torch.Tensor:
    """``v`` as a replay input of a group of several dtypes (NOTE [Aliased arguments]): a
    leaf of its own where it requires grad, or, where the forward writes the group in
    place (autograd forbids that on a leaf), a non-leaf on the same bytes: copied from a
    clone of its values that requires grad, in place, so its bits stay as they were."""
    if not grad:
        return v
    if not written:
        return v.requires_grad_(True)
    v.copy_(v.detach().clone().requires_grad_(True))
    return v


def state_links(cap: CapturedInputs, state: ArgState) -> list[tuple[int, int, int | None]]:
    """The tensors the call's argument objects held at entry that alias a tensor argument
    of it (NOTE [Aliased arguments]): (index in ``state.tensors``, the argument's index,
    None) for the argument itself; (index, an argument held on the copy, the byte the
    copy begins at) for another tensor on a storage ``keep_copy`` copied."""
    ids = cap.ids
    links: list[tuple[int, int, int | None]] = (
        [(k, ids[id(t)], None) for k, (t, _, _) in enumerate(state.tensors) if id(t) in ids] if ids else []
    )
    if cap.spans:  # the first call's watch copied an input: what else lies on its storage
        same = {k for k, _, _ in links}
        for k, (t, _, _) in enumerate(state.tensors):
            span = cap.spans.get(_storage_key(t) or 0) if k not in same else None
            if span is not None:
                links.append((k, *span))
    return links


def arguments_in_state(
    cap: CapturedInputs,
    state: ArgState,
    links: list[tuple[int, int, int | None]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[frozenset[int], contextlib.AbstractContextManager[None]]:
    """The tensors of ``links`` (``state_links``) the replay reads through its arguments
    (indices in ``state.tensors``), and a context binding each where the argument
    objects hold it to the replay's tensor of that argument (``args``, ``kwargs``), or to
    a view of the replay's storage as it was of the forward's, and to what it bound
    before after (NOTE [Aliased arguments])."""
    if not links:
        return frozenset(), contextlib.nullcontext()
    flat, _ = tree_flatten((args, kwargs))
    tensor_of = {x.i: v for x, v in zip(cap.leaves, flat) if isinstance(x, _Slot)}
    pairs, bound = [], []
    for k, i, start in links:
        t, r = state.tensors[k][0], tensor_of.get(i)
        if r is not None and start is not None:
            r = _view_in(t, r, cap.tensors[i], start)
        if r is not None:
            pairs.append((state.tensors[k][2], r))
            bound.append(k)
    return frozenset(bound), state.bound(pairs)


def _view_in(t: torch.Tensor, r: torch.Tensor, held: torch.Tensor | None, start: int) -> torch.Tensor | None:
    """``t`` (a tensor of the forward's on a storage the capture copied from byte
    ``start``) on the storage of ``r``, the replay's tensor of an argument held on that
    copy as ``held``; None where ``t`` reaches bytes beyond the copy (it holds only
    those of the arguments) or ``r`` carries a conjugate or negative bit."""
    if held is None or r.is_conj() or r.is_neg():
        return None
    size = r.element_size()
    # byte b of the forward's storage is byte b - shift of the replay's
    shift = start + int(held.storage_offset() - r.storage_offset()) * size
    first, end = (b - shift for b in _bytes_reached(t))
    if first < 0 or end > r.untyped_storage().nbytes():
        return None
    if t.dtype == r.dtype and not t.is_conj() and not t.is_neg():
        return (r if t.requires_grad else r.detach()).as_strided(t.shape, t.stride(), first // size)
    return _on(r.untyped_storage(), t, shift)
