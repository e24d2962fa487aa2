"""The one placement decision: what a new storage of a region call gets.

``Placements.decide`` answers, for every storage the pack hook (or a region's input
capture) meets for the first time, the placement it gets and the fallback that led
there, if any, in the spirit of torch.utils.checkpoint's policy functions. It applies,
in order: the forced mode or the plan (a borrowed one, the user's, or the mode's
default while measuring); the legality rules; then, for OFFLOAD, whether the storage
can move at all and whether the pinned pool admits it.

NOTE [Placement rules]
- KEEP whatever the plan says: a storage read by a backward run inside its region's
  forward, or any storage of a region such a backward reaches out of (NOTE [Backward
  inside a forward]); a storage the profile marks external (another call's), unless the
  most frugal plan drops it (NOTE [Small storages]).
- RECOMPUTE only what a replay can regenerate: an activation (not a region input, not
  a root save) of a call with a replay checkpoint, whose region writes no state of its
  own (NOTE [State written by its region]), and, under auto, runs no collective (NOTE
  [Collective regions]).
- OFFLOAD only a storage of at least ``min_bytes`` (a copy costs more than it saves),
  on the runtime's device (a CPU tensor of a GPU run is in host memory already), that
  is not an untracked alias (NOTE [Untracked aliases]) nor a region input an argument
  object holds too (NOTE [Inputs held by arguments] in calls.py: a copy frees nothing),
  and that the pinned pool admits.
  A storage the pool refuses is dropped where a replay can regenerate it and its region
  runs no collective (a refusal is this rank's alone), else kept.
- A plan that asks for a placement these rules refuse gets KEEP. That is decided on the
  save path, so it is said afterwards: ``Placements.end_pass`` names the storages a plan
  set with ``rt.set_plan()`` asked to drop or offload and the rules kept, once per plan,
  and ``rt.explain()`` counts them per call; a solved plan never asks (the solver knows
  the rules), and ``build_table`` says so, once per region, if one does.

NOTE [Placement table]
A planned call's placements are known when it begins, so the pack hook should not apply
the rules to each new storage again: ``build_table`` applies them to the plan once per
call and ``decide`` reads the k-th entry when the storage has the planned size. Anything
else (a size the plan did not see, a borrowed plan, a region whose forward runs a
backward) goes through the rules, which also handle the mismatch.

NOTE [Region inputs of another storage size]
A region input's storage is the whole tensor it views: micro-batches sliced from one
batch have the batch's storage, whose size is the loop's, not the region's. An input
storage of another size than in the recording is therefore no sign that the call ran
other ops (the signature fixes the inputs' sizes; ``RegionCall.layout`` their strides):
it takes the plan's placement when smaller than the recorded one, and is kept when
larger (an offload of it would copy more than the plan booked), and the call stays
planned.

NOTE [Regions that vary]
A region whose calls saved other storages than their recording twice
(``Region.variable``: a mixture of experts' routing, a branch on the data) has no one
recording that describes its calls. A planned call of it takes the plan's placement of
each storage by position, whatever its size, but for a storage larger than one the
recording keeps always at its place (another form's, not that small storage: the plan
would keep it), and a storage past the plan's: those take that of the plan's last
activation of the call, or where the call's recording has none (each of its storages was
under ``min_bytes``), of its last storage (or what a user's plan names). Its replays run
plainly (no served ops: the recording is not this call's), the whole prefix up to the
last save they regenerate, as torch.utils.checkpoint reruns a forward, and check each
regenerated save's shape and dtype against the forward's; the planner models it as
opaque from then on (``profiling.mark_found``). Its calls differing from the recording
is what is known of it, so it never sends the signature to measure again, the planned
call that makes it variable included (a plan that drops or offloads such a region would
otherwise measure every other step for good, and the measuring pass would drop the
profile's growth); its profile grows to the sizes its calls save
(NOTE [Sizes of regions that vary] in differences.py).

NOTE [Kept planned calls]
A call of a planned pass whose plan keeps every one of its storages has nothing to
decide and nothing to replay: ``fixed`` gives it KEEP, as a forced keep, so it takes no
replay checkpoint (inputs, RNG, autocast, buffers and parameters: tens of microseconds
of host time per call) and no table, and every storage it saves is kept; with native
keep on, it saves through autograd's own saved variables, the hooks off (NOTE [Native
keep] in native.py). Its region
inputs are then not storages of its own (a kept input an op saves is one, as in keep
mode). Nothing of such a call can be dropped wrongly, and the booked bytes stay exact;
one that saved more or larger storages than its profile (a mixture of experts running
more of them, or on more tokens) is seen at its exit, and the signature measures again
(``Planner.grew``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from offrecomp.config import Config, format_bytes
from offrecomp.diagnostics import named, warn_once
from offrecomp.phases import Phase
from offrecomp.state import PassState, RegionCall, StorageRec
from scheduler.plan import Placement, Plan
from scheduler.profile import StorageRecord, growing_kind, outgrown

if TYPE_CHECKING:
    from offrecomp.groups import OffloadGroups
    from offrecomp.planning import Planner
    from offrecomp.regions import Region

log = logging.getLogger(__name__)

__all__ = ["Decision", "Placements", "never_replayed", "refusal", "refusals", "untracked_alias"]

KEEP, OFFLOAD, RECOMPUTE = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE

#: A placement and the fallback that led to it (None: the one wanted).
Decision = tuple[Placement, "str | None"]
_KEPT: Decision = (KEEP, None)
_DROPPED: Decision = (RECOMPUTE, None)
_OFFLOADED: Decision = (OFFLOAD, None)
#: Why a region whose forward writes state in place is never replayed.
_WRITES_STATE = "writes in place state a replay would write again (its inputs, its parameters or a tensor from outside it)"


def never_replayed(region: Region | None) -> str | None:
    """Why ``region``'s calls are never replayed, if they are not."""
    if region is None:
        return None
    if region.untracked_state:
        return "changes argument state too large to track"
    if region.writes_state:
        return _WRITES_STATE
    if region.reaches_out:
        return "runs a backward through earlier activations"
    if region.accumulates:
        return "runs a backward that accumulates into .grad"
    return None


def _last_activation(placements: Sequence[Placement], structure: Any) -> Placement:
    """The placement a plan gives the last activation of a call's recording, or where
    it has none, its last storage kept always (KEEP if neither): a variable region's
    storage past the plan's takes it, as its bytes grow that storage in the profile
    (NOTE [Regions that vary], NOTE [Sizes of regions that vary] in differences.py)."""
    recs = structure.storage_records if structure is not None else ()
    kind = growing_kind(recs)
    for i in range(min(len(placements), len(recs)) - 1, -1, -1):
        if recs[i].kind == kind:
            return placements[i]
    return KEEP


def _differs(recs: Sequence[StorageRecord], index: int, nbytes: int, kind: str) -> bool:
    """Is the ``index``-th storage of a call (``nbytes``, of ``kind``) another than its
    recording's (``recs``)? A region input of another size is not (NOTE [Region inputs
    of another storage size])."""
    if index >= len(recs):
        return True
    r = recs[index]
    return r.nbytes != nbytes and not (kind == "input" and r.kind == "input")


def refusal(call: RegionCall, rec: StorageRec, asked: Placement, min_bytes: int) -> str | None:
    """Why NOTE [Placement rules] kept storage ``rec`` of ``call`` where a plan asked for
    ``asked``; None where they did not (it got ``asked``, or the pool's fallback moved it:
    the report counts those)."""
    if asked is KEEP or rec.placement is not KEEP:
        return None
    region = call.region
    if region is not None and (region.reaches_out or rec.index in region.forward_used):
        return "read by a backward inside its region's forward"
    if asked is RECOMPUTE:
        if rec.kind == "input":
            return "a region input is the replay's checkpoint, never dropped"
        if call.ordinal < 0:
            return "saved outside every region, so no replay regenerates it"
        cause = never_replayed(region) or ("runs collectives" if call.collective else None)
        if call.writes_state and cause is None:
            cause = _WRITES_STATE
        return f"its region {cause or 'is not replayed'}: never dropped"
    if rec.by_argument:
        return "an argument object of the call holds it too, so a copy frees nothing: never offloaded"
    if rec.nbytes < min_bytes:
        return f"under min_bytes ({format_bytes(min_bytes)}), never offloaded"
    if rec.aliased:
        return "covers part of its storage without being a view autograd tracks, never offloaded"
    return None


def refusals(plan: Plan, calls: Iterable[RegionCall], min_bytes: int) -> list[tuple[tuple[str, int, int], str]]:
    """The keys ``plan`` names whose storage in ``calls`` the rules kept, and why."""
    out = []
    for call in calls:
        for rec in call.storages:
            key = (call.name, call.call_index, rec.index)
            asked = plan.placements.get(key)
            why = None if asked is None else refusal(call, rec, asked, min_bytes)
            if asked is not None and why is not None:
                out.append((key, f"{asked.name} ({why})"))
    return out


def untracked_alias(t: torch.Tensor, nbytes: int) -> bool:
    """Does ``t`` cover only part of its ``nbytes`` storage without being a view autograd
    tracks? NOTE [Untracked aliases]: such a storage is never offloaded."""
    return t._base is None and t.nbytes < nbytes


class Placements:
    """The placement decision of one runtime (NOTE [Placement rules])."""

    def __init__(
        self,
        config: Config,
        planner: Planner,
        groups: OffloadGroups,
        user_plan: Callable[[], Plan | None],
    ) -> None:
        self._config = config
        self._planner = planner
        self._groups = groups
        self._user_plan = user_plan
        self._told: Plan | None = None  # the user's plan end_pass last checked

    # ------------------------------------------------------- once per call

    def fixed(self, call: RegionCall) -> Placement | None:
        """The placement every new storage of ``call`` gets whatever its index (a forced
        keep or offload) when no plan and no rule can vary it; None: ``decide`` asks the
        rules."""
        region = call.region
        if self._user_plan() is not None or (
            region is not None and (region.reaches_out or region.backward_in_forward)
        ):
            return None
        mode = self._config.mode
        if mode == "keep":
            return KEEP
        if mode == "offload":
            return OFFLOAD
        p = call.pass_state
        if call.kept_whole and call.placements and p is not None and p.phase == Phase.PLANNED and not call.record:
            return KEEP  # NOTE [Kept planned calls]
        return None

    def drops(self, call: RegionCall) -> bool:
        """Does every new activation storage of ``call`` get RECOMPUTE from the rules
        whatever its index and size (a forced recompute: no plan, no user's plan, a
        droppable region call that no rule keeps by index)? Asked once the call has
        captured its inputs; ``RegionCall.forget_placements`` undoes it when a rule starts
        to vary."""
        region = call.region
        return (
            self._config.mode == "recompute" and region is not None and not call.is_root
            and call.placements is None and call.borrowed_sizes is None and self._user_plan() is None
            and not region.reaches_out and not region.backward_in_forward and not region.forward_used
            and self.droppable(call)
        )

    def droppable(self, call: RegionCall, *, symmetric: bool = True) -> bool:
        """May ``call``'s activations be dropped? ``symmetric``: every rank drops alike
        (a plan or a mode); a rank-local fallback never drops in a collective region."""
        region = call.region
        if call.inputs is None or call.writes_state or (region is not None and region.accumulates):
            return False
        if call.collective:
            return symmetric and self._config.mode != "auto"
        return True

    def build_table(self, call: RegionCall) -> None:
        """Fill ``call.table`` (NOTE [Placement table]) for a planned call."""
        placements, structure, region = call.placements, call.structure, call.region
        if (
            placements is None or structure is None or region is None or call.fixed is not None
            or call.borrowed_sizes is not None or call.mismatch
            or region.reaches_out or region.backward_in_forward
        ):
            return
        recs = structure.storage_records
        droppable = self.droppable(call)
        small = structure.small_storages  # NOTE [Small storages]
        table = []
        refused = 0
        for i, (pl, r) in enumerate(zip(placements, recs)):
            if r.kind == "external" and not (pl == RECOMPUTE and i in small):
                pl = KEEP
            legal = self._legal(pl, r.kind, r.nbytes, call, droppable)
            refused += legal is not pl
            table.append(legal)
        call.table = table
        call.table_sizes = [r.nbytes for r in recs[: len(table)]]
        if refused and self._user_plan() is None:  # the user's: end_pass names them
            warn_once(
                f"refused:{named(region)}",
                "offrecomp: the solved plan for region %r asks to drop or offload %d storage(s) of call %d "
                "that the placement rules keep (a region input, a region that may not be replayed, "
                "or a storage under min_bytes); they are kept",
                region.name, refused, call.call_index,
            )

    def end_pass(self, p: PassState) -> None:
        """At the end of the first pass a plan set with ``rt.set_plan()`` placed, name
        the storages it asked to drop or offload that the rules kept (NOTE [Placement
        rules]); once per plan."""
        user = self._user_plan()
        if user is None or user is self._told or p.recording or p.aborted:
            return
        self._told = user
        refused = refusals(user, p.all_calls(), self._config.min_bytes) if user.placements else []
        if refused:
            log.warning(
                "offrecomp: the plan set with rt.set_plan() asks for %d placement(s) the rules do "
                "not allow, which are kept instead: %s; rt.explain() counts them per region call",
                len(refused),
                "; ".join(f"{key!r} {what}" for key, what in refused[:5]) + ("; ..." if len(refused) > 5 else ""),
            )

    # ---------------------------------------------------- once per storage

    def decide(
        self, p: PassState, call: RegionCall, rec: StorageRec, kind: str, t: torch.Tensor, storage: Any
    ) -> Decision:
        """The placement of ``call``'s new storage ``rec`` (behind ``t``; ``kind``:
        "activation" or "input") and the fallback that led to it. An OFFLOAD answer has
        joined the call's group (``OffloadGroups.join``: the pool admitted it)."""
        index, nbytes = rec.index, rec.nbytes
        pl = call.fixed
        if pl is None:
            table = call.table
            if table is not None and index < len(table) and call.table_sizes[index] == nbytes:  # type: ignore[index]
                pl = table[index]
            else:
                pl = self._rules(p, call, index, nbytes, kind)
        elif pl is OFFLOAD and nbytes < self._config.min_bytes:
            return _KEPT
        if pl is KEEP:
            return _KEPT
        if pl is RECOMPUTE:
            return _DROPPED
        # OFFLOAD: can the storage move, and does the pool take it?
        if kind == "activation" and untracked_alias(t, nbytes):
            return KEEP, "aliased_to_keep"
        joined = self._groups.join(call, rec, t, storage, t.dtype, t.nbytes == nbytes)
        return _OFFLOADED if joined else self.not_joined(call, kind, joined)

    def not_joined(self, call: RegionCall, kind: str, joined: bool | None) -> Decision:
        """The placement of an OFFLOAD storage that did not join its group
        (``OffloadGroups.join``: None, it cannot move; False, the pool is full)."""
        if joined is None:
            return _KEPT  # it cannot move (a CPU tensor of a GPU run is in host memory already)
        if kind == "activation" and self.droppable(call, symmetric=False):
            return RECOMPUTE, "offload_to_recompute"
        return KEEP, "offload_to_keep"

    def _rules(self, p: PassState, call: RegionCall, index: int, nbytes: int, kind: str) -> Placement:
        """The plan or the mode, then legality (NOTE [Placement rules])."""
        region = call.region
        if region is not None and (region.reaches_out or (region.forward_used and index in region.forward_used)):
            return KEEP  # NOTE [Backward inside a forward]: read in the forward, or not replayable
        return self._legal(self._wanted(p, call, index, nbytes, kind), kind, nbytes, call)

    def _legal(
        self, pl: Placement, kind: str, nbytes: int, call: RegionCall, droppable: bool | None = None
    ) -> Placement:
        """``pl`` where NOTE [Placement rules] allow it, else KEEP: RECOMPUTE not for a
        region input (``kind``) nor in a call that may not drop (the root, a call without
        a replay checkpoint; ``droppable``, asked when None), OFFLOAD not under
        ``min_bytes``."""
        if pl == RECOMPUTE and (kind == "input" or not (self.droppable(call) if droppable is None else droppable)):
            return KEEP
        if pl == OFFLOAD and nbytes < self._config.min_bytes:
            return KEEP
        return pl

    def _wanted(self, p: PassState, call: RegionCall, index: int, nbytes: int, kind: str) -> Placement:
        """What the plan (or, without one, the mode) asks for the storage."""
        placements = call.placements
        sizes = call.borrowed_sizes
        if sizes is not None and placements is not None and not call.mismatch:
            if index < len(sizes) and nbytes <= sizes[index]:
                return placements[index]
            # NOTE [Borrowed plans]: larger than the donor's, so its plan does not bound
            # this call: drop the rest (below); the signature measures its own next time.
            self._planner.mismatch(p, call, index, borrowed=True)
        elif placements is not None and sizes is None:
            structure = call.structure
            ok = index < len(placements)
            region = call.region
            if region is not None and region.variable:  # NOTE [Regions that vary]
                recs = structure.storage_records if structure is not None else ()
                if ok and not (kind != "input" and index < len(recs) and outgrown(recs[index], nbytes, recs)):
                    return placements[index]
                if self._user_plan() is None:  # a user's plan names its own (below)
                    return _last_activation(placements, structure)
            if ok and structure is not None:
                recs = structure.storage_records
                if kind == "input" and index < len(recs) and recs[index].kind == "input" and recs[index].nbytes != nbytes:
                    # a sliced batch of another size (NOTE [Region inputs of another storage size])
                    return placements[index] if nbytes < recs[index].nbytes else KEEP
                ok = not _differs(recs, index, nbytes, kind) and recs[index].kind != "external"
                if index < len(recs) and recs[index].kind == "external" and recs[index].nbytes == nbytes:
                    # NOTE [Small storages]: only the most frugal plan drops one
                    small = index in structure.small_storages and index < len(placements)
                    return RECOMPUTE if small and placements[index] == RECOMPUTE else KEEP
            if ok:
                return placements[index]
            if not call.mismatch and not call.is_root and not (region is not None and region.variable):
                self._planner.mismatch(p, call, index, borrowed=False)
        structure = call.structure
        if (
            structure is not None and not call.mismatch and p.phase == Phase.CALIBRATE
            and _differs(structure.storage_records, index, nbytes, kind)
            and (structure.layout is None or call.layout() == structure.layout)  # else NOTE [Stale recordings]
        ):
            self._planner.calibration_differs(p, call, index)  # NOTE [Calibration sizes] in differences.py
        user = self._user_plan()
        if user is not None and not p.recording:
            return user.placement((call.name, call.call_index, index))
        mode = self._config.mode
        if mode == "keep":
            return KEEP
        if mode == "offload":
            return OFFLOAD
        if call.collective and mode == "auto":
            return KEEP  # NOTE [Collective regions]: no rank replays it alone
        # recompute, and auto while measuring or off-plan: drop what may be dropped
        return RECOMPUTE if (not call.is_root and kind == "activation") else KEEP
