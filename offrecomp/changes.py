"""Changes to modules while a runtime is entered, as torch's global registration hooks
report them and region calls find them: buffer assignments (NOTE [Buffer saves]) and
new slots and children (NOTE [Region refresh]); and the plain attributes a forward
changes (NOTE [Module attributes]).

NOTE [Region refresh]
A region's modules, buffer slots and parameter slots are read when the runtime is
entered, and a replay restores exactly those (NOTE [Replay and module state]). A
module added to a block while the runtime is entered (a LoRA adapter, ``spectral_norm``,
a BatchNorm) would otherwise go unseen: its buffers updated twice, its train flag not
restored, a parameter its forward writes not watched. Assigning a module, and
registering a buffer or a parameter under a new name, bump ``structure_epoch``; a region
call that finds the epoch moved since its region was read reads it again
(``Region.refresh``), and a region the first-call watch cleared is watched again.
Torch's container methods that write ``_modules`` themselves run no registration hook:
``Sequential.insert`` and ``ModuleList.insert``, a child's ``del`` (and so both
containers' ``del c[i]`` and ``pop``), ``ModuleDict``'s ``del``, ``pop`` and ``clear``,
nor does code writing ``parent._modules[name]`` (torch.ao's ``convert``, Hugging Face's
quantized layer swaps). So a region's first call in each root forward (each call that
names a pass, where no root forward runs: ``Lifecycle.parts_begun``) also compares the
children its modules hold with those of its last read (``module_children``, about 0.1
us a module), and a difference moves the epoch as an assignment does. A change past
the hook between two calls of one region inside one root forward is seen at the next.
A region whose modules or parameter slots changed so runs another forward: the planned
calls that saved other storages than their recordings before (``Region.mismatches``,
two of which mark it variable, never recomputed) are forgotten, or an adapter added and
merged away later would keep every activation of its region for good.
Replacing a region itself (``model.blocks = ...``) is not followed: the runtime
manages the modules it found when it was made (a warning says so at the next entry);
a region wrapped by ``torch.compile`` at its name is (NOTE [Compiled regions]).
Only changes to the model's modules count (those it holds when the runtime is
entered, and those assigned into it since): a Hugging Face decoder slices its layer
list at every forward (``self.layers[:n]``, a new ModuleList each time), and modules
built inside a forward register their parameters; counted, either would refresh every
region and watch every call again at every step.
"""

from __future__ import annotations

import itertools
import operator
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from offrecomp.slots import Installed

if TYPE_CHECKING:
    from offrecomp.regions import Region

__all__ = [
    "BufferPtrs",
    "changed_attrs",
    "count_buffer_assignment",
    "count_module_assignment",
    "count_parameter_assignment",
    "count_tree_change",
    "drop_hooks_since",
    "exit_attrs",
    "exit_values",
    "forward_hooked",
    "forward_hooks",
    "forward_hooks_as",
    "forward_hooks_moved",
    "hide_hooks",
    "hook_ids",
    "hook_snapshot",
    "left_at_entry",
    "module_children",
    "module_state",
    "restore_hooks",
    "restore_tree",
    "same_entries",
    "same_objects",
    "state_as_replayed",
    "structure_epoch",
    "swap_attrs",
    "track_structure",
    "tree_snapshot",
    "without_graph",
]

#: Buffer assignments seen while a runtime is entered (NOTE [Buffer saves]).
_buffer_assignments = [0]

#: New module, buffer and parameter slots seen while a runtime is entered (NOTE [Region
#: refresh]).
_structure_changes = [0]


def structure_epoch() -> int:
    """Bumped by every module assignment and every buffer or parameter registered under
    a new name while a runtime is entered (NOTE [Region refresh])."""
    return _structure_changes[0]


_SCALARS = (int, float, bool, str, type(None))
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")
#: Every hook table of a module, of torch's global module hooks, and of a tensor (NOTE
#: [Hooks a replay registers]).
_MODULE_HOOK_TABLES = (
    *_HOOK_DICTS, "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
    "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)
_GLOBAL_HOOK_TABLES = (*_GLOBAL_HOOKS, "_global_forward_hooks_with_kwargs", "_global_forward_hooks_always_called")
_TENSOR_HOOK_TABLES = ("_backward_hooks", "_post_accumulate_grad_hooks")


def module_state(modules: tuple[nn.Module, ...]) -> tuple[Any, ...]:
    """What a forward reads of its modules besides tensors: their plain scalar attributes
    (a dropout rate, a momentum, a flag), their classes and forwards (a class's or an
    instance's ``forward`` patched between steps) and which hooks they and torch's global
    module hooks hold. Taken when a region call is recorded and compared only when a
    replay diverges from that recording (NOTE [Stale recordings] in regenerate.py)."""
    out: list[Any] = []
    for m in modules:
        out.append(tuple((k, v) for k, v in m.__dict__.items() if type(v) in _SCALARS))
        own = m.__dict__.get("forward")
        if type(own) is Installed:  # the runtime's wrapper: what it went around
            own = own.previous
        out.append((type(m), getattr(type(m), "forward", None), own))
        out.append(tuple(tuple(getattr(m, d, ())) for d in _HOOK_DICTS))
    out.append(tuple(tuple(getattr(torch.nn.modules.module, d, ())) for d in _GLOBAL_HOOKS))
    return tuple(out)


# NOTE [Hooks a replay registers]
# A forward may register a hook on first use, guarded by an attribute (``if not
# self._hooked: self.fc1.weight.register_hook(scale)``), or swap a hook at each call,
# keeping its handle in an attribute. Its replay sees those attributes as at the call's
# entry (NOTE [Module attributes]) and registers the hook again, on a parameter or a
# module that outlives the replay: the gradient would pass through both hooks from then
# on, and a swapped hook would pile up, one more per step. So a region call reads the id
# of the next hook at its entry and exit (``hook_ids``: every hook torch registers takes
# its id from one counter, the key of its entry in its table). Its replay takes the hook
# tables of the region's modules, of the tensors in their parameter and buffer slots and
# of torch's global module hooks (``hook_snapshot``), and their children, parameters,
# and the lists, dicts and sets among their attributes that hold hook handles
# (``tree_snapshot``); takes out the hooks the forward registered (``hide_hooks``),
# which the replay registers again where the forward did, so that each acts once and
# where it did; runs; and puts all of it back as it was (``restore_hooks``,
# ``restore_tree``): the hooks and handles the forward left, and a submodule it built on
# first use (a replay seeing the attribute at its entry value builds another), as after
# a plain step. A replay of a call whose forward registered no hook and changed no
# attribute takes the same path as its forward, which registered nothing: it takes no
# copies. The replay's registrations on the model's other modules (a sibling
# block, the root) are removed after it too (``drop_hooks_since``, over the modules the
# runtime knows, only where one was registered).
# The forward hooks and pre-hooks themselves are those of the call's entry: a call that
# may replay keeps its submodules' and torch's global non-empty forward hook tables with
# their items (``forward_hooks``, about a microsecond a call, where the modules hold
# none). Between a forward and its backward the loop may take out a hook the forward ran
# (a steering hook held only around the forward, ``with hook: loss = model(x)``), the
# forward may remove a hook as it ran (a one-shot hook), or the loop may register one
# (a capture hook set after the forward): the replay would compute other activations
# and every gradient would be off, silently, as under ``torch.utils.checkpoint``. So a
# replay whose tables differ from its entry's (beyond the hooks its forward registered)
# runs with the entry's (``forward_hooks_as``) and puts them back as it found them.
# Not seen: handles kept outside the model's modules (a global list), a hook table
# mutated in place past ``register_*`` and ``remove``'s ids, and a hook another thread
# registers or removes on those objects while the replay runs.


def forward_hooked(region: Region) -> bool:
    """Does any forward hook or pre-hook of ``region``'s submodules (a replay calls the
    region's own forward, not its hooks), or a global one, see the tensors their calls
    take and return (NOTE [Placeholders and hooks] in trace/structure.py)?"""
    glob = torch.nn.modules.module
    if glob._global_forward_hooks or glob._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in region.modules[1:])


#: The tables of the hooks a call of a module runs around its forward, and torch's global
#: ones (NOTE [Hooks a replay registers]).
_FORWARD_TABLES = (
    "_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)
_GLOBAL_FORWARD_TABLES = (
    "_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_with_kwargs",
    "_global_forward_hooks_always_called",
)
ForwardHooks = tuple[tuple[dict[Any, Any], tuple[Any, ...]], ...]


def forward_hooks(modules: tuple[nn.Module, ...]) -> ForwardHooks:
    """Each non-empty forward hook table of ``modules`` and of torch's global module hooks,
    with its items: the hooks their calls run (NOTE [Hooks a replay registers])."""
    glob = torch.nn.modules.module
    out = [(t, tuple(t.items())) for n in _GLOBAL_FORWARD_TABLES if (t := getattr(glob, n, None))]
    for m in modules:
        d = m.__dict__
        if d.get("_forward_hooks") or d.get("_forward_pre_hooks"):
            out += [(t, tuple(t.items())) for n in _FORWARD_TABLES if (t := d.get(n))]
    return tuple(out)


def forward_hooks_moved(entry: ForwardHooks, now: ForwardHooks, first: int, last: int) -> bool:
    """Do the tables ``now`` hold other hooks than at the call's ``entry``, besides those
    with ids in ``[first, last)`` that its forward registered?"""
    if _same_tables(now, entry):
        return False
    if last > first:
        now = tuple(
            (t, kept) for t, items in now
            if (kept := tuple((k, v) for k, v in items if not (type(k) is int and first <= k < last)))
        )
    return not _same_tables(now, entry)


def _same_tables(a: ForwardHooks, b: ForwardHooks) -> bool:
    return len(a) == len(b) and all(s is t and x == y for (s, x), (t, y) in zip(a, b))


def forward_hooks_as(entry: ForwardHooks, now: ForwardHooks, first: int = 0, last: int = 0) -> None:
    """Give the tables of ``now`` and ``entry`` the items they held at the call's entry:
    those a table gained since are taken out, those it lost put back; and after them
    those of ``now`` with ids in ``[first, last)``, which the call's forward registered
    (as its replay registers them again)."""
    for table, _ in now:
        table.clear()
    for table, items in entry:
        table.clear()
        table.update(items)
    if last > first:
        for table, items in now:
            table.update((k, v) for k, v in items if type(k) is int and first <= k < last)


def state_as_replayed(modules: tuple[nn.Module, ...], entry: ForwardHooks | None, first: int, last: int) -> tuple[Any, ...]:
    """``module_state`` of ``modules`` with the forward hooks a replay of a call runs:
    its entry's and those its forward registered (NOTE [Hooks a replay registers]), for
    comparing with a recording's (NOTE [Stale recordings] in regenerate.py)."""
    now = forward_hooks(modules[1:]) if entry is not None else None
    if entry is None or now is None or not forward_hooks_moved(entry, now, first, last):
        return module_state(modules)
    tables = hook_snapshot(modules)
    forward_hooks_as(entry, now, first, last)
    try:
        return module_state(modules)
    finally:
        restore_hooks(tables)


def hook_snapshot(modules: tuple[nn.Module, ...]) -> list[tuple[Any, str, Any, tuple[Any, ...]]]:
    """The hook tables of ``modules``, of the tensors in their parameter and buffer slots,
    and of torch's global module hooks, with what each holds: (owner, name, the table or
    None, its items) (NOTE [Hooks a replay registers])."""
    glob = torch.nn.modules.module
    tables = [(glob, n, getattr(glob, n, None)) for n in _GLOBAL_HOOK_TABLES]
    for m in modules:
        tables += _hook_tables(m)
    return [(owner, n, t, tuple(t.items()) if t else ()) for owner, n, t in tables]


def _hook_tables(m: nn.Module) -> list[tuple[Any, str, Any]]:
    """(owner, name, the table or None) of each hook table of ``m`` and of the tensors in
    its parameter and buffer slots."""
    d = m.__dict__
    out: list[tuple[Any, str, Any]] = [(m, n, d.get(n)) for n in _MODULE_HOOK_TABLES]
    for x in itertools.chain(m._parameters.values(), m._buffers.values()):
        if x is not None:
            out += [(x, n, getattr(x, n, None)) for n in _TENSOR_HOOK_TABLES]
    return out


def hook_ids() -> int:
    """The id the next hook torch registers takes: a region call reads it at its entry
    and exit (NOTE [Hooks a replay registers])."""
    return RemovableHandle.next_id


def hide_hooks(snapshot: list[tuple[Any, str, Any, tuple[Any, ...]]], first: int, last: int) -> None:
    """Take out of the tables of ``snapshot`` the hooks with ids in ``[first, last)``: those
    a call's forward registered, which its replay registers again where the forward did."""
    for _, _, table, items in snapshot:
        if items:
            for k in [k for k, _ in items if type(k) is int and first <= k < last]:
                del table[k]


def restore_hooks(snapshot: list[tuple[Any, str, Any, tuple[Any, ...]]]) -> bool:
    """Put every table of ``snapshot`` back as it was; True if any had changed."""
    changed = False
    for owner, name, table, items in snapshot:
        now = getattr(owner, name, None)
        if not now and not items:
            continue
        if now is None or (table is not None and now is not table):
            continue  # rebound since (not by registering a hook): left as it is
        if tuple(now.items()) != items:
            now.clear()
            now.update(items)
            changed = True
    return changed


def drop_hooks_since(first: int, keep: tuple[nn.Module, ...]) -> bool:
    """Remove the hooks registered since ``hook_ids()`` read ``first`` on the model's other
    modules (not ``keep``) and their parameters and buffers: a replay's, on a sibling
    block or the root (NOTE [Hooks a replay registers]); True if any."""
    last = RemovableHandle.next_id
    known = _model_modules[0]
    if last == first or known is None:
        return False
    inside = {id(m) for m in keep}
    dropped = False
    for m in list(known):
        if id(m) in inside:
            continue
        for _, _, t in _hook_tables(m):
            if t:
                for k in [k for k in t if type(k) is int and first <= k < last]:
                    del t[k]
                    dropped = True
    return dropped


def tree_snapshot(modules: tuple[nn.Module, ...]) -> list[tuple[Any, tuple[Any, ...]]]:
    """The children and parameters each of ``modules`` holds, and the lists, dicts and
    sets among their attributes that hold hook handles, with their items (NOTE [Hooks a
    replay registers])."""
    out: list[tuple[Any, tuple[Any, ...]]] = []
    for m in modules:
        out.append((m._modules, tuple(m._modules.items())))
        out.append((m._parameters, tuple(m._parameters.items())))
        for v in m.__dict__.values():
            t = type(v)
            if (t is list or t is set) and any(type(x) is RemovableHandle for x in v):
                out.append((v, tuple(v)))
            elif t is dict and any(type(x) is RemovableHandle for x in v.values()):
                out.append((v, tuple(v.items())))
    return out


def restore_tree(snapshot: list[tuple[Any, tuple[Any, ...]]]) -> bool:
    """Put every container of ``snapshot`` back as it was; True if any had changed."""
    changed = False
    for box, items in snapshot:
        now = tuple(box.items()) if isinstance(box, dict) else tuple(box)
        if same_entries(now, items):
            continue
        changed = True
        if isinstance(box, list):
            box[:] = items
        else:
            box.clear()
            box.update(items)
    return changed


def same_entries(now: tuple[Any, ...], items: tuple[Any, ...]) -> bool:
    """The same entries in the same order: objects, or (key, object) pairs, the objects
    by identity."""
    return len(now) == len(items) and all(map(_same_item, now, items))


def _same_item(a: Any, b: Any) -> bool:
    """The same entry: an object, or a (key, object) pair, by identity (a module may
    define ``__eq__``)."""
    if type(a) is tuple and type(b) is tuple:
        return a[0] == b[0] and a[1] is b[1]
    return a is b


# NOTE [Module attributes]
# A forward may set plain attributes of its modules: a lazily filled cache and the int
# that says how far it is filled (rotary-embedding-torch, older Hugging Face rotary
# embeddings), a flag set on first use, a counter. A replay restores the region's
# buffers to their values at the call's entry, so it must see those attributes as they
# were at entry too, or it skips filling a cache it was handed empty. A call takes a
# shallow copy of its modules' attribute tables at its entry (NOTE [Attributes at entry]
# in attr_tables.py: also for what code outside the call changes before its replay); at
# its exit it notes what its forward changed (``changed_attrs``, with the exit values),
# and its replay runs with the attributes as they were at entry (replay.py), then puts
# back the values it found.
#
# A forward may set an attribute only outside a replay, as its docs advise for side
# effects (``if not offrecomp.in_replay(): self.scale = schedule(step)``), and compute
# with it after (or before: an annealing after use): its replay must see the entry value
# before that guard and the value the forward set after it. A replay that asked
# ``in_replay()`` and left such an attribute at its entry value (where the forward had
# changed it) runs again, and its region's replays from then on
# (``Region.guarded_attrs``), with the forward's exit value put in at the replay's first
# ``in_replay()``: the guard itself. So a call keeps its exit values beside its entry
# ones (``exit_attrs``). A replay stopped early, before the forward's write of an
# attribute it does not guard, leaves it at its entry value too: such a replay is run
# once more, to its end, to tell the two apart.

_SKIP_ATTRS = frozenset({"training"})  # the replay sets train flags itself


_MISSING = object()


def changed_attrs(
    modules: tuple[nn.Module, ...], entry: list[dict[str, Any]]
) -> list[tuple[nn.Module, dict[str, Any]]]:
    """The attributes each module holds now that differ from ``entry`` (a value of
    another identity, or added or removed), with their entry values (``_MISSING`` for
    one added since; a tensor with a graph as a detached alias, NOTE [Attributes with a
    graph])."""
    out: list[tuple[nn.Module, dict[str, Any]]] = []
    for m, before in zip(modules, entry):
        now = m.__dict__
        diff: dict[str, Any] = {}
        for k, v in before.items():
            cur = now.get(k, _MISSING)
            if cur is not v and not _same_scalar(cur, v) and k not in _SKIP_ATTRS:
                diff[k] = without_graph(v)
        diff.update((k, _MISSING) for k in now.keys() - before.keys() if k not in _SKIP_ATTRS)
        if diff:
            out.append((m, diff))
    return out


# NOTE [Attributes with a graph]
# An attribute a forward sets to one of its tensors (``self.last = out``: a feature kept
# for a probe, a recurrent memory) holds, at the next call's entry, the previous call's
# output and so its graph, whose saved tensors' handles hold the previous call and its
# entry values: a chain through autograd's C++ nodes, which Python's collector cannot
# see, grown by every forward and never freed (not even by a backward). The entry value
# a replay needs is the tensor's values and its ``requires_grad`` (autograd saves by
# it), not its graph: it is kept as a detached alias (same storage and version
# counter), a leaf that requires grad where the tensor did.


def exit_attrs(
    changed: list[tuple[nn.Module, dict[str, Any]]],
) -> list[tuple[nn.Module, dict[str, Any], dict[str, Any]]]:
    """``changed`` (from ``changed_attrs``) with each module's values of those attributes
    now, at the forward's exit (``_MISSING``: removed; a tensor with a graph as a
    detached alias)."""
    return [(m, entry, {k: without_graph(m.__dict__.get(k, _MISSING)) for k in entry}) for m, entry in changed]


def left_at_entry(
    attrs: list[tuple[nn.Module, dict[str, Any], dict[str, Any]]], guarded: frozenset[str],
) -> set[str]:
    """The attributes of ``attrs`` (entry and exit values) not in ``guarded`` that a
    replay left at their entry values (NOTE [Module attributes])."""
    return {
        k for m, entry, _ in attrs for k, v in entry.items()
        if k not in guarded and m.__dict__.get(k, _MISSING) is v
    }


def exit_values(
    attrs: list[tuple[nn.Module, dict[str, Any], dict[str, Any]]], names: frozenset[str],
) -> list[tuple[nn.Module, dict[str, Any]]]:
    """The exit values of the ``names`` among ``attrs``, to ``swap_attrs`` in."""
    return [(m, {k: v for k, v in exit.items() if k in names}) for m, _, exit in attrs]


def without_graph(v: Any) -> Any:
    """``v``, or for a tensor with a graph a detached alias (NOTE [Attributes with a
    graph])."""
    if type(v) is torch.Tensor and v.grad_fn is not None:
        return v.detach().requires_grad_(v.requires_grad)
    return v


def _same_scalar(a: Any, b: Any) -> bool:
    return type(a) is type(b) and type(a) in _SCALARS and a == b


def swap_attrs(changed: list[tuple[nn.Module, dict[str, Any]]]) -> list[tuple[nn.Module, dict[str, Any]]]:
    """Put ``changed``'s values into the modules' tables (``MISSING``: remove); returns
    what they held, in the same form, to put back."""
    back: list[tuple[nn.Module, dict[str, Any]]] = []
    for m, values in changed:
        table = m.__dict__
        back.append((m, {k: table.get(k, _MISSING) for k in values}))
        for k, v in values.items():
            if v is _MISSING:
                table.pop(k, None)
            else:
                table[k] = v
    return back


#: The modules of the entered runtime's model, and those assigned into it since (None:
#: every assignment counts). NOTE [Region refresh]: an assignment into another module
#: changes nothing a region holds.
_model_modules: list[weakref.WeakSet[nn.Module] | None] = [None]


def track_structure(model: nn.Module | None) -> None:
    """Count the structure changes of ``model`` only (None: of every module)."""
    _model_modules[0] = weakref.WeakSet(model.modules()) if model is not None else None


def _in_model(module: nn.Module) -> bool:
    known = _model_modules[0]
    return known is None or module in known


def count_buffer_assignment(module: nn.Module, name: str, buffer: Any) -> None:
    """torch's global buffer-registration hook while a runtime is entered (it runs before
    the slot is set)."""
    _buffer_assignments[0] += 1
    if name not in module._buffers and _in_model(module):
        _structure_changes[0] += 1


def count_parameter_assignment(module: nn.Module, name: str, param: Any) -> None:
    """torch's global parameter-registration hook while a runtime is entered: a new name,
    or another object under a name (what is frozen, and the regions' parameter slots,
    may change with it)."""
    if module._parameters.get(name) is not param and _in_model(module):
        _structure_changes[0] += 1


def module_children(modules: tuple[nn.Module, ...]) -> list[Any]:
    """Every child each of ``modules`` holds, in order (a slot set to None included):
    what a region call compares with its region's last read (NOTE [Region refresh])."""
    return [c for m in modules for c in m._modules.values()]


def same_objects(a: list[Any], b: list[Any]) -> bool:
    """The same objects in the same order (by identity: a module may define ``__eq__``)."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


def count_tree_change(module: nn.Module) -> None:
    """A region call found its modules holding other children than when its region was
    read (NOTE [Region refresh]): the children were set past torch's registration hook."""
    _structure_changes[0] += 1
    known = _model_modules[0]
    if known is not None:
        known.update(module.modules())  # inserted into the model: their own changes count


def count_module_assignment(module: nn.Module, name: str, child: Any) -> None:
    """torch's global module-registration hook while a runtime is entered."""
    known = _model_modules[0]
    if known is None:
        _structure_changes[0] += 1
    elif module in known:
        _structure_changes[0] += 1
        if isinstance(child, nn.Module):
            known.update(child.modules())  # assigned into the model: its own changes count


# NOTE [Buffer saves]
# A save of one of the region's own buffers is saved as it is (NOTE [What is never
# placed]), so every save in a region with buffers asks whether its storage is one of
# theirs. Reading the buffer slots at every save cost about 0.4 us per slot (5-6 us a
# save in a block with a dozen, as BatchNorm layers give). A call reads them at its first
# save, and again only after a buffer was assigned (``module.buf = t`` and
# ``register_buffer`` run torch's global buffer-registration hook, which counts them
# while a runtime is entered). ``BufferPtrs`` checks the slots' tensors at each such
# read, so a buffer replaced before the call, even through ``_buffers`` directly, is seen.
# A pointer found is checked against its slot's buffer, and the pointers are read again
# when it is not there: a buffer moved to another allocation in place (``resize_`` to a
# larger size, ``set_``) leaves its old address behind, which a new activation may have
# by its save (a fused QAT block's per-channel scale moves at its first call, and batch
# norm's saved statistics allocated at its old address would be saved as buffers,
# missing from the recording). A save of a moved buffer's new storage before such a
# read is placed as an activation.


class BufferPtrs:
    """Storages of regions' buffers, per region call (NOTE [Buffer saves])."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[tuple[int, ...], dict[int, int]]] = {}

    def holds(self, call: Any, region: Region, ptr: int) -> bool:
        """Is ``ptr`` the storage of one of ``region``'s buffers as ``call`` (a
        RegionCall) sees them? A hit is checked against its buffer's storage now: a buffer
        resized in place (``resize_``, ``set_``: an observer's per-channel scale at its
        first call) moves to another allocation, and its old address may hold a new
        activation by then; the pointers are then read again."""
        epoch = _buffer_assignments[0]
        ptrs = call.buffer_ptrs
        if ptrs is None or call.buffer_epoch != epoch:
            ptrs = call.buffer_ptrs = self._of_region(region)
            call.buffer_epoch = epoch
        slot = ptrs.get(ptr)
        if slot is None:
            return False
        b = region.buffer_at(slot)
        if b is not None and b.untyped_storage().data_ptr() == ptr:
            return True
        ptrs = call.buffer_ptrs = self._of_region(region, again=True)
        return ptr in ptrs

    def _of_region(self, region: Region, again: bool = False) -> dict[int, int]:
        """Buffer storage pointer -> slot index; cached while the same tensors fill its
        slots (a forward may replace a buffer by assignment), read ``again`` when a
        cached pointer proved stale."""
        bufs = [(i, b) for i in range(len(region.slots)) if (b := region.buffer_at(i)) is not None]
        key = tuple(id(b) for _, b in bufs)
        hit = self._cache.get(id(region))
        if hit is not None and hit[0] == key and not again:
            return hit[1]
        ptrs = {
            int(b.untyped_storage().data_ptr()): i
            for i, b in bufs
            if type(b) is torch.Tensor and b.layout == torch.strided  # a subclass has no data pointer
        }
        self._cache[id(region)] = (key, ptrs)
        return ptrs
