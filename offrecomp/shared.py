"""Storages several records of a pass hold, counted once in its books: a region input
another record keeps (NOTE [Inputs counted once]) and a kept storage an earlier call kept
(NOTE [Activations counted once])."""

from __future__ import annotations

from typing import Any

from offrecomp.state import PassState, RegionCall, StorageRec
from scheduler.plan import Placement
from scheduler.profile import INPUT_LOOKBACK

KEEP = Placement.KEEP

__all__ = ["INPUT_LOOKBACK", "counting_record", "join_counted", "keeps_whole", "lookup_window", "share_kept"]

# NOTE [Inputs counted once]
# A region input is often a storage another record of the pass counts already: the
# previous block's output that its last op saved (a ReLU's), an encoder output the root
# saved and a decoder block takes later (a UNet's skip), a feature map several blocks
# take (a DenseNet's). Counted by each record, its bytes would count twice in the pass's
# resident bytes and peak, where the device holds them once. A KEEP input whose
# storage's latest record among the INPUT_LOOKBACK calls before its own (else the
# root's) is resident is marked ``shared`` and not counted again; it is still placed and
# held as the others. The latest, not the first: a block's output that the block dropped
# and the next block counts as its input is counted by that input for a block after (a
# skip), where the dropped record holds nothing. A shared record found there stands for
# the record it shares (``same_as``), however far back: a cell called at every time step
# on one sequence counts it once. A storage no call of the window holds is counted again
# (the lookup is bounded: it runs per input per call). A call whose graph died (a
# solver's iterate, detached in the forward) lets its inputs go with its replay
# checkpoint: the program holds such a storage from then on (an encoding every iteration
# takes), and its record stops counting it unless records sharing the count are still
# held (``sharers``: inputs of calls not released; a kept activation that shared it, for
# good); else each later iteration, finding no live record before it, would count it
# once more. An input the call's own forward saved too (a block that is one Linear) is
# held by that saved variable until backward: its record counts it until its storage
# dies (``StorageRec.saved_in_call``).
# Only calls that take a replay checkpoint have input records, and only calls that run
# the hooks have records to find: a call a plan keeps whole has neither when it saves
# natively; the root runs the hooks in every pass. Under native keep the lookup passes
# over region calls kept whole also in the passes they run hooked (the first of a plan,
# an audit), so that those book as the others; with native keep off it finds their
# records, as the model does. A call that drops or offloads nothing (one kept whole) is
# released at its exit, and its records stay where a later call looks its inputs up. An
# input's record names the other (``same_as``, whatever its placement), and so does its
# profile record (``StorageRecord.shared_with``): the model counts the input nothing
# where its allocation's latest record in that window is kept, in a unit that has
# records, and an input no op saves nothing in a call kept whole (docs/planner.md).

# NOTE [Activations counted once]
# A call may save a storage an earlier call saved too without taking it as an input:
# under autocast the bf16 cast of a weight the calls share (a cell called at every time
# step, a block called twice), made by the first call that needs it and cached for the
# rest; a tensor cached on a module by its first call. Each call's record of it would
# count its bytes again. The pass keeps the first kept record of each storage
# (``first_records``, by data pointer, checked by identity); a later call's kept record
# of that storage names it (``same_as``) and is ``shared``: held as the others, not
# counted. A measuring pass also keeps the first record of any placement
# (``first_named``) and names it from every later one, so the profile says which records
# are one allocation (``StorageRecord.shared_with``) and the simulator counts the first
# kept one under any plan, as these books do. A call kept whole (forced keep, or a
# plan's) saves natively in most passes under native keep (NOTE [Native keep] in
# native.py), without records, so its records neither join the table nor share, native
# keep on or off: its books are the same in every pass, and the simulator counts a unit
# kept whole alike. The root (the code outside the regions) always runs the hooks, so
# it joins and shares under any plan, also one that keeps all of it (a loss multiplying
# the last block's output with that block's input saves a storage the block kept, or
# took as an input, before), and in a measuring pass names the first record of each
# storage it saves, as region calls do. Region inputs are looked up as in NOTE [Inputs
# counted once]; a counted one joins the table.


def lookup_window(p: PassState, call: RegionCall) -> tuple[RegionCall | None, ...]:
    """Where a region input of ``call`` is looked up (NOTE [Inputs counted once]): the
    INPUT_LOOKBACK calls of ``p`` just before it, the latest first, then the root."""
    calls = p.calls
    end = call.ordinal if 0 <= call.ordinal <= len(calls) else len(calls)
    return (*reversed(calls[max(0, end - INPUT_LOOKBACK) : end]), p.root)


def counting_record(
    call: RegionCall, ptr: int, storage: Any, window: tuple[RegionCall | None, ...], native: bool, mode: str
) -> StorageRec | None:
    """The record of ``storage`` (at ``ptr``) that a region input of ``call`` names: the
    placed one of the first call of ``window`` (``lookup_window``) that holds one, or,
    where that one shares the storage, the record it shares, however far back (NOTE
    [Inputs counted once]). Under native keep (``native``; ``mode``: the runtime's) a
    region call kept whole holds none: it saves natively in most passes."""
    other = None
    for c in window:
        if c is None or c is call:
            continue
        rec = c.by_ptr.get(ptr)
        if rec is not None and rec.index >= 0 and rec() is storage:
            if native and c.ordinal >= 0 and keeps_whole(c, mode):
                continue  # a region call kept whole; the root always has records
            other = rec
            break
    while other is not None and other.shared and other.same_as is not None:
        other = other.same_as
    return other


def keeps_whole(call: RegionCall, mode: str) -> bool:
    """``call`` keeps every storage, by the forced keep mode or by its plan (NOTE [Kept
    planned calls] in placement.py): under native keep it saves natively in most passes,
    without records (NOTE [Native keep] in native.py)."""
    return call.fixed is KEEP and (mode == "keep" or call.kept_whole)


def _first(table: dict[int, StorageRec], ptr: int, storage: Any, rec: StorageRec) -> StorageRec:
    """The live record of ``storage`` (at ``ptr``) in ``table``, or ``rec``, put there
    now as its first."""
    first = table.get(ptr)
    if first is None or first() is not storage:
        table[ptr] = first = rec
    return first


def join_counted(p: PassState, rec: StorageRec, ptr: int, storage: Any) -> None:
    """``rec``, a region input's record, joins the tables of NOTE [Activations counted
    once]: where it counts ``storage``'s bytes, as the first kept record a later call's
    kept save of it shares; in a measuring pass, as the record later ones name, unless an
    earlier record of it lives."""
    if rec.resident:
        _first(p.first_records, ptr, storage, rec)
    if rec.call.recorder is not None:
        _first(p.first_named, ptr, storage, rec)


def share_kept(p: PassState, call: RegionCall, rec: StorageRec, ptr: int, storage: Any, kept: bool) -> bool:
    """Name the first record of ``storage`` from ``rec``, a new record of ``call`` (in a
    measuring pass, whatever its placement), and, where ``rec`` is ``kept`` and an
    earlier call's kept record counts the storage, mark it ``shared``: True, the caller
    counts nothing. Otherwise a kept ``rec`` becomes the storage's counting record if it
    is the first (NOTE [Activations counted once])."""
    if call.recorder is not None or (p.recording and call.ordinal < 0):
        # the profile names the first record, whatever its placement (from the root's too)
        named = _first(p.first_named, ptr, storage, rec)
        if named.call is not call:
            rec.same_as = named
    if not kept:
        return False
    first = _first(p.first_records, ptr, storage, rec)  # rec: the caller counts it
    if first.call is call or not first.resident:
        return False
    rec.shared = True
    first.sharers += 1  # never taken back: an input record it counts for stays counted
    if rec.same_as is None:
        rec.same_as = first
    return True
