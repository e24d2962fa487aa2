"""Regions: discovery, and what one region call captures so it can be replayed.

A region is a module whose forward can be rerun to regenerate dropped activations (a
transformer block). For every call of a region the runtime keeps:

* its inputs (positional and keyword, tensors and everything else, any nesting),
* the RNG state of the CPU and of every CUDA device in use,
* the autocast state,
* small snapshots of the region's buffers (so replay sees the values the forward saw and
  leaves module state exactly as the forward left it; buffers.py),
* the attribute bindings of the plain Python objects among its arguments, when its
  forward changes them (a key/value cache; see NOTE [Stateful arguments]).

The capture of the arguments themselves is in arguments.py, of the state their objects
carry in arg_state.py.
"""

from __future__ import annotations

import enum
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from offrecomp import _torch_compat as tc
from offrecomp import host_rng
from offrecomp.changes import structure_epoch
from offrecomp.host_rng import Slot as RngSlot
from offrecomp.params import ParamData

if TYPE_CHECKING:
    from offrecomp.arg_state import Position


#: The name of a region that is the model itself (``regions=`` naming its class).
MODEL_NAME = "<model>"

log = logging.getLogger(__name__)

__all__ = [
    "MODEL_NAME",
    "Region",
    "buffer_of",
    "capture_autocast",
    "check_region_spec",
    "compiled_module",
    "discover_regions",
    "has_lazy_parameters",
    "named_modules",
    "storage_ptrs",
    "tensor_attrs",
    "param_of",
]

#: Snapshots of buffers a forward only read are kept for its replay up to this size
#: (NOTE [Buffers written unseen]), and so are copies of the tensors from outside its
#: call it read (NOTE [State read from outside] in call_state.py).
READ_SNAPSHOT_MAX_BYTES = 64 << 10
#: Calls of a variable region in a row, seen with the hooks on, that saved no more than
#: its profile, after which its audits come at the usual cadence (``Region.settled``;
#: NOTE [Sizes of regions that vary] in planning/differences.py).
SETTLED = 8


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
    generator_slots: tuple[RngSlot, ...] = ()
    """Attributes of its modules that held a generator at its first call's exit: a
    generator assigned there later is captured too (NOTE [Private generators])."""
    host_rng: int = 0
    """The global RNGs of Python and numpy its forward was seen drawing from, as
    ``host_rng.PY | host_rng.NUMPY`` bits, and ``host_rng.PRIVATE`` once a call held RNG
    objects of their own (NOTE [Host random states])."""
    host_calls: int = 0
    """Its calls that took a replay checkpoint (some compare their host random states)."""
    rng_slots: tuple[RngSlot, ...] | None = None
    """Attributes of its modules that held Python's or numpy's RNG objects at its first
    call (``host_rng.private_slots``); None before."""
    writes_state: bool | None = None
    """Its forward writes its own inputs or parameters in place; None until a call has
    shown whether it does (NOTE [State written by its region])."""
    mode_sensitive: bool | None = None
    """True once a planned call, or a second calibration call (NOTE [Calibration sizes]
    in planning/differences.py), saved other storages than its recording: its code may
    behave otherwise under a dispatch mode, so every call runs under one (NOTE [Replay],
    step 7) and saves what the recorder saw; False once a call under one differed too
    (its saves depend on the data), for good; None before."""
    mismatches: int = 0
    """Planned calls of it that saved other storages than their recording."""
    variable: bool = False
    """Its saves changed from pass to pass more than once (code that branches on the
    data): no one recording describes its calls, which are placed by position and replay
    plainly from then on (NOTE [Regions that vary] in placement.py)."""
    settled: int = 0
    """Calls of it, seen with the hooks on since it varies, in a row that saved no more
    than its profile (NOTE [Sizes of regions that vary] in planning/differences.py)."""
    external_reads: tuple[weakref.ref[torch.Tensor], ...] = ()
    """Tensors from outside its calls that its first call read (NOTE [State read from
    outside] in call_state.py): each later call notes their versions and copies the small ones."""
    arg_writes: frozenset[Position] = frozenset()
    """Positions of the tensors among its calls' argument state that a forward wrote in
    place (NOTE [State written by the forward] in arg_state.py): copied at each call's
    entry from then on."""
    collective: bool = False
    """A call of it issued a collective (NOTE [Collective regions] in diagnostics.py):
    auto plans it unreplayable."""
    untracked_state: bool | None = None
    """Its calls take argument objects with more state than the runtime tracks: True
    once a call changed it (never replayed from then on), False once a call left it as
    it was; None before (NOTE [Stateful arguments])."""
    grad_off: bool = False
    """A call of it ran with gradients off inside a root forward that trains (NOTE
    [Regions with gradients off] in diagnostics.py): autograd saved nothing of it."""
    traced: bool = False
    """Dynamo traced a call of it into a compiled caller's graph (NOTE [Compiled regions]):
    such calls are the graph's, no region call of the runtime's."""
    guarded_attrs: frozenset[str] = frozenset()
    """Attributes its forward sets only outside a replay: its replays take their exit
    values at their first ``in_replay()`` (NOTE [Module attributes] in changes.py)."""
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
    changes_attrs: bool = False
    """A call's forward changed a module attribute (NOTE [Module attributes] in changes.py)."""
    attr_tables: list[dict[str, Any]] | None = None
    """Its modules' attribute tables at its last call's entry, where they hold no graph
    (NOTE [Attributes at entry] in attr_tables.py)."""
    attr_containers: tuple[tuple[int, str], ...] = ()
    """The plain dicts, lists and sets among those attributes: (module index, name)."""
    attr_contents: list[tuple[Any, Any]] | None = None
    """Those containers and copies of their contents at its last call's entry."""
    tensor_attrs: tuple[tuple[nn.Module, str], ...] = ()
    """Its modules' plain attributes holding a tensor that is not one of its parameters or
    buffers (NOTE [Attributes written after the first call] in call_state.py)."""
    made_state: tuple[weakref.ref[torch.Tensor], ...] = ()
    """Tensors its watched call made that outlived the call, neither saved by it nor its
    modules' parameters or buffers (NOTE [Attributes written after the first call])."""
    param_data: ParamData = field(default_factory=ParamData)
    """The geometry of the storages its parameter slots showed (NOTE [Replay and
    parameters] in params.py)."""
    epoch: int = -1
    """``structure_epoch()`` when it was last read (NOTE [Region refresh] in changes.py)."""
    tree: tuple[tuple[nn.Module, tuple[tuple[str, Any], ...]], ...] = ()
    """Its modules with the children each held, by name, when it was last read: what a
    replay of a call from then runs with (NOTE [Children at entry] in replay_state.py)."""
    children_at: int = -1
    """``Lifecycle.parts_begun`` when a call last compared its modules' children with
    ``children`` (NOTE [Region refresh] in changes.py)."""

    def refresh(self) -> None:
        """Read the slots and the compiled flags again: a block may gain modules (LoRA
        adapters injected) or be compiled after the runtime was built (torchtune
        compiles its layers in place)."""
        self.epoch = structure_epoch()
        mods = tuple(self.module.modules())
        param_slots = tuple((sub, n) for sub in mods for n in sub._parameters.keys())  # noqa: SIM118
        if mods != self.modules or param_slots != self.param_slots:
            # another forward (an adapter added, merged away): what earlier calls showed
            # of its saves no longer says anything about it
            self.mismatches = 0
            self.variable = False
            self.settled = 0
            self.param_data = ParamData()
        self.modules = mods
        self.tree = tuple((m, tuple(m._modules.items())) for m in mods)
        self.slots = tuple((sub, n) for sub in mods for n in sub._buffers.keys())  # noqa: SIM118 (a ScriptModule's buffers iterate by index)
        self.param_slots = param_slots
        self.in_place = _compiled_in_place(self.module)
        self.compiled_self = _is_compiled(self.module) or self.in_place
        self.compiled = any(map(compiled_module, mods))
        self.lazy = has_lazy_parameters(mods)
        self.tensor_attrs = tensor_attrs(mods, [m.__dict__ for m in mods])

    @property
    def children(self) -> list[Any]:
        """The children its modules held when it was last read, in order: what a call
        compares with ``module_children`` (NOTE [Region refresh] in changes.py)."""
        return [c for _, items in self.tree for _, c in items]

    @property
    def buffers(self) -> tuple[torch.Tensor, ...]:
        """The region's buffers as they are now (a slot set to None is skipped)."""
        return tuple(b for b in (buffer_of(m, n) for m, n in self.slots) if b is not None)

    def buffer_at(self, slot: int) -> torch.Tensor | None:
        """The buffer in ``slots[slot]`` now (None: the slot holds none)."""
        return buffer_of(*self.slots[slot])

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


def check_region_spec(
    spec: type | Iterable[type] | Callable[[nn.Module, str], bool] | None,
) -> type | tuple[type, ...] | Callable[[nn.Module, str], bool] | None:
    """``regions=`` checked for its shape, without a model: TypeError naming it and the
    accepted forms unless None, a module type, a non-empty iterable of module types or a
    filter ``fn(module, qualified_name) -> bool``. Returns it as given, an iterable as a
    tuple of its types (so one it reads once, a generator, is read here only)."""
    if isinstance(spec, nn.Module):  # callable, but not a filter
        raise TypeError(
            f"regions= got a module instance ({type(spec).__name__}); accepted: None, a module "
            f"type (regions={type(spec).__name__}), a list of module types, or "
            "fn(module, qualified_name) -> bool (lambda m, name: m is block, for one module)"
        )
    if isinstance(spec, type) and not issubclass(spec, nn.Module):
        raise TypeError(
            f"regions={spec.__name__} is invalid (not an nn.Module subclass); accepted: None, a "
            "module type, a list of module types, or fn(module, qualified_name) -> bool"
        )
    if spec is None or isinstance(spec, type) or callable(spec):
        return spec
    try:
        types = tuple(spec)
    except TypeError:
        raise TypeError(
            f"regions={spec!r} is invalid; accepted: None, a module type, a list of module "
            "types, or fn(module, qualified_name) -> bool"
        ) from None
    if not types or not all(isinstance(t, type) and issubclass(t, nn.Module) for t in types):
        why = "it names no module type" if not types else "not every entry is a module type"
        raise TypeError(
            f"regions={spec!r} is invalid ({why}); accepted: None, a module type, a non-empty "
            "list of module types, or fn(module, qualified_name) -> bool"
        )
    return types


def discover_regions(
    model: nn.Module,
    spec: type | Iterable[type] | Callable[[nn.Module, str], bool] | None,
) -> list[Region]:
    """Find the regions of ``model``.

    ``spec`` None: the repeated children of every ``nn.ModuleList``/``nn.Sequential`` (a
    child whose class occurs at least twice among its siblings), and of an
    ``nn.ModuleDict`` where nothing inside them is one (see _pick_repeated_children), with
    the children of ``nn.ModuleList``s whose class two lists hold (NOTE [Blocks in lists
    of one]); where none repeats, the children of every ``nn.ModuleList`` (NOTE [Stacks
    without repeats]);
    in both, modules of one op never (NOTE [One-op modules]);
    with no such list, repeated blocks held as attributes (NOTE [Blocks held as
    attributes]). A type or types: every module of those types. A callable: every module for which
    ``fn(module, name)`` is true. Only the outermost match counts: regions never nest.
    """
    checked = check_region_spec(spec)
    if checked is None:
        pick = _pick_repeated_children(model)
    elif isinstance(checked, (type, tuple)):
        types = checked if isinstance(checked, tuple) else (checked,)
        pick = {id(m) for _, m in named_modules(model) if isinstance(m, types)}
    else:
        fn = checked
        pick = set()
        for name, m in named_modules(model):
            try:
                if fn(m, name):
                    pick.add(id(m))
            except Exception as exc:
                raise TypeError(
                    f"regions= filter {getattr(fn, '__name__', fn)!r} raised {exc!r} for module "
                    f"{name!r}; it must be fn(module, qualified_name) -> bool"
                ) from exc

    regions: list[Region] = []
    seen: set[int] = set()

    # depth first, children in order, as a recursion would; not a recursive closure, which
    # holds itself through its cell: a reference cycle, holding the regions and so the
    # model's blocks until the collector runs
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, m = stack.pop()
        if id(m) in pick:
            if id(m) not in seen:  # a shared module is one region
                seen.add(id(m))
                prefix, inner = _unwrap_fsdp1(prefix, m)
                region = Region(prefix or MODEL_NAME, inner, ())
                region.refresh()
                regions.append(region)
            continue  # regions never nest
        stack.extend(reversed([(_child_name(prefix, m, name), child) for name, child in m.named_children()]))
    return regions


def named_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``model.named_modules()``, each module named as it is in the model without
    torch.compile: a ``torch.compile(module)`` wrapper holds the module it compiles as
    ``_orig_mod``, a component its names leave out (``_orig_mod.blocks.0`` is
    ``blocks.0``, ``blocks.0._orig_mod.attn`` is ``blocks.0.attn``), so the wrapper and
    the module inside share one name. So a region has one name whether the model is
    compiled or not, and so do the keys ``set_plan()`` takes, the names ``explain()``,
    the reports and the logs give, and those a ``regions=`` filter is called with;
    ``get_submodule`` still finds a module by such a name (a wrapper hands the
    attributes it lacks on to the module inside)."""
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        yield prefix, m
        children = [(_child_name(prefix, m, n), c) for n, c in m._modules.items() if c is not None]
        stack.extend(reversed(children))  # depth first, in order, as named_modules() goes


def _child_name(prefix: str, parent: nn.Module, name: str) -> str:
    """The name of ``parent``'s child ``name`` under ``named_modules``' rule."""
    if name == "_orig_mod" and _is_compiled(parent):
        return prefix
    return f"{prefix}.{name}" if prefix else name


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
    """The blocks of ``model`` held in containers, else as attributes; where there are
    none, its small modules, held in containers, else as attributes (NOTE [One-op
    modules])."""
    return (
        _in_containers(model, _Kind.BLOCK)
        or _repeated_attributes(model, _Kind.BLOCK)
        or _in_containers(model, _Kind.SMALL)
        or _repeated_attributes(model, _Kind.SMALL)
    )


class _Kind(enum.Enum):
    """What a module is to region discovery (NOTE [One-op modules])."""

    BLOCK = "block"  # holds modules beyond one of torch's layers, or is torch's attention or recurrent layer
    SMALL = "small"  # of the model's own code: no children, or just one of torch's layers
    ONE_OP = "one op"  # one of torch's layers, or a torch container holding just one


def _kind(m: nn.Module) -> _Kind:
    if isinstance(m, (nn.RNNBase, nn.RNNCellBase)):
        return _Kind.BLOCK
    inner = [x for _, x in zip(range(2), (x for x in m.modules() if x is not m))]
    if inner and (len(inner) > 1 or _kind(inner[0]) is not _Kind.ONE_OP):
        return _Kind.BLOCK
    if not type(m).__module__.startswith("torch.nn."):
        return _Kind.SMALL
    # torch's: a layer, or a Sequential around one; nn.MultiheadAttention holds only its
    # out_proj beside raw projections and is a block
    return _Kind.ONE_OP if not inner or isinstance(m, nn.Sequential) else _Kind.BLOCK


def _in_containers(model: nn.Module, kind: _Kind) -> set[int]:
    """Children of ``kind`` whose class repeats among their siblings in an
    ``nn.ModuleList`` or ``nn.Sequential`` (also one module held several times, as
    ALBERT's shared layer; the outermost win: regions never nest), and in an
    ``nn.ModuleDict``, which holds a model's layers (torchtitan) but also whole models
    (a runtime over two models): its repeated children count only when nothing inside
    them does, as do the unlike children of ``kind`` beside repeated ones in an
    ``nn.ModuleList`` (a hybrid's layers), and the children of ``kind`` of
    ``nn.ModuleList``s whose class other lists hold too (NOTE [Blocks in lists of
    one]). Where none repeats, the children of ``kind``
    of every ``nn.ModuleList``, and of every ``nn.ModuleDict`` one holds (NOTE [Stacks
    without repeats])."""
    pick: set[int] = set()
    keyed: list[nn.Module] = []
    stacked: set[int] = set()
    layer_dicts = {  # a stack's layers, each its parts by name (rtdl's FT-Transformer)
        id(c) for m in model.modules() if isinstance(m, nn.ModuleList)
        for c in m._modules.values() if isinstance(c, nn.ModuleDict)
    }
    for m in model.modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential, nn.ModuleDict)):
            continue
        by_type: dict[type, list[nn.Module]] = {}
        for child in m._modules.values():  # not children(): one block held n times repeats
            # a ModuleList or ModuleDict is never called (x-transformers keeps each layer's
            # norm, block and residual in one): what it holds is looked at on its own
            if child is not None and not isinstance(child, (nn.ModuleList, nn.ModuleDict)) and _kind(child) is kind:
                by_type.setdefault(type(child), []).append(child)
        if isinstance(m, nn.ModuleList) or id(m) in layer_dicts:
            stacked.update(id(c) for same in by_type.values() for c in same)
        repeats = any(len(same) >= 2 for same in by_type.values())
        for same in by_type.values():
            if len(same) >= 2:
                if isinstance(m, nn.ModuleDict):
                    keyed += same
                else:
                    pick.update(id(c) for c in same)
            elif repeats and isinstance(m, nn.ModuleList):  # NOTE [Stacks without repeats]: a hybrid's
                keyed += same
    candidates = pick | {id(c) for c in keyed}
    pick.update(id(c) for c in keyed if not any(id(x) in candidates for x in c.modules() if x is not c))
    return (pick | _across_lists(model, kind, pick)) if pick else stacked


def _across_lists(model: nn.Module, kind: _Kind, pick: set[int]) -> set[int]:
    """NOTE [Blocks in lists of one]: children of ``kind`` of ``nn.ModuleList``s whose
    class (for a Sequential, with the classes inside) is held by two lists or
    more, or twice by one, where none of ``pick`` lies inside them."""
    by_type: dict[Any, list[nn.Module]] = {}
    seen: set[int] = set()
    for m in model.modules():
        if not isinstance(m, nn.ModuleList):
            continue
        for child in m._modules.values():
            inner = _wrapped(child) if child is not None else None
            if inner is None or id(child) in seen or isinstance(inner, (nn.ModuleList, nn.ModuleDict)):
                continue
            seen.add(id(child))
            if _kind(inner) is kind:
                by_type.setdefault(_class_key(inner), []).append(child)
    return {
        id(c) for same in by_type.values() if len(same) >= 2
        for c in same if not any(id(x) in pick for x in c.modules() if x is not c)
    }


def _class_key(m: nn.Module) -> Any:
    """What makes two modules the same block to discovery: their class, and for torch's
    Sequential the classes it holds."""
    if isinstance(m, nn.Sequential):
        return (type(m), *(type(x) for x in m._modules.values()))
    return type(m)


def _repeated_attributes(model: nn.Module, kind: _Kind) -> set[int]:
    """NOTE [Blocks held as attributes]: children of ``kind`` of any module that repeat
    among their siblings: the same class, and for torch's containers the same classes
    inside (a ResNet's one-block stages, not a model's features and classifier);
    lists and dicts of modules aside."""
    pick: set[int] = set()
    for m in model.modules():
        by_type: dict[Any, list[nn.Module]] = {}
        for child in m._modules.values():
            if child is None:
                continue
            inner = _wrapped(child)
            if not isinstance(inner, (nn.ModuleList, nn.ModuleDict)) and _kind(inner) is kind:
                by_type.setdefault(_class_key(inner), []).append(child)
        for same in by_type.values():
            if len(same) >= 2:
                pick.update(id(c) for c in same)
    return pick


def _wrapped(m: nn.Module) -> nn.Module:
    """The block inside a ``torch.compile`` wrapper or an FSDP1 unit (whose own classes
    are torch's), else ``m``."""
    inner = m._modules.get("_orig_mod") if _is_compiled(m) else _unwrap_fsdp1("", m)[1]
    return inner if isinstance(inner, nn.Module) else m


# NOTE [Stacks without repeats]
# A model with no repeated blocks may still hold its layers in an nn.ModuleList: ALBERT
# keeps one layer group and calls it once per layer (num_hidden_groups=1), a model
# configured with one layer holds one block, and a hybrid with few layers (Jamba's Mamba
# and attention layers) holds one of each class. Where nothing repeats, the children of
# every ModuleList are regions (outermost wins), and those of every ModuleDict a
# ModuleList holds (a layer's parts by name, called by the model's forward: rtdl's
# FT-Transformer, as a ModuleList of ModuleLists is x-transformers'): a shared one's
# calls are region calls as any shared block's are; otherwise such a model would have
# no region, and nothing could be recomputed. For the same reason, in a ModuleList where some class repeats,
# its unlike siblings of the same kind are regions too, where no region lies inside
# them: a hybrid configured with a few layers (Zamba2's one hybrid layer among its Mamba
# layers, Jamba's one attention layer) holds them in one stack, and a layer left out
# would keep all it saves. A ModuleList holds a stack of layers far more often than a Sequential
# without repeats does (a pipeline of unlike stages, or a wrapper around a whole model,
# whose replay would rerun every op), which stays as it is.


# NOTE [Blocks in lists of one]
# A model may hold its blocks one to a list, across many lists: diffusers' UNet with
# layers_per_block=1 gives each down block a list of one ResnetBlock2D and (with cross
# attention) one of one Transformer2DModel, its down blocks are of unlike classes, and
# its mid block holds one attention block; the up blocks hold two of each, the mid block
# two residual blocks. Counted among siblings only, the blocks of the up path repeat and
# those of the down path and the mid block's attention do not: kept whole, they leave
# recompute holding 62% of keep's activations on a small UNet, against 29% as regions
# (docs/results/cpu-2026-12-06k). So where some class repeats among siblings, a class
# whose children of ModuleLists number two or more across the model, in lists of one
# or not, repeats too: each of those children is a region, unless a region found among
# siblings lies inside it (a stage holding repeated blocks, in a list of one, leaves
# them the regions), and outermost wins among the rest (a Transformer2DModel in a list
# of one over the BasicTransformerBlock in its own list of one). Only blocks count (NOTE
# [One-op modules]): Linear layers, norms and embeddings held one to a list are never
# regions, and torch's Sequentials count as one class only with the same classes
# inside. Sequentials of one, the stages of a ResNet with one block each, are left to
# NOTE [Blocks held as attributes] as a Sequential of unlike stages is left out of
# NOTE [Stacks without repeats]. Where nothing repeats among siblings, the stacks of
# that note stand: every ModuleList child, the outermost.


# NOTE [One-op modules]
# A region pays for its bookkeeping at every call (its inputs captured, its RNG and
# module state, a replay's entry), and saves only what its forward saves beyond its
# inputs and outputs, which a replay cannot drop: its inputs are held for the replay and
# its outputs are the next region's inputs. One of torch's layers saves nothing else (a
# Linear its input, a ReLU its output) or little (a norm's statistics, a dropout mask).
# Yet models repeat such layers among their siblings all the time: an MLP is a
# Sequential of two Linear layers, a patch embedding a Sequential of two LayerNorms and
# a Linear, a VGG stage convs and ReLUs, x-transformers a ModuleList of norms per layer.
# Taken as regions, they would be all the regions found where the blocks themselves do
# not repeat among their siblings (vit-pytorch and x-transformers keep theirs in a
# ModuleList of [attention, feedforward] per layer), and nothing could be recomputed.
# So discovery sorts modules in three kinds:
# - one op: one of torch's layers without children, or a torch container holding just
#   one (a Sequential around a LayerNorm). Never a region unless named with regions=.
# - small: a module of the model's own code without children (a chain of functional
#   ops, an einops Rearrange, an attention written with raw parameters) or holding just
#   one of torch's layers (a norm around an nn.LayerNorm, as x-transformers keeps per
#   layer; a block of one Linear and a few functional ops).
# - block: any other module holding modules (nn.MultiheadAttention, which holds its
#   out_proj beside raw projections, too), or one of torch's recurrent layers or cells
#   (an LSTM's forward saves each step's gates).
# The container tiers and the attributes tier look for blocks; only where none finds
# any do the container tiers look for small modules, which may be blocks written with
# few submodules or may be glue, as a model without blocks has nothing better to offer.


# NOTE [Blocks held as attributes]
# Where no container holds a block, a model may still repeat blocks as attributes: timm's
# RegNet holds its stages as s1..s4 and each stage's blocks as b1, b2, ...; DLA holds its
# levels as level0..level5; a ResNet with one block per stage holds its stages as
# layer1..layer4 (Sequentials); hand-written models hold block1, block2. Where neither
# of the tiers above finds a region, the children of any module whose class repeats
# among their siblings are regions (outermost wins), if they are blocks (NOTE [One-op
# modules]): two nn.Linear siblings are a layer's projections, not blocks, and a module
# without children of the model's own may be one op, which a region's bookkeeping would
# cost more than its replay saves. Lists and dicts of modules are never called. A
# compiled block (``torch.compile(block)``) or an FSDP1 unit counts by the block it
# wraps.


# ------------------------------------------------------------------------ RNG state


@dataclass
class RngState:
    cpu: torch.Tensor
    cuda: dict[int, torch.Tensor]
    host: host_rng.HostStates | None = None
    """Python's and numpy's, where the region draws from them (NOTE [Host random states])."""
    probe: host_rng.HostStates | None = None
    """Both global host states at entry, for the call's exit to compare with (NOTE [Host
    random states]): on a region's probed calls only."""


# NOTE [Shared CPU generator states]
# The CPU generator's state is 5,056 bytes, copied at every region call that may replay,
# and held until the call is released: 81 KB for 16 calls of a small spiking network,
# where its activations were 85 KB, and in no book. A call whose forward draws nothing
# leaves the state as the next call finds it, so a state equal to the last one captured
# is that tensor, shared (a replay only reads it). Its bytes are kept beside it, so a
# call reads the state's bytes once to compare.
_last_cpu_state: list[tuple[torch.Tensor, bytes] | None] = [None]


def _cpu_state() -> torch.Tensor:
    """The CPU generator's state, the last one captured where equal (NOTE [Shared CPU
    generator states])."""
    state = torch.get_rng_state()
    now = state.numpy().tobytes()  # torch.equal takes twice as long
    last = _last_cpu_state[0]
    if last is not None and last[1] == now:
        return last[0]
    _last_cpu_state[0] = (state, now)
    return state


def capture_rng(devices: Iterable[torch.device], host: int = 0, private: Iterable[Any] = ()) -> RngState:
    """torch's generator states for ``devices``, the global host ones ``host`` names
    (``Region.host_rng``) and those of the ``private`` RNG objects."""
    cuda: dict[int, torch.Tensor] = {}
    for d in devices:
        if d.type == "cuda":
            idx = d.index if d.index is not None else torch.cuda.current_device()
            if idx not in cuda:
                cuda[idx] = torch.cuda.get_rng_state(idx)
    return RngState(_cpu_state(), cuda, host_rng.capture(host, private) if host or private else None)


def restore_rng(state: RngState) -> None:
    torch.set_rng_state(state.cpu)
    for idx, s in state.cuda.items():
        torch.cuda.set_rng_state(s, idx)
    if state.host is not None:
        host_rng.restore(state.host)


# ------------------------------------------------------------------- autocast state


@dataclass(frozen=True)
class AutocastState:
    entries: tuple[tuple[str, bool, torch.dtype], ...]
    cache_enabled: bool


#: The device types ``capture_autocast`` reads for a set of the call's (sorted, "cpu" added).
_AUTOCAST_TYPES: dict[frozenset[str], tuple[str, ...]] = {}
#: One AutocastState per state seen (frozen: calls share it).
_AUTOCAST_STATES: dict[tuple[tuple[tuple[str, bool, torch.dtype], ...], bool], AutocastState] = {}


def capture_autocast(device_types: Iterable[str]) -> AutocastState:
    """Autocast's state now for ``device_types`` and the CPU: read at every call that may
    replay (autocast may be entered between two calls), the object shared where equal."""
    key = frozenset(device_types)
    types = _AUTOCAST_TYPES.get(key)
    if types is None:
        types = _AUTOCAST_TYPES[key] = tuple(sorted(key | {"cpu"}))
    entries = []
    for dt in types:
        try:
            enabled = torch.is_autocast_enabled(dt)
            dtype = torch.get_autocast_dtype(dt)
        except (RuntimeError, TypeError):  # device type without autocast support
            continue
        entries.append((dt, bool(enabled), dtype))
    found = (tuple(entries), bool(torch.is_autocast_cache_enabled()))
    state = _AUTOCAST_STATES.get(found)
    if state is None:
        if len(_AUTOCAST_STATES) > 64:
            _AUTOCAST_STATES.clear()
        state = _AUTOCAST_STATES[found] = AutocastState(*found)
    return state


def autocast_as_now(state: AutocastState) -> bool:
    """Autocast is off in the forward's state and now, for each of its device types, with
    the same dtype and weight cache settings (which an autocast a block enters itself
    takes as its defaults): a replay needs no autocast context."""
    if torch.is_autocast_cache_enabled() != state.cache_enabled:
        return False
    return not any(
        enabled or torch.is_autocast_enabled(dt) or torch.get_autocast_dtype(dt) != dtype
        for dt, enabled, dtype in state.entries
    )


def autocast_contexts(state: AutocastState, *, cache: bool = True) -> list[Any]:
    """The forward's autocast state, for a replay. ``cache=False`` turns autocast's weight
    cache off (NOTE [Autocast cache]), for a replay inside another autocast context
    (backward under autocast): it then dispatches every cast, whatever casts that
    context's cache holds, and leaves no casts of its leaf inputs held there until the
    context exits.
    A replay of compiled code keeps the forward's setting, which the compiled graph
    guards on (another setting would compile it again), and so does a replay of a
    forward that ran without autocast, where the setting decides nothing."""
    autocast_on = any(enabled for _, enabled, _ in state.entries)
    cache_enabled = state.cache_enabled and (cache or not autocast_on)
    return [
        torch.autocast(device_type=dt, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        for dt, enabled, dtype in state.entries
    ]


# ------------------------------------------------------------- tensors of modules


def storage_ptrs(tensors: Iterable[torch.Tensor | None]) -> set[int]:
    """The data pointers of the plain tensors among ``tensors``. Sharded parameters
    (FSDP2's DTensor) have no plain storage: skipped."""
    return {
        int(t.untyped_storage().data_ptr())
        for t in tensors
        if t is not None and type(t) in (torch.Tensor, nn.Parameter) and t.layout == torch.strided
        and t.device.type != "meta"
    }


def tensor_attrs(modules: tuple[nn.Module, ...], tables: list[dict[str, Any]]) -> tuple[tuple[nn.Module, str], ...]:
    """The plain attributes (``tables``: each module's attribute table) that hold a tensor
    other than the modules' parameters and buffers, or a view of one (NOTE [Attributes
    written after the first call] in call_state.py)."""
    found = [
        (m, n, v) for m, table in zip(modules, tables) for n, v in table.items()
        if type(v) is torch.Tensor and v.layout == torch.strided
    ]
    if not found:
        return ()
    own = storage_ptrs(t for m in modules for t in (*m._parameters.values(), *m._buffers.values()))
    return tuple((m, n) for m, n, v in found if int(v.untyped_storage().data_ptr()) not in own)
