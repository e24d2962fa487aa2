"""The placement optimiser: a memory budget in, the plan with the least predicted step time out.

How it works (details in docs/planner.md):

1. **Hidden offload set.** Storages that may be offloaded are ranked by how expensive
   they are to recompute per byte (region inputs and root storages first: they cannot
   be recomputed). Walking that ranking, a storage joins the set when, with everything
   already in it, every D2H copy still lands before backward starts and every reload
   still lands before its region's backward needs it (checked incrementally: a segment
   tree for the D2H FIFO, a FIFO propagation for the H2D stream). Offloading a member
   costs no time in the model; a storage of the last regions, whose reload would only
   stall, never qualifies.
2. **Chain of plans.** From all-KEEP, each step simulates the current plan, finds the
   time of its memory peak and frees about ``delta`` bytes *at that time*, cheapest
   seconds per byte first: hidden-set members that are off the device then (free),
   offloads that may stall (priced by the stall they add to their region), and drops.
   Drops are priced per region knowing the shared replay prefix: for every prefix end
   ``K`` an option pays the ops before ``K`` that are not served plus the producers of
   what it drops. A step that overshoots also records a side plan that frees the same
   bytes with the single cheapest option. A step that only moves the peak is undone and
   its moves banned; when the chain stalls it continues with drops only.
3. **Frugal plans.** Dropping every droppable storage, with and without offloading
   every offloadable one.
4. **Local search** (profiles of at most ``REFINE_MAX_STORAGES`` storages): every plan
   one storage change (two on tiny profiles) away from a plan on the time/peak Pareto
   frontier is simulated, until the frontier stops changing.
5. **Pick.** Every plan of that family has been simulated once; the answer is the
   fastest one whose peak fits the budget (and whose offloads fit the host limit). The
   family does not depend on the budget, so a larger budget never gives a slower plan.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math

import numpy as np

from scheduler.bound import lower_bound_flat
from scheduler.flat import OFFLOAD_BIT, RECOMPUTE_BIT, FlatProfile, flatten
from scheduler.kernels import argsort, njit, njit_inline, replay_unit, served_now
from scheduler.plan import Placement, Plan
from scheduler.profile import Profile
from scheduler.timeline import SimResult, Workspace, check_prefetch
from scheduler.units import format_bytes

__all__ = ["InfeasibleBudgetError", "exhaustive_solve", "solve"]

logger = logging.getLogger(__name__)

#: Steps the chain takes from all-KEEP to the most frugal plan.
CHAIN_STEPS = 40
#: The chain stops after this many steps without lowering the peak.
CHAIN_PATIENCE = 8
#: Profiles with at most this many storages also get a Pareto local search.
REFINE_MAX_STORAGES = 48
#: Profiles with at most this many storages also try changing two storages at once.
REFINE_PAIRS_MAX_STORAGES = 12
#: ... and three at once from the most frugal plan.
REFINE_TRIPLES_MAX_STORAGES = 10
#: Most simulations the local search may spend.
REFINE_MAX_SIMULATIONS = 20_000
#: The chain reuses a region's drop options while the region is unchanged (NOTE [drop
#: cache]); False prices every region at every step, with the same plans.
_DROP_CACHE = True
#: Results the drop cache keeps per region (the chain's peak often alternates between
#: two times, and with it which storages are resident).
_DROP_CACHE_WAYS = 2
_INFEASIBLE_MODES = ("warn", "error")


class InfeasibleBudgetError(ValueError):
    """No plan keeps the predicted activation peak within the budget."""

    def __init__(self, budget_bytes: int, min_feasible_bytes: int) -> None:
        super().__init__(
            f"activation budget {format_bytes(budget_bytes)} ({budget_bytes} bytes) cannot be met; "
            f"the smallest feasible budget is {format_bytes(min_feasible_bytes)} "
            f"({min_feasible_bytes} bytes). Raise the budget, or pass infeasible='warn' to get "
            "the most memory-frugal plan"
        )
        self.budget_bytes = budget_bytes
        self.min_feasible_bytes = min_feasible_bytes


# ------------------------------------------------------------------------------ kernels


@njit
def _standalone_replay(
    st_ptr, legal, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx,
    rd_ptr, rd_idx, noops, dataflow, fwd_dur, mark, stack, op_host, op_view
):  # type: ignore[no-untyped-def]
    """Replay seconds of dropping each storage alone (everything else KEEP); inf if it cannot be dropped."""
    n = legal.shape[0]
    out = np.full(n, np.inf)
    place = np.zeros(n, dtype=np.int8)
    for u in range(st_ptr.shape[0] - 1):
        for s in range(st_ptr[u], st_ptr[u + 1]):
            if (legal[s] & 4) == 0:
                continue
            place[s] = 2
            out[s] = replay_unit(
                u, place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink,
                out_ptr, out_idx, rd_ptr, rd_idx, noops, dataflow, fwd_dur, mark, stack, op_host,
                op_view
            )
            place[s] = 0
    return out


@njit
def _close(
    stack, top, val, tag, place, op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx,
    vis, ran
):  # type: ignore[no-untyped-def]
    """Demand-driven replay closure from the ``top`` ops on ``stack`` (each already marked
    ``vis = tag``) under ``place``: every op reached gets ``vis = tag``, those that run
    (not served; a sink never is) also ``ran = val``. Returns the seconds of those."""
    cost = 0.0
    while top > 0:
        top -= 1
        j = stack[top]
        if served_now(j, place, op_serv, op_sink, out_ptr, out_idx):
            continue
        ran[j] = val
        cost += op_sec[j]
        for q in range(rd_ptr[j], rd_ptr[j + 1]):
            r = rd_idx[q]
            if vis[r] != tag:
                vis[r] = tag
                stack[top] = r
                top += 1
    return cost


@njit
def _mark_replay(
    u, tag, place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr,
    out_idx, rd_ptr, rd_idx, vis, ran, stack
):  # type: ignore[no-untyped-def]
    """Mark the ops the replay of dataflow unit ``u`` reaches under ``place`` (``vis =
    tag``) and those it runs (``ran = tag``)."""
    j0 = op_ptr[u]
    n_ops = op_ptr[u + 1] - j0
    k = 0
    top = np.int64(0)  # not an int literal: one compiled _close for all calls
    for s in range(st_ptr[u], st_ptr[u + 1]):
        if place[s] == 2:
            k = max(k, min(last_save[s], n_ops))
            p = st_prod[s]
            if p >= 0 and vis[p] != tag:
                vis[p] = tag
                stack[top] = p
                top += 1
    for j in range(j0, j0 + k):
        if op_sink[j] and vis[j] != tag:
            vis[j] = tag
            stack[top] = j
            top += 1
    _close(
        stack, top, tag, tag, place, op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx,
        vis, ran
    )


@njit
def _walk(
    p, kp, wtag, new, odrop, op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, join,
    stamp, sstamp, stack
):  # type: ignore[no-untyped-def]
    """Seconds that start running in a dataflow replay with prefix end ``kp`` when
    producer ``p`` must run: ``p`` and what it reads, transitively, that neither runs
    already (``join <= kp``) nor is served under ``new`` with the storages marked
    ``odrop = wtag`` dropped. Ops counted get ``stamp = wtag`` (counted once per tag)."""
    if join[p] <= kp or stamp[p] == wtag:
        return 0.0
    stamp[p] = wtag
    stack[0] = p
    top = 1
    cost = 0.0
    while top > 0:
        top -= 1
        j = stack[top]
        cost += op_sec[j]
        for q in range(rd_ptr[j], rd_ptr[j + 1]):
            r = rd_idx[q]
            if join[r] <= kp or stamp[r] == wtag or sstamp[r] == wtag:
                continue
            if op_serv[r] and not op_sink[r]:
                served = True
                for q2 in range(out_ptr[r], out_ptr[r + 1]):
                    o = out_idx[q2]
                    if new[o] != 0 or odrop[o] == wtag:
                        served = False
                        break
                if served:
                    sstamp[r] = wtag
                    continue
            stamp[r] = wtag
            stack[top] = r
            top += 1
    return cost


@njit
def _seg_apply(t, add, node, v):  # type: ignore[no-untyped-def]
    t[node] += v
    add[node] += v


@njit
def _seg_pull(t, add, node):  # type: ignore[no-untyped-def]
    node >>= 1
    while node >= 1:
        t[node] = max(t[2 * node], t[2 * node + 1]) + add[node]
        node >>= 1


@njit
def _seg_range_add(t, add, size, lo, hi, v):  # type: ignore[no-untyped-def]
    """Add ``v`` to leaves ``lo..hi`` (inclusive)."""
    a = lo + size
    b = hi + size + 1
    a0 = a
    b0 = b - 1
    while a < b:
        if a & 1:
            _seg_apply(t, add, a, v)
            a += 1
        if b & 1:
            b -= 1
            _seg_apply(t, add, b, v)
        a >>= 1
        b >>= 1
    _seg_pull(t, add, a0)
    _seg_pull(t, add, b0)


@njit
def _seg_set(t, add, size, i, value):  # type: ignore[no-untyped-def]
    node = i + size
    acc = 0.0
    p = node >> 1
    while p >= 1:
        acc += add[p]
        p >>= 1
    t[node] = value - acc
    add[node] = 0.0
    _seg_pull(t, add, node)


@njit
def _hidden_set(
    cand, nbytes, save_time, unit_of, save_rank, t0, d2h_bps, h2d_bps, bwd_dur, prefetch, host_limit
):  # type: ignore[no-untyped-def]
    """Greedy hidden offload set, in the order of ``cand``.

    NOTE [hidden offload]: a candidate is accepted when, together with all accepted
    ones, (a) the D2H FIFO (save order) lands every copy by the end of forward ``t0``:
    for each accepted ``i``, ``save_i + sum(copy seconds of accepted j saved at or after
    i) <= t0``, kept as a max-segment-tree over save ranks; and (b) the H2D FIFO lands
    each unit's reloads before that unit's backward is reached, with backward taken
    without replay or stall (the tightest case), propagated unit by unit until the
    added delay is absorbed by idle time.
    Returns (accepted storages in acceptance order, landing time of each accepted copy).
    """
    n = nbytes.shape[0]
    n_u = bwd_dur.shape[0]
    top = n_u - 1
    neg = -1e300
    size = 1
    while size < max(n, 1):
        size *= 2
    t = np.full(2 * size, neg)
    add = np.zeros(2 * size)
    fen = np.zeros(n + 1)
    total = 0.0
    tol = 1e-9 * max(t0, 1e-300)
    reach0 = np.empty(n_u)
    reach0[top] = t0
    for v in range(top - 1, -1, -1):
        reach0[v] = reach0[v + 1] + bwd_dur[v + 1]
    issue = np.empty(n_u)
    for x in range(n_u):
        # prefetched when the offloading region `prefetch` regions later is reached; the
        # first group backward meets is reloaded when reached (NOTE [Offload groups])
        issue[x] = reach0[x + 2 * prefetch] if x + 2 * prefetch <= top else reach0[x]
    load = np.zeros(n_u)
    comp = issue.copy()
    tmp = np.empty(n_u)
    accepted = np.empty(cand.shape[0], dtype=np.int64)
    n_acc = 0
    used = 0
    for ci in range(cand.shape[0]):
        s = cand[ci]
        b = nbytes[s]
        if host_limit > 0 and used + b > host_limit:
            continue
        # (b) H2D
        k = unit_of[s]
        p_h = b / h2d_bps
        prev = comp[k + 1] if k < top else -np.inf
        ok = True
        last = k
        for x in range(k, -1, -1):
            lx = load[x] + (p_h if x == k else 0.0)
            nc = max(issue[x], prev) + lx
            if x < k and nc <= comp[x]:
                break
            if lx > 0 and nc > reach0[x] + tol:
                ok = False
                break
            tmp[x] = nc
            prev = nc
            last = x
        if not ok:
            continue
        # (a) D2H
        r = save_rank[s]
        p_d = b / d2h_bps
        _seg_range_add(t, add, size, 0, r, p_d)
        i = r + 1
        while i <= n:
            fen[i] += p_d
            i += i & (-i)
        total += p_d
        before = 0.0
        i = r
        while i > 0:
            before += fen[i]
            i -= i & (-i)
        _seg_set(t, add, size, r, save_time[s] + (total - before) - t0)
        if t[1] > tol:
            _seg_set(t, add, size, r, neg)
            _seg_range_add(t, add, size, 0, r, -p_d)
            i = r + 1
            while i <= n:
                fen[i] -= p_d
                i += i & (-i)
            total -= p_d
            continue
        load[k] += p_h
        for x in range(k, last - 1, -1):
            comp[x] = tmp[x]
        accepted[n_acc] = s
        n_acc += 1
        used += b
    acc = accepted[:n_acc]
    land = np.full(n, np.inf)
    inset = np.zeros(n, dtype=np.bool_)
    for i in range(n_acc):
        inset[acc[i]] = True
    order = np.empty(n, dtype=np.int64)
    for s in range(n):
        order[save_rank[s]] = s
    free = 0.0
    for i in range(n):
        s = order[i]
        if inset[s]:
            free = max(free, save_time[s]) + nbytes[s] / d2h_bps
            land[s] = free
    return acc, land


@njit_inline
def _issue_at(x, riss, reach, prefetch, top):  # type: ignore[no-untyped-def]
    """When unit ``x``'s group reload is issued: as simulated where ``x`` offloads, else
    when the region ``prefetch`` regions later is reached, or ``x`` itself when none is
    (NOTE [Offload groups] in scheduler.simulate)."""
    if riss[x] >= 0.0:
        return riss[x]
    return reach[x + 2 * prefetch] if x + 2 * prefetch <= top else reach[x]


@njit
def _region_drops(
    todo, need, want_side, new, codes, way, st_ptr, nbytes, last_save, st_prod, op_ptr, op_sec,
    op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, noops, df_price, fwd_dur, prod_ptr,
    prod_ops, ctr, join, vis, stamp, sstamp, odrop, stack, op_host, dc_items, dc_eff, dc_f,
    dc_i, side_f, side_i, op_view
):  # type: ignore[no-untyped-def]
    """Drop options of the regions ``todo`` (backward units) under ``new``, each knowing
    the replay prefix its current drops share; one call for all of them (a kernel call
    per region costs more than the pricing of a small one).

    Per region ``u``, into the drop cache's way ``w = way[u]`` (NOTE [drop cache]):
    the storages that may be dropped (``codes[s] >= 3``) to ``dc_items[w, st_ptr[u]:]``,
    fewest added replay seconds per byte first, and each one's prefix end to
    ``dc_eff[w]``. An option drops the first ``n`` of them whose prefix end is at most
    ``K``; the cheapest per byte (the most bytes among equals) goes to ``dc_f[w, u]``
    (seconds per byte, bytes) and ``dc_i[w, u, :3]`` (item count, ``K``, ``n``). With
    ``want_side``, an option freeing at least ``need`` bytes for fewer seconds (more bytes
    among equals) than ``side_f`` (seconds, bytes) replaces it there and in ``side_i``
    (region, ``K``, ``n``). A region's results read only its storages and ops, so equal
    inputs give equal results. The scratch is ``_chain_step``'s.
    """
    base = np.empty(stack.shape[0] + 1)
    plain = np.empty(stack.shape[0] + 1)
    for t in range(todo.shape[0]):
        u = todo[t]
        w = way[u]
        items = dc_items[w]
        eff = dc_eff[w]
        j0 = op_ptr[u]
        n_ops = op_ptr[u + 1] - j0
        k_cur = 0
        any_drop = False
        for s in range(st_ptr[u], st_ptr[u + 1]):
            if new[s] == 2:
                any_drop = True
                k_cur = max(k_cur, min(last_save[s], n_ops))
        # NOTE [replay base]: base[K] is the cost of the ops that run in replay with prefix
        # end K under the current plan, join[j] the smallest K at which op j runs (n_ops + 1:
        # not at all). Prefix rule: the ops that are not served, from their own index on.
        # Dataflow rule: the closure of the dropped storages' producers (counted from K = 0;
        # only K >= the current prefix end is ever asked) and of each sink from just past
        # it; a view from just past it too, and the closure never enters it.
        base[0] = 0.0
        # plain[K]: a replay without the dispatch mode runs every op before K
        plain[0] = 0.0
        for jj in range(n_ops):
            plain[jj + 1] = plain[jj] + op_sec[j0 + jj]
        dfu = df_price[u] and not noops[u]
        never = n_ops + 1
        for jj in range(n_ops):
            join[j0 + jj] = never
        if dfu:
            ctr[0] += 1
            tag = ctr[0]
            for jj in range(n_ops):
                if op_view[j0 + jj]:
                    vis[j0 + jj] = tag
            n_top = np.int64(0)  # not an int literal: one compiled _close for all calls
            for s in range(st_ptr[u], st_ptr[u + 1]):
                if new[s] == 2:
                    p = st_prod[s]
                    if p >= 0 and vis[p] != tag:
                        vis[p] = tag
                        stack[n_top] = p
                        n_top += 1
            base[0] = _close(
                stack, n_top, np.int64(0), tag, new, op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr,
                rd_idx, vis, join
            )
            for jj in range(n_ops):
                j = j0 + jj
                base[jj + 1] = base[jj]
                if op_view[j]:
                    join[j] = jj + 1
                    base[jj + 1] += op_sec[j]
                elif op_sink[j] and vis[j] != tag:
                    vis[j] = tag
                    stack[0] = j
                    base[jj + 1] += _close(
                        stack, np.int64(1), np.int64(jj + 1), tag, new, op_sec, op_serv, op_sink, out_ptr, out_idx,
                        rd_ptr, rd_idx, vis, join
                    )
        else:
            for jj in range(n_ops):
                j = j0 + jj
                unserved = not op_serv[j]
                if not unserved:
                    for q in range(out_ptr[j], out_ptr[j + 1]):
                        if new[out_idx[q]] != 0:
                            unserved = True
                            break
                if unserved:
                    join[j] = 0
                base[jj + 1] = base[jj] + (op_sec[j] if unserved else 0.0)
        start = st_ptr[u]
        addc = np.empty(st_ptr[u + 1] - start)
        m = 0
        for s in range(st_ptr[u], st_ptr[u + 1]):
            if codes[s] < 3:
                continue
            e = max(k_cur, min(last_save[s], n_ops))
            c = 0.0
            if dfu:
                ctr[0] += 1
                odrop[s] = ctr[0]
                c = _walk(
                    st_prod[s], e, ctr[0], new, odrop, op_sec, op_serv, op_sink, out_ptr, out_idx,
                    rd_ptr, rd_idx, join, stamp, sstamp, stack
                )
            elif not noops[u]:
                for q in range(prod_ptr[s], prod_ptr[s + 1]):
                    j = prod_ops[q]
                    if join[j] > e:
                        c += op_sec[j]  # served now: dropping s makes it run
            items[start + m] = s
            eff[s] = e
            addc[m] = c
            m += 1
        dc_i[w, u, 0] = m
        if m == 0:
            continue
        dens = np.empty(m)
        for i in range(m):
            dens[i] = addc[i] / nbytes[items[start + i]]
        order = argsort(dens)
        tmp = items[start : start + m].copy()
        for i in range(m):
            items[start + i] = tmp[order[i]]
        cur = 0.0
        if any_drop:
            cur = fwd_dur[u] if noops[u] else min(plain[k_cur], base[k_cur] + k_cur * op_host)
        best_r = np.inf
        best_b = 0.0
        best_kp = 0
        best_n = 0
        for i in range(m):
            kp = eff[items[start + i]]
            seen = False
            for i2 in range(i):
                if eff[items[start + i2]] == kp:
                    seen = True
                    break
            if seen:
                continue
            run = 0.0 if noops[u] else base[kp]  # what the dispatch mode runs
            cost = 0.0
            got = 0.0
            cnt = 0
            ctr[0] += 1
            wt = ctr[0]
            for i2 in range(m):
                s = items[start + i2]
                if eff[s] > kp:
                    continue
                if dfu:
                    odrop[s] = wt
                    run += _walk(
                        st_prod[s], kp, wt, new, odrop, op_sec, op_serv, op_sink, out_ptr,
                        out_idx, rd_ptr, rd_idx, join, stamp, sstamp, stack
                    )
                elif not noops[u]:
                    for q in range(prod_ptr[s], prod_ptr[s + 1]):
                        j = prod_ops[q]
                        if stamp[j] != wt and join[j] > kp:
                            stamp[j] = wt
                            run += op_sec[j]
                if noops[u]:
                    cost = fwd_dur[u] - cur
                else:
                    cost = min(plain[kp], run + kp * op_host) - cur
                got += nbytes[s]
                cnt += 1
                ratio = cost / got
                if ratio < best_r or (ratio == best_r and got > best_b):
                    best_r = ratio
                    best_b = got
                    best_kp = kp
                    best_n = cnt
                if (
                    want_side
                    and got >= need
                    and (cost < side_f[0] or (cost == side_f[0] and got > side_f[1]))
                ):
                    side_f[0] = cost
                    side_f[1] = got
                    side_i[0] = u
                    side_i[1] = kp
                    side_i[2] = cnt
        dc_f[w, u, 0] = best_r
        dc_f[w, u, 1] = best_b
        dc_i[w, u, 1] = best_kp
        dc_i[w, u, 2] = best_n


@njit
def _chain_step(
    place, new, side, tstar, delta, prefetch, h_order, h_land, legal, save_order, st_ptr,
    unit_of, nbytes, save_time, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr,
    out_idx, rd_ptr, rd_idx, noops, df_price, fwd_dur, d2h_bps, h2d_bps, d2h_end, h2d_end,
    reach, cstart, riss, fend, prod_ptr, prod_ops, ctr, join, vis, ran, nvis, nran, stamp, sstamp, odrop,
    stack, op_host, dc_code, dc_items, dc_eff, dc_f, dc_i, op_view
):  # type: ignore[no-untyped-def]
    """One step of the chain: free about ``delta`` bytes resident at time ``tstar``.

    Writes the next chain plan into ``new`` and a side plan into ``side``.
    Returns (bytes freed at tstar by ``new``, whether ``side`` differs from ``new``).

    ``df_price[u]``: price unit ``u``'s drops with the dataflow rule (a dataflow unit
    whose droppable storages all have a producer). ``ctr`` (a one-element counter) and
    the per-op arrays ``join``, ``vis``, ``ran``, ``nvis``, ``nran``, ``stamp``,
    ``sstamp``, the per-storage ``odrop`` and ``stack`` (the largest unit's op count)
    are scratch kept between calls; marks are tags drawn from ``ctr``, never reset.
    ``op_host``: seconds the replay dispatch mode adds per op it sees; a region's replay
    costs the cheaper of that and the plain prefix (``replay_unit``).
    ``dc_*``: the drop cache, kept between the calls of one chain (NOTE [drop cache]),
    first index the way: per storage its code when the way was priced (``dc_code``, -1:
    never), and ``_region_drops``' items and prefix ends (``dc_items``, ``dc_eff``); per
    region its option, seconds per byte and bytes (``dc_f``), and item count, ``K``,
    ``n`` and the ``ctr`` tag of the way's last use (``dc_i``).
    """
    n_u = fwd_dur.shape[0]
    n_st = place.shape[0]
    top = n_u - 1
    for s in range(n_st):
        new[s] = place[s]
    freed = 0
    # NOTE [offload vs replay]: in a dataflow unit, offloading a storage makes its
    # producer unservable; if the current replay reaches that producer (a running op
    # reads it), the producer starts to run. u_tag[x] is the tag of unit x's replay marks
    # (nvis: reached, nran: runs) under ``place``, computed on first use.
    u_tag = np.zeros(n_u, dtype=np.int64)
    # 1. hidden offloads that are off the device at tstar (free)
    for i in range(h_order.shape[0]):
        if freed >= delta:
            break
        s = h_order[i]
        if place[s] != 0 or save_time[s] > tstar or (legal[s] & 2) == 0:
            continue
        x = unit_of[s]
        iss = _issue_at(x, riss, reach, prefetch, top)
        if h_land[s] <= tstar < iss:
            if df_price[x] and st_prod[s] >= 0:
                if u_tag[x] == 0:
                    ctr[0] += 1
                    u_tag[x] = ctr[0]
                    _mark_replay(
                        x, u_tag[x], place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv,
                        op_sink, out_ptr, out_idx, rd_ptr, rd_idx, nvis, nran, stack
                    )
                p = st_prod[s]
                if nvis[p] == u_tag[x] and nran[p] != u_tag[x]:
                    continue  # not free: replay would run its producer
            new[s] = 1
            freed += nbytes[s]
    for s in range(n_st):
        side[s] = new[s]
    if freed >= delta:
        return freed, False
    need = delta - freed
    # options: region drops (kind 0, ref = unit) and offloads that may stall (kind 1, ref = storage)
    opt_ratio = np.empty(n_u + n_st)
    opt_bytes = np.empty(n_u + n_st)
    opt_room = np.zeros(n_u + n_st)  # offloads: D2H seconds of room before tstar
    opt_kind = np.empty(n_u + n_st, dtype=np.int64)
    opt_ref = np.empty(n_u + n_st, dtype=np.int64)
    opt_k = np.zeros(n_u + n_st, dtype=np.int64)
    opt_cnt = np.zeros(n_u + n_st, dtype=np.int64)
    n_opt = 0
    off_cost = np.inf  # the cheapest offload freeing need bytes (most bytes among equals)
    off_bytes = 0.0
    off_ref = -1
    # 2. drops, per region the best option per prefix end K, knowing the shared prefix.
    # NOTE [drop cache]: a step changes few regions. A region's options depend only on
    # its storages' codes: new[s], plus 3 when dropping s frees its bytes at tstar
    # (droppable, not dropped, and resident: saved by then; a copy offloaded under
    # ``place`` until its D2H copy lands and again from its reload's issue time ``iss``;
    # one offloaded in step 1 is off already). The cache keeps the codes and results of
    # a region's last pricings (its ways); a region whose codes all equal a way's reuses
    # that result, which pricing again would repeat bit for bit (same inputs, same order).
    side_f = np.array([np.inf, 0.0])  # the side plan's drop option (_region_drops)
    side_i = np.array([-1, 0, 0])
    codes = np.empty(n_st, dtype=np.int8)
    way = np.zeros(n_u, dtype=np.int64)  # the cache way of region u's option
    listed = np.empty(n_u, dtype=np.int64)  # regions with a storage to drop, in order
    n_listed = 0
    todo = np.empty(n_u, dtype=np.int64)  # those to price
    n_todo = 0
    ctr[0] += 1
    now = ctr[0]
    for u in range(n_u):
        if u % 2 == 0 or tstar >= cstart[u]:
            continue
        iss = _issue_at(u, riss, reach, prefetch, top)
        candidates = False
        for s in range(st_ptr[u], st_ptr[u + 1]):
            item = False
            if (legal[s] & 4) == 0 or nbytes[s] == 0 or new[s] == 2:
                item = False
            elif new[s] == 0:
                item = save_time[s] <= tstar
            elif place[s] == 1:
                lands = d2h_end[s]
                if lands >= iss:
                    item = save_time[s] <= tstar
                else:
                    item = (save_time[s] <= tstar and tstar < lands) or iss <= tstar
            if new[s] != 2 and (legal[s] & 4) != 0 and nbytes[s] > 0 and save_time[s] <= tstar:
                candidates = True
            codes[s] = new[s] + 3 if item else new[s]
        if not candidates:
            continue
        w = -1
        for k in range(dc_code.shape[0]):
            hit = True
            for s in range(st_ptr[u], st_ptr[u + 1]):
                if codes[s] != dc_code[k, s]:
                    hit = False
                    break
            if hit:
                w = k
                break
        if w < 0:  # price it into the least recently used way
            w = 0
            for k in range(1, dc_code.shape[0]):
                if dc_i[k, u, 3] < dc_i[w, u, 3]:
                    w = k
            for s in range(st_ptr[u], st_ptr[u + 1]):
                dc_code[w, s] = codes[s]
            todo[n_todo] = u
            n_todo += 1
        dc_i[w, u, 3] = now
        way[u] = w
        listed[n_listed] = u
        n_listed += 1
    _region_drops(
        todo[:n_todo], need, False, new, codes, way, st_ptr, nbytes, last_save, st_prod, op_ptr,
        op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, noops, df_price, fwd_dur,
        prod_ptr, prod_ops, ctr, join, vis, stamp, sstamp, odrop, stack, op_host, dc_items,
        dc_eff, dc_f, dc_i, side_f, side_i, op_view
    )
    for i in range(n_listed):
        u = listed[i]
        w = way[u]
        if dc_i[w, u, 0] == 0:
            continue
        opt_ratio[n_opt] = dc_f[w, u, 0]
        opt_bytes[n_opt] = dc_f[w, u, 1]
        opt_kind[n_opt] = 0
        opt_ref[n_opt] = u
        opt_k[n_opt] = dc_i[w, u, 1]
        opt_cnt[n_opt] = dc_i[w, u, 2]
        n_opt += 1
    n_drop_opt = n_opt
    # 3. offloads that are not hidden: stall estimated from the unit's reload queue
    if d2h_bps > 0 and h2d_bps > 0:
        ready = np.zeros(n_u)
        for s in range(n_st):
            if place[s] == 1 and h2d_end[s] > ready[unit_of[s]]:
                ready[unit_of[s]] = h2d_end[s]
        # NOTE [D2H room]: a new copy joins the D2H FIFO in save order and delays the
        # copies saved after it; lim[i] is the latest the copy inserted at save position
        # i may land without pushing any copy that lands by tstar past tstar.
        lim = np.empty(n_st)
        nxt = np.inf
        for i in range(n_st - 1, -1, -1):
            s = save_order[i]
            lim[i] = nxt
            if place[s] == 1:
                cap = tstar if d2h_end[s] <= tstar else np.inf
                nxt = min(cap, nxt) - nbytes[s] / d2h_bps
        busy = 0.0
        for i in range(n_st):
            s = save_order[i]
            if place[s] == 1:
                busy = max(busy, d2h_end[s])
                continue
            if new[s] != 0 or (legal[s] & 2) == 0 or nbytes[s] == 0 or save_time[s] > tstar:
                continue
            x = unit_of[s]
            if tstar >= cstart[x]:
                continue
            iss = _issue_at(x, riss, reach, prefetch, top)
            lands = max(fend[x], busy) + nbytes[s] / d2h_bps
            room = min(tstar, lim[i]) - lands
            if room < 0 or tstar >= iss:
                continue
            late = max(ready[x], iss) + nbytes[s] / h2d_bps
            cost = max(0.0, late - reach[x]) - max(0.0, ready[x] - reach[x])
            if df_price[x] and st_prod[s] >= 0:  # NOTE [offload vs replay]
                if u_tag[x] == 0:
                    ctr[0] += 1
                    u_tag[x] = ctr[0]
                    _mark_replay(
                        x, u_tag[x], place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv,
                        op_sink, out_ptr, out_idx, rd_ptr, rd_idx, nvis, nran, stack
                    )
                p = st_prod[s]
                if nvis[p] == u_tag[x] and nran[p] != u_tag[x]:
                    cost += op_sec[p]
            opt_ratio[n_opt] = cost / nbytes[s]
            opt_bytes[n_opt] = nbytes[s]
            opt_room[n_opt] = room
            opt_kind[n_opt] = 1
            opt_ref[n_opt] = s
            n_opt += 1
            if nbytes[s] >= need and (
                cost < off_cost or (cost == off_cost and nbytes[s] > off_bytes)
            ):
                off_cost = cost
                off_bytes = nbytes[s]
                off_ref = s
    # 4. apply options cheapest per byte first
    order_o = argsort(opt_ratio[:n_opt])
    first = -1
    n_applied = 0
    shift = 0.0  # D2H seconds of offloads applied in this step
    slack = np.inf  # least room left among them
    for oi in range(n_opt):
        o = order_o[oi]
        if freed >= delta:
            break
        if opt_kind[o] == 0:
            u = opt_ref[o]
            cnt = 0
            w = way[u]
            for i in range(st_ptr[u], st_ptr[u] + dc_i[w, u, 0]):
                s = dc_items[w, i]
                if dc_eff[w, s] <= opt_k[o] and cnt < opt_cnt[o]:
                    new[s] = 2
                    cnt += 1
        else:
            s = opt_ref[o]
            p_d = nbytes[s] / d2h_bps
            if new[s] != 0 or opt_room[o] < shift or p_d > slack:
                continue
            new[s] = 1
            slack = min(slack - p_d, opt_room[o] - shift)
            shift += p_d
        freed += int(opt_bytes[o])
        if first < 0:
            first = o
        n_applied += 1
    if freed <= delta + delta // 2:  # a side plan is only worth it when the step overshoots
        return freed, False
    # the side plan: the single option freeing need bytes for the fewest seconds (most
    # bytes among equals; the first in step 2's order, drops before offloads). ``side``
    # still holds the plan step 2 priced.
    _region_drops(
        opt_ref[:n_drop_opt], need, True, side, codes, way, st_ptr, nbytes, last_save, st_prod,
        op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, noops, df_price,
        fwd_dur, prod_ptr, prod_ops, ctr, join, vis, stamp, sstamp, odrop, stack, op_host,
        dc_items, dc_eff, dc_f, dc_i, side_f, side_i, op_view
    )
    side_kind = 0 if side_i[0] >= 0 else -1
    side_ref = side_i[0]
    if off_ref >= 0 and (off_cost < side_f[0] or (off_cost == side_f[0] and off_bytes > side_f[1])):
        side_kind = 1
        side_ref = off_ref
    if side_kind < 0:
        return freed, False
    same = (
        n_applied == 1
        and opt_kind[first] == side_kind
        and opt_ref[first] == side_ref
        and (side_kind == 1 or (opt_k[first] == side_i[1] and opt_cnt[first] == side_i[2]))
    )
    if same:
        return freed, False
    if side_kind == 0:
        cnt = 0
        w = way[side_ref]
        for i in range(st_ptr[side_ref], st_ptr[side_ref] + dc_i[w, side_ref, 0]):
            s = dc_items[w, i]
            if dc_eff[w, s] <= side_i[1] and cnt < side_i[2]:
                side[s] = 2
                cnt += 1
    else:
        side[side_ref] = 1
    return freed, True


# ----------------------------------------------------------------------------- family


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


def _build_family(
    flat: FlatProfile, ws: Workspace, legal: np.ndarray, prefetch: int, keep_res: SimResult
) -> _Family:
    """The family (module docstring, steps 1-4); ``ws`` holds the all-KEEP simulation.

    NOTE [chain workspaces]: the chain step reads the simulation of the chain's current
    plan. ``cur_ws`` keeps that one while new members are simulated in the family's own
    workspace, and an accepted step swaps the two: a rejected step leaves the chain's
    state in place, so only the drops-only restart from an earlier plan simulates again.
    """
    cur_ws = ws
    fam = _Family(flat, Workspace(flat), legal, prefetch)
    n = flat.n_storages
    keep = np.zeros(n, dtype=np.int8)
    fam.places.append(keep.copy())
    fam.results.append(keep_res)
    can_drop = (legal & RECOMPUTE_BIT) != 0
    can_off = (legal & OFFLOAD_BIT) != 0
    frugal = np.where(can_drop, 2, 0).astype(np.int8)
    floor = fam.add(frugal).peak
    if bool(np.any(can_off & ~can_drop)):
        frugal_off = np.where(can_drop, 2, np.where(can_off, 1, 0)).astype(np.int8)
        floor = min(floor, fam.add(frugal_off).peak)
    prod_ptr, prod_ops = _producers(flat)
    # dataflow pricing where every droppable storage has a producer (else prefix pricing)
    df_price = flat.dataflow.copy()
    df_price[flat.unit_of[can_drop & (flat.st_prod < 0)]] = False
    h_order = np.zeros(0, dtype=np.int64)
    h_land = np.full(n, np.inf)
    if bool(np.any(can_off)):
        rho = _standalone_replay(
            flat.st_ptr, legal, flat.last_save, flat.st_prod, flat.op_ptr, flat.op_sec,
            flat.op_serv, flat.op_sink, flat.out_ptr, flat.out_idx, flat.rd_ptr, flat.rd_idx,
            flat.noops, flat.dataflow, flat.fwd_dur, ws.mark, ws.stack, flat.op_host,
            flat.op_view
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            density = np.where(flat.nbytes > 0, rho / np.maximum(flat.nbytes, 1), 0.0)
        cand = np.flatnonzero(can_off & (flat.nbytes > 0))
        # most expensive to recompute per byte first, earlier saves first among equals
        rank = np.empty(n, dtype=np.int64)
        rank[flat.save_order] = np.arange(n)
        cand = cand[np.lexsort((rank[cand], -density[cand]))].astype(np.int64)
        # a copy starts no earlier than its group's exit (NOTE [Offload groups])
        exits = (flat.fwd_start + flat.forward_span)[flat.unit_of]
        h_order, h_land = _hidden_set(
            cand, flat.nbytes, exits, flat.unit_of, rank, flat.t0,
            flat.d2h_bps, flat.h2d_bps, flat.bwd_dur, prefetch, flat.host_limit_bytes
        )
    span = keep_res.peak - floor if floor < keep_res.peak else keep_res.peak
    delta = max(1, span // CHAIN_STEPS)
    cur = keep
    res = keep_res
    new = np.empty(n, dtype=np.int8)
    side = np.empty(n, dtype=np.int8)
    # scratch of the chain step (tags from ctr, see _chain_step)
    n_ops = flat.op_sec.shape[0]
    ctr = np.zeros(1, dtype=np.int64)
    join, vis, ran, nvis, nran, stamp, sstamp = (np.zeros(n_ops, dtype=np.int64) for _ in range(7))
    odrop = np.zeros(n, dtype=np.int64)
    stack = np.zeros(max(flat.max_unit_ops, 1), dtype=np.int64)
    # the drop cache (NOTE [drop cache])
    ways = _DROP_CACHE_WAYS
    dc_code = np.full((ways, n), -1, dtype=np.int8)
    dc_items = np.zeros((ways, n), dtype=np.int64)
    dc_eff = np.zeros((ways, n), dtype=np.int64)
    dc_f = np.zeros((ways, flat.fwd_dur.shape[0], 2))
    dc_i = np.zeros((ways, flat.fwd_dur.shape[0], 4), dtype=np.int64)
    # NOTE [chain bans]: a step that frees bytes at the peak can create an equal or
    # higher peak elsewhere (a dropped storage returns when its region's backward
    # starts). Such a step is kept as a family member, its moves are banned and the
    # step is retried from the previous plan; bans are lifted after the next progress.
    banned = np.zeros(n, dtype=np.int64)
    stale = 0  # steps since the peak last went down
    # NOTE [drops-only leg]: offloads can leave the chain see-sawing between a forward
    # peak (copies in flight) and a backward peak (reloads); when it stops making
    # progress it restarts from its lowest-peak plan with drops as the only new moves,
    # which carries the family down to the frugal end.
    drops_only = False
    mask = legal
    allowed = mask  # mask & ~banned, rebuilt only when a move is banned
    best_place, best_res = cur, res
    for _ in range(3 * CHAIN_STEPS + 16):
        freed = 0
        if stale < CHAIN_PATIENCE:
            if not _DROP_CACHE:
                dc_code[:] = -1
            freed, has_side = _chain_step(
                cur, new, side, res.peak_time, delta, prefetch, h_order, h_land,
                allowed, flat.save_order, flat.st_ptr, flat.unit_of, flat.nbytes,
                flat.save_time, flat.last_save, flat.st_prod, flat.op_ptr, flat.op_sec,
                flat.op_serv, flat.op_sink, flat.out_ptr, flat.out_idx, flat.rd_ptr,
                flat.rd_idx, flat.noops, df_price, flat.fwd_dur, flat.d2h_bps, flat.h2d_bps,
                cur_ws.d2h_end, cur_ws.h2d_end, cur_ws.reach, cur_ws.cstart, cur_ws.riss,
                cur_ws.fend, prod_ptr, prod_ops,
                ctr, join, vis, ran, nvis, nran, stamp, sstamp, odrop, stack, flat.op_host,
                dc_code, dc_items, dc_eff, dc_f, dc_i, flat.op_view
            )
        if freed <= 0:
            if drops_only:
                break
            drops_only = True
            mask = allowed = legal & ~OFFLOAD_BIT
            h_order = h_order[:0]
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
    if n <= REFINE_MAX_STORAGES:
        fam.refine()
    return fam


# ------------------------------------------------------------------------------- public


def _check_budget(budget_bytes: object) -> int | None:
    if budget_bytes is None:
        return None
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)):
        raise TypeError(
            f"budget_bytes must be an int (bytes) or None, got {type(budget_bytes).__name__}; "
            "parse unit strings such as '20GiB' with scheduler.parse_bytes"
        )
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes = {budget_bytes} is invalid; accepted: an int >= 0 or None")
    return int(budget_bytes)


def _check_overhead(max_overhead: object) -> float | None:
    if max_overhead is None:
        return None
    if isinstance(max_overhead, bool) or not isinstance(max_overhead, (int, float)):
        raise TypeError(f"max_overhead must be a number or None, got {type(max_overhead).__name__}")
    v = float(max_overhead)
    if not math.isfinite(v) or v < 0:
        raise ValueError(
            f"max_overhead = {max_overhead!r} is invalid; accepted: a number >= 0 (0.05 = 5%) or None"
        )
    return v


def _plan_id(flat: FlatProfile, place: np.ndarray) -> str:
    """Short stable id: a hash of each unit's name and its storages' placements."""
    data = place.astype(np.int8).tobytes()
    ptr = flat.st_ptr.tolist()
    parts: list[bytes] = []
    for name, lo, hi in zip(flat.unit_names, ptr, ptr[1:]):
        if hi > lo:
            parts += (name.encode(), data[lo:hi])
    return hashlib.sha1(b"".join(parts)).hexdigest()[:12]


_PLACEMENTS = tuple(Placement)


def _make_plan(
    flat: FlatProfile,
    place: np.ndarray,
    res: SimResult,
    *,
    budget: int | None,
    feasible: bool = True,
    min_feasible: int | None = None,
    notes: list[str] | None = None,
) -> Plan:
    lb_budget = budget if (budget is not None and feasible) else res.peak
    lb = lower_bound_flat(flat, lb_budget)
    return Plan(
        placements=dict(zip(flat.keys, map(_PLACEMENTS.__getitem__, place.tolist()))),
        budget_bytes=budget,
        predicted_step_seconds=res.step,
        predicted_peak_bytes=res.peak,
        predicted_forward_seconds=res.forward,
        predicted_recompute_seconds=res.recompute,
        predicted_stall_seconds=res.stall,
        lower_bound_seconds=lb,
        feasible=feasible,
        min_feasible_budget_bytes=min_feasible,
        plan_id=_plan_id(flat, place),
        notes=list(notes or []),
    )


def _within_host(results: list[SimResult], host_limit: int) -> np.ndarray:
    if host_limit <= 0:
        return np.ones(len(results), dtype=bool)
    return np.asarray([r.d2h_bytes <= host_limit for r in results], dtype=bool)


def _pick(
    times: np.ndarray,
    peaks: np.ndarray,
    mask: np.ndarray,
    primary: np.ndarray,
    secondary: np.ndarray,
) -> int:
    """Index among ``mask`` minimising (primary, secondary, index)."""
    idx = np.flatnonzero(mask)
    order = np.lexsort((idx, secondary[idx], primary[idx]))
    return int(idx[order[0]])


def solve(
    profile: Profile,
    *,
    budget_bytes: int | None,
    max_overhead: float | None = None,
    prefetch_regions: int = 2,
    allow_offload: bool = True,
    infeasible: str = "warn",
    log_infeasible: bool = True,
) -> Plan:
    """Placements that keep the predicted activation peak within ``budget_bytes`` at the
    least predicted step time.

    * ``log_infeasible``: log the ``infeasible="warn"`` case as a warning (the plan's
      ``notes`` say it either way; the runtime turns this off and warns once itself).

    * ``budget_bytes``: activation budget in bytes; ``None`` = no budget.
    * ``max_overhead``: accepted predicted step-time overhead over all-KEEP (0.05 = 5%).
      Without a budget the planner buys the smallest peak within that overhead; with a
      budget it only notes when meeting the budget costs more.
    * ``prefetch_regions``: how many regions ahead reloads are issued in backward.
    * ``allow_offload``: False restricts plans to KEEP and RECOMPUTE.
    * ``infeasible``: ``"warn"`` returns the most memory-frugal plan with
      ``feasible=False`` when the budget cannot be met; ``"error"`` raises
      ``InfeasibleBudgetError``.
    """
    budget = _check_budget(budget_bytes)
    overhead = _check_overhead(max_overhead)
    prefetch = check_prefetch(prefetch_regions)
    if infeasible not in _INFEASIBLE_MODES:
        raise ValueError(
            f"infeasible={infeasible!r} is invalid; accepted: " + ", ".join(_INFEASIBLE_MODES)
        )
    flat = flatten(profile)
    ws = Workspace(flat)
    legal = flat.legal.copy()
    if not allow_offload or not flat.has_link:
        legal &= ~OFFLOAD_BIT
    keep = np.zeros(flat.n_storages, dtype=np.int8)
    keep_res = ws.run(keep, prefetch)
    if budget is None and overhead is None:
        return _make_plan(flat, keep, keep_res, budget=None)
    if budget is not None and keep_res.peak <= budget:
        return _make_plan(flat, keep, keep_res, budget=budget)
    fam = _build_family(flat, ws, legal, prefetch, keep_res)
    times, peaks = fam.times, fam.peaks
    base = keep_res.step
    limit = base * (1.0 + overhead) * (1 + 1e-12) if overhead is not None else math.inf
    # pinned host memory: a plan may not offload more than the host limit
    host_ok = _within_host(fam.results, flat.host_limit_bytes)
    notes: list[str] = []
    if budget is None:
        i = _pick(times, peaks, host_ok & (times <= limit), peaks.astype(np.float64), times)
        res = fam.results[i]
        notes.append(
            f"no budget given: smallest predicted peak ({format_bytes(res.peak)}) within "
            f"max_overhead {overhead:.1%} (predicted overhead {_overhead(res.step, base)})"
        )
        return _make_plan(flat, fam.places[i], res, budget=None, notes=notes)
    fits = host_ok & (peaks <= budget)
    if not bool(np.any(fits)):
        i = _pick(times, peaks, host_ok, peaks.astype(np.float64), times)
        res = fam.results[i]
        if infeasible == "error":
            raise InfeasibleBudgetError(budget, res.peak)
        msg = (
            f"budget {format_bytes(budget)} cannot be met; the smallest feasible budget is "
            f"{format_bytes(res.peak)} ({res.peak} bytes); this is the most memory-frugal plan"
        )
        if log_infeasible:
            logger.warning("offrecomp planner: %s", msg)
        notes.append(msg)
        return _make_plan(
            flat,
            fam.places[i],
            res,
            budget=budget,
            feasible=False,
            min_feasible=res.peak,
            notes=notes,
        )
    i = _pick(times, peaks, fits, times, peaks.astype(np.float64))
    res = fam.results[i]
    if overhead is not None and res.step > limit:
        notes.append(
            f"meeting budget {format_bytes(budget)} costs a predicted overhead of "
            f"{_overhead(res.step, base)}, above max_overhead {overhead:.1%}; the plan meets the budget"
        )
    return _make_plan(flat, fam.places[i], res, budget=budget, notes=notes)


def _overhead(step: float, base: float) -> str:
    """``step`` over the all-KEEP ``base`` as a percentage (seconds when ``base`` is 0)."""
    return f"{step / base - 1:.1%}" if base > 0 else f"+{step:.3g} s"


def exhaustive_solve(
    profile: Profile,
    budget_bytes: int | None,
    *,
    prefetch_regions: int = 2,
    allow_offload: bool = True,
    max_plans: int = 200_000,
) -> Plan:
    """Best plan by trying every legal placement of every storage (tiny profiles only).

    Same contract as ``solve``'s ``infeasible='warn'``. Raises ValueError when there are
    more than ``max_plans`` combinations.
    """
    budget = _check_budget(budget_bytes)
    prefetch = check_prefetch(prefetch_regions)
    flat = flatten(profile)
    ws = Workspace(flat)
    legal = flat.legal.copy()
    if not allow_offload or not flat.has_link:
        legal &= ~OFFLOAD_BIT
    choices = [[p for p in (0, 1, 2) if legal[i] & (1 << p)] for i in range(flat.n_storages)]
    total = math.prod(len(c) for c in choices)
    if total > max_plans:
        raise ValueError(
            f"exhaustive search over {total} plans exceeds max_plans={max_plans}; use solve() "
            "or a smaller profile"
        )
    best: tuple[float, int] | None = None
    frugal: tuple[int, float] | None = None
    best_place = frugal_place = np.zeros(flat.n_storages, dtype=np.int8)
    best_res = frugal_res = None
    place = np.zeros(flat.n_storages, dtype=np.int8)
    for combo in itertools.product(*choices):
        place[:] = combo
        res = ws.run(place, prefetch)
        if 0 < flat.host_limit_bytes < res.d2h_bytes:
            continue
        if (budget is None or res.peak <= budget) and (best is None or (res.step, res.peak) < best):
            best = (res.step, res.peak)
            best_place, best_res = place.copy(), res
        if frugal is None or (res.peak, res.step) < frugal:
            frugal = (res.peak, res.step)
            frugal_place, frugal_res = place.copy(), res
    if best_res is not None:
        return _make_plan(flat, best_place, best_res, budget=budget)
    assert frugal_res is not None and budget is not None  # the loop ran at least once
    return _make_plan(
        flat,
        frugal_place,
        frugal_res,
        budget=budget,
        feasible=False,
        min_feasible=frugal_res.peak,
        notes=[
            f"budget {format_bytes(budget)} cannot be met; smallest feasible {format_bytes(frugal_res.peak)}"
        ],
    )
