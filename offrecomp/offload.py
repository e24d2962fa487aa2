"""The offload engine: moves whole storages to pinned host memory and back.

The caller (the saved-tensor hooks) hands over flat uint8 views of storages and gets a
:class:`Ticket` back; in backward it calls :meth:`OffloadEngine.fetch` and receives a
flat uint8 device tensor that the current compute stream may read at once. Copies run on
one D2H and one H2D side stream per device; the host never waits on the device in
``offload``/``fetch``/``free`` (the emulated backend's compute "stream" is the host thread,
so there its waits block the host by construction).

The ordering edges are listed in NOTE [Stream ordering]; each wait goes through
:meth:`OffloadEngine._wait_edge` with the edge's name so a test can remove exactly one.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from offrecomp.backends import Backend, Event, Stream
from offrecomp.config import Prefetch, format_bytes
from offrecomp.pool import Block, FailureReason, PinnedPool

__all__ = ["OffloadEngine", "OffloadStats", "Ticket", "TicketState"]

logger = logging.getLogger(__name__)

Edge = Literal["d2h_after_produce", "compute_after_d2h", "h2d_after_d2h", "compute_after_h2d"]

# NOTE [Stream ordering]
# Four edges make an offload round trip race-free. Each one is enqueued as a GPU-side
# wait (stream.wait_event), never as a host wait.
#   1. d2h_after_produce: the D2H copy waits on an event recorded on the compute stream
#      when offload() is called, so it reads the tensor only after the kernels that
#      produced it (they may still be queued when the hook runs).
#   2. compute_after_d2h: before the engine lets go of a device source whose copy may not
#      have landed, the stream the source was produced on waits on that copy's event;
#      see NOTE [Source lifetime].
#   3. h2d_after_d2h: a reload waits on the event of *its own* D2H copy. Without it the
#      H2D stream can read the host slot before the D2H stream wrote it (Megatron #7398).
#   4. compute_after_h2d: fetch() makes the live compute stream wait on the reload's
#      event before it returns, so the caller's kernels read the buffer only after the
#      H2D copy landed.
# The compute stream is looked up live (backend.current_stream) in every call, before
# any side-stream context is entered: inside `with torch.cuda.stream(s)` the current
# stream is `s` (torchtitan #2581), and a stream cached across calls goes stale when the
# caller switches streams (TRL #7195).

# NOTE [Source lifetime]
# A device tensor being copied to host must not be freed, and its memory reused, before
# the copy landed. Two ways exist:
#   - record_stream(source, d2h_stream): the caching allocator holds the block until the
#     D2H stream passes that point. Memory is then freed at a time nobody controls (the
#     allocator polls events when it next needs memory), peak memory becomes
#     non-deterministic, and nothing pushes back when copies fall behind compute.
#   - a stash: the engine keeps a reference to the source together with its copy event.
#     Each engine call polls the stash with query() and drops sources whose copy landed.
#     When the stash holds more than `window_bytes`, the producing stream waits (GPU-side)
#     on the oldest copy's event and the source is dropped: the allocator may hand its
#     block to later work on that stream, which is now ordered after the copy.
# We use the stash: device memory held for in-flight copies is bounded by the window
# (plus the newest tensor), release is deterministic, the window is the backpressure
# point when the link is slower than compute, and the emulated backend can check the
# lifetime (it holds copy sources weakly). The wait goes on the stream the source was
# produced on (looked up live at its offload), because the caching allocator reuses a
# freed block on the stream that allocated it. begin_backward() empties the stash with
# one such wait per stream: backward frees memory, so there is nothing to gain from
# holding sources longer, and the copies of the last regions are still in flight then.
# A source larger than the window is waited on at once: its offload still frees device
# memory, but compute no longer overlaps that copy.

# NOTE [Window under a plan]
# The window is the backpressure of forced offload, where nothing else bounds what
# copies in flight hold. Under a plan the planner has already counted every in-flight
# byte in its simulated peak (a source stays resident until its copy lands) and timed
# the copies at the measured link rate, so the window would only stall forward where
# the plan expects overlap: at 8K tokens one MLP activation is 128 MiB, half the default
# window. `prepare()` widens it to the plan's offloaded bytes.

# NOTE [Reload buffer lifetime]
# The reload buffer is allocated on the H2D stream, so the allocator orders any reuse of
# its block after the H2D copy. When fetch() hands it to compute, record_stream(buffer,
# compute) tells the allocator that compute reads it too; without it the block could be
# handed to a later H2D reload while compute's kernels still read it (pytorch #106360).
# The engine drops its own reference in release_device()/free(); the caller may keep
# using the tensor it got, the allocator keeps the memory until both are done.

# NOTE [Host slot lifetime]
# A pinned slot is written by the ticket's D2H copy and read by every reload of it
# (retain_graph fetches it again). free() therefore does not return the slot at once: the
# ticket waits in `_deferred` until query() says its D2H copy and its latest H2D copy
# landed (one H2D stream per device runs in order, so the latest implies the earlier
# ones). Returning it earlier would let the next offload's D2H copy overwrite data a
# reload is still reading.

# NOTE [Free from finalisers]
# Callers free tickets from finalisers (when autograd drops a saved tensor), which can run
# at any allocation: on another thread while this one holds the engine lock (the emulated
# backend's workers, autograd's device threads), or re-entrantly in the middle of an
# engine call on this thread. free() therefore never blocks and never mutates state under
# a running call: if the lock is taken or the engine is busy on this thread, the ticket
# goes to `_pending_frees` (a deque: appends are atomic), which the next engine call
# drains before it does anything else.

# NOTE [Timing without host waits]
# Copy times come from timing events recorded around each copy on its side stream; stall
# time from a pair of timing events around fetch()'s compute-stream wait (on the
# emulated backend these are host timestamps around the host wait). Elapsed times are
# read only once query() says the end event completed, so a step's stats include the
# copies that landed by end_step() and carry the rest into the next step
# (`pending_timings`). Bandwidth is computed from the bytes whose time is known.

# NOTE [Prefetch order]
# Tickets carry `group`, the region-call ordinal in forward order. Backward runs regions
# in reverse, so reloads are issued in reverse offload order. On fetch of a ticket of
# group g: Prefetch(regions=N) reloads the other tickets of group g (backward of g needs
# them next) and those of groups g-1 .. g-N; Prefetch(nbytes=B) walks the same order and
# issues reloads while the bytes reloaded but not yet fetched stay within B (one reload is
# always allowed when none is outstanding). A ticket is prefetched at most once per
# backward pass: it qualifies only if it has been fetched fewer times than the ticket being
# fetched now, so a second backward (retain_graph) prefetches the released tickets again
# while the first pass never reloads what it already consumed. Ordering is per step;
# tickets of earlier steps are reloaded on demand only.


class TicketState(enum.Enum):
    OFFLOADED = "offloaded"
    """The host copy is issued; the engine holds no device copy."""
    RELOADING = "reloading"
    """A reload is issued and not yet handed to compute."""
    FETCHED = "fetched"
    """The reloaded buffer was handed to compute (until release_device or free)."""
    FREED = "freed"


class Ticket:
    """One offloaded storage. Created by :meth:`OffloadEngine.offload`."""

    __slots__ = (
        "_block",
        "_buffer",
        "_d2h_done",
        "_h2d_done",
        "_step",
        "device",
        "fetches",
        "group",
        "nbytes",
        "seq",
        "state",
    )

    def __init__(
        self, *, nbytes: int, device: torch.device, group: int, seq: int, step: int,
        block: Block, d2h_done: Event,
    ) -> None:
        self.nbytes = nbytes
        self.device = device
        self.group = group  # region-call ordinal in forward order (larger = later)
        self.seq = seq  # offload order within the step
        self.state = TicketState.OFFLOADED
        self.fetches = 0  # times a reloaded buffer was handed to compute
        self._step = step
        self._block: Block | None = block
        self._d2h_done: Event = d2h_done
        self._h2d_done: Event | None = None
        self._buffer: torch.Tensor | None = None

    def __repr__(self) -> str:
        return (
            f"Ticket(seq={self.seq}, group={self.group}, nbytes={self.nbytes}, "
            f"device={self.device}, state={self.state.value})"
        )


@dataclass(frozen=True)
class OffloadStats:
    """What the engine did in one step (since the previous :meth:`OffloadEngine.end_step`)."""

    backend: str
    offloads: int
    reloads: int
    """Reloads issued, prefetches included."""
    prefetches: int
    """Reloads issued ahead of their fetch."""
    bytes_d2h: int
    bytes_h2d: int
    d2h_seconds: float
    """Copy time of the D2H copies that landed (see NOTE [Timing without host waits])."""
    h2d_seconds: float
    d2h_gbps: float | None
    """Achieved device-to-host bandwidth (1e9 bytes/s); None when no copy was timed."""
    h2d_gbps: float | None
    stall_seconds: float
    """Time compute waited for reloads."""
    window_waits: int
    """Times compute waited on an in-flight copy because the stash exceeded its window."""
    fallbacks_pool_full: int
    fallbacks_host_pressure: int
    fallbacks_pin_failed: int
    pool_reserved_bytes: int
    pool_in_use_bytes: int
    pool_high_water_bytes: int
    live_tickets: int
    pending_timings: int
    """Timed copies/waits not landed yet; they count in a later step."""

    @property
    def fallbacks(self) -> int:
        return self.fallbacks_pool_full + self.fallbacks_host_pressure + self.fallbacks_pin_failed

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fallbacks"] = self.fallbacks
        return out


@dataclass
class _InFlight:
    source: torch.Tensor
    landed: Event
    stream: Stream  # the stream that produced `source`
    nbytes: int


_TimingKind = Literal["d2h", "h2d", "stall"]


class OffloadEngine:
    """Offloads flat uint8 storages to a pinned host pool and reloads them ahead of need.

    Args:
        backend: the device runtime (:func:`offrecomp.backends.get_backend`).
        host_limit_bytes: most host memory the pool may reserve
            (:func:`offrecomp.pool.default_host_limit` is a safe default).
        prefetch: how far ahead reloads are issued (NOTE [Prefetch order]).
        window_bytes: most bytes of device sources kept alive for in-flight copies before
            compute waits on the oldest (NOTE [Source lifetime]).
        slab_bytes: size of each pinned slab.
        host_pressure_bytes: available host memory that must remain after a new slab
            (default max(2 GiB, 5% of RAM)).

    Thread-safe: calls are serialised by a lock (forward and backward may run on
    different threads). The engine holds every ticket until :meth:`free` or
    :meth:`close`; a ticket dropped without ``free`` keeps its host slot.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        host_limit_bytes: int,
        prefetch: Prefetch,
        window_bytes: int = 256 << 20,
        slab_bytes: int = 64 << 20,
        host_pressure_bytes: int | None = None,
    ) -> None:
        if not isinstance(prefetch, Prefetch):
            raise TypeError(f"prefetch={prefetch!r} is invalid; pass a config.Prefetch")
        if prefetch.regions is not None and prefetch.regions < 0:
            raise ValueError(f"prefetch={prefetch!r} is invalid; regions must be >= 0")
        if prefetch.nbytes is not None and prefetch.nbytes < 0:
            raise ValueError(f"prefetch={prefetch!r} is invalid; nbytes must be >= 0")
        if window_bytes < 0:
            raise ValueError(f"window_bytes={window_bytes!r} is invalid; it must be >= 0")
        self.backend = backend
        self.prefetch = prefetch
        self.window_bytes = window_bytes
        self.pool = PinnedPool(
            backend=backend,
            limit_bytes=host_limit_bytes,
            slab_bytes=slab_bytes,
            pressure_bytes=host_pressure_bytes,
        )
        self._lock = threading.RLock()
        self._closed = False
        self._streams: dict[tuple[torch.device, str], Stream] = {}
        self._stash: deque[_InFlight] = deque()
        self._stash_bytes = 0
        self._deferred: list[Ticket] = []
        self._tickets: set[Ticket] = set()
        self._order: list[Ticket] = []  # this step's tickets; index == seq
        self._groups: dict[int, list[Ticket]] = {}
        self._step = 0
        self._outstanding_bytes = 0  # reloaded, not yet fetched
        self._timings: list[tuple[_TimingKind, Event, Event, int]] = []
        self._warned: set[str] = set()
        self._busy = 0  # depth of engine calls on the thread holding the lock
        self._pending_frees: deque[Ticket] = deque()
        self._reset_counters()
        logger.debug(
            "offrecomp: offload engine on the %s backend: host limit %s, in-flight window %s, "
            "prefetch %s",
            backend.name, format_bytes(host_limit_bytes), format_bytes(window_bytes), prefetch,
        )

    # ---------------------------------------------------------------- public API

    def offload(self, flat: torch.Tensor, *, group: int) -> Ticket | None:
        """Start copying ``flat`` (a flat uint8 view of a whole storage) to host.

        Returns ``None`` when the pool cannot take it (full, host memory pressure, or
        pinning failed): the caller keeps or recomputes the tensor instead.
        The caller may drop ``flat`` at once; the engine keeps it alive until its copy
        landed (NOTE [Source lifetime]).
        """
        with self._locked():
            self._enter()
            self._check_flat(flat)
            nbytes = flat.numel()
            block = self.pool.alloc(nbytes)
            if block is None:
                self._fallback(nbytes, self.pool.last_failure or "full")
                return None
            device = flat.device
            backend = self.backend
            # NOTE [Stream ordering]: live lookup, before any side-stream context.
            compute = backend.current_stream(device)
            d2h = self._side_stream(device, "d2h")
            produced = backend.record_event(compute)
            self._wait_edge("d2h_after_produce", d2h, produced)
            start = backend.record_event(d2h, timing=True)
            backend.copy_async(block.view, flat, d2h)
            landed = backend.record_event(d2h, timing=True)
            ticket = Ticket(
                nbytes=nbytes, device=device, group=group, seq=len(self._order),
                step=self._step, block=block, d2h_done=landed,
            )
            self._timings.append(("d2h", start, landed, nbytes))
            self._keep_source(_InFlight(flat, landed, compute, nbytes))  # NOTE [Source lifetime]
            self._bound_stash()
            self._order.append(ticket)
            self._groups.setdefault(group, []).append(ticket)
            self._tickets.add(ticket)
            self._offloads += 1
            self._bytes_d2h += nbytes
            return ticket

    def fetch(self, ticket: Ticket) -> torch.Tensor:
        """The ticket's data as a flat uint8 device tensor the current stream may read now.

        Also issues prefetch reloads (NOTE [Prefetch order]). Raises ``RuntimeError`` for
        a freed ticket or when an asynchronous copy failed.
        """
        with self._locked():
            self._enter()
            if ticket.state is TicketState.FREED:
                raise RuntimeError(f"offrecomp: {ticket!r} was freed; it cannot be fetched")
            backend = self.backend
            # NOTE [Stream ordering]: live lookup, before any side-stream context.
            compute = backend.current_stream(ticket.device)
            if ticket.state is TicketState.OFFLOADED:
                self._reload(ticket)
            if ticket.state is TicketState.RELOADING:
                ticket.state = TicketState.FETCHED
                ticket.fetches += 1
                self._outstanding_bytes -= ticket.nbytes
            self._prefetch_for(ticket)
            buffer, h2d_done = ticket._buffer, ticket._h2d_done
            assert buffer is not None and h2d_done is not None
            before = backend.record_event(compute, timing=True)
            self._wait_edge("compute_after_h2d", compute, h2d_done)
            after = backend.record_event(compute, timing=True)
            self._timings.append(("stall", before, after, 0))
            backend.record_stream(buffer, compute)  # NOTE [Reload buffer lifetime]
            backend.check()
            return buffer

    def release_device(self, ticket: Ticket) -> None:
        """The caller is done with the reloaded buffer; the host copy stays (retain_graph
        may fetch the ticket again)."""
        with self._locked():
            if ticket.state is TicketState.RELOADING:
                self._outstanding_bytes -= ticket.nbytes
            if ticket.state in (TicketState.RELOADING, TicketState.FETCHED):
                ticket._buffer = None  # NOTE [Reload buffer lifetime]
                ticket.state = TicketState.OFFLOADED

    def free(self, ticket: Ticket) -> None:
        """The ticket is no longer needed. Its host slot returns to the pool once its
        copies landed (NOTE [Host slot lifetime]). Freeing twice is a no-op.

        Never blocks and may be called from a finaliser (NOTE [Free from finalisers]).
        """
        if not self._lock.acquire(blocking=False):
            self._pending_frees.append(ticket)  # another thread is inside the engine
            return
        try:
            if self._busy:  # re-entered from inside an engine call on this thread
                self._pending_frees.append(ticket)
                return
            if self._closed:
                return
            with self._locked():
                self._free_now(ticket)
                self._poll()
        finally:
            self._lock.release()

    def begin_backward(self) -> None:
        """Forward is over: drop the stash of in-flight sources. The producing streams
        wait on the outstanding copies (GPU-side); the host does not wait."""
        with self._locked():
            self._enter()
            newest: dict[tuple[Any, torch.device], _InFlight] = {}
            for entry in self._stash:  # oldest first: the newest per stream pair wins
                newest[(entry.stream, entry.source.device)] = entry
            for entry in newest.values():
                # One D2H stream per device runs in order: its newest copy landing
                # implies the older ones did.
                if not self.backend.query(entry.landed):
                    self._wait_edge("compute_after_d2h", entry.stream, entry.landed)
            self._stash.clear()
            self._stash_bytes = 0

    def prepare(self, sizes: Sequence[int], *, window_bytes: int | None = None) -> int:
        """Get ready for a plan's offloads: pin host memory for these sizes now, rather
        than in the first step that makes them, and set the in-flight window
        (NOTE [Window under a plan]; None leaves it). Returns the pool's reserved bytes."""
        if window_bytes is not None and window_bytes < 0:
            raise ValueError(f"window_bytes={window_bytes!r} is invalid; it must be >= 0")
        with self._locked():
            self._enter()
            if window_bytes is not None:
                self.window_bytes = window_bytes
            return self.pool.reserve(sizes)

    def end_step(self) -> OffloadStats:
        """This step's stats; resets the counters and the prefetch ordering."""
        with self._locked():
            self._enter()
            self._resolve_timings()
            pool = self.pool.stats()
            stats = OffloadStats(
                backend=self.backend.name,
                offloads=self._offloads,
                reloads=self._reloads,
                prefetches=self._prefetches,
                bytes_d2h=self._bytes_d2h,
                bytes_h2d=self._bytes_h2d,
                d2h_seconds=self._seconds["d2h"],
                h2d_seconds=self._seconds["h2d"],
                d2h_gbps=_gbps(self._timed_bytes["d2h"], self._seconds["d2h"]),
                h2d_gbps=_gbps(self._timed_bytes["h2d"], self._seconds["h2d"]),
                stall_seconds=self._seconds["stall"],
                window_waits=self._window_waits,
                fallbacks_pool_full=self._fallbacks["full"],
                fallbacks_host_pressure=self._fallbacks["pressure"],
                fallbacks_pin_failed=self._fallbacks["pin_failed"],
                pool_reserved_bytes=pool.reserved_bytes,
                pool_in_use_bytes=pool.in_use_bytes,
                pool_high_water_bytes=pool.high_water_bytes,
                live_tickets=len(self._tickets),
                pending_timings=len(self._timings),
            )
            self._reset_counters()
            self.pool.reset_high_water()
            self._order = []
            self._groups = {}
            self._step += 1
            return stats

    def synchronize(self) -> None:
        """Block the host until every copy landed; settle the stash and deferred frees."""
        with self._locked():
            self._enter()
            self.backend.synchronize()
            self._poll()
            self.backend.check()

    def close(self) -> None:
        """Synchronize, drop every buffer and ticket, free the pool. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.backend.synchronize()
            finally:
                self._pending_frees.clear()
                for ticket in list(self._tickets) + self._deferred:
                    ticket._buffer = None
                    ticket._block = None
                    ticket.state = TicketState.FREED
                self._tickets.clear()
                self._deferred.clear()
                self._stash.clear()
                self._stash_bytes = 0
                self._order = []
                self._groups = {}
                self._timings.clear()
                self._outstanding_bytes = 0
                self._streams.clear()
                self.pool.close()
                self.backend.close()
            try:
                self.backend.check()
            except RuntimeError as exc:  # closing must not mask the caller's exception
                logger.error("%s", exc)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def live_tickets(self) -> int:
        """Tickets offloaded and not freed yet."""
        return len(self._tickets)

    @property
    def stash_bytes(self) -> int:
        """Bytes of device sources held for in-flight copies."""
        return self._stash_bytes

    @property
    def outstanding_reload_bytes(self) -> int:
        """Bytes reloaded (or being reloaded) and not fetched yet."""
        return self._outstanding_bytes

    def copy_streams(self, device: torch.device) -> tuple[Stream, Stream]:
        """The (D2H, H2D) side streams of ``device``, created on first use."""
        with self._locked():
            device = self.backend.canonical_device(torch.device(device))
            return self._side_stream(device, "d2h"), self._side_stream(device, "h2d")

    # ---------------------------------------------------------------- internals

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self._busy += 1
            try:
                if self._busy == 1 and not self._closed:
                    while self._pending_frees:  # NOTE [Free from finalisers]
                        self._free_now(self._pending_frees.popleft())
                yield
            finally:
                self._busy -= 1

    def _free_now(self, ticket: Ticket) -> None:
        if ticket.state is TicketState.FREED:
            return
        self.release_device(ticket)
        ticket.state = TicketState.FREED
        self._tickets.discard(ticket)
        if ticket._block is not None:
            self._deferred.append(ticket)

    def _wait_edge(self, edge: Edge, stream: Stream, event: Event) -> None:
        """Enqueue one ordering edge of NOTE [Stream ordering] (``edge`` names it)."""
        self.backend.wait_event(stream, event)

    def _keep_source(self, entry: _InFlight) -> None:
        self._stash.append(entry)
        self._stash_bytes += entry.nbytes

    def _bound_stash(self) -> None:
        # NOTE [Source lifetime]: beyond the window, the producer waits on the oldest copy.
        while self._stash_bytes > self.window_bytes and self._stash:
            entry = self._stash.popleft()
            self._stash_bytes -= entry.nbytes
            if not self.backend.query(entry.landed):
                self._wait_edge("compute_after_d2h", entry.stream, entry.landed)
                self._window_waits += 1

    def _reload(self, ticket: Ticket) -> None:
        backend = self.backend
        block = ticket._block
        assert block is not None
        h2d = self._side_stream(ticket.device, "h2d")
        self._wait_edge("h2d_after_d2h", h2d, ticket._d2h_done)  # NOTE [Stream ordering]
        buffer = backend.alloc_device(ticket.nbytes, ticket.device, h2d)  # NOTE [Reload buffer lifetime]
        start = backend.record_event(h2d, timing=True)
        backend.copy_async(buffer, block.view, h2d)
        done = backend.record_event(h2d, timing=True)
        self._timings.append(("h2d", start, done, ticket.nbytes))
        ticket._buffer = buffer
        ticket._h2d_done = done  # NOTE [Host slot lifetime]: the latest reload
        ticket.state = TicketState.RELOADING
        self._outstanding_bytes += ticket.nbytes
        self._reloads += 1
        self._bytes_h2d += ticket.nbytes

    def _prefetch_for(self, ticket: Ticket) -> None:
        # NOTE [Prefetch order]
        if ticket._step != self._step or (
            self.prefetch.regions is None and self.prefetch.nbytes is None
        ):
            return
        limit = self.prefetch.nbytes
        for other in self._prefetch_candidates(ticket):
            if other.state is not TicketState.OFFLOADED or other.fetches >= ticket.fetches:
                continue
            if (
                limit is not None
                and self._outstanding_bytes > 0
                and self._outstanding_bytes + other.nbytes > limit
            ):
                return
            self._reload(other)
            self._prefetches += 1

    def _prefetch_candidates(self, ticket: Ticket) -> Iterator[Ticket]:
        same = self._groups.get(ticket.group, [])
        yield from (t for t in reversed(same) if t is not ticket)
        if self.prefetch.regions is not None:
            for group in range(ticket.group - 1, ticket.group - self.prefetch.regions - 1, -1):
                yield from reversed(self._groups.get(group, []))
        elif self.prefetch.nbytes is not None:
            first = same[0].seq if same else ticket.seq
            for seq in range(first - 1, -1, -1):
                other = self._order[seq]
                if other.group != ticket.group:
                    yield other

    def _side_stream(self, device: torch.device, kind: str) -> Stream:
        key = (device, kind)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = self.backend.new_stream(device)
        return stream

    def _enter(self) -> None:
        if self._closed:
            raise RuntimeError("offrecomp: the offload engine is closed")
        self.backend.check()
        self._poll()

    def _poll(self) -> None:
        """Drop landed sources and return host slots whose copies landed; never waits."""
        query = self.backend.query
        while self._stash and query(self._stash[0].landed):
            self._stash_bytes -= self._stash.popleft().nbytes
        if self._deferred:
            # Swap first: a free() re-entering from a finaliser appends to the new list.
            deferred, self._deferred = self._deferred, []
            waiting = []
            for ticket in deferred:
                if query(ticket._d2h_done) and (
                    ticket._h2d_done is None or query(ticket._h2d_done)
                ):
                    assert ticket._block is not None
                    self.pool.free(ticket._block)
                    ticket._block = None
                    ticket._h2d_done = None
                else:
                    waiting.append(ticket)
            self._deferred.extend(waiting)
        if len(self._timings) > 4096:
            self._resolve_timings()

    def _resolve_timings(self) -> None:
        # NOTE [Free from finalisers]
# Callers free tickets from finalisers (when autograd drops a saved tensor), which can run
# at any allocation: on another thread while this one holds the engine lock (the emulated
# backend's workers, autograd's device threads), or re-entrantly in the middle of an
# engine call on this thread. free() therefore never blocks and never mutates state under
# a running call: if the lock is taken or the engine is busy on this thread, the ticket
# goes to `_pending_frees` (a deque: appends are atomic), which the next engine call
# drains before it does anything else.

# NOTE [Timing without host waits]
        pending = []
        for kind, start, end, nbytes in self._timings:
            if self.backend.query(end):
                self._seconds[kind] += self.backend.elapsed_seconds(start, end)
                self._timed_bytes[kind] += nbytes
            else:
                pending.append((kind, start, end, nbytes))
        self._timings = pending

    def _check_flat(self, flat: torch.Tensor) -> None:
        if not isinstance(flat, torch.Tensor):
            raise TypeError(f"offrecomp: offload takes a tensor, got {type(flat).__name__}")
        if flat.dtype != torch.uint8 or flat.dim() != 1 or not flat.is_contiguous():
            raise ValueError(
                "offrecomp: offload takes a flat contiguous uint8 view of a storage "
                "(torch.empty(0, dtype=torch.uint8, device=d).set_(t.untyped_storage())); got "
                f"dtype={flat.dtype}, shape={tuple(flat.shape)}"
            )
        if flat.numel() == 0:
            raise ValueError("offrecomp: offload of an empty storage; keep it instead")
        self.backend.validate(flat)

    def _fallback(self, nbytes: int, reason: FailureReason) -> None:
        self._fallbacks[reason] += 1
        if reason == "full" and reason not in self._warned:
            self._warned.add(reason)
            pool = self.pool.stats()
            logger.warning(
                "offrecomp: the pinned host pool cannot take %d more bytes (%d of %d reserved, "
                "%d in use); saves fall back to keep/recompute. Raise OFFRECOMP_HOST_LIMIT to "
                "offload more",
                nbytes, pool.reserved_bytes, self.pool.limit_bytes, pool.in_use_bytes,
            )

    def _reset_counters(self) -> None:
        self._offloads = 0
        self._reloads = 0
        self._prefetches = 0
        self._bytes_d2h = 0
        self._bytes_h2d = 0
        self._window_waits = 0
        self._seconds: dict[str, float] = {"d2h": 0.0, "h2d": 0.0, "stall": 0.0}
        self._timed_bytes: dict[str, int] = {"d2h": 0, "h2d": 0, "stall": 0}
        self._fallbacks: dict[str, int] = {"full": 0, "pressure": 0, "pin_failed": 0}


def _gbps(nbytes: int, seconds: float) -> float | None:
    if nbytes <= 0 or seconds <= 0:
        return None
    return nbytes / seconds / 1e9

