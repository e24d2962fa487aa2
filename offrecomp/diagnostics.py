"""What the runtime finds out about a model and tells its user: saves another hook
took, regions traced into a compiled graph, regions that run collectives.

Each finding is a warning given once (per kind of block in the process, or per
runtime), never an error: the runtime still trains correctly, it only places less.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from offrecomp import _torch_compat as tc
from offrecomp.regions import Region, compiled_module, named_modules

if TYPE_CHECKING:
    from offrecomp.state import RegionCall

log = logging.getLogger(__name__)

__all__ = [
    "HIDDEN_CHECKS",
    "Diagnostics",
    "checkpoints_itself",
    "detached_error",
    "inside_compiled",
    "kind",
    "log_once",
    "modified_error",
    "named",
    "runs_collectives",
    "warn_compiled",
    "warn_once",
    "where_saved",
    "world_size",
]

_warned: set[str] = set()

#: Region calls of a region class checked for saves another hook took; blocks are
#: alike, so the first calls tell (the check walks the call's part of the graph).
HIDDEN_CHECKS = 8


def warn_once(key: str, msg: str, *args: Any) -> None:
    """Log ``msg`` as a warning the first time ``key`` is seen in this process."""
    log_once(key, logging.WARNING, msg, *args)


def log_once(key: str, level: int, msg: str, *args: Any) -> None:
    """Log ``msg`` at ``level`` the first time ``key`` is seen in this process."""
    if key in _warned:
        return
    _warned.add(key)
    log.log(level, msg, *args)


def warn_other_thread() -> None:
    """A forward with grad runs on a thread without the runtime's saved-tensor hooks."""
    warn_once(
        "other_thread",
        "offrecomp: the model's forward runs on a thread (%r) that did not enter the "
        "runtime; saved-tensor hooks are per thread, so it runs plainly (nothing kept, "
        "offloaded or recomputed by offrecomp, no step recorded). Enter "
        "offrecomp.runtime(...) on the thread that runs the forward.",
        threading.current_thread().name,
    )


def clear_warnings() -> None:
    """Forget the warnings given (each is given again once)."""
    _warned.clear()


def kind(region: Region) -> str:
    """The class of a region's module: warnings about "a region and any other like it"
    come once per kind of block in the process, so another model's blocks still warn."""
    cls = type(region.module)
    return f"{cls.__module__}.{cls.__qualname__}"


def named(region: Region | None, name: str = "") -> str:
    """A warning's key for one region: its name with its class, so another model's
    ``blocks.0`` of another class still warns (no region, the root's call: ``name``)."""
    return name if region is None else f"{kind(region)}:{region.name}"


# NOTE [Collective regions]
# Under auto, every rank solves its plans from its own timings, so two ranks may place a
# region differently. That is harmless for data parallelism: a replay there runs local
# ops (FSDP2's gathers happen in hooks outside the region, and its pre-forward hook
# does nothing during backward). A region whose forward runs collectives (tensor
# parallelism: its parameters are DTensors while it runs) is another matter: a replay
# on one rank alone would issue a collective that no other rank joins, and training
# would hang. Such a region is known before its first call when it holds DTensor
# parameters, and at the exit of any call that issued a collective: the process groups'
# sequence numbers moved between its entry and exit (``collective_sequence``: eager,
# functional and compiled collectives alike; an op recording sees none inside a compiled
# region). The measuring pass drops everything on every rank alike. From then on auto
# mode never drops its activations, in any pass or fallback, and plans it as KEEP or
# OFFLOAD (RegionRecord.replayable); plans are solved again. A region whose first
# collective comes in a planned step (a statistic synced after a warmup) has already
# dropped that call's saves: its replay in that step issues the collective again, which
# other ranks join only where their plans dropped it too (a warning says so).
# mode="recompute" is symmetric: every rank replays every region.


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def runs_collectives(module: nn.Module) -> bool:
    """Does the module hold DTensor parameters while it runs (tensor parallelism)? By
    name: FSDP2's sharded DTensors are swapped for plain tensors during the forward."""
    return any(type(p).__name__ == "DTensor" for p in module.parameters())


def warn_collective(region: Region, mode: str) -> None:
    if mode == "auto":
        warn_once(
            f"collective:{kind(region)}",
            "offrecomp: region %r (and any other like it) runs collectives (tensor-parallel "
            "DTensor parameters, or torch.distributed calls); each rank plans from its own "
            "timings, and a replay on one rank alone would wait forever, so auto mode keeps "
            "or offloads its activations. mode='recompute' recomputes every region on every "
            "rank.",
            region.name,
        )


def inside_compiled(model: nn.Module, regions: list[Region]) -> list[str]:
    """Regions below a compiled module (the model, or a stage holding several blocks):
    dynamo traces them into that module's graph (NOTE [Compiled regions])."""
    tops = [(name, m) for name, m in named_modules(model) if compiled_module(m)]
    return [
        r.name
        for r in regions
        if any(m is not r.module and (not name or r.name.startswith(name + ".")) for name, m in tops)
    ]


def warn_compiled(names: str) -> None:
    warn_once(
        f"compiled:{names}",
        "offrecomp: region(s) %s run inside a torch.compile'd frame (torch.compile(model), "
        "model.compile(), or a compiled function that calls them): a replay could not reproduce the compiled graph's saves, so their "
        "activations are kept or offloaded, never recomputed. To recompute with "
        "torch.compile, compile each block instead: block.compile(), or "
        "model.blocks[i] = torch.compile(model.blocks[i])",
        names,
    )


def checkpoints_itself(m: nn.Module) -> bool:
    """HF layers after gradient_checkpointing_enable(), or torch's checkpoint_wrapper."""
    return any(
        getattr(x, "gradient_checkpointing", False) is True or type(x).__name__ == "CheckpointWrapper"
        for x in m.modules()
    )


class Diagnostics:
    """Saves another saved-tensor hook took: warned once per region class and runtime.
    ``own_pack`` returns the runtime's installed pack hook (None while not installed)."""

    def __init__(self) -> None:
        self.own_pack: Callable[[], Any] = lambda: None
        self.hidden_kinds: set[str] = set()  # region classes warned of
        self.hidden_checks: dict[str, int] = {}  # per region class, calls checked (the first few tell)
        self._entries: dict[int, tuple[int, int]] = {}
        """By id of a call to check: autograd's next node number at its entry, and the
        runtime's count of saves made in a backward then (``note_entry``)."""
        self.grad_off_warned = False  # NOTE [Regions with gradients off]

    def wants_hidden_check(self, region_kind: str) -> bool:
        return region_kind not in self.hidden_kinds and self.hidden_checks.get(region_kind, 0) < HIDDEN_CHECKS

    def note_entry(self, call_id: int, region_kind: str, backward_packs: int) -> None:
        """A region call starts: where it is to be checked, the number its first
        autograd node will get (nodes are numbered in creation order on a thread), and
        ``backward_packs``, the saves the runtime's hook took in a backward so far (a
        gradient taken with create_graph inside the forward saves so)."""
        if self.wants_hidden_check(region_kind):
            self._entries[call_id] = (tc.next_sequence_nr(), backward_packs)

    def take_entry(self, call_id: int) -> tuple[int, int] | None:
        """What ``note_entry`` kept of the call ``call_id``, once (None: not to check)."""
        return self._entries.pop(call_id, None)

    def check_hidden_saves(
        self, name: str, region_kind: str, saves: int, inputs: Any, out: Any, first_node: int
    ) -> None:
        """A region call saved ``saves`` tensors through our hooks. If it returns a tensor
        it made that needs grad, and the autograd nodes it made (numbered from
        ``first_node``) between its inputs and that tensor hold more saved tensors than
        that (or a reentrant checkpoint node), a saved-tensor hook pair inside it, around
        all of it or a part (torch.utils.checkpoint, HF gradient_checkpointing_enable,
        save_on_cpu), took them: only the innermost pair runs, so offrecomp cannot place
        them, nor count them. A call that hands an input back (LayerDrop) made nothing; a
        lone Linear saved through our hooks all its graph holds."""
        self.hidden_checks[region_kind] = self.hidden_checks.get(region_kind, 0) + 1
        try:
            ins = [t for t in tc.tree_leaves(inputs) if type(t) is torch.Tensor]
            passed = {_storage_key(t) for t in ins}
            made = [
                t for t in tc.tree_leaves(out)
                if type(t) is torch.Tensor and t.requires_grad and t.grad_fn is not None and t.numel()
                and _storage_key(t) not in passed
            ]
            if not made:
                return
            in_graph, checkpoint_node = _graph_saves(made, ins, first_node)
        except (RuntimeError, NotImplementedError):  # tensors without storage (under vmap): nothing to tell
            return
        if checkpoint_node or in_graph > saves:
            if not saves:
                what = "saved no activation through offrecomp"
            elif checkpoint_node:  # its saves are the checkpoint's own, never on the graph: not counted
                what = f"saved {saves} tensor{'s' * (saves != 1)} through offrecomp"
            else:
                what = (
                    f"saved {saves} of the {in_graph} tensors its graph holds through offrecomp, "
                    f"the other {in_graph - saves} through another hook"
                )
            if checkpoint_node:
                self.warn_hidden(name, what, kinds=(region_kind,), reentrant=True)
                return
            top = tc.top_saved_tensors_hooks()
            own = self.own_pack()
            if own is not None and top is not None and top[0] is own:
                self.warn_hidden(name, what, kinds=(region_kind,))
            else:  # the call ran under a pair entered after the runtime's, around it
                self.warn_hidden(
                    name, what, kinds=(region_kind,),
                    where="around it (entered by the model's code around the region, or around the model's forward)",
                )

    def warn_hidden(
        self, names: str, what: str, *, kinds: tuple[str, ...], where: str = "inside", rerun: bool = False,
        reentrant: bool = False,
    ) -> None:
        """Once per region class (``kinds``: those of the regions named) and runtime.
        ``rerun``: the regions ran inside a backward, which a custom ``autograd.Function``
        rerunning them also does; ``reentrant``: a reentrant checkpoint inside them (an
        autograd Function, no saved-tensor hook) took the rest of their saves."""
        if self.hidden_kinds.issuperset(kinds):
            return  # the other blocks of a class are most likely alike
        self.hidden_kinds.update(kinds)
        if reentrant:
            log.warning(
                "offrecomp: region(s) %s (and any other like it: this is said once) %s, and a "
                "reentrant checkpoint inside it (torch.utils.checkpoint(use_reentrant=True), HF "
                "gradient_checkpointing_enable()) runs the rest with gradients off and again in "
                "backward: that checkpoint owns their activations, so offrecomp cannot keep, "
                "offload or recompute them. Turn it off and let offrecomp decide.",
                names, what,
            )
            return
        if rerun:  # a Function rerunning them in its backward, or a reentrant checkpoint
            log.warning(
                "offrecomp: region(s) %s (and any other like it: this is said once) %s, so "
                "something reruns them there and owns their activations: a custom "
                "autograd.Function (a reversible network, an ODE solver's adjoint) by design, "
                "or a reentrant checkpoint (torch.utils.checkpoint(use_reentrant=True), HF "
                "gradient_checkpointing_enable()) around them. offrecomp cannot keep, offload or "
                "recompute them: leave such regions out (regions=), or turn the checkpoint off "
                "and let offrecomp decide.",
                names, what,
            )
            return
        log.warning(
            "offrecomp: region(s) %s (and any other like it: this is said once) %s: a "
            "saved-tensor hook %s (torch.utils.checkpoint, "
            "HF gradient_checkpointing_enable(), checkpoint_wrapper, save_on_cpu) owns their "
            "activations, and only the innermost hook runs, so offrecomp cannot keep, offload "
            "or recompute them. Turn that off and let offrecomp decide.",
            names, what, where,
        )

    def warn_grad_off(self, names: list[str]) -> None:
        """NOTE [Regions with gradients off]: once per runtime, and not after the warning
        of regions whose forward ran inside a backward (a reentrant checkpoint)."""
        if self.grad_off_warned or self.hidden_kinds:
            return
        self.grad_off_warned = True
        log.warning(
            "offrecomp: region(s) %s ran their forward with gradients off inside a forward "
            "that trains, and no region call saved anything for its backward: autograd saved "
            "nothing of those calls, so offrecomp has nothing to keep, offload or recompute. "
            "A custom autograd.Function whose forward runs them under no_grad and reruns them "
            "in its backward (a reversible network) owns their memory by design; a frozen "
            "part under torch.no_grad() needs no activations. If they should train, run them "
            "with gradients on.",
            ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else ""),
        )


# NOTE [Regions with gradients off]
# A region whose forward runs with gradients off inside a root forward that trains (the
# root began with them on) saves nothing for backward: a reversible network runs its
# blocks inside a custom autograd.Function's forward, which autograd runs under no_grad,
# and reruns them in its backward (calling their parts, not the blocks); a frozen encoder
# runs under torch.no_grad(). Such a call is not a region call of the pass: nothing of it
# is placed, in any mode. The region remembers it (``Region.grad_off``); when a root
# forward returns and no region call of its pass ran with gradients on, the runtime is
# doing nothing for the model, which it says once, at the next root forward: a
# reentrant checkpoint around the blocks also runs them with gradients off, then again
# in the backward, where the warning of ``warn_hidden`` names the checkpoint, and
# this one stays quiet. ``explain()`` names those regions. A pass whose other regions
# train (a student beside a frozen teacher) is quiet.


def _storage_key(t: torch.Tensor) -> int:
    """The storage a tensor views, or the tensor itself for a layout without one (sparse
    tensors have no storage to ask for)."""
    return int(t.untyped_storage().data_ptr()) if t.layout == torch.strided else id(t)


def _graph_saves(
    outs: list[torch.Tensor], ins: list[torch.Tensor], first_node: int = 0, limit: int = 4096
) -> tuple[int, bool]:
    """Saved tensors held by the autograd nodes between a region's inputs and its
    outputs that the call made (numbered from ``first_node``; read as SavedTensor
    objects, never unpacked), and whether a reentrant checkpoint node is among them.
    Visits at most ``limit`` nodes."""
    # The nodes seen are held, not their ids: some torch releases (2.10, 2.11) let a
    # node's Python object go once unreferenced and make another at its next read, whose
    # id may be a freed object's (another node's), which would then count as seen.
    stop = {t.grad_fn for t in ins if t.grad_fn is not None}
    todo = [t.grad_fn for t in outs]
    seen: set[Any] = set()
    count = 0
    while todo and len(seen) < limit:
        fn = todo.pop()
        if fn is None or fn in seen or fn in stop or fn._sequence_nr() < first_node:
            continue  # made before the call (a tensor reached otherwise than as an input)
        seen.add(fn)
        if type(fn).__name__ == "CheckpointFunctionBackward":
            return count, True
        for attr in _saved_attrs(fn):
            value = getattr(fn, attr, None)
            slots = value if isinstance(value, (list, tuple)) else (value,)
            # only slots a hook pair took: not the empty slot of a save that only an
            # input needing no gradient would read, nor a wrapped number (x * 2.5)
            count += sum(s is not None and tc.saved_slot_hooked(s) for s in slots)
        todo.extend(nxt for nxt, _ in fn.next_functions)
    return count, False


_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}


def _saved_attrs(fn: Any) -> tuple[str, ...]:
    """The ``_raw_saved_*`` attributes of autograd node ``fn``'s class (its ``dir`` once)."""
    cls = type(fn)
    names = _SAVED_ATTRS.get(cls)
    if names is None:
        names = _SAVED_ATTRS[cls] = tuple(a for a in dir(fn) if a.startswith("_raw_saved_"))
    return names


# ------------------------------------------------------------ saved tensors


def modified_error(where: str, index: int | None, saved: int, now: int, t: torch.Tensor | None = None) -> RuntimeError:
    """A saved tensor written in place after its save (autograd's own wording first)."""
    what = f"save #{index}" if index is not None or t is None else f"shape {list(t.shape)}, {t.dtype}"
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an "
        f"inplace operation: offrecomp: a tensor saved for backward in {where} ({what}) is "
        f"at version {now}; expected version {saved} instead. Its gradient would be wrong. "
        "Hint: replace the in-place op (x.add_(...), x[...] = ...) with its out-of-place "
        "form, as plain autograd would also require."
    )


def detached_error(where: str, index: int | None) -> RuntimeError:
    """A saved tensor detached in place after its save."""
    what = f" (save #{index})" if index is not None else ""
    return RuntimeError(
        "Trying to use a saved tensor that has been detached in-place, i.e. with .detach_(). "
        f"offrecomp: the tensor was saved for backward in {where}{what}. Hint: use the "
        "out-of-place .detach(), as plain autograd would also require."
    )


#: Part of torch's error when a torch.func transform that differentiates starts while a
#: saved-tensor hook pair is on the thread's stack.
_TRANSFORM_REFUSAL = "don't yet support saved tensor hooks"
#: Part of torch's error when a hook pair is set on a saved tensor that has one.
_HOOKS_SET = "whose hooks have already been set"


def refused_transform(exc: BaseException, where: str | None) -> RuntimeError | None:
    """The runtime's account of torch refusing ``torch.func.grad``/``vjp``/``jacrev``/
    ``hessian`` in ``where`` (a region, the model's forward; None: the code inside
    ``with rt:`` outside every forward), or None for another error.

    Those transforms refuse to start while any saved-tensor hook pair is registered, and
    the runtime's pair is registered for every forward under it (or the call could not be
    kept, offloaded or recomputed), and from the runtime's entry to its exit on the thread
    that entered it; torch's message names neither. The same goes for a hook pair set on
    one saved tensor (``grad_fn._raw_saved_self.register_hooks``), which torch refuses on
    a save that has one: under the runtime every save has its pair; and for
    ``torch.autograd.graph.disable_saved_tensors_hooks``, which torch refuses to enter
    then, raising only the section's own message (the transforms enter one)."""
    if isinstance(exc, RuntimeError) and _HOOKS_SET in str(exc):
        return RuntimeError(
            f"offrecomp: {where or 'code inside `with rt:`'} calls register_hooks on a saved "
            "tensor (grad_fn._raw_saved_...), which torch refuses on a save that already has a "
            "hook pair, and under the runtime every save has the runtime's (it keeps, offloads "
            "or recomputes each one). Put a torch.autograd.graph.saved_tensors_hooks pair "
            "around the ops instead (the runtime's pair runs on what it returns), or train "
            "this model without the runtime (OFFRECOMP_DISABLE=1)"
        )
    if isinstance(exc, RuntimeError) and _TRANSFORM_REFUSAL not in str(exc) and tc.refused_hooks_disable(exc):
        where_pair = "from its entry to its exit" if where is None else "for every forward under it"
        return RuntimeError(
            f"offrecomp: {where or 'code inside `with rt:`'} enters "
            f"torch.autograd.graph.disable_saved_tensors_hooks (its message: {str(exc)!r}), which "
            "torch refuses while a saved-tensor hook pair is registered, and the runtime's "
            f"pair is registered {where_pair} (it keeps, offloads or recomputes each save "
            "through it). Run that code outside `with rt:`, where its saves are plain "
            "autograd's, or train this model without the runtime (OFFRECOMP_DISABLE=1)"
        )
    if not isinstance(exc, RuntimeError) or _TRANSFORM_REFUSAL not in str(exc):
        return None
    if where is None:
        return RuntimeError(
            "offrecomp: code inside `with rt:` calls torch.func.grad, vjp, jacrev or hessian, "
            "which torch refuses to run while a saved-tensor hook pair is registered, and the "
            "runtime's pair is registered from its entry to its exit. Call the transform "
            "outside `with rt:` (an evaluation, a per-sample gradient), or, where it trains "
            "the model, train it without the runtime (OFFRECOMP_DISABLE=1)"
        )
    return RuntimeError(
        f"offrecomp: {where} calls torch.func.grad, vjp, jacrev or hessian, which torch "
        "refuses to run while a saved-tensor hook pair is registered, and the runtime's pair "
        "is registered for every forward under it. Inside a forward, "
        "torch.autograd.grad(..., create_graph=True), torch.func.jacfwd, torch.func.vmap "
        "and torch.autograd.forward_ad run under the runtime; otherwise train this model "
        "without it (OFFRECOMP_DISABLE=1)"
    )


def replay_differs(*, verifying: bool = False) -> str:
    """The end of each error of a replay that computed otherwise than its forward: the two
    causes, where they are listed, and what to do (``verifying``: said by the check
    ``OFFRECOMP_VERIFY`` turns on, which it need not name)."""
    verify = "" if verifying else "; OFFRECOMP_VERIFY=1 checks the values of every replay"
    return (
        "Either state the region reads changed between its forward and its backward (a module "
        "attribute, an attention processor or an adapter switched, a submodule replaced: change "
        "such state between steps), or its forward is not a deterministic function of its "
        "inputs and RNG state (data-dependent control flow or routing). docs/reliability.md, "
        f"Known limits, lists such cases{verify}. Hint: keep this region's activations "
        "(mode='keep', or exclude it with regions=)."
    )


def where_saved(call: RegionCall) -> str:
    """Where ``call``'s saves were made, for messages."""
    return "the root (outside every region)" if call.is_root else f"region {call.name!r} (call {call.call_index})"
