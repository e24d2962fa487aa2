"""Timings and memory probes.

Device time is read with CUDA events on GPU (recorded on the live compute stream and
resolved lazily, never by a host sync in the hot path) and with ``perf_counter`` on CPU.
Memory comes from the CUDA caching allocator, ``nvidia-ml-py``'s ``pynvml`` (device
capacity without touching the allocator) and ``psutil`` (host).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["Clock", "Mark", "device_capacity_bytes", "host_available_bytes"]


@dataclass
class Mark:
    """A point in time on one clock: host time plus, on GPU, an event."""

    host: float
    event: Any = None


class Clock:
    """Marks points on the compute stream of one device and measures between them."""

    def __init__(self, device: torch.device | None) -> None:
        self.cuda = device is not None and device.type == "cuda"
        self.device = device

    def mark(self) -> Mark:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))  # looked up live
            return Mark(time.perf_counter(), ev)
        return Mark(time.perf_counter())

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
