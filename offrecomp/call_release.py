"""A region call's release: once no dropped or offloaded save of it is alive (its lease
died, NOTE [Call leases] in handles.py), its replay checkpoint and offload groups go.
The root call is never done: only its groups go.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress, repeat
from operator import attrgetter, is_not
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from offrecomp.state import RegionCall, StorageRec
    from offrecomp.transfer import Group

__all__ = ["release_call"]

_TENSOR = attrgetter("tensor")


def release_call(call: RegionCall, free: Callable[[Group], None]) -> None:
    """No dropped or offloaded save of ``call`` is alive: drop the replay checkpoint
    and hand each offload group to ``free`` (``OffloadGroups.free``). The root is never
    done: only its groups go. Run again after an interrupt cut it short, it does the rest
    (NOTE [Interrupts in cleanup] in interrupts.py): a group freed twice is freed once."""
    groups = call.groups
    if call.is_root:
        if groups:
            for rec in call.storages:
                if rec.group is not None and rec.group in groups:
                    rec.released = True  # a later save of its storage is a new storage
            _free_all(groups, free)
            call.groups = []
        call.group = None
        return
    if not call.exited:
        return
    call.released = True
    storages = call.storages
    if storages:  # none: a call that saved natively (NOTE [Native keep])
        # the records that hold a tensor (most hold none), picked in C rather than one
        # Python step per record; by_ptr stays: later calls look inputs up there (NOTE
        # [Inputs counted once])
        for rec in compress(storages, map(is_not, map(_TENSOR, storages), repeat(None))):
            rec.tensor = None
            if rec.kind == "input":
                _held_no_more(rec)
    if groups:
        _free_all(groups, free)
        call.groups = []
    call.group = None
    call.inputs = None
    call.rng = None
    call.torch_function = None
    call.buffers = None
    held, call.snapshot_bytes = call.snapshot_bytes, 0
    if held and call.pass_state is not None:  # NOTE [Replay and module state]: its copies go
        call.pass_state.stats.resident_bytes -= held  # a decrease sets no peak
    call.params = None
    call.generators = None
    call.training = None
    call.arg_state = None
    call.attrs = None
    call.entry_tables = None
    call.entry_contents = None
    call.external = None
    call.external_reads = None
    call.replayed.clear()


def _held_no_more(rec: StorageRec) -> None:
    """A region input's record lets its tensor go with its call's replay checkpoint: what
    holds the storage from then on is the program (the iterate a solver detached, an
    encoding every call takes), so the record stops counting its bytes, unless inputs
    sharing its count are still held (NOTE [Inputs counted once] in shared.py). One its
    call's forward saved is held by that saved variable too: its bytes go when its
    storage dies."""
    if rec.saved_in_call:
        return
    other = rec.same_as if rec.shared else None
    if other is not None:
        other.sharers -= 1
        if other.sharers or other.kind != "input" or not other.call.released:
            return
        rec = other
    elif rec.sharers:
        return
    if rec.resident and rec() is not None:
        rec.resident = False
        p = rec.call.pass_state
        if p is not None:
            p.stats.resident_bytes -= rec.nbytes  # a decrease sets no peak
            p.stats.resident_drops += 1


def _free_all(groups: list[Group], free: Callable[[Group], None]) -> None:
    """``free`` each group, every one even if one raises (the first error is raised
    after): a group skipped here would never be freed, its host block held for good."""
    error: BaseException | None = None
    for group in groups:
        try:
            free(group)
        except BaseException as exc:
            error = error or exc
    if error is not None:
        raise error
