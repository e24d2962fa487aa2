"""Installing the runtime into a model: the saved-tensor hook pair, a wrapper around
every region's forward and around the model's (or, for a container, each model's) own,
and torch's global optimizer-step and buffer-registration hooks. Uninstalling puts every
slot back as it was.

NOTE [Compiled regions]
A region's saves must be the same in the forward and in its replay. That holds for a
block compiled on its own: wrapped (``torch.compile(block)``: the wrapper wraps the
compiled forward) or in place (``block.compile()``, as torchtune compiles its layers:
the runtime wraps the compiled call (``tc.COMPILED_CALL_IMPL``), not the forward inside
it, so the module's own hooks run inside the region). Either way the replay calls the same compiled graph.
A block compiled in place while the runtime is entered (after warm-up steps) has its
wrapper moved from its forward to the compiled call at the next root forward. A block
wrapped while entered or between two entries (``model.blocks[i] =
torch.compile(block)``) would have its wrapper run inside the compiled frame, which
traces it into the block's graph (the plain forward, never replayed): at the next root
forward or entry the wrapper at its name becomes the region, as if wrapped before.
Such a region is opaque, replayed whole, and its measuring pass runs no op recorder:
under a dispatch mode dynamo does not compile, and for a block it had not compiled yet
it gives up on that code for good, so the block would run eagerly in every later step.
One op stands for the compiled forward (trace.COMPILED_FORWARD). A block traced into a
larger compiled graph (``torch.compile(model)``, ``model.compile()``) saves what that
graph chose, which an eager replay cannot reproduce: its wrapper returns the plain
forward while dynamo traces it, so the model compiles to the graph it compiles to
without the runtime, and its activations are kept or offloaded (a warning names the
regions). The root's wrapper stays outside such a model's compiled frame: in the
``forward`` slot of the ``torch.compile(model)`` wrapper, which holds the compiled call,
or in the compiled call of a model compiled in place. A root wrapper dynamo traces all
the same (the runtime given the module while the loop calls a ``torch.compile(model)``
made apart, the model compiled in place inside ``with rt:``, a compiled function that
calls the model) returns the plain forward, as a region's does, and names the regions
in the warning once while dynamo traces it (``tc.at_trace_time``): the model compiles
to its graphs without the runtime, ``fullgraph=True`` included, and its saves count as
the pass's saves outside a root forward. Were the wrapper excluded from tracing
instead, dynamo would break the graph there and ``fullgraph=True`` would fail; were it
traced whole, dynamo would trace the bookkeeping, break the graph at each of its calls
and compile pieces of it. In a model that holds compiled code, the bookkeeping and the
saved-tensor hooks run under ``torch.compiler.disable``, so compiled frames never
trace them.

NOTE [Container roots]
Several models trained together (a GAN, distillation) go to one runtime in a container,
nn.ModuleDict({"gen": gen, "disc": disc}), whose forward the loop never calls: it calls
the models. The models inside a container are each wrapped as a root: a pass's signature
names the models it ran ("train|gen:(4, 12, 8):float32:cpu", and for a pass that runs
the generator and then the discriminator both, joined by " + ": NOTE [Pass
signatures]), and each kind of pass gets its own profile and plan (one shared signature
would let the longest pass type extend one profile that every pass type then runs).
"""

from __future__ import annotations

import functools
import logging
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)

from offrecomp import _torch_compat as tc
from offrecomp import backward_entry
from offrecomp.arg_state import ARG_STATE_MAX_ITEMS, ARG_STATE_PER_REGION
from offrecomp.buffers import give_writes, has_readers, watch_writes
from offrecomp.calls import RegionCalls
from offrecomp.changes import (
    count_buffer_assignment,
    count_module_assignment,
    count_parameter_assignment,
    structure_epoch,
    track_structure,
)
from offrecomp.config import Config
from offrecomp.diagnostics import (
    Diagnostics,
    checkpoints_itself,
    inside_compiled,
    kind,
    refused_transform,
    warn_compiled,
    warn_once,
    warn_other_thread,
    world_size,
)
from offrecomp.forward_patches import calls_one_of
from offrecomp.interrupts import finish
from offrecomp.lifecycle import Lifecycle
from offrecomp.native import NativeKeep
from offrecomp.outputs import output_tensors
from offrecomp.regions import (
    MODEL_NAME,
    Region,
    _compiled_in_place,
    _is_compiled,
    compiled_module,
)
from offrecomp.replay import in_replay
from offrecomp.signatures import Frozen, Part, signature_of
from offrecomp.slots import Installed, KeptWrappers, following_class, own_forward, unwrap, weak_call
from offrecomp.state import PassState, RegionCall
from offrecomp.trace import PassiveMode

__all__ = ["Installer", "holds_compiled", "signature_of"]

log = logging.getLogger(__name__)

_EVAL_FRAME_CALLBACK = tc.eval_frame_callback_getter()

Make = Callable[[Callable[..., Any]], Callable[..., Any]]


class Installer:
    """Puts the runtime's hooks and wrappers into a model and takes them out."""

    def __init__(
        self,
        model: nn.Module | None,
        regions: list[Region],
        config: Config,
        lifecycle: Lifecycle,
        calls: RegionCalls,
        diagnostics: Diagnostics,
    ) -> None:
        self._model = model
        self._regions = regions
        self._config = config
        self._life = lifecycle
        self._frozen = Frozen()  # NOTE [Frozen parameters] in signatures.py
        self._calls = calls
        self._diag = diagnostics
        self.active = False  # installed: region wrappers act
        self.compiled_model = False  # the model holds torch.compile'd code
        self.hooks_ctx: Any = None
        self._native = NativeKeep(config, weak_call(self, "_own_hooks"))  # NOTE [Wrappers and the installer] (slots.py)
        self._restore: list[Callable[[], None]] = []
        # NOTE [Forwards replaced while entered] (forward_patches.py): per region wrapped in its forward slot, its
        # wrapper and the slot's value last seen going through it
        self._forwards: dict[Region, tuple[Installed, Any]] = {}
        # NOTE [Wrappers kept across entries] (slots.py)
        self._kept = KeptWrappers()
        self._opt_hook: Any = None
        self._registration_hooks: list[Any] = []
        self._regions_epoch = -1  # structure_epoch() at the last _check_regions
        self._warned_replaced = False  # _check_regions warned (once per runtime) of replaced regions
        self._warned_added = False  # ... of modules added beside them
        self._grad_off: list[str] = []  # NOTE [Regions with gradients off]: to say at the next root forward
        # the regions' kin not chosen as regions when the runtime was made (regions=)
        self._unchosen = frozenset(_added_regions(model, regions)) if model is not None else frozenset()

    def _own_hooks(self) -> tuple[Any, Any] | None:
        """The installed hook pair (None while not installed)."""
        h = self.hooks_ctx
        return (h.pack_hook, h.unpack_hook) if h is not None else None

    def own_pack(self) -> Any:
        """The installed pack hook (None while not installed)."""
        return self.hooks_ctx.pack_hook if self.hooks_ctx is not None else None

    def install(self, pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], torch.Tensor]) -> None:
        model = self._model
        self._frozen.clear()  # parameters registered while not entered move no epoch
        self._check_outer_hooks()
        self._regions_epoch = -1  # modules assigned while not entered move no epoch: read them
        self._check_regions()
        self.compiled_model = model is not None and holds_compiled(model)
        self._calls.distributed = world_size() > 1
        self._calls.arg_state_limit = ARG_STATE_MAX_ITEMS + ARG_STATE_PER_REGION * len(self._regions)
        if self.compiled_model:
            # Saved-tensor hooks run inside compiled frames too: never compile them (nor
            # the replays they run), or dynamo traces the bookkeeping, guards on every
            # tensor's dtype and pointer, and recompiles until it gives up. Only for a
            # model that holds compiled code: the exclusion costs ~5 us per hook call.
            pack = torch.compiler.disable(pack, recursive=True)
            unpack = torch.compiler.disable(unpack, recursive=True)
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        self.hooks_ctx = hooks  # first: uninstall takes the pair off if it is on top
        hooks.__enter__()
        backward_entry.own(hooks.pack_hook, self._calls.accumulating_backward, self._life.graph_made_unseen)  # NOTE [Hooks off in backward]
        for region in self._regions:
            region.refresh()
            if region.in_place:
                self._wrap_compiled_call(region.module, self._region_forward(region), owner=region)
            else:
                wrapper = self._wrap_forward(region.module, self._region_forward(region), owner=region)
                self._forwards[region] = (wrapper, wrapper)
        own = [r for r in self._regions if checkpoints_itself(r.module)]
        if own:
            self._diag.warn_hidden(
                ", ".join(r.name for r in own), "run activation checkpointing of their own",
                kinds=tuple({kind(r) for r in own}),
            )
        if self.compiled_model and model is not None:
            inside = inside_compiled(model, self._regions)
            if inside:
                _traced([r for r in self._regions if r.name in inside])
        self._wrap_roots()
        self._kept.settle()  # NOTE [Wrappers kept across entries]: those of replaced modules go
        tc.import_dynamo()  # before torch.compiler.disable imports it on this thread
        # never traced into a compiled optimizer step (torch.compile(opt.step)): dynamo
        # would break its graph inside the bookkeeping and convert the frames it calls
        self._opt_hook = tc.register_optimizer_step_post_hook(torch.compiler.disable(self._life.on_optimizer_step))
        track_structure(model)  # NOTE [Region refresh] (changes.py)
        self._registration_hooks = [  # NOTE [Buffer saves], NOTE [Region refresh] (changes.py)
            register_module_buffer_registration_hook(count_buffer_assignment),
            register_module_parameter_registration_hook(count_parameter_assignment),
            register_module_module_registration_hook(count_module_assignment),
        ]
        if self._config.report_path and self._life.report_file is None:
            path = tc.per_rank_path(self._config.report_path)  # NOTE [Files per rank] in config.py
            self._life.report_file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self.active = True

    def _check_outer_hooks(self) -> None:
        """A saved-tensor hook pair entered around the runtime never sees a save while the
        runtime's pair is on top of it: say so, and refuse
        ``allow_mutation_on_saved_tensors``, whose exact gradients depend on its pair, and
        a ``disable_saved_tensors_hooks`` section, where torch refuses the runtime's."""
        disabled = tc.saved_tensors_hooks_disabled()
        if disabled is not None:
            raise RuntimeError(
                "offrecomp: the runtime is entered inside torch.autograd.graph."
                f"disable_saved_tensors_hooks (its message: {disabled!r}), where torch refuses "
                "the saved-tensor hook pair the runtime keeps, offloads or recomputes each "
                "save through. Enter the runtime outside that section"
            )
        if tc.top_saved_tensors_hooks() is None:
            return
        if tc.mutation_on_saved_tensors_allowed():
            raise RuntimeError(
                "offrecomp: torch.autograd.graph.allow_mutation_on_saved_tensors() is active "
                "around the runtime; it works through saved-tensor hooks of its own, which the "
                "runtime's would replace. Enter the runtime outside it, or write the saved "
                "tensors out of place"
            )
        warn_once(
            "outer_hooks",
            "offrecomp: a saved-tensor hook pair (torch.autograd.graph.saved_tensors_hooks, "
            "save_on_cpu, an activation offloader) is active around the runtime; while the "
            "runtime is entered its own pair receives every save and that one none. Enter "
            "that pair inside a region's forward to apply it there, or leave it out",
        )

    def _check_regions(self) -> None:
        """Warn once when a region's module is no longer in the model (NOTE [Region
        refresh] in changes.py); read again only after a module assignment, and at every
        entry. One moved to another name (blocks reordered) still runs as its region;
        one wrapped by torch.compile at its name runs as the wrapper (``_follow_wraps``)."""
        epoch = structure_epoch()
        model = self._model
        if epoch == self._regions_epoch or model is None:
            return
        self._regions_epoch = epoch
        self._follow_wraps()
        gone = []
        present: set[int] | None = None
        for r in self._regions:
            if r.name == MODEL_NAME:
                continue  # the model itself: no name it could be replaced at
            try:
                now = model.get_submodule(r.name) if r.name else model
            except AttributeError:
                now = None
            if now is not r.module:
                if present is None:
                    present = {id(m) for m in model.modules()}
                if id(r.module) not in present:
                    gone.append(r.name)
        if gone and not self._warned_replaced:
            self._warned_replaced = True
            log.warning(
                "offrecomp: region(s) %s are no longer the model's modules (replaced since "
                "the runtime was made); the runtime manages the modules it "
                "found then, so the new ones run plainly and their activations are kept. "
                "Make a new runtime for the model as it is now",
                _names(gone),
            )
        added = [] if self._warned_added else [
            n for n in _added_regions(model, self._regions) if n not in self._unchosen
        ]
        if added:
            self._warned_added = True
            log.warning(
                "offrecomp: module(s) %s, added beside the regions since the runtime was made, "
                "are not regions of it: they run plainly and their activations are kept. "
                "Make a new runtime for the model as it is now",
                _names(added),
            )

    def _follow_compiles(self) -> None:
        """A region compiled in place (``block.compile()``) since entry: its calls now run
        the compiled call, past its wrapped ``forward``. Its wrapper moves there, as an
        entry would have put it (NOTE [Compiled regions])."""
        for region in self._regions:
            module = region.module
            if region.in_place or getattr(module, tc.COMPILED_CALL_IMPL, None) is None:
                continue
            unwrap(module, "forward")
            self._forwards.pop(region, None)
            region.refresh()
            self._wrap_compiled_call(module, self._region_forward(region))

    def _follow_forwards(self) -> None:
        """A region whose ``forward`` was set while entered by code that does not call the
        runtime's wrapper: its wrapper goes around the new forward (NOTE [Forwards
        replaced while entered])."""
        for region, (wrapper, seen) in self._forwards.items():
            slot = region.module.__dict__.get("forward")
            if slot is not seen:
                self._forwards[region] = self._forward_replaced(region, wrapper, seen, slot)

    def _forward_replaced(self, region: Region, wrapper: Installed, seen: Any, slot: Any) -> tuple[Installed, Any]:
        """The wrapper and the slot value to look for from now on, for ``region`` whose
        ``forward`` slot holds ``slot`` (None: none) instead of ``seen``."""
        if own_forward(slot, region.module):
            return slot, slot  # one of its own wrappers, put back (a patch undone: mock.patch's exit)
        if slot is not None and calls_one_of(slot, (wrapper, seen)):
            return wrapper, slot  # a patch around the wrapper (accelerate's): its calls still go through it
        log.info(
            "offrecomp: region %s's forward was replaced while the runtime is entered (by %s); "
            "the runtime manages the new forward's calls",
            region.name, getattr(slot, "__qualname__", type(slot).__name__) if slot is not None else "the class's",
        )
        wrapper = self._wrap_forward(region.module, self._region_forward(region), first=False)
        return wrapper, wrapper

    def _follow_wraps(self) -> None:
        """A region wrapped since the runtime was made (``model.blocks[i] =
        torch.compile(block)`` while entered or between entries): the wrapper at its name,
        which its calls go through, is the region from here on, as if wrapped before; its
        wrapper moves from the block's ``forward``, where the compiled frame would trace it,
        to the wrapper's (NOTE [Compiled regions])."""
        model = self._model
        if model is None:
            return
        for region in self._regions:
            if not region.name or region.name == MODEL_NAME:
                continue
            try:
                now = model.get_submodule(region.name)
            except AttributeError:
                continue
            if now is region.module or not _is_compiled(now) or now._modules.get("_orig_mod") is not region.module:
                continue
            log.info("offrecomp: region %s is wrapped by torch.compile: its calls replay the compiled graph", region.name)
            installed = unwrap(region.module, "forward")
            region.module = now
            region.refresh()
            if installed:  # entered: its wrapper goes where an entry would have put it
                wrapper = self._wrap_forward(now, self._region_forward(region))
                self._forwards[region] = (wrapper, wrapper)

    def _wrap_roots(self) -> None:
        model = self._model
        region_modules = {id(r.module) for r in self._regions}
        if model is None or id(model) in region_modules:
            return
        if is_container(model):
            # NOTE [Container roots]: the models inside are what the loop calls
            for name, child in model.named_children():
                if id(child) not in region_modules and not is_container(child):
                    self._wrap_root(child, name)
        else:
            self._wrap_root(model, "")

    def _wrap_root(self, module: nn.Module, name: str) -> None:
        """A root's wrapper goes outside its compiled frame, if compiled itself: in the
        ``forward`` slot of a ``torch.compile(model)`` wrapper (which holds the compiled
        call), in the compiled call of a model compiled in place; inside it, dynamo would
        meet a frame it must not trace and break the graph there, and ``fullgraph=True``
        would fail (NOTE [Compiled regions])."""
        owner = ("root", name)
        if _compiled_in_place(module):
            self._wrap_compiled_call(module, self._root_forward(module, name), owner=owner)
        else:
            self._wrap_forward(module, self._root_forward(module, name), owner=owner)

    def uninstall(self) -> None:
        """Take every hook and wrapper out, to the end through interrupts (NOTE
        [Interrupts in cleanup]): each part redoes nothing when run again."""
        self.active = False
        finish(self._uninstall)

    def _uninstall(self) -> None:
        hooks = self.hooks_ctx
        if hooks is not None:
            self._native.hooks_back()  # a native call cut short before its wrapper's try
            top = tc.top_saved_tensors_hooks()
            if top is not None and top[0] is hooks.pack_hook:
                hooks.__exit__(None, None, None)
            backward_entry.disown(hooks.pack_hook, self._calls.accumulating_backward, self._life.graph_made_unseen)
            self.hooks_ctx = None  # last: a run cut short before it does the rest again
        while self._restore:
            self._restore[-1]()  # then dropped: a restore run twice finds its slot restored
            self._restore.pop()
        if self._opt_hook is not None:
            self._opt_hook.remove()
            self._opt_hook = None
        for hook in self._registration_hooks:
            hook.remove()
        self._registration_hooks = []
        self._forwards.clear()
        track_structure(None)
        if self._life.report_file is not None:
            self._life.report_file.close()
            self._life.report_file = None

    # --------------------------------------------------------------- slots

    def _wrap_forward(self, module: nn.Module, make: Make, *, first: bool = True, owner: Any = None) -> Installed:
        """Put the runtime's wrapper in ``module``'s ``forward`` slot. The ``first`` one
        registers the restore at exit, which also undoes the wrappers later put around a
        forward replaced while entered (NOTE [Forwards replaced while entered] in
        forward_patches.py): each of those gives the slot back the forward it went
        around. One made at an earlier entry for the same ``owner`` (a region, a root) is
        put back where nothing it was made for changed (NOTE [Wrappers kept across
        entries])."""
        had_instance_attr = "forward" in module.__dict__
        previous = module.__dict__.get("forward")
        wrapped = self._kept.wrapper(
            module, "forward", owner if first else None, previous, self.compiled_model,
            lambda: Installed(make(module.forward), module, "forward", previous),
        )

        def restore() -> None:
            slot = module.__dict__.get("forward")
            while own_forward(slot, module):
                if slot is wrapped:
                    if had_instance_attr:
                        module.forward = previous  # type: ignore[method-assign,assignment]
                    else:
                        module.__dict__.pop("forward", None)
                    return
                slot = slot.previous
                if slot is None:  # it went around the class's (the instance's deleted)
                    module.__dict__.pop("forward", None)
                elif not own_forward(slot, module):
                    module.forward = slot  # type: ignore[method-assign]  # the user's forward it went around
            # else patched while entered (an adapter's forward), left so: the user's now

        if first:
            # registered first: an exception landing between the two (a signal handler's)
            # leaves a restore that finds nothing to undo, never a wrapper nothing undoes
            self._restore.append(restore)
        module.forward = wrapped  # type: ignore[method-assign]
        return wrapped

    def _wrap_compiled_call(self, module: nn.Module, make: Make, owner: Any = None) -> None:
        """A region compiled in place (``block.compile()``): wrap the compiled call, not the
        forward it compiles (NOTE [Compiled regions])."""
        slot = tc.COMPILED_CALL_IMPL
        original = getattr(module, slot)
        assert original is not None
        wrapped = self._kept.wrapper(
            module, slot, owner, original, self.compiled_model, lambda: Installed(make(original), module, slot, original)
        )

        def restore() -> None:
            if getattr(module, slot) is wrapped:  # not compiled again meanwhile
                setattr(module, slot, original)

        self._restore.append(restore)  # first, as in _wrap_forward
        setattr(module, slot, wrapped)

    def _host(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Bookkeeping a wrapper runs around a forward: never traced by dynamo in a model
        that holds compiled code (NOTE [Compiled regions])."""
        return torch.compiler.disable(fn, recursive=True) if self.compiled_model else fn

    # ------------------------------------------------------------ wrappers

    def _root_forward(self, module: nn.Module, name: str = "") -> Make:
        me = weakref.ref(self)  # NOTE [Wrappers and the installer] (slots.py)

        def begin(self: Installer, args: tuple[Any, ...], kwargs: dict[str, Any], compiling: bool) -> PassState | None:
            if (
                self.active  # not a wrapper a patched forward kept past exit
                and torch.is_grad_enabled()
                and not torch.is_inference_mode_enabled()
                and not in_replay()
                and tc.current_graph_task_id() == -1
            ):
                if tc.top_saved_tensors_hooks() is None:
                    warn_other_thread()
                    return None
                life, regions = self._life, self._regions
                if (compiling or _is_compiled(module)) and regions:
                    _traced(regions)
                self._follow_compiles()
                self._follow_forwards()
                self._check_regions()
                if self._grad_off:  # NOTE [Regions with gradients off]
                    self._diag.warn_grad_off(self._grad_off)
                    self._grad_off = []
                if not life.stack.roots:  # one inside another is part of it (NOTE [Pass signatures])
                    life.next_part(_part(module, name, args, kwargs, self._frozen))
                p = life.forward_activity()
                life.stack.roots += 1
                p.roots_running += 1
                return p
            return None

        def failed(self: Installer, p: PassState, exc: BaseException, depth: int) -> None:
            try:
                self._native.hooks_back()  # NOTE [Native keep]: an interrupt at a region call's start
                self.end_stale_calls(depth)  # NOTE [Stale calls]
            finally:
                self._life.root_failed(p, exc)

        def returned(self: Installer, p: PassState, out: Any) -> None:
            if not p.calls and self._life.stack.roots == 1:  # NOTE [Regions with gradients off]
                off = [r.name for r in self._regions if r.grad_off]
                if off:
                    self._grad_off = off  # said at the next root forward, past this backward
            self._life.root_returned(p, out)

        def traced(_ctx: Any) -> None:
            self = me()
            if self is not None and self.active and self._regions:
                _traced(self._regions)

        begin_h, fail, returned_h = self._host(begin), self._host(failed), self._host(returned)

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            follow = following_class(original)  # NOTE [Class forwards patched while entered] (slots.py)

            @functools.wraps(original)
            def forward(*args: Any, **kwargs: Any) -> Any:
                fn = original if follow is None else follow()
                if torch.compiler.is_compiling():
                    # traced into a frame compiled outside the runtime's view (NOTE
                    # [Compiled regions]): the plain forward, its regions kept
                    tc.at_trace_time(traced)
                    return fn(*args, **kwargs)
                # Run eagerly while the forward it calls will be compiled (a frame dynamo
                # gave up tracing)? Only the evaluator tells.
                compiling = _EVAL_FRAME_CALLBACK is not None and bool(_EVAL_FRAME_CALLBACK())
                inst = me()  # held for the call: its end reaches the installer its start did
                if inst is None:
                    return fn(*args, **kwargs)
                depth = len(inst._life.stack.calls)
                p = begin_h(inst, args, kwargs, compiling)
                if p is None:
                    return fn(*args, **kwargs)
                try:
                    out = fn(*args, **kwargs)
                except BaseException as exc:
                    fail(inst, p, exc, depth)
                    refused = refused_transform(exc, "the model's forward")
                    if refused is not None:
                        raise refused from exc
                    raise
                returned_h(inst, p, out)
                return out

            return forward

        return make

    def _region_forward(self, region: Region) -> Make:
        me, region_ref = weakref.ref(self), weakref.ref(region)  # NOTE [Wrappers and the installer] (slots.py)
        begin_h, end_h = self._host(Installer._begin_region), self._host(Installer._end_region)
        hooks_back = self._host(NativeKeep.hooks_back)

        def traced(_ctx: Any) -> None:
            # the root's wrapper warns too, where the compiled frame is the model's; not
            # where it is a function the model's forward slot holds, which runs past it
            self, region = me(), region_ref()
            if self is not None and region is not None and self.active:
                region.traced = True
                warn_compiled(", ".join(r.name for r in self._regions))

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            follow = following_class(original)  # NOTE [Class forwards patched while entered] (slots.py)

            @functools.wraps(original)
            def forward(*args: Any, **kwargs: Any) -> Any:
                fn = original if follow is None else follow()
                if torch.compiler.is_compiling():
                    # traced into a compiled caller's graph (torch.compile(model),
                    # model.forward = torch.compile(model.forward)): the block's saves are
                    # the graph's, kept or offloaded (NOTE [Compiled regions])
                    tc.at_trace_time(traced)
                    return fn(*args, **kwargs)
                # Run eagerly while the forward it calls will be compiled (a frame dynamo
                # gave up tracing)? Only the evaluator tells.
                compiling = _EVAL_FRAME_CALLBACK is not None and bool(_EVAL_FRAME_CALLBACK())
                inst, region = me(), region_ref()  # held for the call
                if region is None:  # gone with its runtime: no call of it is left to replay
                    return fn(*args, **kwargs)
                call = None if inst is None else begin_h(inst, region, fn, args, kwargs, compiling)
                if call is None or inst is None:
                    if not has_readers() or torch.is_grad_enabled() or in_replay():
                        return fn(*args, **kwargs)
                    copies = watch_writes(region.slots)  # NOTE [Buffers written unseen] (buffers.py)
                    out = fn(*args, **kwargs)
                    give_writes(copies)
                    return out
                try:
                    out = fn(*args, **kwargs)
                except BaseException as exc:
                    end_h(inst, call, exc)
                    refused = refused_transform(exc, f"region {region.name!r} ({kind(region)})")
                    if refused is not None:
                        raise refused from exc
                    raise
                else:
                    end_h(inst, call, None, out, (args, kwargs))
                finally:
                    if call.native:  # the hooks back, also when an interrupt cut end_h short
                        hooks_back(inst._native)
                return out

            return forward

        return make

    def _begin_region(
        self, region: Region, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
        compiling: bool,
    ) -> RegionCall | None:
        if tc.current_graph_task_id() != -1:
            if self.active and torch.is_grad_enabled() and not in_replay():
                # a forward inside a backward: a reentrant checkpoint around the region
                # recomputing it (its first forward ran without grad, unseen)
                self._diag.warn_hidden(
                    region.name, "run their forward inside a backward", kinds=(kind(region),), where="around", rerun=True
                )
            return None
        if not self.active or in_replay() or self._life.stack.calls:
            return None
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            if self._life.stack.roots:  # NOTE [Regions with gradients off]
                region.grad_off = True
            return None
        if tc.top_saved_tensors_hooks() is None:  # another thread: hooks are per thread, ours are not there
            return None
        if compiling:
            _traced([region])
            return None
        life = self._life
        if life.wants_signature(region.name):
            # a pass without a root forward (NOTE [Pass signatures]): its calls' inputs
            life.next_part(_part(region.module, region.name, args, kwargs, self._frozen), region.name)
        call = self._calls.enter(region, original, args, kwargs)
        placer = self._calls.placer
        self._diag.note_entry(id(call), kind(region), placer.backward_packs if placer is not None else 0)
        call.under_mode = call.watch is not None or call.recorder is not None
        if region.mode_sensitive and not call.under_mode:
            call.passive = PassiveMode()  # NOTE [Replay], step 7: save what the recorder saw
            call.passive.__enter__()
            call.under_mode = True
        if call.watch is not None:
            call.watch.__enter__()  # beneath the recorder: its copies are not recorded
        if call.recorder is not None:
            call.recorder.start()
        else:
            self._native.enter(call, args, kwargs)  # last: from here the hooks may be off (NOTE [Native keep])
        return call

    # NOTE [Stale calls]
    # A region call is on the thread's stack of calls (``Lifecycle.stack``) from its start
    # (``RegionCalls.enter``) to its end (``RegionCalls.exit``), and every region call
    # begun while one is on it runs plainly, as a call nested in it. An interrupt (Ctrl-C,
    # a watchdog handler's exception) landing between a call's start and its wrapper's
    # ``try``, or in its end before it leaves the stack, leaves it there, its forward no
    # longer running: every later call of the runtime would then run plainly (forced
    # recompute replaying nothing, offload booking nothing, auto measuring every step),
    # and the next backward of a call recorded half plainly would diverge. The root
    # forward's wrapper knows how deep the stack was when it began: raising, it ends
    # the calls above that depth, none of which can still run (``end_stale_calls``), and
    # the runtime's exit ends all. Ending one takes off what its start entered as the
    # stacks show it (the hook pair, the recorder's, the watch's and the passive
    # dispatch modes: not from flags, which an interrupt may leave unset) and runs its
    # end's bookkeeping; its pass is aborted by the root's failure or the exit. A loop
    # that calls the blocks with no root forward around them keeps such a call until the
    # runtime exits.

    def end_stale_calls(self, depth: int) -> None:
        """End the region calls above ``depth`` on this thread's stack, whose forwards no
        longer run (NOTE [Stale calls])."""
        stack = self._life.stack.calls
        while len(stack) > depth:
            call = stack[-1]
            finish(functools.partial(self._end_stale, call))
            if stack and stack[-1] is call:
                stack.pop()

    def _end_stale(self, call: RegionCall) -> None:
        self._diag.take_entry(id(call))
        self._native.hooks_back()
        modes = tc.dispatch_mode_stack()
        recorder = call.recorder
        if recorder is not None:
            recorder.abandon(modes)
        for mode in (call.watch, call.passive):
            if mode is not None and any(m is mode for m in modes):
                mode.__exit__(None, None, None)
        self._calls.exit(call)

    def _end_region(self, call: RegionCall, exc: BaseException | None, out: Any = None, inputs: Any = None) -> None:
        entry = self._diag.take_entry(id(call))
        try:
            self._native.exit(call, exc is not None, out, inputs)  # first: the hooks go back on
            if call.recorder is not None:
                call.recorder.stop(out)  # what it returned: NOTE [Forward transients]
            if call.watch is not None:
                call.watch.__exit__(None, None, None)
                call.watch.note_outputs(output_tensors(out, sys.maxsize, grad_only=False))  # NOTE [State the first call made]
                if exc is not None:
                    call.watch = None  # a forward cut short shows nothing: watch the next
            if call.passive is not None:
                call.passive.__exit__(None, None, None)
                call.passive = None
            life = self._life
            p = call.pass_state
            if exc is not None:
                life.abort(p, exc)
                return
            if p is not None and p.named_by == call.name and not life.stack.roots:
                life.watch_graphs(p, output_tensors(out))  # a call that names a pass: NOTE [Dropped graphs]
            placer = self._calls.placer
            if entry is not None and not call.native and call.region is not None and placer is not None:
                first_node, backward_packs = entry  # saves the pack hook took: the call's, and in its backwards
                saves = call.pack_count + placer.backward_packs - backward_packs
                self._diag.check_hidden_saves(call.name, kind(call.region), saves, inputs, out, first_node)
        finally:
            self._calls.exit(call)


def _part(module: nn.Module, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], frozen: Frozen) -> Part:
    """The signature part of a call of ``module`` (a root or a region named ``name``):
    its inputs, its training flag, its parameters' dtype and which of them are frozen."""
    first = next(module.parameters(), None)
    return signature_of(
        args, kwargs, module.training, name, first.dtype if first is not None else None,
        frozen.of(module, structure_epoch()),
    )


def is_container(m: nn.Module) -> bool:
    """A module whose own forward is not defined (ModuleDict, ModuleList, a plain
    nn.Module holding models): the loop calls the modules inside it."""
    if _is_compiled(m):
        return False  # torch.compile(model): its forward slot holds the compiled call
    return isinstance(m, (nn.ModuleDict, nn.ModuleList)) or type(m).forward is nn.Module.forward


def _traced(regions: list[Region]) -> None:
    """``regions`` run inside a compiled caller, traced into its graph: marked so
    (``explain()`` names them) and named in the warning (NOTE [Compiled regions])."""
    for r in regions:
        r.traced = True
    warn_compiled(", ".join(r.name for r in regions))


def holds_compiled(model: nn.Module) -> bool:
    """Does the model hold torch.compile'd code (itself, or any submodule, wrapped or
    compiled in place)? Then the runtime's hooks and wrappers are excluded from dynamo's
    tracing: their own frames run for real, once per call (the frames they call are still
    compiled)."""
    return any(map(compiled_module, model.modules()))


def _names(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _added_regions(model: nn.Module, regions: list[Region]) -> list[str]:
    """Children of the regions' containers, of a region's class, that are no region: a
    block appended to the ``ModuleList`` of blocks after the runtime was made, or one
    that ``regions=`` left out."""
    known = {r.name for r in regions}
    kinds = {type(r.module) for r in regions}
    added = []
    for parent in sorted({r.name.rpartition(".")[0] for r in regions if r.name}):
        try:
            container = model.get_submodule(parent) if parent else model
        except AttributeError:
            continue
        for child_name, child in container.named_children():
            name = f"{parent}.{child_name}" if parent else child_name
            if type(child) in kinds and name not in known:
                added.append(name)
    return added
