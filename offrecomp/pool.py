"""Pinned host pool: a few large slabs carved by a first-fit free list.

Per-tensor ``cudaHostAlloc`` is slow and synchronises the device (torchtune #2076), and
torch's caching host allocator rounds every request up to a power of two (pytorch
#95823). The pool pins a handful of slabs (``slab_bytes`` each, or one request if it is
larger), carves them with 512-byte alignment and no rounding beyond that, coalesces
neighbours on free, and keeps the slabs across steps. Nothing is pinned until the first
allocation.

NOTE [Idle blocks]
A training step offloads the same groups every step, so a block returned with
:meth:`PinnedPool.release` stays carved, idle, for the next request of exactly its size:
that request is a dictionary lookup, and the block keeps what its user attached to it
(the engine's slot views, so a group's layout is sliced once, not every step). Idle bytes
count as free, not in use. When a request finds no room, the idle blocks go back to the
free ranges first, so they never cost the pool room it needs.

The pool never reserves more than ``limit_bytes`` and refuses a new slab when the host is
short of memory (``pressure_bytes`` of available memory must remain) or after pinning
failed once (WSL caps pinned memory at 1-2 GB and reports it as a misleading CUDA OOM).
A refused allocation returns ``None``: the caller keeps or recomputes instead.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psutil
import torch

from offrecomp.backends import Backend
from offrecomp.config import HOST_LIMIT_FORMS, Budget
from offrecomp.config import local_world_size as config_local_world_size

__all__ = ["ALIGN_BYTES", "Block", "aligned", "PinnedPool", "PoolStats", "default_host_limit",
           "default_pressure_bytes"]

logger = logging.getLogger(__name__)

ALIGN_BYTES = 512
HOST_SHARE = 0.5
"""Share of the host's available memory that the pools of one node may pin together."""

FailureReason = Literal["full", "pressure", "pin_failed"]


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to ``ALIGN_BYTES``: what a slot or block of it takes."""
    return (nbytes + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


def default_host_limit(local_world_size: int | None = None) -> int:
    """A safe pinned-memory limit for one rank: half of the host's available memory,
    shared by the ranks on this node (``LOCAL_WORLD_SIZE``, default 1)."""
    ranks = config_local_world_size() if local_world_size is None else local_world_size
    if ranks < 1:
        raise ValueError(f"local_world_size={ranks!r} is invalid; accepted: an integer >= 1")
    return int(psutil.virtual_memory().available * HOST_SHARE) // ranks


def host_limit_of(limit: Budget | None) -> int:
    """The pinned host bytes ``Config.host_limit`` lets one rank's pool hold: the default
    share of available memory (None), a byte count as it is, or a percentage of available
    memory shared by the node's ranks. The pool's limit, and the planner's (a plan
    offloads no more than this, NOTE [Host limit in plans] in planning/profiling.py).

    Never 0, which the planner reads as no limit (``Profile.host_limit_bytes``): a limit
    of 0 bytes raises as ``Config`` does, and a share of a host with almost nothing
    available comes to 1 byte, which offloads nothing."""
    if limit is None:
        return max(1, default_host_limit())
    if limit.nbytes is not None:
        if limit.nbytes <= 0:
            raise ValueError(f"host_limit={limit.nbytes!r} is invalid; accepted: {HOST_LIMIT_FORMS}")
        return limit.nbytes
    return max(1, limit.resolve(int(psutil.virtual_memory().available)) // config_local_world_size())


def default_pressure_bytes() -> int:
    """Available host memory that must remain after a new slab: max(2 GiB, 5% of RAM)."""
    return max(2 << 30, int(psutil.virtual_memory().total * 0.05))


@dataclass(frozen=True)
class PoolStats:
    reserved_bytes: int
    """Host bytes held in slabs (pinned on CUDA)."""
    in_use_bytes: int
    """Bytes carved out of the slabs right now (aligned sizes)."""
    high_water_bytes: int
    """Most bytes in use at once since the last :meth:`PinnedPool.reset_high_water`."""
    slabs: int
    allocs: int
    """Successful allocations, all time."""
    failures: int
    """Refused allocations, all time."""


class Block:
    """One carved range of a slab. ``view`` is the flat uint8 host tensor of ``nbytes``."""

    __slots__ = ("freed", "generation", "nbytes", "offset", "size", "slab", "slots", "view")

    def __init__(
        self, slab: int, offset: int, size: int, nbytes: int, view: torch.Tensor, generation: int
    ) -> None:
        self.slab = slab
        self.generation = generation
        self.offset = offset
        self.size = size
        self.nbytes = nbytes
        self.view = view
        self.freed = False
        self.slots: Any = None
        """What the block's user attached to it (kept while the block is idle)."""

    def __repr__(self) -> str:
        return f"Block(slab={self.slab}, offset={self.offset}, size={self.size})"


class _Slab:
    __slots__ = ("free", "size", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.size = tensor.numel()
        self.free: list[tuple[int, int]] = [(0, self.size)]  # (offset, size), sorted


class PinnedPool:
    """First-fit pool of host slabs allocated through ``backend.alloc_host``.

    Not thread-safe on its own: the engine serialises calls.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        limit_bytes: int,
        slab_bytes: int = 64 << 20,
        pressure_bytes: int | None = None,
    ) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes={limit_bytes!r} is invalid; it must be >= 0")
        if slab_bytes < ALIGN_BYTES:
            raise ValueError(f"slab_bytes={slab_bytes!r} is invalid; it must be >= {ALIGN_BYTES}")
        self._backend = backend
        self.limit_bytes = limit_bytes
        self.slab_bytes = slab_bytes
        self.pressure_bytes = default_pressure_bytes() if pressure_bytes is None else pressure_bytes
        self._slabs: list[_Slab] = []
        self._reserved = 0
        self.in_use_bytes = 0
        """Bytes carved out of the slabs right now (aligned sizes). Read, never written,
        outside the pool: a plain attribute, as the engine reads it at every save."""
        self._high_water = 0
        self._allocs = 0
        self._failures = 0
        self.refusing = False
        """True once pinning failed: the pool keeps its slabs and never grows again."""
        self._idle: dict[int, list[Block]] = {}  # nbytes -> released blocks (NOTE [Idle blocks])
        self._idle_bytes = 0
        self._warned: set[str] = set()
        self._generation = 0  # bumped by close(): blocks from before are stale
        self.last_failure: FailureReason | None = None
        """Why the last refused :meth:`alloc` was refused."""

    # ------------------------------------------------------------------ carving

    def alloc(self, nbytes: int) -> Block | None:
        """A block of at least ``nbytes``; ``None`` when the pool cannot serve it."""
        if nbytes <= 0:
            raise ValueError(f"nbytes={nbytes!r} is invalid; it must be > 0")
        idle = self._idle.get(nbytes)
        if idle:
            reused = idle.pop()
            reused.freed = False
            self._idle_bytes -= reused.size
            self._use(reused.size)
            return reused
        size = aligned(nbytes)
        for index, slab in enumerate(self._slabs):
            block = self._carve(index, slab, size, nbytes)
            if block is not None:
                return block
        if self._idle_bytes:  # NOTE [Idle blocks]: give them back, then try again
            self.flush_idle()
            return self.alloc(nbytes)
        new = self._grow(size)
        if new is None:
            self._failures += 1
            return None
        block = self._carve(new, self._slabs[new], size, nbytes)
        assert block is not None  # a new slab is at least `size` bytes
        return block

    def reserve(self, sizes: Sequence[int]) -> int:
        """Pin ahead of use: carve a block of each size in ``sizes``, as a step that holds
        them all at once would, then return them. The slabs stay (the pool never
        shrinks), so that step finds its memory pinned. Stops quietly where :meth:`alloc`
        would refuse (limit, host pressure, pinning failure). Returns the reserved bytes.
        """
        blocks = []
        counters = (self._allocs, self._failures)  # a reservation is not a use
        try:
            for n in sizes:
                if n <= 0:
                    continue
                block = self.alloc(n)
                if block is None:
                    break
                blocks.append(block)
        finally:
            for block in blocks:
                self.free(block)
            self._allocs, self._failures = counters
        self._high_water = self.in_use_bytes
        return self._reserved

    def _carve(self, index: int, slab: _Slab, size: int, nbytes: int) -> Block | None:
        for i, (offset, free) in enumerate(slab.free):
            if free < size:
                continue
            if free == size:
                del slab.free[i]
            else:
                slab.free[i] = (offset + size, free - size)
            self._use(size)
            view = slab.tensor[offset : offset + nbytes]
            return Block(index, offset, size, nbytes, view, self._generation)
        return None

    def _use(self, size: int) -> None:
        self.in_use_bytes += size
        if self.in_use_bytes > self._high_water:
            self._high_water = self.in_use_bytes
        self._allocs += 1

    def free(self, block: Block) -> None:
        """Return ``block``; neighbouring free ranges merge into one."""
        self._check_owned(block)
        block.freed = True
        self.in_use_bytes -= block.size
        self._merge(block)

    def release(self, block: Block) -> None:
        """Return ``block`` to be handed out again, carved as it is, to the next request
        of exactly its ``nbytes`` (NOTE [Idle blocks])."""
        self._check_owned(block)
        idle = self._idle.get(block.nbytes)
        if idle is None:
            idle = self._idle[block.nbytes] = []
        if not idle or idle[-1] is not block:  # run again after an interrupt: listed once
            idle.append(block)
        # one statement with no call in it: an interrupt lands before it or after it
        self.in_use_bytes, self._idle_bytes, block.freed = (
            self.in_use_bytes - block.size, self._idle_bytes + block.size, True
        )

    def flush_idle(self) -> None:
        """Give every idle block back to the free ranges."""
        idle, self._idle = self._idle, {}
        self._idle_bytes = 0
        for blocks in idle.values():
            for block in blocks:
                self._merge(block)

    def _check_owned(self, block: Block) -> None:
        if block.freed:
            raise RuntimeError(f"offrecomp: {block!r} was freed twice")
        if block.generation != self._generation:
            raise RuntimeError(f"offrecomp: {block!r} does not belong to this pool (closed?)")

    def _merge(self, block: Block) -> None:
        free = self._slabs[block.slab].free
        offset, size = block.offset, block.size
        i = bisect.bisect_left(free, (offset, 0))
        if i < len(free) and offset + size == free[i][0]:  # merge with the next range
            size += free[i][1]
            del free[i]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == offset:  # and with the previous one
            offset, size = free[i - 1][0], free[i - 1][1] + size
            i -= 1
            del free[i]
        free.insert(i, (offset, size))

    # ------------------------------------------------------------------ growing

    def _grow(self, need: int) -> int | None:
        remaining = self.limit_bytes - self._reserved
        size = None
        for want in (max(need, min(self.slab_bytes, remaining)), need):
            granted = self._backend.host_alloc_size(want)
            if granted <= remaining:
                size = granted
                break
        if size is None:
            self._refuse("full", None)
            return None
        if self.refusing:
            self._refuse("pin_failed", None)
            return None
        available = psutil.virtual_memory().available
        if available - size < self.pressure_bytes:
            self._refuse(
                "pressure",
                f"offrecomp: host memory is short ({available / 2**30:.2f} GiB available, "
                f"{self.pressure_bytes / 2**30:.2f} GiB must remain); the pinned pool stops "
                f"growing at {self._reserved / 2**20:.0f} MiB",
            )
            return None
        try:
            tensor = self._backend.alloc_host(size)
        except RuntimeError as exc:
            self.refusing = True
            self._refuse(
                "pin_failed",
                f"offrecomp: pinning {size / 2**20:.0f} MiB of host memory failed ({exc}); the "
                "pool keeps its slabs and stops growing. Lower OFFRECOMP_HOST_LIMIT to silence "
                "this",
            )
            return None
        self._slabs.append(_Slab(tensor))
        self._reserved += size
        logger.debug("pinned pool: new slab of %d bytes (%d reserved)", size, self._reserved)
        return len(self._slabs) - 1

    def _refuse(self, reason: FailureReason, message: str | None) -> None:
        self.last_failure = reason
        if message is not None and reason not in self._warned:
            self._warned.add(reason)
            logger.warning(message)

    # ------------------------------------------------------------------ stats

    def stats(self) -> PoolStats:
        return PoolStats(
            reserved_bytes=self._reserved,
            in_use_bytes=self.in_use_bytes,
            high_water_bytes=self._high_water,
            slabs=len(self._slabs),
            allocs=self._allocs,
            failures=self._failures,
        )

    def reset_high_water(self) -> None:
        self._high_water = self.in_use_bytes

    @property
    def idle_bytes(self) -> int:
        """Bytes of released blocks kept carved for reuse (NOTE [Idle blocks])."""
        return self._idle_bytes

    def free_ranges(self) -> list[list[tuple[int, int]]]:
        """Each slab's free ``(offset, size)`` ranges (idle blocks are not in them), for
        tests and debugging."""
        return [list(slab.free) for slab in self._slabs]

    def close(self) -> None:
        """Drop every slab. Blocks still out become invalid; the pool can grow again."""
        self._slabs.clear()
        self._idle = {}
        self._idle_bytes = 0
        self._generation += 1
        self._reserved = 0
        self.in_use_bytes = 0
        self._high_water = 0
        self.refusing = False
