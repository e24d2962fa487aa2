"""Region inputs as placeable storages: each tensor a region call takes (the replay
checkpoint's, NOTE [Replay] in replay.py) and each its argument objects hold (NOTE
[Inputs held by arguments] in calls.py) gets a record in its call, placed and booked
once (NOTE [Inputs counted once] in shared.py); and ``account``, the books of any new
storage's placement, which the save path (hooks.py) shares."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from offrecomp.shared import counting_record, join_counted, lookup_window, whole_counts
from offrecomp.state import PassState, RegionCall, StorageRec
from scheduler.plan import Placement

if TYPE_CHECKING:
    from offrecomp.config import Config
    from offrecomp.placement import Placements

__all__ = ["InputRecords", "account", "input_storage"]

KEEP, OFFLOAD = Placement.KEEP, Placement.OFFLOAD
_STRIDED = torch.strided
_new_rec = StorageRec.__new__  # set in __new__, no __init__ (hooks.py)


def input_storage(t: Any) -> Any:
    """The storage of a tensor a region call takes as an input that can be placed: a plain
    strided tensor that is no view of a parameter; else None."""
    if type(t) is not torch.Tensor or t.layout is not _STRIDED or t.is_nested or t.is_meta:
        return None
    base = t._base
    if base is not None and isinstance(base, nn.Parameter):
        return None
    return t.untyped_storage()


def account(p: PassState, rec: StorageRec, fallback: str | None) -> None:
    """Count a new storage's bytes as kept, offloaded (it joined its call's group in
    ``Placements.decide``) or dropped, and its fallback if any."""
    stats = p.stats
    if fallback is not None:
        stats.fallback(fallback)
    placement = rec.placement
    if placement is KEEP:
        stats.keep(rec)
    elif placement is OFFLOAD:
        stats.offloaded_bytes += rec.nbytes
    else:
        stats.recomputed_bytes += rec.nbytes


class InputRecords:
    """The records of region inputs, for one runtime (``RegionCalls`` registers them at
    each call's entry)."""

    def __init__(self, config: Config, placements: Placements) -> None:
        self._config = config
        self._decide = placements.decide

    def add_arguments(self, p: PassState, call: RegionCall, tensors: list[tuple[torch.Tensor, Any, Any]]) -> None:
        """Register the tensors ``call``'s argument objects hold (``ArgState.tensors``) as
        its region inputs, only kept (NOTE [Inputs held by arguments] in calls.py)."""
        window = lookup_window(p, call)  # once for them all
        recorder = call.recorder
        for t, _, _ in tensors:
            storage = input_storage(t)
            ptr = storage.data_ptr() if storage is not None else 0
            rec = call.by_ptr.get(ptr)
            if not ptr or (rec is not None and not rec.released and rec() is storage):
                continue  # none, empty, or a storage of the call's already
            nbytes = storage.nbytes()
            rec = _new_rec(StorageRec, storage, call, len(call.storages), nbytes, ptr, KEEP)
            rec.kind = "input"
            rec.by_argument = True
            rec.tensor = t
            if recorder is not None:  # not known: no op reading it is served (NOTE [Which ops replay runs])
                rec.sid = recorder.storage_id(t)
            call.storages.append(rec)
            call.by_ptr[ptr] = rec
            p.stats.input_bytes += nbytes
            self._count(p, rec, ptr, storage, window, None)

    def add(self, p: PassState, call: RegionCall, t: torch.Tensor) -> StorageRec | None:
        """Register a region input (the replay checkpoint) as a placeable storage."""
        storage = input_storage(t)
        if storage is None:
            return None
        ptr = storage.data_ptr()
        rec = call.by_ptr.get(ptr)
        if rec is not None and not rec.released and rec() is storage:
            return rec if rec.placement is not None else None
        nbytes = storage.nbytes()
        rec = _new_rec(StorageRec, storage, call, len(call.storages), nbytes, ptr, None)
        rec.kind = "input"
        placement, fallback = self._decide(p, call, rec, "input", t, storage)
        rec.placement = placement
        if call.recorder is not None:
            rec.sid = call.recorder.storage_id(t, known=True)
        call.storages.append(rec)
        call.by_ptr[ptr] = rec
        p.stats.input_bytes += nbytes
        if placement is KEEP:
            rec.tensor = t
        # the books need the other record of a kept input; a profile, of any input
        window = lookup_window(p, call) if placement is KEEP or call.recorder is not None else None
        self._count(p, rec, ptr, storage, window, fallback)
        return rec

    def _count(
        self, p: PassState, rec: StorageRec, ptr: int, storage: Any,
        window: tuple[RegionCall | None, ...] | None, fallback: str | None,
    ) -> None:
        """Book a placed region input: nothing more where a resident record of ``window``
        counts its storage (NOTE [Inputs counted once]), else as placed, the storage's
        counting record if it is the first (NOTE [Activations counted once])."""
        config = self._config
        other = rec.same_as = (
            counting_record(rec.call, ptr, storage, window, config.native_keep, config.mode)
            if window is not None else None
        )
        if rec.placement is KEEP and fallback is None:
            if other is not None and other.resident:
                rec.shared = True
                other.sharers += 1
                p.stats.kept_bytes += rec.nbytes
                return
            if p.whole_counted and whole_counts(p, ptr, storage):  # NOTE [Whole calls counted once]
                rec.shared = True
                p.stats.kept_bytes += rec.nbytes
                return
        account(p, rec, fallback)
        join_counted(p, rec, ptr, storage)
