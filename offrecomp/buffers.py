"""Module buffers and a region call's replay: which buffers its forward wrote, the
copies of their values at entry that a replay runs on, and what those copies hold.

A call captures its region's buffer slots at entry (``capture_buffers``), finds at exit
which of them its forward mutated or reassigned (``finish_buffers``), and its replay
swaps the entry values in and the post-forward ones back (``swap_buffers``).
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from offrecomp._torch_compat import version_of
from offrecomp.handles import view_on
from offrecomp.regions import READ_SNAPSHOT_MAX_BYTES, buffer_of

__all__ = [
    "BUFFER_SNAPSHOT_MAX_BYTES",
    "BufferState",
    "capture_buffers",
    "differ",
    "differ_at_once",
    "finish_buffers",
    "give_writes",
    "has_readers",
    "modified_buffers",
    "settle_buffers",
    "snapshot_bytes",
    "swap_buffers",
    "watch_writes",
]

#: Buffers larger than this are not snapshotted at region entry (NOTE [Replay and module
#: state]).
BUFFER_SNAPSHOT_MAX_BYTES = 1 << 20


# NOTE [Replay and module state]
# Replay reruns a region's forward, which may mutate module buffers a second time
# (BatchNorm's running statistics, a step counter). torch.utils.checkpoint lets that
# happen; we do not. At region entry the runtime records each buffer's version and clones
# the small ones. Buffers whose version changed during the forward were mutated by it; at
# replay their current (post-forward) values are set aside, the entry values are swapped
# in so the replay computes what the forward computed, and after the replay the
# post-forward values are put back. Large mutated buffers (over
# BUFFER_SNAPSHOT_MAX_BYTES) are not cloned at entry: replay then sees their post-forward
# value, with a warning once per region; their state after replay is still restored.
#
# The copies a call keeps past its forward (of the buffers it mutated, and of the small
# ones it only read: NOTE [Buffers written unseen]) are device memory its replay
# checkpoint holds until the call is released, as it holds its region inputs: six blocks
# each updating an EMA of 1 MiB hold 6 MiB under recompute that torch.utils.checkpoint
# does not. So they are booked. The call's exit counts them resident
# (``RegionCall.snapshot_bytes``), its release takes them off; a copy the exit lets go (a
# larger buffer the forward only read) is the forward's scratch, as its temporaries are.
# Counting at the exit rather than the entry moves no peak of the books: the call's
# bytes only grow until its exit, which counts the copies before it lets an offload
# group go. The profile holds them as one storage of kind ``snapshot`` per call (from
# its recording, ``RegionStructure.snapshot_bytes``), which a plan can only keep and
# which counts only where the plan does not keep the call whole: such a call takes no
# checkpoint (NOTE [Kept planned calls] in placement.py), so it holds no copies.


@dataclass
class BufferState:
    slots: tuple[tuple[nn.Module, str], ...]
    """The region's buffer slots when the call entered."""
    objects: list[torch.Tensor | None]
    """The tensor in each slot at region entry."""
    versions: list[int]
    snapshots: list[torch.Tensor | None]
    mutated: list[int] | None = None  # slot indices, filled at region exit
    exit_stamp: int = 0
    """When the call's forward returned, in the order of all calls' exits (NOTE [Buffers
    written unseen])."""
    pending: list[PendingCompare] | None = None
    """The exit's comparisons still on their way from the devices, one per device (NOTE
    [Buffer comparisons]); ``settle_buffers`` applies them."""
    untouched: list[tuple[int, int]] | None = None
    """(slot index, version at region exit) of the buffers the forward left as they were,
    filled at region exit: a replay reads the tensor the forward read (``objects``), which
    must not have been written since (``modified_buffers``)."""
    offered: set[int] | None = None
    """Slots of larger buffers it read whose copy it keeps, since a later call wrote them
    unseen while its own comparison was still on its way (NOTE [Buffers written unseen])."""
    storages: dict[int, tuple[Any, ...]] | None = None
    """Slot -> (storage, dtype, size, stride, offset) of each plain strided buffer over
    READ_SNAPSHOT_MAX_BYTES at entry: ``buffer.data = other`` replaces them, moving no
    version (NOTE [Replay and buffer slots])."""

    def strides(self) -> list[tuple[int, ...] | None]:
        """The strides of the buffers a replay reads: the tensor each slot held at entry
        (the replay restores a changed one, and puts back one the slot no longer holds);
        None for a slot empty at entry, which the replay empties too (a memory the
        forward sets, and may clear again before it returns); for one whose storage is
        held, the geometry taken with it (``.data =`` may restride the tensor since)."""
        held = self.storages or {}
        return [
            held[i][3] if i in held else b.stride() if b is not None and b.layout is torch.strided else None
            for i, b in enumerate(self.objects)
        ]


def capture_buffers(slots: tuple[tuple[nn.Module, str], ...]) -> BufferState | None:
    if not slots:
        return None
    objects = [buffer_of(m, n) for m, n in slots]
    versions = [-1 if b is None else version_of(b) for b in objects]
    snaps: list[torch.Tensor | None] = []
    storages: dict[int, tuple[Any, ...]] | None = None
    for i, b in enumerate(objects):
        size = _nbytes(b) if b is not None else 0
        if b is not None and size <= BUFFER_SNAPSHOT_MAX_BYTES:
            snaps.append(b.detach().clone())
        else:
            snaps.append(None)
        if size > READ_SNAPSHOT_MAX_BYTES and type(b) is torch.Tensor and b.layout is torch.strided:
            if storages is None:
                storages = {}
            storages[i] = (b.untyped_storage(), b.dtype, b.shape, b.stride(), b.storage_offset())
    return BufferState(slots, objects, versions, snaps, storages=storages)


def finish_buffers(state: BufferState | None) -> None:
    """Region forward returned: find the buffer slots it mutated or reassigned.

    The version counter is not enough: BatchNorm updates its running statistics inside
    the kernel without bumping it, so strided buffers whose copy would go if unchanged
    are compared by value too (NOTE [Buffer comparisons]).
    """
    if state is None:
        return
    state.exit_stamp = next(_exit_stamps)
    mutated = []
    checked: list[tuple[int, bool]] = []  # (slot, rebound by the forward) of each pair
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    slots = state.slots
    for i, (m, n) in enumerate(slots):
        b = buffer_of(m, n)
        entry = state.objects[i]
        snap = state.snapshots[i]
        if b is not entry:
            mutated.append(i)  # reassigned (or set to None) by the forward
            if snap is not None and entry is not None and entry.layout == torch.strided and (
                version_of(entry) == state.versions[i]
            ):
                checked.append((i, True))  # NOTE [Rebound buffers]: the entry tensor may hold its values
                pairs.append((snap, entry.detach()))
            continue
        if b is None:
            continue
        if version_of(b) != state.versions[i]:
            mutated.append(i)
        elif snap is not None and b.layout == torch.strided and _nbytes(snap) > READ_SNAPSHOT_MAX_BYTES:
            checked.append((i, False))  # kept if written unseen, else let go (NOTE [Buffer comparisons])
            _note_reader(state, i)  # at its exit, in order, whenever its comparison comes back
            pairs.append((snap, b.detach()))
    later = {d: ks for d, ks in _by_device(pairs, cpu=True).items() if compares_later(d)}
    if later:  # NOTE [Buffer comparisons]: their flags come back while the forward goes on
        state.pending = [PendingCompare([checked[k] for k in ks], [pairs[k] for k in ks]) for ks in later.values()]
        deferred = {k for ks in later.values() for k in ks}
        checked = [c for k, c in enumerate(checked) if k not in deferred]
        pairs = [pair for k, pair in enumerate(pairs) if k not in deferred]
    state.mutated = mutated
    _apply(state, checked, differ(pairs))
    # The tensors the forward read are needed for replay (NOTE [Replay and buffer
    # slots]); of the snapshots of buffers it only read, the small ones (NOTE [Buffers
    # written unseen]), and those compared later until their flags are read.
    untouched = []
    written = set(mutated)
    waiting = {i for pending in state.pending or () for i, _ in pending.checked}
    for i in range(len(slots)):
        if i not in written:
            b = state.objects[i]
            if b is not None:
                untouched.append((i, version_of(b)))
            snap = state.snapshots[i]
            if snap is not None and _nbytes(snap) > READ_SNAPSHOT_MAX_BYTES and i not in waiting:
                state.snapshots[i] = None
                _note_reader(state, i)
    state.untouched = untouched


def settle_buffers(state: BufferState, wait: bool) -> bool:
    """Apply the exit's comparisons still pending for ``state`` once their flags are on
    the host (with ``wait``, waiting for them: a replay is about to read the buffers);
    True when none is pending any more (NOTE [Buffer comparisons])."""
    pending = state.pending
    if pending is None:
        return True
    if not wait and not all(p.ready() for p in pending):
        return False
    state.pending = None
    for p in pending:
        _apply(state, p.checked, p.read())
    return True


def _apply(state: BufferState, checked: list[tuple[int, bool]], differs: list[bool]) -> None:
    """The exit's comparisons of ``checked`` (slot, rebound) came out as ``differs``: an
    unchanged rebound buffer's copy goes (NOTE [Rebound buffers]), as does an unchanged
    larger buffer's the forward only read; one written unseen is mutated."""
    mutated = state.mutated
    assert mutated is not None  # finish_buffers ran
    for (i, rebound), d in zip(checked, differs):
        if not d:
            if rebound or i not in (state.offered or ()):
                state.snapshots[i] = None
        elif not rebound:
            mutated.append(i)
            state.untouched = [(j, v) for j, v in state.untouched or () if j != i]
            obj, snap = state.objects[i], state.snapshots[i]
            if obj is not None and snap is not None:  # NOTE [Buffers written unseen]
                _give_readers(obj, state.exit_stamp, snap)
    mutated.sort()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def snapshot_bytes(state: BufferState, device: torch.device | None) -> int:
    """Bytes of the copies ``state`` keeps for its call's replay once the forward returned
    (``finish_buffers``), those on ``device``'s type (any, when None): NOTE [Replay and
    module state]."""
    return sum(
        _nbytes(s)
        for s in state.snapshots
        if s is not None and (device is None or s.device.type == device.type)
    )


# NOTE [Rebound buffers]
# A forward that binds a new tensor to a buffer slot (a spiking neuron's membrane, a
# streaming layer's cache: ``self.mem = beta * self.mem + x``) leaves the tensor of the
# call's entry as it was, and the call holds that tensor (``BufferState.objects``). A
# copy of it repeats its values: the copy goes at the call's exit when the entry tensor's
# version did not move and its values still equal the copy's, and a replay runs on (a
# clone of) the entry tensor. Written in place after that (its version moved), it no
# longer holds what the forward read, and the replay raises rather than run on other
# values. A spiking network's membranes are such slots: a copy each would double them.


# NOTE [Buffer comparisons]
# Whether a buffer's values changed (a call's exit; a replay's entry) is a comparison with
# its snapshot, and ``torch.equal`` on a GPU hands a bool to the host: a synchronisation
# per buffer, where a block of BatchNorm layers holds three buffers each. ``differ``
# compares the pairs of each device other than the CPU as one stack of device flags read
# at once: one synchronisation per call and device, which a replay's entry (in
# backward) pays. On the CPU each pair is ``torch.equal``, the cheaper there. A call's
# exit compares only the buffers whose copy it would let go if their values did not
# change (those over READ_SNAPSHOT_MAX_BYTES, and rebound ones): the copy of a smaller
# buffer stays either way (NOTE [Buffers written unseen]), and its replay compares it
# with the buffer before it runs, running on the copy where the two differ, which is
# what it does for a buffer the forward wrote. So a forward of BatchNorm blocks compares
# nothing. On a CUDA device the exit does not read its flags either: they go to pinned
# host memory behind an event (``PendingCompare``), the copies stay, and a later exit
# applies them once the event passed (``settle_buffers``, in exit order: a copy of an
# unchanged buffer goes and leaves the books then, a buffer written unseen becomes one
# the forward wrote). A replay applies them first, and a measuring pass's exit (whose
# profile counts the copies kept) waits for them. No replay's values depend on when
# they are applied: a copy kept for a buffer the forward only read is compared again at
# the replay's entry, which runs on it where the buffer differs. So the forward
# synchronises nowhere for its buffers; the copies of a forward that outruns the device
# stay held, and booked, until the device has compared them.


def compares_later(device: torch.device) -> bool:
    """Whether a call's exit reads its comparisons on ``device`` later, not at once: on
    a CUDA device, where reading them at once synchronises the host."""
    return device.type == "cuda"


class PendingCompare:
    """Comparisons of ``pairs`` (one device) made on the device at a call's exit, their
    flags copied to pinned host memory behind an event, read once it has passed."""

    __slots__ = ("checked", "event", "flags")

    def __init__(self, checked: list[tuple[int, bool]], pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.checked = checked
        flags = _device_flags(pairs)
        self.event: Any = None
        device = flags.device
        if device.type == "cuda":
            try:  # device="cpu": under a torch.device mode too
                host = torch.empty(flags.shape, dtype=torch.bool, device="cpu", pin_memory=True)
            except RuntimeError:  # no pinned memory to be had: read from the device once passed
                host = None
            if host is not None:
                host.copy_(flags, non_blocking=True)  # on the current stream of the flags' device
                flags = host
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(device))
        self.flags = flags

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def read(self) -> list[bool]:
        if self.event is not None:
            self.event.synchronize()
        return [bool(d) for d in self.flags.tolist()]


def differ(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[bool]:
    """Whether the values of each pair of strided tensors differ (``not torch.equal``;
    NaN differs from itself), reading each device's flags at once (NOTE [Buffer
    comparisons])."""
    by_device = _by_device(pairs)
    on_device = {k for ks in by_device.values() for k in ks}
    # the rest: a pair of other shapes, dtypes or devices differs; a CPU pair is compared here
    out = [k not in on_device and (not _comparable(a, b) or not torch.equal(a, b)) for k, (a, b) in enumerate(pairs)]
    for ks in by_device.values():
        for k, d in zip(ks, differ_at_once([pairs[k] for k in ks])):
            out[k] = d
    return out


def differ_at_once(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[bool]:
    """``differ`` for pairs of one device, of equal shapes and dtypes: their flags stacked
    on the device and read in one transfer (NOTE [Buffer comparisons])."""
    return [bool(d) for d in _device_flags(pairs).tolist()]


def _comparable(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _by_device(pairs: list[tuple[torch.Tensor, torch.Tensor]], cpu: bool = False) -> dict[torch.device, list[int]]:
    """The indices of the comparable pairs, by device: on devices other than the CPU (and
    on the CPU too, with ``cpu``)."""
    out: dict[torch.device, list[int]] = {}
    for k, (a, b) in enumerate(pairs):
        if (cpu or a.device.type != "cpu") and _comparable(a, b):
            out.setdefault(a.device, []).append(k)
    return out


def _device_flags(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Whether each pair (one device, equal shapes and dtypes) differs, as one bool tensor
    on that device."""
    return torch.stack([torch.ne(a, b).any() for a, b in pairs])


#: A call that read a larger buffer and kept no copy: the buffer and the call's state,
#: weakly, and the buffer's slot there.
_Reader = tuple["weakref.ref[torch.Tensor]", "weakref.ref[BufferState]", int]
#: Order of region calls' exits (``BufferState.exit_stamp``).
_exit_stamps = itertools.count(1)
#: The calls that read a larger buffer and kept no copy of it, by the buffer's id (NOTE
#: [Buffers written unseen]). Tensors compare by value, so they key no dict themselves.
_readers: dict[int, list[_Reader]] = {}


def _note_reader(state: BufferState, i: int) -> None:
    b = state.objects[i]
    if b is None:
        return
    readers = _readers.setdefault(id(b), [])
    if len(readers) >= 64:  # calls released since
        readers[:] = _live(readers, b)
    readers.append((weakref.ref(b), weakref.ref(state), i))
    if len(_readers) > 1024:  # buffers gone since
        for k in [k for k, rs in _readers.items() if all(r[0]() is None for r in rs)]:
            del _readers[k]


def _live(readers: list[_Reader], b: torch.Tensor) -> list[_Reader]:
    """The entries of ``readers`` of ``b`` whose calls are still held."""
    return [r for r in readers if r[0]() is b and r[1]() is not None]


def has_readers() -> bool:
    """Do calls that read a larger buffer and kept no copy of it wait for their replays?"""
    return bool(_readers)


def watch_writes(slots: tuple[tuple[nn.Module, str], ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of the buffers of ``slots`` that held calls read without keeping a copy, taken
    before a region's forward that is no call of the runtime's (one under ``no_grad``);
    ``give_writes`` hands them to those calls if the forward wrote them (NOTE [Buffers
    written unseen])."""
    out = []
    for m, n in slots:
        b = buffer_of(m, n)
        if b is None:
            continue
        readers = _readers.get(id(b))
        if readers is None:
            continue
        live = _live(readers, b)
        if not live:  # their calls were released: none waits for a replay
            del _readers[id(b)]
            continue
        _readers[id(b)] = live
        if _nbytes(b) <= BUFFER_SNAPSHOT_MAX_BYTES:
            out.append((b, b.detach().clone()))
    return out


def give_writes(copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """The forward ``watch_writes`` watched returned: the buffers it wrote go to their
    readers' replays as they were before it."""
    if not copies:
        return
    stamp = next(_exit_stamps)
    written = differ([(c, b.detach()) for b, c in copies])
    for (b, c), d in zip(copies, written):
        if d:
            _give_readers(b, stamp, c)


def _give_readers(buffer: torch.Tensor, stamp: int, entry: torch.Tensor) -> None:
    """A call that exited at ``stamp`` wrote ``buffer`` unseen; ``entry`` holds its values
    at that call's entry: each earlier reader without a copy takes it."""
    later = []  # exited after the write: they read its values, and may need a later write's copy
    for r in _readers.pop(id(buffer), ()):
        b, state, i = r[0](), r[1](), r[2]
        if b is not buffer or state is None:
            continue
        if state.exit_stamp > stamp:
            later.append(r)
        elif state.snapshots[i] is None:
            state.snapshots[i] = entry
        else:  # its own comparison not applied yet: it keeps its copy of what it read
            state.offered = (state.offered or set()) | {i}
    if later:
        _readers[id(buffer)] = later


# NOTE [Buffers written unseen]
# A buffer a forward only read may be written before that forward's replay without its
# version counter moving: the CPU BatchNorm kernel updates its running statistics in
# place without a bump, so a model evaluated (BatchNorm reading the statistics) and then
# trained before one backward of both has the eval call's statistics changed under it.
# Plain autograd keeps what that forward saved; a replay would recompute it from the
# new statistics. So the snapshot of each small buffer (up to READ_SNAPSHOT_MAX_BYTES) a
# forward only read is kept, and a replay finding the buffer's values changed runs on a
# copy of the snapshot, the buffer back after (``swap_buffers``), whether the
# write moved the version or not. A larger one (up to BUFFER_SNAPSHOT_MAX_BYTES, the
# copies a call takes at entry) is checked by its version: a write that moved it stops
# the replay with an error (``modified_buffers``). One that did not is found by the
# writing call's own exit, which compares the buffer with its entry copy: each earlier
# call that read the buffer and kept no copy (a table by buffer of the calls still held,
# entered at their exits and ordered by them: ``exit_stamp``) takes that copy as its
# snapshot, and its replay runs on it as on its own; one whose own comparison has not
# come back yet (NOTE [Buffer comparisons]) keeps its copy when it does (``offered``).
# The copy holds what the earlier call read unless the buffer was also written between
# the two calls, with its version unmoved, by code no region call saw. A region's forward under ``torch.no_grad`` (a train-mode pass for
# pseudo-labels, a statistics recalibration) is no call of the runtime's: where held calls
# read its buffers without a copy, it copies them before it runs (``watch_writes``) and
# hands over those it wrote (``give_writes``). Larger buffers still are never copied:
# such a write goes unseen.


# NOTE [Replay and buffer slots]
# As parameter slots (NOTE [Replay and parameters]), a buffer slot may hold another
# tensor for one call only (``torch.func.functional_call(model, {"bn.running_mean": t}
# ...)``, fast-weight libraries that set ``module._buffers``): the forward read that
# tensor, and backward runs when the slot holds the module's own again. So the state
# keeps the tensor each slot held at entry, and a replay puts it back into a slot that
# now holds another (``swap_buffers``), and the current one afterwards; the
# version check of a buffer the forward left as it was reads that tensor, not the slot.
# ``buffer.data = other`` between the forward and its replay (a table rebuilt for a new
# length, a cast through ``.data``) keeps the tensor and its version and replaces the
# storage under it. A buffer up to READ_SNAPSHOT_MAX_BYTES has its snapshot, which the
# replay compares with it (NOTE [Buffers written unseen]); for a larger one the call holds
# its storage at entry with its geometry (``BufferState.storages``: no memory while the
# buffer keeps it; a replaced one lives until the call is released, as a parameter's
# does, NOTE [Replay and parameters] in params.py), and the replay reads a tensor over the
# held storage where the buffer has another by then. One written in place (its version
# moved) stops a replay that reads it, the guard watching the held storage; one written
# through ``.data`` in place moves no version and goes unseen (Known limits).


def modified_buffers(state: BufferState) -> dict[int, str]:
    """Storages (data pointer -> description) of the buffers the forward read and left
    as they were that were written in place since it returned (an average a tensor hook
    updates in backward): a replay reading one would differ from the forward."""
    out: dict[int, str] = {}
    for i, v in state.untouched or ():
        m, n = state.slots[i]
        b = state.objects[i]  # what the forward read, and the replay reads
        if state.snapshots[i] is not None:
            continue  # the replay reads its snapshot where it changed (NOTE [Buffers written unseen])
        if b is not None and b.layout == torch.strided and version_of(b) != v:
            held = state.storages.get(i) if state.storages is not None else None
            storage = held[0] if held is not None else b.untyped_storage()  # the one the replay reads
            out[int(storage.data_ptr())] = (
                f"buffer {n!r} of {type(m).__name__} (version {v} -> {version_of(b)})"
            )
    return out


def _data_at_entry(state: BufferState, i: int) -> torch.Tensor | None:
    """Buffer ``i``'s values at entry where ``buffer.data = other`` replaced its storage
    since: a tensor over the storage held (NOTE [Replay and buffer slots]); None where
    the buffer has that storage still, or none was held."""
    held = state.storages.get(i) if state.storages is not None else None
    b = state.objects[i]
    if held is None or b is None or b.untyped_storage() is held[0]:  # one object per storage
        return None
    storage, dtype, size, stride, offset = held
    return view_on(storage, 0, dtype, size, stride, offset)


@contextlib.contextmanager
def swap_buffers(state: BufferState, region_name: str) -> Iterator[None]:
    """NOTE [Replay and module state]: the replay runs on copies of the entry values; the
    post-forward tensors go back into their slots afterwards, untouched. A buffer the
    forward left as it was is read as the tensor the forward read (NOTE [Replay and
    buffer slots] in regions.py)."""
    settle_buffers(state, wait=True)
    slots = state.slots
    saved: list[tuple[int, torch.Tensor | None]] = []
    untouched = state.untouched or ()
    checked: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    for i, _ in untouched:
        snap, read = state.snapshots[i], state.objects[i]
        if snap is not None and read is not None and snap.layout == torch.strided:
            checked.append((i, snap, read.detach()))
    written = differ([(snap, read) for _, snap, read in checked])  # NOTE [Buffer comparisons]
    since = {i: snap for (i, snap, _), d in zip(checked, written) if d}
    for i, _ in untouched:
        m, n = slots[i]
        now, read = buffer_of(m, n), state.objects[i]
        if i in since:
            read = since[i].clone()  # written since, seen or not (NOTE [Buffers written unseen])
        elif (held := _data_at_entry(state, i)) is not None:
            read = held  # its storage replaced since (``.data =``): the one held
        if now is not read:
            saved.append((i, now))
            m._buffers[n] = read
    with torch.no_grad():
        for i in state.mutated or ():
            m, n = slots[i]
            post = buffer_of(m, n)
            saved.append((i, post))
            entry = state.snapshots[i]
            obj = state.objects[i]
            if entry is None and obj is not None:
                # reassigned: the entry tensor itself holds the entry values (NOTE
                # [Rebound buffers]); a large buffer mutated in place: only its
                # post-forward value is known (logged at region exit)
                if obj is not post and version_of(obj) != state.versions[i]:
                    raise RuntimeError(_rebound_written(region_name, n, state.versions[i], version_of(obj)))
                entry = obj
            # obj None: the slot was None at entry (a memory the forward sets), and is again;
            # a recurrent memory with a graph (a spiking neuron's membrane) required grad:
            # its copy does too, or autograd saves other tensors in the replay
            m._buffers[n] = None if entry is None else entry.detach().clone().requires_grad_(
                obj is not None and obj.requires_grad
            )
    try:
        yield
    finally:
        for i, post in saved:
            m, n = slots[i]
            m._buffers[n] = post


def _rebound_written(region_name: str, name: str, was: int, now: int) -> str:
    return (
        f"offrecomp: buffer {name!r} of region {region_name!r} was rebound by its forward, and the "
        f"tensor it held when the forward began was written in place since (version {was} -> "
        f"{now}): a replay cannot run on the values the forward read. Hint: write a new tensor "
        "instead, or exclude the block with regions=."
    )
