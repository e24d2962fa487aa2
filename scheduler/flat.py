"""A profile as flat arrays: the form the numba kernels work on.

``flatten`` validates a ``Profile`` and lays it out by unit (the array names are the
legend's in ``scheduler.kernels``; the ops' arrays come from ``scheduler.opgraph``);
``placement_array`` turns a ``Plan`` into one placement per flat storage and checks it
against the storages' legality masks.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from scheduler.checks import (
    INT64_LIMIT,
    bad_storage,
    check_bytes,
    check_number,
    int_array,
    is_count,
    is_time,
    region_label,
    times_ok,
)
from scheduler.layout import host_times, issue_ahead, unit_times
from scheduler.opgraph import fixed_from, op_outputs, op_reads, producer_ops
from scheduler.plan import ROOT, Placement, Plan, StorageKey
from scheduler.profile import Profile, RegionRecord

__all__ = [
    "KEEP_BIT",
    "OFFLOAD_BIT",
    "RECOMPUTE_BIT",
    "FlatProfile",
    "check_legal",
    "flatten",
    "placement_array",
]

#: Bit of each placement in a legality mask.
KEEP_BIT, OFFLOAD_BIT, RECOMPUTE_BIT = 1, 2, 4
KIND_ACTIVATION, KIND_INPUT, KIND_EXTERNAL, KIND_ROOT, KIND_SNAPSHOT = 0, 1, 2, 3, 4
#: ``FlatProfile.positions`` bits.
RETURNED, ARGUMENT = 1, 2
_KIND_NAMES = ["activation", "input", "external", "root", "snapshot"]  # by code
_KIND_CODES = {name: k for k, name in enumerate(_KIND_NAMES) if k != KIND_ROOT}  # a profile's kinds
_LEGAL = {
    KIND_ACTIVATION: KEEP_BIT | OFFLOAD_BIT | RECOMPUTE_BIT,
    KIND_INPUT: KEEP_BIT | OFFLOAD_BIT,
    KIND_EXTERNAL: KEEP_BIT,
    KIND_ROOT: KEEP_BIT | OFFLOAD_BIT,
    KIND_SNAPSHOT: KEEP_BIT,
}


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
    first_save: np.ndarray
    """Per storage the ops of its unit dispatched before its first save (0 for roots)."""
    st_freed: np.ndarray
    """Per storage the ops of its unit recorded when its forward freed it, dropped (-1:
    unknown; NOTE [Forward transients] in scheduler.working_set)."""
    outlives: np.ndarray
    """Per storage: alive past its unit's forward though dropped (``StorageRecord.
    outlives_call``): held to the step's forward end when dropped (NOTE [Forward
    transients] in scheduler.working_set)."""
    shared: np.ndarray
    """Per storage the flat index of the earlier record of the same allocation
    (``StorageRecord.shared_with``), -1 for none."""
    allocation: np.ndarray
    """Per storage the flat index of the first record of its allocation: ``shared``
    followed to its end, the storage itself where it names none."""
    unsaved: np.ndarray
    """Per storage: held for a replay only, so a unit kept whole holds none: a region input
    no op of its region saves (``saves`` 0; NOTE [Inputs counted once] in
    offrecomp/shared.py), or a snapshot (NOTE [Replay and module state] in offrecomp/buffers.py)."""
    positions: np.ndarray
    """Per storage (int8): RETURNED where its call returned a tensor on it
    (``StorageRecord.returned``), plus ARGUMENT where a tensor argument of its call is on
    it (``StorageRecord.argument``) (NOTE [Whole calls counted once] in
    offrecomp/shared.py)."""
    held: np.ndarray
    """Per storage: the program holds it (or another record of its allocation) past
    backward's end (``StorageRecord.held``): resident until backward ends when kept
    (NOTE [Held past backward] in scheduler.timeline)."""
    choice: np.ndarray
    """``legal`` as the solver and the bound choose from: only KEEP where ``held``
    (dropping or offloading it frees nothing the program holds; a plan that does is
    still legal, and simulated), no OFFLOAD where ``outlives`` (its copy would free
    nothing before the step's forward ends)."""
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
    op_tr: np.ndarray
    """Per op its ``transient_bytes`` (NOTE [Replay transients] in scheduler.working_set)."""
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
    none was measured) plus the pack hook's cost per save (a region's under
    ``Profile.native_keep``: in ``fwd_hook``)."""
    bwd_dev: np.ndarray
    """Per unit its backward device time, without replay."""
    bwd_host: np.ndarray
    """Per unit its backward host time plus the unpack hook's cost per save (a region's
    under ``Profile.native_keep``: in ``bwd_hook``)."""
    fwd_hook: np.ndarray
    """Per unit the host time it adds to ``fwd_host`` under a plan that does not keep it
    whole (non-zero only for regions): its replay checkpoint
    (``Profile.capture_host_seconds``) and, under ``Profile.native_keep``, its pack
    hooks."""
    bwd_hook: np.ndarray
    """Per unit the unpack hooks' host time, likewise."""
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
    native_keep: bool = False
    """``Profile.native_keep``: a region a plan keeps whole has no records to be found."""

    def forward_end_bound(self) -> float:
        """Latest end of forward of any plan: every unit that may offload does, and every
        unit runs its hooks and takes its checkpoint (the forward's end only grows with
        the host time of any unit: NOTE [Host time] in scheduler.timeline)."""
        may = np.zeros(self.n_units, dtype=np.bool_)
        off = (self.legal & OFFLOAD_BIT) != 0
        may[self.unit_of[off]] = True
        host = self.fwd_host + self.fwd_hook
        _, longest = issue_ahead(self.fwd_dur, np.where(may, host + self.offload_host, host))
        _, base = issue_ahead(self.fwd_dur, self.fwd_host)
        return self.t0 + (longest - base)

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


# ----------------------------------------------------------------------------- flatten

_get_nbytes = operator.attrgetter("nbytes")
_get_offset = operator.attrgetter("offset_seconds")
_get_kind = operator.attrgetter("kind")
_get_keep_only = operator.attrgetter("keep_only")
_get_held = operator.attrgetter("held")
_get_returned = operator.attrgetter("returned")
_get_argument = operator.attrgetter("argument")
_get_last_save = operator.attrgetter("last_save_op")
_get_first_save = operator.attrgetter("first_save_op")
_get_producer = operator.attrgetter("producer_op")
_get_freed = operator.attrgetter("freed_op")
_get_outlives = operator.attrgetter("outlives_call")
_get_outputs = operator.attrgetter("outputs")
_get_skippable = operator.attrgetter("skippable")
_get_seconds = operator.attrgetter("seconds")
_get_sink = operator.attrgetter("sink")
_get_view = operator.attrgetter("view")
_get_reads = operator.attrgetter("reads")
_get_saves = operator.attrgetter("saves")
_get_transient = operator.attrgetter("transient_bytes")


class _Units(NamedTuple):
    """Where each region's storages and ops go in flat order (storages grouped by unit:
    a gap's root storages, by root index, then a region's storages)."""

    n_units: int
    sts: list[Any]
    """Region storages, in region order."""
    ops: list[Any]
    """Ops, in region order (global op index order)."""
    reg_st: np.ndarray
    """Per region its storage count."""
    reg_ops: np.ndarray
    """Per region its op count."""
    opaque: np.ndarray
    st_counts: np.ndarray
    op_counts: np.ndarray
    st_ptr: np.ndarray
    op_ptr: np.ndarray
    unit_of: np.ndarray
    op_unit: np.ndarray
    op_region: np.ndarray
    st_region: np.ndarray
    """Per region storage (region order) its region."""
    in_region: np.ndarray
    """Per flat storage: saved in a region (not a root storage)."""
    src: np.ndarray
    """Flat storage i is region storage src[i] (region order), or root src[i] - len(sts)."""


def _root_gaps(profile: Profile, start: np.ndarray, t0: float) -> tuple[np.ndarray, ...]:
    """Root storages' save times (clamped to the end of forward), the gap each goes to
    (the last gap started by its save time), and root indices in gap order."""
    roots = profile.root
    root_off = list(map(_get_offset, roots))
    if not times_ok(root_off):
        root_off = [
            check_number(s.offset_seconds, f"root storage {i} offset_seconds")
            for i, s in enumerate(roots)
        ]
    root_t = np.minimum(np.asarray(root_off, dtype=np.float64), t0)
    root_gap = np.searchsorted(start[0::2], root_t, side="right") - 1
    return root_t, root_gap, np.argsort(root_gap, kind="stable")


def _check_region_keys(regions: list[RegionRecord]) -> None:
    """ValueError for a (name, call_index) seen twice or a region named ROOT."""
    names = [r.name for r in regions]
    calls = [r.call_index for r in regions]
    if ROOT not in names and len(set(zip(names, calls))) == len(regions):
        return
    seen: set[tuple[str, int]] = set()
    for r in regions:
        if r.key in seen:
            raise ValueError(
                f"region {region_label(r)} appears twice in the profile; each (name, call_index) must be unique"
            )
        if r.name == ROOT:
            raise ValueError(
                f"region name {r.name!r} is reserved for root storages; give the region a name"
            )
        seen.add(r.key)


def _units(profile: Profile, root_gap: np.ndarray, root_order: np.ndarray) -> _Units:
    regions = profile.regions
    n = len(regions)
    n_units = 2 * n + 1
    st_lists = [r.storages for r in regions]
    op_lists = [r.ops for r in regions]
    sts = list(itertools.chain.from_iterable(st_lists))
    n_reg_st, n_root = len(sts), len(profile.root)
    reg_st = np.fromiter(map(len, st_lists), dtype=np.int64, count=n)
    reg_ops = np.fromiter(map(len, op_lists), dtype=np.int64, count=n)
    st_counts = np.empty(n_units, dtype=np.int64)
    st_counts[0::2] = np.bincount(root_gap, minlength=n + 1)
    st_counts[1::2] = reg_st
    op_counts = np.zeros(n_units, dtype=np.int64)
    op_counts[1::2] = reg_ops
    st_ptr = np.zeros(n_units + 1, dtype=np.int64)
    np.cumsum(st_counts, out=st_ptr[1:])
    op_ptr = np.zeros(n_units + 1, dtype=np.int64)
    np.cumsum(op_counts, out=op_ptr[1:])
    unit_of = np.repeat(np.arange(n_units, dtype=np.int64), st_counts)
    op_unit = np.repeat(np.arange(n_units, dtype=np.int64), op_counts)
    in_region = (unit_of % 2) == 1
    src = np.empty(n_reg_st + n_root, dtype=np.int64)
    src[in_region] = np.arange(n_reg_st, dtype=np.int64)
    src[~in_region] = n_reg_st + root_order
    return _Units(
        n_units=n_units,
        sts=sts,
        ops=list(itertools.chain.from_iterable(op_lists)),
        reg_st=reg_st,
        reg_ops=reg_ops,
        opaque=np.asarray([bool(r.opaque) for r in regions], dtype=np.bool_),
        st_counts=st_counts,
        op_counts=op_counts,
        st_ptr=st_ptr,
        op_ptr=op_ptr,
        unit_of=unit_of,
        op_unit=op_unit,
        op_region=op_unit // 2,
        st_region=np.repeat(np.arange(n, dtype=np.int64), reg_st),
        in_region=in_region,
        src=src,
    )


class _OpArrays(NamedTuple):
    out_ptr: np.ndarray
    out_idx: np.ndarray
    op_serv: np.ndarray
    df_region: np.ndarray
    """Per region: replays demand-driven (not opaque, and every op has reads)."""
    rd_ptr: np.ndarray
    rd_idx: np.ndarray
    st_prod: np.ndarray
    """Per storage, region storages first then roots (not yet in flat order)."""
    op_sink: np.ndarray
    op_view: np.ndarray


def _op_arrays(profile: Profile, un: _Units) -> _OpArrays:
    """Ops' outputs, reads (dataflow regions only) and flags, storages' producers."""
    ops = un.ops
    n = un.reg_st.shape[0]
    n_ops = len(ops)
    outs = list(map(_get_outputs, ops))
    op_skip = np.asarray(list(map(_get_skippable, ops)), dtype=np.bool_) & ~un.opaque[un.op_region]
    out_ptr, out_idx, op_serv = op_outputs(
        profile,
        list(itertools.chain.from_iterable(outs)),
        list(map(len, outs)),
        un.st_ptr[un.op_unit],
        un.st_counts[un.op_unit],
        op_skip,
    )
    # a region replays demand-driven when it is not opaque and every op has reads
    rds = list(map(_get_reads, ops))
    df_region = ~un.opaque & (un.reg_ops > 0)
    if None in rds:
        unknown = np.asarray([x is None for x in rds], dtype=np.bool_)
        df_region &= np.bincount(un.op_region[unknown], minlength=n) == 0
    df_op = df_region[un.op_region]
    if not bool(df_op.all()):
        rds = list(itertools.compress(rds, df_op.tolist()))
    rd_lens = np.zeros(n_ops, dtype=np.int64)
    rd_lens[df_op] = list(map(len, rds))
    op_start = np.repeat(un.op_ptr[:-1], un.op_counts)
    op_count = np.repeat(un.op_counts, un.op_counts)
    rd_ptr, rd_idx = op_reads(
        profile, list(itertools.chain.from_iterable(rds)), rd_lens, op_start, op_count
    )
    n_reg_st = len(un.sts)
    st_prod = np.full(n_reg_st + len(profile.root), -1, dtype=np.int64)
    st_prod[:n_reg_st] = producer_ops(
        profile,
        list(map(_get_producer, un.sts)),
        un.op_ptr[1::2][un.st_region],
        un.reg_ops[un.st_region],
    )
    sink_arr = np.asarray(list(map(_get_sink, ops)), dtype=np.bool_)
    return _OpArrays(
        out_ptr=out_ptr,
        out_idx=out_idx,
        op_serv=op_serv,
        df_region=df_region,
        rd_ptr=rd_ptr,
        rd_idx=rd_idx,
        st_prod=st_prod,
        op_sink=sink_arr,
        op_view=np.asarray(list(map(_get_view, ops)), dtype=np.bool_) & ~sink_arr,
    )


class _StorageColumns(NamedTuple):
    """Checked storage attributes, region storages first then roots (``last_save``,
    ``offsets`` and ``kind``: region storages only)."""

    nbytes: np.ndarray | None
    """None where a value is bad and ``bad_storage`` found none to name."""
    last_save: np.ndarray | None
    first_save: np.ndarray | None
    offsets: list[Any]
    kind: np.ndarray


#: Bytes of one storage (below), and of a profile's storages together: the simulator's
#: byte sums stay exact in int64.
NBYTES_LIMIT = 2**53
TOTAL_BYTES_LIMIT = 2**62


def _freed(sts: list[Any]) -> np.ndarray:
    """Per region storage its ``freed_op``; -1 (unknown) where it is not an int >= 0
    (NOTE [Forward transients] in scheduler.working_set)."""
    return np.fromiter(
        (f if isinstance(f, int) and not isinstance(f, bool) and -1 <= f < 2**62 else -1 for f in map(_get_freed, sts)),
        dtype=np.int64,
        count=len(sts),
    )


def _storage_columns(profile: Profile, sts: list[Any]) -> _StorageColumns:
    nb_arr = int_array(list(map(_get_nbytes, sts)) + list(map(_get_nbytes, profile.root)), NBYTES_LIMIT)
    if nb_arr is None:
        bad_storage(
            profile, "nbytes", "an int from 0 to 2**53 - 1", lambda s: is_count(s.nbytes) and s.nbytes < NBYTES_LIMIT
        )
    elif (total := float(nb_arr.sum(dtype=np.float64))) >= TOTAL_BYTES_LIMIT:
        raise ValueError(
            f"the profile's storages hold {total:.4g} bytes in all; accepted: under 2**62 ({TOTAL_BYTES_LIMIT:.4g})"
        )
    ls_arr = int_array(list(map(_get_last_save, sts)))
    if ls_arr is None:
        bad_storage(
            profile, "last_save_op", "an int from 0 to 2**63 - 1", lambda s: is_count(s.last_save_op) and s.last_save_op < INT64_LIMIT
        )
    fs_arr = int_array(list(map(_get_first_save, sts)))
    if fs_arr is None:
        bad_storage(
            profile, "first_save_op", "an int from 0 to 2**63 - 1", lambda s: is_count(s.first_save_op) and s.first_save_op < INT64_LIMIT
        )
    offsets = list(map(_get_offset, sts))
    if not times_ok(offsets):
        bad_storage(
            profile, "offset_seconds", "a finite number >= 0", lambda s: is_time(s.offset_seconds)
        )
    try:
        kind_reg = np.fromiter(
            map(_KIND_CODES.__getitem__, map(_get_kind, sts)), dtype=np.int64, count=len(sts)
        )
    except (KeyError, TypeError):
        bad_storage(profile, "kind", ", ".join(_KIND_CODES), lambda s: s.kind in _KIND_CODES)
        raise
    return _StorageColumns(nbytes=nb_arr, last_save=ls_arr, first_save=fs_arr, offsets=offsets, kind=kind_reg)


def _op_seconds(profile: Profile, ops: list[Any]) -> list[Any]:
    """Each op's seconds, checked."""
    op_sec = list(map(_get_seconds, ops))
    if not times_ok(op_sec):
        for r in profile.regions:
            for j, op in enumerate(r.ops):
                check_number(op.seconds, f"op {j} of region {region_label(r)} seconds")
    return op_sec


def _op_transients(profile: Profile, ops: list[Any]) -> np.ndarray:
    """Each op's ``transient_bytes``, checked."""
    arr = int_array(list(map(_get_transient, ops)), NBYTES_LIMIT)
    if arr is None:
        for r in profile.regions:
            for j, op in enumerate(r.ops):
                if not (is_count(op.transient_bytes) and op.transient_bytes < NBYTES_LIMIT):
                    raise ValueError(
                        f"op {j} of region {region_label(r)} transient_bytes = {op.transient_bytes!r} is "
                        "invalid; accepted: an int from 0 to 2**53 - 1"
                    )
    assert arr is not None
    return arr


def _held(profile: Profile, un: _Units) -> np.ndarray:
    """Per flat storage its ``held`` flag."""
    held = list(map(_get_held, un.sts)) + list(map(_get_held, profile.root))
    return np.asarray(held, dtype=np.bool_).reshape(-1)[un.src]


def _flags(profile: Profile, un: _Units, get: Callable[[Any], Any]) -> np.ndarray:
    """Per flat storage the flag ``get`` reads of its record (a root storage's: False)."""
    out = [bool(x) for x in map(get, un.sts)] + [False] * len(profile.root)
    return np.asarray(out, dtype=np.bool_).reshape(-1)[un.src]


def _legality(profile: Profile, un: _Units, kind_reg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per flat storage its kind code and the placements it allows: by kind, only KEEP
    where ``keep_only``, and no RECOMPUTE in a region that must never replay."""
    n_root = len(profile.root)
    src = un.src
    kind_arr = np.concatenate((kind_reg, np.full(n_root, KIND_ROOT, dtype=np.int64)))[src]
    legal_of = np.asarray([_LEGAL[k] for k in range(len(_LEGAL))], dtype=np.int64)
    legal = legal_of[kind_arr]
    if any(map(_get_keep_only, un.sts)):
        only = np.fromiter(map(_get_keep_only, un.sts), dtype=np.bool_, count=len(un.sts))
        legal = np.where(np.concatenate((only, np.zeros(n_root, dtype=np.bool_)))[src], KEEP_BIT, legal)
    frozen = np.asarray([not r.replayable for r in profile.regions], dtype=np.bool_)
    if frozen.any():
        no_replay = np.concatenate((frozen[un.st_region], np.zeros(n_root, dtype=np.bool_)))[src]
        legal = np.where(no_replay, legal & ~RECOMPUTE_BIT, legal)
    return kind_arr, legal


def _saves(profile: Profile, un: _Units) -> tuple[np.ndarray, np.ndarray]:
    """Per flat storage its ``saves``, and per unit their sum as float64."""
    sv_arr = int_array(list(map(_get_saves, un.sts)) + list(map(_get_saves, profile.root)))
    if sv_arr is None:
        bad_storage(
            profile, "saves", "an int from 0 to 2**63 - 1", lambda s: is_count(s.saves) and s.saves < INT64_LIMIT
        )
    assert sv_arr is not None
    saves = sv_arr[un.src]
    return saves, np.bincount(un.unit_of, weights=saves.astype(np.float64), minlength=un.n_units)


def _keys(
    regions: list[RegionRecord], un: _Units, root_order: np.ndarray
) -> tuple[list[StorageKey], list[str]]:
    """Plan key of each flat storage, and each unit's name."""
    n = len(regions)
    unit_names = ["(root)"] * un.n_units
    unit_names[1::2] = [f"{r.name}#{r.call_index}" for r in regions]
    # gap k's root storages: root_keys[gap_ptr[k]:gap_ptr[k + 1]]
    root_keys = [(ROOT, 0, i) for i in root_order.tolist()]
    gap_ptr = [0, *np.cumsum(un.st_counts[0::2]).tolist()]
    keys: list[StorageKey] = []
    for k, (r, m) in enumerate(zip(regions, un.reg_st.tolist())):
        name, call = r.name, r.call_index
        keys += root_keys[gap_ptr[k] : gap_ptr[k + 1]]
        keys.extend(zip(itertools.repeat(name, m), itertools.repeat(call, m), range(m)))
    keys += root_keys[gap_ptr[n] :]
    return keys, unit_names


def _link_shared(flat: FlatProfile, sts: list[Any], root: list[Any], src: np.ndarray) -> None:
    """Fill ``flat.shared``: per flat storage the flat index of the record its
    ``shared_with`` names (left -1: none, or a key the profile lacks); and from it
    ``flat.allocation``."""
    named = [getattr(st, "shared_with", None) for st in (*sts, *root)]
    if not any(k is not None for k in named):
        return
    out, index = flat.shared, flat.key_index
    for i, j in enumerate(src.tolist()):
        k = named[j]
        if k is not None:
            try:
                out[i] = index.get((str(k[0]), int(k[1]), int(k[2])), -1)
            except (TypeError, ValueError, IndexError):
                raise ValueError(
                    f"storage shared_with = {k!r} is invalid; accepted: None or a (region, call, index) key"
                ) from None
    _first_records(out, flat.allocation)
    if flat.held.any():  # the program holds the allocation: every record of it is held
        alloc = np.zeros_like(flat.held)
        alloc[flat.allocation[flat.held]] = True
        held = alloc[flat.allocation]
        flat.held[:] = held


def _per_region_unit(values: np.ndarray, n_units: int) -> np.ndarray:
    """A per-region bool array as a per-unit one (False in gaps)."""
    out = np.zeros(n_units, dtype=np.bool_)
    out[1::2] = values
    return out


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
    start, dur, bdur, t0 = unit_times(profile)
    d2h = check_number(profile.d2h_gbps, "profile d2h_gbps") * 1e9
    h2d = check_number(profile.h2d_gbps, "profile h2d_gbps") * 1e9
    root_t, root_gap, root_order = _root_gaps(profile, start, t0)
    _check_region_keys(regions)
    un = _units(profile, root_gap, root_order)
    ops = _op_arrays(profile, un)
    cols = _storage_columns(profile, un.sts)
    op_sec = _op_seconds(profile, un.ops)
    assert cols.nbytes is not None and cols.last_save is not None and cols.first_save is not None  # bad_storage raised
    kind_arr, legal = _legality(profile, un, cols.kind)
    saves, unit_saves = _saves(profile, un)
    host_start, fwd_host, bwd_host, bwd_dev, t0, fwd_hook, bwd_hook = host_times(
        profile, start, dur, bdur, t0, unit_saves
    )
    src, unit_arr = un.src, un.unit_of
    off_arr = np.concatenate((np.asarray(cols.offsets, dtype=np.float64), root_t))[src]
    # region storages: unit start + offset clamped to the unit; root: absolute, clamped
    # above; both moved by the host time the units before theirs add (NOTE [Host time])
    save_arr = np.where(un.in_region, start[unit_arr] + np.minimum(off_arr, dur[unit_arr]), off_arr)
    save_arr = save_arr + (host_start - start)[unit_arr]
    # by save time, then unit, then index: flat order is by unit, so a stable sort suffices
    order = np.argsort(save_arr, kind="stable").astype(np.int64)
    keys, unit_names = _keys(regions, un, root_order)
    df_arr = _per_region_unit(ops.df_region, un.n_units)
    n_root = len(profile.root)
    flat = FlatProfile(
        keys=keys,
        unit_names=unit_names,
        st_ptr=un.st_ptr,
        unit_of=unit_arr,
        nbytes=cols.nbytes[src],
        save_time=save_arr,
        kind=kind_arr,
        legal=legal,
        last_save=np.concatenate((cols.last_save, np.zeros(n_root, dtype=np.int64)))[src],
        first_save=np.concatenate((cols.first_save, np.zeros(n_root, dtype=np.int64)))[src],
        st_freed=np.concatenate((_freed(un.sts), np.full(n_root, -1, dtype=np.int64)))[src],
        outlives=_flags(profile, un, _get_outlives),
        shared=np.full(len(keys), -1, dtype=np.int64),
        allocation=np.arange(len(keys), dtype=np.int64),
        unsaved=((kind_arr == KIND_INPUT) & (saves == 0)) | (kind_arr == KIND_SNAPSHOT),
        positions=(
            _flags(profile, un, _get_returned).astype(np.int8) * RETURNED
            + _flags(profile, un, _get_argument).astype(np.int8) * ARGUMENT
        ),
        held=_held(profile, un),
        choice=legal,
        save_order=order,
        op_ptr=un.op_ptr,
        op_sec=np.asarray(op_sec, dtype=np.float64),
        op_serv=ops.op_serv,
        out_ptr=ops.out_ptr,
        out_idx=ops.out_idx,
        noops=_per_region_unit(un.reg_ops == 0, un.n_units),
        dataflow=df_arr,
        op_sink=ops.op_sink,
        op_view=ops.op_view,
        rd_ptr=ops.rd_ptr,
        rd_idx=ops.rd_idx,
        st_prod=ops.st_prod[src],
        fixed_from=fixed_from(un.op_ptr, ops.op_serv, ops.op_sink, ops.op_view, ops.rd_ptr, ops.rd_idx, df_arr),
        op_tr=_op_transients(profile, un.ops),
        fwd_start=host_start,
        fwd_dur=dur,
        bwd_dur=np.maximum(bwd_dev, bwd_host),
        t0=float(t0),
        fwd_host=fwd_host,
        bwd_dev=bwd_dev,
        bwd_host=bwd_host,
        fwd_hook=fwd_hook,
        bwd_hook=bwd_hook,
        d2h_bps=d2h,
        h2d_bps=h2d,
        host_limit_bytes=check_bytes(profile.host_limit_bytes, "profile host_limit_bytes", "(0: unlimited)"),
        op_host=check_number(profile.replay_op_seconds, "profile replay_op_seconds"),
        offload_host=check_number(profile.offload_host_seconds, "profile offload_host_seconds"),
        reload_host=check_number(profile.reload_host_seconds, "profile reload_host_seconds"),
        replay_host=check_number(profile.replay_host_seconds, "profile replay_host_seconds"),
        native_keep=bool(profile.native_keep),
    )
    _link_shared(flat, un.sts, profile.root, src)
    if flat.outlives.any():  # NOTE [Forward transients] (scheduler.working_set)
        flat.choice = np.where(flat.outlives, legal & ~OFFLOAD_BIT, legal)
    if flat.held.any():
        flat.choice = np.where(flat.held, KEEP_BIT, flat.choice)
    return flat


def _first_records(shared: np.ndarray, allocation: np.ndarray) -> None:
    """Fill ``allocation`` (each storage's own index on entry) with the first record of
    each storage's allocation, following ``shared`` (-1: none) to its end."""
    for _ in range(shared.shape[0]):  # a chain is at most that long
        nxt = shared[allocation]
        step = nxt >= 0
        if not step.any():
            return
        allocation[step] = nxt[step]


# ---------------------------------------------------------------------------- placements


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
        kind = _KIND_NAMES[int(flat.kind[i])]
        raise ValueError(
            f"placement {Placement(int(place[i])).name} is not allowed for storage {flat.keys[i]!r} "
            f"(kind {kind}); accepted: {accepted}"
        )
    if not flat.has_link and bool(np.any(place == int(Placement.OFFLOAD))):
        raise ValueError(
            "the plan offloads but the profile has no host link (d2h_gbps and h2d_gbps must "
            "both be > 0); use KEEP or RECOMPUTE, or give the link bandwidths"
        )

