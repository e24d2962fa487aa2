"""Streams, events, copies and buffers behind one small interface.

:class:`CudaBackend` drives real CUDA streams. :class:`EmulatedBackend` runs the same
engine code on a machine without a GPU: "device" tensors are CPU tensors, the compute
stream is the calling thread and every side stream is a worker thread with a FIFO
queue, so the engine's ordering edges are exercised for real (a missing wait shows up as
wrong data or as a recorded error, not as a silent pass).

Nothing here touches CUDA at import: streams are created on first use.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from offrecomp import _torch_compat as tc

__all__ = [
    "Backend",
    "CudaBackend",
    "EmulatedBackend",
    "Event",
    "Stream",
    "get_backend",
]

logger = logging.getLogger(__name__)

#: Opaque handles: a backend only ever receives back the objects it handed out.
Stream = Any
Event = Any


class Backend(ABC):
    """What the offload engine needs from a device runtime.

    Streams execute their work in order; an event marks a point in a stream. Every method
    except :meth:`synchronize` (and, on the emulated backend, a wait enqueued on the
    compute stream) returns without waiting for the device.
    """

    name: str = "abstract"
    device_type: str = "abstract"
    """The kind of device whose tensors this backend moves."""

    @abstractmethod
    def current_stream(self, device: torch.device) -> Stream:
        """The stream the caller's compute runs on right now (never cache it)."""

    @abstractmethod
    def new_stream(self, device: torch.device) -> Stream:
        """A fresh side stream on ``device``."""

    @abstractmethod
    def record_event(self, stream: Stream, timing: bool = False) -> Event:
        """Mark the current end of ``stream``'s queue."""

    def record_ordering_event(self, stream: Stream) -> Event:
        """``record_event`` for an event the caller only makes another stream wait on, at
        once, and never holds (NOTE [Ordering events]): a backend may hand out the same
        event again at its next call for ``stream``."""
        return self.record_event(stream)

    @abstractmethod
    def wait_event(self, stream: Stream, event: Event) -> None:
        """Make work enqueued later on ``stream`` start only after ``event`` completed."""

    @abstractmethod
    def query(self, event: Event) -> bool:
        """True when ``event`` has completed; never blocks."""

    @abstractmethod
    def elapsed_seconds(self, start: Event, end: Event) -> float:
        """Seconds between two completed timing events."""

    @abstractmethod
    def copy_many(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], stream: Stream) -> None:
        """Enqueue ``dst.copy_(src)`` for each pair, in order, on ``stream``."""

    @abstractmethod
    def alloc_host(self, nbytes: int) -> torch.Tensor:
        """A flat uint8 host buffer that copies can use asynchronously (pinned on CUDA)."""

    def host_alloc_size(self, nbytes: int) -> int:
        """Host bytes that :meth:`alloc_host` really reserves for a request of ``nbytes``."""
        return nbytes

    @abstractmethod
    def alloc_device(
        self, nbytes: int, device: torch.device, stream: Stream, storage: Any = None
    ) -> torch.Tensor:
        """A flat uint8 device buffer owned by ``stream`` (its memory is reused only in
        ``stream``'s order). With ``storage`` (an empty ``UntypedStorage`` on ``device``),
        that storage is grown to ``nbytes`` instead and the buffer is over it (NOTE
        [Reused reload buffers] in transfer.py)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block the host until every stream this backend knows of is idle."""

    def check(self) -> None:
        """Raise the first error a side stream recorded since the last call (if any)."""
        return None

    def close(self) -> None:
        """Synchronize and drop side streams; the backend can be used again afterwards."""
        self.synchronize()

    def on_side_thread(self) -> bool:
        """Is the calling thread one that runs a side stream's work (the emulated
        backend's workers)? Such a thread must not wait on the streams or close them
        (NOTE [Frees on a copy worker] in groups.py)."""
        return False

    def in_stream_work(self) -> bool:
        """``on_side_thread``, or the calling thread is running a side stream's work for
        it now (a thread that waits on a stream or drains it runs its jobs): it must not
        wait on the streams."""
        return self.on_side_thread()

    def free_after(self, sources: list[torch.Tensor], stream: Stream) -> bool:
        """Have the memory of ``sources`` reused only after the work queued on ``stream``
        so far, once nothing holds them, without a wait on any stream: True if this
        backend can (NOTE [Freed sources] in transfer.py), False if the caller must order
        their reuse itself."""
        return False

    def canonical_device(self, device: torch.device) -> torch.device:
        """``device`` with its index filled in, as tensors report it."""
        return device


# --------------------------------------------------------------------------- CUDA

# NOTE [Ordering events]
# Two of the engine's edges order a side stream after the compute stream at one point
# (a group's copies after the ops that produced its storages; a reload after its buffer
# was allocated): record an event on compute, make the side stream wait on it, drop the
# event. A CUDA stream wait takes the event's latest record at the time of the wait, so
# one event per stream, recorded again for each edge, orders every later edge as a fresh
# one would, without creating and destroying an event (two more runtime calls and a
# Python object) per edge. Events the engine holds (a copy's landing, queried and waited
# on later) stay one per record.


class CudaBackend(Backend):
    """Real CUDA streams, events and pinned memory (torch 2.5+ public APIs)."""

    name = "cuda"
    device_type = "cuda"

    def __init__(self) -> None:
        self._streams: list[torch.cuda.Stream] = []
        self._devices: set[int] = set()
        self._ordering: dict[tuple[int, int], torch.cuda.Event] = {}  # NOTE [Ordering events]

    def current_stream(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def new_stream(self, device: torch.device) -> torch.cuda.Stream:
        stream = torch.cuda.Stream(device=device)
        self._streams.append(stream)
        self._devices.add(stream.device.index if stream.device.index is not None else 0)
        return stream

    def record_event(self, stream: torch.cuda.Stream, timing: bool = False) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=timing)
        event.record(stream)
        return event

    def record_ordering_event(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        # torch.cuda.current_stream() makes a new Stream object per call: key by device
        # and the raw stream handle (NOTE [Ordering events])
        key = (stream.device_index, stream.cuda_stream)
        event = self._ordering.get(key)
        if event is None:
            event = self._ordering[key] = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)

    def free_after(self, sources: list[torch.Tensor], stream: torch.cuda.Stream) -> bool:
        for source in sources:  # the allocator reuses each block once the stream passed this point
            source.record_stream(stream)
        return True

    def query(self, event: torch.cuda.Event) -> bool:
        return bool(event.query())

    def elapsed_seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return float(start.elapsed_time(end)) / 1000.0

    def copy_many(
        self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], stream: torch.cuda.Stream
    ) -> None:
        # The caller looked up the compute stream before this context is entered: one
        # stream switch for the whole group.
        with torch.cuda.stream(stream):
            for dst, src in zip(dsts, srcs):
                dst.copy_(src, non_blocking=True)

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def host_alloc_size(self, nbytes: int) -> int:
        # torch's caching host allocator rounds pinned requests up to a power of two
        # (pytorch #95823). Asking for the rounded size makes the whole block usable and
        # keeps the pool's accounting equal to what is really pinned.
        return 1 << max(0, nbytes - 1).bit_length()

    def alloc_device(
        self, nbytes: int, device: torch.device, stream: torch.cuda.Stream, storage: Any = None
    ) -> torch.Tensor:
        with torch.cuda.stream(stream):
            if storage is None:
                return torch.empty(nbytes, dtype=torch.uint8, device=device)
            storage.resize_(nbytes)  # allocated on ``stream``, as torch.empty would be
            return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)

    def synchronize(self) -> None:
        for index in sorted(self._devices):
            torch.cuda.synchronize(index)

    def close(self) -> None:
        used = bool(self._devices)
        self.synchronize()
        self._streams.clear()
        self._devices.clear()
        # Dropped slabs go back to torch's pinned cache, which keeps them pinned; hand
        # them back to the OS too (it also releases other idle cached pinned blocks of
        # this process).
        if used:
            tc.host_empty_cache()

    def canonical_device(self, device: torch.device) -> torch.device:
        if device.index is None:
            return torch.device(device.type, torch.cuda.current_device())
        return device


# ----------------------------------------------------------------------- emulated

_GARBAGE = 0xFF  # bytes of a fresh buffer: NaN for every float dtype
_EMPTY_BYTES = torch.empty(0, dtype=torch.uint8)
_HOST_WAIT_TIMEOUT_S = 300.0  # a host wait this long means a stream can never reach the event
_IN_STREAM = threading.local()  # depth: host waits on side streams and their jobs the thread is in
START_DELAY_S = 0.005
"""A side stream's worker starts a job this long after it was queued (NOTE [Emulated waits])."""
_IDLE_POLLS = 20  # a worker idle this many delays parks until a job is queued


class _EmuEvent:
    """A point in an emulated stream: fired by the stream's jobs, in order. Waiting on it
    uses its stream's condition, so an event costs one small object (NOTE [Emulated
    events])."""

    __slots__ = ("fired", "stamp", "stream")

    def __init__(self, stream: _EmuStream | None = None) -> None:
        self.fired = False
        self.stamp = 0.0
        self.stream = stream  # the side stream that fires it (None: the host, fired)

    def fire(self) -> None:
        self.stamp = time.perf_counter()
        self.fired = True
        stream = self.stream
        # ``fired`` is set before ``waiters`` is read, and a waiter counts itself before
        # it reads ``fired``: one of the two sees the other (NOTE [Emulated events]).
        if stream is not None and stream.waiters:
            with stream.landed:
                stream.landed.notify_all()


def _host_wait(event: _EmuEvent, run: Callable[[_EmuStream], bool] | None = None) -> None:
    """Block until ``event`` fired. With ``run``, the waiting thread runs the jobs queued
    ahead of the event on its stream itself, in order, when the worker is idle (NOTE
    [Emulated waits])."""
    deadline = time.monotonic() + _HOST_WAIT_TIMEOUT_S
    stream = event.stream
    if event.fired:
        return
    _IN_STREAM.depth = getattr(_IN_STREAM, "depth", 0) + 1  # in_stream_work() while it waits
    try:
        _wait_fired(event, stream, run, deadline)
    finally:
        _IN_STREAM.depth -= 1


def _wait_fired(
    event: _EmuEvent, stream: _EmuStream | None, run: Callable[[_EmuStream], bool] | None, deadline: float
) -> None:
    while not event.fired:
        if stream is None:
            raise RuntimeError("offrecomp: an emulated host event that never fired")
        if run is not None and run(stream):
            continue
        with stream.landed:
            stream.waiters += 1
            try:
                if not event.fired:
                    stream.landed.wait(0.001 if run is not None else _HOST_WAIT_TIMEOUT_S)
            finally:
                stream.waiters -= 1
        if not event.fired and time.monotonic() > deadline:
            raise RuntimeError(
                f"offrecomp: emulated event not reached after {_HOST_WAIT_TIMEOUT_S:.0f} s; "
                "its stream was closed or is blocked"
            )


# NOTE [Emulated events]
# An event is a flag and a time stamp; its stream holds one condition for every thread
# that waits on any of its events. A CUDA event costs the host about a microsecond, so
# the emulation must not cost much more (a lock and a condition per event would cost
# several times the engine's own work per group). A wait on an event that already fired
# enqueues nothing: the stream would run past it at once.


# NOTE [Emulated waits]
# A side stream is a worker thread, and a worker needs the GIL to run a job: while the
# host runs Python (a forward), each job takes the interpreter lock from the host at its
# next torch call and hands it back later, a cost of the emulation that no GPU has (a
# third of the host time per offloaded storage, measured). So a worker starts a job only
# START_DELAY_S after it was queued, looking for jobs every START_DELAY_S rather than
# being woken by each (it parks after _IDLE_POLLS empty looks, and the next job wakes
# it). A thread that waits on a side stream's event runs the jobs queued ahead of it
# itself, one at a time, under the stream's execution lock and in FIFO order, as the
# worker would. In a step shorter than the delay the host runs the copies it waits for
# and the worker stays asleep; in a longer one the worker runs what nobody waited on,
# concurrently with the host. Jobs still run exactly once, in order, and never before
# their ordering edges, so a missing edge still shows up, and more reliably: a copy
# nobody waited on has not run yet, and its destination still holds 0xFF bytes.


class _EmuStream:
    """The host thread (``worker is None``) or a worker thread draining a FIFO queue."""

    def __init__(self, label: str, backend: EmulatedBackend | None) -> None:
        self.label = label
        self.closed = False  # its worker was told to stop
        self.is_compute = backend is None  # the host thread: no worker
        self._start(backend)

    def _start(self, backend: EmulatedBackend | None) -> None:
        """Fresh queue, locks and worker (also in a forked child: NOTE [Emulated streams
        across fork])."""
        self.jobs: deque[tuple[float, Callable[[], None] | None]] = deque()  # (due, job)
        self.queue_lock = threading.Lock()  # guards ``jobs`` (``with`` it directly: no Python call)
        self.ready = threading.Condition(self.queue_lock)  # a job was queued
        self.running = threading.Lock()  # held while one of its jobs runs (NOTE [Emulated waits])
        self.landed = threading.Condition(threading.Lock())  # one of its events fired
        self.waiters = 0  # threads waiting on ``landed``
        self.parked = False  # the worker waits for a job to be queued (NOTE [Emulated waits])
        self.worker: threading.Thread | None = None
        if backend is not None:
            self.worker = threading.Thread(
                target=backend._drain, args=(self,), name=f"offrecomp-{self.label}", daemon=True
            )
            self.worker.start()

    def __repr__(self) -> str:
        return f"<emulated stream {self.label}>"


class _Alone:
    """A reference-count probe: an object only one list holds."""


# NOTE [Emulated sources]
# On a GPU, a copy's source is device memory its owner must keep until the copy landed;
# freed earlier, the allocator hands it to the next kernel under the copy. The emulated
# copy job holds its sources itself (it must, to copy them), so it tells "freed by the
# owner" by reference counts: a source that only the job's list still references was
# dropped by everyone else. The list ends with a probe object that nothing else
# references, whose count is the bar. This costs the host no object per source (a weak
# reference per source would be one more object for the collector to track per
# offloaded storage, in emulation only).


def _from_signal_handler(exc: BaseException) -> bool:
    """Did a Python signal handler raise ``exc``: does its traceback pass through one?"""
    handlers = set()
    for sig in signal.valid_signals():
        with contextlib.suppress(ValueError, OSError):
            h = signal.getsignal(sig)
            while isinstance(h, functools.partial):
                h = h.func
            # a function, a bound method, or an object whose class defines __call__
            fn = getattr(h, "__func__", h)
            call = type(h).__call__ if callable(h) else None
            code = getattr(fn, "__code__", None) or getattr(call, "__code__", None)
            if code is not None:
                handlers.add(code)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            return True
        tb = tb.tb_next
    return False


class EmulatedBackend(Backend):
    """Host emulation of CUDA streams for machines without a GPU.

    - The compute stream is the calling thread: work "enqueued" on it runs at once, events
      recorded on it are complete, and ``wait_event(compute, e)`` blocks the host until
      ``e`` fired (that time is what the engine reports as stall).
    - Each side stream is a daemon worker thread running copies, waits and event records
      in FIFO order, each ``start_delay_s`` after it was queued at the earliest, unless a
      thread waiting on the stream runs it first (NOTE [Emulated waits]).
      ``copy_delay_s`` (read when a copy is enqueued) sleeps before each copy so a test
      can make copies slow on purpose.
    - :meth:`alloc_device` and :meth:`alloc_host` return buffers full of 0xFF bytes, so a
      read that skipped its wait sees NaNs rather than plausible data.
    - A source of a queued copy that its owner dropped before the copy ran models device
      memory reused before the copy landed (NOTE [Emulated sources]); the error is
      recorded and raised by the next :meth:`check`. Destinations are held strongly:
      on CUDA they are allocated on (or owned by) the copying stream, so their reuse is
      already ordered after the copy.
    """

    name = "emulated"
    device_type = "cpu"

    def __init__(self, copy_delay_s: float = 0.0, start_delay_s: float | None = None) -> None:
        self.copy_delay_s = copy_delay_s
        # read at construction: a tool may set the module's START_DELAY_S before a runtime
        # makes its engine (benchmarks/count_hot_path.py)
        self.start_delay_s = START_DELAY_S if start_delay_s is None else start_delay_s
        self._compute = _EmuStream("compute", None)
        self._workers: list[_EmuStream] = []
        self._errors: list[str] = []
        self._lock = threading.Lock()

    # -- worker side
    def _drain(self, stream: _EmuStream) -> None:
        while True:
            with stream.ready:
                polls = 0
                while not stream.jobs:
                    if self.start_delay_s <= 0 or polls >= _IDLE_POLLS:
                        stream.parked = True  # long idle: the next job wakes it
                        stream.ready.wait()
                        stream.parked = False
                    else:
                        stream.ready.wait(self.start_delay_s)
                        polls += 1
                due = stream.jobs[0][0]
            early = due - time.perf_counter()
            if early > 0:
                time.sleep(early)  # a thread that waits on the stream may run it meanwhile
                continue
            with stream.running:
                if not stream.jobs or stream.jobs[0][0] > due:
                    continue  # a waiting thread ran it (NOTE [Emulated waits])
                job = stream.jobs.popleft()[1]
                if job is None:
                    return
                self._run(stream, job)
                job = None  # what it holds (a reload buffer) is free to go now

    def _run(self, stream: _EmuStream, job: Callable[[], None], helping: bool = False) -> None:
        """Run ``job`` of ``stream``: an error it raises is recorded (a broken job must not
        kill the stream; ``check`` raises it). Run by a thread ``helping`` (a wait), one a
        signal handler raised (a watchdog's) is the caller's, not the job's: it reaches
        that thread, which puts the job back."""
        _IN_STREAM.depth = getattr(_IN_STREAM, "depth", 0) + 1  # in_stream_work() while it runs
        try:
            job()
        except Exception as exc:
            if helping and _from_signal_handler(exc):
                raise
            self._error(f"{stream.label}: {type(exc).__name__}: {exc}")
        finally:
            _IN_STREAM.depth -= 1

    def _help(self, stream: _EmuStream) -> bool:
        """Run the next job of ``stream`` on this thread if its worker is idle; True if
        one ran (NOTE [Emulated waits])."""
        if not stream.running.acquire(blocking=False):
            return False
        try:
            if not stream.jobs or stream.jobs[0][1] is None:
                return False
            entry = stream.jobs.popleft()
            try:
                self._run(stream, entry[1], helping=True)  # type: ignore[arg-type]
            except BaseException:
                # an interrupt or a signal handler's exception inside the job: it goes
                # back in its place and runs again (a copy, an event's firing and a wait
                # can all run twice), or an event it was to fire would never fire and
                # every later wait would hang
                stream.jobs.appendleft(entry)
                raise
            return True
        finally:
            stream.running.release()

    def _error(self, message: str) -> None:
        with self._lock:
            self._errors.append(message)

    def _enqueue(self, stream: _EmuStream, job: Callable[[], None] | None) -> None:
        if stream.closed:
            # closed at interpreter exit (NOTE [Workers at exit]) while an atexit handler
            # of the user's still trains or backprops: its jobs run on this thread
            if job is not None:
                self._run(stream, job)
            return
        with stream.queue_lock:
            stream.jobs.append((time.perf_counter() + self.start_delay_s, job))
            if stream.parked:
                stream.ready.notify()

    # -- interface
    def current_stream(self, device: torch.device) -> _EmuStream:
        return self._compute

    def new_stream(self, device: torch.device) -> _EmuStream:
        stream = _EmuStream(f"side{len(self._workers)}", self)
        self._workers.append(stream)
        _WITH_WORKERS.add(self)
        return stream

    def record_event(self, stream: _EmuStream, timing: bool = False) -> _EmuEvent:
        if stream.is_compute:
            event = _EmuEvent()
            event.stamp = time.perf_counter()
            event.fired = True
        else:
            event = _EmuEvent(stream)
            self._enqueue(stream, event.fire)
        return event

    def wait_event(self, stream: _EmuStream, event: _EmuEvent) -> None:
        if event.fired:
            return  # the stream would run past it at once (NOTE [Emulated events])
        if stream.is_compute:
            _host_wait(event, self._help)
        else:
            self._enqueue(stream, functools.partial(_host_wait, event, self._help))

    def query(self, event: _EmuEvent) -> bool:
        return event.fired

    def elapsed_seconds(self, start: _EmuEvent, end: _EmuEvent) -> float:
        if not (start.fired and end.fired):
            raise RuntimeError("offrecomp: elapsed time of an event that has not completed")
        return max(0.0, end.stamp - start.stamp)

    def copy_many(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], stream: _EmuStream) -> None:
        if stream.is_compute:
            for dst, src in zip(dsts, srcs):
                dst.copy_(src)
            return
        delay = self.copy_delay_s
        # The job holds the sources, and a source nothing else holds any more was freed by
        # its owner before the copy ran (NOTE [Emulated sources]).
        held = [*srcs, _Alone()]

        def copy() -> None:
            if delay > 0:
                time.sleep(delay)
            counts = list(map(sys.getrefcount, held))  # each read the same way
            alone = counts.pop()  # the probe: only this list holds it
            if counts and min(counts) <= alone:
                dst = dsts[next(i for i, n in enumerate(counts) if n <= alone)]
                raise RuntimeError(
                    f"copy source ({dst.numel() * dst.element_size()} bytes) was freed "
                    "before its copy ran: device memory would have been reused under an "
                    "in-flight copy"
                )
            tc.foreach_copy_(dsts, held[:-1])  # type: ignore[arg-type]  # one call for the group

        self._enqueue(stream, copy)

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        return torch.full((nbytes,), _GARBAGE, dtype=torch.uint8)

    def alloc_device(
        self, nbytes: int, device: torch.device, stream: _EmuStream, storage: Any = None
    ) -> torch.Tensor:
        if storage is None:
            return torch.full((nbytes,), _GARBAGE, dtype=torch.uint8)
        storage.resize_(nbytes)
        storage.fill_(_GARBAGE)
        return _EMPTY_BYTES.new().set_(storage)  # new(): the cheapest empty tensor

    def synchronize(self) -> None:
        for stream in self._workers:
            if stream.worker is not None and stream.worker.is_alive():
                _host_wait(self.record_event(stream), self._help)

    def on_side_thread(self) -> bool:
        me = threading.current_thread()
        return any(stream.worker is me for stream in self._workers)

    def in_stream_work(self) -> bool:
        # a worker, or a thread waiting on a stream, running its jobs meanwhile (NOTE
        # [Emulated waits]), draining it before a fork or at exit
        return bool(getattr(_IN_STREAM, "depth", 0)) or self.on_side_thread()

    def check(self) -> None:
        if not self._errors:
            return
        with self._lock:
            if not self._errors:
                return
            errors, self._errors = self._errors, []
        raise RuntimeError(
            "offrecomp: an asynchronous copy failed (" + "; ".join(errors) + "). A missing "
            "ordering edge or buffer lifetime bug in the offload engine"
        )

    def close(self) -> None:
        self.synchronize()
        workers, self._workers = self._workers, []
        for stream in workers:
            with stream.ready:
                stream.closed = True
                stream.jobs.append((0.0, None))
                stream.ready.notify()
        for stream in workers:
            assert stream.worker is not None
            stream.worker.join(timeout=5.0)


# NOTE [Workers at exit]
# A side stream's worker is a daemon thread, and an engine stays open after its runtime
# exits (the pool is reused by the next entry). At interpreter exit such a worker may
# still hold queued jobs; run then, during finalization, a job inside torch's C++ ends
# the process with "terminate called without an active exception". So every emulated
# backend with workers is closed at exit: its queued jobs run, its workers stop and are
# joined, before finalization begins. A stream closed so runs what is still enqueued on
# it (a user's atexit handler backpropagating a graph that offloaded) on the caller.
_WITH_WORKERS: weakref.WeakSet[EmulatedBackend] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for backend in list(_WITH_WORKERS):
        try:
            backend.close()
        except Exception as exc:  # exiting: say it, never raise
            logger.error("offrecomp: closing an emulated backend at exit: %s", exc)


# NOTE [Emulated streams across fork]
# A forked child inherits the streams' queues and locks but not their worker threads: a
# job the worker was running at the fork never finishes there, its lock stays held, and
# a host wait on its event spins until the wait's timeout. So the parent drains every
# emulated backend before a fork, and the child gives each worker stream a fresh queue,
# fresh locks and a worker thread of its own.


def _drain_before_fork() -> None:
    for backend in list(_WITH_WORKERS):
        with contextlib.suppress(Exception):  # forking: never raise here
            backend.synchronize()


def _restart_in_child() -> None:
    for backend in list(_WITH_WORKERS):
        for stream in backend._workers:
            if not stream.closed:
                stream._start(backend)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_drain_before_fork, after_in_child=_restart_in_child)


def get_backend(device: torch.device | str) -> Backend:
    """The backend for ``device``: :class:`CudaBackend` for cuda, emulated for cpu.

    Creating a backend does not touch the device; streams appear on first use.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return CudaBackend()
    if dev.type == "cpu":
        return EmulatedBackend()
    raise ValueError(f"offrecomp: no offload backend for device {dev}; accepted: cuda, cpu")
