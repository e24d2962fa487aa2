"""Regions: discovery, and what one region call captures so it can be replayed.

A region is a module whose forward can be rerun to regenerate dropped activations (a
transformer block). For every call of a region the runtime keeps:

* its inputs (positional and keyword, tensors and everything else, any nesting),
* the RNG state of the CPU and of every CUDA device in use,
* the autocast state,
* small snapshots of the region's buffers (so replay sees the values the forward saw and
  leaves module state exactly as the forward left it; see NOTE [Replay and module state]),
* the attribute bindings of the plain Python objects among its arguments, when its
  forward changes them (a key/value cache; see NOTE [Stateful arguments]).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from offrecomp import _torch_compat as tc
from offrecomp._torch_compat import TreeSpec, tree_flatten, tree_unflatten
from offrecomp.changes import structure_epoch

log = logging.getLogger(__name__)

__all__ = [
    "ArgState",
    "ParamState",
    "Region",
    "buffer_of",
    "capture_autocast",
    "capture_inputs",
    "capture_params",
    "compiled_module",
    "discover_regions",
    "finish_params",
    "modified_buffers",
    "has_lazy_parameters",
    "modified_params",
    "param_of",
]

# Buffers larger than this are not snapshotted at region entry (see NOTE below).
BUFFER_SNAPSHOT_MAX_BYTES = 1 << 20


@dataclass(eq=False)
class Region:
    """One module chosen as a unit of replay."""

    name: str
    module: nn.Module
    slots: tuple[tuple[nn.Module, str], ...]
    """(module, buffer name) of every buffer under the region: a forward may replace a
    buffer by assignment (``self.run = 0.9 * self.run + ...``), so buffers are looked up
    by slot, never held."""
    modules: tuple[nn.Module, ...] = ()
    """The region module and every module under it (their ``training`` flags are part of
    what a call captures)."""
    param_slots: tuple[tuple[nn.Module, str], ...] = ()
    """(module, parameter name) of every parameter under the region: ``functional_call``
    puts other tensors into these slots for one call only (NOTE [Replay and parameters])."""
    compiled: bool = False
    """Holds torch.compile'd modules (its op recording cannot be trusted: NOTE [Compiled regions])."""
    compiled_self: bool = False
    """The region module is compiled itself, wrapped (``torch.compile(block)``) or in place
    (``block.compile()``): a replay runs the same compiled graph (NOTE [Compiled regions])."""
    in_place: bool = False
    """Compiled in place: its calls run ``_compiled_call_impl``, which the runtime wraps
    instead of ``forward``."""
    generators: list[torch.Generator] = field(default_factory=list)
    """Generators of its own its first call drew from (NOTE [Private generators])."""
    writes_state: bool | None = None
    """Its forward writes its own inputs or parameters in place; None until a call has
    shown whether it does (NOTE [State written by its region])."""
    mode_sensitive: bool | None = None
    """True once a planned call saved other storages than its recording: its code may
    behave otherwise under a dispatch mode, so every call runs under one (NOTE [Replay],
    step 7) and saves what the recorder saw; False once a call under one differed too
    (its saves depend on the data), for good; None before."""
    mismatches: int = 0
    """Planned calls of it that saved other storages than their recording."""
    variable: bool = False
    """Its saves changed from pass to pass more than once (code that branches on the
    data): never recomputed from then on, as no one recording describes its calls."""
    untracked_state: bool | None = None
    """Its calls take argument objects with more state than the runtime tracks: True
    once a call changed it (never replayed from then on), False once a call left it as
    it was; None before (NOTE [Stateful arguments])."""
    backward_in_forward: bool = False
    """Its forward runs a backward of its own (NOTE [Backward inside a forward] in
    replay.py): its replays hold what they save and run plainly."""
    forward_used: set[int] = field(default_factory=set)
    """Indices of the storages of its calls that a backward inside the forward read: kept."""
    accumulates: bool = False
    """Its forward runs a backward that accumulates into ``.grad`` (NOTE [Accumulating
    backward in a forward] in calls.py): a replay would add those gradients again, so its
    calls are never recomputed."""
    reaches_out: bool = False
    """Its forward runs a backward through activations from before its call (NOTE
    [Backward inside a forward]): a replay, which starts from detached inputs, cannot
    reproduce it, so its activations are kept."""
    lazy: bool = False
    """Holds lazy modules (``nn.LazyLinear``) whose parameters are not materialised yet:
    its calls keep their activations until they are (the call that materialises them
    writes them)."""
    remeasured: bool = False
    """A serving replay diverged from a recording its call's own first use of state had
    shaped, and its signature measured again (NOTE [Stale recordings] in regenerate.py)."""
    attr_quiet: int = -1
    """Calls in a row whose forward changed no module attribute since one did; -1 while
    none has (NOTE [Module attributes] in changes.py)."""
    epoch: int = -1
    """``structure_epoch()`` when it was last read (NOTE [Region refresh] in changes.py)."""

    def refresh(self) -> None:
        """Read the slots and the compiled flags again: a block may gain modules (LoRA
        adapters injected) or be compiled after the runtime was built (torchtune
        compiles its layers in place)."""
        self.epoch = structure_epoch()
        mods = list(self.module.modules())
        self.modules = tuple(mods)
        self.slots = tuple((sub, n) for sub in mods for n in sub._buffers.keys())  # noqa: SIM118 (a ScriptModule's buffers iterate by index)
        self.param_slots = tuple((sub, n) for sub in mods for n in sub._parameters.keys())  # noqa: SIM118
        self.in_place = _compiled_in_place(self.module)
        self.compiled_self = _is_compiled(self.module) or self.in_place
        self.compiled = any(map(compiled_module, mods))
        self.lazy = has_lazy_parameters(mods)

    @property
    def buffers(self) -> tuple[torch.Tensor, ...]:
        """The region's buffers as they are now (a slot set to None is skipped)."""
        return tuple(b for b in (buffer_of(m, n) for m, n in self.slots) if b is not None)

    def __repr__(self) -> str:
        return f"Region({self.name!r}, {type(self.module).__name__})"


def has_lazy_parameters(modules: Iterable[nn.Module]) -> bool:
    """Does a lazy module among ``modules`` still have uninitialised parameters?"""
    return any(isinstance(m, LazyModuleMixin) and m.has_uninitialized_params() for m in modules)


def buffer_of(m: nn.Module, name: str) -> torch.Tensor | None:
    """``m._buffers.get(name)``, also for a TorchScript module, whose buffer table is a
    wrapper without ``get`` (and iterates by index)."""
    table = m._buffers
    return table[name] if name in table else None  # noqa: SIM401 (no .get on the wrapper)


def param_of(m: nn.Module, name: str) -> torch.Tensor | None:
    """``m._parameters.get(name)`` (see ``buffer_of``)."""
    table = m._parameters
    return table[name] if name in table else None  # noqa: SIM401


def discover_regions(
    model: nn.Module,
    spec: type | Iterable[type] | Callable[[nn.Module, str], bool] | None,
) -> list[Region]:
    """Find the regions of ``model``.

    ``spec`` None: the repeated children of every ``nn.ModuleList``/``nn.Sequential`` (a
    child whose class occurs at least twice among its siblings), and of an
    ``nn.ModuleDict`` where nothing inside them is one (see _pick_repeated_children). A
    type or types: every module of those types. A callable: every module for which
    ``fn(module, name)`` is true. Only the outermost match counts: regions never nest.
    """
    if isinstance(spec, nn.Module):  # callable, but not a filter
        raise TypeError(
            f"regions= got a module instance ({type(spec).__name__}); accepted: None, a module "
            f"type (regions={type(spec).__name__}), a list of module types, or "
            "fn(module, qualified_name) -> bool (lambda m, name: m is block, for one module)"
        )
    if spec is None:
        pick = _pick_repeated_children(model)
    elif isinstance(spec, type):
        types: tuple[type, ...] = (spec,)
        pick = {id(m) for _, m in model.named_modules() if isinstance(m, types)}
    elif callable(spec):
        fn = spec
        pick = set()
        for name, m in model.named_modules():
            try:
                if fn(m, name):
                    pick.add(id(m))
            except Exception as exc:
                raise TypeError(
                    f"regions= filter {getattr(fn, '__name__', fn)!r} raised {exc!r} for module "
                    f"{name!r}; it must be fn(module, qualified_name) -> bool"
                ) from exc
    else:
        try:
            types = tuple(spec)
        except TypeError:
            raise TypeError(
                f"regions={spec!r} is invalid; accepted: None, a module type, a list of module "
                "types, or fn(module, qualified_name) -> bool"
            ) from None
        if not types or not all(isinstance(t, type) for t in types):
            raise TypeError(
                f"regions={spec!r} is invalid; accepted: None, a module type, a list of module "
                "types, or fn(module, qualified_name) -> bool"
            )
        pick = {id(m) for _, m in model.named_modules() if isinstance(m, types)}

    regions: list[Region] = []
    seen: set[int] = set()

    def visit(prefix: str, m: nn.Module) -> None:
        if id(m) in pick:
            if id(m) not in seen:  # a shared module is one region
                seen.add(id(m))
                prefix, inner = _unwrap_fsdp1(prefix, m)
                region = Region(prefix or "<model>", inner, ())
                region.refresh()
                regions.append(region)
            return  # regions never nest
        for child_name, child in m.named_children():
            visit(f"{prefix}.{child_name}" if prefix else child_name, child)

    visit("", model)
    return regions


def _unwrap_fsdp1(prefix: str, m: nn.Module) -> tuple[str, nn.Module]:
    """NOTE [FSDP1 units]: an FSDP1 unit (``FullyShardedDataParallel`` wrapping a block,
    as its ``auto_wrap_policy`` makes them) all-gathers its parameters inside its own
    forward. As a region it would run collectives, which auto never recomputes (a replay
    on one rank alone would wait forever). The block it wraps is the region instead: the
    unit gathers the parameters before that block's forward runs and again before its
    backward, where the replay runs, the same point on every rank, as for an activation
    checkpoint inside an FSDP unit."""
    cls = type(m)
    while cls.__name__ == "FullyShardedDataParallel" and cls.__module__.startswith("torch.distributed.fsdp"):
        inner = getattr(m, "_fsdp_wrapped_module", None)
        if not isinstance(inner, nn.Module):
            break
        prefix, m = f"{prefix}._fsdp_wrapped_module" if prefix else "_fsdp_wrapped_module", inner
        cls = type(m)
    return prefix, m


def _is_compiled(m: nn.Module) -> bool:
    """A ``torch.compile(module)`` wrapper?"""
    return tc.is_optimized_module(m)


def _compiled_in_place(m: nn.Module) -> bool:
    """Compiled by ``module.compile()``: its calls go through ``_compiled_call_impl``."""
    return getattr(m, tc.COMPILED_CALL_IMPL, None) is not None


def compiled_module(m: nn.Module) -> bool:
    """Compiled itself, wrapped (``torch.compile(m)``) or in place (``m.compile()``)."""
    return _is_compiled(m) or _compiled_in_place(m)


def _pick_repeated_children(model: nn.Module) -> set[int]:
    """Children whose class repeats among their siblings in an ``nn.ModuleList`` or
    ``nn.Sequential`` (also one module held several times, as ALBERT's shared layer; the
    outermost win: regions never nest), and in an
    ``nn.ModuleDict``, which holds a model's layers (torchtitan) but also whole models
    (a runtime over two models): its repeated children count only when nothing inside
    them does."""
    pick: set[int] = set()
    keyed: list[nn.Module] = []
    for m in model.modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential, nn.ModuleDict)):
            continue
        by_type: dict[type, list[nn.Module]] = {}
        for child in m._modules.values():  # not children(): one block held n times repeats
            # a ModuleList or ModuleDict is never called (x-transformers keeps each layer's
            # norm, block and residual in one): what it holds is looked at on its own
            if child is not None and not isinstance(child, (nn.ModuleList, nn.ModuleDict)):
                by_type.setdefault(type(child), []).append(child)
        for same in by_type.values():
            if len(same) >= 2:
                if isinstance(m, nn.ModuleDict):
                    keyed += same
                else:
                    pick.update(id(c) for c in same)
    candidates = pick | {id(c) for c in keyed}
    pick.update(id(c) for c in keyed if not any(id(x) in candidates for x in c.modules() if x is not c))
    return pick


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

    def devices(self) -> set[torch.device]:
        return set(self.devices_seen)

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

    def grab(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            tensors.append(x.detach())
            flags.append(bool(x.requires_grad))
            versions.append(int(x._version))
            return _Slot(len(tensors) - 1)
        if _stateful(x):
            objects.append(x)
        return x

    flat, spec = _flatten_arguments(args, kwargs)
    leaves = [grab(x) for x in flat]
    devices = {t.device for t in tensors if t is not None}
    return CapturedInputs(leaves, spec, tensors, flags, versions, devices, objects)


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
# reference: no tensor is copied). When the bindings at the region's exit differ from
# those at its entry, the replay puts the entry bindings back, runs, then restores the
# bindings it found. Changes inside a tensor (in place) are the version check's
# business (NOTE [Replay inputs]). The walk records at most ARG_STATE_MAX_ITEMS bindings
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


# ------------------------------------------------------------------------ RNG state


@dataclass
class RngState:
    cpu: torch.Tensor
    cuda: dict[int, torch.Tensor]


def capture_rng(devices: Iterable[torch.device]) -> RngState:
    cuda: dict[int, torch.Tensor] = {}
    for d in devices:
        if d.type == "cuda":
            idx = d.index if d.index is not None else torch.cuda.current_device()
            if idx not in cuda:
                cuda[idx] = torch.cuda.get_rng_state(idx)
    return RngState(torch.get_rng_state(), cuda)


def restore_rng(state: RngState) -> None:
    torch.set_rng_state(state.cpu)
    for idx, s in state.cuda.items():
        torch.cuda.set_rng_state(s, idx)


# ------------------------------------------------------------------- autocast state


@dataclass(frozen=True)
class AutocastState:
    entries: tuple[tuple[str, bool, torch.dtype], ...]
    cache_enabled: bool


def capture_autocast(device_types: Iterable[str]) -> AutocastState:
    entries = []
    for dt in sorted(set(device_types) | {"cpu"}):
        try:
            enabled = torch.is_autocast_enabled(dt)
            dtype = torch.get_autocast_dtype(dt)
        except (RuntimeError, TypeError):  # device type without autocast support
            continue
        entries.append((dt, bool(enabled), dtype))
    return AutocastState(tuple(entries), bool(torch.is_autocast_cache_enabled()))


def autocast_contexts(state: AutocastState, *, cache: bool = True) -> list[Any]:
    """The forward's autocast state, for a replay. ``cache=False`` turns autocast's weight
    cache off (NOTE [Autocast cache]): a replay under the serving mode then
    dispatches every cast, whatever casts the forward found cached, and a replay run
    inside the forward's context (backward under autocast) leaves no casts of its
    inputs, fresh leaves that require grad, held in that context's cache until it exits.
    A replay of compiled code keeps the forward's setting, which the compiled graph
    guards on (another setting would compile it again), and so does a replay of a
    forward that ran without autocast, where the setting decides nothing."""
    autocast_on = any(enabled for _, enabled, _ in state.entries)
    cache_enabled = state.cache_enabled and (cache or not autocast_on)
    return [
        torch.autocast(device_type=dt, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        for dt, enabled, dtype in state.entries
    ]


# ------------------------------------------------------------------- module state

# NOTE [Replay and module state]
# Replay reruns a region's forward, which may mutate module buffers a second time
# (BatchNorm's running statistics, a step counter). torch.utils.checkpoint lets that
# happen; we do not. At region entry the runtime records each buffer's version and clones
# the small ones. Buffers whose version changed during the forward were mutated by it; at
# replay their current (post-forward) values are set aside, the entry values are swapped
# in so the replay computes what the forward computed, and after the replay the
# post-forward values are put back. Large mutated buffers (over
# BUFFER_SNAPSHOT_MAX_BYTES) are not cloned at entry: replay then sees their post-forward
# value, which is logged once per region; their state after replay is still restored.


# NOTE [Replay and parameters]
# torch.func.functional_call (and torch.nn.utils.stateless) runs a module with other
# tensors in its parameter slots for the length of one call: meta-learning's fast
# weights, a hypernetwork's generated weights, an EMA teacher evaluated with the
# student's module. Backward runs after the call, when the module's own parameters are
# back, so a replay that read the slots would recompute with the wrong weights and
# return activations that silently differ from the forward's. At region entry the
# runtime records which tensor fills each parameter slot; a replay puts those tensors
# back into any slot that now holds another one, and the current ones afterwards. Only
# plain tensors are put back: FSDP2 swaps its sharded DTensor parameters for unsharded
# ones around each forward and backward, and for a block compiled in place the runtime
# sees the slots before FSDP2's hooks have run (the sharded DTensor is not what the
# forward read).
#
# A parameter modified in place between the forward and the replay (an optimizer that
# steps inside backward, torchtune's optimizer_in_bwd; or a user's own update) has lost
# the values the forward used. That is harmless when the replay stops before the ops
# that read it: an optimizer in backward only updates a parameter once its gradient is
# complete, i.e. after the backward of every op that used it, and the saves a later
# replay regenerates come from ops before those. So the check is by use, not by version:
# when a parameter's version moved since the forward returned, the replay runs under
# ParamGuard (trace/serving.py), which raises if an op it runs reads that parameter's storage.
# Compiled regions run their graph unseen by the guard, and are not checked.


@dataclass
class ParamState:
    slots: tuple[tuple[nn.Module, str], ...]
    """The region's parameter slots when the call entered."""
    objects: tuple[torch.Tensor | None, ...]
    """The tensor in each parameter slot at region entry."""
    entry_versions: tuple[int, ...] = ()
    """Their versions at region entry."""
    versions: tuple[int, ...] = ()
    """Their versions when the forward returned (``finish_params``)."""
    snapshots: dict[int, torch.Tensor] = field(default_factory=dict)
    """Slot -> the parameter's values before the forward wrote it in place (copied by the
    first call's watch; NOTE [State written by its region])."""
    unseen: list[int] = field(default_factory=list)
    """Slots the forward wrote with no copy taken before: a replay cannot be right."""
    requires_grad: tuple[bool, ...] = ()
    """Their ``requires_grad`` at region entry (a replay saves what the forward saved
    only with the same flags)."""

    def keep_copy(self, i: int) -> None:
        """Parameter ``i`` is about to be written by the forward: keep its values."""
        t = self.objects[i]
        if t is not None and i not in self.snapshots:
            self.snapshots[i] = t.detach().clone(memory_format=torch.preserve_format)


def _versions(objects: tuple[torch.Tensor | None, ...]) -> tuple[int, ...]:
    return tuple(-1 if t is None else int(t._version) for t in objects)


def capture_params(slots: tuple[tuple[nn.Module, str], ...]) -> ParamState | None:
    """The tensor in each parameter slot (None when the region has no parameters)."""
    if not slots:
        return None
    objects = tuple(param_of(m, n) for m, n in slots)
    flags = tuple(t is not None and t.requires_grad for t in objects)
    return ParamState(slots, objects, _versions(objects), requires_grad=flags)


def finish_params(state: ParamState | None) -> list[int]:
    """Region forward returned: a replay must see the parameters as they are now. Returns
    the slots of plain parameters the forward wrote in place (a VQ codebook's running
    average kept in a frozen parameter; ``nn.Embedding(max_norm=...)`` renormalising)."""
    if state is None:
        return []
    state.versions = _versions(state.objects)
    written = [
        i
        for i, (t, a, b) in enumerate(zip(state.objects, state.entry_versions, state.versions))
        if a != b and type(t) in (torch.Tensor, nn.Parameter)
    ]
    state.unseen = [i for i in written if i not in state.snapshots]
    return written


def modified_params(state: ParamState) -> dict[int, str]:
    """Storages (data pointer -> description) of the parameters the forward used that were
    modified in place since it returned."""
    out: dict[int, str] = {}
    for (m, n), t, v in zip(state.slots, state.objects, state.versions):
        if t is not None and int(t._version) != v and type(t) in (torch.Tensor, nn.Parameter):
            out[int(t.untyped_storage().data_ptr())] = (
                f"parameter {n!r} of {type(m).__name__} (version {v} -> {int(t._version)})"
            )
    return out


@dataclass
class BufferState:
    slots: tuple[tuple[nn.Module, str], ...]
    """The region's buffer slots when the call entered."""
    objects: list[torch.Tensor | None]
    """The tensor in each slot at region entry."""
    versions: list[int]
    snapshots: list[torch.Tensor | None]
    mutated: list[int] | None = None  # slot indices, filled at region exit
    untouched: list[tuple[int, int]] | None = None
    """(slot index, version at region exit) of the buffers the forward left as they were,
    filled at region exit: a replay must not read one written since (``modified_buffers``)."""

    def strides(self) -> list[tuple[int, ...] | None]:
        """The strides of the buffers a replay reads: a buffer the forward changed as at
        entry (the replay restores it), any other as its slot holds it now."""
        out: list[tuple[int, ...] | None] = []
        for (m, n), b in zip(self.slots, self.objects):
            if b is None:
                b = buffer_of(m, n)
            out.append(b.stride() if b is not None and b.layout is torch.strided else None)
        return out


def capture_buffers(slots: tuple[tuple[nn.Module, str], ...]) -> BufferState | None:
    if not slots:
        return None
    objects = [buffer_of(m, n) for m, n in slots]
    versions = [-1 if b is None else int(b._version) for b in objects]
    snaps: list[torch.Tensor | None] = []
    for b in objects:
        if b is not None and b.numel() * b.element_size() <= BUFFER_SNAPSHOT_MAX_BYTES:
            snaps.append(b.detach().clone())
        else:
            snaps.append(None)
    return BufferState(slots, objects, versions, snaps)


def finish_buffers(state: BufferState | None) -> None:
    """Region forward returned: find the buffer slots it mutated or reassigned.

    The version counter is not enough: BatchNorm updates its running statistics inside
    the kernel without bumping it, so small strided buffers are compared by value too.
    """
    if state is None:
        return
    mutated = []
    slots = state.slots
    for i, (m, n) in enumerate(slots):
        b = buffer_of(m, n)
        entry = state.objects[i]
        snap = state.snapshots[i]
        if b is not entry:
            mutated.append(i)  # reassigned (or set to None) by the forward
            continue
        if b is None:
            continue
        if int(b._version) != state.versions[i] or (
            snap is not None and b.layout == torch.strided and not torch.equal(snap, b.detach())
        ):
            mutated.append(i)
    state.mutated = mutated
    # Snapshots of buffers the forward did not touch are not needed for replay.
    untouched = []
    for i in range(len(slots)):
        if i not in mutated:
            b = state.objects[i]
            if b is not None:
                untouched.append((i, int(b._version)))
            state.snapshots[i] = None
            state.objects[i] = None
    state.untouched = untouched


def modified_buffers(state: BufferState) -> dict[int, str]:
    """Storages (data pointer -> description) of the buffers the forward read and left
    as they were that were written in place since it returned (an average a tensor hook
    updates in backward): a replay reading one would differ from the forward."""
    out: dict[int, str] = {}
    for i, v in state.untouched or ():
        m, n = state.slots[i]
        b = buffer_of(m, n)
        if b is not None and b.layout == torch.strided and int(b._version) != v:
            out[int(b.untyped_storage().data_ptr())] = (
                f"buffer {n!r} of {type(m).__name__} (version {v} -> {int(b._version)})"
            )
    return out
