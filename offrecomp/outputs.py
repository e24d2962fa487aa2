"""The tensors a root forward returns, as the pass lifecycle watches them.

A root forward's output tensors tell the lifecycle when the pass's graphs were dropped
(NOTE [Dropped graphs] in lifecycle.py) and when a backward reached the pass (NOTE
[Saves outside the forward]). The pre-hooks on their autograd nodes call back the
lifecycle through a weak method (``Reached``): a node may outlive the runtime.

NOTE [Backward without saves]
A pass learns that its backward started from the first unpack of a save it took. A pass
that took none (regions that save nothing, an identity, x * 2.5; a forward under the
user's own save_on_cpu(), whose hooks then take every save) would never see its
backward: its measuring pass would never end, and its next forwards and optimizer steps
would all join it. Such a pass watches its root output's autograd nodes instead, whose
pre-hooks run when a backward reaches them.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from offrecomp import _torch_compat as tc
from offrecomp.state import Stage

if TYPE_CHECKING:
    from offrecomp.state import PassState, RegionCall

__all__ = [
    "WATCHED_OUTPUTS",
    "GraphMarker",
    "Reached",
    "awaits_backward",
    "mark_graphs",
    "output_tensors",
    "watch_unseen_backward",
]

#: What a watched output calls, with the pass's first call, when a backward reaches it
#: while the pass is in its forward: the lifecycle's ``Lifecycle.output_reached``, held
#: weakly (None once the lifecycle is gone).
Reached = weakref.WeakMethod[Callable[["RegionCall"], None]]


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


def output_tensors(out: Any, limit: int = WATCHED_OUTPUTS, *, grad_only: bool = True) -> list[torch.Tensor]:
    """The first ``limit`` tensors in a forward's output (requiring grad, with
    ``grad_only``): through the containers pytree knows, and dataclass instances field by
    field, 4 levels deep. (No closure: a recursive one would be a cycle holding the
    tensors, and so the graphs, until a collection.)"""
    found: list[torch.Tensor] = []
    _collect(out, found, limit, 0, grad_only)
    return found


def _collect(obj: Any, found: list[torch.Tensor], limit: int, depth: int, grad_only: bool) -> None:
    for leaf in tc.tree_leaves(obj):
        if len(found) >= limit:
            return
        if isinstance(leaf, torch.Tensor):
            if leaf.requires_grad or not grad_only:
                found.append(leaf)
        elif depth < 4 and dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            fields = [getattr(leaf, f.name, None) for f in dataclasses.fields(leaf)]
            _collect(fields, found, limit, depth + 1, grad_only)


def mark_graphs(p: PassState, outs: list[torch.Tensor], reached: Reached) -> None:
    """NOTE [Dropped graphs]: mark the graphs a root forward of ``p`` returned (or a
    call of the region that names a pass without one): ``outs``, its
    ``output_tensors``; a backward that reaches one calls ``reached``."""
    refs = []
    nodes: dict[int, tuple[Any, GraphMarker]] = {}
    for t in outs:
        if t.grad_fn is not None:
            fn = t.grad_fn
            meta: dict[str, Any] = fn.metadata  # type: ignore[assignment]
            marker = meta.get("offrecomp_graph")  # a node returned twice keeps its one
            if marker is None:
                marker = meta["offrecomp_graph"] = GraphMarker()
            refs.append(weakref.ref(marker))
            nodes[id(fn)] = (fn, marker)
    if refs:
        p.graphs.append(tuple(refs))  # one entry per forward
        pref = weakref.ref(p)
        for fn, marker in nodes.values():  # NOTE [Saves outside the forward], [Several backwards]
            fn.register_prehook(functools.partial(_output_reached, reached, pref, weakref.ref(marker)))


def watch_unseen_backward(p: PassState, outs: list[torch.Tensor], reached: Reached) -> None:
    """NOTE [Backward without saves]: watch the root output (``outs``, its
    ``output_tensors``) of a pass that saved nothing through the hooks."""
    if p.stats.saved_tensors:
        return
    call = p.root if p.root is not None else (p.calls[0] if p.calls else None)
    if call is None:
        return
    hook = functools.partial(_unseen_backward, reached, weakref.ref(call))
    nodes = {id(t.grad_fn): t.grad_fn for t in outs if t.grad_fn is not None}
    for fn in nodes.values():
        fn.register_prehook(hook)
    if not nodes:  # the output is a leaf (regions that hand their input back)
        handles: list[Any] = []

        def leaf_hook(grad: torch.Tensor) -> None:
            while handles:
                handles.pop().remove()
            hook(grad)

        handles += [t.register_hook(leaf_hook) for t in outs]


# NOTE [Saves outside the forward]
# Ops between a pass's forward and its backward (the loss) save through the runtime's
# hooks into the pass's root call, and so do another model's trained in the same loop
# without a runtime of its own (the discriminator's forward between the generator's
# forward and its backward). Were a backward that reads a root call's save to begin the
# pass's backward, the other model's backward would begin and end the pass before the
# pass's own backward ran, whose replays would then count in no step. So while a pass
# watches outputs of its root forwards (NOTE [Dropped graphs]), a backward that reads its
# root call's saves does not begin it; one that reaches one of those outputs does (a
# pre-hook on each output's node, which runs before any save behind that output is
# read), and so does one that reads a region call's save, or a root save made inside a
# root forward of the pass once every such forward returned (another model's forward
# runs outside the wrapped one; a backward run inside a root forward is not the pass's).
# A model may return more tensors than are watched, and a backward through one of the
# others reads such saves only; one whose path saved nothing in the forward reads the
# loss's saves alone and begins nothing, so while its graph is held the next forward joins
# its pass (two forwards a step). The other model's saves still count in the pass's
# resident bytes and peak while they live: nothing tells them from the loss's.


def _unseen_backward(reached: Reached, cref: weakref.ref[RegionCall], _grads: Any) -> None:
    """NOTE [Backward without saves]: a backward reached a root output of a pass that
    saved nothing through the runtime's hooks."""
    fn, call = reached(), cref()
    if fn is not None and call is not None and call.pass_state is not None and call.pass_state.stage is Stage.FORWARD:
        fn(call)


def _output_reached(
    reached: Reached, pref: weakref.ref[PassState], mref: weakref.ref[GraphMarker], _grads: Any
) -> None:
    """NOTE [Saves outside the forward]: a backward reached an output of a root forward
    of a pass (or of the region call that names it): its marker ``mref`` says so (NOTE
    [Several backwards])."""
    marker = mref()
    if marker is not None:
        marker.reached = True
    fn, p = reached(), pref()
    if fn is None or p is None or p.stage is not Stage.FORWARD:
        return
    call = p.root if p.root is not None else (p.calls[0] if p.calls else None)
    if call is not None:
        fn(call)
