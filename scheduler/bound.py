"""Lower bound on the step time of any plan within a memory budget (``lower_bound``).

A relaxation of the simulator's model (scheduler.timeline); the derivation is in
``lower_bound``'s docstring, the kernels' array names are the legend's in
``scheduler.kernels``.
"""

from __future__ import annotations

import numpy as np

from scheduler.flat import FlatProfile, flatten
from scheduler.kernels import argsort, njit
from scheduler.profile import Profile

__all__ = ["lower_bound", "lower_bound_flat"]


@njit
def _fixed_costs(j0, n_ops, op_sec, fixed_from):  # type: ignore[no-untyped-def]
    """``fixed[K]``: seconds of the unit's ops that run in every replay with prefix end
    ``K`` (``FlatProfile.fixed_from <= K``)."""
    fixed = np.zeros(n_ops + 1)
    for jj in range(n_ops):
        f = fixed_from[j0 + jj]
        if f <= n_ops:
            fixed[f] += op_sec[j0 + jj]
    for jj in range(n_ops):
        fixed[jj + 1] += fixed[jj]
    return fixed


@njit
def _dataflow_shares(
    lo, hi, j0, n_ops, nbytes, legal, last_save, st_prod, op_sec, op_serv, fixed_from,
    out_ptr, out_idx, rd_ptr, rd_idx, share
):  # type: ignore[no-untyped-def]
    """Add to ``share[s - lo]`` each droppable storage's share under the dataflow rule.

    chain(s): s's producer (when it lists s and lies before s's last save) and the
    never-servable ops it reaches through reads of earlier never-servable ops: all of
    them run whenever s is dropped. The chain stops at an op that runs in every replay
    of some prefix (``fixed_from``), the producer included: a view's reads are never
    followed by a replay (a view may produce s), and any other such op's reads run in
    the same replays, so neither is a share. Each op not in fixed is split evenly among
    the droppable storages whose chain holds it (round 0 counts them, round 1 splits).
    """
    lists = np.zeros(hi - lo, dtype=np.bool_)
    for s in range(lo, hi):
        p = st_prod[s]
        if (legal[s] & 4) == 0 or nbytes[s] <= 0 or p < 0 or p - j0 >= last_save[s]:
            continue
        for q in range(out_ptr[p], out_ptr[p + 1]):
            if out_idx[q] == s:
                lists[s - lo] = True
                break
    per_op = np.zeros(n_ops, dtype=np.int64)
    seen = np.zeros(n_ops, dtype=np.int64)
    stack = np.empty(n_ops, dtype=np.int64)
    for rnd in range(2):
        for s in range(lo, hi):
            if not lists[s - lo]:
                continue
            tag = 2 * (s - lo) + rnd + 1
            p = st_prod[s]
            seen[p - j0] = tag
            stack[0] = p
            top = 1
            while top > 0:
                top -= 1
                j = stack[top]
                if fixed_from[j] <= n_ops:
                    continue  # in every replay of some prefix: not a share, nor what it reads
                if rnd == 0:
                    per_op[j - j0] += 1
                else:
                    share[s - lo] += op_sec[j] / per_op[j - j0]
                for q in range(rd_ptr[j], rd_ptr[j + 1]):
                    r = rd_idx[q]
                    if r < j and not op_serv[r] and seen[r - j0] != tag:
                        seen[r - j0] = tag
                        stack[top] = r
                        top += 1


@njit
def _prefix_shares(
    lo, j0, n_ops, nbytes, legal, last_save, op_sec, op_serv, out_ptr, out_idx, share
):  # type: ignore[no-untyped-def]
    """Add to ``share[s - lo]`` each droppable storage's share under the prefix rule:
    each servable op before its last save listing it among its outputs, split evenly
    among the op's droppable outputs."""
    for jj in range(n_ops):
        j = j0 + jj
        if op_serv[j]:
            m = 0
            for q in range(out_ptr[j], out_ptr[j + 1]):
                o = out_idx[q]
                if (legal[o] & 4) != 0 and nbytes[o] > 0:
                    m += 1
            if m > 0:
                for q in range(out_ptr[j], out_ptr[j + 1]):
                    o = out_idx[q]
                    if (legal[o] & 4) != 0 and nbytes[o] > 0 and jj < last_save[o]:
                        share[o - lo] += op_sec[j] / m


@njit
def _envelope_points(lo, hi, cnt, n_ops, nbytes, legal, last_save, share, fixed, max_groups):  # type: ignore[no-untyped-def]
    """Points (bytes dropped, replay seconds) of the drop-cost curve: the ``cnt``
    droppable storages sorted by share per byte, prefix ends clamped to the op count and
    cut into at most ``max_groups`` groups. Returns (px, py, number of points)."""
    items = np.empty(cnt, dtype=np.int64)
    ks = np.empty(cnt, dtype=np.int64)
    dens = np.empty(cnt)
    c = 0
    for s in range(lo, hi):
        if (legal[s] & 4) != 0 and nbytes[s] > 0:
            items[c] = s
            ks[c] = min(last_save[s], n_ops)
            dens[c] = share[s - lo] / nbytes[s]
            c += 1
    items = items[argsort(dens)]
    ks_sorted = ks[argsort(ks.astype(np.float64))]
    kvals = np.empty(cnt, dtype=np.int64)
    n_k = 0
    for i in range(cnt):
        if n_k == 0 or ks_sorted[i] != kvals[n_k - 1]:
            kvals[n_k] = ks_sorted[i]
            n_k += 1
    n_g = min(n_k, max_groups)
    # group g covers kvals[g*n_k//n_g : (g+1)*n_k//n_g]: fixed at its smallest K, items up to its largest
    px = np.empty(1 + n_g * (cnt + 1))
    py = np.empty(1 + n_g * (cnt + 1))
    px[0] = 0.0
    py[0] = 0.0
    n_p = 1
    for g in range(n_g):
        k_lo = kvals[(g * n_k) // n_g]
        k_hi = kvals[((g + 1) * n_k) // n_g - 1]
        f0 = fixed[k_lo]
        bx = 0.0
        by = f0
        for i in range(cnt):
            s = items[i]
            if min(last_save[s], n_ops) <= k_hi:
                bx += nbytes[s]
                by += share[s - lo]
                px[n_p] = bx
                py[n_p] = by
                n_p += 1
    return px, py, n_p


@njit
def _lower_hull(px, py, n_p, seg_x, seg_y, n_seg):  # type: ignore[no-untyped-def]
    """Append the lower convex hull of the points ``px[:n_p]``, ``py[:n_p]`` (one of
    ``px`` 0) as segments (width, rise) at ``n_seg``; returns the new segment count."""
    order = argsort(px[:n_p])
    hx = np.empty(n_p)
    hy = np.empty(n_p)
    h = 0
    for ii in range(n_p):
        x = px[order[ii]]
        y = py[order[ii]]
        if h > 0 and hx[h - 1] == x:
            if y >= hy[h - 1]:
                continue
            h -= 1
        while h >= 2 and (hy[h - 1] - hy[h - 2]) * (x - hx[h - 2]) >= (y - hy[h - 2]) * (
            hx[h - 1] - hx[h - 2]
        ):
            h -= 1
        hx[h] = x
        hy[h] = y
        h += 1
    for i in range(1, h):
        # the envelope of a nondecreasing function can be taken nondecreasing
        seg_x[n_seg] = hx[i] - hx[i - 1]
        seg_y[n_seg] = max(0.0, hy[i] - hy[i - 1])
        n_seg += 1
    return n_seg


@njit
def _region_envelope(
    u, st_ptr, nbytes, legal, last_save, st_prod, op_ptr, op_sec, op_serv, fixed_from,
    out_ptr, out_idx, rd_ptr, rd_idx, noops, dataflow, fwd_dur, max_groups, seg_x, seg_y, n_seg
):  # type: ignore[no-untyped-def]
    """Append the lower convex envelope of region ``u``'s drop-cost curve as segments.

    Per prefix length ``K`` the cost ``fixed(K)`` of the ops that run in every replay
    with that prefix (``FlatProfile.fixed_from <= K``); per storage ``s`` a share ``c_s``
    of an op that is not among them but runs whenever ``s`` is dropped: under prefix
    semantics each servable op listing ``s`` among its outputs, split evenly among its
    droppable outputs; in a dataflow unit ``s``'s producer (when it lists ``s``), split
    evenly among the droppable storages it produced. Any drop set ``D`` with prefix
    ``K`` costs at least ``fixed(K) + sum(c_s for s in D)`` under either replay rule.
    """
    lo = st_ptr[u]
    hi = st_ptr[u + 1]
    cnt = 0
    total_b = 0
    for s in range(lo, hi):
        if (legal[s] & 4) != 0 and nbytes[s] > 0:
            cnt += 1
            total_b += nbytes[s]
    if cnt == 0:
        return n_seg
    if noops[u]:
        seg_x[n_seg] = float(total_b)
        seg_y[n_seg] = fwd_dur[u]
        return n_seg + 1
    j0 = op_ptr[u]
    n_ops = op_ptr[u + 1] - j0
    share = np.zeros(hi - lo)
    fixed = _fixed_costs(j0, n_ops, op_sec, fixed_from)
    if dataflow[u]:
        _dataflow_shares(
            lo, hi, j0, n_ops, nbytes, legal, last_save, st_prod, op_sec, op_serv, fixed_from,
            out_ptr, out_idx, rd_ptr, rd_idx, share
        )
    else:
        _prefix_shares(
            lo, j0, n_ops, nbytes, legal, last_save, op_sec, op_serv, out_ptr, out_idx, share
        )
    px, py, n_p = _envelope_points(
        lo, hi, cnt, n_ops, nbytes, legal, last_save, share, fixed, max_groups
    )
    return _lower_hull(px, py, n_p, seg_x, seg_y, n_seg)


@njit
def _pwl(bx, by, slope, order, x):  # type: ignore[no-untyped-def]
    """Value at ``x`` of the piecewise-linear function with breakpoints (bx, by)."""
    n = bx.shape[0] - 1
    if n == 0:
        return 0.0
    lo = 0
    hi = n + 1
    while hi - lo > 1:  # last breakpoint <= x
        mid = (lo + hi) // 2
        if bx[mid] <= x:
            lo = mid
        else:
            hi = mid
    i = lo
    if i >= n:
        return by[n]
    return by[i] + slope[order[i]] * (x - bx[i])


@njit
def _lower_bound(
    budget, st_ptr, nbytes, legal, last_save, save_time, st_prod, op_ptr, op_sec, op_serv,
    fixed_from, out_ptr, out_idx, rd_ptr, rd_idx, noops, dataflow, fwd_dur, bwd_dur, t0, d2h_bps, h2d_bps,
    host_limit, max_groups, t_cap
):  # type: ignore[no-untyped-def]
    n_u = fwd_dur.shape[0]
    b_total = 0.0
    for u in range(n_u):
        b_total += bwd_dur[u]
    top = -1
    for u in range(n_u - 1, -1, -1):
        if bwd_dur[u] > 0:
            top = u
            break
    if top < 0:
        return t0 + b_total
    a_t0 = 0
    for s in range(st_ptr[top + 1]):
        a_t0 += nbytes[s]
    need = float(a_t0 - budget)
    if need <= 0:
        return t0 + b_total
    cap = 0.0
    if d2h_bps > 0 and h2d_bps > 0:
        ob = 0.0
        t_first = t0
        for s in range(st_ptr[top + 1]):
            if (legal[s] & 2) != 0 and nbytes[s] > 0:
                ob += nbytes[s]
                t_first = min(t_first, save_time[s])
        cap = min(ob, d2h_bps * (t_cap - t_first))
        if host_limit > 0:
            cap = min(cap, float(host_limit))
    seg_x = np.empty(st_ptr[top + 1] * (max_groups + 1) + n_u + 1)
    seg_y = np.empty(seg_x.shape[0])
    n_seg = np.int64(0)  # not an int literal: _region_envelope compiles once
    for u in range(1, top + 1, 2):
        n_seg = _region_envelope(
            u, st_ptr, nbytes, legal, last_save, st_prod, op_ptr, op_sec, op_serv, fixed_from,
            out_ptr, out_idx, rd_ptr, rd_idx, noops, dataflow, fwd_dur, max_groups, seg_x, seg_y,
            n_seg
        )
    x_max = 0.0
    for i in range(n_seg):
        x_max += seg_x[i]
    lo = max(0.0, need - cap)
    hi = min(need, x_max)
    if lo > hi * (1 + 1e-12):
        return np.inf
    slope = np.empty(n_seg)
    for i in range(n_seg):
        slope[i] = seg_y[i] / seg_x[i] if seg_x[i] > 0 else 0.0
    order = argsort(slope)
    # breakpoints of C, the cheapest replay for dropping x bytes (convex, increasing)
    bx = np.zeros(n_seg + 1)
    by = np.zeros(n_seg + 1)
    for i in range(n_seg):
        bx[i + 1] = bx[i] + seg_x[order[i]]
        by[i + 1] = by[i] + seg_y[order[i]]
    if h2d_bps <= 0:
        return t0 + b_total + _pwl(bx, by, slope, order, lo)
    # f(x) = max(B + C(x), (need - x) / h2d): first term increasing, second decreasing
    if b_total + _pwl(bx, by, slope, order, lo) >= (need - lo) / h2d_bps:
        return t0 + b_total + _pwl(bx, by, slope, order, lo)
    if b_total + _pwl(bx, by, slope, order, hi) <= (need - hi) / h2d_bps:
        return t0 + (need - hi) / h2d_bps
    a = lo
    for i in range(n_seg + 1):
        e = min(hi, bx[i + 1]) if i < n_seg else hi
        if e <= a:
            continue
        if b_total + _pwl(bx, by, slope, order, e) >= (need - e) / h2d_bps:
            ya = b_total + _pwl(bx, by, slope, order, a)
            sl = slope[order[i]] if i < n_seg else 0.0
            x = (need / h2d_bps - ya + sl * a) / (sl + 1.0 / h2d_bps)
            x = min(max(x, a), e)
            return t0 + max(b_total + _pwl(bx, by, slope, order, x), (need - x) / h2d_bps)
        a = e
    return t0 + (need - hi) / h2d_bps


def lower_bound(profile: Profile, budget_bytes: int | None) -> float:
    """Physical lower bound on step seconds of any plan whose simulated peak <= budget.

    Relaxation (every step is implied by the model in scheduler.timeline):

    * Compute never idles less than forward + backward + replay, so
      ``step >= F + B + replay``.
    * At the end of forward (``T0 = F``) every storage of a unit whose backward has not
      ended is resident unless dropped or offloaded with its copy landed. Units after the
      last one with backward time > 0 may end at ``T0``; their bytes are left out. So the
      bytes ``R`` dropped plus the bytes ``O`` landed by ``T0`` must cover
      ``need = A - budget`` (``A``: the remaining bytes).
    * ``O`` is at most what the D2H link carries from the earliest offloadable save to
      the latest end of forward any plan has (every group that may offload does, each
      adding its issue time; ``FlatProfile.forward_end_bound``), and the host limit;
      every offloaded byte comes back after ``T0`` on the H2D link before the step ends,
      so ``step >= F + O / h2d``. ``F`` and ``B`` include the host time every plan pays
      (the hooks' per-save costs, but a region's under native keep, which a plan keeping
      it whole does not pay: NOTE [Host time]); issue, checkpoint and replay host time
      only lengthen a plan, so leaving them out keeps the bound.
    * The least replay time to drop ``R`` bytes is bounded below by a fractional
      knapsack over per-region convex envelopes of ``fixed(K) + sum c_s`` (see
      ``_region_envelope``): convex, so regions combine by slope.

    Result: ``F + min over R of max(B + C(R), (need - R) / h2d)``, ``inf`` when even
    dropping every droppable byte and filling the link cannot reach the budget.
    ``budget_bytes=None`` gives ``F + B``.
    """
    flat = flatten(profile)
    if budget_bytes is None:
        return flat.t0 + float(flat.bwd_dur.sum())
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)):
        raise TypeError(f"budget_bytes must be an int or None, got {type(budget_bytes).__name__}")
    return lower_bound_flat(flat, int(budget_bytes))


def lower_bound_flat(flat: FlatProfile, budget_bytes: int, max_groups: int = 32) -> float:
    return float(
        _lower_bound(
            float(budget_bytes),
            flat.st_ptr,
            # a storage an earlier kept record holds may add nothing (NOTE [Inputs
            # counted once], [Activations counted once] in offrecomp/shared.py), nor an
            # input no op saves (a unit kept whole holds none): left out, the bound
            # stays one
            np.where((flat.shared >= 0) | flat.unsaved, 0, flat.nbytes),
            flat.choice,
            flat.last_save,
            flat.save_time,
            flat.st_prod,
            flat.op_ptr,
            flat.op_sec,
            flat.op_serv,
            flat.fixed_from,
            flat.out_ptr,
            flat.out_idx,
            flat.rd_ptr,
            flat.rd_idx,
            flat.noops,
            flat.dataflow,
            flat.fwd_dur,
            flat.bwd_dur,
            flat.t0,
            flat.d2h_bps,
            flat.h2d_bps,
            flat.host_limit_bytes,
            max_groups,
            flat.forward_end_bound(),
        )
    )
