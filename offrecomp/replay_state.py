"""The state a replay runs under, as its forward found it: parameters, the train flags,
hooks, the default dtype, object arguments' state and tensors read or written from
outside the call (NOTE [Replay] in replay.py). Each context puts back what it found."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from offrecomp import _torch_compat as tc
from offrecomp.arg_state import ArgState, holding
from offrecomp.arguments import arguments_in_state, arguments_with, state_links
from offrecomp.buffers import modified_buffers
from offrecomp.changes import (
    drop_hooks_since,
    forward_hooks,
    forward_hooks_as,
    forward_hooks_moved,
    hide_hooks,
    hook_ids,
    hook_snapshot,
    restore_hooks,
    restore_tree,
    same_entries,
    tree_snapshot,
)
from offrecomp.diagnostics import log_once, named
from offrecomp.params import ParamState, data_at_entry, modified_params
from offrecomp.regions import param_of
from offrecomp.state import RegionCall
from offrecomp.trace import ParamGuard
from offrecomp.trace.recorder import EXTERNAL_COPY_MAX_BYTES

__all__ = [
    "default_dtype_as_forward",
    "entry_arg_state",
    "external_as_entry",
    "children_as_forward",
    "hooks_as_found",
    "param_guard",
    "params_as_arguments",
    "reads_as_forward",
    "state_as_found",
    "swap_params",
    "training_as_forward",
]


@contextlib.contextmanager
def swap_params(call: RegionCall, entry: ParamState) -> Iterator[None]:
    """NOTE [Replay and parameters]: the replay runs with the parameters the forward ran
    with (``entry``, the call's), and their ``requires_grad`` as it was; the slots and
    flags are as they were before it afterwards."""
    slots = entry.slots
    if entry.unseen:
        m, n = slots[entry.unseen[0]]
        raise RuntimeError(
            f"offrecomp: region {call.name!r} wrote parameter {n!r} of {type(m).__name__} in "
            "place in its forward, and no copy of its values from before was taken (NOTE "
            "[State written by its region]), so a replay cannot compute what the forward "
            "computed. Hint: keep such state in a buffer, or keep this region (regions=)."
        )
    tables: list[tuple[nn.Module, dict[str, Any], dict[str, Any]]] = []
    swapped: list[tuple[nn.Module, str, torch.Tensor | None]] = []
    flipped: list[tuple[torch.Tensor, bool]] = []
    try:
        _tables_as_entry(call, slots, entry.objects, tables)  # NOTE [Parameter tables changed since the forward]
        # requires_grad switched since the forward: as it was for the replay, then as before it
        for p, flag in zip(entry.objects, entry.requires_grad):
            if p is not None and p.is_leaf and p.requires_grad != flag:
                flipped.append((p, p.requires_grad))
                p.requires_grad_(flag)
        for i, ((m, n), t) in enumerate(zip(slots, entry.objects)):
            now = param_of(m, n)
            before = entry.snapshots.get(i)
            # written by the forward: the replay writes a fresh copy of the values before;
            # its storage replaced since (``.data =``): the replay reads the one held
            fresh = before.clone(memory_format=torch.preserve_format) if before is not None else data_at_entry(entry, i)
            if fresh is not None and t is not None:
                swapped.append((m, n, now))
                fresh = fresh.requires_grad_(t.requires_grad)
                if isinstance(t, nn.Parameter):
                    fresh = nn.Parameter(fresh, requires_grad=t.requires_grad)
                m._parameters[n] = fresh  # type: ignore[assignment]
            elif now is not t and type(t) in (torch.Tensor, nn.Parameter):
                swapped.append((m, n, now))
                m._parameters[n] = t  # type: ignore[assignment]  # functional_call puts plain tensors here too
        yield
    finally:
        for m, n, now in reversed(swapped):
            m._parameters[n] = now  # type: ignore[assignment]
        for m, table, shadows in reversed(tables):
            m._parameters.clear()
            m._parameters.update(table)
            m.__dict__.update(shadows)
        for p, was in flipped:  # set, not toggled: the replay may switch it again (detach_())
            p.requires_grad_(was)


# NOTE [Parameter tables changed since the forward]
# Code between a forward and its backward may change which parameters a module of the
# region holds: ``prune.l1_unstructured`` moves ``weight`` to ``weight_orig`` and sets a
# plain ``weight`` attribute (which a pre-hook computes at each call), ``prune.remove``
# does the reverse, a parametrization makes ``weight`` a property. Plain autograd's graph
# holds what the forward read; a replay reads the module. So a replay of a call whose
# modules' parameter tables hold other names than at its entry runs with each such table
# as at the entry (the entry's objects under the entry's names, none other), and an
# instance attribute shadowing an entry parameter (prune's plain ``weight``) out of the
# way; both are put back exactly as found after it. A name the module's class now makes a
# property of (a parametrization registered since) cannot be given the entry's tensor: an
# error names it (register it between steps).


def _tables_as_entry(
    call: RegionCall, slots: tuple[tuple[nn.Module, str], ...], objects: tuple[torch.Tensor | None, ...],
    out: list[tuple[nn.Module, dict[str, Any], dict[str, Any]]],
) -> None:
    """Set the parameter tables of ``call``'s modules to their entry names and objects
    where they changed since (NOTE [Parameter tables changed since the forward]),
    appending to ``out`` each module, its table and the attributes taken out of the way,
    to put back. Raises before changing any where one cannot be set so."""
    names: dict[int, tuple[nn.Module, dict[str, torch.Tensor | None]]] = {}
    for (m, n), t in zip(slots, objects):
        names.setdefault(id(m), (m, {}))[1][n] = t
    changed = [  # a ScriptModule's table is a wrapper its script owns: never changed so
        (m, entry) for m, entry in names.values() if isinstance(m._parameters, dict) and m._parameters.keys() != entry.keys()
    ]
    for m, entry in changed:
        for n, t in entry.items():
            if t is not None and isinstance(getattr(type(m), n, None), property):
                raise RuntimeError(
                    f"offrecomp: region {call.name!r}: parameter {n!r} of {type(m).__name__} became a property "
                    "(a parametrization registered) between the forward and its backward, so a replay cannot "
                    "read the parameter the forward read. Hint: register parametrizations between steps, or "
                    "keep this region (regions=)."
                )
    for m, entry in changed:
        table = m._parameters
        out.append((m, dict(table), {n: m.__dict__[n] for n in entry if n in m.__dict__}))
        for n in entry:
            m.__dict__.pop(n, None)
        table.clear()
        table.update(entry)  # type: ignore[arg-type]  # functional_call puts plain tensors here too


def params_as_arguments(
    call: RegionCall, entry: ParamState, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """NOTE [Aliased arguments] (arguments.py): a tensor argument that was one of the
    region's parameters at the call's entry (``block(x, block.weight)``, a tied head
    handed the embedding's weight) is, in the replay, the tensor its slot holds there
    (``swap_params``); the arguments as they are otherwise."""
    cap = call.inputs
    if cap is None or not cap.ids:
        return args, kwargs
    ids = cap.ids
    slots = {ids[id(t)]: at for at, t in zip(entry.slots, entry.objects) if t is not None and id(t) in ids}
    if not slots:
        return args, kwargs
    now = {i: t for i, at in slots.items() if (t := param_of(*at)) is not None}  # a slot emptied since: as captured
    return arguments_with(cap, args, kwargs, now)


def param_guard(call: RegionCall) -> ParamGuard | None:
    """Stops a replay that reads a parameter, or a buffer its forward left as it was,
    written in place since the forward (NOTE [Replay and parameters])."""
    region = call.region
    if region is None or region.compiled:
        return None
    modified = modified_params(call.params) if call.params is not None else {}
    if call.buffers is not None:
        modified.update(modified_buffers(call.buffers))
    if call.arg_state is not None and call.inputs is not None:
        modified.update(call.arg_state.modified())  # NOTE [State written after the forward]
    if call.attr_writes:  # NOTE [Attributes written after the first call] (call_state.py)
        modified.update(call.attr_writes)
    for t, v, copy in call.external_reads or ():  # NOTE [State read from outside] (call_state.py)
        if copy is None and tc.version_of(t) != v:
            modified.setdefault(  # a write its call's exit saw says more
                int(t.untyped_storage().data_ptr()),
                f"a {tuple(t.shape)} tensor from outside the call (version {v} -> {tc.version_of(t)})",
            )
    return ParamGuard(call.name, modified) if modified else None


@contextlib.contextmanager
def reads_as_forward(call: RegionCall) -> Iterator[None]:
    """NOTE [State read from outside] (call_state.py): tensors from outside the call that its
    forward read hold the values it read while the replay runs (from their copies), and
    their values at the replay's start afterwards. One written since with a version bump
    is held as before; the others through ``.data``, which moves no version: a write
    through ``.data`` moved none either, and a version the replay moved would fail a
    save of the tensor elsewhere in the graph."""
    reads = [(t, v, copy) for t, v, copy in call.external_reads or () if copy is not None]
    if not reads:
        yield
        return
    moved = [tc.version_of(t) != v for t, v, _ in reads]
    bumped = [(t, copy) for (t, _, copy), m in zip(reads, moved) if m]
    unseen = [(t.data, copy) for (t, _, copy), m in zip(reads, moved) if not m]
    with holding(bumped), holding(unseen):
        yield


@contextlib.contextmanager
def state_as_found(call: RegionCall) -> Iterator[None]:
    """NOTE [State the first call made] (call_state.py): the tensors the watched call made
    and left alive hold, after its replay, the values they had before it; one larger than
    EXTERNAL_COPY_MAX_BYTES that the replay wrote is named in ``call.rewritten_state``
    (the caller raises: an early stop's unwinding swallows what its exits raise)."""
    with torch.no_grad():
        found = [
            (t, tc.version_of(t), t.clone() if t.untyped_storage().nbytes() <= EXTERNAL_COPY_MAX_BYTES else None)
            for ref in call.made_state if (t := ref()) is not None
        ]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, v, value in found:
                if tc.version_of(t) != v and value is not None:
                    t.copy_(value)
        written = [t for t, v, value in found if value is None and tc.version_of(t) != v]
        if written:
            call.rewritten_state = (
                f"offrecomp: the replay of region {call.name!r} wrote in place a {tuple(written[0].shape)} "
                "tensor its first call made and kept outside the region's modules (state a hook keeps?), "
                "which it updated a second time, and it is too large to copy beforehand. Hint: skip such "
                "updates under offrecomp.in_replay(), or keep this region's activations (regions=)."
            )


@contextlib.contextmanager
def default_dtype_as_forward(dtype: torch.dtype, now: torch.dtype) -> Iterator[None]:
    """Factory ops (``torch.ones``, ``linspace``) in the replay make the dtype they made
    in the forward (``dtype``), whatever the default is when backward runs (``now``)."""
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(now)


@contextlib.contextmanager
def hooks_as_found(call: RegionCall) -> Iterator[None]:
    """NOTE [Hooks a replay registers] (changes.py): the replay runs with the hooks its
    forward found at its entry, and leaves the hooks, children, parameters and hook
    handles of the region's modules as it found them."""
    region = call.region
    entry = call.forward_hooks
    # none at entry and none registered anywhere since its exit: none to compare
    unmoved = entry is None or (not entry and hook_ids() == call.hooks_to)
    now = forward_hooks(region.modules[1:]) if region is not None and not unmoved else None
    moved = now is not None and forward_hooks_moved(entry, now, call.hooks_from, call.hooks_to)
    if region is None or not (call.hooks_to > call.hooks_from or call.attrs or moved):
        yield  # a forward that registered no hook and set no attribute: its replay neither
        return
    mods = region.modules
    hooks, tree, first = hook_snapshot(mods), tree_snapshot(mods), hook_ids()
    if call.hooks_to > call.hooks_from:
        hide_hooks(hooks, call.hooks_from, call.hooks_to)
    if moved:
        assert now is not None
        forward_hooks_as(entry, now)
    try:
        yield
    finally:
        changed = restore_hooks(hooks)
        changed = restore_tree(tree) or changed
        changed = drop_hooks_since(first, mods) or changed
        if moved:
            log_once(
                f"replay-entry-hooks:{named(region)}", logging.INFO,
                "offrecomp: forward hooks of region %r's modules were registered or removed "
                "between its forward and its replay; the replay ran with those its forward found",
                region.name,
            )
        elif changed:
            log_once(
                f"replay-hooks:{named(region)}", logging.INFO,
                "offrecomp: region %r registers or removes hooks, or sets children, in its "
                "forward, which its replays do again; each replay leaves them as it found them",
                region.name,
            )


# NOTE [Children at entry]
# A replay calls the region's forward, which reaches its layers through the modules'
# children. The loop may set one between a forward and its backward: an activation
# module swapped, a LoRA wrapper put in around a projection, an adapter added or taken
# out, a ``ModuleList`` entry replaced. The replay would run the new module: other
# activations, every gradient below off, silently, as under ``torch.utils.checkpoint``.
# A region read keeps its modules with their children by name (``Region.tree``: read
# again whenever its structure changed, NOTE [Region refresh] in changes.py), and a call
# that may replay keeps that at entry, at no cost. A replay whose modules hold other
# children runs with those of its entry and puts the others back after it. A module
# set past torch's registration hook (``_modules`` written) in the forward's own root
# forward before the call is not seen until the next one.


@contextlib.contextmanager
def children_as_forward(call: RegionCall) -> Iterator[None]:
    """NOTE [Children at entry]: the replay runs with the children its modules held at
    the call's entry, and leaves them as it found them."""
    moved = [(m._modules, items) for m, items in call.tree or () if not same_entries(tuple(m._modules.items()), items)]
    if not moved:
        yield
        return
    found = [(table, tuple(table.items())) for table, _ in moved]
    for table, items in moved:
        table.clear()
        table.update(items)
    try:
        yield
    finally:
        for table, items in found:
            table.clear()
            table.update(items)
        log_once(
            f"replay-children:{named(call.region, call.name)}", logging.INFO,
            "offrecomp: children of region %r's modules were set since a call's entry; its "
            "replay ran with those the call found",
            call.name,
        )


@contextlib.contextmanager
def training_as_forward(call: RegionCall) -> Iterator[None]:
    """The replay runs in the train/eval mode of the forward. Otherwise a ``model.eval()``
    between forward and backward (an evaluation forward for logging) would turn dropout
    off in the replay, and code that branches on ``self.training`` would take the other
    branch."""
    flags = call.training
    region = call.region
    if flags is None or region is None or len(flags) != len(region.modules):
        yield
        return
    changed = [(m, f) for m, f in zip(region.modules, flags) if m.training != f]
    for m, f in changed:
        m.training = f
    try:
        yield
    finally:
        for m, f in changed:
            m.training = not f  # as the replay found it


@contextlib.contextmanager
def entry_arg_state(
    call: RegionCall, entry: ArgState, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[None]:
    """NOTE [Stateful arguments]: the replay sees the call's object arguments as the
    forward saw them (``entry``, the call's), a tensor argument among their state as the
    replay's argument (``args``, ``kwargs``: NOTE [Aliased arguments] in arguments.py);
    afterwards they are as the replay found them."""
    assert call.inputs is not None
    if call.region is not None and call.region.compiled:
        entry.check(call.name)  # no guard sees its ops (NOTE [State written after the forward])
    bound, as_arguments = arguments_in_state(call.inputs, entry, state_links(call.inputs, entry), args, kwargs)
    with entry.as_entry(call.name, bound), entry.at_entry(), as_arguments:  # NOTE [State written by the forward]
        yield


@contextlib.contextmanager
def external_as_entry(region_name: str, external: list[tuple[Any, Any]]) -> Iterator[None]:
    """NOTE [State written by its region] (call_state.py): storages from outside the call that
    its forward wrote (its region's first call, seen by the watch) hold their bytes of
    before the write while the replay runs, and the bytes found afterwards."""
    if any(before is None for _, before in external):
        raise RuntimeError(
            f"offrecomp: region {region_name!r} wrote in place, in its forward, a tensor it "
            "neither owns nor takes as an argument, too large to copy before the write, so "
            "a replay would read the written values. Hint: keep such state in a buffer of "
            "the block, or exclude the block with regions=."
        )
    with holding(external):
        yield
