"""The handles autograd holds for saved tensors (NOTE [Saved tensor handles]), the
region call's lease they share (NOTE [Call leases]), and the interned geometry they
keep (NOTE [Interned geometry]). ``state`` holds the records they point to.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from offrecomp.interrupts import finish

if TYPE_CHECKING:
    from offrecomp.state import RegionCall, StorageRec

__all__ = [
    "INTERNED_SHAPES",
    "INTERNED_STRIDES",
    "KeptHandle",
    "KeptRef",
    "Lease",
    "SavedHandle",
    "TypedHandle",
    "interned",
    "interned_shape",
    "interned_stride",
    "view_on",
]


# NOTE [Saved tensor handles]
# What the pack hook returns is held by autograd's SavedVariable, itself held by the node
# that saved the tensor. A handle that held the saved tensor itself would hold, for an
# op's saved output, a tensor whose grad_fn is that node: a cycle through C++ that
# Python's collector cannot see, so a graph dropped without backward would never be
# freed. A KEEP handle holds a detached alias instead (same storage, same version counter,
# no grad_fn) when the tensor has a grad_fn, and is a weak reference to the original, to
# see a detach_() after the save (KeptRef); unpack hands the alias back and autograd
# attaches the gradient edge itself. OFFLOAD and RECOMPUTE handles hold the geometry,
# are weak references to the original, and hold the region call's lease (NOTE [Call
# leases]).


#: A KEEP handle of a tensor without a grad_fn is a plain tuple, the cheapest object to
#: make and to take apart: (record, pack index, tensor, version at save).
KeptHandle = tuple


class KeptRef(weakref.ref):  # type: ignore[type-arg]
    """The KEEP handle of a saved tensor that has a grad_fn: a weak reference to the
    original (to see a detach_() after the save) that carries the record, the pack index,
    the detached alias and the version at save. One object where a tuple and a weak
    reference would be two: the collector walks every object a forward keeps alive."""

    __slots__ = ("alias", "index", "rec", "version")
    alias: torch.Tensor
    index: int
    rec: StorageRec
    version: int


# NOTE [Call leases]
# The replay checkpoint of a region call (its inputs, RNG state, ...) and the host block
# of its offload group must live while any of its dropped or offloaded saves may be
# unpacked, and no longer. Each such handle holds the call's lease, one small object per
# call that the call itself holds only weakly; when autograd drops the last handle the
# lease dies and releases the call (once the call has exited). One finaliser per call,
# none per handle; kept saves need no lease.


class Lease:
    """Held by every dropped or offloaded save of one region call."""

    __slots__ = ("__weakref__", "call", "release")

    def __init__(self, call: RegionCall, release: Any) -> None:
        self.call, self.release = call, release

    def __del__(self) -> None:
        try:
            self.release(self.call)
        except BaseException as exc:  # an interrupt: the release runs to its end all the same
            with contextlib.suppress(Exception):  # an error is never raised from a finaliser
                finish(functools.partial(self.release, self.call), exc)


class SavedHandle(weakref.ref):  # type: ignore[type-arg]
    """A saved tensor placed OFFLOAD or RECOMPUTE: its geometry, not its data. It is a weak
    reference to the original (which may outlive the handle): ``h()`` is the original or
    None; one object where a handle and a weak reference would be two. For a view, also
    a weak reference to its base: a write to the base after the save (``h.t()`` saved,
    ``h.add_(1)`` later) shows in the shared version counter after the view died."""

    __slots__ = ("__weakref__", "again", "base", "counted", "dtype", "grad_fn", "lease", "offset", "pack_index",
                 "rec", "size", "stride", "version")
    again: torch.Tensor  # what a dropped save's unpack handed out (NOTE [Saves read twice] in hooks.py)
    counted: int  # an offloaded save: the group's fetch its unpack counted a use of (NOTE [Saves read twice])
    base: weakref.ref[torch.Tensor] | None
    dtype: torch.dtype
    grad_fn: bool
    lease: Lease
    offset: int | torch.SymInt
    pack_index: int
    rec: StorageRec
    size: torch.Size
    stride: tuple[int, ...]
    version: int

    def __new__(
        cls, rec: StorageRec, pack_index: int, t: torch.Tensor, lease: Lease, size: torch.Size | None = None
    ) -> SavedHandle:
        """``size``: ``t.shape`` already read, for a ``t`` that covers its storage from its
        first element (its storage offset is 0)."""
        self = weakref.ref.__new__(cls, t)
        self.rec = rec
        self.pack_index = pack_index
        self.lease = lease
        self.counted = -1
        self.version = t._version
        self.grad_fn = not t.is_leaf  # to see a detach_() after the save
        if size is None:
            size = t.shape
            self.size = INTERNED_SHAPES.get(size) or interned_shape(size)  # NOTE [Interned geometry]
            self.offset = t.storage_offset()
        else:
            self.size = size
            self.offset = 0
        stride = t.stride()
        self.stride = INTERNED_STRIDES.get(stride) or interned_stride(stride)
        self.dtype = t.dtype
        base = t._base  # a view's base shares its version counter and may outlive it
        self.base = weakref.ref(base) if base is not None else None
        return self

    # Everything is set in __new__; weakref.ref's own __init__ would reject the arguments.
    __init__ = object.__init__  # type: ignore[assignment]

    def rebuild(self, storage: Any, byte_offset: int = 0) -> torch.Tensor:
        """This saved view on ``storage`` (an UntypedStorage), whose byte ``byte_offset``
        is the saved storage's first byte."""
        return view_on(storage, byte_offset, self.dtype, self.size, self.stride, self.offset)


# NOTE [Writes after a save]
# Autograd raises at unpack when a saved tensor was written in place after its save. An
# offload or recompute handle sees such a write only while the original (or a view's
# base) lives, as it holds them weakly; an activation written inside its region and then
# dropped at the region's exit would otherwise come back from a copy taken after the
# write. A typed save (NOTE [Typed sources] in transfer.py) joins its group as a detached
# alias, which shares its version counter: the group records its sources' versions when
# the engine lets go of them once their copy landed, or at a fetch before that (what the
# copy may have read), and unpacking the save raises when that version is not the one
# at its save, as plain autograd would. A write after the sources are dropped is
# ordered after the copy, which holds the saved value: backward reads that value, where
# plain raises if the tensor's object is gone (a known limit: holding the version
# counter longer would hold the device memory). Other offloaded saves and dropped
# ones still see writes only through a live original. The check assumes a version never
# goes down: a bump undone with torch.autograd._unsafe_preserve_version_counter around
# an engine call that records it (another region's exit, say) raises where plain does not.


# NOTE [Interned geometry]
# Each offloaded save keeps its shape and strides until its backward. A fresh tuple per
# save would be two more objects per save for the collector to count and walk (a
# collection runs once the live allocations it tracks grow by 700 since the last, and a
# long-sequence forward keeps thousands of saves). A model saves the same few
# geometries every step, so the save path keeps one tuple per distinct geometry
# (``interned_shape``, ``interned_stride``) and drops the fresh one; so do dropped saves'
# handles. A typed save's shape is its group's slot's, and a group keeps one tuple of
# its slots' shapes per distinct tuple, of those same kept shapes (``Group.seal`` in
# transfer.py). The tables are cleared once they hold INTERNED_MAX entries (shapes that
# keep changing).

#: Distinct geometries kept per table before it is cleared.
INTERNED_MAX = 4096
#: The kept shapes and strides (read inline on the save path: ``INTERNED_SHAPES.get(s)
#: or interned_shape(s)``).
INTERNED_SHAPES: dict[torch.Size, torch.Size] = {}
INTERNED_STRIDES: dict[tuple[int, ...], tuple[int, ...]] = {}
_G = TypeVar("_G", bound=tuple)  # type: ignore[type-arg]


def interned(table: dict[_G, _G], key: _G, make: Callable[[_G], _G] | None = None) -> _G:
    """The one kept object equal to ``key`` in ``table``: ``key`` itself, or ``make(key)``
    where given, the first time; a symbolic geometry, which does not hash, as it is (NOTE
    [Interned geometry])."""
    try:
        kept = table.get(key)
    except TypeError:
        return key
    if kept is not None:
        return kept
    if len(table) >= INTERNED_MAX:
        table.clear()
    kept = table[key] = key if make is None else make(key)
    return kept


def interned_shape(shape: torch.Size) -> torch.Size:
    """The one kept ``torch.Size`` equal to ``shape``."""
    return interned(INTERNED_SHAPES, shape)


def interned_stride(stride: tuple[int, ...]) -> tuple[int, ...]:
    """The one kept tuple equal to ``stride``."""
    return interned(INTERNED_STRIDES, stride)


class TypedHandle(weakref.ref):  # type: ignore[type-arg]
    """An OFFLOAD save that joined its group typed (NOTE [Typed sources] in transfer.py):
    it covers its storage from its first element, so its size and dtype are its slot's
    (``group.shapes`` and ``group.dtypes`` at ``rec.slot``) and its storage offset 0;
    it keeps only its strides (a contiguous tensor's strides of size-1 dimensions are
    free). Otherwise as :class:`SavedHandle`: a weak reference to the original, the
    version at save, the detach check, a weak reference to a view's base, the lease.
    Its fields are set where it is made, ``Placer._offload_new`` (hooks.py)."""

    __slots__ = ("base", "counted", "grad_fn", "lease", "pack_index", "rec", "stride", "version")
    base: weakref.ref[torch.Tensor] | None
    counted: int
    grad_fn: bool
    lease: Lease
    pack_index: int
    rec: StorageRec
    stride: tuple[int, ...]
    version: int
    offset = 0

    # Made on the save path only, field by field (``Placer._offload_new`` in hooks.py:
    # no Python call per handle), never through the class; weakref.ref's own __init__
    # would reject the fields as arguments.
    __init__ = object.__init__  # type: ignore[assignment]

    def _slot(self) -> tuple[torch.Size, torch.dtype]:
        """The slow paths' size and dtype: the slot's, or those of the source the group
        kept when its pool refused it (``rec.tensor``, of this geometry)."""
        rec = self.rec
        group = rec.group
        if group is not None:
            return group.shapes[rec.slot], group.dtypes[rec.slot]  # type: ignore[return-value]  # typed: set
        assert rec.tensor is not None
        return rec.tensor.shape, rec.tensor.dtype

    @property
    def size(self) -> torch.Size:
        return self._slot()[0]

    @property
    def dtype(self) -> torch.dtype:
        return self._slot()[1]

    def rebuild(self, storage: Any, byte_offset: int = 0) -> torch.Tensor:
        """As :meth:`SavedHandle.rebuild`."""
        return view_on(storage, byte_offset, self.dtype, self.size, self.stride, 0)


def view_on(
    storage: Any, byte_offset: int, dtype: torch.dtype, size: Any, stride: Any, offset: Any
) -> torch.Tensor:
    """A tensor of ``dtype`` with the given geometry on ``storage`` (an UntypedStorage)
    whose byte ``byte_offset`` is the first byte of the storage the geometry was taken
    on (a multiple of the element size: a group's slots are aligned)."""
    t = torch.empty(0, dtype=dtype, device=storage.device)
    if byte_offset:
        offset += byte_offset // t.element_size()
    return t.set_(storage, offset, size, stride)
