"""One step of the chain of plans (``_chain_step``): free about ``delta`` bytes
resident at the current plan's memory peak, cheapest seconds per byte first.

The moves, in order: hidden-set members that are off the device then (free), drops
priced per region knowing the shared replay prefix (scheduler.solver.drops), and
offloads that may stall, priced by the stall they add to their region. The array names
are the legend's in ``scheduler.kernels``.

An offload changes no replay: a region's replay serves what it offloaded from the
reload (NOTE [Serving from reloads] in offrecomp/regenerate.py), as what it kept.

NOTE [drop cache]: a step changes few regions. A region's options depend only on its
storages' codes: ``new[s]``, plus 3 when dropping s frees its bytes at ``tstar``
(droppable, not dropped, and resident: saved by then; a copy offloaded under ``place``
until its D2H copy lands and again from its reload's issue time ``iss``; one offloaded
in step 1 is off already). The cache keeps the codes and results of a region's last
pricings (its ways); a region whose codes all equal a way's reuses that result, which
pricing again would repeat bit for bit (same inputs, same order).

NOTE [D2H room]: a new copy joins the D2H FIFO in save order and delays the copies saved
after it; ``lim[i]`` is the latest the copy inserted at save position i may land without
pushing any copy that lands by ``tstar`` past ``tstar``.
"""

from __future__ import annotations

import numpy as np

from scheduler.kernels import argsort, njit, njit_inline
from scheduler.solver.drops import _region_drops

__all__: list[str] = []


@njit_inline
def _issue_at(x, riss, reach, prefetch, top):  # type: ignore[no-untyped-def]
    """When unit ``x``'s group reload is issued: as simulated where ``x`` offloads, else
    when the region ``prefetch`` regions later is reached, or ``x`` itself when none is
    (NOTE [Offload groups] in scheduler.timeline)."""
    if riss[x] >= 0.0:
        return riss[x]
    return reach[x + 2 * prefetch] if x + 2 * prefetch <= top else reach[x]


@njit_inline
def _hidden_moves(
    place, new, tstar, delta, prefetch, h_order, h_land, legal, unit_of, nbytes, save_time,
    reach, riss
):  # type: ignore[no-untyped-def]
    """Step 1: offload in ``new`` the hidden-set members that are off the device at
    ``tstar`` (free), in set order, until ``delta`` bytes are freed; returns the bytes."""
    top = reach.shape[0] - 1
    freed = 0
    for i in range(h_order.shape[0]):
        if freed >= delta:
            break
        s = h_order[i]
        if place[s] != 0 or save_time[s] > tstar or (legal[s] & 2) == 0:
            continue
        x = unit_of[s]
        iss = _issue_at(x, riss, reach, prefetch, top)
        if h_land[s] <= tstar < iss:
            new[s] = 1
            freed += nbytes[s]
    return freed


@njit_inline
def _regions_to_price(
    place, new, tstar, prefetch, legal, st_ptr, nbytes, save_time, d2h_end, reach, cstart,
    riss, codes, way, listed, todo, dc_code, dc_i, now
):  # type: ignore[no-untyped-def]
    """Step 2's regions: those whose backward starts after ``tstar`` with a storage that
    could be dropped go to ``listed``, each with its cache way in ``way``; those whose codes no way
    holds also go to ``todo``, their codes stored in the least recently used way (NOTE
    [drop cache]; ``now`` is this step's tag). Returns (listed, todo) counts."""
    n_u = reach.shape[0]
    top = n_u - 1
    n_listed = 0
    n_todo = 0
    for u in range(n_u):
        if u % 2 == 0 or tstar >= cstart[u]:
            continue
        iss = _issue_at(u, riss, reach, prefetch, top)
        # the codes of u's storages; skip u when none could be dropped at all
        # (droppable, not dropped, saved by tstar)
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
        w = -1  # the first way whose codes equal u's
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
    return n_listed, n_todo


@njit_inline
def _drop_options(listed, way, dc_f, dc_i, opt_ratio, opt_bytes, opt_kind, opt_ref, opt_k, opt_cnt):  # type: ignore[no-untyped-def]
    """Each listed region's best drop option as an option of kind 0 (ref: the unit);
    returns the option count."""
    n_opt = 0
    for i in range(listed.shape[0]):
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
    return n_opt


@njit_inline
def _d2h_room(save_order, place, d2h_end, nbytes, tstar, d2h_bps):  # type: ignore[no-untyped-def]
    """``lim`` of NOTE [D2H room], per save position."""
    n_st = place.shape[0]
    lim = np.empty(n_st)
    nxt = np.inf
    for i in range(n_st - 1, -1, -1):
        s = save_order[i]
        lim[i] = nxt
        if place[s] == 1:
            cap = tstar if d2h_end[s] <= tstar else np.inf
            nxt = min(cap, nxt) - nbytes[s] / d2h_bps
    return lim


@njit
def _offload_options(
    n_opt, need, place, new, tstar, prefetch, legal, save_order, unit_of, nbytes, save_time,
    d2h_bps, h2d_bps, d2h_end, h2d_end, reach, cstart, riss, fend, opt_ratio, opt_bytes,
    opt_room, opt_kind, opt_ref
):  # type: ignore[no-untyped-def]
    """Step 3: offloads that are not hidden, options of kind 1 (ref: the storage) from
    ``n_opt`` on. Each is priced by the stall it adds to its unit's reload queue;
    ``opt_room`` is the D2H seconds of room it
    leaves before ``tstar`` (NOTE [D2H room]). Returns (option count, and the cheapest
    offload freeing ``need`` bytes, the most bytes among equals: its seconds, bytes and
    storage, -1 when none)."""
    n_u = reach.shape[0]
    n_st = place.shape[0]
    top = n_u - 1
    off_cost = np.inf
    off_bytes = 0.0
    off_ref = -1
    ready = np.zeros(n_u)
    for s in range(n_st):
        if place[s] == 1 and h2d_end[s] > ready[unit_of[s]]:
            ready[unit_of[s]] = h2d_end[s]
    lim = _d2h_room(save_order, place, d2h_end, nbytes, tstar, d2h_bps)
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
    return n_opt, off_cost, off_bytes, off_ref


@njit_inline
def _apply_drop(plan, u, k, n, way, st_ptr, dc_items, dc_eff, dc_i):  # type: ignore[no-untyped-def]
    """Drop in ``plan`` the first ``n`` of region ``u``'s cached items whose prefix end
    is at most ``k``."""
    cnt = 0
    w = way[u]
    for i in range(st_ptr[u], st_ptr[u] + dc_i[w, u, 0]):
        s = dc_items[w, i]
        if dc_eff[w, s] <= k and cnt < n:
            plan[s] = 2
            cnt += 1


@njit_inline
def _apply_options(
    n_opt, freed, delta, new, opt_ratio, opt_bytes, opt_room, opt_kind, opt_ref, opt_k, opt_cnt,
    way, st_ptr, nbytes, d2h_bps, dc_items, dc_eff, dc_i
):  # type: ignore[no-untyped-def]
    """Step 4: apply options to ``new``, cheapest per byte first, until ``delta`` bytes
    are freed; an offload only while the offloads applied before it leave it room.
    Returns (bytes freed, first option applied or -1, options applied)."""
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
            _apply_drop(new, opt_ref[o], opt_k[o], opt_cnt[o], way, st_ptr, dc_items, dc_eff, dc_i)
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
    return freed, first, n_applied


@njit_inline
def _side_plan(
    side, first, n_applied, side_f, side_i, off_cost, off_bytes, off_ref, opt_kind, opt_ref,
    opt_k, opt_cnt, way, st_ptr, dc_items, dc_eff, dc_i
):  # type: ignore[no-untyped-def]
    """Apply to ``side`` the single option freeing the step's need for the fewest seconds
    (most bytes among equals; the first in step 2's order, drops before offloads): the
    drop in ``side_f``/``side_i`` or the offload ``off_ref``. Returns whether ``side``
    then differs from the chain's plan (not when that option is the one step 4 applied)."""
    side_kind = 0 if side_i[0] >= 0 else -1
    side_ref = side_i[0]
    if off_ref >= 0 and (off_cost < side_f[0] or (off_cost == side_f[0] and off_bytes > side_f[1])):
        side_kind = 1
        side_ref = off_ref
    if side_kind < 0:
        return False
    same = (
        n_applied == 1
        and opt_kind[first] == side_kind
        and opt_ref[first] == side_ref
        and (side_kind == 1 or (opt_k[first] == side_i[1] and opt_cnt[first] == side_i[2]))
    )
    if same:
        return False
    if side_kind == 0:
        _apply_drop(side, side_ref, side_i[1], side_i[2], way, st_ptr, dc_items, dc_eff, dc_i)
    else:
        side[side_ref] = 1
    return True


@njit
def _chain_step(
    place, new, side, tstar, delta, prefetch, h_order, h_land, legal, save_order, st_ptr,
    unit_of, nbytes, save_time, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr,
    out_idx, rd_ptr, rd_idx, noops, df_price, fwd_dur, d2h_bps, h2d_bps, d2h_end, h2d_end,
    reach, cstart, riss, fend, prod_ptr, prod_ops, ctr, join, vis, ran, stamp, sstamp, odrop,
    stack, op_host, dc_code, dc_items, dc_eff, dc_f, dc_i, op_view
):  # type: ignore[no-untyped-def]
    """One step of the chain: free about ``delta`` bytes resident at time ``tstar``.

    Writes the next chain plan into ``new`` and a side plan into ``side``.
    Returns (bytes freed at tstar by ``new``, whether ``side`` differs from ``new``).

    ``df_price[u]``: price unit ``u``'s drops with the dataflow rule (a dataflow unit
    whose droppable storages all have a producer). ``ctr`` (a one-element counter) and
    the per-op arrays ``join``, ``vis``, ``ran``, ``stamp``,
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
    for s in range(n_st):
        new[s] = place[s]
    # 1. hidden offloads that are off the device at tstar (free)
    freed = _hidden_moves(
        place, new, tstar, delta, prefetch, h_order, h_land, legal, unit_of, nbytes, save_time,
        reach, riss
    )
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
    # 2. drops, per region the best option per prefix end K, knowing the shared prefix
    # (NOTE [drop cache])
    side_f = np.array([np.inf, 0.0])  # the side plan's drop option (_region_drops)
    side_i = np.array([-1, 0, 0])
    codes = np.empty(n_st, dtype=np.int8)
    way = np.zeros(n_u, dtype=np.int64)  # the cache way of region u's option
    listed = np.empty(n_u, dtype=np.int64)  # regions with a storage to drop, in order
    todo = np.empty(n_u, dtype=np.int64)  # those to price
    ctr[0] += 1
    n_listed, n_todo = _regions_to_price(
        place, new, tstar, prefetch, legal, st_ptr, nbytes, save_time, d2h_end, reach, cstart,
        riss, codes, way, listed, todo, dc_code, dc_i, ctr[0]
    )
    _region_drops(
        todo[:n_todo], need, False, new, codes, way, st_ptr, nbytes, last_save, st_prod, op_ptr,
        op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, noops, df_price, fwd_dur,
        prod_ptr, prod_ops, ctr, join, vis, stamp, sstamp, odrop, stack, op_host, dc_items,
        dc_eff, dc_f, dc_i, side_f, side_i, op_view
    )
    n_opt = _drop_options(
        listed[:n_listed], way, dc_f, dc_i, opt_ratio, opt_bytes, opt_kind, opt_ref, opt_k, opt_cnt
    )
    n_drop_opt = n_opt
    # 3. offloads that are not hidden: stall estimated from the unit's reload queue
    off_cost = np.inf  # the cheapest offload freeing need bytes (most bytes among equals)
    off_bytes = 0.0
    off_ref = -1
    if d2h_bps > 0 and h2d_bps > 0:
        n_opt, off_cost, off_bytes, off_ref = _offload_options(
            n_opt, need, place, new, tstar, prefetch, legal, save_order, unit_of, nbytes,
            save_time, d2h_bps, h2d_bps, d2h_end, h2d_end, reach, cstart, riss, fend, opt_ratio,
            opt_bytes, opt_room, opt_kind, opt_ref
        )
    # 4. apply options cheapest per byte first
    freed, first, n_applied = _apply_options(
        n_opt, freed, delta, new, opt_ratio, opt_bytes, opt_room, opt_kind, opt_ref, opt_k,
        opt_cnt, way, st_ptr, nbytes, d2h_bps, dc_items, dc_eff, dc_i
    )
    if freed <= delta + delta // 2:  # a side plan is only worth it when the step overshoots
        return freed, False
    # the side plan, priced on ``side``: still the plan step 2 priced
    _region_drops(
        opt_ref[:n_drop_opt], need, True, side, codes, way, st_ptr, nbytes, last_save, st_prod,
        op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, noops, df_price,
        fwd_dur, prod_ptr, prod_ops, ctr, join, vis, stamp, sstamp, odrop, stack, op_host,
        dc_items, dc_eff, dc_f, dc_i, side_f, side_i, op_view
    )
    return freed, _side_plan(
        side, first, n_applied, side_f, side_i, off_cost, off_bytes, off_ref, opt_kind, opt_ref,
        opt_k, opt_cnt, way, st_ptr, dc_items, dc_eff, dc_i
    )
