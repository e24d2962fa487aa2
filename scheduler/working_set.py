"""What a replay, and a forward, hold beyond the storages the plan counts: their transients.

NOTE [Replay transients]
A replay reruns ops ``0..K-1`` of its region's forward, and while it runs, the device
holds more than the dropped storages it regenerates: the tensors those ops make that no
op of the region saves (the scores and probabilities of an attention's math path, the
product a matmul hands to its activation), and, in a replay that runs every op (a plain
one), the copies it makes again of the storages the plan holds (KEEP or OFFLOAD: the
held ones stay, the new ones live as long as the forward's Python held them). A plain step
holds none of this in its backward, so a plan counting only saves goes over its budget
by it (bf16 attention on the CPU: 1.19-1.21x).

The recorder measures, per op of the forward, the bytes of the storages the region's
ops made that the region never saves and that are alive when the op has returned (its
outputs made, its inputs not yet freed): ``OpRecord.transient_bytes``. Work no op
stands for (a kernel's own workspace, a compiled region's graph) is not seen. A replay
with prefix ``K`` then holds, after op ``i < K``:

    transient_bytes(i)
    + the dropped storages made by then (``producer_op <= i``; an unknown producer: from
      the start)
    + in a plain replay, the held storages made by then and not yet freed by the
      recorded forward (``producer_op <= i < freed_op``, NOTE [Forward transients];
      where that is unknown, up to their first save's op: ``i <= first_save_op``)

and its working set is the largest of these over ``i``, less the dropped storages, which
the simulator and the books count from the replay's start to its unit's end anyway. That
excess is held from the replay's start to its end (the simulator) or checked against the
peak when the replay is booked (the books, NOTE [Replays booked per storage] in
offrecomp/regenerate.py; a runtime under ``mode="recompute"`` records no ops, and its
books count none). A replay under the dispatch mode rebuilds the held outputs it
serves on the held storages, so only a plain one makes them again; its placeholders are
allocated like the outputs they stand for. A plain replay's copy of a held storage that
the forward kept to its end (a block's residual stream, read by a later op; a weight's
cast under autocast, which the replay's own autocast cache keeps) lives to the
prefix's end, not only to its first save's op.

NOTE [Forward transients]
A region call's forward holds tensors the plan does not count while it runs: what its
ops make and never save (``transient_bytes``), and the storages it drops (RECOMPUTE),
which the simulator and the books never count in forward though the forward's Python
holds each from the op making it until it lets go of it. The storages it holds (KEEP or
OFFLOAD) they count from their saves to the forward's end and beyond. So after op
``i`` the forward holds, of the call's own storages and temporaries,

    transient_bytes(i)
    + the dropped storages made by then (an unknown producer, a region input: from the
      start) and not freed by then (``StorageRecord.freed_op``: the op count at which
      the recorded forward, which drops every storage, freed it; its ops' count: alive
      at its end; -1, unknown: freed once its last save's op returned)
    + the held storages made by then

and where the largest of these over the ops exceeds the held storages of the call (all
of which the plan counts at the forward's end), the excess is held from the unit's
forward start to its end: the simulator allocates it at the start and frees it at the
end, before the saves of the next unit at the same time, and the books sample it into
the peak above what they hold when the call's forward returns (``book_forward`` in
offrecomp/regenerate.py, before the groups the call's end frees). The model's peak in a
forward is then exactly the forward's largest point, where the ops' records are right;
a region input is taken as counted elsewhere (the caller's, an earlier call's). A
plan keeping nearly all a plain step holds where a forward makes its largest
temporaries (bf16 attention on the CPU, a plan keeping a block almost whole at 0.3 of
keep's peak) otherwise peaks above its budget by them (1.13-1.15x). The measuring
pass's books sample the same figure, so ``Profile.fixed_bytes`` (the device's peak
beyond the books) holds no forward transient the model counts.

A dropped storage can outlive its call: autocast's cache holds each weight's cast (a
save of the matmul reading it) until autocast exits, so a plan dropping the casts frees
none of them before the step's forward ends, and by a GPT's last block the earlier
blocks' casts are there beside its saves (0.15 of the budget at 0.3 of keep's peak on a
small bf16 GPT; gigabytes for a model of billions of parameters). The recorder sees
which storages its call made that are alive when the call's forward returns, though the
measuring pass dropped them and the call returned no tensor on them
(``StorageRecord.outlives_call``); the simulator holds such a storage, when dropped,
from its unit's forward end to the forward's (the last unit's end: autocast exits with
the loss, before backward; a cache still alive at backward's end makes the storage
``held``, NOTE [Held past backward] in scheduler.timeline, and only KEEP), and the books
count it resident from the call's exit until its storage dies (``book_forward``). The
solver never offloads one, as a copy would free nothing before the forward's end; a
plan that does (a user's) is modelled as freeing it at its group's release.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.kernels import njit_inline
from scheduler.profile import OpRecord, StorageRecord

__all__ = ["forward_events", "forward_transient_bytes", "replay_transient_bytes"]


@njit_inline
def unit_replay_transient(v, k, plain, place, st_ptr, nbytes, st_prod, first_save, st_freed, op_ptr, op_tr, level):  # type: ignore[no-untyped-def]
    """Bytes unit ``v``'s replay with prefix end ``k`` holds beyond the storages it
    drops (``plain``: it runs every op before ``k``): NOTE [Replay transients].
    ``level`` is scratch of at least the unit's op count."""
    j0 = op_ptr[v]
    n = min(k, op_ptr[v + 1] - j0)
    if n <= 0:
        return 0
    for i in range(n):
        level[i] = 0
    dropped = 0
    for s in range(st_ptr[v], st_ptr[v + 1]):
        p = st_prod[s] - j0 if st_prod[s] >= 0 else -1
        if place[s] == 2:
            dropped += nbytes[s]
            p = max(p, 0)
            if p < n:
                level[p] += nbytes[s]
        elif plain and 0 <= p < n:
            end = st_freed[s] if st_freed[s] > p else first_save[s] + 1
            if end > p:
                level[p] += nbytes[s]
                if end < n:
                    level[end] -= nbytes[s]
    best = _level_peak(level, n, op_tr, j0)
    return best - dropped if best > dropped else 0


@njit_inline
def unit_forward_transient(v, place, st_ptr, nbytes, st_prod, st_freed, last_save, op_ptr, op_tr, level):  # type: ignore[no-untyped-def]
    """The most bytes unit ``v``'s forward holds of its own storages and temporaries
    after one of its ops: NOTE [Forward transients]. ``level`` is scratch of at least
    the unit's op count."""
    j0 = op_ptr[v]
    n = op_ptr[v + 1] - j0
    if n <= 0:
        return 0
    for i in range(n):
        level[i] = 0
    for s in range(st_ptr[v], st_ptr[v + 1]):
        p = st_prod[s] - j0 if st_prod[s] >= 0 else -1
        if place[s] == 2:
            end = st_freed[s] if st_freed[s] >= 0 else (last_save[s] + 1 if p >= 0 else n)
            p = max(p, 0)
            if p < n and p < end:
                level[p] += nbytes[s]
                if end < n:
                    level[end] -= nbytes[s]
        elif 0 <= p < n:
            level[p] += nbytes[s]
    return _level_peak(level, n, op_tr, j0)


@njit_inline
def _level_peak(level, n, op_tr, j0):  # type: ignore[no-untyped-def]
    """The largest running sum of ``level[:n]`` (the bytes each op's start adds or its
    end takes off) with each op's temporaries (``op_tr`` from ``j0``) beside it."""
    run = 0
    best = 0
    for i in range(n):
        run += level[i]
        at = run + op_tr[j0 + i]
        if at > best:
            best = at
    return best


@njit_inline
def forward_events(
    s3t, s3b, s4t, s4b, place, st_ptr, nbytes, st_prod, st_freed, last_save, op_ptr, op_tr, level, fstart, fend,
    save_time, fwd_start, outlives, t_fwd
):  # type: ignore[no-untyped-def]
    """The forward entries of the simulator's allocation and free streams (its
    ``_event_streams`` leaves them empty; NOTE [Forward transients]): per unit its
    forward transients, held from its forward start to its end, less its held storages
    saved before that end (``s3[2u]``, ``s4[u]``), and its dropped storages that outlive
    it, held from its end to the forward's end (``s3[2u + 1]``, ``s4[n_u]``)."""
    n_u = fstart.shape[0]
    s4t[n_u] = t_fwd
    s4b[n_u] = 0
    for u in range(n_u):
        kept = 0
        for s in range(st_ptr[u], st_ptr[u + 1]):
            if outlives[s] and place[s] == 2:
                kept += nbytes[s]
        if fend[u] >= t_fwd:  # nothing to hold past its end (an allocation there would follow the free)
            kept = 0
        s3t[2 * u + 1] = fend[u]
        s3b[2 * u + 1] = kept
        s4b[n_u] += kept
        extra = unit_forward_transient(u, place, st_ptr, nbytes, st_prod, st_freed, last_save, op_ptr, op_tr, level)
        if extra > 0:  # less the held storages: all of them (none beyond them: nothing) ...
            shift = fstart[u] - fwd_start[u]
            held = 0
            late = 0  # ... but those saved at the unit's end, after this free
            for s in range(st_ptr[u], st_ptr[u + 1]):
                if place[s] != 2 and st_prod[s] >= 0:
                    held += nbytes[s]
                    if save_time[s] + shift >= fend[u]:
                        late += nbytes[s]
            extra = extra - held + late if extra > held else 0
        if fend[u] <= fstart[u]:  # a unit taking no time holds nothing (a free there precedes it)
            extra = 0
        s3t[2 * u] = fstart[u]
        s3b[2 * u] = extra
        s4t[u] = fend[u]
        s4b[u] = extra


def _books_held(
    ops: Sequence[OpRecord], storages: Sequence[StorageRecord], dropped: Sequence[bool], n: int, plain: bool
) -> tuple[int, int]:
    """The books' form of ``unit_replay_transient``: (the largest held, the dropped bytes)."""
    level = [0] * n
    total = 0
    for s, d in zip(storages, dropped):
        p = s.producer_op
        if d:
            total += s.nbytes
            p = max(p, 0)
            if p < n:
                level[p] += s.nbytes
        elif plain and 0 <= p < n:
            end = s.freed_op if s.freed_op > p else s.first_save_op + 1
            if end > p:
                level[p] += s.nbytes
                if end < n:
                    level[end] -= s.nbytes
    run = best = 0
    for i in range(n):
        run += level[i]
        best = max(best, run + ops[i].transient_bytes)
    return best, total


def replay_transient_bytes(
    ops: Sequence[OpRecord], storages: Sequence[StorageRecord], dropped: Sequence[bool], k: int, *, plain: bool
) -> int:
    """What a replay of a region call with ops ``ops`` and storages ``storages`` holds
    beyond its dropped storages (``dropped[i]``: storage ``i`` is dropped) running ops
    ``0..k-1`` (``plain``: every one of them): the books' form of the simulator's
    ``unit_replay_transient`` (NOTE [Replay transients])."""
    n = min(k, len(ops))
    if n <= 0:
        return 0
    best, total = _books_held(ops, storages, dropped, n, plain)
    return max(0, best - total)


def forward_transient_bytes(
    ops: Sequence[OpRecord], storages: Sequence[StorageRecord], dropped: Sequence[bool]
) -> int:
    """What the forward of a region call with ops ``ops`` and storages ``storages``
    holds at its largest beyond the storages of it the books hold at its end
    (``dropped[i]``: storage ``i`` is dropped): the books' form of
    ``unit_forward_transient`` (NOTE [Forward transients])."""
    n = len(ops)
    if n == 0:
        return 0
    level = [0] * n
    held = 0
    for s, d in zip(storages, dropped):
        p = s.producer_op
        if d:
            end = s.freed_op if s.freed_op >= 0 else (s.last_save_op + 1 if p >= 0 else n)
            p = max(p, 0)
            if p < n and p < end:
                level[p] += s.nbytes
                if end < n:
                    level[end] -= s.nbytes
        elif 0 <= p < n:
            held += s.nbytes
            level[p] += s.nbytes
    run = best = 0
    for i in range(n):
        run += level[i]
        best = max(best, run + ops[i].transient_bytes)
    return max(0, best - held)
