"""Timings and memory probes.

Device time is read with CUDA events on GPU (recorded on the live compute stream and
resolved lazily, never by a host sync in the hot path) and with ``perf_counter`` on CPU.
Memory comes from the CUDA caching allocator, ``nvidia-ml-py``'s ``pynvml`` (device
capacity without touching the allocator) and ``psutil`` (host).

NOTE [Host pauses]: a timed span can contain a pause of the Python interpreter that has
nothing to do with the work timed: a garbage collection (a full one walks every object
in the process, 50-500 ms in a training process) runs in whatever code allocated last,
and on GPU the device drains its queue and idles while the host is stopped, so the
CUDA events around a 2 ms block can read 100 ms. Every mark carries the seconds the
interpreter has spent in collections so far (``gc.callbacks``, installed once per
process by the first clock), so the pause inside any span is known, and the planner
learns nothing from spans a pause distorted.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

PAUSE_SHARE = 0.1
"""A span whose host pauses exceed this share of it teaches the planner nothing."""
PAUSE_FLOOR_SECONDS = 1e-3
"""Host pauses up to this long never disqualify a span."""

__all__ = ["Clock", "Mark", "device_capacity_bytes", "distorts", "gc_seconds", "host_available_bytes"]


class _GcWatch:
    """Cumulative seconds spent in garbage collections (NOTE [Host pauses])."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started: float | None = None
        self._installed = False
        self._lock = threading.Lock()

    def install(self) -> None:
        if self._installed:
            return
        with self._lock:
            if not self._installed:
                gc.callbacks.append(self._callback)
                self._installed = True

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # collections hold the GIL and do not nest: one start/stop pair at a time
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None


_GC = _GcWatch()


def distorts(paused: float, span: float | None) -> bool:
    """Does ``paused`` seconds of host pause distort a span of ``span`` seconds? True when
    it is more than 1 ms and more than 10% of the span (None: unknown, so yes): on GPU a
    shorter pause hides under queued work (NOTE [Host pauses])."""
    return paused > PAUSE_FLOOR_SECONDS and (span is None or paused > PAUSE_SHARE * span)


def gc_seconds() -> float:
    """Seconds this process has spent in garbage collections since the first clock."""
    return _GC.seconds


@dataclass
class Mark:
    """A point in time on one clock: host time plus, on GPU, an event; ``gc`` is the
    interpreter's cumulative seconds in garbage collection at the mark."""

    host: float
    event: Any = None
    gc: float = 0.0


class Clock:
    """Marks points on the compute stream of one device and measures between them."""

    def __init__(self, device: torch.device | None) -> None:
        self.cuda = device is not None and device.type == "cuda"
        self.device = device
        _GC.install()

    def mark(self) -> Mark:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))  # looked up live
            return Mark(time.perf_counter(), ev, _GC.seconds)
        return Mark(time.perf_counter(), None, _GC.seconds)

    @staticmethod
    def pause(a: Mark | None, b: Mark | None) -> float:
        """Seconds the interpreter spent in garbage collection between ``a`` and ``b``
        (NOTE [Host pauses]); 0 when either is unknown."""
        if a is None or b is None:
            return 0.0
        return max(0.0, b.gc - a.gc)

    def distorted(self, a: Mark | None, b: Mark | None, seconds: float | None = None) -> bool:
        """Did a host pause distort the span from ``a`` to ``b`` (``seconds`` long, else
        measured here)? See :func:`distorts`."""
        paused = self.pause(a, b)
        if paused <= PAUSE_FLOOR_SECONDS:
            return False  # without measuring the span (a CUDA event wait)
        return distorts(paused, seconds if seconds is not None else self.seconds(a, b, wait=True))

    def ready(self, *marks: Mark | None) -> bool:
        return all(m is None or m.event is None or m.event.query() for m in marks)

    def seconds(self, a: Mark | None, b: Mark | None, *, wait: bool = False) -> float | None:
        """Elapsed seconds from ``a`` to ``b``; None when unknown (not ready and not waited)."""
        if a is None or b is None:
            return None
        if a.event is not None and b.event is not None:
            if not b.event.query():
                if not wait:
                    return None
                b.event.synchronize()
            return float(a.event.elapsed_time(b.event)) / 1e3
        return b.host - a.host


class DeviceClock:
    """The runtime's device and the clock on it, shared by the runtime's parts. A model
    without parameters or buffers has no device until its first region call shows one
    (``discover``)."""

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.clock = Clock(device)

    def discover(self, device: torch.device | None) -> None:
        if self.device is None and device is not None:
            self.device = device
            self.clock = Clock(device)

    def follow(self, device: torch.device | None) -> bool:
        """The model is on ``device`` now (None: it has no tensor): take it, and its
        clock, where it is another real device (NOTE [Model devices] in context.py).
        True if it moved."""
        if device is None or device.type == "meta" or device == self.device:
            return False
        self.device = device
        self.clock = Clock(device)
        return True

    def mark(self) -> Mark:
        return self.clock.mark()

    @property
    def cuda(self) -> bool:
        return self.clock.cuda

    def allocator_stats(self) -> dict[str, Any]:
        """The CUDA caching allocator's counters (``torch.cuda.memory_stats``: one read
        gives a pass's peak and OOM count); empty off CUDA."""
        if not self.clock.cuda:
            return {}
        return dict(torch.cuda.memory_stats(self.device))

    def oom_count(self, stats: dict[str, Any] | None = None) -> int:
        """Out-of-memory errors the device's caching allocator has raised in this process
        (NOTE [Unseen out-of-memory errors] in lifecycle.py), read from ``stats`` (an
        ``allocator_stats()``) or now; 0 off CUDA."""
        if stats is None:
            stats = self.allocator_stats()
        return int(stats.get("num_ooms", 0))


def device_capacity_bytes(device: torch.device) -> int:
    """Total memory of ``device`` (host memory for CPU)."""
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
                return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # pynvml missing or NVML unavailable (containers): ask torch
            return int(torch.cuda.get_device_properties(idx).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def host_available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)
