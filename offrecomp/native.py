"""Region calls that keep every save run with autograd's own saved variables.

NOTE [Native keep]
A region call whose every storage is kept, by the forced mode (``mode="keep"``) or by a
plan that keeps the call whole (NOTE [Kept planned calls] in placement.py), leaves the
pack hook nothing to decide, and its handles only repeat what autograd's own saved
variables check (the version counter, a detach_()). Such a call runs with the runtime's
hook pair taken off the thread's stack, so autograd saves and reads its tensors natively
and the runtime adds nothing per save (the pair costs several microseconds per save,
benchmarks/bench_host_overhead.py). The pair goes back on at the call's exit, whether
the forward returned or raised.

What the hooks would have counted (saves, storages, kept bytes) comes from the same
call (region, call index) in an earlier pass of the same signature that ran with the
hooks: the first pass of each signature does (under auto, the first planned pass that
keeps the call whole), and leaves that record. The call's bytes count as kept and
resident from its exit: a kept storage lives until backward has read it, past the
forward's peak. They leave the count when the backward replays or reloads an earlier
call (``PassState.backward_reached``), as the storages would have died by then (not in
a backward that keeps its graph: ``retain_graph``, a gradient penalty's), or at the end
of the pass: a plan's booked peak in backward, where replays and reloads add bytes, is
then what the hooks would have booked.

A planned call is kept whole because its profile says what it saves; one that saves
more (a mixture of experts running more of them, or on more tokens: more or larger
storages) is seen only with the hooks on (``Planner.grew``). So under a plan, each
kept-whole call (signature, region, call index) runs with the hooks on in the
PROBATION passes after the one that made its record, then once in ``AUDIT_EVERY``
passes on average (``audit_gap``: scattered gaps after the first, so that a routing
that repeats every few steps meets an audit; four times as often for a region known to
vary whose profile still grows to what its audits see: NOTE [Sizes of regions that
vary] in differences.py): its record is made again, and a call that grew sends its
signature to measure again within that many passes (until then its steps may hold more
than the budget, and book the record's bytes). The probation meets a call that
alternates between two or three forms from step to step (an attention processor
swapped every other step, a branch on the step's parity) in the plan's first passes,
where audits alone could miss its larger form for a dozen steps, its native steps
booked at the smaller form's bytes.

NOTE [Graphs the forward drops]
A forward may drop a call's graph before its backward: a solver iterating with grad on
and detaching each iterate (a DEQ), a loss computed and thrown away. The hooked call's
kept storages then die in the forward, and their weak references take the bytes off
(NOTE [Resident bytes] in state.py); a native call's booked bytes would stay until the
backward reached it. So a call recorded with its kept storages alive stays pending in its
pass, and each later call entry of that forward looks at the pending ones (one live
record each, usually the first it tries): one whose kept storages all died is recorded
as freed at that entry, and the native calls of later passes free their bytes at the
entry of that ordinal. A recording made in one pass books the same frees in every pass
of its signature until the next audit makes it again.

The pair goes back from what the stack holds, through an interrupt (Ctrl-C) landing on
the way (NOTE [Interrupts in cleanup]): at the call's exit, again in the ``finally`` of
the region's wrapper when an interrupt cut the exit short at its start, and at the end
of the runtime's model forward and at the runtime's exit when one landed between the
call's start and its wrapper's ``try``.

The hooks stay on when anything else needs to see the saves: the op recorder, a region's
first-call watch, a replay checkpoint, another hook pair beneath the runtime's (taking
the runtime's off would hand it the call's saves), and ``native_keep=False``
(``OFFRECOMP_NATIVE_KEEP=0``), which also keeps the runtime's own error messages and
exact per-step books. A call whose forced keep was lifted during its forward (a backward
ran inside it, NOTE [Backward inside a forward]) leaves no record.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import torch

from offrecomp import _torch_compat as tc
from offrecomp.config import Config
from offrecomp.interrupts import finish
from offrecomp.regions import SETTLED
from offrecomp.shared import (
    Position,
    arg_at,
    arg_tensors,
    count_whole_input,
    count_whole_output,
    keeps_whole,
    out_tensors,
    storage_of,
)
from offrecomp.state import PassState, RegionCall, Stage
from scheduler.plan import Placement

__all__ = ["NativeKeep"]

KEEP = Placement.KEEP

#: Calls remembered across signatures (about 200 bytes each); past this the older half is
#: forgotten, a pass's own calls last (a run whose every step has new shapes gains nothing
#: from it; a bound a few passes' calls exceed would record every call of every pass).
MAX_RECORDS = 16384

#: Under a plan, a kept-whole call runs with the hooks on once in this many passes
#: (NOTE [Native keep]).
AUDIT_EVERY = 8
#: Passes after a call's record is made that run with the hooks on all the same (NOTE
#: [Native keep]): a call alternating between forms every two or three steps shows each.
PROBATION = 2


def audit_gap(audits: int, varies: bool = False) -> int:
    """Passes from a planned call's audit number ``audits`` to its next (NOTE [Native
    keep]): 1 during the PROBATION, AUDIT_EVERY to the first after it, then AUDIT_EVERY
    on average, scattered over [AUDIT_EVERY / 2, 3 * AUDIT_EVERY / 2] by a hash of the
    number; a quarter of that, at least 1, for a region that varies (``varies``). The
    same for every call of a kind, so the calls of a pass stay native alike."""
    if audits < PROBATION:
        return 1
    k = audits - PROBATION
    gap = AUDIT_EVERY if k <= 0 else AUDIT_EVERY // 2 + ((k * 0x9E3779B1) >> 16) % (AUDIT_EVERY + 1)
    return max(1, gap // 4) if varies else gap


#: What a call saved with the hooks on: (saves, storages, kept bytes, storages under
#: ``min_bytes``, kept bytes no earlier record counts: NOTE [Inputs counted once],
#: NOTE [Activations counted once] in shared.py; the ordinal of the first call of the
#: pass entered after all its kept storages died, or -1: NOTE [Graphs the forward drops];
#: the positions of the tensor arguments it saved, with their bytes, and of the tensors
#: it returned that it kept: NOTE [Whole calls counted once] in shared.py).
CallBooks = tuple[int, int, int, int, int, int, tuple[tuple[Position, int], ...], tuple[int, ...]]


class NativeKeep:
    """NOTE [Native keep] for one runtime. ``own_hooks`` returns the installed pair
    (pack, unpack), or None while nothing is installed."""

    def __init__(self, config: Config, own_hooks: Callable[[], tuple[Any, Any] | None]) -> None:
        self._config = config
        self._own_hooks = own_hooks
        self._books: dict[tuple[str, str, int], CallBooks] = {}
        self._runs: dict[tuple[str, str, int], tuple[int, int]] = {}
        """Per planned call: the passes left to its next audit, and its audits so far."""
        self.off = False
        """A native call may have taken the pair off the stack (``hooks_back`` puts it back)."""
        self._pending: list[tuple[RegionCall, tuple[str, str, int]]] = []
        """Calls of ``_pending_pass`` recorded with their kept storages still alive."""
        self._pending_pass: PassState | None = None
        self._seen_drops = 0  # the pending pass's ``resident_drops`` at the last look

    def _keeps_whole(self, call: RegionCall) -> bool:
        """``call`` keeps everything, by the forced keep mode or by its plan (NOTE [Kept
        planned calls]), and native keep is on: its record may be made or used."""
        return self._config.native_keep and keeps_whole(call, self._config.mode)

    def _audited(self, key: tuple[str, str, int], varies: bool) -> bool:
        """A planned call's turn to run with the hooks on (NOTE [Native keep]); a call of
        a region that varies (``varies``) has it four times as often."""
        left, audits = self._runs.get(key, (audit_gap(0, varies), 0))
        if left > 1:
            self._runs[key] = (left - 1, audits)
            return False
        self._runs[key] = (audit_gap(audits + 1, varies), audits + 1)
        return True

    def enter(self, call: RegionCall, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Take the runtime's hooks off for ``call`` if it may save natively; True if
        they came off (``exit`` puts them back). A call kept whole counts its tensor
        arguments ``args`` and ``kwargs`` once (NOTE [Whole calls counted once] in
        shared.py)."""
        p = call.pass_state
        if p is None:
            return False
        if self._pending:
            self._note_freed(p, call.ordinal)
        frees = p.native_frees
        if frees and frees[0][0] <= call.ordinal:
            _free(p, call.ordinal)
        if call.recorder is not None or not keeps_whole(call, self._config.mode):
            return False
        if self._native(p, call):
            taken = call.books[6]
            if taken:
                call.whole_shared = _shared_arguments(p, taken, args, kwargs)
            return True
        call.arg_ptrs = _argument_ptrs(args, kwargs)  # its saves find them (hooks.py)
        return False

    def _native(self, p: PassState, call: RegionCall) -> bool:
        """``enter`` for a call kept whole: True where it saves natively."""
        if not self._config.native_keep or call.watch is not None or call.inputs is not None:
            return False
        key = (p.signature, call.name, call.call_index)
        books = self._books.get(key)
        region = call.region
        varies = region is not None and region.variable and region.settled < SETTLED
        if books is None or (self._config.mode != "keep" and self._audited(key, varies)):
            return False
        own = self._own_hooks()
        top = tc.top_saved_tensors_hooks()
        if own is None or top is None or top[0] is not own[0]:
            return False
        self.off = True  # first: hooks_back reads the stack, so it never pushes the pair twice
        try:
            popped = tc.pop_sole_saved_tensors_hooks(own)
        except BaseException:  # an interrupt between the pop and the look beneath
            self.hooks_back()
            raise
        if not popped:  # another pair beneath ours
            self.off = False
            return False
        call.native = True
        call.books = books
        return True

    def hooks_back(self) -> None:
        """Put the runtime's pair back on the stack if a native call took it off, through
        interrupts (NOTE [Interrupts in cleanup])."""
        if not self.off:
            return
        own = self._own_hooks()
        if own is not None:
            finish(lambda: _on_top(own))
        self.off = False

    def exit(self, call: RegionCall, failed: bool, out: Any = None, inputs: Any = None) -> None:
        """``call`` ends, having taken ``inputs`` (its arguments and keyword arguments) and
        returned ``out``: put the hooks back and count its saves from its record, or
        record what it saved with the hooks on."""
        p = call.pass_state
        if call.native:
            self.hooks_back()  # first: the rest of the call's exit runs with the hooks on
            if failed or p is None or call.books is None:
                return
            saves, storages, kept, _, resident, freed_at, _, returned = call.books
            resident -= call.whole_shared  # NOTE [Whole calls counted once] in shared.py
            call.pack_count += saves
            stats = p.stats
            stats.storages += storages  # finish_pass adds len(call.storages): none here
            stats.kept_bytes += kept
            stats.add_resident(resident)
            held = [call.ordinal, resident]
            p.native_held.append(held)
            if freed_at > call.ordinal:
                heapq.heappush(p.native_frees, (freed_at, len(p.native_held), held))
            if returned:
                _count_returned(p, out, returned)
            return
        if failed or p is None:
            return
        if call.recorder is not None:
            _mark_positions(call, out, inputs)  # for the profile (StorageRecord.returned, .argument)
            return
        if call.arg_ptrs is None:  # not kept whole
            return
        returned = _returned_kept(p, call, out)
        if not self._keeps_whole(call):
            return
        if len(self._books) >= MAX_RECORDS:
            for old in list(itertools.islice(self._books, MAX_RECORDS // 2)):
                del self._books[old]
                self._runs.pop(old, None)
        recs = call.storages
        kept = sum(rec.nbytes for rec in recs)
        # NOTE [Activations counted once] in shared.py; an argument the record shares
        # with another counts in a native pass unless that one counts it then
        resident = sum(rec.nbytes for rec in recs if not rec.shared or rec.arg_pos is not None)
        small = sum(rec.nbytes < self._config.min_bytes for rec in recs)
        taken = tuple((rec.arg_pos, rec.nbytes) for rec in recs if rec.arg_pos is not None)
        key = (p.signature, call.name, call.call_index)
        self._books.pop(key, None)  # then last: the first forgotten are the least recent
        self._books[key] = (call.pack_count, len(recs), kept, small, resident, -1, taken, returned)
        if resident:
            if self._pending_pass is not p:
                self._pending = []
                self._pending_pass = p
                self._seen_drops = -1  # one look at the next entry: this call's storages may have died in it
            self._pending.append((call, key))

    def _note_freed(self, p: PassState, ordinal: int) -> None:
        """Call ``ordinal`` of ``p`` enters: the recorded calls of ``p`` whose kept
        storages all died since are booked as freed at this entry (NOTE [Graphs the
        forward drops])."""
        if p is not self._pending_pass or p.stage is not Stage.FORWARD:
            self._pending = []
            self._pending_pass = None
            return
        drops = p.stats.resident_drops
        if drops == self._seen_drops:
            return  # no kept storage of the pass died since the last look: all alive
        self._seen_drops = drops
        alive = []
        for call, key in self._pending:
            if any(rec.resident for rec in call.storages):
                alive.append((call, key))
                continue
            books = self._books.get(key)
            if books is not None:
                self._books[key] = (*books[:5], ordinal, *books[6:])
        self._pending = alive


def _argument_ptrs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[int, Position]:
    """The data pointer of each tensor argument's storage, to its first position (NOTE
    [Whole calls counted once] in shared.py)."""
    ptrs: dict[int, Position] = {}
    for pos, t in arg_tensors(args, kwargs):
        st = storage_of(t)
        if st is not None:
            ptrs.setdefault(st.data_ptr(), pos)
    return ptrs


def _shared_arguments(
    p: PassState, taken: tuple[tuple[Position, int], ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> int:
    """A native call kept whole saves the arguments at the positions of ``taken`` (with
    their bytes): the bytes of those another record counts already; each counts for
    the calls kept whole after it (NOTE [Whole calls counted once] in shared.py)."""
    shared = 0
    for pos, nbytes in taken:
        t = arg_at(args, kwargs, pos)
        st = storage_of(t) if isinstance(t, torch.Tensor) else None
        if st is not None and count_whole_input(p, st.data_ptr(), st):
            shared += nbytes
    return shared


def _count_returned(p: PassState, out: Any, returned: tuple[int, ...]) -> None:
    """A native call kept whole returned ``out``, of which it keeps the tensors at the
    positions ``returned``: they count for the others (NOTE [Whole calls counted
    once] in shared.py)."""
    for pos in returned:
        t = out if pos == 0 and isinstance(out, torch.Tensor) else out[pos] if isinstance(out, (tuple, list)) else None
        st = storage_of(t) if isinstance(t, torch.Tensor) else None
        if st is not None:
            count_whole_output(p, st)


def _returned_kept(p: PassState, call: RegionCall, out: Any) -> tuple[int, ...]:
    """A call kept whole, run with the hooks, returned ``out``: the positions of the
    tensors it returned whose storage it keeps, which count for the others from now on
    (NOTE [Whole calls counted once] in shared.py)."""
    positions = []
    for pos, t in out_tensors(out):
        rec = _record_of(call, t)
        if rec is not None and rec.placement is KEEP and rec.index >= 0:
            count_whole_output(p, rec())
            positions.append(pos)
    return tuple(positions)


def _mark_positions(call: RegionCall, out: Any, inputs: Any) -> None:
    """A measured call took ``inputs`` (its arguments and keyword arguments) and returned
    ``out``: its records of the storages under the tensors it returned are ``returned``,
    and those under its tensor arguments ``argument`` (``StorageRecord``'s; NOTE [Whole
    calls counted once] in shared.py)."""
    for _, t in out_tensors(out):
        rec = _record_of(call, t)
        if rec is not None:
            rec.returned = True
    if inputs is not None:
        for _, t in arg_tensors(*inputs):
            rec = _record_of(call, t)
            if rec is not None:
                rec.argument = True


def _record_of(call: RegionCall, t: torch.Tensor) -> Any:
    """``call``'s record of the storage under ``t``, or None."""
    st = storage_of(t)
    rec = call.by_ptr.get(st.data_ptr()) if st is not None else None
    return rec if rec is not None and rec() is st else None


def _free(p: PassState, ordinal: int) -> None:
    """Call ``ordinal`` of ``p`` enters: the native calls whose records say their kept
    storages died before it are no longer resident (NOTE [Graphs the forward drops])."""
    frees = p.native_frees
    stats = p.stats
    while frees and frees[0][0] <= ordinal:
        held = heapq.heappop(frees)[2]
        stats.resident_bytes -= held[1]  # a decrease sets no peak
        held[1] = 0


def _on_top(pair: tuple[Any, Any]) -> None:
    """``pair`` on top of this thread's stack: pushed unless it is there already."""
    top = tc.top_saved_tensors_hooks()
    if top is None or top[0] is not pair[0]:
        tc.push_saved_tensors_hooks(*pair)
