"""Storages several records of a pass hold, counted once in its books: a region input
another record keeps (NOTE [Inputs counted once]), a kept storage an earlier call kept
(NOTE [Activations counted once]) and a storage calls kept whole save or return (NOTE
[Whole calls counted once])."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from offrecomp.state import PassState, RegionCall, StorageRec
from scheduler.plan import Placement
from scheduler.profile import INPUT_LOOKBACK

KEEP = Placement.KEEP

__all__ = [
    "INPUT_LOOKBACK", "Position", "arg_at", "arg_tensors", "count_whole_input", "counting_record", "join_counted", "keeps_whole",
    "lookup_window", "out_tensors", "share_kept", "whole_counts",
]

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

# NOTE [Whole calls counted once]
# A call kept whole (forced keep, or a plan's: NOTE [Kept planned calls] in placement.py)
# takes no part in the tables above: it saves natively in most passes, without records.
# Yet what it keeps is often a storage another call counts: a block's input that the
# block before saved as its output (a ReLU's or a tanh's, which the next block's Linear
# or convolution saves as its input: counted by each, a stack of conv+ReLU blocks
# would book 1.77x what it holds), an encoder output every decoder block saves, a
# stem's output the first block saves, the last block's output the loss saves. So calls kept whole count through one
# more table, ``PassState.whole_counted`` (data pointer -> the storage, weakly), by
# positions that a native call can find without its saves: its tensor arguments
# (``arg_tensors``) and the tensors it returns (``out_tensors``). A tensor argument the
# call saves counts nothing where the table or a resident record of ``first_records``
# counts its storage already, and joins the table; a kept storage it returns joins the
# table at its exit. A hooked call finds its arguments at the save (``count_whole_input``,
# by ``RegionCall.arg_ptrs``) and its record (``CallBooks`` in native.py) says which
# positions it saved and returned; a native call reads those positions at its entry and
# exit. Kept saves and kept inputs of the root and of other calls look the table up where
# no record of theirs counts the storage (``share_kept``, ``InputRecords._count`` in input_records.py). A
# storage the table names is resident while the call that counted it keeps it: the
# record of the call counting it lives to that call's backward, after the later calls'.
# The profile marks the storages each call returned (``StorageRecord.returned``), and the
# simulator counts a kept input of a unit kept whole nothing after a counted kept record
# of its allocation in the root or a unit with records, or a saved argument or returned
# storage of a unit kept whole; the others' kept records likewise after the latter
# (``_counted_once`` in scheduler/timeline.py; ``StorageRecord.argument`` marks the
# inputs that are tensor arguments). Arguments are looked into one level deep (a tuple or
# list given as an argument), outputs likewise (a tuple or list returned); deeper nesting
# (a list in a list, a dict, a dataclass) is not: such a storage counts once per call
# saving it.


Position = Any
"""Where a call's argument lies: an index into ``args``, a keyword, or (either, index)
for a tensor in a tuple or list argument."""


def arg_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[Position, torch.Tensor]]:
    """The tensors among a call's arguments, at the top level and in tuples and lists
    given as arguments (rotary ``position_embeddings=(cos, sin)``), with their positions
    (NOTE [Whole calls counted once])."""
    out: list[tuple[Position, torch.Tensor]] = []
    for pos, a in (*enumerate(args), *(kwargs.items() if kwargs else ())):
        if isinstance(a, torch.Tensor):
            out.append((pos, a))
        elif isinstance(a, (tuple, list)):
            out += [((pos, j), t) for j, t in enumerate(a) if isinstance(t, torch.Tensor)]
    return out


def arg_at(args: tuple[Any, ...], kwargs: dict[str, Any], pos: Position) -> Any:
    """The argument at ``pos`` (as :func:`arg_tensors` gives it), or None where the call
    has none there."""
    inner = None
    if isinstance(pos, tuple):
        pos, inner = pos
    a = (args[pos] if pos < len(args) else None) if isinstance(pos, int) else kwargs.get(pos)
    if inner is not None:
        a = a[inner] if isinstance(a, (tuple, list)) and inner < len(a) else None
    return a


def out_tensors(out: Any) -> list[tuple[int, torch.Tensor]]:
    """The tensors a call returned, with their positions: the tensor itself (0), or the
    tensors of a tuple or list it returned (NOTE [Whole calls counted once])."""
    if isinstance(out, torch.Tensor):
        return [(0, out)]
    if isinstance(out, (tuple, list)):
        return [(i, t) for i, t in enumerate(out) if isinstance(t, torch.Tensor)]
    return []


def storage_of(t: torch.Tensor) -> Any:
    """``t``'s untyped storage, or None where it has none with data (sparse, meta,
    a tensor subclass without one)."""
    try:
        st = t.untyped_storage()
        return st if st.data_ptr() else None
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def whole_counts(p: PassState, ptr: int, storage: Any) -> bool:
    """Does a call kept whole count ``storage`` (at ``ptr``) in ``p``?"""
    ref = p.whole_counted.get(ptr)
    return ref is not None and ref() is storage


def count_whole_input(p: PassState, ptr: int, storage: Any) -> bool:
    """A call kept whole saves ``storage`` (at ``ptr``), one of its tensor arguments:
    True where another record counts it already, so the call counts nothing; it counts
    for calls kept whole from now on (NOTE [Whole calls counted once])."""
    if whole_counts(p, ptr, storage):
        return True
    p.whole_counted[ptr] = weakref.ref(storage)
    first = p.first_records.get(ptr)
    if first is None or not first.resident or first() is not storage:
        return False
    first.sharers += 1  # never taken back, as share_kept's: the call holds it past its record's call
    return True


def count_whole_output(p: PassState, storage: Any) -> None:
    """A call kept whole returns ``storage``, which it keeps: it counts it for the others
    (NOTE [Whole calls counted once])."""
    ptr = storage.data_ptr()
    if not whole_counts(p, ptr, storage):
        p.whole_counted[ptr] = weakref.ref(storage)


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
    first = p.first_records.get(ptr)
    if first is not None and first() is not storage:
        first = None  # a freed storage's pointer, taken again
    if first is not None and first.call is not call and first.resident:
        rec.shared = True
        first.sharers += 1  # never taken back: an input record it counts for stays counted
        if rec.same_as is None:
            rec.same_as = first
        return True
    if p.whole_counted and whole_counts(p, ptr, storage):  # NOTE [Whole calls counted once]
        rec.shared = True
        return True
    if first is None:
        p.first_records[ptr] = rec  # the first: the caller counts it
    return False
