"""What the region's modes ask of an ATen op.

Traits that depend on the operator alone (draws random numbers, writes its inputs,
returns a view, is a collective, reads only metadata), worked out once per operator;
the leaves of its arguments and results and their non-tensor values; the tensors it
writes; whether its return can be rebuilt without running it; and whether it is a
parameter cast autocast caches.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]

from offrecomp import _torch_compat as tc
from offrecomp._torch_compat import tree_flatten

#: torch.distributed's ops as the dispatcher names them (dist.all_reduce and friends, and
#: the functional collectives).
_COLLECTIVE_NAMESPACES = ("c10d.", "_c10d_functional.", "c10d_functional.")

# Ops that read only the metadata (shape, dtype, device) of their tensor inputs.
_METADATA_ONLY = frozenset(
    {
        "aten.empty_like.default",
        "aten.zeros_like.default",
        "aten.ones_like.default",
        "aten.full_like.default",
        "aten.rand_like.default",
        "aten.randn_like.default",
        "aten.randint_like.default",
        "aten.new_empty.default",
        "aten.new_empty_strided.default",
        "aten.new_zeros.default",
        "aten.new_ones.default",
        "aten.new_full.default",
        "aten.sym_size.int",
        "aten.sym_stride.int",
        "aten.sym_numel.default",
        "aten.sym_storage_offset.default",
        "aten.size.int",
        "aten.stride.int",
        "aten.dim.default",
        "aten.is_same_size.default",
    }
)

_SIMPLE_RETURN_TYPES = ("Tensor", "Tensor?", "SymInt", "int", "float", "bool", "Tensor[]", "ScalarType")


def _returns_rebuildable(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is None:  # a higher-order operator
        return False
    types = [str(r.type) for r in schema.returns]
    if not types or any(t not in _SIMPLE_RETURN_TYPES for t in types):
        return False
    return not (len(types) > 1 and "Tensor[]" in types)


#: What a tensor subclass without its own ``__torch_dispatch__`` inherits.
_UNINITIALIZED: type = UninitializedTensorMixin
_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def describable(t: torch.Tensor) -> bool:
    # A subclass with its own __torch_dispatch__ (DTensor, also as a parameter under
    # tensor parallelism) is a wrapper whose storage has no data pointer; one with only
    # __torch_function__ (a tagged tensor) holds its own storage, as a plain tensor does.
    cls = type(t)
    if cls is not torch.Tensor and cls is not torch.nn.Parameter and (
        cls.__torch_dispatch__ is not _PLAIN_DISPATCH or issubclass(cls, _UNINITIALIZED)
    ):
        return False  # a lazy module's parameter before its first forward has no data either
    # a nested tensor of the strided layout has no single size or stride; a ZeroTensor
    # (forward AD's zero tangents) has a storage without data
    return t.layout == torch.strided and not t.is_meta and not t.is_nested and not t._is_zerotensor()


# NOTE [Op leaves]
# The modes see every op a region runs, and each flattened the op's arguments (and the
# recorder its results) with pytree: about 12 us per op for a single tensor argument,
# most of a mode's cost per op (a bare dispatch mode costs about 5). The dispatcher hands
# a mode tuples and lists (and the kwargs dict) of tensors and scalars, which
# ``op_leaves`` walks directly; any other type goes through pytree, so the leaves, and
# their order, are always pytree's.
_NODE_TYPES = (tuple, list, torch.Size)
_LEAF_TYPES = frozenset(
    {
        torch.Tensor, torch.nn.Parameter, int, float, bool, str, complex, type(None),
        torch.dtype, torch.device, torch.layout, torch.memory_format,
    }
)


class _Traits(NamedTuple):
    """What the recorder asks of every op that depends on the operator alone."""

    name: str
    higher_order: bool
    seeded: bool  # may draw from an RNG
    writes: bool  # in-place or out=
    view: bool  # a return aliases an input
    collective: bool
    metadata_only: bool  # reads only its inputs' shapes and dtypes


_TRAITS: dict[Any, _Traits] = {}


def _traits(func: Any) -> _Traits:
    """The operator's traits, worked out once per operator (from its schema and tags)."""
    t = _TRAITS.get(func)
    if t is None:
        name = str(func)
        t = _TRAITS[func] = _Traits(
            name=name,
            higher_order=tc.is_higher_order(func),
            seeded=tc.is_nondeterministic_seeded(func),
            writes=tc.op_writes_inputs(func),
            view=tc.op_returns_alias(func),
            collective=name.startswith(_COLLECTIVE_NAMESPACES),
            metadata_only=name in _METADATA_ONLY,
        )
    return t


def op_name(func: Any) -> str:
    """``str(func)``, worked out once per operator (it formats the schema name each time)."""
    return _traits(func).name


def op_leaves(tree: Any) -> list[Any]:
    """``tree_flatten(tree)[0]``, fast for what the dispatcher passes (NOTE [Op leaves])."""
    out: list[Any] = []
    _collect(tree, out)
    return out


def _collect(x: Any, out: list[Any]) -> None:
    t = type(x)
    if t in _LEAF_TYPES:
        out.append(x)
    elif t in _NODE_TYPES:
        for y in x:
            if type(y) in _LEAF_TYPES:
                out.append(y)
            else:
                _collect(y, out)
    elif t is dict:
        for y in x.values():
            _collect(y, out)
    else:
        out.extend(tree_flatten(x)[0])


def _scalars_of(leaves: list[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            out.append(None)
        elif isinstance(x, (int, float, bool, str)) or x is None:
            out.append(x)
        elif isinstance(x, torch.Generator):
            out.append("<generator>")  # which one: the serving mode checks it is the call's
        else:
            out.append(str(x))
    return tuple(out)


def written_arguments(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The plain tensors an op writes (in-place and ``out=`` arguments), by its schema,
    each with the name of the argument that passes it."""
    names = tc.written_arg_names(func)
    if not names:
        return []
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.name not in names:
            continue
        val = kwargs.get(a.name, args[i] if i < len(args) else None)
        out += [(a.name, x) for x in op_leaves(val) if isinstance(x, torch.Tensor) and describable(x)]
    return out


def written_tensors(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The plain tensors an op writes (in-place and ``out=`` arguments), by its schema."""
    return [x for _, x in written_arguments(func, args, kwargs)]


# NOTE [Autocast cache]
# Under autocast, the first op that needs a float32 parameter in bf16/fp16 casts it
# (aten._to_copy) and autocast caches the cast until the outermost autocast context
# exits; later uses of that parameter in the context dispatch no cast. Autocast caches
# the casts of a float32 leaf that requires grad and is no view, and casts any other
# tensor at each use. A replay whose autocast contexts are the outermost (backward
# outside autocast, as AMP runs it) keeps the cache on, plain or under the serving mode:
# the cache starts empty, each cast has the values the forward's had, the replay holds
# one cast of a weight as the forward did (not one per use: a weight applied in a loop,
# a GRU's steps), and the contexts' exit clears it. A replay's inputs are fresh leaves
# that require grad; one that was no leaf in the forward (a block's output, cast at each
# read) reaches the forward as a view of its leaf (NOTE [Replay inputs] in
# arguments.py), so the replay casts it at each read too and dispatches the casts its
# recording holds, which the serving mode follows op by op. Inside another autocast
# context (backward called under autocast, where the cache still holds the forward's
# casts) the cache is off (``regions.autocast_contexts``): it would keep, until that
# context exits, a cast of each replay's leaf inputs, and the replay dispatches every
# cast. A block that uses a parameter an earlier block already cast (weights shared or
# tied between blocks, a block called twice, two forwards in one autocast context)
# records no cast of it, and its replay, with the cache on or off, casts it again: one
# op more than the recording.
# Replays of compiled code keep the forward's setting, which the compiled graph guards
# on (as do replays of forwards without autocast, where it decides nothing; a compiled
# function called in a block under autocast compiles once more for its replays). The
# recording marks each parameter cast with its parameter; the serving mode runs a
# parameter cast that is not the recorded op at its place without consuming that op
# (never serving it: running it is always right). Matching by name alone is not
# enough: an extra cast of a bias would take the place of the recorded cast of the input
# and be served the input's bytes. Plain replays check nothing.
_TO_COPY = "aten._to_copy.default"


def _param_cast(name: str, args: Any, kwargs: dict[str, Any]) -> int:
    """``id`` of the parameter when the op is a cast autocast caches (a float32
    parameter to a lower floating precision), else 0. A replay's region inputs are
    fresh leaves that require grad (or views of them), so "a parameter" is what tells
    the casts apart, not "a leaf" (inside autocast's kernel its keys are excluded, so
    ``torch.is_autocast_enabled`` reads False here). Running such a cast is always
    safe: it is a pure function of the parameter."""
    if name != _TO_COPY or not args:
        return 0
    t = args[0]
    if not isinstance(t, torch.nn.Parameter) or t.dtype != torch.float32 or not t.requires_grad:
        return 0
    return id(t) if kwargs.get("dtype") in (torch.bfloat16, torch.float16) else 0


def _unflatten_like(func: Any, flat: list[Any]) -> Any:
    """Rebuild an op's return value from its flattened outputs."""
    returns = func._schema.returns
    if len(returns) == 1:
        if str(returns[0].type) == "Tensor[]":
            return list(flat)
        return flat[0]
    return tuple(flat)
