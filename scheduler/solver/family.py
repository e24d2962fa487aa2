"""The family of candidate plans (steps 1-6 of scheduler.solver): budget-independent,
each simulated once, so that the solver only picks among them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from scheduler.flat import OFFLOAD_BIT, RECOMPUTE_BIT, FlatProfile
from scheduler.solver.chain import _chain_step
from scheduler.solver.hidden import hidden_offloads
from scheduler.timeline import SimResult, Workspace

__all__: list[str] = []


#: Steps the chain takes from all-KEEP to the most frugal plan.
CHAIN_STEPS = 40
#: The chain stops after this many steps without lowering the peak.
CHAIN_PATIENCE = 8
#: Shares of the hidden set's bytes (in its order) offloaded at the start of the chains
#: of drops a family that may offload also walks (NOTE [Offload families]).
HIDDEN_START_SHARES = (0.5, 1.0)
#: Profiles with at most this many storages also get a Pareto local search.
REFINE_MAX_STORAGES = 48
#: Profiles with at most this many storages also try changing two storages at once.
REFINE_PAIRS_MAX_STORAGES = 12
#: ... and three at once from the most frugal plan.
REFINE_TRIPLES_MAX_STORAGES = 10
#: Most simulations the local search may spend.
REFINE_MAX_SIMULATIONS = 20_000
#: Most simulations the peak descent may spend (NOTE [peak descent]) ...
DESCENT_MAX_SIMULATIONS = 1_000
#: ... and at most this many storages simulated in all (a simulation's cost grows with them).
DESCENT_MAX_WORK = 300_000
#: The descent changes storages of the unit at the peak and of this many units each side.
DESCENT_UNITS = 2
#: The chain reuses a region's drop options while the region is unchanged (NOTE [drop
#: cache]); False prices every region at every step, with the same plans.
_DROP_CACHE = True
#: Results the drop cache keeps per region (the chain's peak often alternates between
#: two times, and with it which storages are resident).
_DROP_CACHE_WAYS = 2


class _Family:
    """Budget-independent candidate plans of one profile, each simulated once."""

    def __init__(self, flat: FlatProfile, ws: Workspace, legal: np.ndarray, prefetch: int) -> None:
        self.flat = flat
        self.ws = ws
        self.legal = legal
        self.prefetch = prefetch
        self.places: list[np.ndarray] = []
        self.results: list[SimResult] = []

    def add(self, place: np.ndarray) -> SimResult:
        res = self.ws.run(place, self.prefetch)
        self.places.append(place.copy())
        self.results.append(res)
        return res

    @property
    def times(self) -> np.ndarray:
        return np.asarray([r.step for r in self.results])

    @property
    def peaks(self) -> np.ndarray:
        return np.asarray([r.peak for r in self.results], dtype=np.int64)

    def frontier(self) -> list[int]:
        """Members no other member beats on both step time and peak."""
        order = sorted(
            range(len(self.results)), key=lambda i: (self.results[i].step, self.results[i].peak, i)
        )
        out: list[int] = []
        best_peak = None
        for i in order:
            p = self.results[i].peak
            if best_peak is None or p < best_peak:
                out.append(i)
                best_peak = p
        return out

    def refine(self) -> None:
        """Pareto local search: simulate every plan one storage change away (on tiny
        profiles two) from every frontier member, and three away from the most frugal
        one on the tiniest, until the frontier stops changing or the simulation
        allowance is spent."""
        n = self.flat.n_storages
        moves = [(s, q) for s in range(n) for q in (0, 1, 2) if self.legal[s] & (1 << q)]
        seen = {p.tobytes() for p in self.places}
        expanded: set[tuple[bytes, int]] = set()
        budget = [REFINE_MAX_SIMULATIONS]

        def expand(base: np.ndarray, depth: int) -> None:
            for combo in itertools.combinations(range(len(moves)), depth):
                if budget[0] <= 0:
                    return
                cand = base.copy()
                touched = set()
                for m in combo:
                    s, q = moves[m]
                    if s in touched or base[s] == q:
                        break
                    touched.add(s)
                    cand[s] = q
                else:
                    key = cand.tobytes()
                    if key not in seen:
                        seen.add(key)
                        self.add(cand)
                        budget[0] -= 1

        while budget[0] > 0:
            front = self.frontier()
            frugal = min(front, key=lambda i: (self.results[i].peak, self.results[i].step))
            work = []
            for i in front:
                depths = [1]
                if n <= REFINE_PAIRS_MAX_STORAGES:
                    depths.append(2)
                if i == frugal and n <= REFINE_TRIPLES_MAX_STORAGES:
                    depths.append(3)
                for d in depths:
                    key = (self.places[i].tobytes(), d)
                    if key not in expanded:
                        expanded.add(key)
                        work.append((i, d))
            if not work:
                return
            for i, d in work:
                expand(self.places[i], d)


def _descend(fam: _Family, frugal: range) -> None:
    """Walk down from the family's lowest-peak member, and from the ``frugal`` members
    (every droppable storage dropped) where they are other plans, one storage change at
    a time (NOTE [peak descent])."""
    lowest = min(range(len(fam.results)), key=lambda j: (fam.results[j].peak, fam.results[j].step))
    key = fam.places[lowest].tobytes()  # the frugal plans differ from each other
    for i in [lowest, *(j for j in frugal if fam.places[j].tobytes() != key)]:
        _descend_from(fam, i)


def _descend_from(fam: _Family, i: int) -> None:
    """The peak descent from member ``i`` (NOTE [peak descent])."""
    legal, st_ptr = fam.legal, fam.flat.st_ptr
    cur, res = fam.places[i].copy(), fam.results[i]
    allowance = min(DESCENT_MAX_SIMULATIONS, DESCENT_MAX_WORK // max(fam.flat.n_storages, 1))
    ws = Workspace(fam.flat)
    improved = True
    while improved:
        improved = False
        ws.run(cur, fam.prefetch)
        u = _unit_at(ws, res.peak_time)
        lo, hi = max(u - DESCENT_UNITS, 0), min(u + DESCENT_UNITS + 1, len(st_ptr) - 1)
        for change in _descent_moves(cur, legal, st_ptr, lo, hi):
            if allowance <= 0:
                return
            allowance -= 1
            old = [(s, cur[s]) for s, _ in change]
            for s, q in change:
                cur[s] = q
            step = fam.ws.run(cur, fam.prefetch)
            if step.peak < res.peak:
                fam.places.append(cur.copy())
                fam.results.append(step)
                res, improved = step, True
                break  # the peak moved: look around its new place
            for s, q in old:
                cur[s] = q


def _descent_moves(
    cur: np.ndarray, legal: np.ndarray, st_ptr: np.ndarray, lo: int, hi: int
) -> Iterator[tuple[tuple[int, int], ...]]:
    """The peak descent's moves over the storages of units ``lo`` to ``hi - 1``: each
    single change (keep, drop, offload), then, per unit, its last k dropped storages
    kept at once (k >= 2): a replay runs its region's ops up to the last save it
    regenerates, so keeping one of the last alone shortens it by nothing where another
    after it is still dropped (NOTE [peak descent])."""
    for s in range(int(st_ptr[lo]), int(st_ptr[hi])):
        for q in (0, 2, 1):
            if q != cur[s] and legal[s] & (1 << q):
                yield ((s, q),)
    for v in range(lo, hi):
        dropped = [s for s in range(int(st_ptr[v]), int(st_ptr[v + 1])) if cur[s] == 2 and legal[s] & 1]
        for k in range(2, len(dropped) + 1):
            yield tuple((s, 0) for s in dropped[-k:])


def _unit_at(ws: Workspace, t: float) -> int:
    """The unit computing at time ``t`` in the simulation ``ws`` holds: in backward the
    one whose reach-to-end span holds it, else in forward."""
    n = ws.cend.shape[0]
    for v in range(n):
        if ws.reach[v] <= t <= ws.cend[v]:
            return v
    for v in range(n):
        if ws.fstart[v] <= t <= ws.fend[v]:
            return v
    return n - 1


# NOTE [peak descent]: dropping a storage can raise the peak (its region's replay brings
# it back with a working set; a plain replay's early frees depend on what it keeps), so
# dropping every droppable storage is not always the most frugal plan, and the chain's
# way down follows measured times: two solves of one model could find a budget near the
# frugal end met and not. So the family also walks down from its lowest-peak member:
# among the storages of the unit computing at the peak and of DESCENT_UNITS units each
# side (the ones whose placement moves that peak), the first single change (keep, drop,
# offload), or else the first keep of a unit's last k dropped storages at once, that
# lowers the peak is taken, and the search starts again where the peak now is, until no
# such change lowers it or the allowance is spent (fewer simulations the more storages
# a profile has, as each costs more). It walks from the frugal plans too where they are
# not that member: two members of one peak can lie in different valleys (the frugal
# plan's peak a block's replay, which keeping its last saves lowers; a faster member of
# the same peak keeping later blocks whole, where each such keep raises it), and the
# tie goes to the faster one (a block of 6 extra ops stayed at 1.31x the lowest peak a
# descent from the frugal plan reaches). It depends on no budget, so a larger budget
# still never gets a slower plan.


def _producers(flat: FlatProfile) -> tuple[np.ndarray, np.ndarray]:
    """Per storage, the ops that list it among their outputs (CSR)."""
    n_ops = flat.op_sec.shape[0]
    counts = np.diff(flat.out_ptr)
    owner = np.repeat(np.arange(n_ops, dtype=np.int64), counts)
    ok = flat.out_idx >= 0
    st = flat.out_idx[ok]
    ops = owner[ok]
    order = np.argsort(st, kind="stable")
    ptr = np.zeros(flat.n_storages + 1, dtype=np.int64)
    np.add.at(ptr, st + 1, 1)
    return np.cumsum(ptr).astype(np.int64), ops[order].astype(np.int64)


def _level_at(ws: Workspace, t: float) -> int:
    """Resident bytes at time ``t`` in the simulation ``ws`` holds (after all events at ``t``)."""
    n = ws.n_events
    i = int(np.searchsorted(ws.ev_t[:n], t, side="right"))
    return int(ws.ev_d[:i].sum())



class _ChainScratch:
    """The chain step's scratch, kept between its calls (tags drawn from ``ctr``, see
    ``_chain_step``), and the drop cache (NOTE [drop cache])."""

    def __init__(self, flat: FlatProfile) -> None:
        n = flat.n_storages
        n_ops = flat.op_sec.shape[0]
        self.ctr = np.zeros(1, dtype=np.int64)
        self.join, self.vis, self.ran, self.stamp, self.sstamp = (
            np.zeros(n_ops, dtype=np.int64) for _ in range(5)
        )
        self.odrop = np.zeros(n, dtype=np.int64)
        self.stack = np.zeros(max(flat.max_unit_ops, 1), dtype=np.int64)
        ways = _DROP_CACHE_WAYS
        self.dc_code = np.full((ways, n), -1, dtype=np.int8)
        self.dc_items = np.zeros((ways, n), dtype=np.int64)
        self.dc_eff = np.zeros((ways, n), dtype=np.int64)
        self.dc_f = np.zeros((ways, flat.fwd_dur.shape[0], 2))
        self.dc_i = np.zeros((ways, flat.fwd_dur.shape[0], 4), dtype=np.int64)


class _Chain:
    """What every step of one chain shares: the profile, the hidden set and how each
    region's drops are priced."""

    def __init__(self, flat: FlatProfile, ws: Workspace, legal: np.ndarray, prefetch: int) -> None:
        self.flat = flat
        self.prefetch = prefetch
        self.prod_ptr, self.prod_ops = _producers(flat)
        # dataflow pricing where every droppable storage has a producer (else prefix pricing)
        can_drop = (legal & RECOMPUTE_BIT) != 0
        self.df_price = flat.dataflow.copy()
        self.df_price[flat.unit_of[can_drop & (flat.st_prod < 0)]] = False
        self.h_order, self.h_land = hidden_offloads(flat, ws, legal, prefetch)
        self.scratch = _ChainScratch(flat)

    def step(
        self,
        cur: np.ndarray,
        cur_ws: Workspace,
        tstar: float,
        delta: int,
        allowed: np.ndarray,
        new: np.ndarray,
        side: np.ndarray,
    ) -> tuple[int, bool]:
        """``_chain_step`` from ``cur``, whose simulation ``cur_ws`` holds."""
        f, c = self.flat, self.scratch
        if not _DROP_CACHE:
            c.dc_code[:] = -1
        freed, has_side = _chain_step(
            cur, new, side, tstar, delta, self.prefetch, self.h_order, self.h_land,
            allowed, f.save_order, f.st_ptr, f.unit_of, f.nbytes,
            f.save_time, f.last_save, f.st_prod, f.op_ptr, f.op_sec,
            f.op_serv, f.op_sink, f.out_ptr, f.out_idx, f.rd_ptr,
            f.rd_idx, f.noops, self.df_price, f.fwd_dur, f.d2h_bps, f.h2d_bps,
            cur_ws.d2h_end, cur_ws.h2d_end, cur_ws.reach, cur_ws.cstart, cur_ws.riss,
            cur_ws.fend, self.prod_ptr, self.prod_ops,
            c.ctr, c.join, c.vis, c.ran, c.stamp, c.sstamp, c.odrop, c.stack,
            f.op_host, c.dc_code, c.dc_items, c.dc_eff, c.dc_f, c.dc_i, f.op_view
        )
        return int(freed), bool(has_side)


def _frugal_plans(fam: _Family, legal: np.ndarray) -> int:
    """Add the frugal plans (every droppable storage dropped, and also every other
    offloadable one offloaded); returns the smaller of their peaks."""
    can_drop = (legal & RECOMPUTE_BIT) != 0
    can_off = (legal & OFFLOAD_BIT) != 0
    frugal = np.where(can_drop, 2, 0).astype(np.int8)
    floor = fam.add(frugal).peak
    if bool(np.any(can_off & ~can_drop)):
        frugal_off = np.where(can_drop, 2, np.where(can_off, 1, 0)).astype(np.int8)
        floor = min(floor, fam.add(frugal_off).peak)
    return floor


def _run_chain(
    fam: _Family, chain: _Chain, cur_ws: Workspace, keep_res: SimResult, floor: int,
    legal: np.ndarray, start: int = 0,
) -> None:
    """Walk the chain of plans from member ``start`` of ``fam`` (by default all-KEEP),
    whose simulation ``cur_ws`` holds, moving storages as ``legal`` allows, adding each
    step's plans to ``fam``.

    NOTE [chain workspaces]: the chain step reads the simulation of the chain's current
    plan. ``cur_ws`` keeps that one while new members are simulated in the family's own
    workspace, and an accepted step swaps the two: a rejected step leaves the chain's
    state in place, so only the drops-only restart from an earlier plan simulates again.

    NOTE [chain bans]: a step that frees bytes at the peak can create an equal or
    higher peak elsewhere (a dropped storage returns when its region's backward
    starts). Such a step is kept as a family member, its moves are banned and the
    step is retried from the previous plan; bans are lifted after the next progress.

    NOTE [drops-only leg]: offloads can leave the chain see-sawing between a forward
    peak (copies in flight) and a backward peak (reloads); when it stops making
    progress it restarts from its lowest-peak plan with drops as the only new moves,
    which carries the family down to the frugal end.
    """
    n = fam.flat.n_storages
    prefetch = fam.prefetch
    span = keep_res.peak - floor if floor < keep_res.peak else keep_res.peak
    delta = max(1, span // CHAIN_STEPS)
    cur = fam.places[start]
    res = fam.results[start]
    new = np.empty(n, dtype=np.int8)
    side = np.empty(n, dtype=np.int8)
    banned = np.zeros(n, dtype=np.int64)
    stale = 0  # steps since the peak last went down
    drops_only = False
    mask = legal
    allowed = mask  # mask & ~banned, rebuilt only when a move is banned
    best_place, best_res = cur, res
    for _ in range(3 * CHAIN_STEPS + 16):
        freed = 0
        if stale < CHAIN_PATIENCE:
            freed, has_side = chain.step(cur, cur_ws, res.peak_time, delta, allowed, new, side)
        if freed <= 0:
            if drops_only:
                break
            drops_only = True
            mask = allowed = legal & ~OFFLOAD_BIT
            chain.h_order = chain.h_order[:0]
            if best_place is not cur:
                cur = best_place
                res = cur_ws.run(cur, prefetch)
            stale = 0
            banned[:] = 0
            continue
        if has_side:
            fam.add(side)
        step = fam.add(new)
        stale = 0 if step.peak <= res.peak - max(1, delta // 4) else stale + 1
        if step.peak < res.peak or _level_at(cur_ws, step.peak_time) >= step.peak:
            cur = fam.places[-1]
            res = step
            cur_ws, fam.ws = fam.ws, cur_ws
            if allowed is not mask:
                banned[:] = 0
                allowed = mask
            if res.peak < best_res.peak:
                best_place, best_res = cur, res
        else:
            changed = new != cur
            banned[changed & (new == 2)] |= RECOMPUTE_BIT
            banned[changed & (new == 1)] |= OFFLOAD_BIT
            allowed = mask & ~banned


def _members(
    flat: FlatProfile, ws: Workspace, legal: np.ndarray, prefetch: int, keep_res: SimResult
) -> _Family:
    """Steps 2-5 of scheduler.solver with the moves ``legal`` allows; ``ws`` holds the
    all-KEEP simulation."""
    fam = _Family(flat, Workspace(flat), legal, prefetch)
    keep = np.zeros(flat.n_storages, dtype=np.int8)
    fam.places.append(keep.copy())
    fam.results.append(keep_res)
    floor = _frugal_plans(fam, legal)
    frugal = range(1, len(fam.places))  # after all-KEEP, the frugal plans
    _run_chain(fam, _Chain(flat, ws, legal, prefetch), ws, keep_res, floor, legal)
    _descend(fam, frugal)
    if flat.n_storages <= REFINE_MAX_STORAGES:
        fam.refine()
    return fam


def _hidden_starts(fam: _Family, ws: Workspace, keep_res: SimResult) -> None:
    """Chains of drops from plans that offload a share of the hidden set (NOTE [Offload
    families]); each chain walks in ``ws``, which this simulates its start in."""
    flat, prefetch = fam.flat, fam.prefetch
    h_order, _ = hidden_offloads(flat, ws, fam.legal, prefetch, by_producer=True)
    if h_order.shape[0] == 0:
        return
    drops = fam.legal & ~OFFLOAD_BIT
    cum = np.cumsum(flat.nbytes[h_order])
    for share in HIDDEN_START_SHARES:
        k = min(int(np.searchsorted(cum, share * cum[-1])) + 1, h_order.shape[0])
        start = np.zeros(flat.n_storages, dtype=np.int8)
        start[h_order[:k]] = 1
        fam.add(start)
        ws.run(start, prefetch)
        chain = _Chain(flat, ws, drops, prefetch)
        _run_chain(fam, chain, ws, keep_res, 0, drops, start=len(fam.places) - 1)


def _build_family(
    flat: FlatProfile, ws: Workspace, legal: np.ndarray, prefetch: int, keep_res: SimResult
) -> _Family:
    """The family (scheduler.solver, steps 1-6); ``ws`` holds the all-KEEP simulation."""
    fam = _members(flat, ws, legal, prefetch, keep_res)
    if not bool(np.any(legal & OFFLOAD_BIT)):
        return fam
    keep = np.zeros(flat.n_storages, dtype=np.int8)
    ws.run(keep, prefetch)
    sub = _members(flat, ws, legal & ~OFFLOAD_BIT, prefetch, keep_res)
    fam.places += sub.places
    fam.results += sub.results
    _hidden_starts(fam, ws, keep_res)
    return fam


# NOTE [Offload families]: the chain that may offload takes the hidden set's members
# first (free in the model) and then pays for what it frees next at the peak, one greedy
# step at a time; at some budgets its path ends slower than the chain that only drops
# (on a GPT block stack at 25% of keep's bytes, 2-5% slower), and a plan that may offload
# must never be predicted slower than the best one that does not. So a family that may
# offload also holds every member of the family that only drops (the same steps with
# offloads off: the plan solve(allow_offload=False) picks is among them), and the chains
# of drops that start from all-KEEP with the first HIDDEN_START_SHARES of a hidden set's
# bytes offloaded (drops on top of copies the link hides). That set ranks storages by
# their producer op's seconds per byte, not by what dropping each alone would replay:
# where drops follow, the region replays anyway, and a storage next to a dropout (alone,
# its drop replays the dropout) is cheap to drop along with the rest; its link time is
# better spent on a matmul's output. On the GPT above, with dropout, that ranking gave
# 0.934-0.970 of the no-offload plan's step against 0.958-0.980.
