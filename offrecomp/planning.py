"""Between the runtime and the planner: profiles in, placements out, plans cached.

The first pass of every input-shape signature in ``auto`` mode is the *measuring* pass:
every region activation is dropped (as full checkpointing would) while the forward of
each region runs under the op recorder. At its end the runtime builds a
``scheduler.Profile`` from what it saw, resolves the budget, asks the solver for a plan
and caches it for the signature (bounded LRU). Later passes of the signature follow the
plan; a pass whose structure differs from the profile (more region calls, other
storage sizes) falls back to dropping for the unknown parts and triggers a new
measuring pass; measured step time drifting from the prediction beyond
``Config.drift`` triggers a re-plan with the measured times.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import statistics
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from offrecomp import hooks as _hooks
from offrecomp.config import format_bytes
from offrecomp.explain import (
    PLACEMENT_COLUMNS,
    cells,
    explain_forced,
    summarize,
    table,
)
from offrecomp.measure import device_capacity_bytes, distorts, host_available_bytes
from offrecomp.report import StepRecord
from offrecomp.state import PassState, RegionCall, Stage
from offrecomp.trace import RegionStructure, build_structure
from offrecomp.transfer import slot_offsets
from scheduler.cost_model import CostModel, Prediction, predict
from scheduler.plan import ROOT, Placement, Plan
from scheduler.profile import Profile, RegionRecord, StorageRecord

if TYPE_CHECKING:
    from offrecomp.runtime import Runtime

log = logging.getLogger(__name__)

#: A first solve slower than this compiled the planner's kernels: say so, once.
SLOW_FIRST_SOLVE_SECONDS = 5.0
_solved_once = False

__all__ = ["PlanEntry", "Planner"]

KEEP, OFFLOAD, RECOMPUTE = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE

OUTLIER_RATIO = 4.0
"""A planned pass reads a region's forward time, or the backward, as at most this many
times (and at least its inverse) the estimate: one pass slowed by something else on the
machine (a preempted thread, a busy neighbour) moves the average (weight 0.3) by 1.9x
at most, and a real change is followed within a few passes."""

CATCH_UP_SECONDS = 0.02
"""At a pass's start, deferred record reading and learning stops after this long (one
record is always read): NOTE [Bookkeeping off the critical path]."""

MAX_CALIBRATION_TRIES = 2
"""Calibration passes a host pause may send back (NOTE [Host pauses]); the pass after
the last of them is taken as it is."""


def _aligned(calls: list[RegionCall], regions: list[RegionRecord]) -> bool:
    """The pass's region calls are the profile's regions, one for one and in order."""
    return len(calls) == len(regions) and all(
        c.key == r.key and c.start_mark is not None and c.end_mark is not None
        for c, r in zip(calls, regions)
    )


def _shape(r: RegionRecord) -> tuple[Any, ...]:
    """What repeated blocks share: the same ops and the same storage sizes."""
    return (tuple(op.name for op in r.ops), tuple(s.nbytes for s in r.storages))


def _fill_from_peers(profile: Profile, skipped: set[tuple[str, int]]) -> list[str]:
    """Give each skipped region the forward time and op times of the median of its clean
    peers (regions of the same shape, NOTE [Host pauses]); the names of those with none."""
    clean: dict[tuple[Any, ...], list[RegionRecord]] = {}
    for r in profile.regions:
        if r.key not in skipped and r.ops:
            clean.setdefault(_shape(r), []).append(r)
    alone = []
    for r in profile.regions:
        if r.key not in skipped:
            continue
        peers = sorted(clean.get(_shape(r), []), key=lambda q: q.forward_seconds)
        if not peers:
            alone.append(f"{r.name}#{r.call_index}")
            continue
        peer = peers[len(peers) // 2]
        r.forward_seconds = peer.forward_seconds
        for op, q in zip(r.ops, peer.ops):
            op.seconds = q.seconds
        for st, qs in zip(r.storages, peer.storages):
            st.offset_seconds = qs.offset_seconds
    return alone


def _gaps(profile: Profile) -> list[float]:
    """The estimate's forward gaps: before the first region, between regions (from their
    start times) and after the last one, none below 0 (NOTE [Forward timeline])."""
    gaps, end = [], 0.0
    for r in profile.regions:
        gaps.append(max(0.0, r.start_seconds - end))
        end = max(end, r.start_seconds) + r.forward_seconds
    gaps.append(max(0.0, profile.forward_seconds - end))
    return gaps


@dataclass
class PlanEntry:
    """What the runtime knows about one signature."""

    signature: str
    family: str = ""
    """The signature without sizes (NOTE [Borrowed plans])."""
    dims: tuple[int, ...] = ()
    """The sizes of the signature's input tensors."""
    structures: dict[tuple[str, int], RegionStructure] = field(default_factory=dict)
    profile: Profile | None = None
    plan: Plan | None = None
    borrow_plan: Plan | None = None
    """The plan with every replay priced plainly: what passes that borrow this signature's
    plan run (NOTE [Borrowed plans]). Solved when first lent, dropped at every solve."""
    needs_measure: bool = True
    needs_solve: bool = False
    cost: CostModel | None = None
    """Smoothed timings of the signature, updated by every planned pass."""
    warned_infeasible: bool = False
    warned_over_budget: bool = False
    """A planned step's activations went over the budget (warned once per signature)."""
    calibration_ran: bool = False
    calibration_tries: int = 0
    """Calibration passes sent back for a host pause (NOTE [Host pauses])."""
    calibrated: bool = False
    """True once a calibration pass (no recorder, no offload) has replaced the measuring
    pass's times (NOTE [Calibration])."""
    drift_strikes: int = 0
    """Planned steps in the drift window so far (NOTE [Drift])."""
    drift_ratios: list[float] = field(default_factory=list)
    """Measured / predicted step time of those steps."""
    drift_replans: int = 0
    """Re-plans for drift in a row, each after a window that drifted."""
    drift_backoff: int = 0
    """The drift window is ``DRIFT_WINDOW << drift_backoff`` steps long."""
    drift_warned: bool = False
    drift_said_backoff: bool = False
    measured_peak_bytes: int | None = None
    """The activation peak of the pass the profile was measured in (every droppable save
    dropped): a budget it met is never called infeasible (NOTE [Small storages])."""
    budget_scale: float = 1.0
    """Shrinks after a device OOM in a planned step (see ``Planner.on_oom``)."""
    solved_replay_op_seconds: float = 0.0
    """``Planner.replay_op_seconds`` when the plan was solved."""
    live: Prediction | None = None
    """NOTE [Live prediction]: the plan predicted under the latest estimate (None until a
    planned pass has been learnt since the plan was solved)."""
    live_every: int = 1
    """Refresh ``live`` every this many learnt passes (keeps the refresh under ~2% of
    step time on profiles large enough for it to matter)."""
    live_skipped: int = 0
    trial: OffloadTrial = field(default_factory=lambda: OffloadTrial())
    """NOTE [Offload trial]: whether plans of this signature may offload."""
    next_plan: Plan | None = None
    """A plan already solved for the next solve to install (the trial's)."""
    regions_of: Profile | None = None
    regions_by_key: dict[tuple[str, int], RegionRecord] = field(default_factory=dict)
    """``regions_of``'s region records by call key (``Planner.assign``)."""
    placements_of: Plan | None = None
    placements_by_key: dict[tuple[str, int], list[Placement]] = field(default_factory=dict)
    """``placements_of``'s placements of each call's storages (``Planner.assign``)."""


#: A planned step whose activation peak passes its budget by more than this warns.
OVER_BUDGET = 1.05

#: NOTE [Drift]: planned steps whose median is judged against the prediction, ...
DRIFT_WINDOW = 8
#: ... re-plans in a row that may follow drifting windows before the window grows, ...
DRIFT_REPLANS = 2
#: ... and how many times it may double.
DRIFT_MAX_BACKOFF = 8

#: NOTE [Offload trial]: a plan that offloads is tried against one that does not when
#: its measured step exceeds its prediction by more than this ...
TRIAL_EXCESS = 0.10
#: ... over the median of this many planned passes; each plan then runs this many.
TRIAL_PASSES = 3


# NOTE [Offload trial]
# The model takes an offload that hides under compute to cost nothing. On a GPU its
# copies, events, the stash and the reloads also cost host time and stream waits the
# model does not see; where the forward is short (an H200 at 4K tokens: 1.5 ms a block)
# plans that offload ran 1.46x their prediction and 1.33x full recompute, while the
# plan solved for the same budget without offloading ran 1.07x its prediction and 0.88x
# full recompute. So the runtime checks the plan by measurement: when the median of
# TRIAL_PASSES planned passes of a plan that offloads is more than TRIAL_EXCESS over
# its prediction, it solves the same budget without offloading; if that plan fits the
# budget and is predicted faster than what the offloading plan measured, it runs for
# TRIAL_PASSES passes, and the faster of the two by measured median stays for the
# signature (re-plans included). Each signature is tried once.
@dataclass
class OffloadTrial:
    state: str = "watch"
    """watch (offloading allowed, plans checked), trial (running without), settled."""
    allow_offload: bool = True
    with_offload: list[float] = field(default_factory=list)
    without_offload: list[float] = field(default_factory=list)

    def observe(self, offloads: bool, measured: float, predicted: float | None) -> str | None:
        """One planned pass of a plan that ``offloads`` (or not), ``measured`` seconds
        against ``predicted``. Returns "try" (solve without offloading, and run it if it
        is predicted faster than ``self.measured_with()``), "keep" (the plan without
        offloading measured faster: keep it), "back" (it did not: offload again), or None."""
        if self.state == "watch" and offloads and predicted:
            self.with_offload = [*self.with_offload, measured][-TRIAL_PASSES:]
            if len(self.with_offload) == TRIAL_PASSES and self.measured_with() > (1.0 + TRIAL_EXCESS) * predicted:
                self.state = "trial"
                self.allow_offload = False
                return "try"
        elif self.state == "trial" and not offloads:
            self.without_offload.append(measured)
            if len(self.without_offload) == TRIAL_PASSES:
                self.state = "settled"
                if statistics.median(self.without_offload) <= self.measured_with():
                    return "keep"
                self.allow_offload = True
                return "back"
        return None

    def measured_with(self) -> float:
        return statistics.median(self.with_offload)

    def outcome(self) -> str:
        """The settled trial, as the step notes, the log and ``rt.explain()`` say it."""
        return (
            f"{1e3 * statistics.median(self.without_offload):.1f} ms without offloading, "
            f"{1e3 * self.measured_with():.1f} ms with: "
            + ("offloading stays off" if not self.allow_offload else "offloading again")
        )

    def cancel(self) -> None:
        """The plan without offloading does not fit or is not predicted faster."""
        self.state = "settled"
        self.allow_offload = True


#: NOTE [Borrowed plans]: a new signature at most this much larger, in every dimension,
#: than a profiled one of its family runs a plain full recompute instead of measuring.
GROWTH = 1.25


class Planner:
    def __init__(self, rt: Runtime) -> None:
        self.rt = weakref.proxy(rt)  # the runtime owns its planner: no cycle
        self.entries: OrderedDict[str, PlanEntry] = OrderedDict()
        self.sightings: OrderedDict[str, int] = OrderedDict()  # NOTE [Borrowed plans]
        self.last_entry: PlanEntry | None = None
        self.opaque_regions: set[str] = set()  # regions whose recording proved untrustworthy
        self.collective_regions: set[str] = set()  # regions seen running collectives
        self._pending: list[tuple[StepRecord, list[PassState]]] = []
        # NOTE [Bookkeeping off the critical path]: passes whose profile is still to be
        # built, with their replay marks and backward end as they were when they ended (a
        # later backward may still replay their regions and add marks)
        self._unplanned: list[tuple[PassState, list[tuple[int, Any, Any]], Any]] = []
        self._resolved: list[StepRecord] = []
        self._catching_up = False
        self._warned_unfinished = False
        self.last_forced: list[PassState] = []  # a forced mode's last step's passes, for explain()
        pinned = rt.config.replay_op_us
        self.replay_op_pinned = pinned is not None
        self.replay_op_seconds: float = (
            pinned * 1e-6 if pinned is not None else _hooks.SERVING_OVERHEAD_SECONDS
        )
        """Time a replay under the dispatch mode costs per op it sees (NOTE [Serving
        overhead]): learnt from the replays that run unless the config pins it."""

    # ------------------------------------------------------------ per pass

    def begin_pass(self, p: PassState) -> None:
        # a record's learning counts in that record's planner time, a profile build in p's
        self._catch_up(CATCH_UP_SECONDS, p)
        with _planner_time(p):
            self._begin_pass(p)

    # NOTE [Bookkeeping off the critical path]
    # A pass ends in autograd's backward-done callback, where the runtime closes the pass
    # and the step. Building a profile from a measuring pass, reading a step's times and
    # learning from them (the cost model, the replay cost, the live prediction, the
    # offload trial, the re-plan check) are not needed until the next pass begins: done in
    # the callback, they sit between the backward and whatever the training loop does
    # next (the optimizer step, the next batch's forward) and, on GPU, the event reads
    # there may wait for the device. So the callback only queues that work;
    # `_catch_up` does it at the next pass's start (`begin_pass`, before the pass's first
    # mark, so outside its timing), or when the runtime waits for its records
    # (`resolve(wait=True)`: `report()`, leaving the context). A profile is built before
    # the next pass is placed (it decides whether that pass calibrates); the records are
    # read in order, and at a pass's start only those whose events have landed and only
    # for `CATCH_UP_SECONDS` (one record at least). A calibration a record still holds
    # back is read with a wait before the pass that needs its plan
    # (`_begin_pass`, NOTE [Calibration]), so plans are ready as before: a signature
    # measures, calibrates and plans from its third pass.

    def _catch_up(self, seconds: float | None, holder: PassState | None = None) -> None:
        """Deferred end-of-pass work (NOTE [Bookkeeping off the critical path]): every
        queued profile build (its time counted in ``holder``'s planner time), then the
        records whose times can be read, for at most ``seconds`` (None: all of them,
        waiting for their events)."""
        if self._catching_up:
            return
        self._catching_up = True
        try:
            while self._unplanned:
                p, marks, end = self._unplanned.pop(0)
                try:
                    with _planner_time(holder if holder is not None else p):
                        self._plan_from(p, marks, end)
                except Exception:
                    entry = self.entries.get(p.signature)
                    if entry is not None:
                        entry.needs_measure = True
                    raise
            self._resolve(wait=seconds is None, seconds=seconds)
        finally:
            self._catching_up = False

    def _begin_pass(self, p: PassState) -> None:
        cfg = self.rt.config
        user = self.rt._user_plan
        if cfg.mode != "auto":
            p.phase = "user-plan" if user is not None else cfg.mode
            p.plan_id = user.plan_id if user is not None else ""
            return
        p.plan_signature = p.signature
        if user is None and p.signature not in self.entries:
            donor, seen = self._donor(p)
            if donor is not None and donor.borrow_plan is not None:
                p.planned = True
                p.phase = "borrowed"
                p.plan_signature = donor.signature
                p.plan_id = donor.borrow_plan.plan_id
                return
            if not seen and self._grows_from_profiled(p):
                # NOTE [Borrowed plans]: a little larger than a profiled signature (a
                # sequence-length warmup): a plain full recompute, not a measuring pass
                p.phase = "recompute"
                return
        entry = self._entry(p.signature, p)
        if entry.needs_measure or entry.profile is None:
            p.recording = True
            p.phase = "measure"
            return
        if user is None and not entry.calibrated and entry.calibration_ran:
            # A calibration pass ran but its (device) times were not read yet: read them
            # now, once per signature, rather than calibrating twice.
            self.resolve(wait=True)
        if user is None and not entry.calibrated:
            # NOTE [Calibration]: the measuring pass ran under the op recorder, whose
            # overhead inflates every time it saw (on GPU the device starves while the
            # host records). The next pass drops the same activations without the
            # recorder and without offload; its region times replace the recorded ones
            # before the first plan is solved.
            p.phase = "calibrate"
            entry.calibration_ran = True
            return
        if user is None and (entry.needs_solve or entry.plan is None):
            self._solve(entry)
        p.planned = True
        p.phase = "user-plan" if user is not None else "planned"
        plan = self.active_plan(entry)
        p.plan_id = plan.plan_id if plan is not None else ""

    def active_plan(self, entry: PlanEntry) -> Plan | None:
        """The user's plan when one is set, else the solver's."""
        return self.rt._user_plan if self.rt._user_plan is not None else entry.plan

    # NOTE [Borrowed plans]
    # Batches padded to their longest sequence (dynamic padding, a smaller last batch)
    # give a new signature at almost every step. Measuring each (a full recompute under
    # the op recorder) and calibrating it would keep auto at measuring speed for good,
    # slower than plain full recompute. A new signature whose family (the signature
    # without sizes) has a profiled signature at least as large in every input dimension
    # runs that donor's plan instead: the same code saves the same storages, in the same
    # order, each no larger than the donor's, so the donor's peak bounds this pass's.
    # Each storage is checked against the donor's size; a larger one (code whose saves
    # depend on the shape) drops the rest of its call's activations, and the signature
    # measures its own profile at its next pass. Replays run plainly: the donor's op
    # recording is another shape's. So the plan a borrowing pass runs is the donor's
    # profile solved again with every replay priced plainly (``PlanEntry.borrow_plan``):
    # the donor's own plan may drop a few late outputs of every block, cheap when served,
    # which plain replays pay for with each block's whole prefix. A signature seen before
    # measures its own profile while the plan cache has room (bucketed lengths get their
    # own plans); otherwise it borrows. A donor without a plan yet (measured, not calibrated) is solved from
    # its measured profile. Borrowed passes teach no cost model and predict nothing.
    # A new signature that no profiled one covers, but that exceeds one by at most
    # GROWTH (25%) in every dimension, runs a plain full recompute on first sight rather
    # than a measuring pass: a sequence-length warmup grows the length a little at every
    # step, and measured at every step (1.9x full recompute); now it measures each time
    # the length has grown by a quarter. Seen again, such a signature measures.
    SIGHTINGS = 256  # new signatures remembered for the "seen before" rule

    def _donor(self, p: PassState) -> tuple[PlanEntry | None, int]:
        """The profiled signature whose plan ``p`` may run (NOTE [Borrowed plans]), and
        how often ``p``'s signature was seen before."""
        if not p.family or not p.dims:
            return None, 0
        seen = self.sightings.pop(p.signature, 0)
        self.sightings[p.signature] = seen + 1
        while len(self.sightings) > self.SIGHTINGS:
            self.sightings.popitem(last=False)
        if seen and len(self.entries) < self.rt.config.plan_cache_size:
            return None, seen  # seen before, and room for a plan of its own
        covering = [
            e for e in self._profiled_kin(p)
            if not e.needs_measure and all(a >= b for a, b in zip(e.dims, p.dims))
        ]
        best = min(covering, key=lambda e: sum(e.dims), default=None)
        if best is None:
            return None, seen
        if best.plan is None or best.needs_solve:
            self._solve(best)
        if best.borrow_plan is None:
            self._solve_borrow_plan(best)
        self.entries.move_to_end(best.signature)  # a donor in use stays cached
        return best, seen

    def _grows_from_profiled(self, p: PassState) -> bool:
        """``p`` exceeds a profiled signature of its family by at most GROWTH in every
        dimension: too close to be worth a measuring pass of its own on first sight."""
        return any(all(b <= GROWTH * a for a, b in zip(e.dims, p.dims)) for e in self._profiled_kin(p))

    def _profiled_kin(self, p: PassState) -> Iterator[PlanEntry]:
        """Profiled signatures of ``p``'s family, sizes comparable dimension by dimension."""
        if not p.family or not p.dims:
            return
        for e in self.entries.values():
            if e.family == p.family and len(e.dims) == len(p.dims) and e.profile is not None:
                yield e

    def _entry(self, signature: str, p: PassState | None = None) -> PlanEntry:
        entry = self.entries.get(signature)
        if entry is None:
            entry = PlanEntry(signature)
            if p is not None:
                entry.family, entry.dims = p.family, p.dims
            self.entries[signature] = entry
            while len(self.entries) > self.rt.config.plan_cache_size:
                old, _ = self.entries.popitem(last=False)
                log.info("offrecomp: plan cache full, dropped the plan of signature %s", old)
        else:
            self.entries.move_to_end(signature)
        return entry

    def assign(self, p: PassState, call: RegionCall) -> None:
        """Give a new region call its planned placements and structure."""
        if p.phase == "calibrate" and not call.is_root:
            # NOTE [Calibration]: no placements (everything drops), but the structure,
            # so that each plain replay knows where it stops
            entry = self.entries.get(p.signature)
            if entry is not None:
                call.structure = entry.structures.get(call.key)
                if call.structure is None:
                    self._record_unprofiled(p, call)
            return
        if not p.planned:
            return
        entry = self.entries.get(p.plan_signature or p.signature)
        plan = self.active_plan(entry) if entry is not None else None
        if entry is not None and p.phase == "borrowed":
            plan = entry.borrow_plan
        if entry is None or plan is None:
            return
        if call.is_root:
            n = len(entry.profile.root) if entry.profile is not None else 0
            call.placements = [plan.placement((ROOT, 0, i)) for i in range(n)]
            return
        structure = entry.structures.get(call.key)
        if p.phase == "borrowed":
            # NOTE [Borrowed plans]: the donor's placements, checked against its sizes;
            # no structure, so replays run plainly (the recording is another shape's).
            # A call the donor lacks drops its activations (the measuring pass's rule).
            if structure is not None:
                recs = structure.storage_records
                call.borrowed_sizes = [r.nbytes for r in recs]
                call.placements = [
                    KEEP if r.kind == "external" and i not in structure.small_storages
                    else plan.placement((call.name, call.call_index, i))
                    for i, r in enumerate(recs)
                ]
            return
        if structure is None:
            self._record_unprofiled(p, call)
            return
        call.structure = structure
        key = call.key
        if entry.profile is not None:
            if entry.regions_of is not entry.profile:  # one index per profile, not a scan per call
                entry.regions_of = entry.profile
                entry.regions_by_key = {r.key: r for r in entry.profile.regions}
            r = entry.regions_by_key.get(key)
            if r is not None and len(r.ops) == len(structure.op_records):
                call.op_seconds = [op.seconds for op in r.ops]
        n = len(structure.storage_records)
        if entry.placements_of is not plan:
            entry.placements_of = plan
            entry.placements_by_key = {}
        placements = entry.placements_by_key.get(key)
        if placements is None or len(placements) != n:
            placements = entry.placements_by_key[key] = [
                plan.placement((call.name, call.call_index, i)) for i in range(n)
            ]
        call.placements = list(placements)  # a call may change its own (fallbacks)

    # NOTE [Calls the profile lacks]
    # The number of calls of a region may depend on the data (adaptive depth, a loop that
    # runs until a halting score is reached) while the input shapes, and so the
    # signature, stay the same. A planned pass that reaches a call its profile lacks
    # drops that call's activations (the measuring pass's rule, safe for memory) and
    # records its ops, as a measuring pass would; the pass's end builds the profile
    # again from all of its calls (the planned ones keep their structures) and the next
    # pass calibrates. A profile built so covers the longer pass, and a plan solved from
    # it also serves the shorter ones: calls that do not run leave their share of the
    # budget unused. Before, that call set needs_measure, and the next pass, often a
    # shorter one, measured a profile without those calls again: depths that
    # alternated re-measured (full recompute) every few steps, for good.

    def _record_unprofiled(self, p: PassState, call: RegionCall) -> None:
        call.record = True
        p.reprofile = True
        log.info(
            "offrecomp: region %r call %d is not in the profile of signature %s; recording "
            "it in this pass (its activations dropped) to extend the profile",
            call.name, call.call_index, p.signature,
        )

    def needs_capture(self, p: PassState, call: RegionCall) -> bool:
        """Keep a replay checkpoint for this call? Not when nothing can ever be dropped.

        Under a plan the checkpoint is always taken: region inputs are storages 0..m-1
        of every call (NOTE [Identity of a saved tensor]), and the plan may place them.
        """
        return not (self.rt._user_plan is None and self.rt.config.mode in ("keep", "offload"))

    def mismatch(self, p: PassState, call: RegionCall, index: int, *, borrowed: bool) -> None:
        """``call``'s storage ``index`` is not the one its plan placed: the rest of the
        call is placed as while measuring (placement.py), and the signature measures
        again. ``borrowed``: the storage is larger than the donor plan's (NOTE [Borrowed
        plans])."""
        call.mismatch = True
        if borrowed:
            if p.signature not in self.entries:
                self._entry(p.signature, p)
            log.info(
                "offrecomp: region %r call %d saves storage %d larger than in the plan of "
                "signature %s that this pass borrowed; dropping its activations this pass, "
                "measuring signature %s next time",
                call.name, call.call_index, index, p.plan_signature, p.signature,
            )
            return
        entry = self.entries.get(p.signature)
        if entry is not None:
            entry.needs_measure = True
        structure = call.structure
        if structure is not None and not structure.opaque:
            # What ran unrecorded differs from what was recorded (code that behaves
            # differently under a dispatch mode): never trust the recording of this
            # region again.
            structure.opaque = True
            self.opaque_regions.add(call.name)
        log.info(
            "offrecomp: region %r call %d differs from its profile (storage %d); "
            "dropping its activations this pass and measuring again",
            call.name, call.call_index, index,
        )

    def record_structure(self, call: RegionCall) -> None:
        """Region forward returned in a measuring pass: derive its structure."""
        rec = call.recorder
        if rec is None:
            return
        call.recorder = None
        if rec.collective and self.rt._distributed:  # NOTE [Collective regions]
            self.collective_regions.add(call.name)
            call.collective = True
            if call.region is not None:
                self.rt._warn_collective(call.region)
        min_bytes = self.rt.config.min_bytes
        region = call.region
        used = region.forward_used if region is not None else ()
        kinds = []
        for s in call.storages:
            if s.kind == "input":
                kinds.append("input")
            elif s.nbytes < min_bytes or s.aliased or s.index in used:
                # always kept: planned as fixed (aliased: NOTE [Untracked aliases]; read
                # in the forward: NOTE [Backward inside a forward])
                kinds.append("external")
            else:
                kinds.append("activation")
        call.structure = build_structure(
            rec,
            call.saves,
            [s.sid for s in call.storages],
            [s.nbytes for s in call.storages],
            kinds,
            rec.op_seconds() if not rec._events else [0.0] * len(rec.ops),
            call.start_mark.host if call.start_mark is not None else 0.0,
            compiled=region is not None
            and (region.compiled or region.backward_in_forward or call.name in self.opaque_regions),
        )
        recs = call.structure.storage_records
        call.structure.small_storages = tuple(
            i for i, s in enumerate(call.storages)
            if kinds[i] == "external" and s.nbytes < min_bytes and not s.aliased
            and s.index not in used and recs[i].producer_op >= 0
        )
        call.recorded_ops = rec  # op events are resolved at the end of the pass (CUDA)
        call.saves = []

    def end_pass(self, p: PassState) -> None:
        """Queue the pass's profile build, when it has one to make (NOTE [Bookkeeping off
        the critical path])."""
        with _planner_time(p):
            self._end_pass(p)

    def _end_pass(self, p: PassState) -> None:
        if p.recording:
            if not p.aborted and p.stage is not Stage.DONE and p.calls and not self._warned_unfinished:
                self._warned_unfinished = True
                log.warning(
                    "offrecomp: the measuring pass of signature %s ended before its backward "
                    "ran (the runtime's context exited after the forward). auto plans only "
                    "from passes whose forward and backward both run inside `with rt:`; "
                    "until one does, every pass is measured again (full recompute)",
                    p.signature,
                )
            if p.aborted or p.stage is not Stage.DONE:
                return  # measure again next time
        elif not (p.reprofile and not p.aborted and p.stage is Stage.DONE):
            return
        # the recorded structure now (cheap, and what rt.set_plan() users read); the
        # profile, which reads the pass's times, at the next pass's start
        self._entry(p.signature, p).structures = {
            c.key: c.structure for c in p.calls if c.structure is not None
        }
        self._unplanned.append((p, list(p.replay_marks), p.backward_end_mark))

    # ------------------------------------------------------------ planning

    def _plan_from(self, p: PassState, replay_marks: list[tuple[int, Any, Any]], end_mark: Any) -> None:
        """Build the signature's profile from the measuring (or re-profiling) pass ``p``,
        whose replay marks and backward end were ``replay_marks`` and ``end_mark`` when it
        ended."""
        rt = self.rt
        clock = rt._clock
        entry = self._entry(p.signature, p)
        regions: list[RegionRecord] = []
        structures: dict[tuple[str, int], RegionStructure] = {}
        replay_by_ordinal: dict[int, tuple[Any, Any]] = {}
        total_replay = 0.0
        for ordinal, a, b in replay_marks:
            replay_by_ordinal.setdefault(ordinal, (a, b))
            total_replay += clock.seconds(a, b, wait=True) or 0.0
        order = sorted(replay_by_ordinal)  # backward replays in descending ordinal
        for call in p.calls:
            st = call.structure
            if st is None:
                continue
            rec = getattr(call, "recorded_ops", None)
            if rec is not None and rec._events:
                secs = rec.op_seconds()  # CUDA events: resolved now, after backward
                for op, s in zip(st.op_records, secs):
                    op.seconds = float(s)
            fwd = clock.seconds(call.start_mark, call.end_mark, wait=True) or 0.0
            bwd = self._backward_seconds(end_mark, call.ordinal, order, replay_by_ordinal)
            storages = [StorageRecord(**vars(s)) for s in st.storage_records]
            regions.append(
                RegionRecord(
                    name=call.name,
                    call_index=call.call_index,
                    start_seconds=clock.seconds(p.start_mark, call.start_mark, wait=True) or 0.0,
                    forward_seconds=fwd,
                    backward_seconds=bwd if bwd is not None else 2.0 * fwd,
                    ops=list(st.op_records),
                    storages=storages,
                    opaque=st.opaque,
                    replayable=not call.collective
                    and not (call.region is not None and (call.region.writes_state or call.region.reaches_out)),
                )
            )
            structures[call.key] = st
        root_records: list[StorageRecord] = []
        if p.root is not None:
            for s in p.root.storages:
                root_records.append(
                    StorageRecord(
                        nbytes=s.nbytes,
                        kind=(
                            "activation"
                            if s.nbytes >= rt.config.min_bytes and not s.aliased
                            else "external"
                        ),
                        offset_seconds=clock.seconds(p.start_mark, s.save_mark, wait=True) or 0.0,
                    )
                )
        fwd_total = clock.seconds(p.start_mark, p.backward_start_mark, wait=True) or 0.0
        bwd_total = clock.seconds(p.backward_start_mark, end_mark, wait=True) or 0.0
        device = rt._device or torch.device("cpu")
        d2h, h2d = self._link_gbps(device)
        profile = Profile(
            signature=p.signature,
            device=device.type,
            forward_seconds=fwd_total,
            backward_seconds=max(0.0, bwd_total - total_replay),
            d2h_gbps=d2h,
            h2d_gbps=h2d,
            regions=regions,
            root=root_records,
            device_capacity_bytes=device_capacity_bytes(device),
            meta={"torch": torch.__version__},
        )
        if p.device_peak is not None:
            profile.fixed_bytes = max(0, p.alloc_start + p.device_peak - p.stats.peak_resident_bytes)
        entry.structures = structures
        entry.calibrated = False
        entry.calibration_ran = False
        entry.calibration_tries = 0
        entry.cost = CostModel()
        entry.cost.update(profile, take=True)
        entry.profile = profile
        if rt.config.profile_path:
            # the measured profile now; each solve overwrites it with the calibrated one
            profile.save(rt.config.profile_path)
            log.info("offrecomp: profile of signature %s saved to %s", p.signature, rt.config.profile_path)
        entry.needs_measure = False
        entry.needs_solve = True
        entry.plan = entry.borrow_plan = None
        entry.measured_peak_bytes = p.stats.peak_resident_bytes  # every droppable save dropped
        self.last_entry = entry

    def _backward_seconds(
        self, end_mark: Any, ordinal: int, order: list[int], marks: dict[int, tuple[Any, Any]]
    ) -> float | None:
        """Backward time of one region call, from the replay marks of the measuring pass."""
        if ordinal not in marks:
            return None
        clock = self.rt._clock
        _, end = marks[ordinal]
        i = order.index(ordinal)
        nxt = marks[order[i - 1]][0] if i > 0 else end_mark
        return clock.seconds(end, nxt, wait=True)

    def _link_gbps(self, device: torch.device) -> tuple[float, float]:
        cfg = self.rt.config
        if device.type != "cuda":
            return (cfg.d2h_gbps or 0.0, cfg.h2d_gbps or 0.0)
        d2h = cfg.d2h_gbps
        h2d = cfg.h2d_gbps
        if d2h is None or h2d is None:
            md2h, mh2d = _probe_link(device)
            d2h = d2h if d2h is not None else md2h
            h2d = h2d if h2d is not None else mh2d
        return (d2h, h2d)

    def budget_bytes(self, profile: Profile) -> int | None:
        cfg = self.rt.config
        device = self.rt._device or torch.device("cpu")
        if cfg.budget is not None:
            if cfg.budget.nbytes is not None:
                return cfg.budget.nbytes
            return cfg.budget.resolve(profile.device_capacity_bytes)
        if device.type == "cuda":
            cap = profile.device_capacity_bytes
            return max(0, int(cap * (1.0 - cfg.budget_margin)) - profile.fixed_bytes)
        return int(host_available_bytes() * (1.0 - cfg.budget_margin))

    def _entry_budget(self, entry: PlanEntry) -> int | None:
        """The budget ``entry``'s plans are solved for (shrunk after a device OOM)."""
        assert entry.profile is not None
        budget = self.budget_bytes(entry.profile)
        if budget is not None and entry.budget_scale < 1.0:
            budget = int(budget * entry.budget_scale)
        return budget

    @staticmethod
    def _allow_offload(entry: PlanEntry, profile: Profile) -> bool:
        """Offloading needs a GPU and a measured or configured link, and a signature whose
        trial did not settle against it (NOTE [Offload trial])."""
        return (
            entry.trial.allow_offload
            and profile.device == "cuda"
            and profile.d2h_gbps > 0
            and profile.h2d_gbps > 0
        )

    def _solve_plan(self, entry: PlanEntry, *, allow_offload: bool | None = None) -> Plan:
        """Solve ``entry``'s profile, at its budget, as its replays are priced now."""
        cfg = self.rt.config
        profile = entry.profile
        assert profile is not None
        from scheduler.solver import solve

        global _solved_once
        t0 = time.perf_counter()
        plan = solve(
            profile,
            budget_bytes=self._entry_budget(entry),
            max_overhead=cfg.max_overhead,
            prefetch_regions=cfg.prefetch.regions or 2,
            allow_offload=self._allow_offload(entry, profile) if allow_offload is None else allow_offload,
            infeasible="warn",  # the entry's own plan raises in _solve, after the frugal end
            log_infeasible=False,
        )
        seconds = time.perf_counter() - t0
        if not _solved_once and seconds > SLOW_FIRST_SOLVE_SECONDS:
            log.warning(
                "offrecomp: the first plan of this process took %.1f s, most of it compiling "
                "the planner's kernels (numba). They are cached on disk for later processes "
                "on this machine; `python -m offrecomp warmup` compiles them ahead (in a "
                "container image's build, say)",
                seconds,
            )
        _solved_once = True
        return plan

    # NOTE [Small storages]
    # Storages under min_bytes are kept by every plan: a copy of one costs more than it
    # saves, and dropping one pays for a replay that plans which keep the rest of its
    # region would not run. With small activations (small configs, LoRA's rank-r
    # intermediates) they are most of a region's saves, and the most frugal plan that
    # keeps them holds more than the measuring pass, which dropped them as forced
    # recompute and torch.utils.checkpoint do. So a budget no plan meets is solved again
    # with those storages droppable (never offloaded: the runtime keeps a small storage a
    # plan offloads), and the plan with the lower predicted peak runs. The budget is
    # called infeasible only when the measuring pass did not meet it either, and the
    # smallest feasible budget named is the lower of that pass's peak and the frugal
    # plan's prediction; the warning waits for the first planned step, whose measured
    # peak bounds it too (NOTE [Infeasible budgets]).

    def _frugal_end(self, entry: PlanEntry, plan: Plan) -> Plan:
        """The most frugal of ``plan`` (infeasible) and the plan solved with every small
        storage of a replayable region droppable; raises for ``infeasible='error'``."""
        profile = entry.profile
        assert profile is not None
        small = {
            key: st.small_storages for key, st in entry.structures.items() if st.small_storages
        }
        convert = [
            (r, i) for r in profile.regions if r.replayable and (r.name, r.call_index) in small
            for i in small[(r.name, r.call_index)] if i < len(r.storages) and r.storages[i].kind == "external"
        ]
        if convert:
            for r, i in convert:
                r.storages[i].kind = "activation"
            try:
                frugal = self._solve_plan(entry, allow_offload=False)
            finally:
                for r, i in convert:
                    r.storages[i].kind = "external"
            if frugal.feasible or (frugal.predicted_peak_bytes or 0) < (plan.predicted_peak_bytes or 0):
                plan = frugal
        measured = entry.measured_peak_bytes
        budget = plan.budget_bytes
        if plan.feasible or budget is None:
            return plan
        plan.notes = [n for n in plan.notes if "cannot be met" not in n]
        if measured is not None and measured <= budget:
            plan.feasible = True
            plan.min_feasible_budget_bytes = None
            plan.notes.append(
                f"the most frugal plan is predicted to hold {format_bytes(plan.predicted_peak_bytes or 0)}, "
                f"above the budget {format_bytes(budget)}, but the measuring pass (every droppable "
                f"save dropped) held {format_bytes(measured)}, within it; this is the most "
                "memory-frugal plan"
            )
            return plan
        smallest = min(x for x in (plan.min_feasible_budget_bytes, measured, plan.predicted_peak_bytes) if x)
        plan.min_feasible_budget_bytes = smallest
        if self.rt.config.infeasible == "error":
            from scheduler.solver import InfeasibleBudgetError

            raise InfeasibleBudgetError(budget, smallest)
        plan.notes.append(_infeasible_note(budget, smallest))
        return plan

    #: Replay cost per op under the dispatch mode that makes every replay plain.
    PLAIN_REPLAY_OP_SECONDS = 1.0

    def _solve_borrow_plan(self, entry: PlanEntry) -> None:
        """NOTE [Borrowed plans]: a borrowing pass replays plainly (the donor's recording is
        another shape's, so nothing is served), running each replayed block up to its
        last dropped save. The plan it runs is solved for that: the same profile and
        budget with every replay priced as a plain one, which drops whole prefixes where
        the served plan would drop a few late outputs of every block."""
        profile = entry.profile
        assert profile is not None
        saved = profile.replay_op_seconds
        profile.replay_op_seconds = self.PLAIN_REPLAY_OP_SECONDS
        try:
            plan = self._solve_plan(entry)
        finally:
            profile.replay_op_seconds = saved
        entry.borrow_plan = plan
        self._pin_ahead(self._offloaded_sizes(profile, plan))
        log.info(
            "offrecomp: plan %s for passes borrowing signature %s (replays priced plainly): "
            "predicted peak %s, predicted step %.4fs",
            plan.plan_id, entry.signature, format_bytes(plan.predicted_peak_bytes or 0),
            plan.predicted_step_seconds or 0.0,
        )

    @staticmethod
    def _offloaded_sizes(profile: Profile, plan: Plan) -> list[int]:
        """The pinned block of each region call's offload group (the root's as one)."""
        blocks = []
        for r in profile.regions:
            sizes = [
                s.nbytes for i, s in enumerate(r.storages)
                if plan.placement((r.name, r.call_index, i)) == OFFLOAD
            ]
            blocks.append(slot_offsets(sizes)[1])
        root = [s.nbytes for i, s in enumerate(profile.root) if plan.placement((ROOT, 0, i)) == OFFLOAD]
        return [n for n in [*blocks, slot_offsets(root)[1]] if n > 0]

    def _solve(self, entry: PlanEntry) -> None:
        cfg = self.rt.config
        profile = entry.profile
        assert profile is not None
        # NOTE [Serving overhead]: price replays as the runtime will run them
        profile.replay_op_seconds = self.replay_op_seconds
        entry.solved_replay_op_seconds = self.replay_op_seconds
        plan = entry.next_plan if entry.next_plan is not None else self._solve_plan(entry)
        entry.next_plan = None
        entry.borrow_plan = None  # solved again when next lent
        if not plan.feasible:
            plan = self._frugal_end(entry, plan)
        entry.plan = plan
        entry.needs_measure = False
        entry.needs_solve = False
        entry.drift_strikes = 0
        entry.drift_ratios.clear()  # a new prediction: a new window
        entry.live = None
        entry.live_skipped = 0
        self.last_entry = entry
        if cfg.profile_path:
            # the profile this plan was solved with (calibrated, smoothed): the latest wins
            profile.save(cfg.profile_path)
            log.info("offrecomp: profile of signature %s saved to %s", entry.signature, cfg.profile_path)
        counts = plan.counts()
        nbytes = {p: 0 for p in Placement}
        for r in profile.regions:
            for i, s in enumerate(r.storages):
                nbytes[plan.placement((r.name, r.call_index, i))] += s.nbytes
        self._pin_ahead(self._offloaded_sizes(profile, plan))
        log.info(
            "offrecomp: plan %s for %s: keep %d (%s), offload %d (%s), recompute %d (%s); "
            "budget %s, predicted peak %s, predicted step %.4fs%s",
            plan.plan_id, entry.signature,
            counts[KEEP], format_bytes(nbytes[KEEP]), counts[OFFLOAD], format_bytes(nbytes[OFFLOAD]),
            counts[RECOMPUTE], format_bytes(nbytes[RECOMPUTE]),
            "none" if plan.budget_bytes is None else format_bytes(plan.budget_bytes),
            format_bytes(plan.predicted_peak_bytes or 0), plan.predicted_step_seconds or 0.0,
            "" if plan.feasible else " (budget NOT met: " + "; ".join(plan.notes) + ")",
        )
        log.info(
            "offrecomp: the plan's inputs: forward %.4fs (regions %.4fs), backward %.4fs "
            "(regions %.4fs), ops %.4fs, link %.1f/%.1f GB/s, replay %.1f us per op; predicted "
            "forward %.4fs, replay %.4fs, stall %.4fs",
            profile.forward_seconds, sum(r.forward_seconds for r in profile.regions),
            profile.backward_seconds, sum(r.backward_seconds for r in profile.regions),
            sum(op.seconds for r in profile.regions for op in r.ops),
            profile.d2h_gbps, profile.h2d_gbps, 1e6 * profile.replay_op_seconds,
            plan.predicted_forward_seconds, plan.predicted_recompute_seconds,
            plan.predicted_stall_seconds,
        )

    def _pin_ahead(self, sizes: list[int]) -> None:
        """Pin the plan's host memory now, outside any step: the pool would otherwise pin
        it inside the first planned step (seconds for gigabytes), which that step's
        timing, and the drift check, would take for the plan's cost."""
        if not sizes:
            return
        rt = self.rt
        t0 = time.perf_counter()
        engine = rt._get_engine()
        # NOTE [Window under a plan]: the plan counts in-flight bytes itself
        reserved = engine.prepare(sizes, window_bytes=max(engine.window_bytes, sum(sizes)))
        log.info(
            "offrecomp: pinned pool ready for %s of planned offloads: %s reserved in %.2fs",
            format_bytes(sum(sizes)), format_bytes(reserved), time.perf_counter() - t0,
        )

    def on_oom(self, p: PassState | None) -> None:
        """A device OOM escaped a pass: the next pass of its signature gets a safer plan.

        Each OOM shrinks the signature's budget to 70%; the plan is solved again before
        the next pass. An OOM in a measuring pass (everything already dropped) can only
        be helped by a smaller budget for the plan that follows.
        """
        if p is None:
            return
        entry = self.entries.get(p.signature)
        if entry is None:
            if p.phase == "borrowed":  # NOTE [Borrowed plans]: its own profile from now on
                self._entry(p.signature, p)
                log.warning(
                    "offrecomp: device out of memory in a pass of signature %s that ran the "
                    "plan of %s; it measures its own profile next time",
                    p.signature, p.plan_signature,
                )
            return
        entry.budget_scale *= 0.7
        entry.needs_solve = entry.profile is not None
        entry.next_plan = None  # solved for the old budget
        log.warning(
            "offrecomp: device out of memory in a %s pass of signature %s; later passes plan "
            "for %.0f%% of the budget",
            p.phase or "planned", p.signature, 100 * entry.budget_scale,
        )

    # ------------------------------------------------------------- reports

    def step_record(self, step: int, passes: list[PassState]) -> StepRecord:
        """The record of one step; its times are filled by :meth:`resolve`.

        NOTE [Lazy timing]: on GPU, times come from CUDA events that complete after the
        host has moved on. A record waits in ``_pending`` until its events have landed
        (checked with ``query()``, never a host sync in the training loop); ``report()``
        and leaving the context wait for the rest.
        """
        rt = self.rt
        first, last = passes[0], passes[-1]
        rec = StepRecord(step=step, passes=len(passes), signature=first.signature, mode=rt.config.mode)
        rec.phase = first.phase
        # a step of several passes (gradient accumulation) shows each phase it ran: its
        # first step measures and then calibrates ("measure+calibrate")
        rec.phases = "+".join(dict.fromkeys(p.phase for p in passes))
        rec.plan_id = first.plan_id
        rec.wall_seconds = max(0.0, last.end_time - first.start_time)
        rec.planner_seconds = sum(p.planner_seconds for p in passes)
        for p in passes:
            s = p.stats
            rec.peak_activation_bytes = max(rec.peak_activation_bytes, s.peak_resident_bytes)
            rec.kept_bytes += s.kept_bytes
            rec.offloaded_bytes += s.offloaded_bytes
            rec.recomputed_bytes += s.recomputed_bytes
            rec.input_bytes += s.input_bytes
            rec.replays += s.replays
            rec.served_ops += s.served_ops
            rec.rerun_ops += s.rerun_ops
            rec.saved_tensors += s.saved_tensors
            rec.storages += s.storages
            for k, v in s.fallbacks.items():
                rec.fallbacks[k] = rec.fallbacks.get(k, 0) + v
            if p.device_peak is not None:
                rec.device_peak_bytes = max(rec.device_peak_bytes or 0, p.device_peak)
            o = p.offload_stats
            if o is not None:
                rec.backend = getattr(o, "backend", "")
                rec.d2h_bytes += int(getattr(o, "bytes_d2h", 0))
                rec.h2d_bytes += int(getattr(o, "bytes_h2d", 0))
                rec.stall_seconds += float(getattr(o, "stall_seconds", 0.0))
                rec.d2h_gbps = float(getattr(o, "d2h_gbps", None) or rec.d2h_gbps)
                rec.h2d_gbps = float(getattr(o, "h2d_gbps", None) or rec.h2d_gbps)
                rec.pool_reserved_bytes = int(getattr(o, "pool_reserved_bytes", 0))
                rec.pool_high_water_bytes = int(getattr(o, "pool_high_water_bytes", 0))
        if rt.config.mode != "auto":
            self.last_forced = passes[-1:]  # summarised when explain() asks, not every step
        entry = self.entries.get(first.signature)
        plan = self.active_plan(entry) if entry is not None else None
        if plan is not None and first.planned:
            rec.predicted_step_seconds = plan.predicted_step_seconds
            rec.predicted_peak_bytes = plan.predicted_peak_bytes
            rec.budget_bytes = plan.budget_bytes
            rec.predicted_forward_seconds = plan.predicted_forward_seconds
            rec.predicted_recompute_seconds = plan.predicted_recompute_seconds
            rec.predicted_stall_seconds = plan.predicted_stall_seconds
            budget = plan.budget_bytes
            if entry is not None and budget and not plan.feasible:
                self._warn_infeasible(entry, plan, budget, rec.peak_activation_bytes)
            elif (
                entry is not None
                and budget
                and rec.peak_activation_bytes > OVER_BUDGET * budget
                and not entry.warned_over_budget
            ):
                entry.warned_over_budget = True
                double = any(p.double_backward for p in passes)
                log.warning(
                    "offrecomp: signature %s: a planned step held %s of activations for a "
                    "budget of %s (%+.0f%%).%s",
                    first.signature, format_bytes(rec.peak_activation_bytes), format_bytes(budget),
                    100 * (rec.peak_activation_bytes / budget - 1),
                    " Its backward made a graph that a second backward differentiates (a "
                    "gradient penalty); that graph holds the tensors the first backward's "
                    "replays regenerate, which the plan does not count: expect this margin, "
                    "or keep those regions (regions=, mode='keep')." if double else
                    " Plan with a budget lower by that margin; rt.explain() and the step "
                    "records show where the memory went.",
                )
            live = entry.live if entry is not None and plan is entry.plan else None
            if live is not None:  # NOTE [Live prediction]
                rec.predicted_step_seconds = live.step_seconds
                rec.predicted_peak_bytes = live.peak_bytes
                rec.predicted_forward_seconds = live.forward_seconds
                rec.predicted_recompute_seconds = live.recompute_seconds
                rec.predicted_stall_seconds = live.stall_seconds
        self._pending.append((rec, passes))
        return rec

    @staticmethod
    def _warn_infeasible(entry: PlanEntry, plan: Plan, budget: int, held: int) -> None:
        """NOTE [Infeasible budgets]: once per signature, at its first planned step, naming
        a smallest feasible budget that the frugal plan's prediction, the measuring pass
        and this step all bound (a step within the budget says nothing)."""
        if entry.warned_infeasible or held <= budget:
            return
        entry.warned_infeasible = True  # once per signature, not once per re-plan
        smallest = min(plan.min_feasible_budget_bytes or held, held)
        plan.min_feasible_budget_bytes = smallest
        plan.notes = [n for n in plan.notes if "cannot be met" not in n] + [_infeasible_note(budget, smallest)]
        log.warning(
            "offrecomp: signature %s: %s. Raise the budget (budget=, OFFRECOMP_BUDGET) or "
            "accept the most frugal plan; infeasible='error' makes this an error",
            entry.signature, "; ".join(plan.notes),
        )

    def pending_ids(self) -> set[int]:
        return {id(r) for r, _ in self._pending}

    def discard(self, rec: StepRecord) -> None:
        """Forget a provisional record (its passes were merged into a later step)."""
        self._pending = [(r, ps) for r, ps in self._pending if r is not rec]

    def resolve(self, *, wait: bool) -> list[StepRecord]:
        """With ``wait``: do every deferred end-of-pass job and fill the times of every
        pending record, in order, waiting for their events. Without: nothing now; the
        next pass's start does it (NOTE [Bookkeeping off the critical path])."""
        if not wait:
            return []
        self._catch_up(None)
        return list(self._resolved)

    def _resolve(self, *, wait: bool, seconds: float | None = None) -> None:
        """Fill the times of pending records whose events have landed (all of them with
        ``wait``), in order, and learn from their passes; stop after ``seconds``."""
        clock = self.rt._clock
        start = time.perf_counter()
        done: list[StepRecord] = []
        self._resolved = done
        while self._pending:
            rec, passes = self._pending[0]
            first, last = passes[0], passes[-1]
            marks = [first.start_mark, last.backward_end_mark]
            for p in passes:
                marks += [m for _, a, b in p.replay_marks for m in (a, b)]
            if not wait and not clock.ready(*marks):
                break
            if seconds is not None and done and time.perf_counter() - start > seconds:
                break
            self._pending.pop(0)
            secs = clock.seconds(first.start_mark, last.backward_end_mark, wait=True)
            rec.step_seconds = secs if secs is not None else rec.wall_seconds
            rec.recompute_seconds = sum(
                clock.seconds(a, b, wait=True) or 0.0 for p in passes for _, a, b in p.replay_marks
            )
            rec.forward_seconds = sum(
                clock.seconds(p.start_mark, p.backward_start_mark, wait=True) or 0.0 for p in passes
            )
            rec.forward_host_seconds = sum(
                p.backward_start_mark.host - p.start_mark.host
                for p in passes
                if p.start_mark is not None and p.backward_start_mark is not None
            )
            with _planner_time(rec):
                rec.pause_seconds = sum(clock.pause(p.start_mark, p.backward_end_mark) for p in passes)
                for p in passes:
                    self._learn_replay_cost(p)
                rec.replay_op_us = 1e6 * self.replay_op_seconds
                for p in passes:
                    # each pass by its own signature: micro-batches of other lengths in
                    # one step are other signatures, with other times
                    pe = self.entries.get(p.signature)
                    note = self._learn(pe, p) if pe is not None else None
                    if note is not None:
                        rec.notes.append(note)
                entry = self.entries.get(first.signature)
                if entry is not None and first.planned and rec.predicted_step_seconds:
                    self._check_drift(entry, rec)
            done.append(rec)

    def _learn(self, entry: PlanEntry, p: PassState) -> str | None:
        """Feed a calibration or planned pass's measured times into the cost model; a
        note for the step record when the pass taught less than usual.

        NOTE [Forward timeline]: the forward is learnt piece by piece: each region's
        span and each gap around the regions (the root's work: embedding, head, loss).
        A piece is taken from this pass only when it timed compute alone: in a pass
        whose compute waited on the offload window, the regions that offloaded and the
        gaps may hold that wait, and a span a host pause distorted (NOTE [Host pauses])
        holds the pause. A region that offloads is learnt like the others otherwise:
        its group is copied after its forward, and the hooks' and the group issue's
        host time come off its span (NOTE [Host time] in scheduler/simulate.py).
        Skipped pieces keep the estimate's value; the region starts, the root saves'
        offsets and the forward total are rebuilt from the pieces, so one pause never
        shifts the timeline after it.
        """
        calibrating = p.phase == "calibrate"
        if entry.cost is None or not (p.planned or calibrating) or p.aborted or p.stage is not Stage.DONE:
            return None
        if p.reprofile:
            return None  # its end built the profile again (NOTE [Calls the profile lacks])
        clock = self.rt._clock
        measured = entry.cost.estimate()
        self._learn_host_costs(p, measured)
        alone: list[str] = []
        skipped = self._learn_forward(p, measured, calibrating=calibrating, alone=alone)
        if calibrating and alone and entry.calibration_tries < MAX_CALIBRATION_TRIES:
            entry.calibration_tries += 1
            entry.calibration_ran = False  # the next pass calibrates again
            pause = clock.pause(p.start_mark, p.backward_end_mark)
            log.info(
                "offrecomp: calibration pass of signature %s: %.1f ms of garbage collection "
                "distorted %s, with no repeated peer to take times from; calibrating again",
                p.signature, 1e3 * pause, ", ".join(alone),
            )
            return f"host pause {1e3 * pause:.1f} ms in {', '.join(alone)}; calibrating again"
        fwd_total = clock.seconds(p.start_mark, p.backward_start_mark)
        bwd_total = clock.seconds(p.backward_start_mark, p.backward_end_mark)
        if fwd_total is not None and bwd_total is not None:
            replay = sum(clock.seconds(a, b) or 0.0 for _, a, b in p.replay_marks)
            stall = float(getattr(p.offload_stats, "stall_seconds", 0.0) or 0.0)
            # NOTE [Host time]: the hooks' and the reloads' host time is the model's to add
            bwd = max(0.0, bwd_total - replay - stall - self._backward_host_extra(p, measured))
            # pauses inside replays went out with the replays' time
            paused = clock.pause(p.backward_start_mark, p.backward_end_mark) - sum(
                clock.pause(a, b) for _, a, b in p.replay_marks
            )
            if distorts(paused, bwd):
                skipped.append("backward")
            else:
                est = sum(r.backward_seconds for r in measured.regions)
                if est > 0 and bwd > 0:
                    scale = bwd / (est + max(0.0, measured.backward_seconds - est))
                    if not calibrating:
                        scale = min(OUTLIER_RATIO, max(1.0 / OUTLIER_RATIO, scale))
                        bwd = scale * max(est, measured.backward_seconds)
                    for r in measured.regions:
                        r.backward_seconds *= scale
                measured.backward_seconds = bwd
        # the link as the engine's copies achieved it (per-copy overheads included)
        o = p.offload_stats
        for name in ("d2h_gbps", "h2d_gbps"):
            achieved = float(getattr(o, name, 0.0) or 0.0) if o is not None else 0.0
            if achieved > 0 and getattr(self.rt.config, name) is None:
                setattr(measured, name, achieved)
        if calibrating:
            self._calibrate_replays(p, measured)
            # NOTE [Calibration]: replace the recorder-inflated times outright; the plan
            # is solved with these before the next pass. Later passes average in.
            entry.cost = CostModel()
            entry.calibrated = True
            entry.needs_solve = True
        # `measured` is this pass's own copy: the model keeps it as the new estimate, and
        # the entry reads it (the next pass learns on a fresh copy, so it stays as is).
        measured.replay_op_seconds = self.replay_op_seconds
        entry.cost.update(measured, take=True)
        entry.profile = measured
        if not calibrating:
            step = clock.seconds(p.start_mark, p.backward_end_mark)
            self._refresh_live(entry, step)
            if step is not None and p.phase == "planned":
                trial_note = self._offload_trial(entry, step)
                if trial_note is not None:
                    return trial_note
        if skipped:  # only distorted spans are skipped, so the pass paused
            pause = clock.pause(p.start_mark, p.backward_end_mark)
            note = f"host pause {1e3 * pause:.1f} ms: not learnt from " + ", ".join(skipped)
            if calibrating and any("#" in x for x in skipped):
                note += " (regions: their repeated peers' times)"
            return note
        return None

    def _learn_forward(self, p: PassState, measured: Profile, *, calibrating: bool, alone: list[str]) -> list[str]:
        """NOTE [Forward timeline]: learn the forward's pieces from ``p`` into
        ``measured`` (the estimate's copy); the pieces a host pause made it skip.

        A planned pass moves a region's time by at most ``OUTLIER_RATIO`` either way.
        A calibration pass replaces the recorder's times, which a skipped region would
        keep (NOTE [Host pauses]): a repeated block takes its clean peers' times, and
        the regions without one go into ``alone`` (the caller sends the pass back).
        """
        clock = self.rt._clock
        regions = measured.regions
        calls = [c for c in p.calls if not c.is_root]
        skipped: list[str] = []
        skipped_regions: set[tuple[str, int]] = set()
        by_key = {r.key: r for r in regions}
        seen: set[tuple[str, int]] = set()
        o = p.offload_stats
        waited = int(getattr(o, "window_waits", 0) or 0) if o is not None else 0
        on_device = (self.rt._device or torch.device("cpu")).type == "cuda"
        for call in calls:
            r = by_key.get(call.key)
            if r is None or call.key in seen:
                continue
            seen.add(call.key)
            offloads = any(rec.placement == OFFLOAD for rec in call.storages)
            if offloads and waited:
                continue  # NOTE [Source lifetime]: a window wait stalls compute anywhere
            fwd = clock.seconds(call.start_mark, call.end_mark)
            if fwd is None or fwd <= 0 or r.forward_seconds <= 0:
                continue
            if clock.distorted(call.start_mark, call.end_mark, fwd):
                skipped.append(f"{call.name}#{call.call_index}")
                skipped_regions.add(call.key)
                continue
            # NOTE [Host time]: the span holds the pack hooks' and the group offload's host
            # time, which the model adds per unit: on CPU (host and device are one) it
            # comes off the region's time; on GPU the events time the device, and the
            # host's own span, less that time, is the region's host time
            extra = self._forward_host_extra(measured, r, offloads)
            if on_device:
                host = call.end_mark.host - call.start_mark.host - extra
                if host > 0:
                    old = r.host_seconds
                    if old is not None and old > 0 and not calibrating:
                        host = min(OUTLIER_RATIO * old, max(old / OUTLIER_RATIO, host))
                    r.host_seconds = host
            elif fwd - extra > 0:
                fwd -= extra
            ratio = fwd / r.forward_seconds
            if not calibrating:
                ratio = min(OUTLIER_RATIO, max(1.0 / OUTLIER_RATIO, ratio))
            r.forward_seconds *= ratio
            for op in r.ops:
                op.seconds *= ratio
            for st in r.storages:
                st.offset_seconds *= ratio
        if calibrating and skipped_regions:
            alone += _fill_from_peers(measured, skipped_regions)
        if not _aligned(calls, regions):
            # The pass's calls are not the profile's regions one for one (a structure
            # the next measuring pass will settle): the whole forward, when clean.
            fwd_total = clock.seconds(p.start_mark, p.backward_start_mark)
            if fwd_total is not None and waited == 0:
                if clock.distorted(p.start_mark, p.backward_start_mark, fwd_total):
                    skipped.append("forward")
                else:
                    # NOTE [Host time]: on CPU the total holds the hooks and the group
                    # offloads, which the model adds back per unit
                    groups = int(getattr(o, "groups_offloaded", 0) or 0) if o is not None else 0
                    extra = (
                        0.0
                        if on_device
                        else int(p.stats.saved_tensors) * measured.pack_host_seconds
                        + groups * measured.offload_host_seconds
                    )
                    measured.forward_seconds = fwd_total - extra if extra < fwd_total else fwd_total
            return skipped
        # gaps: before the first region, between regions, after the last one
        bounds = [p.start_mark]
        for c in calls:
            bounds += [c.start_mark, c.end_mark]
        bounds.append(p.backward_start_mark)
        at = [clock.seconds(p.start_mark, m) for m in bounds]
        times = [t for t in at if t is not None]
        if len(times) != len(at) or any(b < a for a, b in itertools.pairwise(times)):
            return skipped  # unresolved marks, or regions that overlap: no timeline
        gaps = _gaps(measured)  # the estimate's, replaced by what this pass measured cleanly
        copy_waits = waited
        gap_learnt = [False] * len(gaps)
        unpaused = list(gaps)  # a distorted gap's time less its pause
        if copy_waits == 0:  # NOTE [Source lifetime]: a window wait stalls compute anywhere
            for j in range(len(gaps)):
                a, b = bounds[2 * j], bounds[2 * j + 1]
                g = times[2 * j + 1] - times[2 * j]
                if clock.distorted(a, b, g):
                    skipped.append(f"gap {j}")
                    unpaused[j] = max(0.0, g - clock.pause(a, b))
                    continue
                gaps[j] = g
                gap_learnt[j] = True
        if calibrating and copy_waits == 0 and not all(gap_learnt):
            # The estimate's gaps are the measuring pass's, which hold the recorder's
            # setup: a paused gap between blocks takes the median of the clean ones. The
            # first and the last (the root's own work) have no peers: their time less
            # the pause (exact on CPU; on GPU at most the queued work short, and later
            # passes learn gaps without bounds).
            inner = sorted(gaps[j] for j in range(1, len(gaps) - 1) if gap_learnt[j])
            for j, ok in enumerate(gap_learnt):
                if not ok:
                    gaps[j] = inner[len(inner) // 2] if 0 < j < len(gaps) - 1 and inner else unpaused[j]
        t = 0.0
        gap_start = []
        for j, r in enumerate(regions):
            gap_start.append(t)
            t += gaps[j]
            r.start_seconds = t
            t += r.forward_seconds
        gap_start.append(t)
        measured.forward_seconds = t + gaps[-1]
        # root saves: at their place within their gap, on the rebuilt timeline
        if p.root is not None and len(p.root.storages) == len(measured.root):
            for rec_s, st in zip(p.root.storages, measured.root):
                off = clock.seconds(p.start_mark, rec_s.save_mark)
                if off is None:
                    continue
                for j in range(len(gaps)):
                    if times[2 * j] <= off <= times[2 * j + 1]:
                        if gap_learnt[j]:
                            st.offset_seconds = gap_start[j] + min(off - times[2 * j], gaps[j])
                        break
        return skipped

    def _learn_host_costs(self, p: PassState, measured: Profile) -> None:
        """NOTE [Host time]: the runtime's own host costs as ``p`` measured them, into
        ``measured`` (the cost model averages them): per saved tensor in the pack and
        the unpack hook (``PassStats.pack_seconds``, ``unpack_seconds``), per group
        offload and per group reload issued (``OffloadStats.offload_host_seconds`` over
        ``groups_offloaded``, ``reload_host_seconds`` over ``groups_reloaded``). A cost
        the pass did not measure keeps the estimate; one pass moves a cost by at most
        ``OUTLIER_RATIO`` times the estimate (plus 20 us)."""
        st, o = p.stats, p.offload_stats
        saves = int(st.saved_tensors)
        costs = {
            "pack_host_seconds": (getattr(st, "pack_seconds", None), saves),
            "unpack_host_seconds": (getattr(st, "unpack_seconds", None), saves),
            "offload_host_seconds": (
                getattr(o, "offload_host_seconds", None),
                int(getattr(o, "groups_offloaded", 0) or 0),
            ),
            "reload_host_seconds": (
                getattr(o, "reload_host_seconds", None),
                int(getattr(o, "groups_reloaded", 0) or 0),
            ),
        }
        for name, (total, count) in costs.items():
            if total is None or count <= 0 or not total > 0:
                continue  # not measured: the estimate stands
            per = float(total) / count
            old = getattr(measured, name)
            if old > 0:
                per = min(per, OUTLIER_RATIO * old + 20e-6)
            setattr(measured, name, per)

    @staticmethod
    def _forward_host_extra(measured: Profile, r: RegionRecord, offloads: bool) -> float:
        """Host time the runtime added to region ``r``'s forward span: its saves' pack
        hooks and, when it offloads, its group's offload issue (NOTE [Host time])."""
        saves = sum(st.saves for st in r.storages)
        return saves * measured.pack_host_seconds + (measured.offload_host_seconds if offloads else 0.0)

    @staticmethod
    def _backward_host_extra(p: PassState, measured: Profile) -> float:
        """Host time the runtime added to ``p``'s backward: the unpack hooks and the group
        reloads it issued (NOTE [Host time])."""
        saves = int(p.stats.saved_tensors)
        groups = int(getattr(p.offload_stats, "groups_reloaded", 0) or 0)
        return saves * measured.unpack_host_seconds + groups * measured.reload_host_seconds

    def _refresh_live(self, entry: PlanEntry, step_seconds: float | None) -> None:
        """NOTE [Live prediction]: predict the plan again under the estimate that now
        includes this pass, for the next step's record and for the re-plan check.

        The plan's own prediction dates from its solve; the estimate moves with every
        pass (warm-up, clocks, other work on the machine), so the step after a pass is
        predicted from the estimate after it. When that prediction has moved from the
        solve's by more than ``drift``, the plan was chosen for costs that no longer
        hold: it is solved again.
        """
        plan, profile = entry.plan, entry.profile
        if plan is None or profile is None or entry.needs_solve or self.rt._user_plan is not None:
            return
        entry.live_skipped += 1
        if entry.live_skipped < entry.live_every:
            return
        entry.live_skipped = 0
        t0 = time.perf_counter()
        try:
            live = predict(profile, plan, prefetch_regions=self.rt.config.prefetch.regions or 2)
        except ValueError as exc:  # the plan no longer places on this profile
            log.debug("offrecomp: live prediction skipped (%s)", exc)
            return
        spent = time.perf_counter() - t0
        if step_seconds and step_seconds > 0:
            entry.live_every = max(1, min(64, int(spent / (0.02 * step_seconds)) + 1))
        entry.live = live
        solved = plan.predicted_step_seconds
        if solved and abs(live.step_seconds / solved - 1.0) > self.rt.config.drift:
            log.info(
                "offrecomp: the plan of signature %s was solved for a %.4fs step; under the "
                "measured times it now predicts %.4fs (%+.0f%%): solving again",
                entry.signature, solved, live.step_seconds, 100 * (live.step_seconds / solved - 1.0),
            )
            entry.needs_solve = True

    def _offload_trial(self, entry: PlanEntry, step_seconds: float) -> str | None:
        """NOTE [Offload trial]: learn from one planned pass whether offloading pays."""
        plan, profile, trial = entry.plan, entry.profile, entry.trial
        if plan is None or profile is None or trial.state == "settled" or self.rt._user_plan is not None:
            return None
        offloads = any(pl == OFFLOAD for _, pl in plan)
        predicted = entry.live.step_seconds if entry.live is not None else plan.predicted_step_seconds
        action = trial.observe(offloads, step_seconds, predicted)
        if action == "try":
            measured = trial.measured_with()
            alt = self._solve_plan(entry, allow_offload=False)
            alt_step = alt.predicted_step_seconds or math.inf
            ran = f"plan measured {1e3 * measured:.1f} ms against {1e3 * (predicted or 0.0):.1f} ms predicted"
            if not alt.feasible or alt_step >= measured:
                trial.cancel()
                why = "does not fit the budget" if not alt.feasible else f"is predicted at {1e3 * alt_step:.1f} ms"
                note = f"offload trial: {ran}; without offloading {why}: offloading stays"
            else:
                entry.needs_solve = True
                entry.next_plan = alt
                note = (
                    f"offload trial: {ran}, trying without offloading (predicted "
                    f"{1e3 * alt_step:.1f} ms) for {TRIAL_PASSES} passes"
                )
        elif action in ("keep", "back"):
            if action == "back":
                entry.needs_solve = True  # offloading again: solve with it
            note = f"offload trial: {trial.outcome()}"
        else:
            return None
        log.info("offrecomp: signature %s: %s", entry.signature, note)
        return note

    def _calibrate_replays(self, p: PassState, measured: Profile) -> None:
        """NOTE [Calibration]: fit each region's op times to the plain replay the
        calibration pass measured, then compare the whole pass with its prediction.

        Recorded op times miss what runs between ops (Python module code; on GPU, launch
        gaps), so their sum falls short of a real replay. The calibration pass replays
        each region plainly (every op before its stop K runs), so the shortfall against
        that measured replay, spread over those K ops, is a time per op. The check at
        the end logs the breakdown, so that a model that still disagrees with
        the device says where (forward, backward, replay).
        """
        clock = self.rt._clock
        by_key = {r.key: r for r in measured.regions}
        by_ordinal = {c.ordinal: c for c in p.calls}
        seen: set[tuple[str, int]] = set()
        paused: set[tuple[str, int]] = set()
        for ordinal, a, b, k in p.plain_replays:
            call = by_ordinal.get(ordinal)
            secs = clock.seconds(a, b)
            if call is None or secs is None or secs <= 0 or call.key in seen:
                continue
            if clock.distorted(a, b, secs):
                paused.add(call.key)  # NOTE [Host pauses]: fitted from a peer below
                continue
            seen.add(call.key)
            r = by_key.get(call.key)
            k = min(k, len(r.ops)) if r is not None else 0
            if r is None or k <= 0:
                continue
            plain = sum(op.seconds for op in r.ops[:k])  # a plain replay runs every op before K
            if plain <= 0:
                continue
            if secs >= plain:
                gap = (secs - plain) / k  # time between ops: per op, not per second of op
                for op in r.ops:
                    op.seconds += gap
            else:
                ratio = max(0.1, secs / plain)
                for op in r.ops:
                    op.seconds *= ratio
        fitted: dict[tuple[Any, ...], RegionRecord] = {}
        for key in seen:
            if key in by_key:
                fitted.setdefault(_shape(by_key[key]), by_key[key])
        for key in paused - seen:
            r = by_key.get(key)
            peer = fitted.get(_shape(r)) if r is not None else None
            if r is not None and peer is not None:
                for op, q in zip(r.ops, peer.ops):
                    op.seconds = q.seconds
        placements: dict[tuple[str, int, int], Placement] = {}
        for c in p.calls:
            for rec in c.storages:
                if rec.placement == RECOMPUTE and not c.is_root and c.key in by_key:
                    placements[(c.name, c.call_index, rec.index)] = RECOMPUTE
        plan = Plan(placements=placements)
        measured.replay_op_seconds = self.replay_op_seconds  # the rule the pass replayed by
        try:
            pred = predict(measured, plan, prefetch_regions=self.rt.config.prefetch.regions or 2)
        except ValueError as exc:  # a structure the profile cannot place as the pass did
            log.debug("offrecomp: calibration check skipped (%s)", exc)
            return
        step = clock.seconds(p.start_mark, p.backward_end_mark)
        fwd = clock.seconds(p.start_mark, p.backward_start_mark)
        replay = sum(clock.seconds(a, b) or 0.0 for _, a, b in p.replay_marks)
        if step is None or fwd is None or step <= 0:
            return
        off = pred.step_seconds / step - 1.0
        level = logging.WARNING if abs(off) > self.rt.config.drift else logging.INFO
        log.log(
            level,
            "offrecomp: calibration pass of signature %s: measured step %.4fs (forward %.4fs, "
            "replay %.4fs, backward without replay %.4fs), the model predicts %.4fs (%+.0f%%; "
            "forward %.4fs, replay %.4fs)",
            p.signature, step, fwd, replay, step - fwd - replay, pred.step_seconds, 100 * off,
            pred.forward_seconds, pred.recompute_seconds,
        )

    def _learn_replay_cost(self, p: PassState) -> None:
        """NOTE [Serving overhead]: learn what the dispatch mode costs per op it sees.

        Each replay under the mode ran ops whose predicted seconds are known (scaled by
        how much faster or slower the pass's forward ran than the estimate's); the rest of
        its measured time, per op seen, is the mode's cost. Smoothed like the cost model
        (weight 0.3 on the newest pass, whose value counts for at most 4x the current
        one plus 20 us, so one outlying pass cannot swing it); a pinned ``replay_op_us`` is never changed, and
        passes whose op times are the recorder's (before calibration) teach nothing. A
        plan solved with a cost that has since moved by more than half (and 5 us) is
        solved again, since which replays pay and what they cost both moved.
        """
        if self.replay_op_pinned or not p.dispatch_replays:
            return
        entry = self.entries.get(p.signature)
        if p.phase == "measure" or entry is None or not entry.calibrated:
            return  # the op times are the recorder's: not comparable with a replay
        clock = self.rt._clock
        # The ops' predicted times come from the estimate before this pass. When the
        # whole pass ran slower or faster (another process on the machine, clocks), so
        # did the ops it replayed: scale them by the pass's forward against the
        # estimate's, or that change would be taken for the mode's cost.
        slow = 1.0
        fwd = clock.seconds(p.start_mark, p.backward_start_mark)
        est = entry.profile.forward_seconds if entry.profile is not None else 0.0
        if (
            fwd
            and est > 0
            and int(getattr(p.offload_stats, "window_waits", 0) or 0) == 0  # waits are not compute
            and not clock.distorted(p.start_mark, p.backward_start_mark, fwd)
        ):
            slow = min(4.0, max(0.25, fwd / est))
        extra, ops = 0.0, 0
        for a, b, k, run in p.dispatch_replays:
            secs = clock.seconds(a, b)
            if secs is None or k <= 0 or clock.distorted(a, b, secs):
                continue  # NOTE [Host pauses]
            extra += secs - run * slow
            ops += k
        p.dispatch_replays = []  # learnt once, however many records the pass is part of
        if ops == 0:
            return
        # one outlying pass moves the estimate by at most 4x the current value (plus 20 us)
        observed = min(max(0.0, extra / ops), 4.0 * self.replay_op_seconds + 20e-6)
        self.replay_op_seconds = 0.7 * self.replay_op_seconds + 0.3 * observed
        for entry in self.entries.values():
            if entry.plan is None or entry.needs_solve:
                continue
            old = entry.solved_replay_op_seconds
            if abs(self.replay_op_seconds - old) > max(0.5 * old, 5e-6):
                entry.needs_solve = True
                log.info(
                    "offrecomp: replay dispatch cost now %.1f us per op (plan solved with %.1f); "
                    "solving signature %s again",
                    1e6 * self.replay_op_seconds, 1e6 * old, entry.signature,
                )

    # NOTE [Drift]
    # A plan's prediction is checked against the measured steps on the median of a window
    # of DRIFT_WINDOW planned steps, not step by step: on a loaded host single steps run
    # far off either way, and a check on a few steps in a row would solve a signature
    # again every few steps for good, warning each time. A window whose median is more
    # than Config.drift off solves the plan again with the measured times (warned once
    # per signature, then logged). When DRIFT_REPLANS such re-plans in a row did not
    # bring the median back, the times are not the model's to predict (another process
    # shares the device or the host): the window doubles at every further drifting one,
    # up to DRIFT_WINDOW << DRIFT_MAX_BACKOFF steps, and the runtime says so once. A
    # window within the tolerance resets both.

    def _check_drift(self, entry: PlanEntry, rec: StepRecord) -> None:
        pred = rec.predicted_step_seconds
        if not pred or rec.passes != 1:
            return
        if distorts(rec.pause_seconds, rec.step_seconds):
            return  # NOTE [Host pauses]: the step's time is not the plan's
        entry.drift_ratios.append(rec.step_seconds / pred)
        entry.drift_strikes = len(entry.drift_ratios)
        if entry.drift_strikes < DRIFT_WINDOW << entry.drift_backoff:
            return
        ratio = statistics.median(entry.drift_ratios)
        entry.drift_ratios.clear()
        entry.drift_strikes = 0
        if abs(ratio - 1.0) <= self.rt.config.drift:
            entry.drift_replans = entry.drift_backoff = 0
            return
        entry.drift_replans += 1
        window = DRIFT_WINDOW << entry.drift_backoff
        if entry.drift_replans > DRIFT_REPLANS:
            entry.drift_backoff = min(DRIFT_MAX_BACKOFF, entry.drift_backoff + 1)
            if not entry.drift_said_backoff:
                entry.drift_said_backoff = True
                log.warning(
                    "offrecomp: signature %s: steps still run %+.0f%% off the prediction after %d "
                    "re-plans with the measured times, so its step times are not the model's to "
                    "predict (another process loading the host or the device, say); re-planning "
                    "backs off, judging windows of up to %d steps",
                    entry.signature, 100 * (ratio - 1), DRIFT_REPLANS, DRIFT_WINDOW << DRIFT_MAX_BACKOFF,
                )
        level = logging.INFO if entry.drift_warned else logging.WARNING
        entry.drift_warned = True
        log.log(
            level,
            "offrecomp: the median measured step time of %d steps is %+.0f%% off the predicted "
            "%.4fs; planning signature %s again with the measured times",
            window, 100 * (ratio - 1), pred, entry.signature,
        )
        rec.notes.append("drift: re-plan")
        entry.needs_solve = True

    def explain(self) -> str:
        cfg = self.rt.config
        if cfg.mode != "auto" or not cfg.active:
            device = self.rt._device
            return explain_forced(
                cfg, self.rt._regions, summarize(self.last_forced, cfg.min_bytes),
                emulated=device is None or device.type != "cuda",
            )
        entry = self.last_entry
        if entry is None or entry.profile is None or entry.plan is None:
            return (
                "offrecomp: no plan yet (auto measures the first pass of each input signature, "
                "calibrates the second and plans from the third; a signature that a larger, "
                "measured one covers runs that one's plan)"
            )
        plan = entry.plan
        lines = [
            f"plan {plan.plan_id} for signature {entry.signature}",
            f"  budget {format_bytes(plan.budget_bytes) if plan.budget_bytes is not None else 'none'}, "
            f"predicted peak {format_bytes(plan.predicted_peak_bytes or 0)}, "
            f"predicted step {plan.predicted_step_seconds or 0.0:.4f}s, "
            f"lower bound {plan.lower_bound_seconds or 0.0:.4f}s",
        ]
        lines += [f"  note: {n}" for n in plan.notes]
        trial = entry.trial
        if trial.state == "trial":
            lines.append(
                f"  note: offload trial running: the plan that offloaded measured "
                f"{1e3 * trial.measured_with():.1f} ms a step; this one does not offload"
            )
        elif trial.state == "settled" and trial.without_offload:
            lines.append(f"  note: offload trial: {trial.outcome()}")
        rows = []
        for r in entry.profile.regions:
            b = {p: 0 for p in Placement}
            n = {p: 0 for p in Placement}
            for i, s in enumerate(r.storages):
                pl = plan.placement((r.name, r.call_index, i))
                b[pl] += s.nbytes
                n[pl] += 1
            values = [*cells(n, b), f"{r.forward_seconds:.5f}", f"{r.backward_seconds:.5f}"]
            rows.append((r.name, r.call_index, values, self._why(r, n, plan)))
        lines += table(rows, [*PLACEMENT_COLUMNS, ("fwd s", 9), ("bwd s", 9)])
        return "\n".join(lines)

    def _why(self, r: RegionRecord, n: dict[Placement, int], plan: Plan) -> str:
        """Why auto placed a region call's storages as it did."""
        region = next((g for g in self.rt._regions if g.name == r.name), None)
        if not r.replayable:
            if region is not None and region.writes_state:
                why = "writes its inputs or parameters in place"
            elif region is not None and region.reaches_out:
                why = "runs a backward through earlier activations"
            else:
                why = "runs collectives"
            return why + ": never recomputed"
        if region is not None and region.backward_in_forward:
            return "runs a backward inside its forward: its replays rerun it, holding their saves"
        why = "opaque: a replay reruns its forward; " if r.opaque else ""
        if n[RECOMPUTE] == 0 and n[OFFLOAD] == 0:
            return why + ("kept: the budget holds it" if plan.feasible else "kept: nothing here frees memory")
        parts = []
        if n[RECOMPUTE]:
            parts.append("dropped where a replay costs least for the bytes it frees")
        if n[OFFLOAD]:
            parts.append("offloaded where the copy hides under compute")
        return why + "; ".join(parts) + " (budget)"


def _infeasible_note(budget: int, smallest: int) -> str:
    return (
        f"budget {format_bytes(budget)} cannot be met; the smallest feasible budget is "
        f"{format_bytes(smallest)} ({smallest} bytes); this is the most memory-frugal plan"
    )


@contextlib.contextmanager
def _planner_time(holder: PassState | StepRecord) -> Iterator[None]:
    """Count the planner's host time in a pass or a step record (planner_seconds)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        holder.planner_seconds += time.perf_counter() - t0


_link_cache: dict[int, tuple[float, float]] = {}


def _probe_link(device: torch.device) -> tuple[float, float]:
    """Measure pinned D2H/H2D bandwidth once per device (64 MiB each way)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx in _link_cache:
        return _link_cache[idx]
    n = 64 << 20
    try:
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device=device)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host.copy_(dev, non_blocking=True)  # warm-up
        torch.cuda.synchronize(device)
        s.record()
        host.copy_(dev, non_blocking=True)
        e.record()
        e.synchronize()
        d2h = n / (s.elapsed_time(e) / 1e3) / 1e9
        s.record()
        dev.copy_(host, non_blocking=True)
        e.record()
        e.synchronize()
        h2d = n / (s.elapsed_time(e) / 1e3) / 1e9
    except RuntimeError as exc:
        log.warning("offrecomp: could not measure the host link (%s); planning without offload", exc)
        d2h = h2d = 0.0
    _link_cache[idx] = (d2h, h2d)
    return d2h, h2d
