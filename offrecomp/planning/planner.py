"""The planner: what the runtime asks at each pass, region call and step, answered by
the planning parts (NOTE [Bookkeeping off the critical path] on when they run)."""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from offrecomp.config import format_bytes
from offrecomp.explain import NO_PLAN_YET, explain_forced, explain_plan, storage_keys, summarize
from offrecomp.phases import Phase
from offrecomp.planning import differences, drift, profiling, records
from offrecomp.planning.entries import PlanCache, PlanEntry, assign
from offrecomp.planning.learning import Learner
from offrecomp.planning.profiling import ReplayMarks
from offrecomp.planning.replay_cost import DISPATCH_PROBES, ReplayCost
from offrecomp.planning.solving import Solver
from offrecomp.signatures import shown
from offrecomp.state import PassHolder, Stage
from offrecomp.transfer import BACKWARD_START
from scheduler.plan import Placement, Plan
from scheduler.timeline import simulate

if TYPE_CHECKING:
    from offrecomp.planning.host import PlannerHost
    from offrecomp.report import StepRecord
    from offrecomp.state import PassState, RegionCall
    from offrecomp.trace import RegionStructure
    from scheduler.profile import Profile

log = logging.getLogger(__name__)

KEEP, OFFLOAD, RECOMPUTE = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE

CATCH_UP_SECONDS = 0.02
"""At a pass's start, deferred record reading and learning stops after this long (one
record is always read): NOTE [Bookkeeping off the critical path]."""

class Planner(PassHolder):
    """Profiles in, placements out, plans cached per signature; over a ``PlannerHost``."""

    def __init__(self, host: PlannerHost) -> None:
        self.host = host
        self.cache = PlanCache(lambda: host.config)
        self.entries = self.cache.entries  # the cache's entries by signature (one dict)
        self.last_entry: PlanEntry | None = None
        self.opaque_regions: set[str] = set()  # regions whose recording proved untrustworthy
        self.collective_regions: set[str] = set()  # regions seen running collectives
        self.replay_cost = ReplayCost(host.config.replay_op_us)
        self.solver = Solver(host, self.replay_cost)
        self.learner = Learner(host, self.replay_cost, self.solver, self.entries)
        self._pending: list[tuple[StepRecord, list[PassState]]] = []
        self._learnt: weakref.WeakSet[PassState] = weakref.WeakSet()
        """Passes learnt from: a provisional step's pass is learnt once, though the step it
        merges into lists it again (NOTE [Passes and steps] in lifecycle.py)."""
        # NOTE [Calibration in an open step]: each signature's latest calibration pass, and
        # the notes of passes learnt before their step's record was
        self._calibrations: weakref.WeakValueDictionary[str, PassState] = weakref.WeakValueDictionary()
        self._early_notes: weakref.WeakKeyDictionary[PassState, str] = weakref.WeakKeyDictionary()
        # NOTE [Bookkeeping off the critical path]: passes whose profile is still to be
        # built, with their replay marks and backward end as they were when they ended (a
        # later backward may still replay their regions and add marks), and whether the
        # build waited once for a later backward (NOTE [Split backwards] in profiling.py)
        self._unplanned: list[tuple[PassState, ReplayMarks, Any, bool]] = []
        self._resolved: list[StepRecord] = []
        self._catching_up = False
        self._warned_unfinished = False
        # the user plans checked (_check_user_plan), by id while each lives: a new plan may
        # take a collected one's id
        self._plans_checked: weakref.WeakValueDictionary[int, Plan] = weakref.WeakValueDictionary()
        self.last_forced: list[PassState] = []  # a forced mode's last step's passes, for explain()

    @property
    def replay_op_seconds(self) -> float:
        """Time a replay under the dispatch mode costs per op it sees (NOTE [Serving
        overhead]): learnt from the replays that run unless the config pins it."""
        return self.replay_cost.seconds

    def wants_dispatch_probe(self, call: RegionCall) -> bool:
        """Whether the calibration pass replays ``call`` under the dispatch mode (NOTE
        [Dispatch probe]): the pass's first DISPATCH_PROBES replays of regions whose
        repeated peer it replayed plainly already, until a probe has taught the cost."""
        p = call.pass_state
        cost = self.replay_cost
        if p is None or cost.pinned or cost.probed or len(p.dispatch_probes) >= DISPATCH_PROBES:
            return False
        region, structure = call.region, call.structure
        if region is None or structure is None:
            return False
        n = len(structure.op_records)
        for ordinal, _, _, _ in p.plain_replays:
            peer = p.calls[ordinal] if ordinal < len(p.calls) else None
            if (
                peer is not None and peer.region is not None and peer.structure is not None
                and type(peer.region.module) is type(region.module)
                and len(peer.structure.op_records) == n
            ):
                return True
        return False

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
    # the next pass is placed (it decides whether that pass calibrates; a split pass's
    # waits for its later backward: NOTE [Split backwards] in profiling.py); the records are
    # read in order, and at a pass's start only those whose events have landed and only
    # for `CATCH_UP_SECONDS` (one record at least). A calibration a record still holds
    # back is read with a wait before the pass that needs its plan
    # (`_begin_pass`, NOTE [Calibration]), so plans are ready on time: a signature
    # measures, calibrates and plans from its third pass (one still in the open step
    # too: NOTE [Calibration in an open step]).

    def _catch_up(self, seconds: float | None, holder: PassState | None = None) -> None:
        """Deferred end-of-pass work (NOTE [Bookkeeping off the critical path]): every
        queued profile build (its time counted in ``holder``'s planner time), then the
        records whose times can be read, for at most ``seconds`` (None: all of them,
        waiting for their events)."""
        if self._catching_up:
            return
        self._catching_up = True
        waiting: list[tuple[PassState, ReplayMarks, Any, bool]] = []
        try:
            while self._unplanned:
                p, marks, end, waited = self._unplanned.pop(0)
                if profiling.split_backward(p):  # NOTE [Split backwards] (profiling.py)
                    if seconds is not None and not waited and profiling.awaits_late_backward(p):
                        waiting.append((p, marks, end, True))
                        continue
                    marks = list(p.replay_marks)  # with its later backwards'
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
            self._unplanned[:0] = waiting
            self._catching_up = False

    def _begin_pass(self, p: PassState) -> None:
        cfg = self.host.config
        user = self.host.user_plan
        if cfg.mode != "auto":
            p.phase = Phase.USER_PLAN if user is not None else Phase(cfg.mode)
            p.plan_id = user.plan_id if user is not None else ""
            p.plan = user
            return
        p.plan_signature = p.signature
        if user is None and p.signature not in self.entries:
            donor, seen = self.cache.donor(p)
            if donor is not None:
                if donor.plan is None or donor.needs_solve:
                    self._solve(donor)
                if donor.borrow_plan is None:
                    self.solver.solve_borrow_plan(donor)
            if donor is not None and _recompute_instead(donor):
                # NOTE [Borrowed plans]: no plan with plain replays is predicted to fit
                # the budget: drop every droppable save, as the donor's measuring pass did
                self._say_borrow_infeasible(donor)
                p.phase = Phase.RECOMPUTE
                return
            if donor is not None and donor.borrow_plan is not None:
                p.planned = True
                p.phase = Phase.BORROWED
                p.plan_signature = donor.signature
                p.plan_id = donor.borrow_plan.plan_id
                p.plan = donor.borrow_plan
                p.releases = pass_releases(donor.borrow_plan.releases)
                return
            if not seen and self.cache.grows_from_profiled(p):
                # NOTE [Borrowed plans]: a little larger than a profiled signature (a
                # sequence-length warmup): a plain full recompute, not a measuring pass
                p.phase = Phase.RECOMPUTE
                return
        p.made_entry = p.signature not in self.entries
        entry = self.cache.entry(p.signature, p)
        if any(q.signature == p.signature for q, *_ in self._unplanned):
            # NOTE [Split backwards] (profiling.py): its new profile waits (a measure again too)
            p.phase = Phase.RECOMPUTE
            return
        if entry.needs_measure or entry.profile is None:
            p.recording = True
            p.phase = Phase.MEASURE
            return
        if user is None and not entry.calibrated and entry.calibration_ran:
            # A calibration pass ran but its (device) times were not read yet: read them
            # now, once per signature, rather than calibrating twice.
            self.resolve(wait=True)
            if not entry.calibrated:
                self._learn_open_calibration(entry)
        if user is None and not entry.calibrated:
            # NOTE [Calibration]: the measuring pass ran under the op recorder, whose
            # overhead inflates every time it saw (on GPU the device starves while the
            # host records). The next pass drops the same activations without the
            # recorder and without offload; its region times replace the recorded ones
            # before the first plan is solved.
            p.phase = Phase.CALIBRATE
            entry.calibration_ran = True
            return
        if user is None and (entry.needs_solve or entry.plan is None):
            self._solve(entry)
        p.planned = True
        p.phase = Phase.USER_PLAN if user is not None else Phase.PLANNED
        plan = self.active_plan(entry)
        p.plan_id = plan.plan_id if plan is not None else ""
        p.plan = plan
        if user is not None:
            p.releases = _user_releases(entry, user)
        elif plan is not None:
            p.releases = pass_releases(plan.releases)

    # NOTE [Calibration in an open step]
    # Records are read, and their passes learnt, once their step has ended, at an
    # optimizer step. A signature first seen in a step of several micro-batches (a new
    # sequence length, parameters frozen since) measures and calibrates in its first two,
    # and its calibration is still in the open step when the third begins: not learnt
    # there, the third calibrates again, and so would every micro-batch left in the step
    # (each a full recompute): a signature seen only in such steps (LBFGS's closure passes
    # on a new shape each step) would never plan. So the pass that needs the plan learns
    # the calibration pass itself; its step's record skips it later and takes the note
    # it left, if any.

    def _learn_open_calibration(self, entry: PlanEntry) -> None:
        """NOTE [Calibration in an open step]: learn ``entry``'s calibration pass, which
        ended in the step still open, waiting for its events."""
        q = self._calibrations.get(entry.signature)
        if q is None or q in self._learnt or q.aborted or q.stage is not Stage.DONE:
            return  # none, learnt, or one whose backward never ran (it teaches nothing yet)
        clock = self.host.clock
        clock.seconds(q.start_mark, q.backward_end_mark, wait=True)
        self.replay_cost.learn(q, self.entries, clock)
        self._learnt.add(q)
        note = self.learner.learn(entry, q)
        if note is not None:
            self._early_notes[q] = note

    @staticmethod
    def _say_borrow_infeasible(donor: PlanEntry) -> None:
        """Once per donor plan: why the passes borrowing it run a full recompute."""
        plan = donor.borrow_plan
        if plan is None or donor.said_borrow_infeasible == plan.plan_id:
            return
        donor.said_borrow_infeasible = plan.plan_id
        log.info(
            "offrecomp: no plan with plain replays is predicted to fit the budget of signature "
            "%s (the most frugal holds %s); passes that would borrow it drop every droppable "
            "save instead, as its measuring pass did (which held %s)",
            shown(donor.signature), format_bytes(plan.predicted_peak_bytes or 0),
            format_bytes(donor.measured_peak_bytes or 0),
        )

    def _plan_of(self, p: PassState) -> tuple[PlanEntry | None, Plan | None]:
        """The entry whose plan the planned pass ``p`` runs, and that plan: a borrowed
        pass that did not begin planned runs the entry's borrow plan."""
        entry = self.entries.get(p.plan_signature or p.signature)
        if entry is None:
            return None, None
        if p.phase == Phase.BORROWED and p.resigned_from != Phase.PLANNED:
            return entry, entry.borrow_plan  # not a pass that borrows the plan it began with
        return entry, self.active_plan(entry)

    def active_plan(self, entry: PlanEntry) -> Plan | None:
        """The user's plan when one is set, else the solver's."""
        user = self.host.user_plan
        return user if user is not None else entry.plan

    def _solve(self, entry: PlanEntry) -> None:
        if entry.profile is not None:
            profiling.mark_found(entry.profile, self.host.regions)
        self.solver.solve(entry)
        self.last_entry = entry

    def assign(self, p: PassState, call: RegionCall) -> None:
        """Give a new region call its planned placements and structure."""
        if p.phase == Phase.CALIBRATE and not call.is_root:
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
        entry, plan = self._plan_of(p)
        if entry is None or plan is None:
            return
        if not assign(entry, plan, p, call):
            self._record_unprofiled(p, call)

    # NOTE [Calls the profile lacks]
    # The number of calls of a region may depend on the data (adaptive depth, a loop that
    # runs until a halting score is reached) while the input shapes, and so the
    # signature, stay the same. A planned pass that reaches a call its profile lacks
    # drops that call's activations (the measuring pass's rule) and records its ops, as
    # a measuring pass would. That pass can still exceed the budget: the extra call,
    # last in the forward, replays first in backward, while everything the plan kept is
    # resident, so its replay's working set comes on top. The pass's end builds the profile
    # again from all of its calls (the planned ones keep their structures) and the next
    # pass calibrates. A profile built so covers the longer pass, and a plan solved from
    # it also serves the shorter ones: calls that do not run leave their share of the
    # budget unused. Measuring again instead would measure a profile without those
    # calls at the next pass, often a shorter one: depths that alternate would
    # re-measure (full recompute) every few steps, for good. The profile also keeps the
    # calls of the last one that the re-profiling pass did not run (passes alternating
    # between task heads run disjoint calls), each after the call it followed: a
    # profile only grows. A call that keeps its activations because nothing of it can be
    # recorded (under forward-mode AD, a functorch transform, a dispatch mode of the
    # caller's) is not missing: re-profiling for it would calibrate at every pass.

    def _record_unprofiled(self, p: PassState, call: RegionCall) -> None:
        call.record = True
        p.reprofile = True
        log.info(
            "offrecomp: region %r call %d is not in the profile of signature %s; recording "
            "it in this pass (its activations dropped) to extend the profile",
            call.name, call.call_index, shown(p.signature),
        )

    def unrecordable(self, p: PassState, call: RegionCall) -> None:
        """``call``, which its profile lacks, keeps its activations (it runs under
        forward-mode AD, a functorch transform or a dispatch mode of the caller's): no
        pass can record it, so it extends no profile (NOTE [Calls the profile lacks])."""
        call.record = False
        p.reprofile = any(c.record for c in p.calls)

    def left(self, p: PassState, signature: str) -> PlanEntry | None:
        """``p`` no longer runs under ``signature``, a guess it began with: the entry its
        planning made for that guess alone goes (it would hold a slot of the plan cache
        for good); the entry, if it stays."""
        entry = self.entries.get(signature)
        if entry is not None and p.made_entry and entry.profile is None:
            del self.entries[signature]
            entry = None
        p.made_entry = False
        return entry

    def resign(self, p: PassState, chosen: str) -> None:
        """NOTE [Pass signatures]: ``p`` was planned for signature ``chosen``, and its root
        forwards departed from it; ``p.signature`` now names what ran. The rest of the
        pass goes on as its phase allows, and the pass teaches no cost model."""
        with _planner_time(p):
            entry = self.left(p, chosen)
            if self.host.config.mode != "auto":
                return
            p.reprofile = False  # its calls are not all the signature's
            first, before = not p.resigned_from, p.phase
            if first:
                p.resigned_from = p.phase
            if p.phase == Phase.MEASURE:
                own = self.entries.get(p.signature)
                if own is None or own.needs_measure or own.profile is None:
                    p.plan_signature = p.signature  # its recordings hold every call
                    return
                p.recording = False
                p.phase = Phase.RECOMPUTE
            elif p.phase == Phase.CALIBRATE:
                if entry is not None:
                    entry.calibration_ran = False  # it calibrates at its next pass
                p.phase = Phase.RECOMPUTE
            elif p.phase == Phase.PLANNED:
                p.phase = Phase.BORROWED  # the plan it began with: NOTE [Borrowed plans]
            if p.phase == Phase.RECOMPUTE:
                p.plan_signature = p.plan_id = ""
                p.plan = None
                p.releases = ()
            if first or p.phase != before:  # once per pass, not once per forward it joins
                log.info(
                    "offrecomp: a pass planned for signature %s ran %s; it goes on as a %s pass",
                    shown(chosen), shown(p.signature), p.phase,
                )

    def needs_capture(self, p: PassState, call: RegionCall) -> bool:
        """Keep a replay checkpoint for this call? Not when nothing can ever be dropped.

        Under a plan the checkpoint is taken unless the plan keeps all of the call
        (NOTE [Kept planned calls]): region inputs are storages 0..m-1 of every call
        (NOTE [Identity of a saved tensor]), and the plan may place them.
        """
        if call.fixed is KEEP:
            return False
        return not (self.host.user_plan is None and self.host.config.mode in ("keep", "offload"))

    def mismatch(self, p: PassState, call: RegionCall, index: int, *, borrowed: bool) -> None:
        """``call``'s storage ``index`` is not the one its plan placed: the rest of the
        call is placed as while measuring (placement.py), and the signature measures
        again. ``borrowed``: the storage is larger than the donor plan's (NOTE [Borrowed
        plans])."""
        call.mismatch = True
        if borrowed:
            # its own entry is made when the pass ends: a later root forward may still
            # change its signature (NOTE [Pass signatures])
            p.wants_entry = True
            log.info(
                "offrecomp: region %r call %d saves storage %d larger than in the plan of "
                "signature %s that this pass borrowed; dropping its activations this pass, "
                "and its own signature measures next time",
                call.name, call.call_index, index, shown(p.plan_signature),
            )
            return
        structure = call.structure
        if structure is not None and not structure.opaque:
            # What ran unrecorded differs from what was recorded (code that behaves
            # differently under a dispatch mode): never trust the recording of this
            # region again.
            self.distrust(call.name, structure)
        region = call.region
        if region is not None:
            differences.suspect_mode(call, region)
            differences.differed(region)
        entry = self.entries.get(p.signature)
        # a region this made variable keeps the profile, which grows to what its calls
        # save (NOTE [Sizes of regions that vary]); another measuring pass would not
        # describe its calls either
        again = region is None or not region.variable
        if entry is not None and again:
            entry.needs_measure = True
        log.info(
            "offrecomp: region %r call %d differs from its profile (storage %d); "
            "dropping its activations this pass%s",
            call.name, call.call_index, index, " and measuring again" if again else "",
        )

    def distrust(self, name: str, structure: RegionStructure) -> None:
        """Region ``name``'s recording proved untrustworthy: its replays run plainly from
        now on, and profiles made later treat it as opaque."""
        structure.opaque = True
        self.opaque_regions.add(name)

    def calibration_differs(self, p: PassState, call: RegionCall, index: int) -> None:
        """A calibration pass's ``call`` saved its storage ``index`` with another size
        than its recording, or one the recording lacks (NOTE [Calibration sizes] in
        differences.py)."""
        differences.calibration_differs(self.entries.get(p.signature), p, call, index)

    def remeasure(self, call: RegionCall, why: str) -> None:
        """``call``'s recording does not describe it (``why``; NOTE [Stale recordings] in
        regenerate.py): ``differences.relayout``."""
        p = call.pass_state
        differences.relayout(self.entries.get(p.signature) if p is not None else None, call, why)

    def grew(self, p: PassState, call: RegionCall) -> None:
        """A planned call its plan keeps whole ran with the hooks on: ``differences.grew``
        (if it saved more than its recording)."""
        differences.grew(self.entries.get(p.signature), p, call)

    def ran_collective(self, call: RegionCall) -> None:
        """``call`` issued a collective its region was not known to run (NOTE [Collective
        regions]): auto keeps or offloads the region's calls from now on, and plans are
        solved again with it unreplayable. A call of a planned pass that dropped saves
        already replays this step, as the other ranks' plans may not: said."""
        first = call.name not in self.collective_regions
        self.collective_regions.add(call.name)
        call.collective = True
        region = call.region
        if region is not None:
            region.collective = True
            self.host.warn_collective(region)
        if first:
            for entry in self.entries.values():
                entry.needs_solve = True
        p = call.pass_state
        if call.dropped and p is not None and not p.recording and self.host.config.mode == "auto":
            log.warning(
                "offrecomp: region %r ran a collective (torch.distributed) for the first time in "
                "a planned step, after its saves were dropped: its replay in this step issues it "
                "again, which other ranks join only if their plans dropped it too. Its calls keep "
                "their activations from now on.",
                call.name,
            )

    def record_structure(self, call: RegionCall) -> None:
        """Region forward returned in a measuring pass: derive its structure."""
        rec = call.recorder
        if rec is None:
            return
        if rec.collective and self.host.distributed:  # NOTE [Collective regions]
            self.collective_regions.add(call.name)
            call.collective = True
            if call.region is not None:
                self.host.warn_collective(call.region)
        region = call.region
        profiling.record_structure(  # a variable region's recording is one routing of many
            call, min_bytes=self.host.config.min_bytes,
            opaque=call.name in self.opaque_regions or (region is not None and region.variable),
        )

    def end_pass(self, p: PassState) -> None:
        """Queue the pass's profile build, when it has one to make (NOTE [Bookkeeping off
        the critical path])."""
        with _planner_time(p):
            self._end_pass(p)

    def _end_pass(self, p: PassState) -> None:
        if p.phase == Phase.CALIBRATE:
            self._calibrations[p.signature] = p  # NOTE [Calibration in an open step]
        user = self.host.user_plan
        if user is not None and user.placements and not p.aborted and self._plans_checked.get(id(user)) is not user:
            self._check_user_plan(user, p)
        if p.wants_entry and not p.aborted and p.signature not in self.entries:
            self.cache.entry(p.signature, p)  # NOTE [Borrowed plans]: it measures next time
        if p.recording:
            if not p.aborted and p.stage is Stage.BACKWARD and p.calls:
                log.info(
                    "offrecomp: the backward of the measuring pass of signature %s did not "
                    "finish (it raised); the signature measures again",
                    shown(p.signature),
                )
            elif not p.aborted and p.stage is not Stage.DONE and p.calls and not self._warned_unfinished:
                self._warned_unfinished = True
                log.warning(
                    "offrecomp: the measuring pass of signature %s ended before its backward "
                    "ran (a forward with grad whose graph was dropped without backward, as a "
                    "metric or logging forward is, or the runtime's context exited after the "
                    "forward). auto plans only from passes whose forward and backward both run "
                    "inside `with rt:`; until one does, every pass of that signature is "
                    "measured again (full recompute). Run such forwards under torch.no_grad()",
                    shown(p.signature),
                )
            if p.aborted or p.stage is not Stage.DONE:
                return  # measure again next time
        elif not (p.reprofile and not p.aborted and p.stage is Stage.DONE):
            return
        # the recorded structure now (cheap, and what rt.set_plan() users read); the
        # profile, which reads the pass's times, at the next pass's start
        entry = self.cache.entry(p.signature, p)
        structures = {c.key: c.structure for c in p.calls if c.structure is not None}
        if p.reprofile:  # NOTE [Calls the profile lacks]: a profile only grows
            for key, st in entry.structures.items():
                structures.setdefault(key, st)
        entry.structures = structures
        self._unplanned.append((p, list(p.replay_marks), p.backward_end_mark, False))

    # ------------------------------------------------------------ planning

    def _plan_from(self, p: PassState, replay_marks: ReplayMarks, end_mark: Any) -> None:
        """Build the signature's profile from the measuring (or re-profiling) pass ``p``,
        whose replay marks and backward end were ``replay_marks`` and ``end_mark`` when it
        ended (a split pass's replay marks: all of them, NOTE [Split backwards])."""
        entry = self.cache.entry(p.signature, p)
        profiling.profile_into(entry, p, replay_marks, end_mark, self.host)
        self.last_entry = entry

    def _check_user_plan(self, user: Plan, p: PassState) -> None:
        """Once per plan (``rt.set_plan``), at the end of its first pass: name the keys that
        matched no storage of it (a call or storage index the model never reaches)."""
        self._plans_checked[id(user)] = user
        seen = {(c.name, c.call_index, r.index) for c in p.all_calls() for r in c.storages if r.index >= 0}
        missed = sorted(set(user.placements) - seen)
        if missed:
            log.warning(
                "offrecomp: %d key(s) of the plan set with rt.set_plan() matched no storage of "
                "its first pass (signature %s), which places them by the plan's default: %s; "
                "rt.explain(storages=True) lists the (region, call, storage) keys a pass has",
                len(missed), shown(p.signature),
                ", ".join(map(repr, missed[:5])) + (", ..." if len(missed) > 5 else ""),
            )

    def budget_bytes(self, profile: Profile) -> int | None:
        """The activation budget plans of ``profile`` are solved for."""
        return self.solver.budget_bytes(profile)

    def on_oom(self, p: PassState | None) -> None:
        """A device OOM escaped a pass: the next pass of its signature gets a safer plan.

        Each OOM shrinks the signature's budget to 70%; the plan is solved again before
        the next pass. An OOM in a measuring pass (everything already dropped) can only
        be helped by a smaller budget for the plan that follows. An OOM under the most
        frugal plan (an infeasible budget) keeps the budget: no smaller one drops more.
        """
        if p is None:
            return
        # the plan that ran: a pass that departed from its plan's signature borrowed it
        entry = self.entries.get(p.plan_signature if p.resigned_from == Phase.PLANNED else p.signature)
        if entry is None:
            if p.phase == Phase.BORROWED:  # NOTE [Borrowed plans]: its own profile from now on
                self.cache.entry(p.signature, p)
                log.warning(
                    "offrecomp: device out of memory in a pass of signature %s that ran the "
                    "plan of %s; it measures its own profile next time",
                    shown(p.signature), shown(p.plan_signature),
                )
            return
        plan = entry.plan
        if plan is not None and not plan.feasible and p.phase == Phase.PLANNED:
            # the frugal plan ran (NOTE [Infeasible budgets]): no smaller budget drops more
            log.warning(
                "offrecomp: device out of memory in a planned pass of signature %s, whose "
                "plan already drops and offloads all it can (the budget is below what the "
                "solver can meet); a smaller budget would not help: free memory outside the "
                "activations (a smaller batch, the optimizer's state) or let more regions "
                "be replayed (regions=)",
                shown(p.signature),
            )
            return
        entry.budget_scale *= 0.7
        entry.needs_solve = entry.profile is not None
        entry.next_plan = None  # solved for the old budget
        log.warning(
            "offrecomp: device out of memory in a %s pass of signature %s; later passes plan "
            "for %.0f%% of the budget",
            p.phase or Phase.PLANNED, shown(p.signature), 100 * entry.budget_scale,
        )

    # ------------------------------------------------------------- reports

    def step_record(self, step: int, passes: list[PassState]) -> StepRecord:
        """The record of one step; its times are filled by :meth:`resolve` (NOTE [Lazy
        timing])."""
        mode = self.host.config.mode
        rec = records.step_record(step, passes, mode)
        if mode != "auto" or self.host.user_plan is not None:
            self.last_forced = passes[-1:]  # summarised when explain() asks, not every step
        runs = []  # the plan each pass ran of its own, None for any other: the step's prediction
        for q in passes:  # NOTE [Budgets per pass] (records.py): each against the plan it ran
            if q.aborted:
                continue
            ran_entry = None
            if q.phase == Phase.BORROWED:  # no prediction of its own; still the budget
                ran_entry = self._plan_of(q)[0]
            elif q.planned:
                ran_entry = self.entries.get(q.signature)
            ran = q.plan if ran_entry is not None else None  # the one it ran, not one set or solved since
            if ran_entry is not None and ran is not None:
                records.check_pass(rec, ran_entry, ran, q)
            runs.append((ran_entry, ran) if ran is not None and q.phase != Phase.BORROWED else None)
        plans = [run for run in runs if run is not None]
        if plans:
            records.add_prediction(rec, plans, every_pass=len(plans) == len(runs))
        self._pending.append((rec, passes))
        return rec

    def held(self) -> Iterator[PassState]:
        """The passes whose calls it will still read: to build a profile, to learn from
        their step, or for ``explain()`` of a forced mode (NOTE [Pass retirement])."""
        yield from self.last_forced
        yield from (q for _, passes in self._pending for q in passes)
        yield from (q for q, *_ in self._unplanned)

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
        clock = self.host.clock
        start = time.perf_counter()
        done: list[StepRecord] = []
        self._resolved = done
        while self._pending:
            rec, passes = self._pending[0]
            if not wait and not records.times_ready(clock, passes):
                break
            if seconds is not None and done and time.perf_counter() - start > seconds:
                break
            self._pending.pop(0)
            records.fill_times(rec, passes, clock)
            with _planner_time(rec):
                first = passes[0]
                rec.pause_seconds = sum(clock.pause(p.start_mark, p.backward_end_mark) for p in passes)
                fresh = [p for p in passes if p not in self._learnt]
                for p in fresh:
                    self.replay_cost.learn(p, self.entries, clock)
                rec.replay_op_us = 1e6 * self.replay_cost.seconds
                for p in fresh:
                    self._learnt.add(p)
                    # each pass by its own signature: micro-batches of other lengths in
                    # one step are other signatures, with other times
                    pe = self.entries.get(p.signature)
                    note = self.learner.learn(pe, p) if pe is not None else None
                    if note is not None:
                        rec.notes.append(note)
                # passes learnt early (NOTE [Calibration in an open step])
                rec.notes += [n for p in passes if (n := self._early_notes.pop(p, None)) is not None]
                entry = self.entries.get(first.signature)
                if entry is not None and first.planned and rec.predicted_step_seconds:
                    drift.check_step(entry, rec, passes, clock, self.host.config.drift)
            done.append(rec)

    def explain(self, storages: bool = False) -> str:
        """``rt.explain()``: auto's latest plan or what a forced mode did (``storages``: each key)."""
        text, cfg = self._explain(), self.host.config
        if storages:
            auto = cfg.mode == "auto" and cfg.active and self.host.user_plan is None
            entry = self.last_entry if auto else None
            plan, profile = (entry.plan, entry.profile) if entry is not None else (None, None)
            text += "\n" + "\n".join(storage_keys([] if auto else self.last_forced, plan, profile))
        return text

    def _explain(self) -> str:
        host = self.host
        cfg = host.config
        user = host.user_plan if cfg.active else None
        if cfg.mode != "auto" or not cfg.active or user is not None:
            return explain_forced(
                cfg, host.regions, summarize(self.last_forced, cfg.min_bytes),
                emulated=host.device().type != "cuda", user_plan=user, ran=bool(self.last_forced),
            )
        entry = self.last_entry
        if entry is not None and entry.plan is None and entry.replaced is not None:
            plan, profile = entry.replaced
            head = (
                f"offrecomp: signature {shown(entry.signature)} is measured and calibrated again "
                f"(calls that saved more than its profile: {entry.growths} time(s); calls on "
                f"inputs of another layout: {entry.relayouts} time(s)); it plans again after "
                "that, and ran this plan before:"
            )
            return head + "\n" + explain_plan(entry.signature, plan, profile, host.regions)
        if entry is None or entry.profile is None or entry.plan is None:
            return NO_PLAN_YET
        return explain_plan(
            entry.signature, entry.plan, entry.profile, host.regions, entry.trial.notes(), entry.replays_seen
        )


def _recompute_instead(donor: PlanEntry) -> bool:
    """NOTE [Borrowed plans]: do passes that would borrow ``donor``'s plan run a plain full
    recompute instead? When the borrow plan fits no budget and the donor's measuring pass
    (every droppable save dropped) held no more than that plan is predicted to (a plan
    that offloads root saves may hold less)."""
    plan = donor.borrow_plan
    if plan is None or plan.feasible:
        return False
    measured, predicted = donor.measured_peak_bytes, plan.predicted_peak_bytes
    return measured is None or predicted is None or measured <= predicted


@contextlib.contextmanager
def _planner_time(holder: PassState | StepRecord) -> Iterator[None]:
    """Count the planner's host time in a pass or a step record (planner_seconds)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        holder.planner_seconds += time.perf_counter() - t0


def pass_releases(releases: tuple[int, ...]) -> tuple[int, ...]:
    """A plan's ``releases`` as a pass uses them: the last unit ends at backward's start
    (NOTE [Planned release] in groups.py)."""
    top = len(releases) - 1
    return tuple(BACKWARD_START if v >= top else v for v in releases)


def _user_releases(entry: PlanEntry, plan: Plan) -> tuple[int, ...]:
    """A user's plan carries no releases (NOTE [Planned release] in groups.py): where it
    offloads, its timeline on the signature's profile gives them, once per plan and
    profile; none where that profile has no link to offload over."""
    profile = entry.profile
    offloads = plan.default is Placement.OFFLOAD or any(pl is Placement.OFFLOAD for _, pl in plan)
    if profile is None or not offloads:
        return ()
    cached = entry.user_releases
    if cached is not None and cached[0] is plan and cached[1] is profile:
        return cached[2]
    try:
        releases = pass_releases(simulate(profile, plan).releases)
    except ValueError:  # no link in the profile: the plan's offloads fall back anyway
        releases = ()
    entry.user_releases = (plan, profile, releases)
    return releases
