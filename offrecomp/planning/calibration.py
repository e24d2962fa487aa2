"""The calibration pass (NOTE [Calibration]): each region's op times fitted to the
plain replay the pass measured, the dispatch mode's cost per op from its probes (NOTE
[Dispatch probe] in replay_cost.py), and the whole pass checked against its
prediction."""

from __future__ import annotations

import logging
import statistics
from typing import TYPE_CHECKING, Any

from offrecomp.planning.profiling import (
    own_seconds,
    prefetch_depth,
    region_shape,
    split_backward,
    within,
)
from offrecomp.trace import RUN
from scheduler.cost_model import predict
from scheduler.plan import Placement, Plan

if TYPE_CHECKING:
    from collections.abc import Mapping

    from offrecomp.measure import Clock
    from offrecomp.planning.entries import PlanEntry
    from offrecomp.planning.host import PlannerHost
    from offrecomp.planning.replay_cost import ReplayCost
    from offrecomp.state import PassState
    from scheduler.profile import Profile, RegionRecord

log = logging.getLogger("offrecomp.planning.learning")

RECOMPUTE = Placement.RECOMPUTE


def calibrate_replays(
    p: PassState, measured: Profile, host: PlannerHost, replay_cost: ReplayCost, entries: Mapping[str, PlanEntry]
) -> None:
    """NOTE [Calibration]: fit each region's op times to the plain replay the
    calibration pass measured, then compare the whole pass with its prediction.

    Recorded op times miss what runs between ops (Python module code; on GPU, launch
    gaps), so their sum falls short of a real replay. The calibration pass replays
    each region plainly (every op before its stop K runs), so the shortfall against
    that measured replay, spread over those K ops, is a time per op. The check at
    the end logs the breakdown, so that a model that still disagrees with
    the device says where (forward, backward, replay).
    """
    clock = host.clock
    by_key = {r.key: r for r in measured.regions}
    fit_replays(p, by_key, clock)
    probe = probe_seconds(p, by_key, clock)
    if probe is not None:
        replay_cost.observe(probe, entries)
        log.info(
            "offrecomp: calibration pass of signature %s: a replay under the dispatch mode "
            "costs %.1f us per op it sees (the probes' median; taken as %.1f)",
            p.signature, 1e6 * probe, 1e6 * replay_cost.seconds,
        )
    # the probes replayed under the dispatch mode, which a plan prices plainly where
    # that is cheaper: the check leaves them out of both sides (NOTE [Dispatch probe])
    probed = {ordinal for ordinal, *_ in p.dispatch_probes}
    probes = sum(clock.seconds(a, b) or 0.0 for _, a, b, _ in p.dispatch_probes)
    placements: dict[tuple[str, int, int], Placement] = {}
    for c in p.calls:
        for rec in c.storages:
            if rec.placement == RECOMPUTE and not c.is_root and c.key in by_key and c.ordinal not in probed:
                placements[(c.name, c.call_index, rec.index)] = RECOMPUTE
    plan = Plan(placements=placements)
    measured.replay_op_seconds = replay_cost.seconds  # the rule the pass replayed by
    cfg = host.config
    try:
        pred = predict(measured, plan, prefetch_regions=prefetch_depth(cfg.prefetch, measured))
    except ValueError as exc:  # a structure the profile cannot place as the pass did
        log.debug("offrecomp: calibration check skipped (%s)", exc)
        return
    inside = within(p)
    if split_backward(p) or len(inside) < len(p.replay_marks):
        # NOTE [Split backwards] (profiling.py): its span is not the pass, as where a later
        # backward of its outputs (one loss of several at a time) replayed more
        log.debug("offrecomp: calibration check skipped (the pass's backward was split)")
        return
    step = own_seconds(p, p.start_mark, p.backward_end_mark, clock)
    fwd = own_seconds(p, p.start_mark, p.backward_start_mark, clock)
    replay = sum(clock.seconds(a, b) or 0.0 for _, a, b in inside) - probes
    if step is None or fwd is None or step - probes <= 0:
        return
    step -= probes
    off = pred.step_seconds / step - 1.0
    ran = {c.key for c in p.calls if not c.is_root}
    same_calls = ran == set(by_key)  # else the profile holds calls this pass did not run
    level = logging.WARNING if abs(off) > cfg.drift and same_calls else logging.INFO
    log.log(
        level,
        "offrecomp: calibration pass of signature %s: measured step %.4fs (forward %.4fs, "
        "replay %.4fs, backward without replay %.4fs%s), the model predicts %.4fs (%+.0f%%; "
        "forward %.4fs, replay %.4fs)",
        p.signature, step, fwd, replay, max(0.0, step - fwd - replay),
        f"; less {len(probed)} dispatch-mode probe(s) of {probes:.4f}s" if probed else "",
        pred.step_seconds, 100 * off, pred.forward_seconds, pred.recompute_seconds,
    )


def fit_replays(p: PassState, by_key: dict[tuple[str, int], RegionRecord], clock: Clock) -> None:
    """NOTE [Calibration]: each region's op times fitted to the calibration pass's plain
    replay of it; a replay a host pause distorted, or one a split pass's later backward
    had not run yet, takes a fitted peer's times."""
    by_ordinal = {c.ordinal: c for c in p.calls}
    seen: set[tuple[str, int]] = set()
    paused: set[tuple[str, int]] = set()
    for ordinal, *_ in p.dispatch_probes:  # NOTE [Dispatch probe]: their peers' times
        if ordinal in by_ordinal:
            paused.add(by_ordinal[ordinal].key)
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
    if split_backward(p):  # NOTE [Split backwards] (profiling.py): a later backward's replays come late
        paused |= {c.key for c in p.calls if not c.is_root}
    fitted: dict[tuple[Any, ...], RegionRecord] = {}
    for key in seen:
        if key in by_key:
            fitted.setdefault(region_shape(by_key[key]), by_key[key])
    for key in paused - seen:
        r = by_key.get(key)
        peer = fitted.get(region_shape(r)) if r is not None else None
        if r is not None and peer is not None:
            for op, q in zip(r.ops, peer.ops):
                op.seconds = q.seconds


def probe_seconds(p: PassState, by_key: dict[tuple[str, int], RegionRecord], clock: Clock) -> float | None:
    """NOTE [Dispatch probe]: the median of the dispatch mode's cost per op that the
    calibration pass's probes showed over their ops' fitted times; None without a clean
    probe."""
    calls = {c.ordinal: c for c in p.calls}
    seen: list[float] = []
    for ordinal, a, b, program in p.dispatch_probes:
        call = calls.get(ordinal)
        secs = clock.seconds(a, b)
        r = by_key.get(call.key) if call is not None else None
        if r is None or secs is None or secs <= 0 or not program or clock.distorted(a, b, secs):
            continue  # NOTE [Host pauses]
        run = sum(op.seconds for op, act in zip(r.ops, program) if act == RUN)
        seen.append(max(0.0, (secs - run) / len(program)))
    return statistics.median(seen) if seen else None
