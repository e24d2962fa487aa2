"""Timeline of a plan: compute stream, D2H copy stream, H2D copy stream, memory over time.

The model (see docs/planner.md for the picture):

* **Units.** The step's forward is cut into units in forward order: a root gap (work
  saved outside every region, e.g. embedding), region 0, gap, region 1, ..., region n-1,
  and a final gap (e.g. LM head and loss). Unit ``2k`` is gap ``k``, unit ``2r+1`` is
  region ``r``. Regions keep their measured start times when those form a consistent
  timeline; otherwise they run back to back and the root forward time
  (``profile.forward_seconds`` minus the regions' sum) is spread evenly over the gaps.
  Root backward time is spread over the gaps in proportion to their forward time.
* **Forward.** The host issues the units in order, ahead of the device where it can; a
  unit ends no earlier than its device time after its start nor than the host's end of
  it (NOTE [Host time]). A storage is saved at its unit's start plus ``offset_seconds``
  (root storages: step start plus ``offset_seconds``, moved by the host time the units
  before theirs add) and is resident from then on unless it is dropped (RECOMPUTE).
* **D2H** (NOTE [Offload groups]). The OFFLOAD storages of one unit form a group: a
  region call's, or a gap's (one run of root saves, closed by the next region call or
  by backward). The group's copy is issued when its unit exits and runs FIFO on one
  stream: it starts at ``max(exit, end of the previous copy)`` and takes ``sum(nbytes)
  / (d2h_gbps * 1e9)``. The group's device storages are freed at the end of the first
  unit of forward to end once its copy landed (the runtime lets go of them at unit
  ends: NOTE [Planned release] in offrecomp/groups.py); a copy that lands after the
  last unit's end is waited for at backward's start, which frees its group.
* **Backward.** Units run in reverse from backward's start: the end of forward, or the
  landing of the last copy, when later. Unit ``v`` is *reached* when the previous
  unit's backward ends (the first at backward's start). Reaching a unit whose group
  offloads reloads that group unless it was issued already, and issues the reloads of
  the next ``prefetch_regions`` groups below it that offload (skipping units with
  nothing offloaded), where not issued yet. A reload is one H2D copy of the group, FIFO in issue order, starting at
  ``max(issue, end of the previous reload, the group's D2H landing)``. A unit's compute
  starts once it is reached and its reload has landed (the wait is *stall*); it takes
  the longer of ``replay_seconds + backward_seconds`` and its host time.
* **Memory** (activation bytes only). KEEP: from save until its unit's backward ends,
  or until its replay starts when every save of it came after the replay's prefix
  (NOTE [Frees before a replay]). OFFLOAD: from save until its group is freed (above),
  and again from the group's reload issue until its unit's backward ends (continuously
  when it is freed no earlier than the reload is issued). RECOMPUTE: only during its
  unit's backward (the replay working set), with what the replay holds beyond it while
  it runs (NOTE [Replay transients] in scheduler.working_set). A KEEP storage the
  program holds past backward's end (``StorageRecord.held``) stays until backward ends
  (NOTE [Held past backward]). At equal times, frees are applied before allocations.

NOTE [Held past backward]: the runtime's books count a kept storage until its
allocation dies, and autograd lets go of a saved tensor when its node has run; what
else holds the storage decides when it dies. A training loop's ``out = model(x); loss =
F.mse_loss(out, y)`` keeps ``out`` and ``y`` referenced until after ``backward()``
returns, so the two storages the loss saved stay through the whole backward, replays
included; so does a block output the loop keeps in a list. The runtime marks a
storage it finds alive when a measured pass's backward ends (``StorageRecord.held``);
such a storage is resident from its save until backward's end under every plan, and
is only KEEP: dropping or offloading it would free nothing the program holds, so the
solver never takes it as a candidate.

NOTE [Frees before a replay]: a unit that drops storages replays ops ``0..K-1``, ``K`` the
largest ``last_save_op`` among them, when backward first reads one of them: at the node
of op ``K-1``. Autograd has run the nodes of the ops after it by then and freed what
they saved, so under a plain replay a KEEP storage whose first save came after the
prefix (``first_save_op > K``) is gone before the replay's working set arrives. A
serving replay (the cheaper one where ``replay_costs`` says so) serves from the call's
kept storages, which the runtime holds until the call's backward ends, as it does every
storage of a unit that replays nothing. A profile that leaves ``first_save_op`` at 0
frees nothing early.

NOTE [Offload groups]: this is the runtime's offload engine, step for step: pack only
records an OFFLOAD storage in its group; at the region's exit the group is copied as
one unit; the plan's ``releases`` (the units whose ends free each group, computed here)
tell the runtime where to let go of a group's device storages, with compute waiting
on its copy there, which costs nothing where the copy landed as predicted; backward's
start waits only for the copies this model has still in flight then (the in-flight
window, which a plan sets to its own offloaded bytes, never binds); the first unpack
of a group's storage reloads the group and issues the next groups' reloads; the group
is released when its unit's backward ends.

NOTE [Host time]: in forward the host issues the units one after another and runs ahead
of the device where it can: a unit starts on the device once the device ended the unit
before and the host began issuing it, and ends no earlier than its device time after
that nor than the host's end of issuing it. So host time a unit adds (its hooks, its
checkpoint, its group's issue) costs step time only where the host's lead does not cover
it (at 8K tokens on an H200 an offloading plan's host ended its 57 ms forward some 14 ms
ahead of the device). In backward a unit's time is the longer of its device time and
its host time. The host time of a region's forward is ``RegionRecord.host_seconds``
(where measured; else its device time, as on CPU, where host and device are one) plus,
per saved tensor,
``Profile.pack_host_seconds``, plus ``offload_host_seconds`` when its group offloads,
plus ``capture_host_seconds`` when the plan does not keep it whole (its entry takes a
replay checkpoint); gaps take their device time plus the pack cost of their root
saves. In backward: the unit's ``backward_host_seconds`` (or device time) plus
``unpack_host_seconds`` per save, ``reload_host_seconds`` per group reload it issues,
and ``replay_seconds`` plus ``replay_host_seconds`` when it replays. Under
``Profile.native_keep`` a region that the plan keeps whole pays neither hook: its
saves go through autograd's own saved variables (the runtime's NOTE [Native keep]);
the root's saves always pay them. Where
no host time is measured and every host cost is 0, each unit takes its device time,
bit for bit as without the host model.

``lower_bound`` (scheduler.bound) is a relaxation of this model; its derivation is in
its docstring. The kernels' array names are the legend's in ``scheduler.kernels``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from scheduler.flat import ARGUMENT, KIND_SNAPSHOT, RETURNED, FlatProfile, flatten, placement_array
from scheduler.kernels import njit, njit_inline, replay_costs
from scheduler.plan import Placement, Plan
from scheduler.profile import INPUT_LOOKBACK, Profile
from scheduler.working_set import forward_events, unit_replay_transient

__all__ = [
    "Interval",
    "SimResult",
    "Timeline",
    "Workspace",
    "check_prefetch",
    "simulate",
]


# ------------------------------------------------------------------------------ kernels


@njit_inline
def _groups(place, unit_of, nbytes, n_u):  # type: ignore[no-untyped-def]
    """Per unit its group's offloaded bytes, whether it offloads (NOTE [Offload
    groups]) and whether it places any storage other than KEEP (its saves then run the
    hooks under native keep)."""
    gbytes = np.zeros(n_u, dtype=np.int64)
    goff = np.zeros(n_u, dtype=np.bool_)
    hooked = np.zeros(n_u, dtype=np.bool_)
    for s in range(nbytes.shape[0]):
        if place[s] != 0:
            hooked[unit_of[s]] = True
            if place[s] == 1:
                goff[unit_of[s]] = True
                gbytes[unit_of[s]] += nbytes[s]
    return gbytes, goff, hooked


@njit_inline
def _forward(goff, hooked, fwd_start, fwd_dur, fwd_host, fwd_hook, t0, off_h, fstart, fend):  # type: ignore[no-untyped-def]
    """Forward start and end of each unit into ``fstart``/``fend``; returns the end of
    forward. The host issues the units one after another and the device runs each once
    the host began issuing it, ending no earlier than the host's end of it (NOTE [Host
    time]); issuing a unit's group offload is host time at its exit, and the hooks of a
    unit not kept whole are host time under native keep. ``fwd_start`` and ``t0`` are
    the layout without either (``layout.host_times``: the same recurrence, run here
    again alongside, so that a plan adding nothing moves nothing, bit for bit)."""
    db = 0.0  # the layout's recurrence: device end ...
    hb = 0.0  # ... and host end
    d = 0.0  # the plan's
    h = 0.0
    for u in range(fwd_dur.shape[0]):
        sb = db if db >= hb else hb
        hb = hb + fwd_host[u]
        eb = sb + fwd_dur[u]
        db = eb if eb >= hb else hb
        s = d if d >= h else h
        host = fwd_host[u]
        if hooked[u]:
            host += fwd_hook[u]
        if goff[u]:
            host += off_h
        h = h + host
        e = s + fwd_dur[u]
        fstart[u] = fwd_start[u] + (s - sb)
        if e >= h:
            d = e
            fend[u] = fstart[u] + fwd_dur[u]
        else:
            d = h
            fend[u] = fstart[u] + (h - s)
    return t0 + (d - db)


@njit_inline
def _offload_copies(place, unit_of, gbytes, goff, fend, d2h_bps, d2h_start, d2h_end):  # type: ignore[no-untyped-def]
    """D2H: one copy per group, issued at its unit's exit, FIFO in forward order. Fills
    each storage's copy times (-1: not offloaded); returns each group's landing time and
    the bytes copied."""
    n_u = gbytes.shape[0]
    free = 0.0
    d2h_bytes = 0
    g_start = np.zeros(n_u)
    g_end = np.zeros(n_u)
    for u in range(n_u):
        if goff[u]:
            st = max(fend[u], free)
            en = st + gbytes[u] / d2h_bps
            g_start[u] = st
            g_end[u] = en
            free = en
            d2h_bytes += gbytes[u]
    for s in range(place.shape[0]):
        if place[s] == 1:
            d2h_start[s] = g_start[unit_of[s]]
            d2h_end[s] = g_end[unit_of[s]]
        else:
            d2h_start[s] = -1.0
            d2h_end[s] = -1.0
    return g_end, d2h_bytes


@njit_inline
def _releases(goff, g_end, fend, t_fwd, rel_u, rel_t):  # type: ignore[no-untyped-def]
    """Where each offloading unit's group is freed (NOTE [Offload groups]): at the end
    of the first unit to end once its copy landed, or at backward's start, which waits
    for the copies still in flight then. Fills ``rel_u`` (the unit; a unit that offloads
    nothing: itself) and ``rel_t`` (the time); returns backward's start."""
    n_u = goff.shape[0]
    top = n_u - 1
    t_b = t_fwd
    v = 0
    for u in range(n_u):
        rel_u[u] = u
        rel_t[u] = fend[u]
        if goff[u]:
            v = max(v, u)
            while v < top and fend[v] < g_end[u]:
                v += 1
            rel_u[u] = v
            if v == top:
                t_b = max(t_b, g_end[u])
            else:
                rel_t[u] = fend[v]
    for u in range(n_u):
        if goff[u] and rel_u[u] == top:
            rel_t[u] = t_b
    return t_b


@njit_inline
def _replays(
    place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx,
    rd_ptr, rd_idx, noops, dataflow, fwd_dur, mark, stack, op_host, op_view, replay, plain
):  # type: ignore[no-untyped-def]
    """Replay seconds of each unit into ``replay``, and whether it replays plainly into
    ``plain``; returns their sum."""
    recompute = 0.0
    for u in range(fwd_dur.shape[0]):
        replay[u] = 0.0
        plain[u] = False
        for s in range(st_ptr[u], st_ptr[u + 1]):
            if place[s] == 2:  # the call is not free: only where something is dropped
                seconds, dispatch = replay_costs(
                    u, place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink,
                    out_ptr, out_idx, rd_ptr, rd_idx, noops, dataflow, fwd_dur, mark, stack,
                    op_host, op_view
                )
                plain[u] = seconds <= dispatch
                replay[u] = seconds if plain[u] else dispatch
                break
        recompute += replay[u]
    return recompute


@njit_inline
def _backward(
    place, prefetch, st_ptr, gbytes, goff, hooked, g_end, replay, bwd_dev, bwd_host, bwd_hook,
    rel_h, rp_h, h2d_bps, t_fwd, h2d_start, h2d_end, reach, cstart, cend, riss
):  # type: ignore[no-untyped-def]
    """Backward, units in reverse from ``t_fwd`` (backward's start: ``_releases``).
    Reaching a unit whose group offloads reloads that group unless issued already, and
    the next ``prefetch`` offloading groups below it, one H2D copy each, FIFO (NOTE
    [Offload groups]). Fills reach, cstart, cend, riss and the storages' reload times;
    returns (step end, stall, bytes reloaded, per unit the unit whose reach issued its
    group's reload)."""
    n_u = gbytes.shape[0]
    top = n_u - 1
    ready = np.zeros(n_u)
    by = np.zeros(n_u, dtype=np.int64)
    for u in range(n_u):
        riss[u] = -1.0
    h2d_free = 0.0
    h2d_bytes = 0
    stall = 0.0
    t = t_fwd
    for v in range(top, -1, -1):
        reach[v] = t
        issued = 0
        if goff[v]:
            seen = -1
            x = v
            while x >= 0 and seen < prefetch:
                if goff[x]:
                    seen += 1
                    if riss[x] < 0.0:
                        riss[x] = t
                        by[x] = v
                        st = max(t, h2d_free, g_end[x])
                        en = st + gbytes[x] / h2d_bps
                        h2d_free = en
                        ready[x] = en
                        h2d_bytes += gbytes[x]
                        issued += 1
                        for s in range(st_ptr[x], st_ptr[x + 1]):
                            if place[s] == 1:
                                h2d_start[s] = st
                                h2d_end[s] = en
                x -= 1
        for s in range(st_ptr[v], st_ptr[v + 1]):
            if place[s] != 1:
                h2d_start[s] = -1.0
                h2d_end[s] = -1.0
        cs = max(t, ready[v])
        stall += cs - t
        cstart[v] = cs
        cend[v] = cs + replay[v] + bwd_dev[v]
        host = bwd_host[v] + issued * rel_h
        if hooked[v]:
            host += bwd_hook[v]
        if replay[v] > 0.0:
            host += rp_h
        h_end = cs + replay[v] + host
        if h_end > cend[v]:
            cend[v] = h_end
        t = cend[v]
    return t, stall, h2d_bytes, by


@njit_inline
def _counted_once(place, save_order, allocation, kind, unsaved, hooked, unit_of, native, positions):  # type: ignore[no-untyped-def]
    """Per storage: a kept record whose allocation another record counts, as the
    runtime's books do. ``allocation``: each storage's first record of its allocation.

    * A kept region input of a unit kept whole that no op of it saves (``unsaved``), or
      a snapshot of such a unit: the unit takes no replay checkpoint, and its ops hold
      no such storage (a snapshot is the checkpoint's alone: NOTE [Replay and module
      state] in offrecomp/buffers.py).
    * A kept region input that an op of a unit kept whole saves, one of its call's tensor
      arguments (``positions`` & ARGUMENT: the runtime's calls kept whole find only
      those), after a counted kept record of its allocation in the root or a unit with
      records (``seen``), or a saved argument or returned storage of a unit kept whole
      (``whole``): NOTE [Whole calls counted once] in offrecomp/shared.py. Such an
      argument counts for the units after it (``whole``), as a storage such a unit
      returns (``positions`` & RETURNED) does.
    * A kept region input (NOTE [Inputs counted once] in offrecomp/shared.py) of a unit
      with a replay checkpoint (one the plan does not keep whole) whose allocation's
      latest record before it is kept, in the root or in one of the INPUT_LOOKBACK
      region calls before: the runtime finds such a record and the one it shares, which
      counts. A record exists in the root and in units with hooks (a region kept whole
      saves natively under native keep, without records, and takes no checkpoint). Else
      after a saved argument or returned storage of a unit kept whole (``whole``).
    * Any other kept record (NOTE [Activations counted once]) after a counted kept
      record of the same allocation, both in the root or in units the plan does not
      keep whole (a region kept whole may save natively, so its records share nothing
      under native keep or not), or after ``whole``.
    """
    n = place.shape[0]
    once = np.zeros(n, dtype=np.bool_)
    seen = np.zeros(n, dtype=np.bool_)
    whole = np.zeros(n, dtype=np.bool_)  # per allocation: a unit kept whole counts it
    last_unit = np.full(n, -1, dtype=np.int64)  # per allocation: the unit of its latest record
    last_kept = np.zeros(n, dtype=np.bool_)  # ... and whether that record is kept
    for i in range(n):
        s = save_order[i]
        u = unit_of[s]
        first = allocation[s]
        if kind[s] == KIND_SNAPSHOT:  # counted with the checkpoint, alone in its allocation
            once[s] = not hooked[u]
            continue
        if kind[s] == 1 and not hooked[u]:  # no checkpoint: no input record
            if unsaved[s]:
                once[s] = True
                continue
            if positions[s] & ARGUMENT:
                once[s] = seen[first] or whole[first]
                whole[first] = True
            if not native:  # an op saves it, through the hooks: a record of it
                last_unit[first] = u
                last_kept[first] = True
            continue
        if u % 2 == 1 and not hooked[u] and positions[s] & RETURNED:
            whole[first] = True
        if place[s] == 0 and (kind[s] == 1 or u % 2 == 0 or hooked[u]):
            if kind[s] == 1:
                v = last_unit[first]
                if (v >= 0 and last_kept[first] and (v % 2 == 0 or u - v <= 2 * INPUT_LOOKBACK)) or whole[first]:
                    once[s] = True
            elif seen[first] or whole[first]:
                once[s] = True
            if not once[s]:
                seen[first] = True
        if u % 2 == 0 or hooked[u] or not native:  # a record the runtime holds
            last_unit[first] = u
            last_kept[first] = place[s] == 0
    return once


@njit_inline
def _event_streams(
    place, save_order, st_ptr, unit_of, nbytes, goff, gbytes, rel_t, by, reach,
    cstart, cend, riss, last_save, first_save, plain, noops, allocation, kind, unsaved, hooked, native,
    replay, st_prod, op_ptr, op_tr, level, held, st_freed, positions
):  # type: ignore[no-untyped-def]
    """The four memory event streams of NOTE [memory merge], each sorted by time: saves
    (storages ``s1[:n1]``), group releases (storages ``s2[:n2]``), allocations
    (``s3t``/``s3b``: time, bytes): two per unit in forward, then backward allocations
    and a replay's transients, four per unit (NOTE [Replay transients]), and frees
    (``s4t``/``s4b``): one per unit in forward and one at its end, then backward's (NOTE
    [Frees before a replay]). The forward entries are left empty, for
    ``forward_events`` (NOTE [Forward transients], both in scheduler.working_set)."""
    n_st = nbytes.shape[0]
    n_u = gbytes.shape[0]
    top = n_u - 1
    s1 = np.empty(n_st, dtype=np.int64)
    s2 = np.empty(n_st, dtype=np.int64)
    n1 = 0
    n2 = 0
    once = _counted_once(place, save_order, allocation, kind, unsaved, hooked, unit_of, native, positions)
    for i in range(n_st):
        s = save_order[i]
        if nbytes[s] == 0 or place[s] == 2 or once[s]:
            continue
        s1[n1] = s
        n1 += 1
    for s in range(n_st):  # flat order is forward unit order: releases in time order
        if place[s] == 1 and nbytes[s] > 0 and rel_t[unit_of[s]] < riss[unit_of[s]]:
            s2[n2] = s
            n2 += 1
    f3 = 2 * n_u  # forward entries of the allocations ...
    f4 = n_u + 1  # ... and of the frees
    s3t = np.empty(f3 + 4 * n_u)
    s3b = np.zeros(f3 + 4 * n_u, dtype=np.int64)
    s4t = np.empty(f4 + n_u)
    s4b = np.zeros(f4 + n_u, dtype=np.int64)
    for x in range(n_u):
        # a reload allocates at its issue; a group still on the device then stays
        if goff[x] and rel_t[x] < riss[x]:
            s3b[f3 + 4 * (top - by[x])] += gbytes[x]
    n3 = f3
    for v in range(top, -1, -1):
        s3t[n3] = reach[v]
        k = 0  # the replay's prefix: ops 0..k-1
        for s in range(st_ptr[v], st_ptr[v + 1]):
            if place[s] == 2:
                s3b[n3 + 2] += nbytes[s]
                k = max(k, last_save[s])
        if k > 0:  # held from the replay's start to its end, beside what it brings back
            extra = unit_replay_transient(
                v, k, plain[v], place, st_ptr, nbytes, st_prod, first_save, st_freed, op_ptr, op_tr, level
            )
            s3b[n3 + 2] += extra
            s3b[n3 + 3] -= extra
        if noops[v] or not plain[v]:
            # only a plain replay leaves the kept storages past its prefix to autograd;
            # a serving replay holds them to serve from
            k = 0
        for s in range(st_ptr[v], st_ptr[v + 1]):
            if once[s]:
                continue
            if held[s] and place[s] == 0:  # NOTE [Held past backward]: the last unit's end
                s4b[f4 + top] += nbytes[s]
            elif k > 0 and place[s] == 0 and first_save[s] > k:
                # read by backward before the replay starts; a free in this stream, so
                # that it follows saves at the same time (the last unit's, at T0)
                s3b[n3 + 1] -= nbytes[s]
            else:
                s4b[f4 + top - v] += nbytes[s]
        s3t[n3 + 1] = cstart[v]
        s3t[n3 + 2] = cstart[v]
        s3t[n3 + 3] = cstart[v] + replay[v]
        n3 += 4
        s4t[f4 + top - v] = cend[v]
    return s1, n1, s2, n2, s3t, s3b, n3, s4t, s4b


@njit_inline
def _merge_events(
    s1, n1, s2, n2, s3t, s3b, n3, s4t, s4b, unit_of, nbytes, save_time, fstart, fwd_start,
    rel_t, ev_t, ev_d
):  # type: ignore[no-untyped-def]
    """Merge the event streams into ``ev_t``/``ev_d``, frees first at equal times (a
    save's time moves with its unit's forward start). Returns (events, peak bytes, when
    the peak is first reached)."""
    inf = np.inf
    n4 = s4t.shape[0]
    i1 = 0
    i2 = 0
    i3 = 0
    i4 = 0
    n_ev = 0
    run = 0
    peak = 0
    peak_t = 0.0
    while True:
        t1 = save_time[s1[i1]] + (fstart[unit_of[s1[i1]]] - fwd_start[unit_of[s1[i1]]]) if i1 < n1 else inf
        t2 = rel_t[unit_of[s2[i2]]] if i2 < n2 else inf
        t3 = s3t[i3] if i3 < n3 else inf
        t4 = s4t[i4] if i4 < n4 else inf
        tf = min(t2, t4)
        ta = min(t1, t3)
        if tf == inf and ta == inf:
            break
        if tf <= ta:
            if t2 <= t4:
                t = t2
                d = -nbytes[s2[i2]]
                i2 += 1
            else:
                t = t4
                d = -s4b[i4]
                i4 += 1
        elif t1 <= t3:
            t = t1
            d = nbytes[s1[i1]]
            i1 += 1
        else:
            t = t3
            d = s3b[i3]
            i3 += 1
        if d == 0:
            continue
        run += d
        ev_t[n_ev] = t
        ev_d[n_ev] = d
        n_ev += 1
        if run > peak:
            peak = run
            peak_t = t
    return n_ev, peak, peak_t


@njit
def run_timeline(
    place, prefetch, save_order, st_ptr, unit_of, nbytes, save_time, last_save, first_save, st_prod,
    op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, noops, dataflow,
    fwd_dur, fwd_start, fwd_host, fwd_hook, bwd_dev, bwd_host, bwd_hook, t0, d2h_bps, h2d_bps,
    off_h, rel_h, rp_h, allocation, kind, unsaved, native, d2h_start, d2h_end, h2d_start, h2d_end, reach, cstart,
    cend, fstart, fend, riss, replay, plain, ev_t, ev_d, mark, stack, op_host, op_view, rel_u, rel_t, op_tr, level,
    held, st_freed, outlives, positions
):  # type: ignore[no-untyped-def]
    """Simulate one step; fills the per-storage/per-unit arrays (``plain[u]``: unit ``u``
    replays plainly) and the memory events.

    Returns (step, peak, peak_time, stall, recompute, d2h_bytes, h2d_bytes, n_events,
    forward end); ``ev_t[:n_events]``/``ev_d[:n_events]`` hold the memory events sorted
    by time, frees first at equal times. ``riss[u]`` is when unit ``u``'s group reload
    was issued (-1: it offloads nothing).
    """
    gbytes, goff, hooked = _groups(place, unit_of, nbytes, fwd_dur.shape[0])
    t_fwd = _forward(goff, hooked, fwd_start, fwd_dur, fwd_host, fwd_hook, t0, off_h, fstart, fend)
    g_end, d2h_bytes = _offload_copies(
        place, unit_of, gbytes, goff, fend, d2h_bps, d2h_start, d2h_end
    )
    t_b = _releases(goff, g_end, fend, t_fwd, rel_u, rel_t)
    recompute = _replays(
        place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx,
        rd_ptr, rd_idx, noops, dataflow, fwd_dur, mark, stack, op_host, op_view, replay, plain
    )
    step, stall, h2d_bytes, by = _backward(
        place, prefetch, st_ptr, gbytes, goff, hooked, g_end, replay, bwd_dev, bwd_host, bwd_hook,
        rel_h, rp_h, h2d_bps, t_b, h2d_start, h2d_end, reach, cstart, cend, riss
    )
    # NOTE [memory merge]: four event streams, each already sorted by time: saves (save
    # order), group releases (in forward order), allocations (forward transients at their
    # unit's forward start and the dropped storages outliving it at its end, then in
    # backward reloads at issue, replay working sets at compute start, a replay's
    # transients going at its end) and frees (forward transients at their unit's forward
    # end, the storages outliving their units at the forward's end, then backward's at
    # unit ends). They are merged with frees first at equal times, so no sort is needed.
    s1, n1, s2, n2, s3t, s3b, n3, s4t, s4b = _event_streams(
        place, save_order, st_ptr, unit_of, nbytes, goff, gbytes, rel_t, by, reach,
        cstart, cend, riss, last_save, first_save, plain, noops, allocation, kind, unsaved, hooked, native,
        replay, st_prod, op_ptr, op_tr, level, held, st_freed, positions
    )
    forward_events(
        s3t, s3b, s4t, s4b, place, st_ptr, nbytes, st_prod, st_freed, last_save, op_ptr, op_tr, level, fstart, fend,
        save_time, fwd_start, outlives, t_fwd
    )
    n_ev, peak, peak_t = _merge_events(
        s1, n1, s2, n2, s3t, s3b, n3, s4t, s4b, unit_of, nbytes, save_time, fstart, fwd_start,
        rel_t, ev_t, ev_d
    )
    return step, peak, peak_t, stall, recompute, d2h_bytes, h2d_bytes, n_ev, t_fwd


# ------------------------------------------------------------------------------- driver


class SimResult(NamedTuple):
    step: float
    peak: int
    peak_time: float
    stall: float
    recompute: float
    d2h_bytes: int
    h2d_bytes: int
    forward: float = 0.0
    """End of forward (start of backward) under the plan."""


class Workspace:
    """Preallocated arrays for repeated simulations of one flat profile."""

    def __init__(self, flat: FlatProfile) -> None:
        n, u = flat.n_storages, flat.n_units
        self.flat = flat
        self.d2h_start = np.zeros(n)
        self.d2h_end = np.zeros(n)
        self.h2d_start = np.zeros(n)
        self.h2d_end = np.zeros(n)
        self.reach = np.zeros(u)
        self.cstart = np.zeros(u)
        self.cend = np.zeros(u)
        self.fstart = np.zeros(u)
        self.fend = np.zeros(u)
        self.riss = np.zeros(u)
        self.replay = np.zeros(u)
        self.plain = np.zeros(u, dtype=np.bool_)
        self.rel_u = np.zeros(u, dtype=np.int64)
        self.rel_t = np.zeros(u)
        self.ev_t = np.zeros(2 * n + 8 * u + 2)
        self.ev_d = np.zeros(2 * n + 8 * u + 2, dtype=np.int64)
        self.mark = np.zeros(flat.op_sec.shape[0], dtype=np.bool_)
        self.stack = np.zeros(max(flat.max_unit_ops, 1), dtype=np.int64)
        self.level = np.zeros(max(flat.max_unit_ops, 1), dtype=np.int64)
        self.n_events = 0

    def run(self, place: np.ndarray, prefetch: int) -> SimResult:
        f = self.flat
        # a link of 0 is only reachable with no OFFLOAD placement (check_legal)
        d2h = f.d2h_bps if f.d2h_bps > 0 else 1.0
        h2d = f.h2d_bps if f.h2d_bps > 0 else 1.0
        out = run_timeline(
            place, prefetch, f.save_order, f.st_ptr, f.unit_of, f.nbytes, f.save_time,
            f.last_save, f.first_save, f.st_prod, f.op_ptr, f.op_sec, f.op_serv, f.op_sink, f.out_ptr,
            f.out_idx, f.rd_ptr, f.rd_idx, f.noops, f.dataflow, f.fwd_dur, f.fwd_start,
            f.fwd_host, f.fwd_hook, f.bwd_dev, f.bwd_host, f.bwd_hook, f.t0, d2h, h2d,
            f.offload_host, f.reload_host,
            f.replay_host, f.allocation, f.kind, f.unsaved, f.native_keep, self.d2h_start, self.d2h_end, self.h2d_start, self.h2d_end,
            self.reach, self.cstart, self.cend, self.fstart, self.fend, self.riss, self.replay, self.plain,
            self.ev_t, self.ev_d, self.mark, self.stack, f.op_host, f.op_view, self.rel_u, self.rel_t,
            f.op_tr, self.level, f.held, f.st_freed, f.outlives, f.positions
        )
        self.n_events = int(out[7])
        return SimResult(
            float(out[0]),
            int(out[1]),
            float(out[2]),
            float(out[3]),
            float(out[4]),
            int(out[5]),
            int(out[6]),
            float(out[8]),
        )


#: Prefetch depths from here on reach every group of any profile: one beyond this acts
#: alike, and the kernels take 64-bit integers (``check_prefetch`` caps a larger one).
PREFETCH_EVERY_GROUP = 1 << 30


def check_prefetch(prefetch_regions: int) -> int:
    """``prefetch_regions`` as the kernels take it: an int >= 0, at most
    PREFETCH_EVERY_GROUP (a deeper prefetch reaches no more groups)."""
    if (
        isinstance(prefetch_regions, bool)
        or not isinstance(prefetch_regions, (int, np.integer))
        or prefetch_regions < 0
    ):
        raise ValueError(
            f"prefetch_regions = {prefetch_regions!r} is invalid; accepted: an int >= 0"
        )
    return min(int(prefetch_regions), PREFETCH_EVERY_GROUP)


# ----------------------------------------------------------------------------- timeline


class Interval(NamedTuple):
    """Busy time of one stream."""

    start: float
    end: float
    label: str


@dataclass(kw_only=True)
class Timeline:
    """What one step looks like under a plan."""

    step_seconds: float
    """End of the last backward compute (start of forward = 0)."""
    forward_seconds: float
    """End of forward (start of backward)."""
    peak_bytes: int
    """Largest device-resident activation total."""
    peak_time_seconds: float
    """When the peak is first reached."""
    stall_seconds: float
    """Time backward compute waited for reloads."""
    recompute_seconds: float
    """Replay time summed over regions."""
    d2h_bytes: int
    h2d_bytes: int
    compute: list[Interval]
    """Compute stream: forward, replay and backward per unit, and stalls."""
    d2h: list[Interval]
    """Device-to-host copies, one per offloading group (region call or root run)."""
    h2d: list[Interval]
    """Host-to-device reloads, one per offloading group, in start order."""
    memory: list[tuple[float, int]]
    """(time, resident activation bytes) after all events at that time; starts at (0, 0)."""
    releases: tuple[int, ...] = ()
    """Per unit, the unit at whose end its offload group is freed (``Plan.releases``)."""


def simulate(profile: Profile, plan: Plan, *, prefetch_regions: int = 2) -> Timeline:
    """Timeline of ``plan`` on ``profile`` (model in this module's docstring)."""
    prefetch = check_prefetch(prefetch_regions)
    flat = flatten(profile)
    place = placement_array(flat, plan)
    ws = Workspace(flat)
    res = ws.run(place, prefetch)
    compute: list[Interval] = []
    for u in range(flat.n_units):
        if ws.fend[u] > ws.fstart[u]:
            compute.append(
                Interval(float(ws.fstart[u]), float(ws.fend[u]), f"forward {flat.unit_names[u]}")
            )
    top = flat.n_units - 1
    if ws.reach[top] > res.forward:
        compute.append(Interval(res.forward, float(ws.reach[top]), "wait for copies"))
    for u in range(flat.n_units - 1, -1, -1):
        name = flat.unit_names[u]
        r, cs, ce, rp = (
            float(ws.reach[u]),
            float(ws.cstart[u]),
            float(ws.cend[u]),
            float(ws.replay[u]),
        )
        if cs > r:
            compute.append(Interval(r, cs, f"stall {name}"))
        if rp > 0:
            compute.append(Interval(cs, cs + rp, f"replay {name}"))
        if ce > cs + rp:
            compute.append(Interval(cs + rp, ce, f"backward {name}"))
    # one copy per group each way (NOTE [Offload groups])
    off = place == int(Placement.OFFLOAD)
    d2h: list[Interval] = []
    h2d: list[Interval] = []
    for u in range(flat.n_units):
        lo, hi = int(flat.st_ptr[u]), int(flat.st_ptr[u + 1])
        members = np.flatnonzero(off[lo:hi])
        if members.size:
            first = lo + int(members[0])
            label = flat.unit_names[u] if u % 2 else f"(root) before unit {u + 1}"
            d2h.append(Interval(float(ws.d2h_start[first]), float(ws.d2h_end[first]), label))
            h2d.append(Interval(float(ws.h2d_start[first]), float(ws.h2d_end[first]), label))
    h2d.sort()
    n = ws.n_events
    memory: list[tuple[float, int]] = [(0.0, 0)]
    if n:
        times = ws.ev_t[:n]
        levels = np.cumsum(ws.ev_d[:n])
        last = np.flatnonzero(np.append(times[1:] != times[:-1], True))
        for i in last:
            t, b = float(times[i]), int(levels[i])
            if t == 0.0 and memory[0][0] == 0.0 and len(memory) == 1:
                memory[0] = (t, b)
            else:
                memory.append((t, b))
    return Timeline(
        step_seconds=res.step,
        forward_seconds=res.forward,
        peak_bytes=res.peak,
        peak_time_seconds=res.peak_time,
        stall_seconds=res.stall,
        recompute_seconds=res.recompute,
        d2h_bytes=res.d2h_bytes,
        h2d_bytes=res.h2d_bytes,
        compute=compute,
        d2h=d2h,
        h2d=h2d,
        memory=memory,
        releases=tuple(ws.rel_u.tolist()),
    )

