"""The hidden offload set: storages whose copies the links hide completely.

NOTE [hidden offload]: a candidate is accepted when, together with all accepted ones,
(a) the D2H FIFO (save order) lands every copy by the end of forward ``t0``: for each
accepted ``i``, ``save_i + sum(copy seconds of accepted j saved at or after i) <= t0``,
kept as a max-segment-tree over save ranks; and (b) the H2D FIFO lands each unit's
reloads before that unit's backward is reached, with backward taken without replay or
stall (the tightest case), propagated unit by unit until the added delay is absorbed by
idle time. The array names are the legend's in ``scheduler.kernels``.
"""

from __future__ import annotations

import numpy as np

from scheduler.flat import OFFLOAD_BIT, FlatProfile
from scheduler.kernels import njit, njit_inline, replay_unit
from scheduler.layout import issue_ahead
from scheduler.timeline import Workspace

__all__ = ["hidden_offloads"]


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




@njit_inline
def _fen_add(fen, i, v):  # type: ignore[no-untyped-def]
    """Add ``v`` at position ``i`` (1-based) of the Fenwick tree ``fen``."""
    n = fen.shape[0] - 1
    while i <= n:
        fen[i] += v
        i += i & (-i)


@njit_inline
def _fen_sum(fen, i):  # type: ignore[no-untyped-def]
    """Sum of positions 1..``i`` of the Fenwick tree ``fen``."""
    out = 0.0
    while i > 0:
        out += fen[i]
        i -= i & (-i)
    return out


@njit_inline
def _reload_issue(bwd_dur, t0, prefetch):  # type: ignore[no-untyped-def]
    """Per unit when backward reaches it (without replay or stall) and when its group's
    reload is issued."""
    n_u = bwd_dur.shape[0]
    top = n_u - 1
    reach0 = np.empty(n_u)
    reach0[top] = t0
    for v in range(top - 1, -1, -1):
        reach0[v] = reach0[v + 1] + bwd_dur[v + 1]
    issue = np.empty(n_u)
    for x in range(n_u):
        # prefetched when the offloading region `prefetch` regions later is reached; the
        # first group backward meets is reloaded when reached (NOTE [Offload groups])
        issue[x] = reach0[x + 2 * prefetch] if x + 2 * prefetch <= top else reach0[x]
    return reach0, issue


@njit_inline
def _h2d_fits(k, p_h, issue, reach0, load, comp, tmp, tol):  # type: ignore[no-untyped-def]
    """(b) of NOTE [hidden offload]: whether adding ``p_h`` reload seconds to unit ``k``
    keeps every unit's reloads landing by its reach. ``comp[x]``: when unit x's reloads
    complete; the new completions go to ``tmp[last..k]``. Returns (fits, last)."""
    top = comp.shape[0] - 1
    prev = comp[k + 1] if k < top else -np.inf
    last = k
    for x in range(k, -1, -1):
        lx = load[x] + (p_h if x == k else 0.0)
        nc = max(issue[x], prev) + lx
        if x < k and nc <= comp[x]:
            break
        if lx > 0 and nc > reach0[x] + tol:
            return False, last
        tmp[x] = nc
        prev = nc
        last = x
    return True, last


@njit_inline
def _d2h_fits(r, p_d, save_s, t0, tol, neg, t, add, size, fen, total):  # type: ignore[no-untyped-def]
    """(a) of NOTE [hidden offload]: add a copy of ``p_d`` seconds saved at ``save_s``
    with save rank ``r``; undone when some copy would then land after ``t0``. Returns
    (kept, the copy seconds of the set)."""
    _seg_range_add(t, add, size, 0, r, p_d)
    _fen_add(fen, r + 1, p_d)
    total += p_d
    before = _fen_sum(fen, r)
    _seg_set(t, add, size, r, save_s + (total - before) - t0)
    if t[1] > tol:
        _seg_set(t, add, size, r, neg)
        _seg_range_add(t, add, size, 0, r, -p_d)
        _fen_add(fen, r + 1, -p_d)
        total -= p_d
        return False, total
    return True, total


@njit_inline
def _landing_times(acc, nbytes, save_time, save_rank, d2h_bps):  # type: ignore[no-untyped-def]
    """When each accepted copy lands (D2H FIFO in save order; inf outside the set)."""
    n = nbytes.shape[0]
    land = np.full(n, np.inf)
    inset = np.zeros(n, dtype=np.bool_)
    for i in range(acc.shape[0]):
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
    return land


@njit
def _hidden_set(
    cand, nbytes, save_time, unit_of, save_rank, t0, d2h_bps, h2d_bps, bwd_dur, prefetch, host_limit
):  # type: ignore[no-untyped-def]
    """Greedy hidden offload set, in the order of ``cand`` (NOTE [hidden offload]).
    Returns (accepted storages in acceptance order, landing time of each accepted copy).
    """
    n = nbytes.shape[0]
    neg = -1e300
    size = 1
    while size < max(n, 1):
        size *= 2
    t = np.full(2 * size, neg)
    add = np.zeros(2 * size)
    fen = np.zeros(n + 1)
    total = 0.0
    tol = 1e-9 * max(t0, 1e-300)
    reach0, issue = _reload_issue(bwd_dur, t0, prefetch)
    load = np.zeros(bwd_dur.shape[0])
    comp = issue.copy()
    tmp = np.empty(bwd_dur.shape[0])
    accepted = np.empty(cand.shape[0], dtype=np.int64)
    n_acc = 0
    used = 0
    for ci in range(cand.shape[0]):
        s = cand[ci]
        b = nbytes[s]
        if host_limit > 0 and used + b > host_limit:
            continue
        k = unit_of[s]
        p_h = b / h2d_bps
        ok, last = _h2d_fits(k, p_h, issue, reach0, load, comp, tmp, tol)
        if not ok:
            continue
        ok, total = _d2h_fits(
            save_rank[s], b / d2h_bps, save_time[s], t0, tol, neg, t, add, size, fen, total
        )
        if not ok:
            continue
        load[k] += p_h
        for x in range(k, last - 1, -1):
            comp[x] = tmp[x]
        accepted[n_acc] = s
        n_acc += 1
        used += b
    acc = accepted[:n_acc]
    return acc, _landing_times(acc, nbytes, save_time, save_rank, d2h_bps)


def hidden_offloads(
    flat: FlatProfile, ws: Workspace, legal: np.ndarray, prefetch: int, *, by_producer: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The hidden offload set in acceptance order, and each storage's copy landing time
    (inf outside the set). Candidates go most expensive to recompute per byte first
    (region inputs and root storages, which cannot be recomputed, lead), earlier saves
    first among equals; ``by_producer``: by the producer op's seconds per byte instead, the
    cost of dropping a storage in a region that replays anyway (NOTE [Offload families]).
    ``ws`` lends its replay scratch."""
    n = flat.n_storages
    can_off = (legal & OFFLOAD_BIT) != 0
    if not bool(np.any(can_off)):
        return np.zeros(0, dtype=np.int64), np.full(n, np.inf)
    if by_producer:
        rho = np.full(n, np.inf)  # a storage no op made (an input, a root's) first
        made = flat.st_prod >= 0
        rho[made] = flat.op_sec[flat.st_prod[made]]  # a profile may have no ops at all
    else:
        rho = _standalone_replay(
            flat.st_ptr, legal, flat.last_save, flat.st_prod, flat.op_ptr, flat.op_sec,
            flat.op_serv, flat.op_sink, flat.out_ptr, flat.out_idx, flat.rd_ptr, flat.rd_idx,
            flat.noops, flat.dataflow, flat.fwd_dur, ws.mark, ws.stack, flat.op_host,
            flat.op_view
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        density = np.where(flat.nbytes > 0, rho / np.maximum(flat.nbytes, 1), 0.0)
    cand = np.flatnonzero(can_off & (flat.nbytes > 0))
    rank = np.empty(n, dtype=np.int64)
    rank[flat.save_order] = np.arange(n)
    cand = cand[np.lexsort((rank[cand], -density[cand]))].astype(np.int64)
    # a copy starts no earlier than its group's exit (NOTE [Offload groups]): the unit's
    # end with every unit running its hooks, the host ahead where it can (NOTE [Host time])
    starts, end = issue_ahead(flat.fwd_dur, flat.fwd_host + flat.fwd_hook)
    exits = np.append(starts[1:], end)[flat.unit_of]
    return _hidden_set(
        cand, flat.nbytes, exits, flat.unit_of, rank, flat.t0,
        flat.d2h_bps, flat.h2d_bps, flat.bwd_dur, prefetch, flat.host_limit_bytes
    )
