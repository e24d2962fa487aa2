"""Pricing drops: what replay costs when a region's storages are dropped (RECOMPUTE).

``_region_drops`` prices the drop options of a chain step's regions (NOTE [drop cache]
in scheduler.solver.chain) in three passes over them: their replay bases
(``_region_bases``, NOTE [replay base]), the storages each may drop
(``_region_items``) and each one's cheapest option (``_region_options``). A region's
passes read only its own storages and ops, so they give each region what one pass per
region would; each pass is one loop over the regions (NOTE [kernel parts] in
scheduler.kernels). ``_close`` and ``_walk`` follow a demand-driven
replay through its ops' reads. The array names are the legend's in
``scheduler.kernels``.
"""

from __future__ import annotations

import numpy as np

from scheduler.kernels import argsort, njit, served_now

__all__: list[str] = []


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
                    if new[o] == 2 or odrop[o] == wtag:
                        served = False
                        break
                if served:
                    sstamp[r] = wtag
                    continue
            stamp[r] = wtag
            stack[top] = r
            top += 1
    return cost


# NOTE [replay base]: base[K] is the cost of the ops that run in replay with prefix end
# K under the current plan, join[j] the smallest K at which op j runs (n_ops + 1: not at
# all). Prefix rule: the ops that are not served, from their own index on. Dataflow
# rule: the closure of the dropped storages' producers (counted from K = 0; only K >=
# the current prefix end is ever asked) and of each sink from just past it; a view from
# just past it too, and the closure never enters it. Region u's base[K] and plain[K] are
# at index op_ptr[u] + u + K.


@njit
def _region_bases(
    todo, new, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx,
    rd_ptr, rd_idx, noops, df_price, op_view, ctr, join, vis, stack, base, plain, k_cur, any_drop
):  # type: ignore[no-untyped-def]
    """Per region ``u`` of ``todo`` under ``new``: its current prefix end and whether it
    drops anything (``k_cur[u]``, ``any_drop[u]``), ``plain`` (a replay without the
    dispatch mode runs every op before K), and ``base`` and ``join`` (NOTE [replay base])."""
    for t in range(todo.shape[0]):
        u = todo[t]
        j0 = op_ptr[u]
        n_ops = op_ptr[u + 1] - j0
        b0 = j0 + u
        k_cur[u] = 0
        any_drop[u] = False
        for s in range(st_ptr[u], st_ptr[u + 1]):
            if new[s] == 2:
                any_drop[u] = True
                k_cur[u] = max(k_cur[u], min(last_save[s], n_ops))
        base[b0] = 0.0
        plain[b0] = 0.0
        for jj in range(n_ops):
            plain[b0 + jj + 1] = plain[b0 + jj] + op_sec[j0 + jj]
        never = n_ops + 1
        for jj in range(n_ops):
            join[j0 + jj] = never
        if df_price[u] and not noops[u]:
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
            base[b0] = _close(
                stack, n_top, np.int64(0), tag, new, op_sec, op_serv, op_sink, out_ptr, out_idx,
                rd_ptr, rd_idx, vis, join
            )
            for jj in range(n_ops):
                j = j0 + jj
                base[b0 + jj + 1] = base[b0 + jj]
                if op_view[j]:
                    join[j] = jj + 1
                    base[b0 + jj + 1] += op_sec[j]
                elif op_sink[j] and vis[j] != tag:
                    vis[j] = tag
                    stack[0] = j
                    base[b0 + jj + 1] += _close(
                        stack, np.int64(1), np.int64(jj + 1), tag, new, op_sec, op_serv, op_sink,
                        out_ptr, out_idx, rd_ptr, rd_idx, vis, join
                    )
        else:
            for jj in range(n_ops):
                j = j0 + jj
                unserved = not op_serv[j]
                if not unserved:
                    for q in range(out_ptr[j], out_ptr[j + 1]):
                        if new[out_idx[q]] == 2:
                            unserved = True
                            break
                if unserved:
                    join[j] = 0
                base[b0 + jj + 1] = base[b0 + jj] + (op_sec[j] if unserved else 0.0)


@njit
def _region_items(
    todo, codes, new, way, st_ptr, nbytes, last_save, st_prod, op_ptr, noops, df_price, op_sec,
    op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, prod_ptr, prod_ops, ctr, join, stamp,
    sstamp, odrop, stack, k_cur, dc_items, dc_eff, dc_i
):  # type: ignore[no-untyped-def]
    """Per region ``u`` of ``todo``: the storages it may drop (``codes[s] >= 3``) into
    ``dc_items[w, st_ptr[u]:]`` (``w = way[u]``), fewest added replay seconds per byte
    first, each one's prefix end into ``dc_eff[w]``, their count into ``dc_i[w, u, 0]``.
    Added seconds: dropping the storage alone on top of ``new``, with its prefix end."""
    for t in range(todo.shape[0]):
        u = todo[t]
        w = way[u]
        items = dc_items[w]
        eff = dc_eff[w]
        n_ops = op_ptr[u + 1] - op_ptr[u]
        dfu = df_price[u] and not noops[u]
        start = st_ptr[u]
        addc = np.empty(st_ptr[u + 1] - start)
        m = 0
        for s in range(st_ptr[u], st_ptr[u + 1]):
            if codes[s] < 3:
                continue
            e = max(k_cur[u], min(last_save[s], n_ops))
            c = 0.0
            if dfu:
                ctr[0] += 1
                odrop[s] = ctr[0]
                c = _walk(
                    st_prod[s], e, ctr[0], new, odrop, op_sec, op_serv, op_sink, out_ptr,
                    out_idx, rd_ptr, rd_idx, join, stamp, sstamp, stack
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


@njit
def _region_options(
    todo, need, want_side, new, way, st_ptr, nbytes, st_prod, op_ptr, noops, df_price, fwd_dur,
    op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, prod_ptr, prod_ops, ctr, join,
    stamp, sstamp, odrop, stack, op_host, base, plain, k_cur, any_drop, dc_items, dc_eff, dc_f,
    dc_i, side_f, side_i
):  # type: ignore[no-untyped-def]
    """Per region ``u`` of ``todo`` with items: its cheapest option per byte into
    ``dc_f[w, u]``/``dc_i[w, u, 1:3]``, and with ``want_side`` a cheaper side option into
    ``side_f``/``side_i`` (see ``_region_drops``). Per distinct prefix end ``K`` among
    the items, the options drop the first 1, 2, ... items whose prefix end is at most
    ``K``, each priced against what the region's replay costs now."""
    for t in range(todo.shape[0]):
        u = todo[t]
        w = way[u]
        m = dc_i[w, u, 0]
        if m == 0:
            continue
        items = dc_items[w]
        eff = dc_eff[w]
        dfu = df_price[u] and not noops[u]
        start = st_ptr[u]
        b0 = op_ptr[u] + u
        kc = k_cur[u]
        cur = 0.0
        if any_drop[u]:
            cur = fwd_dur[u] if noops[u] else min(plain[b0 + kc], base[b0 + kc] + kc * op_host)
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
            run = 0.0 if noops[u] else base[b0 + kp]  # what the dispatch mode runs
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
                    cost = min(plain[b0 + kp], run + kp * op_host) - cur
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
    (region, ``K``, ``n``). The scratch is ``_chain_step``'s.
    """
    n_u = fwd_dur.shape[0]
    base = np.empty(op_ptr[n_u] + n_u)
    plain = np.empty(op_ptr[n_u] + n_u)
    k_cur = np.zeros(n_u, dtype=np.int64)
    any_drop = np.zeros(n_u, dtype=np.bool_)
    _region_bases(
        todo, new, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr,
        out_idx, rd_ptr, rd_idx, noops, df_price, op_view, ctr, join, vis, stack, base, plain,
        k_cur, any_drop
    )
    _region_items(
        todo, codes, new, way, st_ptr, nbytes, last_save, st_prod, op_ptr, noops, df_price,
        op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, prod_ptr, prod_ops, ctr,
        join, stamp, sstamp, odrop, stack, k_cur, dc_items, dc_eff, dc_i
    )
    _region_options(
        todo, need, want_side, new, way, st_ptr, nbytes, st_prod, op_ptr, noops, df_price,
        fwd_dur, op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, prod_ptr, prod_ops,
        ctr, join, stamp, sstamp, odrop, stack, op_host, base, plain, k_cur, any_drop, dc_items,
        dc_eff, dc_f, dc_i, side_f, side_i
    )
