"""What a region call's forward did to the state its replay reads.

At a call's exit: did the forward write its inputs, its parameters, its arguments' state,
its modules' attributes, or a tensor from outside the call (a replay would see the
written values, or write them again)? Which tensors from outside did it read (a replay
runs on copies of those written since)? A region found writing such state keeps its
activations from then on. calls.py calls these at a call's entry and exit.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from offrecomp._torch_compat import version_of
from offrecomp.arg_state import ArgState
from offrecomp.attr_tables import changed_since, kept_tables, same_contents
from offrecomp.changes import exit_attrs
from offrecomp.diagnostics import kind, named, warn_once
from offrecomp.regions import READ_SNAPSHOT_MAX_BYTES, Region, buffer_of
from offrecomp.state import RegionCall
from scheduler.plan import Placement

log = logging.getLogger(__name__)

__all__ = [
    "check_arg_state",
    "check_attr_writes",
    "check_state_writes",
    "check_training_cache",
    "finish_attrs",
    "hold_dropped",
    "note_attr_versions",
    "note_external_reads",
    "saved_by",
    "warn_big_buffers",
    "warn_foreign",
    "writes_foreign",
]

KEEP, RECOMPUTE = Placement.KEEP, Placement.RECOMPUTE


def hold_dropped(call: RegionCall) -> None:
    """Keep every storage ``call`` dropped so far that still exists (NOTE [Accumulating
    backward in a forward]): its saves, made and to come, read it as kept."""
    p = call.pass_state
    for rec in call.storages:
        if rec.placement is not RECOMPUTE:
            continue
        storage = rec()
        if storage is None:  # freed: a later save at its pointer is another storage
            continue
        rec.placement = KEEP
        rec.tensor = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        if p is not None:
            p.stats.recomputed_bytes -= rec.nbytes
            p.stats.keep(rec)
    for idx, ref in list(call.dropped.items()):
        h = ref()
        if h is None or h.rec.placement is KEEP:
            del call.dropped[idx]


def finish_attrs(call: RegionCall, region: Region) -> None:
    """NOTE [Module attributes]: note the attributes the forward changed, if any; keep
    the entry tables for the replay (NOTE [Attributes at entry])."""
    tables = call.attrs
    changed = changed_since(region.modules, tables)
    call.entry_tables = kept_tables(region, tables)
    call.attrs = exit_attrs(changed) if changed else None
    if call.recorder is not None and call.entry_contents and not same_contents(call.entry_contents):
        call.filled_contents = True  # a cache its modules hold filled on first use (RegionStructure.self_changing)
    if changed and not region.changes_attrs:
        region.changes_attrs = True
        log.info(
            "offrecomp: region %r changes attributes of its modules in its forward (%s); "
            "its replays see them as they were at each call's entry",
            region.name, ", ".join(sorted({k for _, d in changed for k in d}))[:200],
        )


def warn_big_buffers(call: RegionCall, region: Region) -> None:
    if call.buffers is None or not call.buffers.mutated:
        return
    big = [
        i
        for i in call.buffers.mutated
        if call.buffers.snapshots[i] is None and call.buffers.objects[i] is buffer_of(*call.buffers.slots[i])
    ]
    if big:
        warn_once(
            f"bigbuf:{named(region)}",
            "offrecomp: region %r mutates buffers larger than 1 MiB in its forward; "
            "replay sees their post-forward values",
            region.name,
        )


# NOTE [State written by its region]
# A forward may write its own inputs in place: an in-place activation applied to the
# block's input first thing (F.leaky_relu_(x)), x.mul_(scale). Autograd allows it when
# nothing saved the input before the write. A replay starts from the captured inputs,
# which alias the written tensors: it would start from the written values. A forward
# may also write its parameters: a running average kept in a frozen parameter (as
# some VQ codebooks are), nn.Embedding(max_norm=...) renormalising its weight; a replay
# would read the written values and write them a second time, silently (buffers are
# snapshotted for this, NOTE [Replay and module state]; weights are too large to copy
# at every call). The first call of each region therefore runs under FirstCallWatch
# (trace), which copies an input or a parameter just before an op writes it. That call
# replays from the copies: an input as a fresh non-leaf, so that the write is legal and
# the copy stays intact, and a parameter as a fresh parameter in its slot, the written
# one put back afterwards. From then on the region is known to write its state, and its
# activations are kept (or offloaded under a plan), never dropped. (Copying the written
# state at every call would let it recompute, for its bytes per call; the planner does
# not model such a copy.) A parameter the watch copied counts as written even where its
# version did not move: a write through ``.data`` (a KAN's grid update) bumps only the
# alias's counter. A write the watch cannot see (compiled code, a higher-order
# operator, a later call that writes when the first did not) is found by versions at
# exit; that call's replay raises, and the region is kept from then on; such a write
# through ``.data`` is not found, and the replay reads the written values. A write to a
# tensor from outside the call, one it did not make and neither owns nor takes as an
# argument (a buffer of another module or a tensor attribute reached through a plain
# attribute, a global): from that op on, the watched call keeps what it saves, so its
# replay stops before the write, and the region is kept from then on, with a warning,
# unless each such storage proves, at the call's exit, scratch of the call's own that
# compiled code allocated where no op showed it (NOTE [Storages no op made] in
# trace/recorder.py, which also tells how writes inside compiled kernels are heard).
# What the replay runs before the write may read that tensor: where the call read it
# before writing it, or writes only part of it, the watch copies its storage just
# before the first write (up to EXTERNAL_COPY_MAX_BYTES in trace/recorder.py; a larger
# one stops the replay with an error), and the replay runs on that copy, the storage's
# later bytes put back afterwards. A storage overwritten whole before any read (a
# scratch buffer) needs no copy.


# NOTE [State read from outside]
# A forward may read a tensor from outside its call that it does not write: a plain
# tensor attribute, a global, another module's buffer. Plain autograd does not care when
# the op that read it saved nothing of it (an add), and the loop may write it between
# the forward and the backward (a temperature, a schedule's scale). A replay would then
# read the written value. The first call's watch sees which such tensors the call reads
# (trace/recorder.py: a storage that existed before the call, that it does not own,
# take or write); the region remembers them (weakly), and the call, at its exit, and
# each later call, at its entry, notes their versions, and copies those up to
# READ_SNAPSHOT_MAX_BYTES (regions.py, as for buffers a forward only read). A
# replay runs on the copies, the values found put back afterwards: a write since may
# have moved no version (through ``.data``), and the copies go in through ``.data``
# too, so that no version moves where the graph saved the tensor. A larger one written
# since with a version bump stops the replay at its first read (the parameters' guard,
# NOTE [Replay and parameters] in params.py); one written through ``.data`` goes
# unseen. A tensor the first call did not read is not seen (a global rebound to a new
# tensor at each step reads as another tensor).


def note_external_reads(refs: tuple[weakref.ref[torch.Tensor], ...]) -> list[tuple[torch.Tensor, int, torch.Tensor | None]] | None:
    """What a call notes of the tensors from outside it its region reads (NOTE [State
    read from outside]): each one alive, its version, a copy where small."""
    out = []
    with torch.no_grad():
        for ref in refs:
            t = ref()
            if t is not None:
                small = t.untyped_storage().nbytes() <= READ_SNAPSHOT_MAX_BYTES
                out.append((t, version_of(t), t.clone() if small else None))
    return out or None


# NOTE [Attributes written after the first call]
# Only a region's first call is watched (NOTE [State written by its region]): a write
# to a tensor outside the call that begins in a later call (a flag switched on after the
# first step turning on ``self.pos.add_(1)``, eager or in a compiled function) goes
# unseen, and the call's replay would write it again. The tensors its modules hold in
# plain attributes (``Region.tensor_attrs``: not their parameters or buffers, read when
# the region is refreshed and at each copy of the attribute tables) are the likely ones:
# each later call notes their versions at entry, and one moved at exit was written by the
# forward. The region is then marked, its later calls kept, with the foreign-write
# warning; this call's replay cannot be right where it reads the tensor, so it raises
# there (``RegionCall.attr_writes``, read by the replay's guard). Not for one the first
# call read: its copy taken at this call's entry (NOTE [State read from outside]) holds
# what the forward read, and the replay runs on it. The tensors the watched call made
# and left alive are noted so too (NOTE [State the first call made]), unless one it
# takes or owns (its inputs, parameters, buffers: NOTE [State written by its region]).
# A global or another object's tensor that existed before the first call and is written
# only from a later call goes unseen (Known limits).

# NOTE [State the first call made]
# A tensor the watched call made on first use and keeps outside the region's modules
# (returned by none of its calls, saved by none of their ops), as a K-FAC optimizer's
# hook on a layer inside the block keeps its covariance factor in a dict of its own, is
# state a later call may update in place: there the hook finds it and updates it, and so
# would every replay, a second time, silently. The watch keeps a weak reference to each
# tensor an op made on a new storage; those alive at the call's exit, on the storage
# they were made on, are the region's ``made_state``, but for those only the call's
# autograd graph holds (a custom Function's forward keeping an intermediate on ``ctx``:
# ``graph_held`` in trace/recorder.py), which no later call reads. The watched call's replay leaves
# them as it found them (it runs on them as the forward left them: where its output
# reads state the same call updated, the replay computes other activations, silently
# unless OFFRECOMP_VERIFY=1; a K-FAC factor only the optimizer reads replays right)
# (``state_as_found`` in replay_state.py: copied before, put back after where the replay
# wrote them; one larger than EXTERNAL_COPY_MAX_BYTES is not copied, and a replay that
# wrote it raises once it ended). For the later calls they are tensors read from outside
# (NOTE [State read from outside]): each call copies the small ones at its entry, and a
# replay of one whose forward wrote them runs on that copy, what it writes put back
# afterwards; a larger one its forward wrote is a write seen at the call's exit (NOTE
# [Attributes written after the first call]): that call's replay raises where it reads
# it, and the region is kept from then on.


def note_attr_versions(
    attrs: tuple[tuple[nn.Module, str], ...], made: tuple[weakref.ref[torch.Tensor], ...] = ()
) -> list[tuple[torch.Tensor, int, nn.Module | None, str]]:
    """NOTE [Attributes written after the first call]: each attribute's tensor now, its
    version, its module and name; and each tensor of ``made`` alive, with its version
    (module None, no name)."""
    out: list[tuple[torch.Tensor, int, nn.Module | None, str]] = []
    for m, n in attrs:
        t = m.__dict__.get(n)
        if type(t) is torch.Tensor:
            out.append((t, version_of(t), m, n))
    for ref in made:
        t = ref()
        if t is not None:
            out.append((t, version_of(t), None, ""))
    return out


def _written_what(t: torch.Tensor, m: nn.Module | None, n: str) -> str:
    """What ``check_attr_writes`` says a moved tensor of ``note_attr_versions`` is."""
    if m is not None:
        return (
            f"tensor attribute {n!r} of {type(m).__name__} (written by this call's forward; "
            "the region's first call, the one watched, did not)"
        )
    return (
        f"a {tuple(t.shape)} tensor the region's first call made and kept outside the "
        "region's modules (state a hook keeps? updated in place by this call's forward; "
        "skip such updates under offrecomp.in_replay())"
    )


def check_attr_writes(call: RegionCall, region: Region, own: Callable[[], frozenset[int]]) -> None:
    """NOTE [Attributes written after the first call]: did the forward write in place one
    of its modules' tensor attributes, or a tensor its region's watched call made and
    left alive? ``own``: the storages the call takes or owns, read if one moved."""
    moved = {
        int(t.untyped_storage().data_ptr()): _written_what(t, m, n)
        for t, v, m, n in call.attr_versions or ()
        if version_of(t) != v
    }
    call.attr_versions = None
    if not moved:
        return
    # one the first call read, copied at this call's entry, replays on that copy (NOTE
    # [State read from outside]); one it takes or owns is the capture's to copy
    copied = {int(t.untyped_storage().data_ptr()) for t, _, copy in call.external_reads or () if copy is not None}
    skip = copied | own()
    written = {ptr: what for ptr, what in moved.items() if ptr not in skip}
    if not written:
        return
    call.attr_writes = written
    region.writes_state = True  # its later calls keep
    warn_foreign(region)


def warn_foreign(region: Region) -> None:
    """Say once per kind of region that it writes a tensor from outside its call."""
    warn_once(
        f"foreign:{kind(region)}",
        "offrecomp: region %r (and any other like it) writes in place a tensor that "
        "it neither owns nor takes as an argument (a buffer or tensor attribute "
        "reached through a plain attribute, a global, say); a replay would write it "
        "again, so its activations are kept",
        region.name,
    )


def writes_foreign(call: RegionCall, heard_after: bool) -> None:
    """NOTE [State written by its region]: ``call``'s forward is about to write a tensor
    it did not make and does not own: what it saves from now on is kept (a replay stops
    before that write: everything after it needs none). ``heard_after``: compiled code
    wrote it already (NOTE [Storages no op made]); what the call dropped so far and still
    exists is kept too, as its later saves would need a replay through that write."""
    if not call.writes_state:
        call.kept_from_write = True  # NOTE [Storages no op made]: perhaps scratch of its own
    call.writes_state = True
    call.forget_placements()
    if heard_after:
        hold_dropped(call)


def saved_by(call: RegionCall, ptr: int, storage: Any) -> bool:
    """Is ``storage`` (at ``ptr``) one that ``call`` saved (NOTE [Storages no op made])?"""
    rec = call.by_ptr.get(ptr)
    return rec is not None and rec() is storage


def check_state_writes(region: Region, call: RegionCall, params: list[int]) -> None:
    """NOTE [State written by its region]: did this forward write its inputs, or the
    region's parameters (``params``: the slots it wrote)?"""
    cap = call.inputs
    assert cap is not None
    watched, call.watch = call.watch is not None, None
    unseen = [
        i for i, t in enumerate(cap.tensors)
        if t is not None and i not in cap.copied and version_of(t) != cap.versions[i]
    ]
    if not (cap.copied or unseen or params):
        if watched:
            region.writes_state = False
        return
    region.writes_state = True
    inputs = bool(cap.copied or unseen)
    what = " and ".join(w for w, hit in (("its own inputs", inputs), ("its parameters", params)) if hit)
    missed = bool(unseen) or (call.params is not None and bool(call.params.unseen))
    warn_once(
        f"writes-state:{kind(region)}" if not missed else f"writes-state-unseen:{named(region)}",
        "offrecomp: region %r (and any other like it) writes %s in place in its forward "
        "(an in-place activation applied to its input first thing; a running average "
        "kept in a frozen parameter; weights normalised in place, as magnitude-preserving "
        "layers do); a replay needs them as they were, so its "
        "activations are kept or offloaded from now on, never recomputed. An out-of-place "
        "op, or a buffer for such state, lets offrecomp recompute it.%s",
        region.name, what,
        "" if not missed else " This call's replay cannot be done: the write was not seen "
        "as it happened (compiled code, a higher-order operator, or a call that writes "
        "when the region's first call did not), so backward raises.",
    )


def _key_value_cache(obj: Any) -> bool:
    """A Hugging Face key/value cache (``DynamicCache`` and its kin)?"""
    t = type(obj)
    return t.__module__.startswith("transformers.") and t.__name__.endswith("Cache")


def _empty(cache: Any) -> bool:
    """A cache that holds no keys yet: one the model built for this forward (its first
    layer's call). One handed in full is the caller's (a trainable prefix, as prefix
    tuning passes): the loss may read it, and use_cache does not leave it out."""
    try:
        return int(cache.get_seq_length()) == 0
    except Exception:  # another kind of cache: taken for the model's own
        return True


def check_training_cache(region: Region, objects: Any) -> None:
    """A call of a new signature takes ``objects`` as arguments: warn if one is a key/value
    cache the model built for this forward (NOTE [Cache paused in training])."""
    if any(_key_value_cache(o) and _empty(o) for o in objects):
        _warn_training_cache(region)


def _warn_training_cache(region: Region) -> None:
    """NOTE [Cache paused in training] (integrations/_common.py), for a loop without a
    trainer callback: say once what the cache costs and how to leave it out."""
    warn_once(
        "training-cache",
        "offrecomp: region %r (and every layer like it) is handed a Hugging Face key/value cache in "
        "training: the loss never reads it, and a replay must see it as its forward did, so each "
        "layer call records the state it holds, host time growing with the square of the depth. "
        "Where the model takes use_cache (most decoders, True by default), pass use_cache=False to "
        "it or set model.config.use_cache = False for training; a model that builds its cache "
        "whatever it is told (XLM) pays that time.",
        region.name,
    )


def check_arg_state(call: RegionCall) -> None:
    """NOTE [Stateful arguments]: keep the entry bindings, for a replay after the forward
    or the caller changed them, and the versions of their tensors now."""
    entry = call.arg_state
    assert entry is not None and call.inputs is not None
    now = ArgState.capture(call.inputs.objects, entry.limit, prev=entry)  # NOTE [Capture reuse]
    region = call.region
    if entry.same(now):  # for state too large to record, the part recorded
        if not entry.complete:
            call.arg_state = None
            if region is not None and region.untracked_state is None:
                region.untracked_state = False  # later calls replay (this one keeps)
        else:
            _seal(call, entry)
        return
    types = ", ".join(sorted({type(o).__name__ for o in call.inputs.objects}))
    if not (entry.complete and now.complete):
        call.arg_state = None
        if region is not None:
            region.untracked_state = region.writes_state = True  # kept or offloaded from now on
            warn_once(
                f"argstate-big:{kind(region)}",
                "offrecomp: region %r (and any other like it) changes the state of its "
                "arguments (%s) in its forward, and they hold more than %d bindings to "
                "track, so no replay could see them as the forward did: its activations "
                "are kept or offloaded, never recomputed. Hint: keep such state out of the "
                "block's arguments (for a transformers model in training: use_cache=False)",
                region.name, types, entry.limit,
            )
        return
    _seal(call, entry, now)
    log.debug(
        "offrecomp: region %r changes the state of its arguments (%s); replays run on "
        "the state its forward saw",
        call.name, types,
    )


def _seal(call: RegionCall, entry: ArgState, now: ArgState | None = None) -> None:
    """The call's argument state as its forward left it (``now``, where it differs from
    ``entry``); the positions its forward wrote are copied at the entry of its region's
    later calls (NOTE [State written by the forward])."""
    written = entry.seal(now)
    region = call.region
    if region is not None and not written <= region.arg_writes:
        region.arg_writes = region.arg_writes | written
