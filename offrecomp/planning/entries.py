"""The plan cache: what the runtime knows about each input signature (``PlanEntry``),
bounded LRU, and which profiled signature a new one may borrow a plan from (NOTE
[Borrowed plans]); the placements a region call gets from its entry's plan."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from offrecomp.phases import Phase
from offrecomp.planning.trial import OffloadTrial
from scheduler.cost_model import CostModel, predict
from scheduler.plan import ROOT, Placement, Plan

if TYPE_CHECKING:
    from offrecomp.config import Config
    from offrecomp.state import PassState, RegionCall
    from offrecomp.trace import RegionStructure
    from scheduler.cost_model import Prediction
    from scheduler.profile import Profile, RegionRecord

log = logging.getLogger(__name__)

KEEP = Placement.KEEP

#: NOTE [Borrowed plans]: a new signature at most this much larger, in every dimension,
#: than a profiled one of its family runs a plain full recompute instead of measuring.
GROWTH = 1.25


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
    said_borrow_infeasible: str = ""
    """The id of the borrow plan whose passes were said to run a full recompute instead
    (it fits no budget)."""
    lacks: str = ""
    """A region call a pass borrowing its plan ran that its profile lacks: it lends no
    plan until profiled again (NOTE [Borrowed plans])."""
    user_releases: tuple[Plan, Profile, tuple[int, ...]] | None = None
    """(user plan, profile, its releases): NOTE [Planned release] for ``rt.set_plan``."""
    needs_measure: bool = True
    replays_seen: dict[tuple[str, int], float] | None = None
    """Seconds each region call's replays took in the last planned pass learnt from, by
    (name, call index): what ``rt.explain()`` sets beside the plan's prediction."""
    growths: int = 0
    """Times a call its plan kept whole saved more or larger storages than its profile."""
    growth_solves: int = 0
    """Plans solved because a variable region's sizes grew (NOTE [Sizes of regions that
    vary] in differences.py)."""
    growth_pending: bool = False
    """Sizes grew since the last plan, which is not solved again yet."""
    relayouts: int = 0
    """Times a call's inputs, parameters or buffers had another layout than its recording
    (NOTE [Stale recordings] in regenerate.py)."""
    recalibrations: int = 0
    """Times a calibration pass's call saved storages of other sizes than its recording
    (NOTE [Calibration sizes] in differences.py)."""
    replaced: tuple[Plan, Profile] | None = None
    """The plan and profile a measuring pass replaced (``rt.explain()`` shows them until
    the signature plans again)."""
    needs_solve: bool = False
    cost: CostModel | None = None
    """Smoothed timings of the signature, updated by every planned pass."""
    warned_infeasible: bool = False
    warned_over_budget: bool = False
    """A planned step's activations went over the budget (warned once per signature)."""
    frugal_plan_id: str | None = None
    """The plan id of the most frugal plan, run because the measuring pass met a budget no
    plan is predicted to meet (NOTE [Small storages] in solving.py)."""
    calibration_ran: bool = False
    calibration_tries: int = 0
    """Calibration passes sent back for a host pause (NOTE [Host pauses])."""
    calibrated: bool = False
    """True once a calibration pass (no recorder, no offload) has replaced the measuring
    pass's times (NOTE [Calibration])."""
    drift_ratios: list[float] = field(default_factory=list)
    """Measured / predicted step time of the planned steps in the drift window so far
    (NOTE [Drift])."""
    drift_windows: list[bool] = field(default_factory=list)
    """Whether each of the latest DRIFT_HISTORY windows judged drifted, oldest first."""
    drift_learning: bool = False
    """The latest window drifted and re-planning has not backed off: every pass is learnt
    (NOTE [Learning cadence])."""
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
    """The plan predicted under the latest estimate (NOTE [Live prediction] in drift.py;
    None until a planned pass has been learnt since the plan was solved)."""
    live_reference: float | None = None
    """NOTE [Model moves]: the step time live predictions are judged from when the
    incumbent survived a re-solve (None: the plan's own prediction)."""
    model_moves: int = 0
    """Live refreshes in a row that moved from the reference (NOTE [Model moves])."""
    model_resolves: int = 0
    """Re-solves for a moved model since the profile was taken."""
    incumbent: Plan | None = None
    """The plan the pending re-solve keeps unless a plan is predicted MODEL_GAIN faster."""
    live_every: int = 1
    """Refresh ``live`` every this many learnt passes (keeps the refresh under ~2% of
    step time on profiles large enough for it to matter)."""
    live_skipped: int = 0
    learn_every: int = 1
    """Learn from one planned pass in this many (NOTE [Learning cadence])."""
    learn_skipped: int = 0
    learnt_since_solve: int = 0
    trial: OffloadTrial = field(default_factory=lambda: OffloadTrial())
    """NOTE [Offload trial]: whether plans of this signature may offload."""
    next_plan: Plan | None = None
    """A plan already solved for the next solve to install (the trial's)."""
    regions_of: Profile | None = None
    regions_by_key: dict[tuple[str, int], RegionRecord] = field(default_factory=dict)
    """``regions_of``'s region records by call key (``assign``)."""
    placements_of: Plan | None = None
    placements_by_key: dict[tuple[str, int], tuple[tuple[Placement, ...], bool]] = field(default_factory=dict)
    """``placements_of``'s placements of each call's storages, and whether they keep every
    one (``assign``); shared by the calls, which never change them."""

    def small_externals(self, profile: Profile) -> list[tuple[RegionRecord, int]]:
        """The small storages of ``profile``'s replayable regions that are external, each
        as its region's record and index (NOTE [Small storages] in solving.py)."""
        small = {key: st.small_storages for key, st in self.structures.items() if st.small_storages}
        return [
            (r, i) for r in profile.regions if r.replayable and (r.name, r.call_index) in small
            for i in small[(r.name, r.call_index)] if i < len(r.storages) and r.storages[i].kind == "external"
        ]

    def predict(self, profile: Profile, plan: Plan, *, prefetch_regions: int) -> Prediction:
        """``plan`` predicted on ``profile`` as it was solved: one that drops a small
        external storage was solved with them all droppable, as activations (NOTE [Small
        storages] in solving.py); raises ``ValueError`` where it does not place."""
        convert = self.small_externals(profile)
        if not any(plan.placement((r.name, r.call_index, i)) is not Placement.KEEP for r, i in convert):
            convert = []
        for r, i in convert:
            r.storages[i].kind = "activation"
        try:
            return predict(profile, plan, prefetch_regions=prefetch_regions)
        finally:
            for r, i in convert:
                r.storages[i].kind = "external"

    def lend_no_more(self, call: RegionCall) -> None:
        """NOTE [Borrowed plans]: a pass borrowing this entry's plan ran ``call``, which
        its profile lacks and which could have been recorded (one that cannot, under a
        dispatch mode of the caller's, is in no profile)."""
        if not self.lacks:
            self.lacks = f"{call.name!r} call {call.call_index}"
            log.info(
                "offrecomp: a pass borrowing the plan of signature %s ran region %s, which its "
                "profile lacks (a block its measuring pass skipped?); it lends no plan until "
                "profiled again",
                self.signature, self.lacks,
            )

    def take_profile(
        self, profile: Profile, structures: dict[tuple[str, int], RegionStructure], measured_peak_bytes: int
    ) -> None:
        """A measuring (or re-profiling) pass built ``profile``, whose activations peaked
        at ``measured_peak_bytes``: it replaces what the entry knew, and the next pass
        calibrates it (NOTE [Calibration])."""
        if self.plan is not None and self.profile is not None:
            self.replaced = (self.plan, self.profile)
        self.structures = structures
        self.calibrated = False
        self.calibration_ran = False
        self.calibration_tries = 0
        self.cost = CostModel()
        self.cost.update(profile, take=True)
        self.profile = profile
        self.needs_measure = False
        self.needs_solve = True
        self.plan = self.borrow_plan = self.incumbent = self.live_reference = None
        self.lacks = ""
        self.model_resolves = self.model_moves = 0
        self.measured_peak_bytes = measured_peak_bytes  # every droppable save dropped


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
# Where no plan with plain replays is predicted to fit the budget (the donor's own
# plan may fit only with served replays), it is solved again with small storages
# droppable, as the donor's own frugal end is (NOTE [Small storages]); where that does
# not fit either, and the donor's measuring pass held no more than it is predicted to,
# a pass that would borrow runs a plain full recompute instead: it drops what that
# measuring pass dropped, at a shape no larger, so that pass's peak bounds it, where the
# infeasible borrow plan would run over the budget. A borrowing pass that runs a region
# call the donor's profile lacks (a block the donor's measuring pass skipped: LayerDrop)
# drops its activations, and its replay comes on top of what the plan keeps, beyond the
# donor's peak: that donor lends no plan until it is profiled again (``lacks``), so the
# shapes after it measure, or borrow from one whose profile has every call.
# A new signature that no profiled one covers, but that exceeds one by at most
# GROWTH (25%) in every dimension, runs a plain full recompute on first sight rather
# than a measuring pass: a sequence-length warmup grows the length a little at every
# step, and measured at every step (1.9x full recompute); now it measures each time
# the length has grown by a quarter. Seen again, such a signature measures.


# NOTE [Plan cache growth]
# Shapes that recur in turn, more of them than the cache holds, and none covering
# another (token-budget batching: 2 x 192, 3 x 128, ..., B * T constant; NOTE [Borrowed
# plans] finds no donor), each evict the plan of the one that comes next: every step
# measured again, a full recompute under the op recorder (3x plain on a small model,
# for good, nothing said). A signature whose plan the full cache dropped and that comes
# back doubles the cache's bound, up to GROWN_MAX, where ``plan_cache_size`` was left
# as it is (logged); one set, or the cache at GROWN_MAX, warns once instead, naming the
# setting. A profile and its recordings are host memory: tens of KB to a few MB each.


class PlanCache:
    """The entries of the signatures seen, least recently used first, at most
    ``bound()`` of them; and the new signatures seen, for NOTE [Borrowed plans]."""

    SIGHTINGS = 256  # new signatures remembered for the "seen before" rule
    GROWN_MAX = 64  # NOTE [Plan cache growth]

    def __init__(self, config: Callable[[], Config]) -> None:
        self.config = config
        """The runtime's configuration: ``plan_cache_size``, read at every insertion."""
        self.grown = 0  # the bound the cache grew to, 0: none
        self.entries: OrderedDict[str, PlanEntry] = OrderedDict()
        self.sightings: OrderedDict[str, int] = OrderedDict()
        self.dropped: OrderedDict[str, None] = OrderedDict()  # signatures whose plans went
        self.warned = False

    def bound(self) -> int:
        """How many entries the cache holds at most (NOTE [Plan cache growth])."""
        return max(self.config().plan_cache_size, self.grown)

    def _came_back(self, signature: str) -> None:
        """NOTE [Plan cache growth]: the cache dropped ``signature``'s plan, and it is
        here again."""
        bound = self.bound()
        if self.config().sources.get("plan_cache_size", "default") == "default" and bound < self.GROWN_MAX:
            self.grown = min(self.GROWN_MAX, 2 * bound)
            log.info(
                "offrecomp: signature %s came back after the full plan cache dropped its plan; "
                "the cache now holds up to %d plans (plan_cache_size, OFFRECOMP_PLAN_CACHE, sets a bound)",
                signature, self.grown,
            )
        elif not self.warned:
            self.warned = True
            log.warning(
                "offrecomp: signature %s came back after the full plan cache (%d plans) dropped its "
                "plan: it is measured again (a full recompute under the op recorder), and so is "
                "every shape that recurs beyond the cache's bound. Raise plan_cache_size "
                "(OFFRECOMP_PLAN_CACHE) above the number of input shapes that recur, or batch to "
                "fewer shapes",
                signature, bound,
            )

    def entry(self, signature: str, p: PassState | None = None) -> PlanEntry:
        """The entry of ``signature`` (made for ``p``'s family and sizes when new), now
        the most recently used; a full cache drops its least recently used."""
        entry = self.entries.get(signature)
        if entry is None:
            if self.dropped.pop(signature, 0) is None:
                self._came_back(signature)
            entry = PlanEntry(signature)
            if p is not None:
                entry.family, entry.dims = p.family, p.dims
            self.entries[signature] = entry
            while len(self.entries) > self.bound():
                old, _ = self.entries.popitem(last=False)
                log.info("offrecomp: plan cache full, dropped the plan of signature %s", old)
                self.dropped[old] = None
                while len(self.dropped) > self.SIGHTINGS:
                    self.dropped.popitem(last=False)
        else:
            self.entries.move_to_end(signature)
        return entry

    def donor(self, p: PassState) -> tuple[PlanEntry | None, int]:
        """The profiled signature whose plan ``p`` may run (NOTE [Borrowed plans]), made
        the most recently used, and how often ``p``'s signature was seen before. The
        caller solves the donor's plans where it has none."""
        if not p.family or not p.dims:
            return None, 0
        seen = self.sightings.pop(p.signature, 0)
        self.sightings[p.signature] = seen + 1
        while len(self.sightings) > self.SIGHTINGS:
            self.sightings.popitem(last=False)
        if seen and len(self.entries) < self.bound():
            return None, seen  # seen before, and room for a plan of its own
        covering = [
            e for e in self._profiled_kin(p)
            if not e.needs_measure and not e.lacks and all(a >= b for a, b in zip(e.dims, p.dims))
        ]
        best = min(covering, key=lambda e: sum(e.dims), default=None)
        if best is None:
            return None, seen
        self.entries.move_to_end(best.signature)  # a donor in use stays cached
        return best, seen

    def grows_from_profiled(self, p: PassState) -> bool:
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


def assign(entry: PlanEntry, plan: Plan, p: PassState, call: RegionCall) -> bool:
    """Give a region call of planned pass ``p`` its placements from ``plan`` (``entry``'s,
    or for a borrowing pass the donor's) and its structure; False when ``entry`` has no
    structure for the call (NOTE [Calls the profile lacks])."""
    if call.is_root:
        n = len(entry.profile.root) if entry.profile is not None else 0
        root = [plan.placement((ROOT, 0, i)) for i in range(n)]
        call.placements, call.kept_whole = root, all(pl is KEEP for pl in root)
        return True
    structure = entry.structures.get(call.key)
    if p.phase == Phase.BORROWED:
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
        elif not entry.lacks:
            call.lacks_in = entry  # told once the call is seen recordable (lend_no_more)
        return True
    if structure is None:
        return False
    call.structure = structure
    key = call.key
    if entry.profile is not None:
        if entry.regions_of is not entry.profile:  # one index per profile, not a scan per call
            entry.regions_of = entry.profile
            entry.regions_by_key = {r.key: r for r in entry.profile.regions}
        r = entry.regions_by_key.get(key)
        if r is not None and len(r.ops) == len(structure.op_records):
            call.op_times = r  # read by a replay, if one runs
    n = len(structure.storage_records)
    if entry.placements_of is not plan:
        entry.placements_of = plan
        entry.placements_by_key = {}
    cached = entry.placements_by_key.get(key)
    if cached is None or len(cached[0]) != n:
        planned = tuple(plan.placement((call.name, call.call_index, i)) for i in range(n))
        cached = entry.placements_by_key[key] = (planned, all(pl is KEEP for pl in planned))
    call.placements, call.kept_whole = cached
    return True
