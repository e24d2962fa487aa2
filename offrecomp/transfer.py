"""The unit of transfer of the offload engine: a group of storages, and a step's stats.

A :class:`Group` holds the storages one region call (or one run of root saves) offloads,
at slots of one pinned block (:func:`slot_offsets`); the engine (``offload.py``) moves it
as one unit (NOTE [Offload groups] in ``groups.py``).
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import accumulate
from typing import Any

import torch

from offrecomp import _torch_compat as tc
from offrecomp.backends import Backend, Event, Stream
from offrecomp.handles import interned, interned_shape
from offrecomp.pool import ALIGN_BYTES, Block

__all__ = [
    "BACKWARD_START",
    "NOT_PLANNED",
    "Group",
    "GroupState",
    "InFlight",
    "OffloadStats",
    "ReloadBuffer",
    "ReloadBuffers",
    "gbps",
    "slot_offsets",
    "slot_views",
]


# NOTE [Host slot lifetime]
# A group's pinned block is written by its D2H copy and read by every reload of it
# (retain_graph fetches it again). The engine's free() therefore does not return the
# block at once: the group waits in the engine's `_deferred` until query() says its D2H
# copy and its latest H2D copy landed (one H2D stream per device runs in order, so the
# latest implies the earlier ones). Returning it earlier would let the next group's D2H
# copy overwrite data a reload is still reading. The waiting groups are checked (two
# queries each) only where blocks are handed out (issue, prepare) and at end_step and
# synchronize, not at each engine call: backward frees every group while the last
# reloads are still in flight.


# NOTE [Prefetch order]
# Groups carry `ordinal`, their region call's place in forward order. Backward runs
# regions in reverse, so reloads are issued in reverse issue order. On the first fetch
# of group g after its reload (or its serving): Prefetch(regions=N) reloads the next N
# groups of this step below g (groups with nothing offloaded do not exist, so they do
# not count); Prefetch(nbytes=B) walks the same order and issues reloads while the bytes
# reloaded but not yet fetched stay within B (one reload is always allowed when none is
# outstanding). A group in that order whose sources are still held is served instead
# (NOTE [Served groups]): pinned, no copy, no bytes outstanding. A group is prefetched
# at most once per backward pass: it qualifies only if it has been fetched fewer times
# than the group being fetched now, so a second backward (retain_graph) prefetches the
# released groups again while the first never reloads what it already consumed.
# Ordering is per step; groups of earlier steps are reloaded on demand only. A group of
# a pass whose plan chose its depth (NOTE [Chosen prefetch] in scheduler/solver/api.py)
# reloads that many ahead instead of the engine's ``prefetch`` (``Group.depth``).

# NOTE [Served groups]
# Outside a plan, a group's sources stay held until query() says its copy landed. When
# the link lags the forward (or the host runs ahead of the device), the last groups are
# still held as backward reaches them: a reload would allocate a second copy of them
# beside the first and wait for the round trip. Such a group is served instead: its
# first unpack (or a prefetch, which would have reloaded it) pins its held sources, and
# unpack hands out views of them, as keep would. Its memory is never more than the
# reload's (sources held, no buffer), and goes as a reload's would: when each of its
# saves was unpacked, and the copy landed or compute waited on it. A plan lets go of
# every group by backward's start (NOTE [Planned release] in groups.py), so only forced
# and unplanned offload serve. ``OffloadEngine.serve_held = False`` turns it off (the
# test suite's default, so that its offload runs keep reloading on the emulated
# backend, whose copies start late).


def slot_offsets(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Offsets of consecutive slots of ``sizes`` bytes in one block, each aligned to
    ``ALIGN_BYTES`` (a multiple of every element size), and the block's size."""
    # aligned(n), inline: once per storage
    offsets = list(accumulate([-(-n // ALIGN_BYTES) * ALIGN_BYTES for n in sizes], initial=0))
    end = offsets.pop()
    return offsets, end


_VERSION = operator.attrgetter("_version")
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")

#: ``InFlight.release_at`` of a group issued outside a plan: only its landed copy lets
#: go of its sources (NOTE [Planned release] in groups.py).
NOT_PLANNED = 1 << 62
#: The end of the last unit of forward, backward's start: every planned group goes there.
BACKWARD_START = NOT_PLANNED - 1

#: Slot layouts by the sizes they lay out: offsets, block size, payload bytes.
_LAYOUTS: dict[tuple[int, ...], tuple[tuple[int, ...], int, int]] = {}
_MAX_LAYOUTS = 4096


#: The kept tuples of slot shapes (``Group.shapes``), one per distinct tuple.
_SHAPE_TUPLES: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _interned_shapes(shapes: tuple[Any, ...]) -> tuple[Any, ...]:
    """The one kept tuple equal to ``shapes``, of the one kept ``torch.Size`` of each
    geometry; a symbolic one, which does not hash, as it is (NOTE [Interned geometry] in
    handles.py)."""
    return interned(_SHAPE_TUPLES, shapes, _of_kept_shapes)


def _of_kept_shapes(shapes: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(s if s is None else interned_shape(s) for s in shapes)


class GroupState(enum.Enum):
    OPEN = "open"
    """Collecting storages; nothing copied yet."""
    OFFLOADED = "offloaded"
    """The host copy is issued; the engine holds no device buffer."""
    RELOADING = "reloading"
    """A reload is issued and compute has not waited on it yet."""
    FETCHED = "fetched"
    """Compute waited on the reload; its buffer is handed out (until release_device)."""
    SERVED = "served"
    """Its device sources, still held for the copy, are handed out instead of a reload
    (until release_device: NOTE [Served groups])."""
    FREED = "freed"


class Group:
    """The storages one region call (or one run of root saves) offloads; made by
    :meth:`OffloadEngine.open_group`.

    ``OffloadEngine.add`` appends its storages on the save path. ``handles`` and
    ``uses`` are the caller's counters: saves of the group alive in autograd, and unpacks
    since the latest reload (NOTE [Reload buffer lifetime]).
    """

    __slots__ = (
        "__weakref__",
        "block",
        "buffer",
        "d2h_done",
        "depth",
        "device",
        "dtypes",
        "fetches",
        "h2d_done",
        "handles",
        "in_flight",
        "issue_versions",
        "live",
        "nbytes",
        "offsets",
        "ordinal",
        "payload_bytes",
        "reuse",
        "seq",
        "served",
        "shapes",
        "sizes",
        "sources",
        "state",
        "step",
        "strides",
        "typed_views",
        "uses",
        "versions",
        "views",
        "waited",
    )

    def __init__(self, ordinal: int, device: torch.device, step: int) -> None:
        self.ordinal = ordinal  # region-call ordinal in forward order (larger = later)
        self.device = device
        self.sources: list[Any] = []  # until issue(): see ``OffloadEngine.add``
        self.sizes: list[int] = []
        self.shapes: tuple[torch.Size | None, ...] = ()  # each typed source's size (None: flat), from ``seal``
        self.dtypes: tuple[torch.dtype | None, ...] = ()  # and its dtype
        self.strides: dict[int, tuple[int, ...]] = {}  # a typed source's strides, where not contiguous
        self.offsets: Sequence[int] = ()  # slot_offsets(sizes), from ``seal``
        self.in_flight: list[torch.Tensor] | None = None  # its sources, issued and not dropped yet
        self.served: list[torch.Tensor] | None = None  # its sources, handed out (GroupState.SERVED)
        self.versions: list[int] = []
        """Each source's version when the engine let go of the sources, or at a fetch
        before that (NOTE [Writes after a save] in handles.py)."""
        self.issue_versions: list[int] = []
        """Each source's version when its copy was issued: a slot whose ``versions`` entry
        differs was written while the copy was in flight (NOTE [Serving from reloads] in
        regenerate.py)."""
        self.nbytes = 0  # the block's size: aligned slots (from ``seal``)
        self.payload_bytes = 0  # bytes of the storages, without alignment (from ``seal``)
        self.state = GroupState.OPEN
        self.seq = -1  # issue order within the step
        self.depth: int | None = None  # groups its first fetch reloads ahead; None: the engine's prefetch
        self.fetches = 0  # times a reload was handed to compute
        self.handles = 0
        self.uses = 0
        self.live = False  # the caller's: counted among the groups it has not freed
        # What the engine that made it records as it moves the group (OffloadEngine):
        self.step = step  # the engine's step when it was opened
        self.block: Block | None = None  # its pinned host block, from issue until returned
        self.d2h_done: Event = None  # its copy to host landed
        self.h2d_done: Event = None  # its latest reload landed
        self.buffer: torch.Tensor | None = None  # the latest reload's device buffer
        self.typed_views: dict[torch.dtype, torch.Tensor] = {}
        """Views of the fetched buffer by dtype, made since the latest reload: the unpack's
        fast path reads them without a call."""
        self.waited = False  # compute waited on the latest reload (NOTE [Stream ordering] edge 5)
        self.reuse: ReloadBuffer | None = None  # the reload's buffer, when it is a reused one
        self.views: dict[int, tuple[tuple[Any, ...], torch.Tensor]] | None = None
        """``reuse.views`` once the reload into a reused buffer is fetched (the unpack's
        fast path reads it)."""

    def seal(self) -> None:
        """Lay out the slots (``offsets``, ``nbytes``, ``payload_bytes``, and each
        source's ``shapes`` and ``dtypes``): the group takes no more storages (its issue,
        or its discard). A step's groups repeat the last one's sizes and shapes, so
        layouts are computed once per sizes, and one tuple of shapes is kept per distinct
        tuple (NOTE [Interned geometry] in handles.py)."""
        sizes = tuple(self.sizes)
        layout = _LAYOUTS.get(sizes)
        if layout is None:
            if len(_LAYOUTS) >= _MAX_LAYOUTS:
                _LAYOUTS.clear()
            offsets, end = slot_offsets(sizes)
            layout = _LAYOUTS[sizes] = (tuple(offsets), end, sum(sizes))
        self.offsets, self.nbytes, self.payload_bytes = layout
        sources = self.sources
        try:  # read once per group, not per save (OffloadEngine.add)
            shapes: tuple[Any, ...] = tuple(map(_SHAPE, sources))
            self.dtypes = tuple(map(_DTYPE, sources))
        except AttributeError:  # a storage among them: its slot is flat
            shapes = tuple(s.shape if isinstance(s, torch.Tensor) else None for s in sources)
            self.dtypes = tuple(s.dtype if isinstance(s, torch.Tensor) else None for s in sources)
        self.shapes = _interned_shapes(shapes)

    def hold(self, sources: list[torch.Tensor]) -> None:
        """The engine holds these sources of the issued copy until it lets go of them."""
        self.in_flight = sources
        self.issue_versions = list(map(_VERSION, sources))

    def see_writes(self) -> None:
        """Record the versions of the sources still held (NOTE [Writes after a save] in
        handles.py)."""
        if self.in_flight is not None:
            self.versions = list(map(_VERSION, self.in_flight))

    @property
    def ready(self) -> torch.Tensor | None:
        """The reloaded buffer, once compute has waited on it (the fetch fast path)."""
        return self.buffer if self.state is GroupState.FETCHED else None

    @property
    def holds_reload(self) -> bool:
        """A reload of it is issued or handed out, or its sources are served: device
        memory until ``release_device``."""
        state = self.state
        return state is GroupState.RELOADING or state is GroupState.FETCHED or state is GroupState.SERVED

    def typed(self, dtype: torch.dtype) -> torch.Tensor:
        """The fetched buffer viewed as ``dtype`` (made once per reload and dtype): a
        saved tensor is one ``as_strided`` of it."""
        view = self.typed_views.get(dtype)
        if view is None:
            buffer = self.ready
            if buffer is None:
                raise RuntimeError(f"offrecomp: {self!r} is not fetched")
            view = self.typed_views[dtype] = buffer.view(dtype)
        return view

    def set_buffer(self, buffer: torch.Tensor | None, reuse: ReloadBuffer | None = None) -> None:
        self.buffer = buffer
        self.typed_views = {}
        self.reuse = reuse
        self.views = None  # ``reuse.views`` once compute waited on the reload (OffloadEngine.fetch)

    def __repr__(self) -> str:
        return (
            f"Group(ordinal={self.ordinal}, storages={len(self.sizes)}, "
            f"nbytes={self.nbytes}, device={self.device}, state={self.state.value})"
        )


# NOTE [Typed sources]
# A copy needs a tensor on each side. A saved tensor (or region input) that is
# contiguous, covers its whole storage (most activations) and has a dtype whose copy
# moves bytes as they are (floating point and integers of 8 to 64 bits: a bool copy
# writes 1 for any nonzero byte, which another view of the storage would read, and
# sub-byte dtypes have no copy kernel) joins its group as ``t.detach()``, an alias
# outside autograd that shares t's version counter (NOTE [Writes after a save] in
# handles.py), and its slot's host view takes the same dtype and size: the copy moves
# the storage's bytes with no tensor made at issue. A view of part of a storage, or a
# permuted one (a transposed weight a matrix product saves, attention's heads), whose
# base covers the storage so joins as the base's alias, of the base's dtype and size
# (views share their base's version counter). A tensor that fills its storage from the
# first element in another order of its dimensions (attention's output, made permuted)
# joins as itself, and its slot's host view takes its strides too: the copy between two
# tensors of one layout moves the storage's bytes as they are. Any other storage joins
# as the storage, and issue() makes one flat uint8 tensor over it (two dispatcher
# calls). Slot views are made once per block and layout (sizes, geometries and
# strides), so a step that repeats the last one's groups makes none. The first save
# of a storage that a contiguous save covers gets a TypedHandle (handles.py): its size and dtype are its slot's,
# so the handle keeps only the strides (a contiguous tensor's size-1 dimensions may
# have any stride, and the reload must give back the saved ones).


# NOTE [Reload buffer lifetime]
# A group is reloaded into one device buffer allocated on the compute stream, the stream
# that reads it, as PyTorch's compiler-side offload does: its block is then reused only
# in compute's order, after the reads, with no record_stream (whose release time nobody
# controls, pytorch #106360). The H2D copy is ordered after the allocation (edge 4 of
# NOTE [Stream ordering] in offload.py) and compute after the copy (edges 5 and 6). The
# saved tensors handed out are views of that buffer; the engine drops its own reference
# when every save of the group has been unpacked once (release_device) and the views
# keep the memory as long as autograd does.

# NOTE [Reused reload buffers]
# Handing out a saved tensor as a view of its group's reload (``as_strided``) costs the
# host a dispatcher call and a view record per unpack, more than all the rest of the
# unpack. ``.data`` of a tensor of the right geometry costs a quarter of that (no
# dispatcher, no view record), but needs such a tensor on the reload's storage first.
# Each unpack hands out a tensor of its own: autograd passes what unpack returns on as
# it is where the saved variable needs no gradient edge, and the cached alias itself,
# handed out, would hold no use of the storage of its own (emptying counts uses).
# So a reload reuses one device storage per group position (its device and its place in
# its step's issue order, which a step that repeats the last one's calls repeats) from
# step to step: the storage is grown (``resize_``) on the compute stream for the reload,
# as a fresh buffer would be allocated there (NOTE [Reload buffer lifetime]), and
# emptied again once nothing uses it; the unpack caches, per pack index, a ``.data``
# alias of the view it made, and hands out ``.data`` of that alias when the next
# reload's save has the same geometry: a typed save's is its slot's offset, shape and
# dtype and its strides, so the buffer checks its groups' slot
# layout once per fetch (``ReloadBuffer.views_for``: another layout begins the cache
# again) and a typed save's unpack compares only its slot and strides. Emptying needs
# proof that nothing outside still reads the storage: its use count (every tensor on it
# holds one) must be exactly the storage object's and the cached aliases', and no one
# but the buffer may hold the storage object (``untyped_storage()`` of every tensor on
# it returns that one object, and holding it adds no use). A storage that autograd, a
# user or a pending copy still uses stays as it is (busy): its position's next reload
# takes a fresh buffer, as without reuse. The check runs at every engine call, so the
# memory of a released group goes at the next fetch or at the step's end, not at its
# last tensor's death; in backward the next group's fetch follows at once. A reload
# whose allocation fails leaves its position free. An unpack that finds its group
# released after it took an alias (another thread's backward) makes its view again,
# from a new fetch. Emptied, the cached aliases describe tensors on a storage of no
# bytes: nothing hands them out then.


class ReloadBuffer:
    """A reusable device storage for the reloads of one group position, with the saved
    tensors' aliases on it (NOTE [Reused reload buffers])."""

    __slots__ = ("busy", "layout", "storage", "views")

    #: Cached aliases per buffer beyond which a miss clears them (a position whose
    #: saves keep changing).
    MAX_VIEWS = 4096

    def __init__(self, storage: Any) -> None:
        self.storage = storage  # an UntypedStorage on the device; empty while not busy
        self.views: dict[int, tuple[tuple[Any, ...], torch.Tensor]] = {}
        """Per pack index: the saved tensor's geometry (its slot and strides for a typed
        save, whose slot gives the rest; else its slot offset in bytes, storage offset,
        size, stride and dtype), and a ``.data`` alias of that geometry on ``storage``."""
        self.layout: tuple[Any, ...] = ()
        """The slots' offsets, shapes and dtypes of the groups the aliases were made for."""
        self.busy = False

    def views_for(self, group: Group) -> dict[int, tuple[tuple[Any, ...], torch.Tensor]]:
        """The cached aliases, for ``group`` fetched into this buffer: kept while the groups
        it takes have one layout of slots (a typed save's alias is then known by its slot
        and strides alone, its slot's offset, shape and dtype being the same: checked once
        per group, not once per save), else begun again."""
        layout = (group.offsets, group.shapes, group.dtypes)
        if layout != self.layout:
            self.views = {}
            self.layout = layout
        return self.views

    def remember(self, pack_index: int, key: tuple[Any, ...], view: torch.Tensor) -> None:
        """Cache an alias of ``view`` (of geometry ``key``) for the save at ``pack_index``."""
        views = self.views
        if pack_index not in views and len(views) >= self.MAX_VIEWS:
            views.clear()
        views[pack_index] = (key, view.data)

    def empty_if_unused(self) -> bool:
        """Empty the storage if no tensor but the cached aliases is on it and nothing
        else holds its storage object (True), making the buffer free for the next reload
        of its position."""
        storage = self.storage
        # the storage object is the one ``untyped_storage()`` of every tensor on it
        # returns, and holding it adds no use: only this attribute and the local may
        if tc.storage_use_count(storage) != 1 + len(self.views) or tc.storage_object_refs(storage) != 2:
            return False
        self.empty()
        return True

    def empty(self) -> None:
        self.storage.resize_(0)
        self.busy = False


class ReloadBuffers:
    """The engine's reusable reload buffers, by group position (NOTE [Reused reload
    buffers])."""

    #: Positions with a buffer, at most: past it, the idle ones are forgotten (positions
    #: of many shapes).
    MAX_POSITIONS = 4096

    def __init__(self) -> None:
        self._by_position: dict[tuple[torch.device, int], ReloadBuffer] = {}
        self._draining: list[ReloadBuffer] = []  # released, emptied once unused

    def alloc(self, backend: Backend, group: Group, stream: Stream) -> tuple[torch.Tensor, ReloadBuffer | None]:
        """A device buffer of ``group.nbytes`` for ``group``'s reload, allocated on
        ``stream``: its position's storage grown, or a fresh one while that is busy."""
        position = (group.device, group.seq)
        reuse = self._by_position.get(position)
        if reuse is None:
            if len(self._by_position) >= self.MAX_POSITIONS:
                for idle in [k for k, b in self._by_position.items() if not b.busy]:
                    del self._by_position[idle]
            reuse = self._by_position[position] = ReloadBuffer(torch.UntypedStorage(0, device=group.device))
        elif reuse.busy:
            return backend.alloc_device(group.nbytes, group.device, stream), None
        reuse.busy = True
        try:
            return backend.alloc_device(group.nbytes, group.device, stream, reuse.storage), reuse
        except BaseException:  # out of memory: the position stays free for the next reload
            reuse.empty()
            raise

    def release(self, reuse: ReloadBuffer) -> None:
        """Its group let go of it: emptied by a later ``poll`` once nothing uses it."""
        self._draining.append(reuse)

    def poll(self) -> None:
        if self._draining:
            self._draining = [reuse for reuse in self._draining if not reuse.empty_if_unused()]

    def clear(self) -> None:
        """Forget every buffer (the engine closes): their storages go with the last
        tensor on them."""
        self._by_position.clear()
        self._draining.clear()


@dataclass(frozen=True)
class OffloadStats:
    """What the engine did in one step (since the previous :meth:`OffloadEngine.end_step`)."""

    backend: str
    groups_offloaded: int
    storages_offloaded: int
    groups_reloaded: int
    """Group reloads issued, prefetches included."""
    prefetches: int
    """Reloads issued ahead of their fetch."""
    bytes_d2h: int
    bytes_h2d: int
    d2h_seconds: float
    """Copy time of the timed D2H copies that landed (NOTE [Timing without host waits])."""
    h2d_seconds: float
    d2h_gbps: float | None
    """Achieved device-to-host bandwidth (1e9 bytes/s); None when no copy was timed."""
    h2d_gbps: float | None
    stall_seconds: float
    """Time compute waited for reloads."""
    window_waits: int
    """Times compute waited on an in-flight copy because the stash exceeded its window."""
    offload_host_seconds: float
    """Host time spent issuing group offloads (the region exits' share)."""
    reload_host_seconds: float
    """Host time spent in fetch(): reloads, prefetches and compute waits issued."""
    fallbacks_pool_full: int
    fallbacks_host_pressure: int
    fallbacks_pin_failed: int
    pool_reserved_bytes: int
    pool_in_use_bytes: int
    pool_high_water_bytes: int
    live_groups: int
    pending_timings: int
    """Timed copies/waits not landed yet; they count in a later step."""
    groups_served: int = 0
    """Groups whose device sources were still held at their first unpack (or prefetch)
    and were handed out instead of a reload (NOTE [Served groups])."""
    release_waits: int = 0
    """Groups a plan let go of before query() saw their copy land, compute waiting on it
    (NOTE [Planned release] in groups.py; a wait the device has often passed already)."""

    @property
    def fallbacks(self) -> int:
        return self.fallbacks_pool_full + self.fallbacks_host_pressure + self.fallbacks_pin_failed

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fallbacks"] = self.fallbacks
        return out


def gbps(nbytes: int, seconds: float) -> float | None:
    if nbytes <= 0 or seconds <= 0:
        return None
    return nbytes / seconds / 1e9


# NOTE [Source lifetime]
# The offload engine's (offload.py). A device storage being copied to host must not be
# freed, and its memory reused, before the copy landed. Two ways exist:
#   - record_stream(source, d2h_stream): the caching allocator holds the block until the
#     D2H stream passes that point. Memory is then freed at a time nobody controls (the
#     allocator polls events when it next needs memory), peak memory becomes
#     non-deterministic, and nothing pushes back when copies fall behind compute.
#   - a stash: the engine keeps the group's sources together with its copy event. Each
#     engine call polls the stash with query() and drops sources whose copy landed. When
#     the stash holds more than `window_bytes`, the producing stream waits (GPU-side) on
#     the oldest group's event and its sources are dropped: the allocator may hand their
#     blocks to later work on that stream, which is now ordered after the copy.
# We use the stash: device memory held for in-flight copies is bounded by the window
# (plus the newest group), release is deterministic, the window is the backpressure
# point when the link is slower than compute, and the emulated backend can check the
# lifetime (it holds copy sources weakly). The wait goes on the stream the sources were
# produced on (looked up live at issue), because the caching allocator reuses a freed
# block on the stream that allocated it. Outside a plan, backward does not drain the
# stash: the copies of the last groups land while backward starts, and their sources go
# at the next poll, or are served to backward meanwhile (NOTE [Served groups]). A group
# larger than the window is waited on at once: its offload still frees device memory,
# but compute no longer overlaps that copy.

# NOTE [Freed sources]
# A group freed while the stash holds its sources (its graph dropped without backward, a forward or
# backward that raised) lets go of them at its free: left to the engine's next call, a graph
# dropped at a loop's end would hold them until the next forward or the exit. A copy query() does
# not see landed still reads them: on CUDA each source is recorded on the D2H stream
# (``record_stream``), so the allocator reuses its block only once that stream passed the copy,
# with no wait on any stream (compute waiting on a dead graph's copies would stall the next
# forward; NOTE [Source lifetime]'s case against record_stream is a bound and a release time for
# memory still in use, which these sources no longer are; cudaMallocAsync orders the reuse with a
# stream wait of its own); elsewhere compute waits on the copy first, interrupted, leaving them
# held and the group freed all the same.

# NOTE [Window under a plan]
# The window is the backpressure of forced offload, where nothing else bounds what copies in flight
# hold. Under a plan the planner has already counted every in-flight byte in its simulated peak and
# timed the copies at the measured link rate, so the window would only stall forward where the plan
# expects overlap. `OffloadEngine.prepare()` widens it to the plan's offloaded bytes; the plan
# says when each group's sources go instead.


@dataclass(eq=False)
class InFlight:
    """An issued group's device sources, held until the engine lets go of them (NOTE
    [Source lifetime])."""

    sources: list[torch.Tensor]
    landed: Event
    stream: Stream  # the stream that produced the sources
    nbytes: int
    group: Group  # the sources' group (``Group.see_writes``)
    release_at: int = NOT_PLANNED  # the unit at whose end a plan lets go of them
    dropped: bool = False  # let go of (``OffloadEngine._drop``), once


def slot_views(block: Block, group: Group) -> list[torch.Tensor]:
    """The host views of ``group``'s slots in ``block``, each flat or of its typed
    source's geometry (NOTE [Typed sources]), made once per block and layout (NOTE [Idle
    blocks]: a step's groups get back the blocks, and views, of the last)."""
    sizes, shapes, dtypes, strides = group.sizes, group.shapes, group.dtypes, group.strides
    slots = block.slots
    if slots is not None and slots[0] == sizes and slots[1] == shapes and slots[2] == dtypes and slots[3] == strides:
        return slots[4]  # type: ignore[no-any-return]
    view = block.view
    views = []
    for i, (o, n, shape, dtype) in enumerate(zip(group.offsets, sizes, shapes, dtypes)):
        v = view[o : o + n]
        if shape is not None:
            v = v.view(dtype)  # type: ignore[arg-type]  # set with the shape
            stride = strides.get(i)
            v = v.view(shape) if stride is None else v.as_strided(shape, stride)
        views.append(v)
    block.slots = (list(sizes), shapes, dtypes, dict(strides), views)  # shapes and dtypes: tuples
    return views


def dense_from_start(t: torch.Tensor) -> bool:
    """Do ``t``'s elements fill the first ``t.numel()`` elements of its storage, each
    once, in some order of its dimensions (contiguous, or permuted: a transpose's
    layout)?"""
    if t.storage_offset() != 0:
        return False
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True
