"""The tensors a root forward returns, as the pass lifecycle watches them.

A root forward's output tensors tell the lifecycle when the pass's graphs were dropped
(NOTE [Dropped graphs] in lifecycle.py) and when a backward reached the pass (NOTE
[Saves outside the forward]).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from offrecomp import _torch_compat as tc

__all__ = ["WATCHED_OUTPUTS", "GraphMarker", "awaits_backward", "output_tensors"]


class GraphMarker:
    """Held by a root output's autograd node only (NOTE [Dropped graphs]); ``reached``
    once a backward ran that node (NOTE [Several backwards])."""

    __slots__ = ("__weakref__", "reached")

    def __init__(self) -> None:
        self.reached = False


def awaits_backward(graphs: list[tuple[Any, ...]]) -> bool:
    """Does a root forward of a pass (``graphs``: ``PassState.graphs``) have an output
    graph alive that no backward reached yet (NOTE [Several backwards] in lifecycle.py)?"""
    for refs in graphs:
        markers = [m for m in (r() for r in refs) if m is not None]
        if markers and not any(m.reached for m in markers):
            return True
    return False


#: Output tensors of a root forward that the runtime watches (NOTE [Dropped graphs]).
WATCHED_OUTPUTS = 64


def output_tensors(out: Any, limit: int = WATCHED_OUTPUTS) -> list[torch.Tensor]:
    """The first ``limit`` tensors requiring grad in a forward's output: through the
    containers pytree knows, and dataclass instances field by field. (No closure: a
    recursive one would be a cycle holding the tensors, and so the graphs, until a
    collection.)"""
    found: list[torch.Tensor] = []
    _collect(out, found, limit, 0)
    return found


def _collect(obj: Any, found: list[torch.Tensor], limit: int, depth: int) -> None:
    for leaf in tc.tree_leaves(obj):
        if len(found) >= limit:
            return
        if isinstance(leaf, torch.Tensor):
            if leaf.requires_grad:
                found.append(leaf)
        elif depth < 4 and dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            _collect([getattr(leaf, f.name, None) for f in dataclasses.fields(leaf)], found, limit, depth + 1)


