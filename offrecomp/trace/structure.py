"""Region structure: what one region call looks like at op level, and what replay does
with each op.

``build_structure`` combines an ``OpRecorder`` trace with the saves the hooks saw into a
``RegionStructure``:

* for the planner: per op its time, its dataflow (``reads``), whether replay could serve
  it, and which saved storage each output lives in (``scheduler.profile.OpRecord``);
* for replay: ``RegionStructure.program``, saying for each op of the replayed prefix
  whether to run it, serve it from held storages, or hand out a placeholder (carried out
  by ``serving.ServingMode``).

NOTE [Which ops replay runs]
Replay must regenerate the dropped storages it needs, and nothing else. Going backwards
from the ops that produced those storages, it follows the dataflow the recording saw:
an op runs if a running op reads what it produced, or if it is a *sink* (draws random
numbers, writes in place, writes storage it did not create, or hands a value to Python
such as ``.item()``), whose effects must happen as in the forward. An op whose every
output lives in a held storage (a KEEP save, never written in place in the region) is
*served*: its outputs are rebuilt with the recorded size/stride/offset on the held
storage, the very bytes the forward produced, and what it read is not needed. Every
other op gets placeholder outputs (right shape, strides and dtype, unspecified values)
because nothing that runs reads them. View ops always run (they cost nothing and keep
Python-level metadata right). An op is a view by what its call did: one whose schema
may alias (``to``, ``contiguous``, ``reshape``, reached as themselves under a dispatch
mode inside the region) but returned new storage computes, and is placed like any other.

That is only sound when the recording saw all the dataflow, and when every pass takes
the recorded path through the region's Python code. It does not, or may not, when:
  * the region holds torch.compile'd modules: under a dispatch mode dynamo does not
    compile them (and may give up on them for good), so a recording would show other ops
    and saves than the compiled forward runs. Such a region is *opaque* from the start
    and is never recorded: one op stands for its whole forward (NOTE [Compiled
    regions]);
  * a higher-order operator ran (flex_attention, cond): it reaches the recorder as one
    op whose subgraphs it never sees. The region is *opaque*. Both modes (``_RegionMode``)
    accept such operators (without that they raise), and both step aside while dynamo
    compiles (``ignore_compile_internals``): under a mode dynamo would not compile,
    would give up on that code for good, and code compiled with ``fullgraph=True``
    (eager flex_attention's own wrapper) would raise;
  * an op ran with grad disabled inside the grad-enabled region (a custom
    autograd.Function, a compiled graph, a no_grad block): such code may launch kernels
    the dispatcher never sees. The region is *opaque*: replay runs its whole prefix, as
    torch.utils.checkpoint does, and serves nothing;
  * an op handed Python a value or a shape that depends on the data (``.item()``,
    ``bool(t)``, ``nonzero``, ``unique``), or the code read tensor values through a
    method no op stands for (``.tolist()``, ``.numpy()``, ``np.asarray``; NOTE [Host
    reads] in recorder.py): the code may branch on it, so another pass may
    run other ops, or the same ops on other tensors, than the recording. The region is
    *opaque*: replay reruns the prefix plainly, following this pass's own branches;
  * an op read a tensor that no op of the region created and that is neither a region
    input nor a parameter or buffer (``torch.tensor(x.tolist())``, ``from_numpy``): a
    Python-side value path the dispatcher cannot see, or a tensor held in a module
    attribute or inside an argument object). Then replay hands out no placeholders, and
    serves no output of that op nor of any op that reads, directly or through other ops,
    what it produced: a served output takes the recorded strides, and an op's output
    strides follow its inputs', which for such a tensor nothing at the call's entry
    fixes (``RegionCall.layout`` holds those of its inputs, parameters and buffers).
Replay checks that it dispatches the same ops with the same non-tensor arguments as the
forward. If a replay with placeholders diverges anyway, it is redone without
placeholders and the region never uses them again (logged once); a replay without
placeholders that diverges is an error: the region's forward is not a deterministic
function of its inputs.

NOTE [Skipped builds]
A tensor built on first use and kept where the runtime does not look (a
``functools.lru_cache`` function returning a mask, a dict filled per length) is built in
the call the measuring pass records and taken from the cache by every later call: a
serving replay of that call does not dispatch the recorded ops that built it. Where the
replay dispatches another op than the recording's next one, the serving mode looks past
a run of recorded ops that reads nothing from outside the run (factory ops such as
``full``, ``arange``, ``triu`` and what they feed one another), draws no random numbers,
writes nothing it did not make and saves nothing, and goes on at the first op after it
that the replay's op matches, by name and non-tensor arguments (an op of the build may
have the replay's op's name: a ``slice`` of a frequency table). An op of the build may
match by its arguments too (the build slices its table as every call slices the cached
one): while the replay's ops after the skip are ops of the run, the replay runs them,
serving none, and where one differs from the recording, the replay goes on at the next
op of the run that its ops since the skip match. An op reading no tensor is checked
against its recorded arguments even where it is served, so a build whose first op is
the replay's op with other arguments is skipped too. The skipped ops'
outputs are what the cached tensor holds: the forward of this pass took the tensor from
the same cache, and the replay reruns that forward. A run that reads an input, a
parameter or a buffer (a tensor computed from the data and stashed) is never skipped, so
a replay that Python state sends down another branch still raises.
``RegionStructure.build_roots`` holds, per op, the first op of the run it may belong to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from offrecomp.trace.ops import _returns_rebuildable
from offrecomp.trace.recorder import COMPILED_FORWARD, OpRecorder, _Op, _OutMeta, _Value
from scheduler.profile import OpRecord, StorageRecord

_DATA_TAGS = tuple(
    getattr(torch.Tag, name) for name in ("data_dependent_output", "dynamic_output_shape")
    if hasattr(torch.Tag, name)
)


def _branches_on_data(op: Any) -> bool:
    """The op hands Python a value or a shape that depends on tensor data (``.item()``,
    ``bool(t)``, ``nonzero``, ``unique``): the region's Python code may branch on it."""
    if any(tag in _DATA_TAGS for tag in getattr(op.func, "tags", ())):
        return True
    values = [o for o in op.outputs if isinstance(o, _Value)]
    return bool(values) and not any(isinstance(o, _OutMeta) for o in op.outputs)


@dataclass
class ServedOutput:
    """How replay rebuilds one tensor output of an op it does not run."""

    storage: int  # index into the region call's storages; -1: not held (placeholder)
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: torch.device


# A skipped op's flattened return value: tensors to rebuild, or plain values as recorded.
ServedEntry = ServedOutput | _Value

RUN, SERVE, PLACEHOLDER = 0, 1, 2


@dataclass
class RegionStructure:
    """What one region call looks like at op level (stable across steps of a signature)."""

    op_names: list[str]
    op_scalars: list[tuple[Any, ...]]
    op_records: list[OpRecord]
    storage_records: list[StorageRecord]
    opaque: bool
    placeholders_ok: bool
    outputs: list[list[ServedEntry] | None]
    """Per op, how to rebuild its flattened return without running it (None: cannot)."""
    servable: list[bool]
    """Per op: may be served when all its ``outputs`` storages are held."""
    view_ops: list[bool]
    save_ops: list[int] = field(default_factory=list)
    """Per save (pack index): number of ops dispatched before it."""
    param_casts: dict[int, int] = field(default_factory=dict)
    """Op index -> ``id`` of the parameter it casts, for the casts autocast caches (NOTE
    [Autocast cache])."""
    state: tuple[Any, ...] | None = None
    """``module_state`` of the recorded call's region at its exit (NOTE [Stale
    recordings] in regenerate.py)."""
    transients: dict[tuple[Any, ...], int] = field(default_factory=dict)
    """Replay transients computed from this recording, by (dropped storages, prefix,
    plain) (NOTE [Replay transients] in scheduler/working_set.py): the same each step."""
    self_changing: bool = False
    """The recorded call changed its modules' attributes or replaced a buffer (a cache
    built on first use): later calls may run other ops (NOTE [Stale recordings])."""
    layout: tuple[Any, ...] | None = None
    """The recorded call's ``RegionCall.layout()``: the geometry its served outputs
    assume (NOTE [Stale recordings] in regenerate.py)."""
    arguments: tuple[Any, ...] | None = None
    """The recorded call's ``CapturedInputs.plain_values()``: a call with others (a
    temperature annealed per step) may run other ops or scalars, and replays plainly."""
    small_storages: tuple[int, ...] = ()
    """Storages made in the region that are ``external`` only for being under the
    runtime's ``min_bytes``: the most frugal plan may drop them (NOTE [Small storages])."""
    snapshot_bytes: int = 0
    """Bytes of the buffer copies the recorded call held for its replay (NOTE [Replay and
    module state] in buffers.py): its profile's storage of kind ``snapshot``."""
    kept_dropped: int = 0
    """Bytes of storages its measuring pass dropped that every plan keeps (storages
    untracked aliases share, NOTE [Untracked aliases]): that pass's peak is below what any
    plan holds."""
    build_roots: list[int] = field(default_factory=list)
    """Per op: the first op whose output it reads (itself when it reads no tensor), or -1
    when it reads a tensor no op of the region made, draws random numbers or writes what
    it did not make (NOTE [Skipped builds])."""
    skipped_builds: int = 0
    """Recorded ops serving replays have skipped as builds of a cached tensor."""

    def skip_build(self, k: int, name: str, scalars: tuple[Any, ...], after: int = -1) -> int:
        """NOTE [Skipped builds]: the index of the first op named ``name`` with the
        non-tensor arguments ``scalars`` after a run of recorded ops from ``k`` that reads
        nothing from outside itself, or -1; past ``after``, where given (the next
        candidate)."""
        roots = self.build_roots
        n = min(len(roots), len(self.op_names))
        j = max(k, after)
        while j < n and roots[j] >= k:
            j += 1
            if j < n and self.op_names[j] == name:
                if j in self.param_casts or any(k < s <= j for s in self.save_ops):
                    return -1
                if j < len(self.op_scalars) and self.op_scalars[j] != scalars:
                    continue  # an op of the build itself (its own slice of a table, say)
                return j
        return -1

    def program(
        self, kept: Sequence[bool], needed_saves: set[int], storage_of_save: dict[int, int], *,
        placeholders: bool = True,
    ) -> list[int]:
        """What replay does with each op of the prefix it must cover.

        ``kept[i]``: storage i is held at replay time. ``needed_saves``: pack indices of the
        dropped saves to regenerate; ``storage_of_save[p]``: storage index of save p.
        ``placeholders``: False where module hooks see the region's tensors now (NOTE
        [Placeholders and hooks]).
        """
        last = max(needed_saves)
        k_end = self.save_ops[last] if last < len(self.save_ops) else len(self.op_records)
        ops = self.op_records
        prog = [RUN] * k_end
        if self.opaque:
            return prog

        def served(k: int) -> bool:
            if not self.servable[k]:
                return False
            outs = ops[k].outputs
            return bool(outs) and all(0 <= s < len(kept) and kept[s] for s in outs)

        if not self.placeholders_ok or not placeholders:
            return [SERVE if served(k) else RUN for k in range(k_end)]
        run = [False] * k_end
        work: list[int] = []
        for p in needed_saves:
            sidx = storage_of_save.get(p, -1)
            prod = self.storage_records[sidx].producer_op if 0 <= sidx < len(self.storage_records) else -1
            if prod < 0:
                return [SERVE if served(k) else RUN for k in range(k_end)]  # unknown origin: be safe
            if prod < k_end:
                work.append(prod)
        for k in range(k_end):
            if ops[k].sink:
                work.append(k)
            elif self.view_ops[k]:
                run[k] = True  # views run (free) but read no values: reads not followed
        done = [False] * k_end
        serve = [False] * k_end
        while work:
            k = work.pop()
            if k >= k_end or done[k]:
                continue
            done[k] = True
            if self.view_ops[k]:
                continue
            if not ops[k].sink and served(k):
                serve[k] = True
                continue
            run[k] = True
            reads = ops[k].reads or ()
            work.extend(r for r in reads if 0 <= r < k_end and not done[r])
        for k in range(k_end):
            if run[k]:
                prog[k] = RUN
            elif serve[k] or served(k):
                prog[k] = SERVE
            elif self.outputs[k] is not None:
                prog[k] = PLACEHOLDER
            else:
                prog[k] = RUN
        return prog


@dataclass
class SaveInfo:
    """What the hooks saw for one save during the recorded forward."""

    storage: int
    ops_before: int
    time: float


@dataclass
class _OpTable:
    """Per op of the recording, what ``build_structure`` hands the planner and replay."""

    records: list[OpRecord] = field(default_factory=list)
    outputs: list[list[ServedEntry] | None] = field(default_factory=list)
    servable: list[bool] = field(default_factory=list)
    view_ops: list[bool] = field(default_factory=list)
    build_roots: list[int] = field(default_factory=list)

    def add(
        self, record: OpRecord, outputs: list[ServedEntry] | None, servable: bool, view: bool, root: int = -1
    ) -> None:
        self.records.append(record)
        self.outputs.append(outputs)
        self.servable.append(servable)
        self.view_ops.append(view)
        self.build_roots.append(root)


@dataclass
class _Outputs:
    """Where one op's flattened return lives."""

    storages: list[int]
    """Per tensor output, the region call's storage index it lives in (-1: none)."""
    entries: list[ServedEntry]
    """How replay rebuilds the return without running the op."""
    rebuildable: bool
    """The return can be rebuilt at all (simple return types, every tensor describable)."""
    held: bool
    """Every tensor output lives in one of the call's storages, never written in place."""


class _Role(NamedTuple):
    """What one op is to replay (NOTE [Which ops replay runs])."""

    aliasing: bool  # a return shares an input's storage
    view: bool  # a pure view: always runs, reads no values
    sink: bool  # its effects must happen as in the forward: always runs
    servable: bool  # may be served from held storages


def _is_opaque(rec: OpRecorder) -> bool:
    """The recording may not show all the region's dataflow, or the path every pass takes
    through its code (NOTE [Which ops replay runs])."""
    return (
        any(op.higher_order for op in rec.ops)
        or (not rec.grad_enabled_at_entry)
        or any(not op.grad_enabled for op in rec.ops)
        or any(_branches_on_data(op) for op in rec.ops)
        or rec.host_reads
    )


#: The ops ``torch.tensor(data)`` and friends dispatch on the tensor they built from
#: Python data outside the dispatcher (NOTE [Lifted constants]).
_LIFTS = frozenset({"aten.lift_fresh.default", "aten.lift_fresh_copy.default"})

# NOTE [Lifted constants]
# ``torch.tensor([])`` (a Hugging Face cache's first keys, a mask built from a list) makes
# its tensor outside the dispatcher and hands it to ``lift_fresh``, so the recording sees
# a read of an allocation no op made: an unseen value, which turns placeholders off for
# the whole region (every op before the replay's stop then runs but served ones). That
# data comes from Python, not from the region's tensors: a region that reads tensor
# values on the host (``.tolist()``, ``.item()``) is opaque and never gets here. So the
# lift counts as the op that made its tensor: what reads it reads the lift, a view that
# replay always runs, where the region's Python code builds the tensor again.


def _reads(op: _Op, creator: dict[int, int], known_sids: set[int]) -> tuple[list[int], bool]:
    """The ops whose allocations ``op`` reads, and whether it reads an allocation that no
    op of the region made and that is not one of the region's inputs, parameters or
    buffers (a value from a path the dispatcher cannot see)."""
    reads: list[int] = []
    unseen = False
    for sid in op.read_sids:
        c = creator.get(sid)
        if c is not None:
            reads.append(c)
        elif sid not in known_sids:
            unseen = True
    return reads, unseen


def _outputs(
    op: _Op,
    k: int,
    creator: dict[int, int],
    producer: list[int],
    sid_to_storage: dict[int, int],
    written: set[int],
) -> _Outputs:
    """Where op ``k``'s outputs live. An allocation it makes is entered in ``creator``
    (recording's storage id -> op) and, the first time one of the call's storages is
    made, in ``producer`` (storage index -> op)."""
    storages: list[int] = []
    entries: list[ServedEntry] = []
    rebuildable = _returns_rebuildable(op.func)
    held = True
    for o in op.outputs:
        if isinstance(o, _Value):
            entries.append(o)
            continue
        if not isinstance(o, _OutMeta):
            rebuildable = False
            storages.append(-1)
            continue
        sidx = sid_to_storage.get(o.sid, -1)
        storages.append(sidx)
        fresh = o.sid not in op.input_sids and o.sid not in creator
        if fresh:
            creator[o.sid] = k
            if sidx >= 0 and producer[sidx] < 0:
                producer[sidx] = k
        if o.numel == 0 or sidx < 0 or o.sid in written:
            held = False
        entries.append(ServedOutput(sidx if (o.numel and sidx >= 0) else -1, o.size, o.stride,
                                    o.offset if sidx >= 0 else 0, o.dtype, o.device))
    return _Outputs(storages, entries, rebuildable, held)


def _role(op: _Op, out: _Outputs, writes_foreign: bool, opaque: bool) -> _Role:
    """Whether ``op`` is a view, a sink, or servable (NOTE [Which ops replay runs])."""
    # _unsafe_view and friends alias an input without saying so in their schema.
    aliasing = op.view or any(isinstance(o, _OutMeta) and o.sid in op.input_sids for o in op.outputs)
    has_value_out = any(isinstance(e, _Value) for e in out.entries) and not any(
        isinstance(e, ServedOutput) for e in out.entries
    )
    pure_view = aliasing and not op.writes
    sink = not pure_view and (op.random or op.writes or writes_foreign or has_value_out or not out.rebuildable)
    can_serve = (
        not opaque and out.rebuildable and not aliasing and not op.writes and not op.random and out.held
        and any(isinstance(e, ServedOutput) and e.storage >= 0 for e in out.entries)
    )
    return _Role(aliasing=aliasing, view=pure_view, sink=sink, servable=can_serve)


def _add_compiled_forward(
    table: _OpTable, producer: list[int], storage_kinds: Sequence[str], seconds: float
) -> None:
    """NOTE [Compiled regions]: op 0 is the compiled forward; it makes every activation."""
    made = tuple(i for i, kind in enumerate(storage_kinds) if kind == "activation")
    for i in made:
        producer[i] = 0
    table.add(
        OpRecord(seconds=float(seconds), skippable=False, outputs=made, name=COMPILED_FORWARD,
                 reads=None, sink=True, view=False),
        None,
        False,
        False,
    )


# NOTE [Placeholders and hooks]
# A placeholder is garbage bytes of the right geometry (NOTE [Which ops replay runs]).
# No op the replay runs may read one (NOTE [Placeholder guard] in serving.py), but a
# module's forward hook or pre-hook is Python code that may keep what it is handed
# outside the region (a feature store for distillation, an activation logger), which
# the replay does not put back: it would keep garbage, where a plain replay hands it
# the values the forward computed again, as torch.utils.checkpoint does. So a region
# whose submodules (or torch's global module hooks) have forward hooks when it is
# recorded gets no placeholders, and its ops that only make such values run (``reads``
# unknown: the planner prices its replays by prefix); one hooked after its recording
# replays without placeholders from then on (``RegionStructure.program``'s
# ``placeholders``). The region's own hooks do not count: a replay calls its forward,
# not the module (FSDP2's hooks on a sharded block leave it its placeholders).
# Attributes the forward sets on the region's own modules are put back after a replay
# (NOTE [Module attributes] in changes.py); Python code in the forward itself that keeps
# a tensor elsewhere (a global dict) is not seen.


def _add_recorded_ops(
    table: _OpTable,
    producer: list[int],
    rec: OpRecorder,
    storage_sids: Sequence[int | None],
    op_seconds: Sequence[float],
    opaque: bool,
) -> bool:
    """Enter every recorded op in ``table`` (and the ops that make the call's storages in
    ``producer``); return whether replay may hand out placeholders (NOTE [Which ops
    replay runs])."""
    sid_to_storage = {sid: i for i, sid in enumerate(storage_sids) if sid is not None}
    live = rec.unsaved_live_bytes(set(sid_to_storage))  # NOTE [Replay transients]
    written: set[int] = set()
    for op in rec.ops:
        written.update(op.written_sids)
    creator: dict[int, int] = {}  # sid -> op that allocated it
    placeholders_ok = not opaque
    unfixed: set[int] = set()  # ops whose output geometry an unseen tensor may set
    for k, op in enumerate(rec.ops):
        lift = op.name in _LIFTS
        if lift:  # NOTE [Lifted constants]: the op makes what it lifts
            for sid in op.read_sids:
                creator.setdefault(sid, k)
        reads, unseen = _reads(op, creator, rec.known_sids)
        if lift:
            reads = [r for r in reads if r != k]
        outside = any(sid not in creator for sid in op.read_sids)  # before _outputs enters op k's
        if unseen:
            placeholders_ok = False  # a value from a path the dispatcher cannot see
        if unseen or any(r in unfixed for r in reads):
            unfixed.add(k)
        writes_foreign = any(sid not in creator or sid in rec.known_sids for sid in op.written_sids)
        out = _outputs(op, k, creator, producer, sid_to_storage, written)
        role = _role(op, out, writes_foreign, opaque)
        if k in unfixed and role.servable:
            role = role._replace(servable=False)
        root = -1 if outside or op.random or writes_foreign or op.higher_order else min(reads, default=k)
        table.add(
            OpRecord(
                seconds=float(op_seconds[k]),
                skippable=role.servable,
                outputs=tuple(out.storages),
                name=op.name,
                reads=None if opaque else tuple(sorted(set(reads))),
                sink=role.sink,
                view=role.view,
                transient_bytes=live[k],
            ),
            out.entries if out.rebuildable and not role.aliasing else None,
            role.servable,
            role.view,
            root,
        )
    return placeholders_ok


def _storage_records(
    saves: Sequence[SaveInfo],
    producer: Sequence[int],
    storage_nbytes: Sequence[int],
    storage_kinds: Sequence[str],
    region_start: float,
    freed: Sequence[int],
    outlives: Sequence[bool],
) -> list[StorageRecord]:
    """Per storage of the region call: its size, kind, producing op, saves, the op count
    at which the call's forward freed it (``freed[i]``; the op count: not before its
    end; -1: unknown) and whether it outlived the call unreturned (``outlives[i]``).
    An activation no recorded op made is ``external``."""
    n = len(producer)
    first: dict[int, SaveInfo] = {}
    last: dict[int, SaveInfo] = {}
    counts = [0] * n
    for s in saves:
        if s.storage < 0:
            continue
        first.setdefault(s.storage, s)
        last[s.storage] = s
        counts[s.storage] += 1
    storages: list[StorageRecord] = []
    for i in range(n):
        kind = storage_kinds[i]
        if kind == "activation" and producer[i] < 0:
            kind = "external"
        f = first.get(i)
        la = last.get(i)
        storages.append(
            StorageRecord(
                nbytes=int(storage_nbytes[i]),
                kind=kind,  # type: ignore[arg-type]
                producer_op=producer[i],
                first_save_op=f.ops_before if f else 0,
                last_save_op=la.ops_before if la else 0,
                offset_seconds=max(0.0, (f.time - region_start)) if f else 0.0,
                saves=counts[i],
                freed_op=freed[i] if producer[i] >= 0 else -1,
                outlives_call=outlives[i] and producer[i] >= 0,
            )
        )
    return storages


def build_structure(
    rec: OpRecorder,
    saves: Sequence[SaveInfo],
    storage_sids: Sequence[int | None],
    storage_nbytes: Sequence[int],
    storage_kinds: Sequence[str],
    op_seconds: Sequence[float],
    region_start: float,
    *,
    compiled: bool = False,
    hooked: bool = False,
) -> RegionStructure:
    """Combine the op trace with the saves into a ``RegionStructure``. ``hooked``: module
    hooks see the region's tensors (NOTE [Placeholders and hooks]).

    ``storage_sids[i]`` is the recorder's storage id of the region call's storage i
    (inputs first, then activations in order of first save).
    """
    opaque = compiled or _is_opaque(rec)
    table = _OpTable()
    producer = [-1] * len(storage_sids)
    if rec.passive:
        _add_compiled_forward(table, producer, storage_kinds, op_seconds[0])
        placeholders_ok = not opaque
    else:
        placeholders_ok = _add_recorded_ops(table, producer, rec, storage_sids, op_seconds, opaque) and not hooked
    n_ops = len(rec.ops)
    freed = [-1] * len(storage_sids)
    outlives = [False] * len(storage_sids)
    for i, sid in enumerate(storage_sids):  # NOTE [Forward transients] in scheduler/working_set.py
        if sid is not None and not rec.passive:
            freed[i] = min(rec.freed.get(sid, n_ops), n_ops)
            outlives[i] = sid in rec.made and sid not in rec.freed and sid not in rec.returned
    storages = _storage_records(saves, producer, storage_nbytes, storage_kinds, region_start, freed, outlives)
    if not placeholders_ok and not opaque:
        for r in table.records:
            r.reads = None  # planner: prefix semantics
    return RegionStructure(
        op_names=[op.name for op in rec.ops],
        op_scalars=[op.scalars for op in rec.ops],
        op_records=table.records,
        storage_records=storages,
        opaque=opaque,
        placeholders_ok=placeholders_ok,
        outputs=table.outputs,
        servable=table.servable,
        view_ops=table.view_ops,
        save_ops=[s.ops_before for s in saves],
        param_casts={k: op.cast_of for k, op in enumerate(rec.ops) if op.cast_of},
        build_roots=table.build_roots,
    )
