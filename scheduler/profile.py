"""The measured facts the runtime hands to the planner.

Plain numbers only: this module (like all of ``scheduler``) never imports torch, so a
profile saved from one machine can be planned for another ("what-if" planning).

Vocabulary
----------
* A **step** here is one forward + its backward (one micro-batch).
* A **region** is a module whose forward can be replayed (a transformer block). The same
  region module may be called several times per step; each call is a separate
  ``RegionRecord`` with its own ``call_index``.
* A **storage** is one device allocation that autograd saved for backward, however many
  saved tensors (views) refer to it. Placements are decided per storage: a storage is
  kept, offloaded or dropped as a whole, and its bytes are counted once.
* An **op** is one ATen operator call inside a region's forward, in dispatch order.

Replay semantics the cost model must reproduce
----------------------------------------------
When some storages of a region call are dropped (RECOMPUTE), the first backward access
to one of them replays the region's forward from its captured inputs:

1. Replay executes ops in forward order ``0, 1, 2, ...`` and stops right after the last
   save of the last dropped storage, i.e. it covers ops ``0 .. K-1`` with
   ``K = max(storage.last_save_op for dropped storages)``.
2. Inside that prefix an op is *served* (costs nothing) when ``op.skippable`` is true,
   the region is not ``opaque``, and every entry of ``op.outputs`` is ``>= 0`` and names
   a storage placed KEEP. Otherwise it runs and costs ``op.seconds``.
3. An op whose ``outputs`` contains ``-1`` produces a tensor that no backward formula
   saved (e.g. the output projection of attention before a residual add); it therefore
   always runs when it lies inside the prefix.

So ``replay_seconds(region, dropped) = sum(op.seconds for op in ops[:K] if not served(op))``.
Storages of kind ``input`` are the region inputs the runtime holds for replay (the
checkpoint); they may be KEEP or OFFLOAD, never RECOMPUTE. Storages of kind
``external`` (tensors created outside the region and read by it, e.g. a cache held by
the module) are always KEEP and their bytes are not freed by any placement.
Root storages (saved outside every region) may be KEEP or OFFLOAD only.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "PROFILE_VERSION",
    "OpRecord",
    "Profile",
    "RegionRecord",
    "StorageKind",
    "StorageRecord",
]

PROFILE_VERSION = 1

StorageKind = Literal["activation", "input", "external"]


@dataclass(kw_only=True)
class OpRecord:
    """One ATen op of a region's forward."""

    seconds: float
    """Measured forward time of the op (device time on GPU, wall time on CPU)."""
    skippable: bool
    """Pure compute op (not a view, not in-place, no RNG use, not a factory): replay may
    serve its outputs from held storages instead of running it."""
    outputs: tuple[int, ...] = ()
    """For each tensor output: index into the region's ``storages`` if that output's
    storage was saved for backward, else -1."""
    name: str = ""
    """Operator name (for explanations only)."""
    flops: float = 0.0
    """Estimated floating point operations, where known (0 = unknown)."""


@dataclass(kw_only=True)
class StorageRecord:
    """One saved device allocation."""

    nbytes: int
    """Size of the allocation in bytes (counted once however many views were saved)."""
    kind: StorageKind = "activation"
    """``activation``: produced inside the region; ``input``: a region input held for
    replay; ``external``: created outside the region (always kept)."""
    producer_op: int = -1
    """Index of the op that allocated it, -1 when it came from outside the region."""
    first_save_op: int = 0
    """Number of the region's ops dispatched before its first save."""
    last_save_op: int = 0
    """Number of the region's ops dispatched before its last save (replay stops there)."""
    offset_seconds: float = 0.0
    """Time from the region's start to the first save: the earliest a D2H copy can start."""
    saves: int = 1
    """How many saved tensors refer to this storage."""
    backward_offset_seconds: float | None = None
    """Time from the start of backward to the first use of this storage in backward,
    where measured (None: the simulator derives it from region backward times)."""


@dataclass(kw_only=True)
class RegionRecord:
    """One call of one region in the step."""

    name: str
    """Qualified module name (``layers.3``)."""
    call_index: int
    """Index of this call among the calls of the same region in the step (0, 1, ...)."""
    start_seconds: float
    """Start of the region relative to the start of the step's forward."""
    forward_seconds: float
    """Measured forward time of the region."""
    backward_seconds: float
    """Measured (or estimated, 2x forward) backward time of the region, excluding replay."""
    ops: list[OpRecord] = field(default_factory=list)
    """The region's ATen ops in dispatch order (empty when not recorded)."""
    storages: list[StorageRecord] = field(default_factory=list)
    """Saved storages in order of first save."""
    opaque: bool = False
    """True when the region runs work the recorder cannot see (custom autograd
    Functions, compiled code, no_grad blocks): replay then never serves ops and always
    reruns the whole prefix up to the last dropped storage."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.call_index)


@dataclass(kw_only=True)
class Profile:
    """Everything the planner knows about one step signature."""

    signature: str
    """Input shape signature the profile belongs to."""
    device: str = "cpu"
    """``cuda`` or ``cpu`` (or a what-if device name)."""
    forward_seconds: float = 0.0
    """Forward time of the step (without offrecomp overheads)."""
    backward_seconds: float = 0.0
    """Backward time of the step, excluding replay."""
    d2h_gbps: float = 0.0
    """Device-to-host bandwidth in GB/s (1e9 bytes/s); 0 = no offload link."""
    h2d_gbps: float = 0.0
    """Host-to-device bandwidth in GB/s (1e9 bytes/s); 0 = no offload link."""
    regions: list[RegionRecord] = field(default_factory=list)
    """Region calls in forward order."""
    root: list[StorageRecord] = field(default_factory=list)
    """Storages saved outside every region (KEEP or OFFLOAD only)."""
    fixed_bytes: int = 0
    """Device bytes the rest of training needs at the activation peak (weights,
    gradients, optimizer state, workspace), where measured."""
    device_capacity_bytes: int = 0
    """Total device memory, where known."""
    host_limit_bytes: int = 0
    """Pinned host memory available for offload (0 = unlimited)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form facts (hardware name, versions, model description)."""
    version: int = PROFILE_VERSION

    # ------------------------------------------------------------------ derived

    @property
    def activation_bytes(self) -> int:
        """Bytes of every placeable storage (what keeping everything would hold)."""
        total = sum(s.nbytes for s in self.root)
        for r in self.regions:
            total += sum(s.nbytes for s in r.storages)
        return total

    # ------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json(indent=1))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        version = int(data.get("version", PROFILE_VERSION))
        if version != PROFILE_VERSION:
            raise ValueError(
                f"profile version {version} is not supported; this build reads version "
                f"{PROFILE_VERSION}"
            )
        regions = []
        for r in data.get("regions", []):
            ops = [OpRecord(**{**o, "outputs": tuple(o.get("outputs", ()))}) for o in r.get("ops", [])]
            storages = [StorageRecord(**s) for s in r.get("storages", [])]
            fields = {k: v for k, v in r.items() if k not in ("ops", "storages")}
            regions.append(RegionRecord(ops=ops, storages=storages, **fields))
        root = [StorageRecord(**s) for s in data.get("root", [])]
        rest = {k: v for k, v in data.items() if k not in ("regions", "root")}
        return cls(regions=regions, root=root, **rest)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Profile:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())
