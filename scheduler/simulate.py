"""Timeline of a plan: compute stream, D2H copy stream, H2D copy stream, memory over time.

The model (see docs/planner.md for the picture):

* **Units.** The step's forward is cut into units in forward order: a root gap (work
  saved outside every region, e.g. embedding), region 0, gap, region 1, ..., region n-1,
  and a final gap (e.g. LM head and loss). Unit ``2k`` is gap ``k``, unit ``2r+1`` is
  region ``r``. Regions keep their measured start times when those form a consistent
  timeline; otherwise they run back to back and the root forward time
  (``profile.forward_seconds`` minus the regions' sum) is spread evenly over the gaps.
  Root backward time is spread over the gaps in proportion to their forward time.
* **Forward.** Each unit runs for the longer of its device time and its host time
  (NOTE [Host time]). A storage is saved at its unit's start plus ``offset_seconds``
  (root storages: step start plus ``offset_seconds``, moved by the host time the units
  before theirs add) and is resident from then on unless it is dropped (RECOMPUTE).
* **D2H** (NOTE [Offload groups]). The OFFLOAD storages of one unit form a group: a
  region call's, or a gap's (one run of root saves, closed by the next region call or
  by backward). The group's copy is issued when its unit exits and runs FIFO on one
  stream: it starts at ``max(exit, end of the previous copy)`` and takes ``sum(nbytes)
  / (d2h_gbps * 1e9)``. The group's device storages are freed when its copy lands.
* **Backward.** Units run in reverse from the end of forward, with no wait for copies
  still in flight. Unit ``v`` is *reached* when the previous unit's backward ends (the
  first at the end of forward). Reaching a unit whose group offloads reloads that group
  unless it was issued already, and issues the reloads of the next ``prefetch_regions``
  groups below it that offload (skipping units with nothing offloaded), where not issued
  yet. A reload is one H2D copy of the group, FIFO in issue order, starting at
  ``max(issue, end of the previous reload, the group's D2H landing)``. A unit's compute
  starts once it is reached and its reload has landed (the wait is *stall*); it takes
  the longer of ``replay_seconds + backward_seconds`` and its host time.
* **Memory** (activation bytes only). KEEP: from save until its unit's backward ends.
  OFFLOAD: from save until its group's D2H lands, and again from the group's reload
  issue until its unit's backward ends (continuously when the copy lands after the
  reload is issued). RECOMPUTE: only during its unit's backward (the replay working
  set). At equal times, frees are applied before allocations.

NOTE [Offload groups]: this is the runtime's offload engine, step for step: pack only
records an OFFLOAD storage in its group; at the region's exit the group is copied as
one unit; backward does not drain the D2H stream (compute waits on a D2H copy only past
the in-flight window, which a plan sets to its own offloaded bytes, so a planned step
never waits there); the first unpack of a group's storage reloads the group and issues
the next groups' reloads; the group is released when its unit's backward ends.

NOTE [Host time]: a unit's time is the longer of its device time and its host time. The
host time of a region's forward is ``RegionRecord.host_seconds`` (where measured; else
its device time, as on CPU, where host and device are one) plus, per saved tensor,
``Profile.pack_host_seconds``, plus ``offload_host_seconds`` when its group offloads;
gaps take their device time plus the pack cost of their root saves. In backward: the
unit's ``backward_host_seconds`` (or device time) plus ``unpack_host_seconds`` per save,
``reload_host_seconds`` per group reload it issues, and ``replay_seconds`` plus
``replay_host_seconds`` when it replays. Where no host time is measured and every host
cost is 0, each unit takes its device time, bit for bit as without the host model.

``lower_bound`` is a relaxation of this model; its derivation is in its docstring.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numba
import numpy as np

from scheduler.plan import ROOT, Placement, Plan, StorageKey
from scheduler.profile import Profile, RegionRecord

__all__ = [
    "Interval",
    "Timeline",
    "lower_bound",
    "simulate",
]

#: Bit of each placement in a legality mask.
KEEP_BIT, OFFLOAD_BIT, RECOMPUTE_BIT = 1, 2, 4
KIND_ACTIVATION, KIND_INPUT, KIND_EXTERNAL, KIND_ROOT = 0, 1, 2, 3
_KIND_CODES = {"activation": KIND_ACTIVATION, "input": KIND_INPUT, "external": KIND_EXTERNAL}
_LEGAL = {
    KIND_ACTIVATION: KEEP_BIT | OFFLOAD_BIT | RECOMPUTE_BIT,
    KIND_INPUT: KEEP_BIT | OFFLOAD_BIT,
    KIND_EXTERNAL: KEEP_BIT,
    KIND_ROOT: KEEP_BIT | OFFLOAD_BIT,
}


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


# --------------------------------------------------------------------------- flattening


@dataclass
class FlatProfile:
    """A profile as flat arrays (the form the numba kernels work on).

    Storages are grouped by unit (``st_ptr``); ``keys[i]`` is the plan key of flat
    storage ``i``. Ops are grouped by unit (``op_ptr``; gaps have none), their outputs
    in CSR form (``out_ptr``/``out_idx``, flat storage indices, -1 kept as -1).

    Dataflow (see scheduler.profile, replay semantics): ``dataflow[u]`` says unit ``u``
    replays demand-driven (a region, not opaque, with ops that all have ``reads``);
    ``op_sink`` marks sinks; ``rd_ptr``/``rd_idx`` hold each op's ``reads`` as global op
    indices (empty rows in other units); ``st_prod[i]`` is storage ``i``'s producer as a
    global op index, -1 when unknown (root storages, regions without ops).
    ``fixed_from[j]`` is the smallest prefix end ``K`` from which op ``j`` runs in every
    replay of its unit with that prefix, whatever is dropped (``n_ops + 1``: not
    always): outside dataflow units ``j + 1`` for ops that can never be served; in
    dataflow units the ops reached from a never-servable sink before ``K`` through
    never-servable ops only.
    """

    keys: list[StorageKey]
    unit_names: list[str]
    st_ptr: np.ndarray
    unit_of: np.ndarray
    nbytes: np.ndarray
    save_time: np.ndarray
    kind: np.ndarray
    legal: np.ndarray
    last_save: np.ndarray
    save_order: np.ndarray
    op_ptr: np.ndarray
    op_sec: np.ndarray
    op_serv: np.ndarray
    out_ptr: np.ndarray
    out_idx: np.ndarray
    noops: np.ndarray
    dataflow: np.ndarray
    op_sink: np.ndarray
    op_view: np.ndarray
    """Per op: a view (not a sink), which a demand-driven replay runs whenever it lies
    before the stop, without following its reads."""
    rd_ptr: np.ndarray
    rd_idx: np.ndarray
    st_prod: np.ndarray
    fixed_from: np.ndarray
    fwd_start: np.ndarray
    """Per unit its forward start when no group offloads (NOTE [Host time])."""
    fwd_dur: np.ndarray
    """Per unit its forward device time (what a replay of a region without ops costs)."""
    bwd_dur: np.ndarray
    """Per unit its backward time without replay or group reloads: the longer of
    ``bwd_dev`` and ``bwd_host``."""
    t0: float
    """End of forward when no group offloads."""
    fwd_host: np.ndarray
    """Per unit its forward host time: the measured host time (or the device time where
    none was measured) plus the pack hook's cost per save."""
    bwd_dev: np.ndarray
    """Per unit its backward device time, without replay."""
    bwd_host: np.ndarray
    """Per unit its backward host time plus the unpack hook's cost per save."""
    d2h_bps: float
    h2d_bps: float
    host_limit_bytes: int
    op_host: float = 0.0
    """Seconds the replay dispatch mode adds per op it sees (``Profile.replay_op_seconds``)."""
    offload_host: float = 0.0
    """Host seconds to issue one group offload (``Profile.offload_host_seconds``)."""
    reload_host: float = 0.0
    """Host seconds to issue one group reload (``Profile.reload_host_seconds``)."""
    replay_host: float = 0.0
    """Host seconds of one replay beyond its ops (``Profile.replay_host_seconds``)."""

    @property
    def forward_span(self) -> np.ndarray:
        """Per unit its forward time when its group does not offload."""
        return np.maximum(self.fwd_dur, self.fwd_host)

    def forward_end_bound(self) -> float:
        """Latest end of forward of any plan: every unit that may offload does."""
        may = np.zeros(self.n_units, dtype=np.bool_)
        off = (self.legal & OFFLOAD_BIT) != 0
        may[self.unit_of[off]] = True
        span = self.forward_span
        with_issue = np.maximum(self.fwd_dur, self.fwd_host + self.offload_host)
        return self.t0 + float(np.sum(np.where(may, with_issue - span, 0.0)))

    @functools.cached_property
    def key_index(self) -> dict[StorageKey, int]:
        """Flat index of each plan key (built on first use: only plan checks need it)."""
        return dict(zip(self.keys, range(len(self.keys))))

    @property
    def n_storages(self) -> int:
        return int(self.nbytes.shape[0])

    @property
    def n_units(self) -> int:
        return int(self.fwd_dur.shape[0])

    @property
    def has_link(self) -> bool:
        return self.d2h_bps > 0.0 and self.h2d_bps > 0.0

    @property
    def max_unit_ops(self) -> int:
        return int(np.max(np.diff(self.op_ptr))) if self.op_ptr.shape[0] > 1 else 0


def _check_number(value: float, what: str) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0.0:
        raise ValueError(f"{what} = {value!r} is invalid; accepted: a finite number >= 0")
    return v


def _region_label(r: RegionRecord) -> str:
    return f"{r.name}#{r.call_index}"


def _layout(profile: Profile) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Forward start/duration and backward duration per unit, and the forward end.

    Region times are checked as arrays; only when that check fails are they walked one
    by one, to name the bad value (or accept what ``_check_number`` accepts).
    """
    regions = profile.regions
    n = len(regions)
    fw_raw = [r.forward_seconds for r in regions]
    bw_raw = [r.backward_seconds for r in regions]
    if not _times_ok(fw_raw):
        fw_raw = [
            _check_number(r.forward_seconds, f"region {_region_label(r)} forward_seconds")
            for r in regions
        ]
    if not _times_ok(bw_raw):
        bw_raw = [
            _check_number(r.backward_seconds, f"region {_region_label(r)} backward_seconds")
            for r in regions
        ]
    fw = np.asarray(fw_raw, dtype=np.float64)
    bw = np.asarray(bw_raw, dtype=np.float64)
    fwd_total = _check_number(profile.forward_seconds, "profile forward_seconds")
    bwd_total = _check_number(profile.backward_seconds, "profile backward_seconds")
    # sums in Python (sequential) and elementwise numpy below: the same floats as a loop
    fw_sum = sum(fw.tolist())
    scale = max(1e-300, fwd_total, float(fw.max()) if n else 0.0)
    tol = 1e-9 * scale
    starts = np.asarray([float(r.start_seconds) for r in regions], dtype=np.float64)
    consistent = n > 0 and bool(np.all(np.isfinite(starts) & (starts >= 0.0)))
    if consistent:
        consistent = not bool(np.any(starts[1:] < starts[:-1] + fw[:-1] - tol))
    gaps = np.empty(n + 1)
    if consistent:
        end_last = float(starts[-1] + fw[-1])
        fwd_total = max(fwd_total, end_last)
        gaps[0] = starts[0]
        gaps[1:n] = np.maximum(0.0, starts[1:] - (starts[:-1] + fw[:-1]))
        gaps[n] = max(0.0, fwd_total - end_last)
    else:
        fwd_total = max(fwd_total, fw_sum)
        gaps[:] = max(0.0, fwd_total - fw_sum) / (n + 1)
    bw_sum = sum(bw.tolist())
    bwd_total = max(bwd_total, bw_sum)
    root_b = max(0.0, bwd_total - bw_sum)
    gap_sum = sum(gaps.tolist())
    gaps_b = root_b * gaps / gap_sum if gap_sum > 0 else np.full(n + 1, root_b / (n + 1))
    # units: gap 0, region 0, gap 1, ..., gap n
    dur = np.empty(2 * n + 1)
    dur[0::2] = gaps
    dur[1::2] = fw
    bdur = np.empty(2 * n + 1)
    bdur[0::2] = gaps_b
    bdur[1::2] = bw
    ends = np.cumsum(dur)
    start = np.concatenate(([0.0], ends[:-1]))
    return start, dur, bdur, max(float(ends[-1]), fwd_total)


def _bad_storage(profile: Profile, what: str, accepted: str, check: Any) -> None:
    """Raise ValueError for the first storage failing ``check`` (slow path)."""
    for r in profile.regions:
        for i, s in enumerate(r.storages):
            if not check(s):
                raise ValueError(
                    f"storage {i} of region {_region_label(r)} {what} = {getattr(s, what)!r} is "
                    f"invalid; accepted: {accepted}"
                )
    for i, s in enumerate(profile.root):
        if not check(s):
            raise ValueError(
                f"root storage {i} {what} = {getattr(s, what)!r} is invalid; accepted: {accepted}"
            )


def _is_count(v: Any) -> bool:
    return bool(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0)


def _is_time(v: Any) -> bool:
    return bool(
        isinstance(v, (int, float, np.number))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and v >= 0
    )


def _int_array(values: list[Any]) -> np.ndarray | None:
    """``values`` as int64 when all are ints >= 0, else None."""
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError):
        return None
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or int(arr.min()) < 0:
        return None
    return arr.astype(np.int64)


def _int_column(raw: list[Any]) -> tuple[np.ndarray, bool]:
    """``raw`` as an array, and whether it is a 1-D array of ints (bounds are the caller's)."""
    arr = np.asarray(raw) if raw else np.zeros(0, dtype=np.int64)
    return arr, bool(arr.ndim == 1 and (arr.size == 0 or arr.dtype.kind in "iu"))


def _csr_rows(lens: Any) -> tuple[np.ndarray, np.ndarray]:
    """Row pointers for rows of these lengths, and the row of each entry."""
    lens_arr = np.asarray(lens, dtype=np.int64)
    ptr = np.zeros(lens_arr.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens_arr, out=ptr[1:])
    return ptr, np.repeat(np.arange(lens_arr.shape[0], dtype=np.int64), lens_arr)


def _times_ok(values: list[Any]) -> bool:
    if not values:
        return True
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError):
        return False
    if arr.ndim != 1 or arr.dtype.kind not in "iuf":
        return False
    return bool(np.all(np.isfinite(arr)) and np.all(arr >= 0))


def _outputs(
    profile: Profile,
    raw: list[Any],
    lens: list[int],
    op_base: np.ndarray,
    op_m: np.ndarray,
    skip: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Op outputs in CSR form (flat storage indices, -1 kept) and which ops replay may serve."""
    n_ops = len(lens)
    out_ptr, owner = _csr_rows(lens)
    arr, ok = _int_column(raw)
    m = np.asarray(op_m, dtype=np.int64)[owner] if n_ops else np.zeros(0, dtype=np.int64)
    if ok and arr.size:
        ok = bool(np.all((arr >= -1) & (arr < m)))
    if not ok:
        for r in profile.regions:
            k = len(r.storages)
            for j, op in enumerate(r.ops):
                for o in op.outputs:
                    if (
                        isinstance(o, bool)
                        or not isinstance(o, (int, np.integer))
                        or not -1 <= o < k
                    ):
                        raise ValueError(
                            f"op {j} of region {_region_label(r)} has output {o!r}; accepted: -1 or "
                            f"a storage index in 0..{k - 1}"
                        )
    arr = arr.astype(np.int64)
    base = np.asarray(op_base, dtype=np.int64)[owner] if n_ops else np.zeros(0, dtype=np.int64)
    out_idx = np.where(arr >= 0, arr + base, -1).astype(np.int64)
    has_unsaved = np.bincount(owner[arr < 0], minlength=n_ops) > 0
    op_serv = (
        np.asarray(skip, dtype=np.bool_) & ~has_unsaved if n_ops else np.zeros(0, dtype=np.bool_)
    )
    return out_ptr, out_idx, op_serv


def _reads(
    profile: Profile,
    raw: list[Any],
    lens: np.ndarray,
    op_start: np.ndarray,
    op_count: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Op reads in CSR form as global op indices (rows of non-dataflow units are empty)."""
    rd_ptr, owner = _csr_rows(lens)
    arr, ok = _int_column(raw)
    if ok and arr.size:
        ok = bool(np.all((arr >= 0) & (arr < op_count[owner])))
    if not ok:
        for r in profile.regions:
            k = len(r.ops)
            for j, op in enumerate(r.ops):
                for x in op.reads or ():
                    if (
                        isinstance(x, bool)
                        or not isinstance(x, (int, np.integer))
                        or not 0 <= x < k
                    ):
                        raise ValueError(
                            f"op {j} of region {_region_label(r)} reads op {x!r}; accepted: an op "
                            f"index in 0..{k - 1}"
                        )
    rd_idx = (arr.astype(np.int64) + op_start[owner]).astype(np.int64)
    return rd_ptr, rd_idx


def _producer_ops(
    profile: Profile, raw: list[Any], base: np.ndarray, n_arr: np.ndarray
) -> np.ndarray:
    """Per flat storage its producer as a global op index, -1 when unknown (``base``, ``n_arr``:
    per storage the first global op index and the op count of its unit)."""
    arr, ok = _int_column(raw)
    if ok and arr.size:
        ok = bool(np.all((arr >= -1) & ((arr < n_arr) | (n_arr == 0))))
    if not ok:

        def good(s: Any, k: int) -> bool:
            p = s.producer_op
            return bool(
                isinstance(p, (int, np.integer))
                and not isinstance(p, bool)
                and p >= -1
                and (p < k or k == 0)
            )

        for r in profile.regions:
            k = len(r.ops)
            for i, st in enumerate(r.storages):
                if not good(st, k):
                    raise ValueError(
                        f"storage {i} of region {_region_label(r)} producer_op = "
                        f"{st.producer_op!r} is invalid; accepted: -1 or an op index in "
                        f"0..{k - 1}"
                    )
    arr = arr.astype(np.int64)
    return np.where((arr >= 0) & (n_arr > 0), arr + base, -1).astype(np.int64)


@njit
def _fixed_from(op_ptr, op_serv, op_sink, rd_ptr, rd_idx, dataflow):  # type: ignore[no-untyped-def]
    """``FlatProfile.fixed_from``: per op the prefix end from which it always runs."""
    n_u = op_ptr.shape[0] - 1
    out = np.empty(op_serv.shape[0], dtype=np.int64)
    stack = np.empty(op_serv.shape[0], dtype=np.int64)
    for u in range(n_u):
        j0 = op_ptr[u]
        n = op_ptr[u + 1] - j0
        for jj in range(n):
            out[j0 + jj] = n + 1
        if not dataflow[u]:
            for jj in range(n):
                if not op_serv[j0 + jj]:
                    out[j0 + jj] = jj + 1
            continue
        # a never-servable sink runs whenever it lies in the prefix (served or not, under
        # both replay rules); so does every never-servable op it reaches through reads of
        # earlier ops (the profile contract; a read of a later op is not followed here)
        for jj in range(n):
            j = j0 + jj
            if not op_sink[j] or op_serv[j] or out[j] <= n:
                continue
            out[j] = jj + 1
            top = 1
            stack[0] = j
            while top > 0:
                top -= 1
                i = stack[top]
                for q in range(rd_ptr[i], rd_ptr[i + 1]):
                    r = rd_idx[q]
                    if r >= i or op_serv[r] or out[r] <= n:
                        continue
                    out[r] = jj + 1
                    stack[top] = r
                    top += 1
    return out


_get_nbytes = operator.attrgetter("nbytes")
_get_offset = operator.attrgetter("offset_seconds")
_get_kind = operator.attrgetter("kind")
_get_last_save = operator.attrgetter("last_save_op")
_get_producer = operator.attrgetter("producer_op")
_get_outputs = operator.attrgetter("outputs")
_get_skippable = operator.attrgetter("skippable")
_get_seconds = operator.attrgetter("seconds")
_get_sink = operator.attrgetter("sink")
_get_view = operator.attrgetter("view")
_get_reads = operator.attrgetter("reads")
_get_saves = operator.attrgetter("saves")


def flatten(profile: Profile) -> FlatProfile:
    """Validate ``profile`` and lay it out as flat arrays.

    Each attribute is gathered in one pass over all storages (ops) of all regions and
    checked as an array; only a failed check walks the profile again, to name the first
    bad value. Flat storage order is by unit: a gap's root storages (by root index),
    then a region's storages.
    """
    if not isinstance(profile, Profile):
        raise TypeError(f"expected a scheduler.Profile, got {type(profile).__name__}")
    regions = profile.regions
    n = len(regions)
    start, dur, bdur, t0 = _layout(profile)
    n_units = 2 * n + 1
    d2h = _check_number(profile.d2h_gbps, "profile d2h_gbps") * 1e9
    h2d = _check_number(profile.h2d_gbps, "profile h2d_gbps") * 1e9

    # root storages go to the last gap that has started by their save time
    roots = profile.root
    root_off = list(map(_get_offset, roots))
    if not _times_ok(root_off):
        root_off = [
            _check_number(s.offset_seconds, f"root storage {i} offset_seconds")
            for i, s in enumerate(roots)
        ]
    root_t = np.minimum(np.asarray(root_off, dtype=np.float64), t0)
    root_gap = np.searchsorted(start[0::2], root_t, side="right") - 1
    root_order = np.argsort(root_gap, kind="stable")

    names = [r.name for r in regions]
    calls = [r.call_index for r in regions]
    if ROOT in names or len(set(zip(names, calls))) < n:
        seen: set[tuple[str, int]] = set()
        for r in regions:
            if r.key in seen:
                raise ValueError(
                    f"region {_region_label(r)} appears twice in the profile; each (name, call_index) must be unique"
                )
            if r.name == ROOT:
                raise ValueError(
                    f"region name {r.name!r} is reserved for root storages; give the region a name"
                )
            seen.add(r.key)

    st_lists = [r.storages for r in regions]
    op_lists = [r.ops for r in regions]
    sts = list(itertools.chain.from_iterable(st_lists))
    ops = list(itertools.chain.from_iterable(op_lists))
    n_reg_st, n_ops, n_root = len(sts), len(ops), len(roots)
    reg_st = np.fromiter(map(len, st_lists), dtype=np.int64, count=n)
    reg_ops = np.fromiter(map(len, op_lists), dtype=np.int64, count=n)
    opaque = np.asarray([bool(r.opaque) for r in regions], dtype=np.bool_)
    st_counts = np.empty(n_units, dtype=np.int64)
    st_counts[0::2] = np.bincount(root_gap, minlength=n + 1)
    st_counts[1::2] = reg_st
    op_counts = np.zeros(n_units, dtype=np.int64)
    op_counts[1::2] = reg_ops
    st_ptr_arr = np.zeros(n_units + 1, dtype=np.int64)
    np.cumsum(st_counts, out=st_ptr_arr[1:])
    op_ptr_arr = np.zeros(n_units + 1, dtype=np.int64)
    np.cumsum(op_counts, out=op_ptr_arr[1:])
    unit_arr = np.repeat(np.arange(n_units, dtype=np.int64), st_counts)
    op_unit = np.repeat(np.arange(n_units, dtype=np.int64), op_counts)
    op_region = op_unit // 2
    # flat storage i is region storage src[i] (region order), or root src[i] - n_reg_st
    in_region = (unit_arr % 2) == 1
    src = np.empty(n_reg_st + n_root, dtype=np.int64)
    src[in_region] = np.arange(n_reg_st, dtype=np.int64)
    src[~in_region] = n_reg_st + root_order

    # ops: outputs, reads (dataflow units only), seconds, flags
    outs = list(map(_get_outputs, ops))
    op_skip = np.asarray(list(map(_get_skippable, ops)), dtype=np.bool_) & ~opaque[op_region]
    out_ptr, out_idx, op_serv = _outputs(
        profile,
        list(itertools.chain.from_iterable(outs)),
        list(map(len, outs)),
        st_ptr_arr[op_unit],
        st_counts[op_unit],
        op_skip,
    )
    # a region replays demand-driven when it is not opaque and every op has reads
    rds = list(map(_get_reads, ops))
    df_region = ~opaque & (reg_ops > 0)
    if None in rds:
        unknown = np.asarray([x is None for x in rds], dtype=np.bool_)
        df_region &= np.bincount(op_region[unknown], minlength=n) == 0
    df_op = df_region[op_region]
    if not bool(df_op.all()):
        rds = list(itertools.compress(rds, df_op.tolist()))
    rd_lens = np.zeros(n_ops, dtype=np.int64)
    rd_lens[df_op] = list(map(len, rds))
    op_start = np.repeat(op_ptr_arr[:-1], op_counts)
    op_count = np.repeat(op_counts, op_counts)
    rd_ptr, rd_idx = _reads(
        profile, list(itertools.chain.from_iterable(rds)), rd_lens, op_start, op_count
    )
    st_prod = np.full(n_reg_st + n_root, -1, dtype=np.int64)
    st_region = np.repeat(np.arange(n, dtype=np.int64), reg_st)
    st_prod[:n_reg_st] = _producer_ops(
        profile,
        list(map(_get_producer, sts)),
        op_ptr_arr[1::2][st_region],
        reg_ops[st_region],
    )
    sink_arr = np.asarray(list(map(_get_sink, ops)), dtype=np.bool_)
    view_arr = np.asarray(list(map(_get_view, ops)), dtype=np.bool_) & ~sink_arr

    # storages (region storages first, then roots; put in flat order through src)
    nb_arr = _int_array(list(map(_get_nbytes, sts)) + list(map(_get_nbytes, roots)))
    if nb_arr is None:
        _bad_storage(profile, "nbytes", "an int >= 0", lambda s: _is_count(s.nbytes))
    ls_arr = _int_array(list(map(_get_last_save, sts)))
    if ls_arr is None:
        _bad_storage(profile, "last_save_op", "an int >= 0", lambda s: _is_count(s.last_save_op))
    offsets = list(map(_get_offset, sts))
    if not _times_ok(offsets):
        _bad_storage(
            profile, "offset_seconds", "a finite number >= 0", lambda s: _is_time(s.offset_seconds)
        )
    try:
        kind_reg = np.fromiter(
            map(_KIND_CODES.__getitem__, map(_get_kind, sts)), dtype=np.int64, count=n_reg_st
        )
    except (KeyError, TypeError):
        _bad_storage(profile, "kind", ", ".join(_KIND_CODES), lambda s: s.kind in _KIND_CODES)
        raise
    op_sec = list(map(_get_seconds, ops))
    if not _times_ok(op_sec):
        for r in regions:
            for j, op in enumerate(r.ops):
                _check_number(op.seconds, f"op {j} of region {_region_label(r)} seconds")
    assert nb_arr is not None and ls_arr is not None  # _bad_storage raised otherwise
    kind_arr = np.concatenate((kind_reg, np.full(n_root, KIND_ROOT, dtype=np.int64)))[src]
    legal_of = np.asarray([_LEGAL[k] for k in range(4)], dtype=np.int64)
    legal = legal_of[kind_arr]
    frozen = np.asarray([not r.replayable for r in regions], dtype=np.bool_)
    if frozen.any():  # regions that must never replay: no RECOMPUTE for their storages
        no_replay = np.concatenate((frozen[st_region], np.zeros(n_root, dtype=np.bool_)))[src]
        legal = np.where(no_replay, legal & ~RECOMPUTE_BIT, legal)
    sv_arr = _int_array(list(map(_get_saves, sts)) + list(map(_get_saves, roots)))
    if sv_arr is None:
        _bad_storage(profile, "saves", "an int >= 0", lambda s: _is_count(s.saves))
    assert sv_arr is not None
    unit_saves = np.bincount(unit_arr, weights=sv_arr[src].astype(np.float64), minlength=n_units)
    host_start, fwd_host, bwd_host, bwd_dev, t0 = _host_layout(profile, start, dur, bdur, t0, unit_saves)
    off_arr = np.concatenate((np.asarray(offsets, dtype=np.float64), root_t))[src]
    # region storages: unit start + offset clamped to the unit; root: absolute, clamped
    # above; both moved by the host time the units before theirs add (NOTE [Host time])
    save_arr = np.where(in_region, start[unit_arr] + np.minimum(off_arr, dur[unit_arr]), off_arr)
    save_arr = save_arr + (host_start - start)[unit_arr]
    # by save time, then unit, then index: flat order is by unit, so a stable sort suffices
    order = np.argsort(save_arr, kind="stable").astype(np.int64)

    unit_names = ["(root)"] * n_units
    unit_names[1::2] = [f"{r.name}#{r.call_index}" for r in regions]
    # gap k's root storages: root_keys[gap_ptr[k]:gap_ptr[k + 1]]
    root_keys = [(ROOT, 0, i) for i in root_order.tolist()]
    gap_ptr = [0, *np.cumsum(st_counts[0::2]).tolist()]
    keys: list[StorageKey] = []
    for k, (name, call, m) in enumerate(zip(names, calls, reg_st.tolist())):
        keys += root_keys[gap_ptr[k] : gap_ptr[k + 1]]
        keys.extend(zip(itertools.repeat(name, m), itertools.repeat(call, m), range(m)))
    keys += root_keys[gap_ptr[n] :]
    noops = np.zeros(n_units, dtype=np.bool_)
    noops[1::2] = reg_ops == 0
    df_arr = np.zeros(n_units, dtype=np.bool_)
    df_arr[1::2] = df_region
    return FlatProfile(
        keys=keys,
        unit_names=unit_names,
        st_ptr=st_ptr_arr,
        unit_of=unit_arr,
        nbytes=nb_arr[src],
        save_time=save_arr,
        kind=kind_arr,
        legal=legal,
        last_save=np.concatenate((ls_arr, np.zeros(n_root, dtype=np.int64)))[src],
        save_order=order,
        op_ptr=op_ptr_arr,
        op_sec=np.asarray(op_sec, dtype=np.float64),
        op_serv=op_serv,
        out_ptr=out_ptr,
        out_idx=out_idx,
        noops=noops,
        dataflow=df_arr,
        op_sink=sink_arr,
        op_view=view_arr,
        rd_ptr=rd_ptr,
        rd_idx=rd_idx,
        st_prod=st_prod[src],
        fixed_from=_fixed_from(op_ptr_arr, op_serv, sink_arr, rd_ptr, rd_idx, df_arr),
        fwd_start=host_start,
        fwd_dur=dur,
        bwd_dur=np.maximum(bwd_dev, bwd_host),
        t0=float(t0),
        fwd_host=fwd_host,
        bwd_dev=bwd_dev,
        bwd_host=bwd_host,
        d2h_bps=d2h,
        h2d_bps=h2d,
        host_limit_bytes=int(profile.host_limit_bytes),
        op_host=_check_number(profile.replay_op_seconds, "profile replay_op_seconds"),
        offload_host=_check_number(profile.offload_host_seconds, "profile offload_host_seconds"),
        reload_host=_check_number(profile.reload_host_seconds, "profile reload_host_seconds"),
        replay_host=_check_number(profile.replay_host_seconds, "profile replay_host_seconds"),
    )


def _host_layout(
    profile: Profile,
    start: np.ndarray,
    dur: np.ndarray,
    bdur: np.ndarray,
    t0: float,
    unit_saves: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Host time per unit (NOTE [Host time]): forward starts and end of forward when no
    group offloads, forward host time, backward host time, backward device time.

    Where no host time was measured, and the hooks cost nothing, every unit's host time
    equals its device time and the layout is ``_layout``'s, bit for bit.
    """
    pack = _check_number(profile.pack_host_seconds, "profile pack_host_seconds")
    unpack = _check_number(profile.unpack_host_seconds, "profile unpack_host_seconds")
    fwd_host = dur.copy()
    bwd_host = bdur.copy()
    for k, r in enumerate(profile.regions):
        if r.host_seconds is not None:
            fwd_host[2 * k + 1] = _check_number(
                r.host_seconds, f"region {_region_label(r)} host_seconds"
            )
        if r.backward_host_seconds is not None:
            bwd_host[2 * k + 1] = _check_number(
                r.backward_host_seconds, f"region {_region_label(r)} backward_host_seconds"
            )
    if pack > 0:
        fwd_host = fwd_host + pack * unit_saves
    if unpack > 0:
        bwd_host = bwd_host + unpack * unit_saves
    span = np.maximum(dur, fwd_host)
    if np.array_equal(span, dur):
        return start, fwd_host, bwd_host, bdur, t0
    ends = np.cumsum(span)
    host_start = np.concatenate(([0.0], ends[:-1]))
    return host_start, fwd_host, bwd_host, bdur, t0 + float(ends[-1] - np.cumsum(dur)[-1])


def placement_array(flat: FlatProfile, plan: Plan) -> np.ndarray:
    """The plan as one int8 per flat storage, checked for unknown keys and legality."""
    if not isinstance(plan, Plan):
        raise TypeError(f"expected a scheduler.Plan, got {type(plan).__name__}")
    default = Placement.parse(plan.default)
    place = np.full(flat.n_storages, int(default), dtype=np.int8)
    for key, p in plan.placements.items():
        idx = flat.key_index.get(key)
        if idx is None:
            raise ValueError(
                f"plan names storage {key!r}, which the profile does not have; keys are "
                "(region name, call index, storage index), root storages ('', 0, i)"
            )
        place[idx] = int(Placement.parse(p))
    check_legal(flat, place)
    return place


def check_legal(flat: FlatProfile, place: np.ndarray) -> None:
    """Raise ValueError naming the first storage whose placement is not allowed."""
    bits = np.left_shift(1, place.astype(np.int64))
    bad = np.flatnonzero((bits & flat.legal) == 0)
    if bad.size:
        i = int(bad[0])
        accepted = ", ".join(p.name for p in Placement if flat.legal[i] & (1 << int(p)))
        kind = ["activation", "input", "external", "root"][int(flat.kind[i])]
        raise ValueError(
            f"placement {Placement(int(place[i])).name} is not allowed for storage {flat.keys[i]!r} "
            f"(kind {kind}); accepted: {accepted}"
        )
    if not flat.has_link and bool(np.any(place == int(Placement.OFFLOAD))):
        raise ValueError(
            "the plan offloads but the profile has no host link (d2h_gbps and h2d_gbps must "
            "both be > 0); use KEEP or RECOMPUTE, or give the link bandwidths"
        )


# ------------------------------------------------------------------------------ kernels


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


@njit
def run_timeline(
    place, prefetch, save_order, st_ptr, unit_of, nbytes, save_time, last_save, st_prod,
    op_ptr, op_sec, op_serv, op_sink, out_ptr, out_idx, rd_ptr, rd_idx, noops, dataflow,
    fwd_dur, fwd_start, fwd_host, bwd_dev, bwd_host, t0, d2h_bps, h2d_bps, off_h, rel_h, rp_h,
    d2h_start, d2h_end, h2d_start, h2d_end, reach, cstart, cend, fstart, fend, riss, replay,
    ev_t, ev_d, mark, stack, op_host, op_view
):  # type: ignore[no-untyped-def]
    """Simulate one step; fills the per-storage/per-unit arrays and the memory events.

    Returns (step, peak, peak_time, stall, recompute, d2h_bytes, h2d_bytes, n_events,
    forward end); ``ev_t[:n_events]``/``ev_d[:n_events]`` hold the memory events sorted
    by time, frees first at equal times. ``riss[u]`` is when unit ``u``'s group reload
    was issued (-1: it offloads nothing).
    """
    n_st = nbytes.shape[0]
    n_u = fwd_dur.shape[0]
    top = n_u - 1
    # groups: the offloaded bytes of each unit (NOTE [Offload groups])
    gbytes = np.zeros(n_u, dtype=np.int64)
    goff = np.zeros(n_u, dtype=np.bool_)
    for s in range(n_st):
        if place[s] == 1:
            goff[unit_of[s]] = True
            gbytes[unit_of[s]] += nbytes[s]
    # forward: a unit takes the longer of its device and host time; issuing its group's
    # offload is host time at its exit (NOTE [Host time])
    shift = 0.0
    for u in range(n_u):
        fstart[u] = fwd_start[u] + shift
        span = max(fwd_dur[u], fwd_host[u])
        if goff[u] and off_h > 0.0:
            grown = max(fwd_dur[u], fwd_host[u] + off_h)
            shift += grown - span
            span = grown
        fend[u] = fstart[u] + span
    t_fwd = t0 + shift
    # D2H: one copy per group, issued at its unit's exit, FIFO in forward order
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
    for s in range(n_st):
        if place[s] == 1:
            d2h_start[s] = g_start[unit_of[s]]
            d2h_end[s] = g_end[unit_of[s]]
        else:
            d2h_start[s] = -1.0
            d2h_end[s] = -1.0
    recompute = 0.0
    for u in range(n_u):
        replay[u] = 0.0
        for s in range(st_ptr[u], st_ptr[u + 1]):
            if place[s] == 2:  # the call is not free: only where something is dropped
                replay[u] = replay_unit(
                    u, place, st_ptr, last_save, st_prod, op_ptr, op_sec, op_serv, op_sink,
                    out_ptr, out_idx, rd_ptr, rd_idx, noops, dataflow, fwd_dur, mark, stack,
                    op_host, op_view
                )
                break
        recompute += replay[u]
    # backward (no drain of the D2H stream first): reaching a unit whose group offloads
    # reloads it unless prefetched, and issues the next `prefetch` offloading groups
    # below it (NOTE [Offload groups])
    ready = np.zeros(n_u)
    by = np.zeros(n_u, dtype=np.int64)  # the unit whose reach issued each group's reload
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
        if replay[v] > 0.0:
            host += rp_h
        h_end = cs + replay[v] + host
        if h_end > cend[v]:
            cend[v] = h_end
        t = cend[v]
    step = t
    # NOTE [memory merge]: four event streams, each already sorted by time: saves (save
    # order), D2H landings (groups land in forward order), backward allocations (reloads
    # at issue, replay working sets at compute start) and backward frees (unit ends). They
    # are merged with frees first at equal times, so no sort is needed.
    inf = np.inf
    s1 = np.empty(n_st, dtype=np.int64)
    s2 = np.empty(n_st, dtype=np.int64)
    n1 = 0
    n2 = 0
    for i in range(n_st):
        s = save_order[i]
        if nbytes[s] == 0 or place[s] == 2:
            continue
        s1[n1] = s
        n1 += 1
    for s in range(n_st):  # flat order is forward unit order: landings in time order
        if place[s] == 1 and nbytes[s] > 0 and d2h_end[s] < riss[unit_of[s]]:
            s2[n2] = s
            n2 += 1
    s3t = np.empty(2 * n_u)
    s3b = np.zeros(2 * n_u, dtype=np.int64)
    s4t = np.empty(n_u)
    s4b = np.zeros(n_u, dtype=np.int64)
    for x in range(n_u):
        # a reload allocates at its issue; a group still on the device then stays
        if goff[x] and g_end[x] < riss[x]:
            s3b[2 * (top - by[x])] += gbytes[x]
    n3 = 0
    for v in range(top, -1, -1):
        s3t[n3] = reach[v]
        n3 += 1
        s3t[n3] = cstart[v]
        for s in range(st_ptr[v], st_ptr[v + 1]):
            if place[s] == 2:
                s3b[n3] += nbytes[s]
            s4b[top - v] += nbytes[s]
        n3 += 1
        s4t[top - v] = cend[v]
    n4 = n_u
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
        t2 = d2h_end[s2[i2]] if i2 < n2 else inf
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
    return step, peak, peak_t, stall, recompute, d2h_bytes, h2d_bytes, n_ev, t_fwd


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
        self.ev_t = np.zeros(2 * n + 3 * u + 1)
        self.ev_d = np.zeros(2 * n + 3 * u + 1, dtype=np.int64)
        self.mark = np.zeros(flat.op_sec.shape[0], dtype=np.bool_)
        self.stack = np.zeros(max(flat.max_unit_ops, 1), dtype=np.int64)
        self.n_events = 0

    def run(self, place: np.ndarray, prefetch: int) -> SimResult:
        f = self.flat
        # a link of 0 is only reachable with no OFFLOAD placement (check_legal)
        d2h = f.d2h_bps if f.d2h_bps > 0 else 1.0
        h2d = f.h2d_bps if f.h2d_bps > 0 else 1.0
        out = run_timeline(
            place, prefetch, f.save_order, f.st_ptr, f.unit_of, f.nbytes, f.save_time,
            f.last_save, f.st_prod, f.op_ptr, f.op_sec, f.op_serv, f.op_sink, f.out_ptr,
            f.out_idx, f.rd_ptr, f.rd_idx, f.noops, f.dataflow, f.fwd_dur, f.fwd_start,
            f.fwd_host, f.bwd_dev, f.bwd_host, f.t0, d2h, h2d, f.offload_host, f.reload_host,
            f.replay_host, self.d2h_start, self.d2h_end, self.h2d_start, self.h2d_end,
            self.reach, self.cstart, self.cend, self.fstart, self.fend, self.riss, self.replay,
            self.ev_t, self.ev_d, self.mark, self.stack, f.op_host, f.op_view
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


def check_prefetch(prefetch_regions: int) -> int:
    if (
        isinstance(prefetch_regions, bool)
        or not isinstance(prefetch_regions, (int, np.integer))
        or prefetch_regions < 0
    ):
        raise ValueError(
            f"prefetch_regions = {prefetch_regions!r} is invalid; accepted: an int >= 0"
        )
    return int(prefetch_regions)


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
    )


# -------------------------------------------------------------------------- lower bound


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
    fixed = np.zeros(n_ops + 1)
    for jj in range(n_ops):
        f = fixed_from[j0 + jj]
        if f <= n_ops:
            fixed[f] += op_sec[j0 + jj]
    for jj in range(n_ops):
        fixed[jj + 1] += fixed[jj]
    if dataflow[u]:
        # chain(s): s's producer (when it lists s and lies before s's last save) and the
        # never-servable ops it reaches through reads of earlier never-servable ops: all
        # of them run whenever s is dropped. Each op not in fixed is split evenly among the
        # droppable storages whose chain holds it.
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
                    if fixed_from[j] > n_ops:
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
    else:
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
    # items sorted by share per byte; prefix lengths clamped to the op count
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

    Relaxation (every step is implied by the model in this module's docstring):

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
      (the hooks' per-save costs, NOTE [Host time]); issue and replay host time only
      lengthen a plan, so leaving them out keeps the bound.
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
            flat.nbytes,
            flat.legal,
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
