"""Unpacks of a pass's saves before its backward began, or while the pass awaits its
second one (NOTE [Double backward] in lifecycle.py): the pass's backward begins, or a
backward run inside a forward reads them (NOTE [Backward inside a forward] in
replay.py), which marks the regions whose placements must change. Once per pass or per
region, off the unpack hook's usual path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from offrecomp import _torch_compat as tc
from offrecomp.diagnostics import kind, warn_once

if TYPE_CHECKING:
    from offrecomp.lifecycle import Lifecycle
    from offrecomp.state import PassState, RegionCall, StorageRec

log = logging.getLogger("offrecomp.hooks")  # the unpack hook's record, under the hook's name

__all__ = ["outside_backward"]

_graph_task_id = tc.graph_task_id


def outside_backward(life: Lifecycle, call: RegionCall, p: PassState, rec: StorageRec | None) -> bool:
    """An unpack of ``call``'s save (``rec``'s) before its pass's backward ran, or while
    the pass awaits its second one (NOTE [Double backward]): the pass's backward
    begins (``life.backward_activity``), or it is a backward run inside a forward
    (NOTE [Backward inside a forward] in replay.py), which returns True."""
    if not (call.exited or call.is_root):
        _in_forward(call, rec)  # inside the call's own forward
        return True
    if life.forwards_running:
        _reached_from_forward(p)  # inside a later region's forward
        return True
    if p.roots_running:
        return True  # inside a root forward of the pass, between its regions' calls
    if _graph_task_id() == -1:
        return False  # read outside any backward (``grad_fn._saved_self``): none begins
    # a root save made inside a root forward of the pass is its own backward's (NOTE
    # [Saves outside the forward] in outputs.py)
    life.backward_activity(call, reached=rec is not None and rec.in_forward)
    return False


def _in_forward(call: RegionCall, rec: StorageRec | None) -> None:
    """A backward inside ``call``'s running forward unpacks one of its saves (NOTE
    [Backward inside a forward] in replay.py): not the pass's backward."""
    region = call.region
    if region is None:
        return
    call.forget_placements()  # the storages it reads are kept from now on
    if not region.backward_in_forward:
        region.backward_in_forward = True
        log.info(
            "offrecomp: region %r runs a backward inside its forward; what that backward "
            "reads is kept, and the region replays plainly",
            call.name,
        )
    if rec is not None:
        region.forward_used.add(rec.index)


def _reached_from_forward(p: PassState) -> None:
    """A backward run inside a region's forward reads a save of an earlier call or
    of the root (NOTE [Backward inside a forward]). It is not the pass's backward.
    That call's placements stand (a dropped save is regenerated then, as a forced
    recompute asks; keeping every block such a backward passes through would keep
    the whole model). A replay starts from detached inputs, so it cannot run
    that backward: the running regions keep their activations from now on, and the
    saves their calls dropped so far are held while their tensors live."""
    for c in p.calls:
        region = c.region
        if c.exited or region is None or region.reaches_out:
            continue
        region.reaches_out = True
        c.forget_placements()
        warn_once(
            f"reaches_out:{kind(region)}",
            "offrecomp: region %r (and any other like it) runs a backward through "
            "activations from before its call; a replay starts from detached inputs and "
            "cannot reproduce that, so its activations are kept",
            c.name,
        )
        for idx, w in list(c.dropped.items()):
            h = w()
            orig = h() if h is not None else None
            if orig is not None and idx not in c.replayed:
                c.replayed[idx] = orig  # handed out as if replayed
