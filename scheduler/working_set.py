"""What a replay holds beyond the storages it brings back: its transients.

NOTE [Replay transients]
A replay reruns ops ``0..K-1`` of its region's forward, and while it runs, the device
holds more than the dropped storages it regenerates: the tensors those ops make that no
op of the region saves (the scores and probabilities of an attention's math path, the
product a matmul hands to its activation), and, in a replay that runs every op (a plain
one), the copies it makes again of the storages the plan holds (KEEP or OFFLOAD: the
held ones stay, the new ones live until the ops that read them have run). A plain step
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
    + in a plain replay, the held storages made by then and not yet past their first
      save's op (``producer_op <= i <= first_save_op``)

and its working set is the largest of these over ``i``, less the dropped storages, which
the simulator and the books count from the replay's start to its unit's end anyway. That
excess is held from the replay's start to its end (the simulator) or checked against the
peak when the replay is booked (the books, NOTE [Replays booked per storage] in
offrecomp/regenerate.py; a runtime under ``mode="recompute"`` records no ops, and its
books count none). A replay under the dispatch mode rebuilds the held outputs it
serves on the held storages, so only a plain one makes them again; its placeholders are
allocated like the outputs they stand for. The forward's own transients are not
counted: a plain step holds them at the same points, above at least as many saves, so
where they make a plain step's peak, the device's peak beyond the books
(``Profile.fixed_bytes``) holds them; a plan keeping most of what a plain step holds at
such a point can still go over its budget by part of them (bf16 attention at 0.35 of
keep's peak: 1.02x).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.kernels import njit_inline
from scheduler.profile import OpRecord, StorageRecord

__all__ = ["replay_transient_bytes"]


@njit_inline
def unit_replay_transient(v, k, plain, place, st_ptr, nbytes, st_prod, first_save, op_ptr, op_tr, level):  # type: ignore[no-untyped-def]
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
        elif plain and 0 <= p < n and first_save[s] >= p:
            level[p] += nbytes[s]
            if first_save[s] + 1 < n:
                level[first_save[s] + 1] -= nbytes[s]
    run = 0
    best = 0
    for i in range(n):
        run += level[i]
        held = run + op_tr[j0 + i]
        if held > best:
            best = held
    return best - dropped if best > dropped else 0


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
    level = [0] * n
    total = 0
    for s, d in zip(storages, dropped):
        p = s.producer_op
        if d:
            total += s.nbytes
            p = max(p, 0)
            if p < n:
                level[p] += s.nbytes
        elif plain and 0 <= p < n and s.first_save_op >= p:
            level[p] += s.nbytes
            if s.first_save_op + 1 < n:
                level[s.first_save_op + 1] -= s.nbytes
    run = best = 0
    for i in range(n):
        run += level[i]
        best = max(best, run + ops[i].transient_bytes)
    return max(0, best - total)
