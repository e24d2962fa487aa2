"""Calls that differ from their recording: when a signature measures again, when a
region is taken to branch on its data, and the warnings when neither helps."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from offrecomp.signatures import shown

if TYPE_CHECKING:
    from offrecomp.planning.entries import PlanEntry
    from offrecomp.regions import Region
    from offrecomp.state import PassState, RegionCall

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
# [Regions that vary] in placement.py), and the signature plans. State the first step
# lacks so costs no passive mode. What is found of a region after the profile was built
# goes into it when a plan is solved (``profiling.mark_found``).


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
        "offrecomp: signature %s: region %r call %d and others run on inputs of another "
        "layout or size than its recording from step to step (it was measured again %d "
        "times), which the signature of the model's inputs does not tell apart; auto "
        "plans from the last recording, and such calls replay plainly. Hint: make the "
        "blocks' input shapes a function of the model's (for a slice taken in the "
        "forward: pass it in), or keep such regions (regions=)",
        shown(entry.signature), call.name, call.call_index, MAX_RELAYOUT_MEASURES,
    ):
        log.info(
            "offrecomp: region %r call %d: %s; it replays plainly, and signature %s "
            "measures again",
            call.name, call.call_index, why, shown(entry.signature),
        )


def grew(entry: PlanEntry | None, p: PassState, call: RegionCall) -> None:
    """A planned call its plan keeps whole (NOTE [Kept planned calls] in placement.py)
    saved more storages than its recording (a mixture of experts running more of them):
    the profile underestimates it, so the signature (``entry``) measures again, up to
    MAX_GROWTH_MEASURES times; then a warning says its steps may exceed the budget."""
    if entry is None or entry.needs_measure or (call.region is not None and call.region.variable):
        return  # a variable region is known to save more some times
    if measure_again(
        entry, "growths", MAX_GROWTH_MEASURES,
        "offrecomp: signature %s: region %r and others save more than their profile "
        "from step to step (it was measured again %d times); planned steps may hold more "
        "than the budget. Hint: keep such regions (regions=), or lower the budget",
        shown(p.signature), call.name, MAX_GROWTH_MEASURES,
    ):
        log.info(
            "offrecomp: region %r call %d saved more storages than its profile; measuring "
            "signature %s again",
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
