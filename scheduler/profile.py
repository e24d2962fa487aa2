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
to one of them replays the region's forward from its captured inputs. Replay covers ops
``0 .. K-1`` with ``K = max(storage.last_save_op for dropped storages)`` (it stops right
after the last save it needs). Which of those ops actually execute:

* ``opaque`` region: every op in the prefix runs (torch.utils.checkpoint semantics).
* otherwise, when every op of the region has ``reads`` (not None), replay is
  demand-driven. The set R of ops that run is the closure of
  ``{producer_op of each dropped storage} | {k < K with ops[k].sink}`` under ``reads``:
  for an op in the worklist, if it is *served* (not a sink, ``skippable``, and every
  entry of its ``outputs`` is ``>= 0`` and placed KEEP or OFFLOAD: held, as the replay
  runs after the region's reload) it costs nothing and its reads
  are not followed; otherwise it runs, costs ``seconds``, and every op index in its ``reads``
  joins the worklist. Every ``view`` op before ``K`` runs too (it costs ``seconds``, its
  reads are not followed, and the closure never enters it). Other ops outside R cost
  nothing (replay hands out placeholders).
* otherwise (``reads`` unknown): an op in the prefix is served when it is not a sink,
  ``skippable`` and all outputs are ``>= 0`` and KEEP or OFFLOAD, and runs (costs ``seconds``) in
  every other case.

The runtime replays a region in one of two ways and picks the cheaper: under its
dispatch mode, which skips what it may (the rules above) but costs
``Profile.replay_op_seconds`` of extra time for each of the ``K`` ops it sees, or
plainly, running every op before ``K``. So ``replay_seconds(region, dropped) =
min(sum(ops[k].seconds for k < K), sum(ops[k].seconds for k in R) + K *
replay_op_seconds)``, which is the sum over R when ``replay_op_seconds`` is 0 (an opaque
region always replays plainly). Storages of kind
``input`` are the region inputs the runtime holds for replay (the checkpoint); they may
be KEEP or OFFLOAD, never RECOMPUTE (only KEEP where ``keep_only``: one an argument
object holds too). Storages of kind ``external`` (created outside the
region, smaller than the runtime's ``min_bytes``, or saved through an untracked alias)
are always KEEP. A storage of kind ``snapshot`` is the copies of the module buffers a
region call's checkpoint holds for its replay (a BatchNorm's statistics, an EMA its
forward updates): always KEEP, resident from the call's start until its backward ends,
and only where the plan does not keep the call whole (a call kept whole takes no
checkpoint); no op saves it (``saves`` 0). Root storages
(saved outside every region) may be KEEP or OFFLOAD only. A storage marked ``held`` (the
program holds it past backward's end) is KEEP only, resident until backward ends.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

__all__ = [
    "INPUT_LOOKBACK",
    "PROFILE_VERSION",
    "OpRecord",
    "Profile",
    "RegionRecord",
    "StorageKind",
    "StorageRecord",
    "growing_kind",
    "outgrown",
]

#: The format of a saved profile. 2 adds ``OpRecord.transient_bytes`` and
#: ``StorageRecord.held``, ``freed_op`` and ``outlives_call``; 3 ``StorageRecord.returned``
#: and ``argument``; a build reads its own version and every earlier one (a field an
#: earlier version lacks takes its default).
PROFILE_VERSION = 3

#: Region calls before a call whose records the runtime looks a kept region input of it
#: up in (with the root's), to count the input's allocation once (NOTE [Inputs counted
#: once] in offrecomp/shared.py); the simulator counts the same way.
INPUT_LOOKBACK = 8

StorageKind = Literal["activation", "input", "external", "snapshot"]


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
    reads: tuple[int, ...] | None = None
    """Indices of the earlier ops of this region whose results this op reads by value
    (None: dataflow unknown, replay reruns the whole prefix but served ops)."""
    sink: bool = False
    """Replay must run this op whenever it lies in the replayed prefix (it draws random
    numbers, writes in place, or hands a value to Python)."""
    view: bool = False
    """The op returns a view of an input (no compute, reads no values): replay runs it
    whenever it lies in the replayed prefix, and its ``reads`` are not followed."""
    transient_bytes: int = 0
    """Bytes of the storages the region's ops made that no op of the region saves, alive
    when this op has returned (its outputs made, its inputs not yet freed): what a replay
    holds beyond the region's saves while it runs this op (the simulator's NOTE [Replay
    transients]; 0: none measured)."""


@dataclass(kw_only=True)
class StorageRecord:
    """One saved device allocation."""

    nbytes: int
    """Size of the allocation in bytes (counted once however many views were saved)."""
    kind: StorageKind = "activation"
    """``activation``: produced inside the region; ``input``: a region input held for
    replay; ``external``: created outside the region, smaller than the runtime's
    ``min_bytes``, or only partly covered by an untracked alias whose siblings may be
    written later (always kept); ``snapshot``: copies of module buffers held for replay,
    counted only where the plan does not keep the call whole (always kept)."""
    producer_op: int = -1
    """Index of the op that allocated it, -1 when it came from outside the region."""
    first_save_op: int = 0
    """Number of the region's ops dispatched before its first save."""
    last_save_op: int = 0
    """Number of the region's ops dispatched before its last save (replay stops there)."""
    freed_op: int = -1
    """Number of the region's ops recorded when its forward, dropping it, freed the
    storage (the region's op count: alive at its end; NOTE [Forward transients] in
    scheduler.working_set); -1: unknown, taken as freed once its last save's op returned."""
    outlives_call: bool = False
    """Alive when its call's forward returned although the measuring pass dropped it and
    the call returned no tensor on it: something beyond the call holds it (autocast's
    cache of a weight's cast, until autocast exits), so dropping it frees nothing before
    the step's forward ends (NOTE [Forward transients])."""
    offset_seconds: float = 0.0
    """Time from the region's start to the first save: the storage is resident from then
    on (an offloaded one until its group's copy, issued at the region's exit, lands)."""
    saves: int = 1
    """How many saved tensors refer to this storage."""
    backward_offset_seconds: float | None = None
    """Time from the start of backward to the first use of this storage in backward,
    where measured (None: the simulator derives it from region backward times)."""
    shared_with: tuple[str, int, int] | None = None
    """The plan key of the record of an earlier region call (or of the root, ``(ROOT, 0,
    i)``) that is the same allocation: a region input's (the runtime's NOTE [Inputs
    counted once]), or a storage a call saves that an earlier call saved first (NOTE
    [Activations counted once]); where the runtime counts it once, so does the
    simulator."""
    keep_only: bool = False
    """A region input an argument object of the call holds too (a tensor inside a
    dataclass the blocks hand along: the runtime's NOTE [Inputs held by arguments]):
    only KEEP, as a copy to host memory would free nothing the object holds."""
    returned: bool = False
    """Its call returned a tensor on it (the tensor itself, or one of a tuple or list it
    returned): a unit kept whole that keeps it counts it for the units after it, as the
    runtime's books do (NOTE [Whole calls counted once] in offrecomp/shared.py).
    Version 3; False in earlier profiles."""
    argument: bool = False
    """A region input that is one of its call's tensor arguments (not one nested in a
    container): a unit kept whole that saves it counts it once, as the runtime's books
    do (NOTE [Whole calls counted once] in offrecomp/shared.py). Version 3; False in
    earlier profiles."""
    held: bool = False
    """The program holds the storage past backward's end (the training loop's ``out``
    and target that a loss saved, a block output the loop keeps in a list), as measured
    passes found it alive there: resident from its save until backward ends, whatever
    the plan, so only KEEP (dropping or offloading it would free nothing). False: it
    dies with its saved tensors, by its unit's backward end (NOTE [Held past backward]
    in scheduler.timeline)."""


def growing_kind(records: Sequence[StorageRecord]) -> StorageKind:
    """The kind of a region call's records that carries what a larger call saves (a
    region that varies: NOTE [Sizes of regions that vary] in offrecomp/planning/
    differences.py): its activations, or where it has none (each storage was under
    ``min_bytes``), the storages it always keeps."""
    return "activation" if any(r.kind == "activation" for r in records) else "external"


def outgrown(record: StorageRecord, nbytes: int, records: Sequence[StorageRecord]) -> bool:
    """Is a storage of ``nbytes`` at the place of ``record`` (one of the call's
    ``records``) in a call of a region that varies another than the one recorded there:
    larger than a storage the call keeps always (``record`` not of the kind
    ``growing_kind(records)`` names)? It takes the place of the call's last storage of
    that kind, and its bytes count with it (NOTE [Sizes of regions that vary] in
    offrecomp/planning/differences.py). The records are scanned only for a larger
    storage at an external one's place."""
    return record.kind == "external" and nbytes > record.nbytes and growing_kind(records) == "activation"


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
    replayable: bool = True
    """False when a replay must not run at all (the region issues collectives, as under
    tensor parallelism, and ranks plan independently): its storages are KEEP or OFFLOAD
    only."""
    host_seconds: float | None = None
    """Host time of the region's forward without offrecomp's own host costs (the hooks,
    the group offload), where measured. None: the host runs in step with the device (as
    on CPU), so the runtime's host costs add to ``forward_seconds``. See NOTE [Host time]
    in ``scheduler.timeline``."""
    backward_host_seconds: float | None = None
    """Host time of the region's backward without offrecomp's own host costs and replay,
    where measured; None: in step with the device, as ``host_seconds``."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.call_index)


def _umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@dataclass(kw_only=True)
class Profile:
    """Everything the planner knows about one step signature."""

    signature: str
    """Input shape signature the profile belongs to."""
    device: str = "cpu"
    """``cuda`` or ``cpu`` (or a what-if device name)."""
    forward_seconds: float = 0.0
    """Forward time of the step without offrecomp's own host costs (those are the
    ``*_host_seconds`` fields below, which the simulator adds back per unit)."""
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
    replay_op_seconds: float = 0.0
    """Extra step time per op that a replay under the runtime's dispatch mode sees (its
    host cost where the device waits on it), measured at run time; 0 = free. See the
    replay semantics above."""
    pack_host_seconds: float = 0.0
    """Host seconds offrecomp's pack hook adds per saved tensor in forward (0 = free).
    The simulator adds it to the host time of the unit that saves (NOTE [Host time] in
    ``scheduler.timeline``)."""
    unpack_host_seconds: float = 0.0
    """Host seconds the unpack hook adds per saved tensor in backward."""
    native_keep: bool = False
    """A region call whose every storage a plan keeps saves through autograd's own saved
    variables, without the hooks (the runtime's NOTE [Native keep]): the simulator
    charges the pack and unpack costs of a region's saves only under plans that offload
    or drop some of its storages (the root's saves always pay them)."""
    capture_host_seconds: float = 0.0
    """Host seconds a region call's entry spends keeping what a replay of it needs (its
    inputs, generator, autocast and module state): paid by each region call a plan does
    not keep whole, whether or not it replays (a call kept whole takes no checkpoint)."""
    offload_host_seconds: float = 0.0
    """Host seconds to issue one group's D2H copies at its region's exit (a group: the
    offloaded storages of one region call, or of one run of root saves)."""
    reload_host_seconds: float = 0.0
    """Host seconds to issue one group's reload in backward (and wait for it)."""
    replay_host_seconds: float = 0.0
    """Host seconds a replay costs on top of its ops (restoring RNG and autocast state,
    entering the replay): added once per region call that replays."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form facts (hardware name, versions, model description)."""
    version: int = PROFILE_VERSION

    # ------------------------------------------------------------------ derived

    @property
    def activation_bytes(self) -> int:
        """Bytes of every placeable storage (what keeping everything would hold: no
        snapshots, which only a replay checkpoint holds)."""
        total = sum(s.nbytes for s in self.root)
        for r in self.regions:
            total += sum(s.nbytes for s in r.storages if s.kind != "snapshot")
        return total

    def copy(self) -> Profile:
        """An independent copy, fast enough to take every step.

        Records hold only numbers, strings and tuples, so copying each record's fields
        is a full copy; ``meta`` (free-form) is copied deeply.
        """
        out = _clone(self)
        out.regions = [_clone_region(r) for r in self.regions]
        out.root = [_clone(s) for s in self.root]
        out.meta = copy.deepcopy(self.meta)
        return out

    # ------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the profile to ``path`` whole: into a file beside it, then moved over it,
        so a reader (or a second writer) never sees half of one."""
        text = self.to_json(indent=1)
        path = os.path.realpath(path)  # a symlink's target is written, the link kept
        folder = os.path.dirname(path)
        fd, tmp = tempfile.mkstemp(prefix=".profile-", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o666 & ~_umask())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        """A profile from its JSON object; TypeError naming the part that is not the JSON
        object (or list) it must be."""
        _expect(data, dict, "a profile")
        for i, r in enumerate(_expect(data.get("regions", []), list, "a profile's regions")):
            _expect(r, dict, f"region {i}")
            for key in ("ops", "storages"):
                for j, x in enumerate(_expect(r.get(key, []), list, f"region {i}'s {key}")):
                    _expect(x, dict, f"{key[:-1]} {j} of region {i}")
        for j, x in enumerate(_expect(data.get("root", []), list, "a profile's root storages")):
            _expect(x, dict, f"root storage {j}")
        version = int(data.get("version", PROFILE_VERSION))
        if not 1 <= version <= PROFILE_VERSION:
            raise ValueError(
                f"profile version {version} is not supported; this build reads versions 1 "
                f"to {PROFILE_VERSION}"
            )
        for key in _BYTE_FIELDS:
            _check_bytes(data.get(key, 0), f"profile {key}")
        regions = []
        for r in data.get("regions", []):
            ops = [
                OpRecord(
                    **{
                        **o,
                        "outputs": tuple(o.get("outputs", ())),
                        "reads": None if o.get("reads") is None else tuple(o["reads"]),
                    }
                )
                for o in r.get("ops", [])
            ]
            storages = [
                _storage_record(s, f"storage {j} of region {r.get('name')}#{r.get('call_index')}")
                for j, s in enumerate(r.get("storages", []))
            ]
            fields = {k: v for k, v in r.items() if k not in ("ops", "storages")}
            regions.append(RegionRecord(ops=ops, storages=storages, **fields))
        root = [_storage_record(s, f"root storage {j}") for j, s in enumerate(data.get("root", []))]
        rest = {k: v for k, v in data.items() if k not in ("regions", "root", "version")}
        return cls(regions=regions, root=root, **rest)  # in this build's format: its version

    @classmethod
    def from_json(cls, text: str) -> Profile:
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Profile:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())


_T = TypeVar("_T")


def _expect(value: _T, kind: type, what: str) -> _T:
    """``value`` if it is a ``kind`` (a JSON object or list), else TypeError naming
    ``what``."""
    if not isinstance(value, kind):
        name = "a JSON object" if kind is dict else "a JSON list" if kind is list else kind.__name__
        raise TypeError(f"{what} must be {name}, got {type(value).__name__} {value!r:.60}")
    return value


#: A profile's byte counts, held as int64 by the planner.
_BYTE_FIELDS = ("fixed_bytes", "device_capacity_bytes", "host_limit_bytes")


def _check_bytes(value: object, what: str) -> None:
    """ValueError naming ``what`` unless ``value`` is a whole number of bytes an int64 holds."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ValueError(f"{what} = {value!r:.60} is invalid; accepted: a whole number of bytes from 0 to 2**63 - 1")


def _storage_record(data: dict[str, Any], what: str) -> StorageRecord:
    """A storage from its JSON object; ``shared_with`` (a JSON list) as a plan key, or
    ValueError naming ``what`` where it is none."""
    shared = data.get("shared_with")
    if shared is not None:
        key_ok = isinstance(shared, (list, tuple)) and len(shared) == 3 and isinstance(shared[0], str)
        if not (key_ok and all(isinstance(x, int) and not isinstance(x, bool) for x in shared[1:])):
            raise ValueError(
                f"{what} shared_with = {shared!r:.60} is invalid; accepted: null or a [region, call, index] "
                'list, as ["blocks.0", 0, 2]'
            )
        data = {**data, "shared_with": tuple(shared)}
    return StorageRecord(**data)


def _clone(obj: _T) -> _T:
    """Shallow copy of a dataclass instance (its fields are shared)."""
    out = object.__new__(type(obj))
    out.__dict__.update(obj.__dict__)
    return out


def _clone_region(r: RegionRecord) -> RegionRecord:
    out = _clone(r)
    out.ops = [_clone(o) for o in r.ops]
    out.storages = [_clone(s) for s in r.storages]
    return out
