"""The offload engine's books for one step: groups, storages and bytes moved, copy times
read from events without a host wait (NOTE [Timing without host waits]), fallbacks, and
the step's :class:`~offrecomp.transfer.OffloadStats`.

The engine (``offload.py``) counts on these fields in its per-group methods, as it would
on its own; what runs once per step or on a fallback (resolving timings, making the
stats, resetting the counters, warning of a full pool) is here.
"""

from __future__ import annotations

import logging
from typing import Literal

from offrecomp.backends import Backend, Event
from offrecomp.pool import FailureReason, PinnedPool, PoolStats
from offrecomp.transfer import OffloadStats, gbps
from scheduler.units import format_bytes

__all__ = ["TIME_EVERY", "StepBooks"]

logger = logging.getLogger("offrecomp.offload")  # the engine's warning, under the engine's name

#: Copies timed per link: one group in TIME_EVERY (NOTE [Timing without host waits]).
TIME_EVERY = 4

# NOTE [Timing without host waits]
# Link rates come from timing events recorded around one group copy in TIME_EVERY on
# each side stream; the other copies use untimed events, the cheap ones for ordering.
# Stall time comes from a pair of timing events around fetch()'s compute-stream wait
# (on the emulated backend these are host timestamps around the host wait); a reload
# whose event query() already reports complete costs compute no wait (edge 5 of NOTE
# [Stream ordering] in offload.py is skipped too), so it takes no events and books no
# stall. Elapsed
# times are read only once query() says the end event completed, so a step's stats
# include the copies that landed by end_step() and carry the rest into the next step
# (`pending_timings`). Bandwidth is computed from the bytes whose time is known. Host
# time of issue() and fetch() is measured with perf_counter on every call.

TimingKind = Literal["d2h", "h2d", "stall"]


class StepBooks:
    """What one offload engine did since its last ``end_step``: counters the engine adds
    to, timing events not read yet (``timings``: kind, start, end, bytes), and the
    fallbacks. A plain class with slots, as the engine adds to it once per group."""

    __slots__ = (
        "bytes_d2h", "bytes_h2d", "fallbacks", "offload_host", "offloads", "prefetches",
        "release_waits", "reload_host", "reloads", "seconds", "served", "storages", "timed",
        "timed_bytes", "timings", "warned", "window_waits",
    )

    def __init__(self) -> None:
        self.timings: list[tuple[TimingKind, Event, Event, int]] = []
        self.timed = {"d2h": 0, "h2d": 0}  # copies seen, to time one in TIME_EVERY
        self.warned: set[str] = set()
        self.reset()

    def reset(self) -> None:
        """Zero the counters; timings not landed yet stay for the next step."""
        self.offloads = 0
        self.storages = 0
        self.reloads = 0
        self.prefetches = 0
        self.served = 0
        self.bytes_d2h = 0
        self.bytes_h2d = 0
        self.window_waits = 0
        self.release_waits = 0
        self.offload_host = 0.0
        self.reload_host = 0.0
        self.seconds: dict[str, float] = {"d2h": 0.0, "h2d": 0.0, "stall": 0.0}
        self.timed_bytes: dict[str, int] = {"d2h": 0, "h2d": 0, "stall": 0}
        self.fallbacks: dict[str, int] = {"full": 0, "pressure": 0, "pin_failed": 0}

    def time_this(self, kind: Literal["d2h", "h2d"]) -> bool:
        """Is this copy of ``kind`` one of the timed ones (one in TIME_EVERY)?"""
        n = self.timed[kind]
        self.timed[kind] = n + 1
        return n % TIME_EVERY == 0

    def resolve_timings(self, backend: Backend) -> None:
        """Read the timings whose end event landed; keep the rest. Never waits."""
        # see NOTE [Timing without host waits]
        pending = []
        for kind, start, end, nbytes in self.timings:
            if backend.query(end):
                self.seconds[kind] += backend.elapsed_seconds(start, end)
                self.timed_bytes[kind] += nbytes
            else:
                pending.append((kind, start, end, nbytes))
        self.timings = pending

    def fallback(self, nbytes: int, reason: FailureReason, pool: PinnedPool, pending: int = 0) -> None:
        """``pool`` could not take ``nbytes`` beside the ``pending`` bytes of groups not yet
        copied (their blocks are carved when they close): count it, and warn once that it
        is full."""
        self.fallbacks[reason] += 1
        if reason == "full" and reason not in self.warned:
            self.warned.add(reason)
            stats = pool.stats()
            logger.warning(
                "offrecomp: the pinned host pool cannot take %s more (%d bytes): %s in use and %s "
                "for groups not yet copied, of a limit of %s; the saves it cannot take are kept "
                "(or recomputed, where a plan drops them). Raise the host limit (host_limit=, "
                "OFFRECOMP_HOST_LIMIT) to offload more",
                format_bytes(nbytes), nbytes, format_bytes(stats.in_use_bytes), format_bytes(pending),
                format_bytes(pool.limit_bytes),
            )

    def end_step(self, backend: Backend, pool: PoolStats, live_groups: int) -> OffloadStats:
        """The step's stats (``pool``: the pool's now; ``live_groups``: groups issued and
        not freed), the timings that landed read first; the counters start again."""
        self.resolve_timings(backend)
        stats = OffloadStats(
            backend=backend.name,
            groups_offloaded=self.offloads,
            storages_offloaded=self.storages,
            groups_reloaded=self.reloads,
            prefetches=self.prefetches,
            bytes_d2h=self.bytes_d2h,
            bytes_h2d=self.bytes_h2d,
            d2h_seconds=self.seconds["d2h"],
            h2d_seconds=self.seconds["h2d"],
            d2h_gbps=gbps(self.timed_bytes["d2h"], self.seconds["d2h"]),
            h2d_gbps=gbps(self.timed_bytes["h2d"], self.seconds["h2d"]),
            stall_seconds=self.seconds["stall"],
            window_waits=self.window_waits,
            offload_host_seconds=self.offload_host,
            reload_host_seconds=self.reload_host,
            fallbacks_pool_full=self.fallbacks["full"],
            fallbacks_host_pressure=self.fallbacks["pressure"],
            fallbacks_pin_failed=self.fallbacks["pin_failed"],
            pool_reserved_bytes=pool.reserved_bytes,
            pool_in_use_bytes=pool.in_use_bytes,
            pool_high_water_bytes=pool.high_water_bytes,
            live_groups=live_groups,
            pending_timings=len(self.timings),
            release_waits=self.release_waits,
            groups_served=self.served,
        )
        self.reset()
        return stats
