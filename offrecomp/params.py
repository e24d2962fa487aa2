"""The parameters of a region call: which tensor filled each parameter slot at its entry,
so its replay runs with the parameters its forward ran with (buffers: buffers.py)."""

from __future__ import annotations

import operator
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from offrecomp import _torch_compat as tc
from offrecomp.handles import view_on

__all__ = [
    "ParamData",
    "ParamState",
    "capture_params",
    "data_at_entry",
    "finish_params",
    "let_go_released",
    "modified_params",
    "note_stepped",
]


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
#
# ``param.data = other`` (an EMA swap, a cast through ``.data``) keeps the Parameter and
# its version and replaces the storage and geometry under it. So a call also holds the
# storage of each plain parameter at its entry (no memory while the parameter keeps it; a
# replaced one lives until the call is released), and a replay whose parameter has
# another storage by then reads a tensor over the held one: the values the forward read.
# The dtype, shape, stride and offset come from ``Region.param_data``, read once per
# storage a slot shows (weakly held: no memory): the capture costs about 0.5 us more a
# parameter on the 2-core CPU machine, reading them at every call 2 us. The guard
# watches the held storage.


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
    stepped: set[int] = field(default_factory=set)
    """Slots an optimizer stepped since the forward returned, outside a backward (NOTE
    [Steps before the backward])."""
    storages: tuple[tuple[torch.UntypedStorage, tuple[Any, ...]] | None, ...] = ()
    """Each plain parameter's storage at region entry, with its ``Region.param_data``
    entry: ``param.data = other`` replaces them, moving no version (NOTE [Replay and
    parameters])."""

    def keep_copy(self, i: int) -> None:
        """Parameter ``i`` is about to be written by the forward: keep its values."""
        t = self.objects[i]
        if t is not None and i not in self.snapshots:
            self.snapshots[i] = t.detach().clone(memory_format=torch.preserve_format)


def _versions(objects: tuple[torch.Tensor | None, ...]) -> tuple[int, ...]:
    return tuple(-1 if t is None else tc.version_of(t) for t in objects)


_PLAIN = (torch.Tensor, nn.Parameter)
#: Slot contents a region's last capture keeps for its next (NOTE [Parameters read in a row]).
_ROW_TYPES = frozenset({nn.Parameter, type(None)})


class ParamData:
    """What a region keeps of its parameters from one call's capture to the next (NOTE
    [Replay and parameters], NOTE [Parameters read in a row])."""

    __slots__ = ("by_slot", "first_look", "released", "row")

    def __init__(self) -> None:
        self.by_slot: dict[int, tuple[Any, ...]] = {}
        """Slot -> (a weak reference to the storage its parameter showed, with that
        parameter's dtype, shape, stride and offset)."""
        self.row: tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]] | None = None
        """The last capture's objects, their storages and its ``ParamState.storages``,
        where every slot held an ``nn.Parameter`` or nothing; else None."""
        self.released: set[int] = set()
        """Slots whose parameter's storage a call saw freed by its owner: the region's
        calls hold none of theirs (NOTE [Parameters released by their owner])."""
        self.first_look = -1
        """The pass whose calls of the region were first looked at for such slots."""


# NOTE [Parameters read in a row]
# Every region call that may replay reads each of its parameter slots: the tensor there,
# its version and ``requires_grad``, the storage under it and that storage's geometry
# (NOTE [Replay and parameters]). Read slot by slot, with a branch per case, that costs
# about 1.5 us a parameter on a 2-core CPU host, a large part of a block's entry. Where
# the region's last capture found only ``nn.Parameter`` objects (or empty slots), it keeps
# them, their storages and its entry of each (``ParamData.row``); a call reads the slots,
# and where it finds those objects on those storages (two identity comparisons) it
# reads only their versions and flags and shares the rest. Anything else (another tensor
# in a slot, as ``functional_call`` puts there; a slot gone from its table; a storage
# replaced through ``.data``; an inference tensor, which has no version; a sparse
# parameter, which has no storage) takes the loop, which reads each slot as it is and
# keeps the row again where it may. The row holds what the model holds while nothing
# changes: a parameter replaced (or a storage swapped out through ``.data``) is held until
# the region's next call, or its next refresh; a plain tensor in a slot, which may carry
# a graph, is never kept.


def capture_params(slots: tuple[tuple[nn.Module, str], ...], data: ParamData) -> ParamState | None:
    """The tensor in each parameter slot (None when the region has no parameters), and
    the storage under each plain one, its geometry read into ``data`` (the region's
    ``param_data``) when the slot shows a storage it has not read."""
    if not slots:
        return None
    row = data.row
    if row is not None:  # NOTE [Parameters read in a row]
        is_ = operator.is_
        try:
            objects = [m._parameters[n] for m, n in slots]
            if len(objects) == len(row[0]) and all(map(is_, objects, row[0])) and all(
                map(is_, [None if t is None else t.untyped_storage() for t in objects], row[1])
            ):
                return ParamState(
                    slots,
                    row[0],
                    tuple([-1 if t is None else t._version for t in objects]),
                    requires_grad=tuple([t is not None and t.requires_grad for t in objects]),
                    storages=row[2],
                )
        except (KeyError, RuntimeError, NotImplementedError):  # no slot, no version, no storage: the loop
            pass
    return _capture_each(slots, data)


def _capture_each(slots: tuple[tuple[nn.Module, str], ...], data: ParamData) -> ParamState:
    """``capture_params`` slot by slot, each case apart; keeps ``data.row`` where it may."""
    objects: list[torch.Tensor | None] = []
    versions: list[int] = []
    flags: list[bool] = []
    storages: list[Any] = []
    by_slot = data.by_slot
    for i, (m, n) in enumerate(slots):  # one pass: every region call that may replay runs it
        table = m._parameters
        t = table[n] if n in table else None  # noqa: SIM401 (param_of, inline)
        objects.append(t)
        if t is None:
            versions.append(-1)
            flags.append(False)
            storages.append(None)
            continue
        versions.append(tc.version_of(t))
        flags.append(t.requires_grad)
        try:
            st = t.untyped_storage() if type(t) in _PLAIN else None  # others are never put back
        except NotImplementedError:  # not strided (sparse): no storage
            st = None
        if st is None or i in data.released:  # NOTE [Parameters released by their owner]: not held
            storages.append(None)
            continue
        g = by_slot.get(i)
        if g is None or g[0]() is not st:
            g = by_slot[i] = (weakref.ref(st), t.dtype, t.shape, t.stride(), t.storage_offset())
        storages.append((st, g))
    state = ParamState(slots, tuple(objects), tuple(versions), requires_grad=tuple(flags), storages=tuple(storages))
    kept = set(map(type, objects)) <= _ROW_TYPES and all(
        (t is None) == (h is None) for t, h in zip(objects, storages)
    ) and tc.INFERENCE_VERSION not in versions
    data.row = (state.objects, tuple(None if h is None else h[0] for h in storages), state.storages) if kept else None
    return state


def data_at_entry(state: ParamState, i: int) -> torch.Tensor | None:
    """Parameter ``i``'s values at region entry where ``param.data = other`` replaced its
    storage since: a tensor over the storage held (NOTE [Replay and parameters]); None
    where the parameter has that storage still."""
    held, t = state.storages[i], state.objects[i]
    if held is None or t is None:
        return None
    now = t.untyped_storage()
    if now is held[0] or not now.nbytes() or not held[0].nbytes():  # one object per storage
        return None  # its own; or freed, or gathered in the forward (NOTE [Parameters released by their owner])
    storage, (_, dtype, shape, stride, offset) = held
    return view_on(storage, 0, dtype, shape, stride, offset)


# NOTE [Parameters released by their owner]
# A partitioner that gathers a module's parameters for its forward and frees them after
# (DeepSpeed ZeRO-3: ``param.data = gathered`` in a forward pre-hook, ``param.data =
# torch.empty(0)`` in the forward hook) replaces the storage under the same Parameter,
# and gathers the same values again whenever a forward runs the module, a replay's
# included. The storage held for NOTE [Replay and parameters] would keep every gathered
# parameter of the pass alive until its backward: the memory the partitioner exists to
# save. So where a parameter shows an empty storage, the one it had at entry not empty,
# the call lets go of that storage (and the region of its row, NOTE [Parameters read in
# a row]), and the region's later calls hold none of that slot's storages
# (``ParamData.released``): that parameter follows its owner, as under
# ``torch.utils.checkpoint``, and the region's other parameters stay held (DeepSpeed
# leaves small ones gathered for good, and a ``.data =`` rebinding of one must still
# replay as read). The last call's parameters are looked at when the next region call
# enters (hooks free a module's parameters after its forward), and every call's when the
# pass's backward begins (hooks may free them later, when a later module's run begins),
# in each region's first RELEASE_LOOKS passes: a partitioner frees alike at every step,
# and a look costs about 0.1 us a parameter, which every call would pay for good.
#
# A replay runs such a parameter as its slot holds it, the Parameter object of the
# call's entry (put back where another fills the slot), never a new one over a held
# storage, whose attributes the partitioner's hooks would lack: where the parameter shows
# an empty storage, or showed one at the call's entry (a module under the region,
# gathered by its own hook inside the forward, shows one then), those hooks gather it as
# for any forward. A storage freed in
# place (FSDP's ``resize_(0)``) is the same storage, held at no cost and refilled by its
# owner before the backward.

#: Passes, from a region's first call looked at, in which its calls are looked at for
#: parameters their owner freed (NOTE [Parameters released by their owner]).
RELEASE_LOOKS = 4


def let_go_released(state: ParamState | None, data: ParamData, index: int) -> None:
    """NOTE [Parameters released by their owner]: in pass ``index``, while the calls of
    the region of ``data`` are looked at, drop the storages of a call's ``state`` (None:
    it captured none) whose parameter now shows an empty storage in their place, and
    mark their slots."""
    if state is None:
        return
    first = data.first_look
    if first < 0:
        data.first_look = first = index
    if index < first + RELEASE_LOOKS:
        _let_go(state, data)


def _let_go(state: ParamState, data: ParamData) -> None:
    held = state.storages
    kept: list[Any] | None = None
    for i, (h, t) in enumerate(zip(held, state.objects)):
        if h is None or t is None:
            continue
        st = t.untyped_storage()
        if st is not h[0] and not st.nbytes() and h[0].nbytes():
            if kept is None:
                kept = list(held)
            kept[i] = None
            data.released.add(i)
    if kept is not None:
        state.storages = tuple(kept)
        data.row = None


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
        if (a != b or i in state.snapshots) and type(t) in (torch.Tensor, nn.Parameter)
    ]  # a copy taken: the watch saw a write, also one through ``.data``, which moves no version
    state.unseen = [i for i in written if i not in state.snapshots]
    return written


def modified_params(state: ParamState) -> dict[int, str]:
    """Storages (data pointer -> description) of the parameters the forward used that were
    modified in place since it returned: those the replay reads, held at entry (NOTE
    [Replay and parameters])."""
    out: dict[int, str] = {}
    for i, ((m, n), t, v, h) in enumerate(zip(state.slots, state.objects, state.versions, state.storages)):
        if t is None or type(t) not in (torch.Tensor, nn.Parameter):
            continue
        now = tc.version_of(t)
        if now != v:
            why = f"version {v} -> {now}"
        elif i in state.stepped:
            why = "stepped by an optimizer whose kernels move no version, such as a fused one"
        else:
            continue
        held = t.untyped_storage() if h is None else h[0]
        out[int(held.data_ptr())] = f"parameter {n!r} of {type(m).__name__} ({why})"
    return out


# NOTE [Steps before the backward]
# An optimizer that steps between a forward and its backward changes the parameters a
# replay of that forward reads. A step that moves their versions stops such a replay
# (NOTE [Replay and parameters]); a fused one (``AdamW(fused=True)``, ``SGD(fused=True)``
# on the CPU) writes them in its kernels, moving no version, and the replay would
# recompute with the new weights where plain autograd holds activations of the old ones:
# other gradients, silently. So the runtime's optimizer-step hook, outside a backward,
# marks the parameters the optimizer holds, those with a gradient (the others it skips),
# in every call a backward may still reach, not released yet, of any pass (one that a
# later forward ended too: ``note_stepped``), and the replay's guard treats them as
# modified: a replay that reads one raises. A step inside backward (an optimizer per parameter, as
# torchtune's ``optimizer_in_bwd``) is not marked: it updates a parameter after the
# backward of every op that read it.


def note_stepped(state: ParamState, stepped: set[int]) -> None:
    """NOTE [Steps before the backward]: the parameters of ``state`` whose ids are in
    ``stepped`` were stepped by an optimizer."""
    for i, t in enumerate(state.objects):
        if t is not None and id(t) in stepped:
            state.stepped.add(i)
