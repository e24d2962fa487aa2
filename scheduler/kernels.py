"""numba helpers shared by the simulator, the lower bound and the solver.

# ----------------------------------------------------------------------------- legend
#
# The kernels take a profile as flat arrays (``scheduler.flat.FlatProfile``) and use
# the same names for them everywhere. Indices:
#   s  flat storage, 0..n_st-1, grouped by unit (gap 0's root storages, region 0's
#      storages, gap 1's, ...); within a unit by storage (root) index.
#   u  unit, 0..n_u-1 with n_u = 2 * n_regions + 1, in forward order: u = 2k is gap k
#      (root work between region calls), u = 2r + 1 is region r. ``top = n_u - 1``.
#      v and x also name units (v: the one backward is at, x: another one).
#   j  global op index, 0..n_ops-1, grouped by unit (gaps have none); jj = j - j0 is
#      the index within its unit, j0 = op_ptr[u].
#   q  entry of a CSR row (out_idx, rd_idx, prod_ops).
#   K  a replay's prefix end: the ops jj < K of the unit are considered.
#
# Placements (``place``, ``new``, ``side``; int8 per storage): 0 KEEP, 1 OFFLOAD,
# 2 RECOMPUTE (``scheduler.plan.Placement``). Legality masks (``legal``, int64 per
# storage): bit 1 KEEP, 2 OFFLOAD, 4 RECOMPUTE.
#
# Per storage (shape n_st):
#   unit_of    int64  its unit
#   nbytes     int64  bytes
#   save_time  f64    seconds from step start at which it is saved, no group offloading
#   kind       int64  0 activation, 1 region input, 2 external, 3 root
#   legal      int64  placements allowed (mask above)
#   last_save  int64  ops of its unit dispatched before its last save (replay prefix
#                     needed to rebuild it)
#   st_prod    int64  producer as a global op index, -1 when unknown
#   save_order int64  flat storages by save time (a permutation of 0..n_st-1)
#   save_rank  int64  position of each storage in save_order
# Per unit (shape n_u; st_ptr and op_ptr n_u + 1, CSR row pointers):
#   st_ptr     int64  storages of unit u are st_ptr[u]:st_ptr[u + 1]
#   op_ptr     int64  ops of unit u are op_ptr[u]:op_ptr[u + 1]
#   noops      bool   a region recorded without ops (a replay costs fwd_dur[u])
#   dataflow   bool   replays demand-driven (ops have reads); else by prefix
#   fwd_start  f64    forward start, seconds, no group offloading
#   fwd_dur    f64    forward device seconds
#   fwd_host   f64    forward host seconds (NOTE [Host time] in scheduler.timeline)
#   bwd_dev    f64    backward device seconds, without replay
#   bwd_host   f64    backward host seconds, without reloads or replay
#   bwd_dur    f64    max(bwd_dev, bwd_host)
# Per op (shape n_ops; out_ptr and rd_ptr n_ops + 1):
#   op_sec     f64    seconds
#   op_serv    bool   replay may skip it (servable) when all its outputs are kept
#   op_sink    bool   has effects beyond its outputs: runs in every replay reaching it
#   op_view    bool   a view: a demand-driven replay runs it whenever it lies before K
#   out_ptr/out_idx   its outputs as flat storages (-1: an output that is not saved)
#   rd_ptr/rd_idx     the earlier ops it reads, global op indices (dataflow units)
#   fixed_from int64  smallest K from which it runs in every replay (n_ops + 1: never)
#   prod_ptr/prod_ops per storage (n_st + 1 pointers), the ops listing it as output
# Scalars: t0 end of forward (s) with no group offloading; d2h_bps, h2d_bps link
#   bytes/s (0: no link); op_host dispatch-mode seconds per replayed op; off_h, rel_h,
#   rp_h host seconds per group offload, group reload and replay; host_limit pinned
#   host bytes (0: unlimited); prefetch groups reloaded ahead.
#
# Simulation results (``scheduler.timeline.Workspace``; seconds, -1 where none):
#   d2h_start, d2h_end, h2d_start, h2d_end  per storage, its group's copies
#   fstart, fend          per unit, forward start and end under the plan
#   reach                 per unit, when backward reaches it
#   cstart, cend          per unit, its backward compute (replay first) start and end
#   riss                  per unit, when its group reload was issued
#   replay                per unit, replay seconds
#   ev_t, ev_d            memory events: time (s), change of resident bytes (int64)
#   gbytes, goff, g_end   per unit, its group's bytes, whether it offloads, its D2H end
# Scratch: mark (bool per op, left all False) and stack (int64, at least the largest
#   unit's op count); the solver's tag arrays (join, vis, ran, nvis, nran, stamp,
#   sstamp per op, odrop per storage) hold tags drawn from ``ctr`` (a one-element
#   counter), never reset; the drop cache arrays dc_* (NOTE [drop cache] in
#   scheduler.solver.chain).
# ------------------------------------------------------------------------------------
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

__all__ = ["argsort", "njit", "njit_inline", "replay_unit", "served_now"]


def njit(fn: Any) -> Any:
    """``numba.njit(cache=True)``, or uncached when no cache location is writable.

    NOTE [numba cache]: numba looks for a writable cache directory when the decorator
    runs (next to the source, then ``NUMBA_CACHE_DIR`` / the user cache dir) and raises
    RuntimeError when there is none, e.g. in a read-only install. The planner must work
    there too; it then compiles on first use in each process.
    """
    try:
        return numba.njit(cache=True)(fn)
    except RuntimeError:
        return numba.njit(cache=False)(fn)


def njit_inline(fn: Any) -> Any:
    """``njit`` for small kernels called in hot loops: numba inlines them into callers."""
    try:
        return numba.njit(cache=True, inline="always")(fn)
    except RuntimeError:
        return numba.njit(cache=False, inline="always")(fn)


@njit
def argsort(keys):  # type: ignore[no-untyped-def]
    """Stable argsort of a float64 array (bottom-up merge sort).

    Used instead of ``np.argsort``/``np.unique`` inside kernels: numba compiles those
    generically and each adds seconds to a cold start.
    """
    n = keys.shape[0]
    a = np.arange(n)
    b = np.empty(n, dtype=np.int64)
    width = 1
    while width < n:
        i = 0
        while i < n:
            mid = min(i + width, n)
            hi = min(i + 2 * width, n)
            p, q, k = i, mid, i
            while p < mid and q < hi:
                if keys[a[q]] < keys[a[p]]:
                    b[k] = a[q]
                    q += 1
                else:
                    b[k] = a[p]
                    p += 1
                k += 1
            while p < mid:
                b[k] = a[p]
                p += 1
                k += 1
            while q < hi:
                b[k] = a[q]
                q += 1
                k += 1
            i += 2 * width
        a, b = b, a
        width *= 2
    return a


# ----------------------------------------------------------------------------- replay


@njit_inline
def served_now(j, place, op_serv, op_sink, out_ptr, out_idx):  # type: ignore[no-untyped-def]
    """Replay skips op ``j`` under ``place``: servable, not a sink, every output KEEP."""
    if not op_serv[j] or op_sink[j]:
        return False
    for q in range(out_ptr[j], out_ptr[j + 1]):  # noqa: SIM110 - numba: no generators
        if place[out_idx[q]] != 0:
            return False
    return True


@njit_inline
def replay_unit(
    u, place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx,
    rd_ptr, rd_idx, noops, dataflow, fwd_dur, mark, stack, op_host, op_view
):  # type: ignore[no-untyped-def]
    """Replay seconds of unit ``u`` under ``place`` (see scheduler.profile, replay semantics).

    The cheaper of the two ways the runtime replays: under the dispatch mode (the ops
    that run plus ``op_host`` seconds for each of the ``K`` ops the mode sees) or plainly
    (every op before ``K``). ``mark`` (one bool per op, all False) and ``stack`` (at least
    the unit's op count) are scratch for the demand-driven closure; ``mark`` is left all
    False.
    """
    k = 0
    dropped = False
    unknown = False
    for s in range(st_ptr[u], st_ptr[u + 1]):
        if place[s] == 2:
            dropped = True
            if last_save[s] > k:
                k = last_save[s]
            if st_prod[s] < 0:
                unknown = True
    if not dropped:
        return 0.0
    if noops[u]:
        return fwd_dur[u]
    n = op_ptr[u + 1] - op_ptr[u]
    if k > n:
        k = n
    j0 = op_ptr[u]
    end = j0 + k
    total = 0.0
    plain = 0.0
    for j in range(j0, end):
        plain += op_sec[j]
    if not dataflow[u] or unknown:
        # prefix semantics: every op before K runs unless served
        for j in range(j0, end):
            if not served_now(j, place, op_serv, op_sink, out_ptr, out_idx):
                total += op_sec[j]
        return min(plain, total + k * op_host)
    # demand-driven: closure of the dropped storages' producers and the sinks before K;
    # the views before K run too, and the closure never enters them
    for j in range(j0, end):
        if op_view[j]:
            mark[j] = True
    top = 0
    for s in range(st_ptr[u], st_ptr[u + 1]):
        if place[s] == 2:
            p = st_prod[s]
            if p < end and not mark[p]:
                mark[p] = True
                stack[top] = p
                top += 1
    for j in range(j0, end):
        if op_sink[j] and not mark[j]:
            mark[j] = True
            stack[top] = j
            top += 1
    i = 0
    while i < top:
        j = stack[i]
        i += 1
        if served_now(j, place, op_serv, op_sink, out_ptr, out_idx):
            continue
        total += op_sec[j]
        for q in range(rd_ptr[j], rd_ptr[j + 1]):
            r = rd_idx[q]
            if r < end and not mark[r]:
                mark[r] = True
                stack[top] = r
                top += 1
    for i in range(top):
        mark[stack[i]] = False
    views = 0.0
    for j in range(j0, end):
        if op_view[j]:
            mark[j] = False
            views += op_sec[j]
    return min(plain, total + views + k * op_host)
