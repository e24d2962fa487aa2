"""Online estimates of a step's costs and the predicted outcome of a plan.

``CostModel`` keeps exponential moving averages of everything the runtime measures per
step (op, region and step times, offsets, link bandwidths) for one input-shape
signature; ``estimate()`` hands the smoothed numbers to the solver as a ``Profile``.
``replay_seconds`` is the replay cost rule of ``scheduler.profile``; ``predict`` runs
the simulator (``scheduler.timeline``) and keeps its headline numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.plan import Placement, Plan
from scheduler.profile import Profile, RegionRecord
from scheduler.timeline import simulate

__all__ = ["CostModel", "Prediction", "predict", "replay_seconds"]


def replay_seconds(
    region: RegionRecord,
    placements: Sequence[Placement | int | str] | Mapping[int, Placement | int | str],
    *,
    op_overhead_seconds: float = 0.0,
) -> float:
    """Seconds the replay of ``region`` costs when its storages are placed as given.

    ``placements`` is one placement per storage of the region (a sequence in storage
    order) or a mapping from storage index to placement (missing indices are KEEP).
    With ``D`` the dropped (RECOMPUTE) storages and ``K = max(last_save_op over D)``
    (clamped to the op count), only ops ``0 .. K-1`` are considered. An op is *served*
    (free) when the region is not opaque, the op is skippable and every output is a
    storage placed KEEP or OFFLOAD (held: the replay runs after the region's reload).

    * Dataflow (the region is not opaque and every op has ``reads``): the ops that run
      are the closure of the producers of ``D`` and the sinks before ``K`` under
      ``reads``; an op reached that is served (a sink never is) costs nothing and its
      reads are not followed. Every ``view`` op before ``K`` runs as well (its reads
      are not followed). When a storage of ``D`` has ``producer_op < 0`` the
      prefix rule below applies instead.
    * Prefix (``reads`` unknown, or opaque: nothing is served there): every op before
      ``K`` costs its ``seconds`` unless served.

    With ``op_overhead_seconds`` (``Profile.replay_op_seconds``) ``h > 0`` the result is
    ``min(P, C + K * h)``, ``C`` the cost above and ``P`` the plain replay (every op
    before ``K``): the runtime replays plainly when its dispatch mode would cost more
    than it skips.

    A region without recorded ops costs its whole ``forward_seconds`` as soon as
    anything is dropped. Nothing dropped: 0.
    """
    h = float(op_overhead_seconds)
    if not math.isfinite(h) or h < 0.0:
        raise ValueError(
            f"op_overhead_seconds = {op_overhead_seconds!r} is invalid; accepted: a finite number >= 0"
        )
    n = len(region.storages)
    place = [Placement.KEEP] * n
    if isinstance(placements, Mapping):
        items = list(placements.items())
    else:
        if len(placements) != n:
            raise ValueError(
                f"region {region.name}#{region.call_index} has {n} storages but {len(placements)} "
                "placements were given; give one per storage or a mapping index -> placement"
            )
        items = list(enumerate(placements))
    for i, p in items:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise ValueError(
                f"storage index {i!r} is invalid for region {region.name}#{region.call_index}; "
                f"accepted: 0..{n - 1}"
            )
        place[i] = Placement.parse(p)
    dropped = [i for i in range(n) if place[i] == Placement.RECOMPUTE]
    if not dropped:
        return 0.0
    ops = region.ops
    if not ops:
        return float(region.forward_seconds)
    k = min(max(region.storages[i].last_save_op for i in dropped), len(ops))

    def served(j: int) -> bool:
        op = ops[j]
        return (
            not region.opaque
            and op.skippable
            and not op.sink
            and all(0 <= o < n and place[o] != Placement.RECOMPUTE for o in op.outputs)
        )

    plain = sum((op.seconds for op in ops[:k]), 0.0)
    dataflow = not region.opaque and all(op.reads is not None for op in ops)
    if not dataflow or any(region.storages[i].producer_op < 0 for i in dropped):
        served_sum = sum((op.seconds for j, op in enumerate(ops[:k]) if not served(j)), 0.0)
        return min(plain, served_sum + k * h)
    # the same worklist order as the simulator's kernel, so both sum alike; views before
    # K run, and the closure never enters them
    is_view = [op.view and not op.sink for op in ops[:k]]
    seen = list(is_view)
    work: list[int] = []
    for i in dropped:
        p = region.storages[i].producer_op
        if p < k and not seen[p]:
            seen[p] = True
            work.append(p)
    for j in range(k):
        if ops[j].sink and not seen[j]:
            seen[j] = True
            work.append(j)
    total = 0.0
    for j in work:  # grows while iterating: breadth-first
        if served(j):
            continue
        total += ops[j].seconds
        for r in ops[j].reads or ():
            if 0 <= r < k and not seen[r]:
                seen[r] = True
                work.append(r)
    views = sum((op.seconds for op, v in zip(ops, is_view) if v), 0.0)
    return min(plain, total + views + k * h)


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """The simulator's headline numbers for one plan."""

    step_seconds: float
    peak_bytes: int
    recompute_seconds: float
    stall_seconds: float
    d2h_bytes: int
    h2d_bytes: int
    forward_seconds: float = 0.0
    """From the step's start to the start of backward."""


def predict(profile: Profile, plan: Plan, *, prefetch_regions: int = 2) -> Prediction:
    """Predicted step time, peak activation bytes and traffic of ``plan``."""
    t = simulate(profile, plan, prefetch_regions=prefetch_regions)
    return Prediction(
        step_seconds=t.step_seconds,
        peak_bytes=t.peak_bytes,
        recompute_seconds=t.recompute_seconds,
        stall_seconds=t.stall_seconds,
        d2h_bytes=t.d2h_bytes,
        h2d_bytes=t.h2d_bytes,
        forward_seconds=t.forward_seconds,
    )


HOST_COSTS = (
    "pack_host_seconds",
    "unpack_host_seconds",
    "capture_host_seconds",
    "offload_host_seconds",
    "reload_host_seconds",
    "replay_host_seconds",
)
"""The profile's per-save, per-call, per-group and per-replay host costs (NOTE [Host time] in
``scheduler.timeline``): averaged like the bandwidths, 0 meaning not measured."""


def _ema(old: float, new: float, alpha: float) -> float:
    """The moving average; a value that is not finite (a failed measurement) leaves the
    other as it is, so one never stays in the estimate. Written as a step from ``old``
    towards ``new``: equal values leave it exactly as it is (``(1 - a) * x + a * x`` is
    not ``x`` in floating point, and an estimate an ulp off its profile can flip a plan)."""
    if not math.isfinite(new):
        return old
    if not math.isfinite(old):
        return new
    return old + alpha * (new - old)


def _same_shape(a: RegionRecord, b: RegionRecord) -> bool:
    return (
        a.key == b.key
        and len(a.ops) == len(b.ops)
        and len(a.storages) == len(b.storages)
        and all(x.outputs == y.outputs for x, y in zip(a.ops, b.ops))
    )


class CostModel:
    """Smoothed profile of one signature, updated with every measured step.

    Times (op, region, step, save offsets, region host times) link bandwidths and the
    runtime's host costs (``HOST_COSTS``) are exponential moving averages with weight
    ``alpha`` on the newest measurement. Structure (which ops and storages exist, byte
    sizes, kinds, save positions) is taken from the newest profile; a region whose
    structure changed starts its averages afresh. A bandwidth or host cost of 0 in an
    update (a region host time of None) means "not measured this step" and keeps the
    previous estimate.
    """

    def __init__(self, alpha: float = 0.3) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha = {alpha!r} is invalid; accepted: a number in (0, 1]")
        self.alpha = float(alpha)
        self._estimate: Profile | None = None
        self.samples = 0
        """Number of profiles merged so far."""

    @property
    def signature(self) -> str | None:
        return None if self._estimate is None else self._estimate.signature

    def update(self, profile: Profile, *, take: bool = False) -> None:
        """Merge a newly measured profile of the same signature.

        With ``take=True`` the model keeps ``profile`` itself as its new estimate (its
        times overwritten with the averages) instead of a copy: for a caller that made
        ``profile`` for this call and does not change it afterwards.
        """
        if not isinstance(profile, Profile):
            raise TypeError(f"expected a scheduler.Profile, got {type(profile).__name__}")
        new = profile if take else profile.copy()
        old = self._estimate
        self.samples += 1
        if old is None:
            self._estimate = new
            return
        if new.signature != old.signature:
            raise ValueError(
                f"profile signature {new.signature!r} does not match this cost model's "
                f"{old.signature!r}; keep one CostModel per signature"
            )
        a = self.alpha
        new.forward_seconds = _ema(old.forward_seconds, new.forward_seconds, a)
        new.backward_seconds = _ema(old.backward_seconds, new.backward_seconds, a)
        for name in ("d2h_gbps", "h2d_gbps", *HOST_COSTS):
            o, n = getattr(old, name), getattr(new, name)
            measured = 0 < n < math.inf  # 0 (and a failed measurement): not measured
            setattr(new, name, o if not measured else (n if not 0 < o < math.inf else _ema(o, n, a)))
        previous = {r.key: r for r in old.regions}
        for r in new.regions:
            p = previous.get(r.key)
            if p is None or not _same_shape(p, r):
                continue
            r.start_seconds = _ema(p.start_seconds, r.start_seconds, a)
            r.forward_seconds = _ema(p.forward_seconds, r.forward_seconds, a)
            r.backward_seconds = _ema(p.backward_seconds, r.backward_seconds, a)
            for name in ("host_seconds", "backward_host_seconds"):
                o, n = getattr(p, name), getattr(r, name)
                setattr(r, name, o if n is None else (n if o is None else _ema(o, n, a)))
            for x, y in zip(p.ops, r.ops):
                y.seconds = _ema(x.seconds, y.seconds, a)
            for xs, ys in zip(p.storages, r.storages):
                ys.offset_seconds = _ema(xs.offset_seconds, ys.offset_seconds, a)
        if len(old.root) == len(new.root):
            for xs, ys in zip(old.root, new.root):
                ys.offset_seconds = _ema(xs.offset_seconds, ys.offset_seconds, a)
        self._estimate = new

    def estimate(self) -> Profile:
        """The smoothed profile (a copy)."""
        if self._estimate is None:
            raise ValueError("the cost model has no measurements yet; call update(profile) first")
        return self._estimate.copy()

    def drift(self, profile: Profile) -> float:
        """Largest relative difference of a region's forward or backward time between
        ``profile`` and the estimate (``inf`` when the region set differs): the runtime
        re-plans when this exceeds its threshold."""
        if self._estimate is None:
            return math.inf
        est = {r.key: r for r in self._estimate.regions}
        if len(est) != len(profile.regions):
            return math.inf
        worst = 0.0
        for r in profile.regions:
            e = est.get(r.key)
            if e is None:
                return math.inf
            for a, b in (
                (e.forward_seconds, r.forward_seconds),
                (e.backward_seconds, r.backward_seconds),
            ):
                scale = max(abs(a), 1e-12)
                d = abs(b - a) / scale
                if not math.isfinite(d):
                    return math.inf  # a failed measurement on either side: no agreement
                worst = max(worst, d)
        return worst
