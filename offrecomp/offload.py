"""The offload engine: moves groups of storages to pinned host memory and back.

The unit of transfer is a :class:`Group`: the storages one region call offloads (or one
run of saves outside every region). The saved-tensor hook only appends a storage to its
group (:meth:`OffloadEngine.add`); at the region's exit the caller hands the group to
:meth:`OffloadEngine.issue`, which copies all of it into one block of the pinned pool
under one ordering event; in backward :meth:`OffloadEngine.fetch` reloads the whole
group into one device buffer with one copy, makes the compute stream wait on it once,
and issues the reloads of the next groups ahead. A saved tensor is then a view of that
buffer at its slot's offset. Copies run on one D2H and one H2D side stream per device;
the host never waits on the device in ``issue``/``fetch``/``free`` (the emulated
backend's compute "stream" is the host thread, so there its waits block the host by
construction).

The sources of copies in flight are held in a stash (NOTE [Source lifetime] in
transfer.py). The ordering edges are listed in NOTE [Stream ordering]; each wait goes through
:meth:`OffloadEngine._wait_edge` with the edge's name so a test can remove exactly one.
What a step moved, and how fast, is counted in a :class:`~offrecomp.offload_books.StepBooks`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

import torch

from offrecomp.backends import Backend, Event, Stream
from offrecomp.config import Prefetch, format_bytes
from offrecomp.interrupts import finish
from offrecomp.offload_books import StepBooks
from offrecomp.pool import ALIGN_BYTES, Block, PinnedPool
from offrecomp.transfer import (
    NOT_PLANNED,
    Group,
    GroupState,
    InFlight,
    OffloadStats,
    ReloadBuffers,
    slot_views,
)

__all__ = ["OffloadEngine"]

logger = logging.getLogger(__name__)

Edge = Literal[
    "d2h_after_produce",
    "compute_after_d2h",
    "h2d_after_d2h",
    "h2d_after_alloc",
    "compute_after_h2d",
    "free_after_h2d",
]

# NOTE [Stream ordering]
# Six edges make a group's round trip race-free. Each one is enqueued as a GPU-side
# wait (stream.wait_event), never as a host wait.
#   1. d2h_after_produce: the group's D2H copies wait on one event recorded on the
#      compute stream when issue() is called (the region's exit), so they read the
#      storages only after the kernels that produced them (they may still be queued).
#   2. compute_after_d2h: before the engine lets go of a group's device sources whose
#      copy may not have landed, the stream they were produced on waits on that copy's
#      event; see NOTE [Source lifetime] in transfer.py.
#   3. h2d_after_d2h: a reload waits on the event of *its own* group's D2H copy. Without
#      it the H2D stream can read the host block before the D2H stream wrote it
#      (Megatron #7398).
#   4. h2d_after_alloc: the reload buffer is allocated on the compute stream (NOTE
#      [Reload buffer lifetime] in transfer.py); the caching allocator may hand it a block that kernels
#      already queued on compute still read, so the H2D copy waits on an event recorded
#      on compute after the allocation.
#   5. compute_after_h2d: fetch() makes the live compute stream wait on the reload's
#      event once per reload, before it returns, so the caller's kernels read the buffer
#      only after the H2D copy landed (unless query() says it landed already).
#   6. free_after_h2d: a reload the caller never fetched (a prefetch past the end of
#      backward) is waited on by compute before the engine drops its buffer, so the
#      allocator cannot hand that block to compute work while the copy still writes it.
# The compute stream is looked up live (backend.current_stream) in every call, before
# any side-stream context is entered: inside `with torch.cuda.stream(s)` the current
# stream is `s` (torchtitan #2581), and a stream cached across calls goes stale when the
# caller switches streams (TRL #7195).

class OffloadEngine:
    """Offloads groups of storages to a pinned host pool and reloads them ahead of need.

    Args:
        backend: the device runtime (:func:`offrecomp.backends.get_backend`).
        host_limit_bytes: most host memory the pool may reserve
            (:func:`offrecomp.pool.default_host_limit` is a safe default).
        prefetch: how far ahead reloads are issued (NOTE [Prefetch order] in transfer.py).
        window_bytes: most bytes of device sources kept alive for in-flight copies before
            compute waits on the oldest group (NOTE [Source lifetime] in transfer.py).
        slab_bytes: size of each pinned slab.
        host_pressure_bytes: available host memory that must remain after a new slab
            (default max(2 GiB, 5% of RAM)).

    Thread-safe: calls are serialised by a lock (forward and backward may run on
    different threads). The engine holds every issued group until :meth:`free` or
    :meth:`close`; a group dropped without ``free`` keeps its host block.
    """

    serve_held = True  # hand out still-held sources, not a reload (NOTE [Served groups] in transfer.py)

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
        if any(n is not None and n < 0 for n in (prefetch.regions, prefetch.nbytes)):
            raise ValueError(f"prefetch={prefetch!r} is invalid; its regions and nbytes must be >= 0")
        if window_bytes < 0:
            raise ValueError(f"window_bytes={window_bytes!r} is invalid; it must be >= 0")
        self.backend = backend
        self.prefetch = prefetch
        self.window_bytes = window_bytes
        self.pool = PinnedPool(
            backend=backend, limit_bytes=host_limit_bytes, slab_bytes=slab_bytes, pressure_bytes=host_pressure_bytes
        )
        self._lock = threading.RLock()
        self._closed = False
        self._streams: dict[tuple[torch.device, str], Stream] = {}
        self._empties: dict[torch.device, torch.Tensor] = {}
        self._stash: deque[InFlight] = deque()
        self._stash_bytes = 0
        self._deferred: list[Group] = []
        self._groups: set[Group] = set()
        self._order: list[Group] = []  # this step's issued groups; index == seq
        self._step = 0
        self._open_bytes = 0  # storages added to groups not issued yet (device bytes)
        self._outstanding_bytes = 0  # reloaded, not yet fetched
        self._fetched_bytes = 0  # reloads handed to compute, not released yet
        self._books = StepBooks()  # the step's counters and timings (offload_books.py)
        self._pending_frees: deque[Group] = deque()
        self._open_reserved = 0  # the same, aligned as the pool will carve them
        self._reuse = ReloadBuffers()
        logger.debug(
            "offrecomp: offload engine on the %s backend: host limit %s, in-flight window %s, prefetch %s",
            backend.name, format_bytes(host_limit_bytes), format_bytes(window_bytes), prefetch,
        )

    # ---------------------------------------------------------------- forward

    def open_group(self, ordinal: int, device: torch.device, prefetch_regions: int | None = None) -> Group:
        """A new, empty group for the storages of the region call ``ordinal`` saves; its
        first fetch reloads ``prefetch_regions`` groups ahead, where given, else as the
        engine's ``prefetch`` says (NOTE [Prefetch order] in transfer.py)."""
        if self._closed:
            raise RuntimeError("offrecomp: the offload engine is closed")
        if device.type != self.backend.device_type:
            raise ValueError(
                f"offrecomp: the {self.backend.name} backend moves {self.backend.device_type} "
                f"tensors; got a group on {device}"
            )
        group = Group(ordinal, device, self._step)
        group.depth = prefetch_regions
        return group

    def add(self, group: Group, source: Any, nbytes: int, stride: tuple[int, ...] | None = None) -> int:
        """Add a storage of ``nbytes`` to the open ``group`` if the pool has room for it;
        returns its slot, or -1 (nothing added). Checked at save time against the pool's
        limit, so a storage the pool cannot hold falls back before its handle is made (a
        refusal at issue() keeps the whole group); its bytes count as the engine's until
        the group is issued. ``source`` is an ``UntypedStorage``, or a tensor that covers
        the whole storage: contiguous, or of ``stride`` (dense from the storage's first
        element, in another order of its dimensions), its slot then of its shape and
        dtype (NOTE [Typed sources] in transfer.py). The group holds it until its copy landed; the
        slots' offsets, shapes and dtypes are laid out when it closes (``Group.seal``)."""
        reserved = self._open_reserved - (-nbytes // ALIGN_BYTES) * ALIGN_BYTES  # + aligned(nbytes), inline: once per save
        pool = self.pool
        if pool.refusing or pool.in_use_bytes + reserved > pool.limit_bytes:
            with self._locked():
                self._return_blocks()  # freed groups' blocks may be back by now
                if pool.refusing or pool.in_use_bytes + reserved > pool.limit_bytes:
                    self._books.fallback(
                        nbytes, "pin_failed" if pool.refusing else "full", pool, self._open_reserved
                    )
                    return -1
        self._open_bytes += nbytes
        self._open_reserved = reserved
        sizes = group.sizes
        if stride is not None:
            group.strides[len(sizes)] = stride
        group.sources.append(source)
        sizes.append(nbytes)
        return len(sizes) - 1

    def issue(self, group: Group, release_at: int = NOT_PLANNED) -> bool:
        """Copy ``group`` to host: one block, one ordering event, one copy per storage, one
        event. Returns False when the pool cannot take it (full, host memory pressure,
        or pinning failed): the caller keeps its storages instead, and the group is
        freed. The engine keeps the sources alive until their copy landed (NOTE [Source
        lifetime]) or until ``release_due(release_at)`` (NOTE [Planned release] in
        groups.py)."""
        if group.state is not GroupState.OPEN:
            raise RuntimeError(f"offrecomp: {group!r} was issued already")
        t0 = time.perf_counter()
        with self._locked():
            self._enter()
            self._return_blocks()
            group.seal()
            payload = group.payload_bytes
            self._open_bytes -= payload
            total = group.nbytes
            self._open_reserved -= total
            if not group.sizes:
                group.state = GroupState.FREED
                return True
            block = self.pool.alloc(total)
            if block is None:
                self._books.fallback(total, self.pool.last_failure or "full", self.pool)
                group.state = GroupState.FREED
                return False
            device = group.device
            sources = group.sources
            if None in group.shapes:  # a flat uint8 tensor over each storage (new() is the cheapest)
                empty = self._empties.get(device)
                if empty is None:
                    empty = self._empties[device] = torch.empty(0, dtype=torch.uint8, device=device)
                new = empty.new
                sources = [s if isinstance(s, torch.Tensor) else new().set_(s) for s in sources]
            group.sources = []
            try:
                self._copy_out(group, block, sources, payload, release_at)
            except BaseException as exc:  # NOTE [Interrupted issue]
                finish(functools.partial(self._abandon_issue, group, block), exc)
            books = self._books
            books.offloads += 1
            books.storages += len(sources)
            books.bytes_d2h += payload
            books.offload_host += time.perf_counter() - t0
            return True

    def _copy_out(self, group: Group, block: Block, sources: list[torch.Tensor], payload: int, release_at: int) -> None:
        """Issue ``group``'s copies into ``block`` and keep their sources (``issue``)."""
        backend = self.backend
        device = group.device
        dsts = slot_views(block, group)
        # NOTE [Stream ordering]: live lookup, before any side-stream context.
        compute = backend.current_stream(device)
        d2h = self._side_stream(device, "d2h")
        produced = backend.record_ordering_event(compute)  # NOTE [Ordering events] in backends.py
        self._wait_edge("d2h_after_produce", d2h, produced)
        books = self._books
        timed = books.time_this("d2h")
        start = backend.record_event(d2h, timing=True) if timed else None
        backend.copy_many(dsts, sources, d2h)
        landed = backend.record_event(d2h, timing=timed)
        if start is not None:
            books.timings.append(("d2h", start, landed, payload))
        group.block = block
        group.d2h_done = landed
        group.state = GroupState.OFFLOADED
        group.seq = len(self._order)
        self._keep_sources(InFlight(sources, landed, compute, payload, group, release_at))
        self._order.append(group)
        self._groups.add(group)  # whole from here (``_abandon_issue``)
        self._bound_stash()

    # NOTE [Interrupted issue]
    # An interrupt landing in ``issue`` between its copies' issue and the keeping of their
    # sources would let the sources go under copies in flight and keep the block out of
    # the pool. Raising there, the engine waits for every copy issued, then, from what it
    # finds, completes a group whose sources it kept (in its order once, in its groups) or
    # frees one whose it did not (out of the stash, its block returned).

    def _abandon_issue(self, group: Group, block: Block) -> None:
        self.backend.synchronize()
        if group in self._groups:
            return  # whole
        if group.in_flight is not None:
            if not any(g is group for g in self._order):
                self._order.append(group)
            self._groups.add(group)
            return
        stash = self._stash
        for entry in [e for e in stash if e.group is group]:
            stash.remove(entry)
        self._stash_bytes = sum(e.nbytes for e in stash)
        group.d2h_done = group.block = None
        group.state = GroupState.FREED
        if not block.freed:  # run again after an interrupt: returned once
            self.pool.release(block)

    def release_due(self, boundary: int) -> None:
        """Let go of the sources of the issued groups the plan releases at the end of unit
        ``boundary`` or earlier (NOTE [Planned release] in groups.py); compute first waits
        on a copy that has not landed."""
        stash = self._stash
        try:  # unlocked: another thread's backward may empty it meanwhile
            if stash[0].release_at > boundary:
                return
        except IndexError:
            return
        with self._locked():
            self._enter()
            while stash and stash[0].release_at <= boundary:
                entry = stash[0]
                if not self.backend.query(entry.landed):  # first: interrupted, the sources stay held
                    self._wait_edge("compute_after_d2h", entry.stream, entry.landed)
                    self._books.release_waits += 1
                self._drop(entry)
                stash.popleft()

    def discard(self, group: Group) -> None:
        """An open group that will not be issued (its pass was abandoned)."""
        if group.state is GroupState.OPEN:
            group.seal()
            payload = group.payload_bytes
            self._open_bytes -= payload
            self._open_reserved -= group.nbytes
            group.sources = []
            group.state = GroupState.FREED

    # --------------------------------------------------------------- backward

    def fetch(self, group: Group, serve: bool = False) -> torch.Tensor | None:
        """The group's data as a flat uint8 device tensor the current stream may read
        now; storage ``i`` is at ``group.offsets[i]``. Reloads the group if needed,
        issues prefetch reloads (NOTE [Prefetch order] in transfer.py), and makes compute
        wait once per reload. With ``serve``, None where the group is served from its
        held sources instead (``group.served``: NOTE [Served groups] in transfer.py).
        Raises ``RuntimeError`` for a freed group or when an asynchronous copy failed."""
        buffer = group.buffer
        if group.state is GroupState.FETCHED and buffer is not None:
            return buffer  # compute already waited on this reload
        t0 = time.perf_counter()
        with self._locked():
            self._enter()
            state = group.state
            if state is GroupState.FREED or state is GroupState.OPEN:
                raise RuntimeError(f"offrecomp: {group!r} cannot be fetched")
            backend = self.backend
            # NOTE [Stream ordering]: live lookup, before any side-stream context.
            compute = backend.current_stream(group.device)
            counted = False  # this backward counted its fetch already
            if state is GroupState.SERVED and not serve:  # a caller that needs one buffer
                counted = group.waited
                self._end_serving(group, wait=False)
            elif state is GroupState.OFFLOADED and serve and group.in_flight is not None and self.serve_held:
                self._serve(group)
            if group.state is GroupState.SERVED:
                if not group.waited:  # its first fetch: counted as a reload's
                    group.waited = True
                    group.fetches += 1
                    self._prefetch_for(group, compute)
                backend.check()
                return None
            if group.state is GroupState.OFFLOADED:
                self._reload(group, compute)
            if not counted:
                group.fetches += 1
            self._outstanding_bytes -= group.nbytes
            self._fetched_bytes += group.nbytes
            self._prefetch_for(group, compute)
            landed = group.h2d_done
            counted = group.step == self._step  # NOTE [Several backwards] in lifecycle.py: a finished pass's counts in no step
            if not backend.query(landed):  # landed already: compute waits for nothing, nothing to time
                before = backend.record_event(compute, timing=True) if counted else None
                self._wait_edge("compute_after_h2d", compute, landed)
                if before is not None:
                    after = backend.record_event(compute, timing=True)
                    self._books.timings.append(("stall", before, after, 0))
            group.waited = True
            group.see_writes()  # so far, as the copy may have read them
            # FETCHED only now: another thread's fetch takes the buffer without the lock
            # (Group.ready), and must find compute already waiting on the reload
            if group.reuse is not None:
                group.views = group.reuse.views_for(group)
            group.state = GroupState.FETCHED
            backend.check()
            if counted:
                self._books.reload_host += time.perf_counter() - t0
            buffer = group.buffer
            assert buffer is not None
            return buffer

    def poll(self) -> None:
        """Let go of landed copies' sources, unused reload buffers, freed groups' landed blocks; never waits."""
        with self._locked():
            self._enter()
            self._return_blocks()

    def release_device(self, group: Group) -> None:
        """The caller is done with the reloaded buffer; the host copy stays (retain_graph
        may fetch the group again)."""
        with self._locked():
            self._release_device(group)

    def free(self, group: Group) -> None:
        """The group is no longer needed. Its host block returns to the pool once its
        copies landed (NOTE [Host slot lifetime]). Freeing twice is a no-op. Never blocks
        on CUDA (on the emulated backend, a copy its sources wait for runs on this thread:
        NOTE [Freed sources] in transfer.py); may run in a finaliser, on any thread (NOTE [Free from
        finalisers], NOTE [Frees on a copy worker] in groups.py)."""
        lock = self._lock
        if lock._is_owned():  # type: ignore[attr-defined]
            self._pending_frees.append(group)  # inside an engine call on this thread
            return
        try:
            if not lock.acquire(blocking=False):
                self._pending_frees.append(group)  # another thread is inside the engine
                return
            if self._closed:
                return
            self._free_pending()
            self._free_now(group)
            self._poll()
        finally:
            try:  # noqa: SIM105 - release is the first call here (suppress would put its __enter__ first)
                lock.release()
            except RuntimeError:  # not taken: another thread holds it
                pass

    def prepare(self, sizes: Sequence[int], *, window_bytes: int | None = None) -> int:
        """Get ready for a plan's offloads: pin host memory for these block sizes now,
        rather than in the first step that makes them, and set the in-flight window
        (NOTE [Window under a plan] in transfer.py; None leaves it). Returns the pool's reserved bytes."""
        if window_bytes is not None and window_bytes < 0:
            raise ValueError(f"window_bytes={window_bytes!r} is invalid; it must be >= 0")
        with self._locked():
            self._enter()
            self._return_blocks()
            if window_bytes is not None:
                self.window_bytes = window_bytes
            return self.pool.reserve(sizes)

    def end_step(self) -> OffloadStats:
        """This step's stats; resets the counters and the prefetch ordering."""
        with self._locked():
            self._enter()
            self._return_blocks()
            stats = self._books.end_step(self.backend, self.pool.stats(), len(self._groups))
            self.pool.reset_high_water()
            self._order = []
            self._step += 1
            return stats

    def synchronize(self) -> None:
        """Block the host until every copy landed; settle the stash and deferred frees."""
        with self._locked():
            self._enter()
            self.backend.synchronize()
            self._poll()
            self._return_blocks()
            self.backend.check()

    def close(self) -> None:
        """Synchronize, drop every buffer and group, free the pool. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.backend.synchronize()
            finally:
                self._pending_frees.clear()
                for group in list(self._groups) + self._deferred:
                    group.set_buffer(None)
                    group.served = group.in_flight = None
                    group.block = None
                    group.state = GroupState.FREED
                self._groups.clear()
                self._deferred.clear()
                self._stash.clear()
                self._order = []
                self._books.timings.clear()
                self._stash_bytes = self._outstanding_bytes = self._fetched_bytes = 0
                self._open_bytes = self._open_reserved = 0
                self._streams.clear()
                self._empties.clear()
                self._reuse.clear()
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
    def live_groups(self) -> int:
        """Groups issued and not freed yet."""
        return len(self._groups)

    @property
    def device_bytes(self) -> int:
        """Device bytes the engine holds: storages of open groups, sources of copies in
        flight, and reloads not released yet."""
        return self._open_bytes + self._stash_bytes + self._outstanding_bytes + self._fetched_bytes

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

    def _locked(self) -> threading.RLock:
        """The engine's lock for ``with`` (NOTE [Engine lock] in groups.py); outside an
        engine call, the frees finalisers queued are done first (NOTE [Free from
        finalisers] in groups.py)."""
        lock = self._lock
        if self._pending_frees and not self._closed and not lock._is_owned():  # type: ignore[attr-defined]
            with lock:
                self._free_pending()
        return lock

    def _free_pending(self) -> None:
        """Free what finalisers queued (NOTE [Free from finalisers] in groups.py); the lock
        held."""
        pending = self._pending_frees
        while pending and not self._closed:
            self._free_now(pending[0])  # then popped: a free cut short is done again
            pending.popleft()

    def _release_device(self, group: Group, hold_unlanded: bool = False) -> None:
        """Drop ``group``'s reload, compute first waiting on a copy it did not wait on
        (edge 6). With ``hold_unlanded`` (a free), a reload not landed keeps its buffer
        instead, dropped once it landed (NOTE [Frees on a copy worker] in groups.py)."""
        state = group.state
        if state is GroupState.SERVED:
            self._end_serving(group, wait=not hold_unlanded)
        elif state is GroupState.RELOADING or state is GroupState.FETCHED:
            held = False
            if not group.waited:  # NOTE [Stream ordering]: edge 6
                if hold_unlanded and not self.backend.query(group.h2d_done):
                    held = True
                else:
                    compute = self.backend.current_stream(group.device)
                    self._wait_edge("free_after_h2d", compute, group.h2d_done)
            if state is GroupState.RELOADING:
                self._outstanding_bytes -= group.nbytes
            else:
                self._fetched_bytes -= group.nbytes
            if not held:
                self._drop_reload(group)
            group.state = GroupState.OFFLOADED
        group.uses = 0

    def _drop_reload(self, group: Group) -> None:
        if group.reuse is not None:
            self._reuse.release(group.reuse)
        group.set_buffer(None)  # NOTE [Reload buffer lifetime] in transfer.py

    def _free_now(self, group: Group) -> None:
        if group.state is GroupState.FREED:
            return
        if group.state is GroupState.OPEN:
            self.discard(group)
            return
        self._release_device(group, hold_unlanded=True)
        group.state = GroupState.FREED
        self._groups.discard(group)
        if group.block is not None or group.buffer is not None:
            self._deferred.append(group)
        if group.in_flight is not None and not self.backend.in_stream_work():
            # NOTE [Freed sources] in transfer.py; last: it may wait (and be interrupted)
            self._unstash(group, free=True)

    def _wait_edge(self, edge: Edge, stream: Stream, event: Event) -> None:
        """Enqueue one ordering edge of NOTE [Stream ordering] (``edge`` names it)."""
        self.backend.wait_event(stream, event)

    def _keep_sources(self, entry: InFlight) -> None:
        self._stash.append(entry)
        self._stash_bytes += entry.nbytes
        entry.group.hold(entry.sources)

    def _drop(self, entry: InFlight) -> None:
        """Let go of a group's sources (NOTE [Source lifetime] in transfer.py), their writes since issue
        seen first; a served group's stay handed out (NOTE [Served groups] in transfer.py)."""
        if entry.dropped:  # run again after an interrupt: once
            return
        entry.dropped = True
        self._stash_bytes -= entry.nbytes
        group = entry.group
        if group.state is GroupState.SERVED:
            self._fetched_bytes += entry.nbytes
        group.see_writes()  # NOTE [Writes after a save] (handles.py)
        group.in_flight = None

    def _serve(self, group: Group) -> None:
        """Hand out ``group``'s held sources instead of a reload (NOTE [Served groups] in
        transfer.py)."""
        group.served = group.in_flight
        group.see_writes()  # NOTE [Writes after a save] (handles.py)
        group.state = GroupState.SERVED
        group.waited = False
        group.uses = 0
        if group.step == self._step:  # NOTE [Several backwards] in lifecycle.py
            self._books.served += 1

    def _end_serving(self, group: Group, wait: bool = True) -> None:
        """Let go of the sources ``group`` served. Held still for its copy, they go now,
        compute first waiting on it (``wait``; a free lets go of them itself: NOTE [Freed
        sources])."""
        group.served = None
        group.state = GroupState.OFFLOADED
        group.uses = 0
        if group.in_flight is None:
            self._fetched_bytes -= group.payload_bytes
        elif wait:
            self._unstash(group)

    def _unstash(self, group: Group, free: bool = False) -> None:
        """Let go of ``group``'s sources held for its copy now, compute first waiting on
        the copy if it has not landed (edge 2 of NOTE [Stream ordering]), or for a
        ``free``, their memory reused after it where the backend can (NOTE [Freed sources] in transfer.py)."""
        stash = self._stash
        entry = next(e for e in stash if e.group is group)
        backend = self.backend
        if not backend.query(entry.landed) and not (
            free and backend.free_after(entry.sources, self._side_stream(group.device, "d2h"))
        ):  # first: interrupted, the sources stay held
            self._wait_edge("compute_after_d2h", entry.stream, entry.landed)
        self._drop(entry)
        stash.remove(entry)

    def _bound_stash(self) -> None:
        # NOTE [Source lifetime] in transfer.py: beyond the window, the producer waits on the oldest copy.
        while self._stash_bytes > self.window_bytes and self._stash:
            entry = self._stash[0]
            if not self.backend.query(entry.landed):  # first: interrupted, the sources stay held
                self._wait_edge("compute_after_d2h", entry.stream, entry.landed)
                self._books.window_waits += 1
            self._drop(entry)  # then popped: an interrupt between leaves it to be popped again
            self._stash.popleft()

    def _reload(self, group: Group, compute: Stream) -> None:
        backend = self.backend
        block = group.block
        assert block is not None
        h2d = self._side_stream(group.device, "h2d")
        self._wait_edge("h2d_after_d2h", h2d, group.d2h_done)  # NOTE [Stream ordering]
        buffer, reuse = self._reuse.alloc(backend, group, compute)  # on compute: NOTE [Reload buffer lifetime] in transfer.py
        allocated = backend.record_ordering_event(compute)  # NOTE [Ordering events] in backends.py
        self._wait_edge("h2d_after_alloc", h2d, allocated)
        books = self._books
        counted = group.step == self._step  # NOTE [Several backwards] in lifecycle.py
        timed = counted and books.time_this("h2d")
        start = backend.record_event(h2d, timing=True) if timed else None
        backend.copy_many([buffer], [block.view], h2d)  # the block holds its view
        done = backend.record_event(h2d, timing=timed)
        if start is not None:
            books.timings.append(("h2d", start, done, group.payload_bytes))
        group.set_buffer(buffer, reuse)
        group.h2d_done = done  # NOTE [Host slot lifetime]: the latest reload
        group.waited = False
        group.uses = 0
        group.state = GroupState.RELOADING
        self._outstanding_bytes += group.nbytes
        if counted:
            books.reloads += 1
            books.bytes_h2d += group.payload_bytes

    def _prefetch_for(self, group: Group, compute: Stream) -> None:
        # see NOTE [Prefetch order] in transfer.py
        regions, limit = self.prefetch.regions, self.prefetch.nbytes
        if group.depth is not None:
            regions, limit = group.depth, None  # its plan's (NOTE [Chosen prefetch] in scheduler)
        if group.step != self._step or group.seq < 0 or (regions is None and limit is None):
            return
        issued = 0
        for seq in range(group.seq - 1, -1, -1):
            if regions is not None and issued >= regions:
                return
            other = self._order[seq]
            issued += 1
            if other.state is not GroupState.OFFLOADED or other.fetches >= group.fetches:
                continue
            if other.in_flight is not None and self.serve_held:  # NOTE [Served groups] in transfer.py
                self._serve(other)
                continue
            if (
                limit is not None
                and self._outstanding_bytes > 0
                and self._outstanding_bytes + other.nbytes > limit
            ):
                return
            self._reload(other, compute)
            self._books.prefetches += 1

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
        """Drop landed sources; never waits."""
        query = self.backend.query
        stash = self._stash
        while stash and query(stash[0].landed):
            self._drop(stash[0])  # then popped: an interrupt between leaves it to be popped again
            stash.popleft()
        self._reuse.poll()
        if len(self._books.timings) > 4096:
            self._books.resolve_timings(self.backend)

    def _return_block(self, group: Group) -> None:
        block = group.block
        if block is not None:
            if not block.freed:  # run again after an interrupt: returned once
                self.pool.release(block)
            group.block = None

    def _return_blocks(self) -> None:
        """Return the host blocks of freed groups whose copies landed (NOTE [Host slot
        lifetime] in transfer.py); never waits. An interrupt leaves the groups it did not
        finish listed, each holding its block until the pool has it."""
        if self._deferred:
            query = self.backend.query
            deferred, self._deferred = self._deferred, []
            waiting: list[Group] = []
            try:
                while deferred:
                    group = deferred[0]
                    if query(group.d2h_done) and (group.h2d_done is None or query(group.h2d_done)):
                        if group.buffer is not None:  # freed, its reload in flight (NOTE [Frees on a copy worker])
                            self._drop_reload(group)
                        if group.block is not None:  # NOTE [Idle blocks]
                            finish(functools.partial(self._return_block, group))
                        group.h2d_done = None
                    else:
                        waiting.append(group)
                    del deferred[0]
            finally:
                self._deferred += waiting + deferred
