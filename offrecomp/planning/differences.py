"""Calls that differ from their recording: when a signature measures again, when a
region is taken to branch on its data, and the warnings when neither helps."""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from offrecomp.signatures import shown
from scheduler.profile import growing_kind, outgrown

if TYPE_CHECKING:
    from offrecomp.planning.entries import PlanEntry
    from offrecomp.regions import Region
    from offrecomp.state import PassState, RegionCall
    from scheduler.profile import Profile, StorageRecord

log = logging.getLogger(__name__)

#: Times a signature measures again because a call its plan keeps whole saved more than
#: its profile (``grew``).
MAX_GROWTH_MEASURES = 3
#: Times a signature measures again because a call's layout differs from its recording
#: (``relayout``).
MAX_RELAYOUT_MEASURES = 3
#: Times a signature measures again because its calibration pass saved storages of other
#: sizes than its measuring pass (``calibration_differs``).
MAX_CALIBRATION_MEASURES = 1
#: Learnt passes a plan solved because sizes grew waits at most before the next such
#: solve (``settle_growth``).
MAX_GROWTH_WAIT = 31


def measure_again(entry: PlanEntry, counter: str, limit: int, refused: str, *args: Any) -> bool:
    """Send ``entry``'s signature to measure again for one more reason of the kind
    ``counter`` (a count in ``entry``), up to ``limit`` times: True if it will; past the
    limit False, and the first time the warning ``refused`` (with ``args``)."""
    n = getattr(entry, counter) + 1
    setattr(entry, counter, n)
    if n > limit:
        if n == limit + 1:
            log.warning(refused, *args)
        return False
    entry.needs_measure = True
    return True


# NOTE [Calibration sizes]
# A model's forward may read state that its first step lacks: a Transformer-XL block
# concatenates the keys of the previous step's segment (`self.mem`), None at step 0. The
# signature names the inputs' sizes only, so the measuring pass records the blocks
# without the memory, and a plan solved from that recording books too little, and its
# first planned step would hold more than the budget until its mismatches sent the
# signature to measure again. The calibration pass runs the same calls without the
# recorder, with every call given its recording (``Planner.assign``), so it sees the
# sizes the recording missed: a region activation of another size than recorded, or one
# more than the recording has, sends the signature to measure again at the next pass
# instead of planning from it, and that call replays plainly, without its recording, as
# a planned call that differs does. Region inputs are not compared (NOTE [Region inputs
# of another storage size] in placement.py), nor the calls of a region known to branch
# on the data (``Region.variable``). A signature measures again for this once
# (MAX_CALIBRATION_MEASURES): state the first step lacks is there from the second on,
# and a calibration that differs again means calls that differ from step to step (a
# mixture of experts' routing) or under the recorder's dispatch mode (an op whose path
# depends on one): each such call counts as a planned call that differs, its region's
# calls run under a passive mode from then on (``suspect_mode``, NOTE [Replay], step 7)
# and count one mismatch (``differed``; the second makes the region variable: NOTE
# [Regions that vary] in placement.py), and the signature plans, its profile's sizes
# grown to what such calls saved in that calibration pass (``variable_sizes``, as a
# variable region's grow: NOTE [Sizes of regions that vary]), so that the first plan
# books a call that alternates between forms at the larger one the calibration saw.
# State the first step lacks so costs no passive mode. What is found of a region after
# the profile was built goes into it when a plan is solved (``profiling.mark_found``).


def calibration_differs(entry: PlanEntry | None, p: PassState, call: RegionCall, index: int) -> None:
    """A calibration pass ``p`` of the signature of ``entry``: its ``call`` saved its
    storage ``index`` with another size than its recording, or one the recording lacks
    (NOTE [Calibration sizes])."""
    call.mismatch = True
    region = call.region
    if entry is None or entry.needs_measure or (region is not None and region.variable):
        return
    if entry.recalibrations >= MAX_CALIBRATION_MEASURES:
        if region is not None:  # it differs again: the recorder's mode, or the data
            suspect_mode(call, region)
            differed(region)
        return
    entry.recalibrations += 1
    entry.needs_measure = True
    log.info(
        "offrecomp: region %r call %d saved storage %d with another size than its "
        "recording in the calibration pass; signature %s measures again",
        call.name, call.call_index, index, shown(p.signature),
    )


def relayout(entry: PlanEntry | None, call: RegionCall, why: str) -> None:
    """``call``'s recording does not describe it (``why``; NOTE [Stale recordings] in
    regenerate.py): it replays plainly, and its signature (``entry``) measures again, up
    to MAX_RELAYOUT_MEASURES times; after that its steps alternate between layouts the
    signature does not tell apart, and such calls replay plainly under the plan, with one
    warning."""
    if entry is None or entry.needs_measure:
        return
    if measure_again(
        entry, "relayouts", MAX_RELAYOUT_MEASURES,
        "offrecomp: signature %s: region %r call %d and others run on other inputs than "
        "their recording from step to step (last: %s; it was measured again %d times), "
        "which the signature of the model's inputs does not tell apart; auto plans from "
        "the last recording, and such calls replay plainly. Hint: make the blocks' input "
        "shapes a function of the model's (for a slice taken in the forward: pass it in), "
        "give each optional argument on every step or on none, or keep such regions "
        "(regions=)",
        shown(entry.signature), call.name, call.call_index, why, MAX_RELAYOUT_MEASURES,
    ):
        log.info(
            "offrecomp: region %r call %d: %s; it replays plainly, and signature %s "
            "measures again",
            call.name, call.call_index, why, shown(entry.signature),
        )


def saved_more(call: RegionCall) -> bool:
    """Did ``call``, kept whole, save more than its recording: more storages, or more
    bytes (NOTE [Sizes of regions that vary])? The recording holds every region input,
    the call only those its ops save (it takes no replay checkpoint: NOTE [Kept planned
    calls] in placement.py), so a call that saved what was recorded never has more."""
    assert call.structure is not None
    recs = call.structure.storage_records
    storages = call.storages
    return len(storages) > len(recs) or sum(s.nbytes for s in storages) > sum(r.nbytes for r in recs)


def grew(entry: PlanEntry | None, p: PassState, call: RegionCall) -> None:
    """A planned call its plan keeps whole (NOTE [Kept planned calls] in placement.py),
    run with the hooks on, may have saved more than its recording (``saved_more``: a
    mixture of experts running more of them, or on more tokens): then the profile
    underestimates it, so the signature (``entry``) measures again, up to
    MAX_GROWTH_MEASURES times; then a warning says its steps may exceed the budget. It
    counts as a planned call that differs (``differed``): a region that saves more again
    after measuring again varies, and its profile grows instead (NOTE [Sizes of regions
    that vary])."""
    region = call.region
    if entry is None or (region is not None and region.variable) or not saved_more(call):
        return
    if region is not None:
        differed(region)
        if region.variable:
            return
    if not entry.needs_measure and measure_again(
        entry, "growths", MAX_GROWTH_MEASURES,
        "offrecomp: signature %s: region %r and others save more than their profile "
        "from step to step (it was measured again %d times); planned steps may hold more "
        "than the budget. Hint: keep such regions (regions=), or lower the budget",
        shown(p.signature), call.name, MAX_GROWTH_MEASURES,
    ):
        log.info(
            "offrecomp: region %r call %d saved more or larger storages than its profile; "
            "measuring signature %s again",
            call.name, call.call_index, shown(p.signature),
        )


def suspect_mode(call: RegionCall, region: Region) -> None:
    """``call`` saved other storages than its recording, made under the recorder: its
    region's code may behave otherwise under a dispatch mode, so its calls run under one
    from now on (NOTE [Replay], step 7), unless ``call`` ran under one already (the data
    decides)."""
    if call.passive is not None:
        region.mode_sensitive = False  # differs under a mode too
    elif region.mode_sensitive is None and not call.under_mode:
        region.mode_sensitive = True


def differed(region: Region) -> None:
    """One more planned call of ``region`` (or calibration call, NOTE [Calibration sizes])
    differed from its recording; the second makes it variable from then on (NOTE
    [Regions that vary] in placement.py)."""
    region.mismatches += 1
    if region.mismatches >= 2 and not region.variable:
        region.variable = True  # measured again, it differed again
        log.warning(
            "offrecomp: region %r saved other tensors than its profile in two planned passes "
            "(code that branches on the data or on Python state, or tensors of other "
            "layouts); no one recording describes its calls, so from now on its planned "
            "calls take the plan's placements by position and its replays rerun its forward "
            "plainly, up to what they regenerate",
            region.name,
        )


# NOTE [Sizes of regions that vary]
# A variable region's profile holds one step's routing (NOTE [Regions that vary] in
# placement.py): a planned step whose routing saves more holds more than predicted, and
# a budget set near the device's capacity must hold all the same. So each planned pass
# compares every call of such a region with its profile, storage by storage in order: an
# activation larger than the profile's, or activations past the profile's (they take the
# placement of its last activation, so they count with it), grow the profile's sizes to
# what the pass saved (``variable_sizes``); so does a storage larger than one the
# profile keeps always at its place, a storage the profile does not describe (a form
# whose op sequence differs, an attention processor saving its probabilities among small
# storages): it takes the placement of the last activation too (``outgrown``). A profile
# with no activation (each storage the recorded form saved was under ``min_bytes``, kept
# always) grows its kept storages so: a larger form's storages past them are kept too
# (the placement of the last activation, of which there is none, is KEEP). A call its
# plan keeps whole takes no replay checkpoint, so it holds only the region inputs its
# ops save, where they save them (NOTE [Kept planned calls] in placement.py): for it
# only the totals are compared (a storage of a recorded input's size taken for that
# input), and where it saved more than the profile's activations, each of them grows by
# that ratio (an upper bound: the storages that did not grow grow too). Either way the
# plan is then solved again (``settle_growth``): at once the first time, then after 1,
# 3, 7, ... learnt passes since the last solve (at most MAX_GROWTH_WAIT), as a random
# routing sets a new largest size somewhere for many steps, and a solve costs the host
# tens of milliseconds at the next step's start. The sizes only grow: the profile tends
# to the largest routing seen, and planned steps to at most their prediction. A pass
# that grew them is always learnt (NOTE [Learning cadence] in learning.py). A call of
# such a region kept whole saves natively but at its audits, which come four times as
# often as other calls' (every other pass on average: NOTE [Native keep] in native.py)
# until SETTLED (regions.py) of its calls in a row, seen with the hooks on, saved no
# more than the profile (``Region.settled``), so that its sizes are seen while they
# still grow. The same comparison of totals tells a call its plan keeps whole that saved
# more than its recording (``saved_more``, ``grew``).


def variable_sizes(p: PassState, profile: Profile, *, grow: bool, calibrating: bool = False) -> bool:
    """Did a call of a variable region in pass ``p`` save more than ``profile`` says
    (NOTE [Sizes of regions that vary])? With ``grow``, the profile's sizes grow to what
    it saved; without, each such region's ``settled`` count follows the pass's calls
    seen with the hooks on (the check runs once for every planned pass). A calibration
    pass (``calibrating``) that is learnt grows the sizes of its calls that differed
    from their recording (NOTE [Calibration sizes]) too."""
    by_key = None
    grew = False
    for call in p.calls:
        region = call.region
        if region is None or not (region.variable or (calibrating and call.mismatch)) or not call.storages:
            continue  # (no storages: it saved natively, NOTE [Native keep])
        if by_key is None:
            by_key = {r.key: r for r in profile.regions}
        r = by_key.get((call.name, call.call_index))
        if r is None:
            continue
        recs = r.storages
        grows = growing_kind(recs)
        if call.kept_whole:  # its inputs where its ops saved them, if at all: the totals only
            recorded = sum(x.nbytes for x in recs if x.kind == grows)
            ratio = _activation_bytes(call, recs) / recorded if recorded else 0.0
            pairs = [(x, math.ceil(x.nbytes * ratio)) for x in recs]
        else:  # a region input of another size is no sign (NOTE [Region inputs of another storage size])
            # inputs with inputs: the pass's records are inputs or activations, the
            # profile's activations under min_bytes are external
            pairs = [(x, s.nbytes) for x, s in zip(recs, call.storages) if (s.kind == "input") == (x.kind == "input")]
            last = max((i for i, (x, _) in enumerate(pairs) if x.kind == grows), default=-1)
            saved = len(recs) - sum(x.kind == "snapshot" for x in recs)  # NOTE [Replay and module state]
            extra = sum(s.nbytes for s in call.storages[saved:])
            extra += sum(n for x, n in pairs if outgrown(x, n, recs))  # placed as the last one, too
            if last >= 0 and extra:
                pairs[last] = (pairs[last][0], pairs[last][1] + extra)
        grown = False
        for rec, n in pairs:
            if rec.kind == grows and n > rec.nbytes:
                grown = grew = True
                if not grow:
                    break
                rec.nbytes = n
        if not grow:
            region.settled = 0 if grown else region.settled + 1
    return grew


def _activation_bytes(call: RegionCall, recs: list[StorageRecord]) -> int:
    """The bytes ``call``, kept whole, saved but for its region inputs: a storage of the
    size of a recorded input is taken for it (NOTE [Sizes of regions that vary])."""
    sizes = Counter(s.nbytes for s in call.storages)
    total = sum(s.nbytes for s in call.storages)
    for x in recs:
        if x.kind == "input" and sizes[x.nbytes] > 0:
            sizes[x.nbytes] -= 1
            total -= x.nbytes
    return total


def settle_growth(entry: PlanEntry, grew: bool) -> None:
    """A learnt planned pass of ``entry``'s signature grew its variable regions' sizes
    (``grew``), or did not: solve the plan again if its turn came (NOTE [Sizes of
    regions that vary])."""
    if grew:
        entry.growth_pending = True
    if entry.growth_pending and entry.learnt_since_solve >= min(2**entry.growth_solves - 1, MAX_GROWTH_WAIT):
        entry.growth_pending = False
        entry.growth_solves += 1
        entry.needs_solve = True
