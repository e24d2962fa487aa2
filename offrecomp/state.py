"""Per-pass bookkeeping: region calls, saved storages, and the handles autograd holds.

A *pass* is one forward and its backward (one micro-batch). Everything here lives for
one pass and is dropped when autograd releases the last handle of it.

NOTE [Identity of a saved tensor]
A saved tensor is known across steps by (region qualified name, call index of that
region in the pass, storage index within the call). Storage index: the region's inputs
first, one index per distinct storage (the tensors its argument objects hold, in the
order their capture walks them: NOTE [Inputs held by arguments] in calls.py; then its
tensor arguments, in argument flatten order), then every other storage in the order of
its first save. Several saved tensors that are views of
one allocation share one storage index and one placement, and their bytes count once.
Saves outside every region belong to the root call (name ``""``, call index 0).
"""

from __future__ import annotations

import contextlib
import enum
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from offrecomp.backward_entry import keeping_graph
from offrecomp.handles import Lease
from offrecomp.trace.ops import describable
from scheduler.plan import ROOT, Placement

if TYPE_CHECKING:
    from collections.abc import Sequence

    from offrecomp.arg_state import ArgState
    from offrecomp.arguments import CapturedInputs
    from offrecomp.buffers import BufferState
    from offrecomp.handles import SavedHandle
    from offrecomp.params import ParamState
    from offrecomp.regions import (
        AutocastState,
        Region,
        RngState,
    )
    from offrecomp.signatures import Part
    from offrecomp.trace import FirstCallWatch, OpRecorder, RegionStructure, SaveInfo
    from offrecomp.transfer import Group
    from scheduler.profile import RegionRecord

__all__ = [
    "PassState",
    "Stage",
    "RegionCall",
    "StorageRec",
]


#: ``StorageRec.watch`` of a kept storage whose first save's handle is not made yet.
PENDING_WATCH: Any = object()


class StorageRec(weakref.ref):  # type: ignore[type-arg]
    """One saved allocation of one region call (or of the root).

    It is a weak reference to the ``UntypedStorage`` (alive iff the allocation is):
    ``rec()`` is the storage or None, and its death ends the storage's resident bytes
    (NOTE [Resident bytes]). One object per storage on the save path: the hot fields are
    slots, the rest class defaults that an instance overrides when it needs to.
    """

    __slots__ = ("__dict__", "call", "group", "index", "nbytes", "placement", "ptr", "resident", "slot")
    placement: Placement  # None for a "plain" record (never placed), kept out of ``storages``
    call: RegionCall
    index: int
    nbytes: int
    ptr: int
    resident: bool
    group: Group | None  # OFFLOAD: the group it travels in, at ``slot``
    slot: int

    # defaults, overridden per instance where they apply
    aliased = False  # NOTE [Untracked aliases]: never offloaded
    by_argument = False  # a region input an argument object holds: only kept (NOTE [Inputs held by arguments])
    device: torch.device | None = None
    kind = "activation"  # "activation", "input" (a region input) or "plain" (never placed)
    released = False
    save_mark: Any = None  # clock mark of the first save (root storages)
    in_forward = False  # a root storage first saved inside a root forward (NOTE [Saves outside the forward])
    sid: int | None = None  # storage id in the op recording (measuring pass only)
    tensor: torch.Tensor | None = None  # held strongly: a region input, or a fallback to KEEP
    watch: Any = None
    """KEEP in a call that may drop: ``PENDING_WATCH`` until its first save's handle is
    made, then a weak reference to the tensor that handle holds, which shares the saved
    tensor's version counter (NOTE [Served storages written since] in regenerate.py)."""
    version = 0  # the version at its first save, with ``watch``
    death: weakref.ref[Any] | None = None
    """A weak reference to its storage with ``_storage_died`` for a callback, where the
    record has none and became resident (``resident_until_death``)."""
    shared = False
    """A KEEP record whose storage another record of the pass counts resident already (a
    region input: NOTE [Inputs counted once]; a storage an earlier call kept: NOTE
    [Activations counted once], in shared.py): its bytes are not counted again."""
    same_as: StorageRec | None = None
    """The record of an earlier call (or the root) of the same storage: a region input's
    (NOTE [Inputs counted once]); a shared record's, or in a measuring pass any later
    record's, the first record of it (NOTE [Activations counted once])."""
    sharers = 0  # records sharing its count: inputs of unreleased calls, kept activations
    arg_pos: Any = None
    """Where its call, kept whole and run with the hooks, took the storage among its tensor
    arguments (NOTE [Whole calls counted once] in shared.py); None: not an argument's."""
    returned = False
    """In a measuring pass, its call returned a tensor on the storage (``StorageRecord.
    returned``: NOTE [Whole calls counted once] in shared.py)."""
    argument = False
    """In a measuring pass, one of its call's tensor arguments is on the storage
    (``StorageRecord.argument``)."""
    held = False
    """Found alive when its pass's backward ended (NOTE [Held past backward] in
    scheduler/timeline.py): the program holds it; its profile record is ``held``."""
    saved_in_call = False
    """A region input its own call's forward saved too: a saved variable holds it past the
    call's release, so its bytes count until its storage dies (NOTE [Inputs counted once])."""

    def __new__(
        cls, storage: Any, call: RegionCall, index: int, nbytes: int, ptr: int, placement: Placement | None
    ) -> StorageRec:
        self = weakref.ref.__new__(cls, storage, _storage_died)
        self.call = call
        self.index = index
        self.nbytes = nbytes
        self.ptr = ptr
        self.placement = placement  # type: ignore[assignment]
        self.resident = False  # counted in the pass's resident bytes (NOTE [Resident bytes])
        self.group = None
        self.slot = -1
        return self

    # Everything is set in __new__ (one Python call per record on the save path);
    # weakref.ref's own __init__ would reject the extra arguments.
    __init__ = object.__init__  # type: ignore[assignment]

    def resident_until_death(self) -> None:
        """It became resident: its storage's death ends its bytes (NOTE [Resident
        bytes]), also for a record the offload fast path made without that callback."""
        storage = self()
        if self.__callback__ is None and storage is not None:
            self.death = weakref.ref(storage, lambda _, rec=self: _storage_died(rec))

    def __repr__(self) -> str:
        name = self.placement.name if self.placement is not None else "PLAIN"
        return f"StorageRec({self.call.name!r}#{self.call.call_index}[{self.index}], {name}, {self.nbytes} B)"


# NOTE [Resident bytes]
# A pass counts the device bytes of the storages it keeps: a KEEP storage from its first
# save until the allocation dies. The runtime holds a kept activation only through its
# saved-tensor handles (a detached alias, NOTE [Saved tensor handles]) and the storage
# only weakly, so the storage dies when autograd and the program drop it, as in a plain
# run; the weak reference's callback takes its bytes off then. No finaliser runs per
# handle. An offloaded storage is not resident, so the offload fast path makes its
# record without the callback (NOTE [Offload fast path] in hooks.py): no call per
# storage's death. The one way such a record becomes resident, its group refused at
# issue (NOTE [Offload groups]), gives it the callback then
# (``StorageRec.resident_until_death``).


def _storage_died(rec: StorageRec) -> None:
    if rec.resident:
        rec.resident = False
        p = rec.call.pass_state
        if p is not None:
            stats = p.stats
            stats.resident_bytes -= rec.nbytes  # a decrease sets no peak
            stats.resident_drops += 1


class _WeakReferable:
    __slots__ = ("__weakref__",)


#: ``RegionCall.lease_ref`` of a call that never had a lease: a dead weak reference, so
#: that the save path calls it without a None check.
NO_LEASE: weakref.ref[Any] = weakref.ref(_WeakReferable())


@dataclass(eq=False, slots=True)
class RegionCall(_WeakReferable):
    """One call of a region (or the root pseudo-call) within a pass. Slots: one is made
    per region call, and the save path reads its fields at every save."""

    name: str
    call_index: int
    ordinal: int
    region: Region | None = None
    forward_fn: Any = None
    inputs: CapturedInputs | None = None
    rng: RngState | None = None
    autocast: AutocastState | None = None
    under_mode: bool = False
    """Its forward ran under one of the runtime's dispatch modes (a watch or a recorder): its plain replay runs under a passive one (NOTE [Replay], step 7)."""
    passive: Any = None  # the PassiveMode its forward runs under, while it runs
    torch_function: Any = None
    """The torch-function state at entry, None for the usual one (NOTE [Torch function state] in _torch_compat.py)."""
    buffers: BufferState | None = None
    snapshot_bytes: int = 0
    """Device bytes of the buffer copies its replay checkpoint holds past its forward,
    resident until the call is released (NOTE [Replay and module state])."""
    training: tuple[bool, ...] | None = None
    """The ``training`` flag of each of the region's modules at entry."""
    params: ParamState | None = None
    """The tensor in each of the region's parameter slots at entry (NOTE [Replay and
    parameters])."""
    arg_state: ArgState | None = None
    """Bindings of the object arguments at entry, kept when the forward changed them
    (NOTE [Stateful arguments])."""
    placements: Sequence[Placement] | None = None  # planned placement per storage index
    kept_whole: bool = False  # the plan keeps every storage of ``placements``
    fixed: Placement | None = None
    """The placement of every new storage of this call when no plan or rule can vary it
    (forced keep or offload): the pack hook's fast path skips the decision."""
    drops: bool = False
    """Every new activation storage is dropped (``Placements.drops``): no decision per save."""
    native: bool = False
    """Saves natively, the runtime's hooks off (NOTE [Native keep])."""
    books: Any = None
    """A native call's ``CallBooks``: what the same call saved with the hooks on (NOTE
    [Native keep] in native.py)."""
    arg_ptrs: dict[int, Any] | None = None
    """Kept whole and run with the hooks: the data pointer of each tensor argument's
    storage, to its position (NOTE [Whole calls counted once] in shared.py)."""
    whole_shared: int = 0
    """Kept whole and native: the bytes of the arguments it saves that another record
    counts already (NOTE [Whole calls counted once] in shared.py)."""
    table: list[Placement] | None = None
    """NOTE [Placement table]: the planned placement of each activation storage, the
    rules applied, valid for a storage of the size in ``table_sizes``."""
    table_sizes: list[int] | None = None
    structure: RegionStructure | None = None
    op_times: RegionRecord | None = None  # the plan's profile's record of this call: calibrated op times
    storages: list[StorageRec] = field(default_factory=list)
    by_ptr: dict[int, StorageRec] = field(default_factory=dict)  # data_ptr -> storage (checked by identity)
    pack_count: int = 0
    dropped: dict[int, weakref.ref[SavedHandle]] = field(default_factory=dict)
    replayed: dict[int, torch.Tensor] = field(default_factory=dict)
    mismatch: bool = False  # structure differs from the planned one
    borrowed_sizes: list[int] | None = None  # NOTE [Borrowed plans]: the donor's storage sizes
    buffer_ptrs: dict[int, int] | None = None  # NOTE [Buffer saves]: region's buffer storages -> slots
    buffer_epoch: int = -1  # buffer assignments counted when buffer_ptrs was read
    collective: bool = False  # runs collectives: auto never replays it (NOTE [Collective regions])
    collectives_at_entry: int = -1  # collective_sequence() at entry, in a distributed run
    writes_state: bool = False  # its region writes its inputs or parameters: never replayed (NOTE [State written by its region])
    record: bool = False  # recorded outside a measuring pass (NOTE [Calls the profile lacks])
    watch: FirstCallWatch | None = None  # the region's first call (see FirstCallWatch)
    kept_from_write: bool = False
    """Its watch saw it write a storage it did not see made, and it kept what it saved from
    there (``writes_state`` had not been set before: NOTE [Storages no op made])."""
    external_reads: list[tuple[torch.Tensor, int, torch.Tensor | None]] | None = None
    """Tensors from outside the call its forward reads, with their versions when it did and copies of the small ones (NOTE [State read from outside] in call_state.py)."""
    made_state: tuple[weakref.ref[torch.Tensor], ...] = ()
    """The watched call: the tensors it made and left alive, which its replay leaves as it
    found them (NOTE [State the first call made] in call_state.py)."""
    rewritten_state: str | None = None
    """What of those its replay wrote and could not put back (too large to copy)."""
    external: list[tuple[Any, Any]] | None = None
    """Storages from outside the call its forward wrote, with their bytes before (None: too large to copy): a replay runs on those (NOTE [State written by its region])."""
    attr_versions: list[tuple[torch.Tensor, int, Any, str]] | None = None
    """The tensors in its modules' plain attributes at entry, their versions, modules and
    names; and those its region's watched call made and left alive, their versions (module
    None) (NOTE [Attributes written after the first call])."""
    attr_writes: dict[int, str] | None = None
    """Those its forward wrote in place (data pointer -> description): its replay must not
    read them (NOTE [Attributes written after the first call])."""
    default_dtype: torch.dtype | None = None
    """``torch.get_default_dtype()`` at entry: a replay's factory ops make that dtype."""
    attrs: Any = None
    """Its modules' attribute tables at entry; from its exit, only the attributes its
    forward changed, with their entry and exit values (NOTE [Module attributes] in changes.py)."""
    entry_tables: Any = None
    """From its exit, its modules' attribute tables at entry, as its replay puts them
    back (NOTE [Attributes at entry] in attr_tables.py)."""
    entry_contents: Any = None
    """Its modules' container attributes and copies of their contents at entry."""
    filled_contents: bool = False
    """Recorded, its forward changed the contents of such a container (a cache filled on
    first use): ``RegionStructure.self_changing``."""
    generators: list[tuple[torch.Generator, torch.Tensor]] | None = None
    """The region's own generators and their states at entry (NOTE [Private generators])."""
    recorder: OpRecorder | None = None
    recorded_ops: OpRecorder | None = None
    saves: list[SaveInfo] = field(default_factory=list)
    start_mark: Any = None
    end_mark: Any = None
    capture_seconds: float = 0.0
    """Host seconds its entry spent keeping what a replay needs (0: none kept); inside its span, from ``start_mark``."""
    hooks_from: int = -1
    hooks_to: int = -1
    """The ids of the hooks its forward registered: ``[hooks_from, hooks_to)`` (NOTE
    [Hooks a replay registers] in changes.py)."""
    lacks_in: Any = None
    """The donor entry of its borrowed pass, whose profile lacks it (NOTE [Borrowed
    plans] in planning/entries.py)."""
    tree: Any = None
    """Its region's ``tree`` at entry; None where it keeps no checkpoint (NOTE [Children
    at entry] in replay_state.py)."""
    forward_hooks: Any = None
    """The non-empty forward hook tables of its submodules and torch's global ones at
    entry, with their items; None where it keeps no checkpoint (NOTE [Hooks a replay
    registers] in changes.py)."""
    replay_seconds: float = 0.0
    replays: int = 0
    served_ops: int = 0
    rerun_ops: int = 0
    replay_resident: int = 0
    replay_pending: dict[int, int] | None = None  # id(rec) -> saves its replay holds (NOTE [Replays booked per storage])
    pass_state: PassState | None = None
    lease_ref: weakref.ref[Lease] = NO_LEASE  # NOTE [Call leases]: held by the handles only; dead while none lives
    group: Group | None = None
    """The open offload group collecting this call's OFFLOAD storages (for the root: the run of root saves since the last region call began), issued at the call's exit."""
    groups: list[Group] = field(default_factory=list)
    """Every offload group of this call, open or issued, until the call is released."""
    exited: bool = False  # the region's forward returned
    released: bool = False  # checkpoint dropped (nothing left to replay)
    # input index -> (storage, (size, stride, offset, dtype)) for inputs sent to host memory
    offloaded_inputs: dict[int, tuple[StorageRec, tuple[Any, ...]]] = field(default_factory=dict)

    @property
    def is_root(self) -> bool:
        return self.name == ROOT

    def forget_placements(self) -> None:
        """Its later storages go to the rules (a rule that now varies them: kept)."""
        self.fixed = self.table = None
        self.drops = False

    def lease(self, release: Any) -> Lease:
        """The call's live lease, a new one if none is alive (NOTE [Call leases])."""
        lease = self.lease_ref()
        if lease is None:
            lease = Lease(self, release)
            self.lease_ref = weakref.ref(lease)
        return lease

    def layout(self) -> tuple[Any, ...]:
        """Which of the call's tensor inputs share a storage (and which places among its
        arguments one tensor fills), and the strides of its inputs, parameters and buffers
        at entry: with the signature's sizes and dtypes they fix the call's storage indices
        and the geometry of every output a replay serves (NOTE [Stale recordings] in
        regenerate.py). Storage offsets are no part of it."""
        out: list[Any] = []
        if self.inputs is not None:
            # which inputs share a storage (it fixes the call's storage indices), then
            # their strides; one sent to host memory answers with its record's pointer
            # and the geometry that went with it
            first: dict[int, int] = {}
            strides: list[Any] = []
            for i, t in enumerate(self.inputs.tensors):
                if t is None:
                    sent = self.offloaded_inputs.get(i)
                    if sent is not None:
                        out.append(first.setdefault(sent[0].ptr, i))
                    strides.append(sent[1][1] if sent is not None else None)
                elif describable(t):  # not a wrapper subclass (no data), nested, a ZeroTensor
                    out.append(first.setdefault(t.untyped_storage().data_ptr(), i))
                    strides.append(t.stride())
                else:
                    strides.append(None)
            out.extend(strides)
            if self.inputs.repeated:  # which places one tensor fills (NOTE [Aliased arguments] in arguments.py)
                out.append(self.inputs.places())
        if self.params is not None:
            out.extend(
                t.stride() if t is not None and t.layout is torch.strided else None for t in self.params.objects
            )
        if self.buffers is not None:  # a model moved to channels_last restrides its buffers
            out.extend(self.buffers.strides())
        return tuple(out)

    @property
    def leased(self) -> bool:
        """Does a dropped or offloaded save of this call still live?"""
        return self.lease_ref() is not None

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.call_index)


@dataclass(slots=True)
class PassStats:
    """Counters of one pass (summed into the step record)."""

    saved_tensors: int = 0
    hooked_saves: int = 0
    """Of ``saved_tensors``, those that went through the hooks (not a native call's:
    NOTE [Native keep])."""
    storages: int = 0
    kept_bytes: int = 0
    offloaded_bytes: int = 0
    recomputed_bytes: int = 0
    input_bytes: int = 0
    resident_bytes: int = 0
    peak_resident_bytes: int = 0
    resident_drops: int = 0  # records whose resident bytes ended: a kept storage that died
    replays: int = 0
    served_ops: int = 0
    rerun_ops: int = 0
    pack_seconds: float = 0.0
    """Host seconds in the pack calls timed (one in HOOK_SAMPLE; NOTE [Hook timing])."""
    pack_timed: int = 0  # pack calls timed
    unpack_seconds: float = 0.0
    """Host seconds in the unpack calls of kept saves timed (sampled the same way)."""
    unpack_timed: int = 0  # unpack calls timed
    capture_seconds: float = 0.0
    """Host seconds region calls' entries spent keeping what a replay needs."""
    captures: int = 0  # region calls that kept it (each timed)
    fallbacks: dict[str, int] = field(default_factory=dict)

    def keep(self, rec: StorageRec) -> None:
        """``rec`` is kept: its bytes count as kept and resident until its storage dies
        (NOTE [Resident bytes]). The pack hook inlines this for a new kept storage."""
        rec.resident = True
        n = rec.nbytes
        self.kept_bytes += n
        resident = self.resident_bytes = self.resident_bytes + n  # add_resident, inlined: the save path
        if resident > self.peak_resident_bytes:
            self.peak_resident_bytes = resident

    def add_resident(self, n: int) -> None:
        self.resident_bytes += n
        if self.resident_bytes > self.peak_resident_bytes:
            self.peak_resident_bytes = self.resident_bytes

    def sample(self, extra: int) -> None:
        """Peak check with ``extra`` bytes held elsewhere (the offload engine's, a replay's
        transients: NOTE [Replay transients] in scheduler/working_set.py)."""
        if self.resident_bytes + extra > self.peak_resident_bytes:
            self.peak_resident_bytes = self.resident_bytes + extra

    def fallback(self, what: str) -> None:
        self.fallbacks[what] = self.fallbacks.get(what, 0) + 1

    def add(self, other: PassStats) -> None:
        """``other``'s counters into these, as a step sums its passes': the peak is the
        larger one, the rest add up."""
        for f in fields(self):
            name = f.name
            if name == "peak_resident_bytes":
                self.peak_resident_bytes = max(self.peak_resident_bytes, other.peak_resident_bytes)
            elif name == "fallbacks":
                for k, v in other.fallbacks.items():
                    self.fallbacks[k] = self.fallbacks.get(k, 0) + v
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))


class Stage(enum.Enum):
    """Where a pass is in its life (NOTE [Pass stages])."""

    FORWARD = "forward"
    BACKWARD = "backward"
    AWAITING = "awaiting"
    DONE = "done"


# NOTE [Pass stages]
# A pass begins in FORWARD and moves to BACKWARD at the first unpack of one of its saves
# (or, for a pass that saved nothing, when a backward reaches its output: NOTE
# [Backward without saves]). Its backward's end makes it DONE, unless that backward
# saved tensors for a later one (create_graph): then it is AWAITING, its saves outside a
# forward still join it, and the next backward that reads its saves moves it back to
# BACKWARD (NOTE [Double backward]). A forward error or a fault at exit marks the pass
# ``aborted`` whatever its stage; the next forward activity begins a new pass.
#
#     FORWARD --first unpack--> BACKWARD --backward ends--> DONE
#                                  ^   \
#              next backward reads |    \ backward ends, its graph differentiable
#                                  |     v
#                                  AWAITING --next forward or optimizer step--> DONE


@dataclass(eq=False, slots=True)
class PassState(_WeakReferable):
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
    plan: Any = None
    """The plan it runs (``plan_id``'s), whatever its entry holds by the time its step's
    record is made: a pass after it may have re-solved it."""
    releases: tuple[int, ...] = ()
    """Per unit, where its plan frees its offload group (NOTE [Planned release] in groups.py)."""
    new_signature: bool = False
    """The first pass of its signature the runtime has seen (NOTE [Module attributes])."""
    family: str = ""
    """The signature without its sizes: passes of one family differ only in tensor sizes."""
    dims: tuple[int, ...] = ()
    """Every input tensor's sizes, in signature order (NOTE [Borrowed plans])."""
    plan_signature: str = ""
    """The signature whose plan this pass runs: its own, or a borrowed one's."""
    parts: list[Part] = field(default_factory=list)
    """Its root forwards' signatures, families and sizes so far (NOTE [Pass signatures])."""
    expected: tuple[Part, ...] = ()
    """The root forwards ``signature`` names: chosen at the first, then what ran."""
    departed: bool = False
    """Its root forwards departed from the choice (NOTE [Pass signatures])."""
    named_by: str = ""
    """The region whose call named its first part, when no root forward did: its later
    calls outside every root forward are parts too (NOTE [Pass signatures])."""
    wants_entry: bool = False
    """A storage outgrew the plan it borrowed: its own signature gets an entry (and
    measures) when the pass ends (NOTE [Borrowed plans])."""
    made_entry: bool = False
    """Its planning made the plan entry of ``signature`` (dropped if that was a choice
    the pass departed from: NOTE [Pass signatures])."""
    resigned_from: str = ""
    """The phase it began in when its forwards departed from the combination it was
    planned for (NOTE [Pass signatures]); a planned one borrows its own plan after."""
    calls: list[RegionCall] = field(default_factory=list)
    call_counts: dict[str, int] = field(default_factory=dict)
    root: RegionCall | None = None
    first_records: dict[int, StorageRec] = field(default_factory=dict)
    """Data pointer -> the first kept record of that storage in the pass: the record a
    later call's kept save of the same storage shares (NOTE [Activations counted once]
    in shared.py)."""
    first_named: dict[int, StorageRec] = field(default_factory=dict)
    """In a measuring pass, data pointer -> the first record of that storage of any
    placement, which the later ones name for the profile."""
    whole_counted: dict[int, weakref.ref[Any]] = field(default_factory=dict)
    """Data pointer -> the storage, for the storages calls kept whole count: those of
    their tensor arguments they save and of the tensors they return (NOTE [Whole calls
    counted once] in shared.py)."""
    stats: PassStats = field(default_factory=PassStats)
    stage: Stage = Stage.FORWARD
    graphs: list[Any] = field(default_factory=list)
    """Per root forward that returned a graph, weak references to one object per graph
    it returned, held by the graphs' output nodes: all dead, no backward can come
    through them (NOTE [Dropped graphs])."""
    roots_running: int = 0
    """Its root forwards that have not returned (any thread)."""
    create_graph: bool = False
    """Its running backward saves tensors (``create_graph=True``) outside any region's
    forward: a later backward may differentiate that graph (NOTE [Double backward])."""
    awaits_other: bool = False
    """AWAITING because another forward's graph waits for a backward (NOTE [Several
    backwards]), not for a double backward."""
    backward_task: int = -1
    """The graph task of its latest backward."""
    later_backward_task: int = -1
    """The graph task of the latest backward that fetched one of its groups once it was
    over (NOTE [Reloads at a backward's end] in groups.py)."""
    double_backward: bool = False
    """A backward of it made a graph that a later one differentiated, or could have."""
    start_time: float = 0.0
    end_time: float = 0.0
    start_mark: Any = None
    backward_start_mark: Any = None
    backward_ends: list[Any] = field(default_factory=list)
    """The end mark of each of its backwards, in order (NOTE [Several backwards])."""
    other_backwards: list[tuple[Any, Any]] = field(default_factory=list)
    """(start mark, end mark) of each backward of another pass that ran while this one
    was the running pass (NOTE [Backwards of other passes] in planning/profiling.py)."""
    replay_marks: list[tuple[int, Any, Any]] = field(default_factory=list)
    native_held: list[list[int]] = field(default_factory=list)
    """[call ordinal, bytes] of its native calls' resident books, in forward order."""
    native_frees: list[tuple[int, int, list[int]]] = field(default_factory=list)
    """Heap of (ordinal at whose entry they die, order, ``native_held`` entry): NOTE
    [Graphs the forward drops] in native.py."""
    dispatch_replays: list[tuple[int, Any, Any, float, list[int]]] = field(default_factory=list)
    """Replays under the dispatch mode: (call ordinal, start, end mark, predicted seconds
    of the ops run, program): NOTE [Serving overhead], [Served replay times]."""
    dispatch_probes: list[tuple[int, Any, Any, list[int]]] = field(default_factory=list)
    """A calibration pass's replays under the dispatch mode: (call ordinal, start mark,
    end mark, its program), to learn the mode's cost per op (NOTE [Dispatch probe])."""
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

    @property
    def backward_end_mark(self) -> Any:
        """The end mark of its latest backward (None before any ended)."""
        ends = self.backward_ends
        return ends[-1] if ends else None

    def backward_reached(self, ordinal: int) -> None:
        """Its backward regenerates or reloads call ``ordinal``'s saves: the native calls
        after it were differentiated, so their booked bytes are no longer resident, as
        their storages would have died (NOTE [Native keep] in native.py); not in a
        backward that keeps its graph (``retain_graph``, a gradient penalty's), whose saved
        tensors live on."""
        held = self.native_held
        if not held or self.create_graph or keeping_graph():
            return
        while held and held[-1][0] > ordinal:
            self.stats.resident_bytes -= held.pop()[1]  # a decrease sets no peak

    def all_calls(self) -> list[RegionCall]:
        """The pass's region calls, and its root call last if it has one."""
        return self.calls if self.root is None else [*self.calls, self.root]

    def mark_held(self) -> None:
        """The pass's backward ended: mark ``held`` each placed storage still alive that
        the runtime no longer holds, a kept one the books still count or a dropped one
        (NOTE [Held past backward] in scheduler/timeline.py). Once per pass, off the
        save path."""
        for call in self.all_calls():
            for rec in call.storages:
                if (rec.resident or rec.placement is Placement.RECOMPUTE) and rec() is not None:
                    rec.held = True

    def retire(self, *, orphaned: bool = False) -> bool:
        """Cut the pass's edges to its calls and the calls' edges to their storages, so
        that refcounting frees them (NOTE [Pass retirement]); False, changing nothing,
        when a saved tensor may still reload or replay one of its calls. ``orphaned``:
        the runtime's lifecycle or planner is gone, so no save through its hooks lives
        (each holds the hooks, which hold both) and the pass retires whatever its stage."""
        calls = self.all_calls()
        if (self.stage is not Stage.DONE and not orphaned) or any(c.leased for c in calls):
            return False
        for c in calls:
            c.storages = []
            c.by_ptr = {}
            c.dropped = {}
            c.replayed = {}
            c.saves = []
            c.offloaded_inputs = {}
        self.calls = []
        self.root = None
        self.first_records = {}
        self.first_named = {}
        self.whole_counted = {}
        return True


class PassHolder:
    """What reads passes' calls after their step (the planner): it holds them from
    retiring while it lives, and retires them when it goes (NOTE [Pass retirement])."""

    def held(self) -> Iterator[PassState]:
        raise NotImplementedError

    def holds(self, p: PassState) -> bool:
        return any(q is p for q in self.held())

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # never raise from a finaliser
            for p in list(self.held()):
                p.retire(orphaned=True)


# NOTE [Pass retirement]
# A pass's records are reference cycles: a storage record names its call and the call
# lists its records; a call names its pass and the pass lists its calls. Refcounting never
# frees a cycle, so a finished pass waits for the collector; by then it has usually
# survived a younger collection into the oldest generation, whose collections walk the
# whole heap (torch and its friends: about 0.1 s). A few hundred objects per step pile up
# there and bring those collections on sooner. Once nothing reads a pass's calls any
# more, ``retire`` cuts the forward edges (pass -> calls, call -> records) and
# refcounting frees the lot at once. Nothing reads them when the planner holds the pass
# no longer (it has learnt from it and built any profile from it, and it is not the
# forced mode's last pass, which ``explain()`` summarises), it is not a provisional
# step's pass (a later step may take it over), its backward is done, and none of its
# calls is leased (no offloaded or dropped save alive: a retained graph can still reload
# or replay them; NOTE [Call leases]). Kept saves need no lease: their handles name the
# record and the record its call, back edges, which stay. The lifecycle sweeps passes at
# each step's end, one step behind the planner; a pass that cannot retire then is left to
# the collector, or retired when the lifecycle goes (``orphaned``: no save through the
# runtime's hooks can outlive the lifecycle and the planner, which the hooks hold), as are
# the passes the planner holds when it goes.
