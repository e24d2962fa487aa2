"""Per-pass bookkeeping: region calls, saved storages, and the handles autograd holds.

A *pass* is one forward and its backward (one micro-batch). Everything here lives for
one pass and is dropped when autograd releases the last handle of it.

NOTE [Identity of a saved tensor]
A saved tensor is known across steps by (region qualified name, call index of that
region in the pass, storage index within the call). Storage index: the region's tensor
inputs first (in argument flatten order, one index per distinct storage), then every
other storage in the order of its first save. Several saved tensors that are views of
one allocation share one storage index and one placement, and their bytes count once.
Saves outside every region belong to the root call (name ``""``, call index 0).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from scheduler.plan import ROOT, Placement

if TYPE_CHECKING:
    from offrecomp.offload import Ticket
    from offrecomp.regions import (
        ArgState,
        AutocastState,
        BufferState,
        CapturedInputs,
        ParamState,
        Region,
        RngState,
    )
    from offrecomp.trace import FirstCallWatch, OpRecorder, RegionStructure, SaveInfo

__all__ = ["KeptHandle", "PassState", "RegionCall", "SavedHandle", "StorageRec"]


class StorageRec:
    """One saved allocation of one region call (or of the root)."""

    __slots__ = (
        "__weakref__",
        "aliased",
        "call",
        "device",
        "fetch_buf",
        "fetch_uses",
        "handles",
        "index",
        "kind",
        "nbytes",
        "on_release",
        "placement",
        "ptr",
        "released",
        "save_mark",
        "sid",
        "storage_ref",
        "tensor",
        "ticket",
    )

    def __init__(
        self,
        *,
        call: RegionCall,
        index: int,
        nbytes: int,
        ptr: int,
        device: torch.device,
        kind: str,
        placement: Placement,
    ) -> None:
        self.call = call
        self.index = index
        self.nbytes = nbytes
        self.ptr = ptr
        self.storage_ref: Any = None  # weakref to the UntypedStorage (alive iff the allocation is)
        self.sid: int | None = None  # storage id in the op recording (measuring pass only)
        self.save_mark: Any = None  # clock mark of the first save (root storages, measuring pass)
        self.device = device
        self.kind = kind
        self.placement = placement
        self.tensor: torch.Tensor | None = None  # held alias (KEEP; or OFFLOAD until the copy is issued)
        self.ticket: Ticket | None = None
        self.fetch_buf: torch.Tensor | None = None  # reloaded flat buffer (OFFLOAD, in backward)
        self.fetch_uses = 0
        self.handles = 0
        self.released = False
        self.on_release: Any = None  # callback(rec) when the last handle dies
        self.aliased = False  # NOTE [Untracked aliases]: never offloaded

    def __repr__(self) -> str:
        return (
            f"StorageRec({self.call.name!r}#{self.call.call_index}[{self.index}], "
            f"{self.placement.name}, {self.nbytes} B)"
        )


class _Handle:
    """What autograd holds for one saved tensor (the pack hook's return value)."""

    __slots__ = ("pack_index", "rec", "version")

    rec: StorageRec

    def __del__(self) -> None:
        rec = self.rec
        rec.handles -= 1
        rec.call.live_handles -= 1
        try:  # noqa: SIM105 - no contextlib in this hot finaliser
            rec.on_release(rec)
        except Exception:  # never raise from a finaliser
            pass


class KeptHandle(_Handle):
    """A saved tensor placed KEEP (the lean common case)."""

    __slots__ = ("tensor",)

    def __init__(self, rec: StorageRec, pack_index: int, t: torch.Tensor) -> None:
        self.rec = rec
        self.pack_index = pack_index
        self.tensor = t
        self.version = t._version
        rec.handles += 1
        rec.call.live_handles += 1


class SavedHandle(_Handle):
    """A saved tensor placed OFFLOAD or RECOMPUTE: its geometry, not its data."""

    __slots__ = ("__weakref__", "dtype", "offset", "size", "stride", "weak")

    def __init__(self, rec: StorageRec, pack_index: int, t: torch.Tensor) -> None:
        self.rec = rec
        self.pack_index = pack_index
        self.version = t._version
        self.weak: weakref.ref[torch.Tensor] = weakref.ref(t)  # the original may outlive us
        self.size = tuple(t.shape)
        self.stride = tuple(t.stride())
        self.offset = t.storage_offset()
        self.dtype = t.dtype
        rec.handles += 1
        rec.call.live_handles += 1

    def rebuild(self, flat: torch.Tensor) -> torch.Tensor:
        """This saved view, on the storage behind ``flat`` (a flat uint8 tensor)."""
        t = torch.empty(0, dtype=self.dtype, device=flat.device)
        t.set_(flat.untyped_storage(), self.offset, self.size, self.stride)
        return t


@dataclass(eq=False)
class RegionCall:
    """One call of a region (or the root pseudo-call) within a pass."""

    name: str
    call_index: int
    ordinal: int
    region: Region | None = None
    forward_fn: Any = None
    inputs: CapturedInputs | None = None
    rng: RngState | None = None
    autocast: AutocastState | None = None
    buffers: BufferState | None = None
    training: tuple[bool, ...] | None = None
    """The ``training`` flag of each of the region's modules at entry."""
    params: ParamState | None = None
    """The tensor in each of the region's parameter slots at entry (NOTE [Replay and
    parameters])."""
    arg_state: ArgState | None = None
    """Bindings of the object arguments at entry, kept when the forward changed them
    (NOTE [Stateful arguments])."""
    placements: list[Placement] | None = None  # planned placement per storage index
    structure: RegionStructure | None = None
    op_seconds: list[float] | None = None  # calibrated op times of this call, from the plan's profile
    storages: list[StorageRec] = field(default_factory=list)
    by_ptr: dict[int, StorageRec] = field(default_factory=dict)  # data_ptr -> storage (checked by identity)
    pack_count: int = 0
    dropped: dict[int, weakref.ref[SavedHandle]] = field(default_factory=dict)
    replayed: dict[int, torch.Tensor] = field(default_factory=dict)
    mismatch: bool = False  # structure differs from the planned one
    borrowed_sizes: list[int] | None = None  # NOTE [Borrowed plans]: the donor's storage sizes
    buffer_ptrs: frozenset[int] | None = None  # NOTE [Buffer saves]: storages of the region's buffers
    buffer_epoch: int = -1  # buffer assignments counted when buffer_ptrs was read
    collective: bool = False  # runs collectives: auto never replays it (NOTE [Collective regions])
    writes_state: bool = False  # its region writes its inputs or parameters: never replayed (NOTE [State written by its region])
    record: bool = False  # recorded outside a measuring pass (NOTE [Calls the profile lacks])
    watch: FirstCallWatch | None = None  # the region's first call (see FirstCallWatch)
    generators: list[tuple[torch.Generator, torch.Tensor]] | None = None
    """The region's own generators and their states at entry (NOTE [Private generators])."""
    recorder: OpRecorder | None = None
    recorded_ops: OpRecorder | None = None
    saves: list[SaveInfo] = field(default_factory=list)
    start_mark: Any = None
    end_mark: Any = None
    replay_seconds: float = 0.0
    replays: int = 0
    served_ops: int = 0
    rerun_ops: int = 0
    replay_resident: int = 0
    pass_state: PassState | None = None
    live_handles: int = 0  # saved-tensor handles of this call still held by autograd
    exited: bool = False  # the region's forward returned
    released: bool = False  # checkpoint dropped (nothing left to replay)
    # input index -> (storage, (size, stride, offset, dtype)) for inputs sent to host memory
    offloaded_inputs: dict[int, tuple[StorageRec, tuple[Any, ...]]] = field(default_factory=dict)

    @property
    def is_root(self) -> bool:
        return self.name == ROOT

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.call_index)


@dataclass
class PassStats:
    """Counters of one pass (summed into the step record)."""

    saved_tensors: int = 0
    storages: int = 0
    kept_bytes: int = 0
    offloaded_bytes: int = 0
    recomputed_bytes: int = 0
    input_bytes: int = 0
    resident_bytes: int = 0
    peak_resident_bytes: int = 0
    replays: int = 0
    served_ops: int = 0
    rerun_ops: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)

    def add_resident(self, n: int) -> None:
        self.resident_bytes += n
        if self.resident_bytes > self.peak_resident_bytes:
            self.peak_resident_bytes = self.resident_bytes

    def sample(self, extra: int) -> None:
        """Peak check with ``extra`` bytes held elsewhere (the offload engine)."""
        if self.resident_bytes + extra > self.peak_resident_bytes:
            self.peak_resident_bytes = self.resident_bytes + extra

    def fallback(self, what: str) -> None:
        self.fallbacks[what] = self.fallbacks.get(what, 0) + 1


@dataclass(eq=False)
class PassState:
    """One forward + backward."""

    index: int
    signature: str
    mode: str
    recording: bool = False
    planned: bool = False
    reprofile: bool = False
    """A planned or calibration pass that recorded calls its profile lacks: its end builds
    the signature's profile again (NOTE [Calls the profile lacks])."""
    phase: str = ""
    plan_id: str = ""
    family: str = ""
    """The signature without its sizes: passes of one family differ only in tensor sizes."""
    dims: tuple[int, ...] = ()
    """Every input tensor's sizes, in signature order (NOTE [Borrowed plans])."""
    plan_signature: str = ""
    """The signature whose plan this pass runs: its own, or a borrowed one's."""
    calls: list[RegionCall] = field(default_factory=list)
    call_counts: dict[str, int] = field(default_factory=dict)
    root: RegionCall | None = None
    stats: PassStats = field(default_factory=PassStats)
    backward_started: bool = False
    backward_done: bool = False
    create_graph: bool = False
    """Its running backward saves tensors (``create_graph=True``) outside any region's
    forward: a later backward may differentiate that graph (NOTE [Double backward])."""
    awaiting: bool = False
    """Its backward made a graph for a later one (a gradient penalty): the pass goes on
    until that backward ends, or the next forward begins (NOTE [Double backward])."""
    backward_task: int = -1
    """The graph task of its latest backward."""
    double_backward: bool = False
    """A backward of it made a graph that a later one differentiated, or could have."""
    start_time: float = 0.0
    end_time: float = 0.0
    start_mark: Any = None
    backward_start_mark: Any = None
    backward_end_mark: Any = None
    replay_marks: list[tuple[int, Any, Any]] = field(default_factory=list)
    dispatch_replays: list[tuple[Any, Any, int, float]] = field(default_factory=list)
    """Replays run under the dispatch mode: (start mark, end mark, ops it saw, predicted
    seconds of the ops it ran), to learn the mode's cost per op (NOTE [Serving overhead])."""
    plain_replays: list[tuple[int, Any, Any, int]] = field(default_factory=list)
    """Replays run plainly, with a known prefix end: (call ordinal, start mark, end mark,
    ops before the stop K), to fit op times (NOTE [Calibration])."""
    aborted: bool = False
    oom_seen: bool = False
    alloc_start: int = 0
    device_peak: int | None = None
    offload_stats: Any = None
    known_ptrs: frozenset[int] | None = None  # parameter/buffer storages (measuring pass)
    planner_seconds: float = 0.0
    """Host seconds the planner spent on this pass outside its timed span (solving before
    it, building the profile after it)."""
