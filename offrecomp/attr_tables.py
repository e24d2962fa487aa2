"""The attribute tables of a region's modules at a call's entry, which its replay starts
from (NOTE [Attributes at entry]).

NOTE [Attributes at entry]
Plain autograd never reads a module's attributes again after the forward; a replay
does. Code outside the region may change them between a call and its replay: a model's
forward scaling its blocks' LoRA layers on entry and back in a ``finally`` (diffusers'
``scale_lora_layers``: ``scaling[adapter] *= scale``, a dict changed in place), an
adapter switched between two forwards of one step (PEFT's ``set_adapter``), a
conditioning tensor the loop binds before each call (``block.ctx = c``) with two
micro-batches in flight. The forward itself may first change one in a later call (a
schedule under ``if not offrecomp.in_replay():``). A replay must run with the values
the forward read. So every call that may replay takes, at its entry, its modules'
attribute tables (shallow copies) and the contents of the plain dicts, lists and sets
among their attributes, and of the standard library's defaultdicts, OrderedDicts and
Counters (a forward's counters; ``MAX_CONTENTS`` items at most; torch's own tables are
not copied); its replay puts in the entry values of whatever differs then, and puts back
after it what it found (``swap_attrs``, ``swap_contents``). Steady state costs one
identity comparison of each table with the region's last (``same_tables``): a call
whose tables are those of the region's previous call shares its copies. A tensor with a
graph is kept as a detached alias (NOTE [Attributes with a graph] in changes.py): the
replay reads its values. Not seen: state on other objects (a config's attribute, a
global), a container nested in a container, and one over ``MAX_CONTENTS`` items.
"""

from __future__ import annotations

import collections
import operator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from offrecomp.changes import changed_attrs, without_graph

if TYPE_CHECKING:
    from offrecomp.regions import Region

__all__ = [
    "MAX_CONTENTS", "changed_since", "enter_tables", "entry_changes", "kept_tables", "same_contents", "swap_contents",
]

#: Items beyond which a container attribute's contents are not copied at entry.
MAX_CONTENTS = 64

#: The containers whose contents a call copies at entry: Python's plain ones, and the
#: standard library's dicts a forward keeps counts or caches in.
_CONTAINERS = frozenset((dict, list, set, collections.defaultdict, collections.OrderedDict, collections.Counter))
_TORCH_TABLES = frozenset(nn.Module().__dict__)  # parameters, buffers, children, hooks: restored elsewhere

Tables = list[dict[str, Any]]
Contents = list[tuple[Any, Any]]


def same_tables(modules: tuple[nn.Module, ...], tables: Tables) -> bool:
    """Does each module's attribute table hold the objects of ``tables`` under the same
    names, in the same order?"""
    is_ = operator.is_
    for m, before in zip(modules, tables):
        now = m.__dict__
        if len(now) != len(before) or not all(map(is_, now.values(), before.values())) or now.keys() != before.keys():
            return False
    return True


def changed_since(modules: tuple[nn.Module, ...], tables: Tables) -> list[tuple[nn.Module, dict[str, Any]]]:
    """The attributes of ``modules`` that differ from ``tables``, with their values there
    (``changed_attrs``), read only where ``same_tables`` finds a difference."""
    return [] if same_tables(modules, tables) else changed_attrs(modules, tables)


def same_contents(contents: Contents) -> bool:
    """Does each container hold what its copy does?"""
    return all(_same(live, copy) for live, copy in contents)


def enter_tables(region: Region, fresh: bool) -> tuple[Tables, Contents]:
    """The attribute tables and container contents of ``region``'s modules now, for a call
    entering it: the region's last ones where nothing changed (``fresh``: read anew, as
    at a signature's first pass). A new read also reads ``Region.tensor_attrs``."""
    from offrecomp.regions import tensor_attrs

    modules = region.modules
    tables = region.attr_tables
    new = fresh or tables is None or len(tables) != len(modules) or not same_tables(modules, tables)
    if new:
        tables = [dict(m.__dict__) for m in modules]
        # a table holding a graph is read anew at each call: the region keeps no graph
        # alive past its call (NOTE [Attributes with a graph] in changes.py)
        region.attr_tables = None if _holds_graph(tables) else tables
        region.attr_containers = tuple(
            (i, k) for i, t in enumerate(tables) for k, v in t.items()
            if type(v) in _CONTAINERS and k not in _TORCH_TABLES and len(v) <= MAX_CONTENTS
        )
        region.tensor_attrs = tensor_attrs(modules, tables)
    contents = region.attr_contents
    if new or contents is None or not same_contents(contents):
        contents = region.attr_contents = _copy_contents(modules, region.attr_containers)
    assert tables is not None
    return tables, contents


def kept_tables(region: Region, tables: Tables) -> Tables:
    """``tables`` as a call keeps them past its exit: a tensor with a graph as a detached
    alias (tables the region keeps hold none)."""
    if tables is region.attr_tables:
        return tables
    return [{k: without_graph(v) for k, v in t.items()} for t in tables]


def _holds_graph(tables: Tables) -> bool:
    return any(type(v) is torch.Tensor and v.grad_fn is not None for t in tables for v in t.values())


def entry_changes(modules: tuple[nn.Module, ...], tables: Tables, contents: Contents | None) -> tuple[Any, Contents]:
    """What differs now from a call's entry: the attributes with their entry values (for
    ``swap_attrs``) and the containers with their entry contents (for ``swap_contents``)."""
    return changed_since(modules, tables), [(live, copy) for live, copy in contents or () if not _same(live, copy)]


def swap_contents(contents: Contents) -> Contents:
    """Put each copy's contents into its container; returns what they held, to put back."""
    back: Contents = []
    for live, copy in contents:
        back.append((live, list(live) if isinstance(live, list) else set(live) if isinstance(live, set) else dict(live)))
        if isinstance(live, list):
            live[:] = copy
        else:
            live.clear()
            live.update(copy)
    return back


def _copy_contents(modules: tuple[nn.Module, ...], keys: tuple[tuple[int, str], ...]) -> Contents:
    out: Contents = []
    for i, k in keys:
        v: Any = modules[i].__dict__.get(k)
        if type(v) not in _CONTAINERS or len(v) > MAX_CONTENTS:
            continue
        if isinstance(v, dict):  # a plain copy: put back with clear() and update()
            out.append((v, {key: without_graph(x) for key, x in v.items()}))
        else:
            out.append((v, (list if isinstance(v, list) else set)(map(without_graph, v))))
    return out


def _same(live: Any, copy: Any) -> bool:
    try:
        return bool(live == copy)
    except (RuntimeError, TypeError, ValueError):  # a tensor's comparison has no single truth value
        return False
