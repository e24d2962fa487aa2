"""numba helpers shared by the simulator, the lower bound and the solver, the legend of
the kernels' array names (the comment block below), and the hold of Ctrl-C while numba
refreshes its contexts for a kernel load (NOTE [kernel loads]).
"""

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
#   kind       int64  0 activation, 1 region input, 2 external, 3 root, 4 snapshot
#   legal      int64  placements allowed (mask above)
#   last_save  int64  ops of its unit dispatched before its last save (replay prefix
#                     needed to rebuild it)
#   st_prod    int64  producer as a global op index, -1 when unknown
#   st_freed   int64  ops of its unit recorded when its forward freed it, dropped; -1:
#                     unknown (NOTE [Forward transients])
#   outlives   bool   alive past its unit's forward, dropped (NOTE [Forward transients])
#   save_order int64  flat storages by save time (a permutation of 0..n_st-1)
#   save_rank  int64  position of each storage in save_order
#   prod_ptr/prod_ops the ops listing it among their outputs (CSR, n_st + 1 pointers)
# Per unit (shape n_u; st_ptr and op_ptr n_u + 1, CSR row pointers):
#   st_ptr     int64  storages of unit u are st_ptr[u]:st_ptr[u + 1]
#   op_ptr     int64  ops of unit u are op_ptr[u]:op_ptr[u + 1]
#   noops      bool   a region recorded without ops (a replay costs fwd_dur[u])
#   dataflow   bool   replays demand-driven (ops have reads); else by prefix
#   fwd_start  f64    forward start (s) when no group offloads, host time included
#   fwd_dur    f64    forward device seconds
#   fwd_host   f64    forward host seconds (NOTE [Host time] in scheduler.timeline)
#   bwd_dev    f64    backward device seconds, without replay
#   bwd_host   f64    backward host seconds with the unpack cost per save, without
#                     reload issues or replay
#   bwd_dur    f64    max(bwd_dev, bwd_host)
#   fwd_hook, bwd_hook f64  the host seconds a unit adds to fwd_host/bwd_host when a
#                     plan places any of its storages other than KEEP: a region's
#                     replay checkpoint (forward) and, under native keep, its hooks
#                     (0 for the root's units)
#   hooked     bool   a plan places some storage of the unit other than KEEP
# Per op (shape n_ops; out_ptr and rd_ptr n_ops + 1):
#   op_sec     f64    seconds
#   op_serv    bool   servable: skippable, in a region that is not opaque, every output
#                     saved; a replay skips it when those are all KEEP and it is no sink
#   op_sink    bool   has effects beyond its outputs: runs in every replay reaching it
#   op_view    bool   a view: a demand-driven replay runs it whenever it lies before K
#   out_ptr/out_idx   its outputs as flat storages (-1: an output that is not saved)
#   rd_ptr/rd_idx     the earlier ops it reads, global op indices (dataflow units)
#   fixed_from int64  smallest K from which it runs in every replay of its unit
#                     (n_ops + 1: not in every one)
#   op_tr      int64  bytes its region's ops made and never save, alive once it returned
#                     (NOTE [Replay transients] in scheduler.working_set)
# Scalars: t0 end of forward (s) with no group offloading; d2h_bps, h2d_bps link
#   bytes/s (0: no link); op_host dispatch-mode seconds per replayed op; off_h, rel_h,
#   rp_h host seconds per group offload, group reload and replay; host_limit pinned
#   host bytes (0: unlimited); prefetch groups reloaded ahead.
#
# Simulation results (``scheduler.timeline.Workspace``; seconds, -1: none):
#   d2h_start, d2h_end, h2d_start, h2d_end  per storage, its group's copies
#   fstart, fend          per unit, forward start and end under the plan
#   reach                 per unit, when backward reaches it
#   cstart, cend          per unit, its backward compute (replay first) start and end
#   riss                  per unit, when its group reload was issued
#   replay                per unit, replay seconds
#   ev_t, ev_d            memory events: time (s), change of resident bytes (int64)
#   gbytes, goff, g_end   per unit, its group's bytes, whether it offloads, its D2H end
#   rel_u, rel_t          per unit, the unit at whose end its group is freed, and when
# Scratch: mark (bool per op, left all False), stack and level (int64, at least the
#   largest unit's op count).
#
# Lower bound (``scheduler.bound``):
#   seg_x, seg_y  f64 per segment of the regions' drop-cost envelopes: bytes, seconds
#   share      f64 per storage of one region (index s - lo, lo = st_ptr[u]): replay
#              seconds charged to dropping it
#   fixed      f64 (n_ops + 1) by K: seconds that every replay with prefix end K runs
#   px, py     f64 points (bytes dropped, replay seconds) of one region's curve
#   bx, by, slope  breakpoints (bytes, seconds) and slopes (s/byte) of the combined curve
#   budget bytes; max_groups prefix-end groups per region; t_cap latest end of forward
#   of any plan (s)
# Hidden set (``scheduler.solver.hidden``):
#   cand       int64 storages to try, in order
#   h_order    int64 accepted storages, in acceptance order
#   h_land     f64 per storage: when its hidden copy lands (s; inf outside the set)
#   reach0, issue  f64 per unit: backward reaches it without replay or stall; its
#              group's reload is issued (s)
#   load, comp f64 per unit: reload seconds queued; when they complete (s)
#   t, add, size, fen  max-segment tree (values, lazy adds, leaf count) and Fenwick tree
#              over save ranks, in copy seconds
# Chain step (``scheduler.solver.chain``):
#   tstar      the current plan's memory peak time (s); delta bytes to free there; need
#              bytes left after the hidden moves
#   df_price   bool per unit: its drops are priced by the dataflow rule
#   u_tag      int64 per unit: tag of its replay marks (nvis reached, nran runs), 0: none
#   codes      int8 per storage: its placement in ``new``, +3 when dropping it frees
#              bytes at tstar (NOTE [drop cache])
#   way        int64 per unit: its drop-cache way; listed, todo int64 units with a drop
#              option, and those to price
#   opt_*      per option (n_u + n_st slots): opt_ratio f64 seconds per byte, opt_bytes
#              f64, opt_room f64 D2H seconds of room (offloads), opt_kind int64 (0 drop,
#              1 offload), opt_ref int64 (unit or storage), opt_k, opt_cnt int64 (K, items)
#   side_f     f64 [seconds, bytes], side_i int64 [unit, K, items]: the side plan's drop
# Drop pricing (``scheduler.solver.drops``):
#   base, plain  f64 (n_ops_total + n_u), region u's at op_ptr[u] + u + K: its replay's
#              seconds with prefix end K under the dispatch mode (the ops that run) and
#              plainly (every op before K) (NOTE [replay base])
#   k_cur, any_drop  per unit: the prefix end its current drops share; whether it drops
#   join       int64 per op: smallest K at which it runs under ``new`` (n_ops + 1: never)
#   vis, ran, nvis, nran, stamp, sstamp (per op), odrop (per storage)  int64 tags drawn
#              from ctr (a one-element counter), never reset; a mark is current when it
#              equals the tag at hand
# Drop cache (NOTE [drop cache] in scheduler.solver.chain; first index the way w):
#   dc_code    int8 (ways, n_st): codes when the way was priced (-1: never)
#   dc_items   int64 (ways, n_st): per region from st_ptr[u], the storages it may drop,
#              cheapest per byte first (``items`` is one way's row)
#   dc_eff     int64 (ways, n_st): per storage its prefix end K (``eff``: one way's row)
#   dc_f       f64 (ways, n_u, 2): the region's best option, seconds per byte and bytes
#   dc_i       int64 (ways, n_u, 4): item count, K, items dropped, tag of last use
# ------------------------------------------------------------------------------------

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba.core.registry import cpu_target

__all__ = ["argsort", "njit", "njit_inline", "replay_costs", "replay_unit", "served_now"]


def _refresh_whole(refresh: Callable[[], None]) -> Callable[[], None]:
    """``refresh`` of one of numba's contexts, run with SIGINT held on the main thread.

    NOTE [kernel loads]: before it loads or compiles a kernel, numba refreshes
    its typing and target contexts. The first refresh in a process imports numba's
    implementation modules and installs their registries; each later one installs what
    was registered since, reading every registry through a generator. An interrupt
    (Ctrl-C) landing in a refresh leaves a module half imported, whose import then fails
    for good ("duplicate registration"), or a registry's generator ended by the
    exception ("generator raised StopIteration"), and every later kernel load in the
    process fails. Neither can be undone from outside numba, so a Ctrl-C arriving during
    a refresh is held and raised as soon as the refresh ends (the first in a process
    takes about half a second, a later one a fraction of a millisecond); the loading or
    compiling around it may be interrupted, and the next call of the kernel loads it
    again. Signals reach Python
    only on the main thread, and only there can a handler be set: elsewhere the refresh
    runs as it is. A SIGINT handler that is not a Python function (ignored, the default
    action) is left in place.
    """

    def run() -> None:
        if threading.current_thread() is not threading.main_thread():
            refresh()
            return
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):
            refresh()
            return
        held: list[tuple[int, Any]] = []
        signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
        try:
            refresh()
        finally:
            signal.signal(signal.SIGINT, handler)
            if held:
                handler(*held[0])  # the default handler raises KeyboardInterrupt

    return run


# the contexts every kernel is typed and compiled with (NOTE [kernel loads])
for _context in (cpu_target.typing_context, cpu_target.target_context):
    _context.refresh = _refresh_whole(_context.refresh)


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
    """``njit`` for the parts of a kernel: numba inlines them into their callers.

    NOTE [kernel parts]: a part that runs a whole loop costs next to nothing, inlined
    or not; a part that takes arrays and runs once per iteration of a hot loop can
    cost measurably (about 8% of a simulation for a part issuing each backward unit's
    reloads, 2 ms of a 10k-storage solve for parts pricing each region's items and
    options), so the kernels keep such loop bodies in their loop.
    """
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
    """Replay skips op ``j`` under ``place``: servable, not a sink, every output held (KEEP,
    or OFFLOAD: a unit's replay runs after its group's reload, NOTE [Serving from reloads]
    in offrecomp/regenerate.py)."""
    if not op_serv[j] or op_sink[j]:
        return False
    for q in range(out_ptr[j], out_ptr[j + 1]):  # noqa: SIM110 - numba: no generators
        if place[out_idx[q]] == 2:
            return False
    return True


@njit_inline
def replay_unit(
    u, place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx,
    rd_ptr, rd_idx, noops, dataflow, fwd_dur, mark, stack, op_host, op_view
):  # type: ignore[no-untyped-def]
    """Replay seconds of unit ``u`` under ``place`` (see scheduler.profile, replay
    semantics): the cheaper of ``replay_costs``."""
    plain, dispatch = replay_costs(
        u, place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr,
        out_idx, rd_ptr, rd_idx, noops, dataflow, fwd_dur, mark, stack, op_host, op_view
    )
    return min(plain, dispatch)


@njit_inline
def replay_costs(
    u, place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx,
    rd_ptr, rd_idx, noops, dataflow, fwd_dur, mark, stack, op_host, op_view
):  # type: ignore[no-untyped-def]
    """The seconds of the two ways the runtime replays unit ``u`` under ``place``: plainly
    (every op before ``K``) and under the dispatch mode (the ops that run plus
    ``op_host`` seconds for each of the ``K`` ops the mode sees); the runtime takes the
    cheaper, the plain one at a tie. ``mark`` (one bool per op, all False) and ``stack``
    (at least the unit's op count) are scratch for the demand-driven closure; ``mark`` is
    left all False.
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
        return 0.0, 0.0
    if noops[u]:
        return fwd_dur[u], fwd_dur[u]
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
        return plain, total + k * op_host
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
    return plain, total + views + k * op_host
