"""The runtime: one context manager that owns every activation autograd saves.

``offrecomp.runtime(model, ...)`` returns a :class:`Runtime`. Entering it installs one
saved-tensor hook pair, wraps the forward of every region module (and of the model, to
read input shapes), and registers a global optimizer step hook that marks step
boundaries. Leaving it, normally or by exception, removes all of that and frees the
offload pool as soon as no saved tensor needs it. A Runtime can be entered and left
many times (e.g. once per step); what it learned (plans, timings) survives.

NOTE [Passes and steps]
A *pass* is a forward and its backward. The runtime starts a pass at the first forward
activity (a save, a region call) after the previous pass's backward began, and ends it
when the next one starts, when an optimizer steps, or when the context exits. A *step*
is what lies between optimizer steps (several passes under gradient accumulation); when
no torch optimizer ever steps, every pass is a step. An optimizer that steps inside
backward (one optimizer per parameter, stepped from a post-accumulate-grad hook, as
torchtune's ``optimizer_in_bwd`` does) ends the step when that backward ends: ending the
pass at the first parameter's update would cut its backward in two. Plans, call indices
and the memory budget are per pass: activations of one micro-batch are freed by its
backward before the next forward starts.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_buffer_registration_hook

from offrecomp import _torch_compat as tc
from offrecomp.config import Config, apply_log_level, format_bytes
from offrecomp.hooks import Placer
from offrecomp.measure import Clock, Mark
from offrecomp.planning import PlanEntry, Planner
from offrecomp.regions import (
    ARG_STATE_MAX_ITEMS,
    ArgState,
    Region,
    _is_compiled,
    buffer_of,
    capture_autocast,
    capture_buffers,
    capture_inputs,
    capture_params,
    capture_rng,
    compiled_module,
    discover_regions,
    finish_buffers,
    finish_params,
)
from offrecomp.replay import in_replay
from offrecomp.report import Report, StepRecord
from offrecomp.state import PassState, RegionCall
from offrecomp.trace import FirstCallWatch, OpRecorder
from offrecomp.verify import Verifier
from scheduler.plan import ROOT, Placement, Plan

log = logging.getLogger(__name__)

__all__ = ["Runtime", "runtime"]

KEEP, OFFLOAD, RECOMPUTE = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE

_MAX_PROVISIONAL = 16  # passes without an optimizer step before every pass counts as a step
#: Step records ``report()`` holds (the most recent; about 2 KB each). A run of a million
#: steps would otherwise hold gigabytes of host memory; OFFRECOMP_REPORT writes every step.
REPORT_MAX_STEPS = 10_000

_active_lock = threading.Lock()
_active: Runtime | None = None

#: Buffer assignments seen while a runtime is entered (NOTE [Buffer saves]).
_buffer_assignments = [0]


def _count_buffer_assignment(module: nn.Module, name: str, buffer: Any) -> None:
    _buffer_assignments[0] += 1


def runtime(
    model: nn.Module | None = None,
    *,
    budget: int | str | None = None,
    mode: str | None = None,
    regions: Any = None,
    **options: Any,
) -> Runtime:
    """Create a :class:`Runtime` for ``model``; use it as a context manager.

    ``budget``: device bytes for activations (int), a unit string (``"24GiB"``), a
    percentage of device memory (``"60%"``) or None (automatic). ``mode``: ``auto``
    (default), ``keep``, ``offload``, ``recompute`` or ``off``. ``regions``: None
    (repeated children of ``nn.ModuleList``/``nn.Sequential``/``nn.ModuleDict``), module types, or
    ``fn(module, qualified_name) -> bool``. Other options are :class:`Config` fields
    (``min_bytes``, ``host_limit``, ``prefetch``, ``verify``, ``max_overhead``, ...).
    Keyword arguments win over ``OFFRECOMP_*`` variables, which win over defaults;
    ``OFFRECOMP_DISABLE=1`` always wins.
    """
    overrides = dict(options)
    if budget is not None:
        overrides["budget"] = budget
    if mode is not None:
        overrides["mode"] = mode
    if regions is not None:
        overrides["regions"] = regions
    return Runtime(model, Config.resolve(overrides))


class _CallStack(threading.local):
    def __init__(self) -> None:
        self.calls: list[RegionCall] = []


class Runtime:
    """Owns the hooks, the per-pass state, the plans and the report. See module doc."""

    def __init__(self, model: nn.Module | None, config: Config) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        self.model = model
        self.config = config
        apply_log_level(config)
        self._regions: list[Region] = []
        if model is not None and config.active:
            self._regions = discover_regions(model, config.regions)
            if not self._regions:
                if config.regions is not None:
                    raise ValueError(
                        f"regions={config.regions!r} matched no module of {type(model).__name__}; "
                        "pass module types that occur in the model, a filter fn(module, name) -> bool "
                        "that selects some, or None for automatic discovery"
                    )
                log.warning(
                    "offrecomp: %s has no repeated blocks (children of nn.ModuleList/Sequential/ModuleDict "
                    "sharing a class), so nothing can be recomputed; activations can still be kept or "
                    "offloaded. Pass regions= to choose the modules to replay.",
                    type(model).__name__,
                )
        elif model is None and config.regions is not None:
            raise ValueError("regions= needs a model: offrecomp.runtime(model, regions=...)")
        self._buffer_ptr_cache: dict[int, tuple[tuple[int, ...], frozenset[int]]] = {}
        self._placer: Placer | None = None  # while entered: it holds the runtime
        self._verifier = Verifier()
        self._planner = Planner(_PlannerHost(self))
        self._user_plan: Plan | None = None
        self._plans: OrderedDict[str, PlanEntry] = OrderedDict()
        self._stack = _CallStack()
        self._entered = False
        self._hooks_ctx: Any = None
        self._hidden_warned = False  # a region's saves were found taken by another hook
        self._hidden_checks = 0  # region calls checked for that (the first few tell)
        self._distributed = False  # set on entry: more than one rank
        self._restore: list[Callable[[], None]] = []
        self._opt_hook: Any = None
        self._buffer_hook: Any = None
        self._pass: PassState | None = None
        self._passes = 0
        self._step_passes: list[PassState] = []
        self._steps: deque[StepRecord] = deque(maxlen=REPORT_MAX_STEPS)
        self._step_count = 0  # steps recorded (the next record's number)
        self._saw_optimizer = False
        self._stepped_in_backward = False  # an optimizer stepped inside the running backward
        self._forwards_running = 0  # region calls whose forward has not returned (any thread)
        self._no_optimizer = False
        self._explicit_steps = False
        self._provisional: list[tuple[StepRecord, list[PassState]]] = []
        self._unwritten: list[StepRecord] = []  # confirmed steps not yet written to the report file
        self._device: torch.device | None = self._model_device()
        self._clock = Clock(self._device)
        self._compiled_model = False  # set on entry: the model holds torch.compile'd code
        self._engine: Any = None
        self._closing = False  # free the pool once nothing needs it (see NOTE [Pool lifetime])
        self._engine_groups = 0
        self._signature: str | None = None
        self._family = ""  # the next pass's signature without sizes (NOTE [Borrowed plans])
        self._dims: tuple[int, ...] = ()
        self._recording = False  # an op recorder is active (measuring pass, inside a region)
        self._report_file: Any = None
        self._lock = threading.RLock()
        if config.active:
            log.info("offrecomp: %s", config.describe())
            if self._regions:
                log.info(
                    "offrecomp: %d regions (%s%s)",
                    len(self._regions),
                    ", ".join(r.name for r in self._regions[:4]),
                    ", ..." if len(self._regions) > 4 else "",
                )

    # ------------------------------------------------------------- public API

    @property
    def regions(self) -> list[str]:
        """Qualified names of the modules this runtime replays."""
        return [r.name for r in self._regions]

    @property
    def active(self) -> bool:
        """True while entered and installed (False when disabled or mode='off')."""
        return self._entered and self.config.active

    def report(self) -> Report:
        """Per-step statistics so far (a completed step appears once it has ended): the
        last ``REPORT_MAX_STEPS`` (10,000) steps; ``OFFRECOMP_REPORT`` writes every step.

        Waits for the device times of finished steps (a host sync on GPU)."""
        with self._lock:
            self._resolve(wait=True)
            cfg = {k: str(v) for k, v in vars(self.config).items() if k != "sources"}
            return Report(steps=list(self._steps), config=cfg)

    def set_plan(self, plan: Plan | None) -> None:
        """Use ``plan`` for every pass (None: back to the configured mode).

        Storages the plan does not name get ``plan.default``; illegal placements (dropping
        a region input or a root storage) fall back to KEEP.
        """
        if plan is not None and not isinstance(plan, Plan):
            raise TypeError(f"plan must be a scheduler.Plan or None, got {type(plan).__name__}")
        self._user_plan = plan

    def explain(self) -> str:
        """Per region call: placements, bytes, predicted and measured times."""
        return self._planner.explain()

    @contextlib.contextmanager
    def step(self) -> Any:
        """One explicit step, for loops automatic detection cannot follow.

        ``with rt.step(): ...`` closes a step when the block ends, whatever ran in it. It
        works inside ``with rt:`` (only the boundary) and on its own (it also enters and
        leaves the runtime around the block).
        """
        self._explicit_steps = True  # from now on only rt.step() closes steps
        if self._entered:
            yield self
            self._end_step(explicit=True)
            return
        with self:
            yield self
            self._end_step(explicit=True)

    # -------------------------------------------------------- enter and exit

    def __enter__(self) -> Runtime:
        global _active
        self._closing = False
        if not self.config.active:
            self._entered = True
            return self
        with _active_lock:
            if _active is not None:
                which = "this runtime is" if _active is self else "another offrecomp runtime is"
                raise RuntimeError(
                    f"offrecomp: {which} already active; runtimes must not nest. Enter one "
                    "runtime around the whole training loop (or exit the first one before "
                    "entering another). For several models trained together, give one "
                    "runtime a container of them: offrecomp.runtime(nn.ModuleDict("
                    "{'gen': gen, 'disc': disc}))."
                )
            _active = self
        try:
            self._install()
        except BaseException:
            self._uninstall()
            with _active_lock:
                _active = None
            raise
        self._entered = True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        global _active
        if not self.config.active:
            self._entered = False
            return
        try:
            if exc_type is not None:
                self._closing = True  # a fault: start the next entry from scratch
            if exc_type is not None and self._pass is not None:
                self._pass.aborted = True
                if issubclass(exc_type, torch.OutOfMemoryError):
                    self._on_oom(self._pass)
            if self._stepped_in_backward:
                self._optimizer_stepped()
            self._finish_pass()
            self._end_step(explicit=False, provisional=not self._saw_optimizer and not self._no_optimizer)
            self._confirm_provisional()
            self._resolve(wait=True)
        finally:
            self._uninstall()
            self._entered = False
            with _active_lock:
                if _active is self:
                    _active = None
            self._stack.calls.clear()
            self._forwards_running = 0
            self._maybe_close_engine()

    def _install(self) -> None:
        self._placer = Placer(self)
        pack, unpack = self._placer.pack, self._placer.unpack
        self._compiled_model = self.model is not None and _holds_compiled(self.model)
        self._distributed = _world_size() > 1
        if self._compiled_model:
            # Saved-tensor hooks run inside compiled frames too: never compile them (nor
            # the replays they run), or dynamo traces the bookkeeping, guards on every
            # tensor's dtype and pointer, and recompiles until it gives up. Only for a
            # model that holds compiled code: the exclusion costs ~5 us per hook call.
            pack = torch.compiler.disable(pack, recursive=True)
            unpack = torch.compiler.disable(unpack, recursive=True)
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        hooks.__enter__()
        self._hooks_ctx = hooks
        for region in self._regions:
            region.refresh()
            if region.in_place:
                self._wrap_compiled_call(region.module, self._make_region_forward(region))
            else:
                self._wrap_forward(region.module, self._make_region_forward(region))
        own = [r.name for r in self._regions if _checkpoints_itself(r.module)]
        if own:
            _warn_hidden(self, ", ".join(own), "run activation checkpointing of their own")
        if self._compiled_model and self.model is not None:
            inside = _inside_compiled(self.model, self._regions)
            if inside:
                _warn_compiled(", ".join(inside))
        region_modules = {id(r.module) for r in self._regions}
        if self.model is not None and id(self.model) not in region_modules:
            if _is_container(self.model):
                # NOTE [Container roots]: the models inside are what the loop calls
                for name, child in self.model.named_children():
                    if id(child) not in region_modules and not _is_container(child):
                        self._wrap_forward(child, self._make_root_forward(child, name))
            else:
                self._wrap_forward(self.model, self._make_root_forward(self.model))
        self._opt_hook = tc.register_optimizer_step_post_hook(self._on_optimizer_step)
        self._buffer_hook = register_module_buffer_registration_hook(_count_buffer_assignment)
        if self.config.report_path and self._report_file is None:
            self._report_file = open(self.config.report_path, "a", encoding="utf-8")  # noqa: SIM115

    def _uninstall(self) -> None:
        self._placer = None  # saved handles still reach theirs; the runtime no longer does
        if self._hooks_ctx is not None:
            hooks, self._hooks_ctx = self._hooks_ctx, None
            hooks.__exit__(None, None, None)
        while self._restore:
            self._restore.pop()()
        if self._opt_hook is not None:
            self._opt_hook.remove()
            self._opt_hook = None
        if self._buffer_hook is not None:
            self._buffer_hook.remove()
            self._buffer_hook = None
        if self._report_file is not None:
            self._report_file.close()
            self._report_file = None

    def _wrap_forward(self, module: nn.Module, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        had_instance_attr = "forward" in module.__dict__
        previous = module.__dict__.get("forward")
        original = module.forward
        wrapped = _Installed(make(original), module, "forward", previous)
        module.forward = wrapped  # type: ignore[method-assign]

        def restore() -> None:
            if had_instance_attr:
                module.forward = previous  # type: ignore[method-assign,assignment]
            else:
                module.__dict__.pop("forward", None)

        self._restore.append(restore)

    def _wrap_compiled_call(
        self, module: nn.Module, make: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> None:
        """A region compiled in place (``block.compile()``): wrap the compiled call, not the
        forward it compiles (NOTE [Compiled regions])."""
        slot = tc.COMPILED_CALL_IMPL
        original = getattr(module, slot)
        assert original is not None
        wrapped = _Installed(make(original), module, slot, original)
        setattr(module, slot, wrapped)

        def restore() -> None:
            if getattr(module, slot) is wrapped:  # not compiled again meanwhile
                setattr(module, slot, original)

        self._restore.append(restore)

    def _model_device(self) -> torch.device | None:
        if self.model is None:
            return None
        for p in self.model.parameters():
            return p.device
        for b in self.model.buffers():
            return b.device
        return None

    # ---------------------------------------------------------- forward side
    #
    # NOTE [Compiled regions]
    # A region's saves must be the same in the forward and in its replay. That holds for a
    # block compiled on its own: wrapped (``torch.compile(block)``: the wrapper wraps the
    # compiled forward) or in place (``block.compile()``, as torchtune compiles its
    # layers: the runtime wraps ``_compiled_call_impl``, not the forward inside it, so
    # the module's own hooks run inside the region). Either way the replay calls the same
    # compiled graph. Such a region is opaque, replayed whole, and its measuring pass runs
    # no op recorder: under a dispatch mode dynamo does not compile, and for a block it
    # had not compiled yet it gave up on that code for good, so the block ran eagerly in
    # every later step. One op stands for the compiled forward (trace.COMPILED_FORWARD).
    # A block traced into a larger compiled graph (``torch.compile(model)``,
    # ``model.compile()``) saves what that graph chose, which an eager replay cannot
    # reproduce: its wrapper returns the plain forward while dynamo traces it, so the
    # model compiles to the graph it compiles to without the runtime, and its
    # activations are kept or offloaded (a warning names the regions). In a model that
    # holds compiled code, the runtime's own frames are kept from dynamo: the bookkeeping
    # runs under ``torch.compiler.disable``, and the root wrapper's frame is skipped
    # (dynamo still compiles the forward it calls). Without that, dynamo traced the
    # bookkeeping, broke the graph at each of its calls and compiled pieces of it.

    def _host(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Bookkeeping a wrapper runs around a forward: never traced by dynamo in a model
        that holds compiled code (NOTE [Compiled regions])."""
        return torch.compiler.disable(fn, recursive=True) if self._compiled_model else fn

    def _wrapper(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        """A wrapper's own frame: in a model that holds compiled code, dynamo neither
        inlines it into a compiled caller (a clean graph break) nor traces it, and still
        compiles the forward it calls."""
        if not self._compiled_model:
            return forward
        _skip_frame(forward)
        return torch.compiler.disable(forward, recursive=False)

    def _make_root_forward(
        self, module: nn.Module, name: str = ""
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        rt = self

        def begin(args: tuple[Any, ...], kwargs: dict[str, Any], compiling: bool) -> PassState | None:
            if (
                torch.is_grad_enabled()
                and not torch.is_inference_mode_enabled()
                and not in_replay()
                and tc.current_graph_task_id() == -1
                and tc.top_saved_tensors_hooks() is not None  # not another thread
            ):
                if (compiling or _is_compiled(module)) and rt._regions:
                    _warn_compiled(", ".join(r.name for r in rt._regions))
                rt._signature, rt._family, rt._dims = _signature_of(args, kwargs, module.training, name)
                return rt._forward_activity()
            return None

        begin_h, fail = self._host(begin), self._host(self._on_forward_error)
        watch_h = self._host(self._watch_unseen_backward)

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def forward(*args: Any, **kwargs: Any) -> Any:
                # In a model that holds compiled code this frame runs eagerly (see
                # _wrapper); the evaluator says whether the forward it calls is compiled.
                compiling = _EVAL_FRAME_CALLBACK is not None and bool(_EVAL_FRAME_CALLBACK())
                p = begin_h(args, kwargs, compiling)
                if p is None:
                    return original(*args, **kwargs)
                try:
                    out = original(*args, **kwargs)
                except BaseException as exc:
                    fail(p, exc)
                    raise
                watch_h(p, out)
                return out

            return rt._wrapper(forward)

        return make

    def _make_region_forward(self, region: Region) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        rt = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def begin(args: tuple[Any, ...], kwargs: dict[str, Any], compiling: bool) -> RegionCall | None:
                if (
                    not rt._entered
                    or not torch.is_grad_enabled()
                    or torch.is_inference_mode_enabled()
                    or in_replay()
                    or rt._stack.calls
                    or tc.current_graph_task_id() != -1
                    # another thread: saved-tensor hooks are per thread, ours are not there
                    or tc.top_saved_tensors_hooks() is None
                ):
                    return None
                if compiling:
                    _warn_compiled(region.name)
                    return None
                call = rt._enter_region(region, original, args, kwargs)
                if call.watch is not None:
                    call.watch.__enter__()  # beneath the recorder: its copies are not recorded
                if call.recorder is not None:
                    call.recorder.start()
                return call

            def end(call: RegionCall, exc: BaseException | None, out: Any = None, inputs: Any = None) -> None:
                try:
                    if call.recorder is not None:
                        call.recorder.stop()
                    if call.watch is not None:
                        call.watch.__exit__(None, None, None)
                        if exc is not None:
                            call.watch = None  # a forward cut short shows nothing: watch the next
                    if exc is not None:
                        rt._on_forward_error(call.pass_state, exc)
                    elif (
                        not rt._hidden_warned
                        and rt._hidden_checks < HIDDEN_CHECKS
                        and not any(r.kind == "activation" for r in call.storages)
                    ):
                        rt._hidden_checks += 1
                        _check_hidden_saves(rt, region.name, call.pack_count, inputs, out)
                finally:
                    rt._exit_region(call)

            begin_h, end_h = rt._host(begin), rt._host(end)

            @functools.wraps(original)
            def forward(*args: Any, **kwargs: Any) -> Any:
                if torch.compiler.is_compiling():
                    # traced into a compiled caller's graph (torch.compile(model)): the
                    # block's saves are the graph's, kept or offloaded (NOTE [Compiled regions])
                    return original(*args, **kwargs)
                # Run eagerly while the forward it calls will be compiled (a frame dynamo
                # gave up tracing)? Only the evaluator tells.
                compiling = _EVAL_FRAME_CALLBACK is not None and bool(_EVAL_FRAME_CALLBACK())
                call = begin_h(args, kwargs, compiling)
                if call is None:
                    return original(*args, **kwargs)
                try:
                    out = original(*args, **kwargs)
                except BaseException as exc:
                    end_h(call, exc)
                    raise
                end_h(call, None, out, (args, kwargs))
                return out

            return forward

        return make

    def _enter_region(
        self, region: Region, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RegionCall:
        p = self._forward_activity()
        if p.root is not None and p.root.group is not None:
            self._issue_group(p.root)  # NOTE [Offload groups]: the root's run ends here
        n = p.call_counts.get(region.name, 0)
        p.call_counts[region.name] = n + 1
        call = RegionCall(name=region.name, call_index=n, ordinal=len(p.calls), region=region, forward_fn=original)
        call.pass_state = p
        if self._distributed and (
            region.name in self._planner.collective_regions or _runs_collectives(region.module)
        ):
            call.collective = True
            self._warn_collective(region)
        p.calls.append(call)
        self._planner.assign(p, call)
        call.fixed = self._fixed_placement(call)
        if self._device is None:
            self._device = _first_device(args, kwargs)
            self._clock = Clock(self._device)
        if self._planner.needs_capture(p, call):
            self._capture(p, call, region, args, kwargs)
        if region.writes_state:
            call.writes_state = True
        elif region.writes_state is None and call.inputs is not None and not region.compiled:
            call.watch = FirstCallWatch(call.inputs, call.params)  # NOTE [State written by its region]
        self._placement_table(call)
        self._stack.calls.append(call)
        self._forwards_running += 1
        self._recording = call.recorder is not None
        call.start_mark = self._clock.mark()
        return call

    def _warn_collective(self, region: Region) -> None:
        if self.config.mode == "auto":
            _warn_once(
                f"collective:{_kind(region)}",
                "offrecomp: region %r (and any other like it) runs collectives (tensor-parallel "
                "DTensor parameters, or torch.distributed calls); each rank plans from its own "
                "timings, and a replay on one rank alone would wait forever, so auto mode keeps "
                "or offloads its activations. mode='recompute' recomputes every region on every "
                "rank.",
                region.name,
            )

    def _capture(
        self, p: PassState, call: RegionCall, region: Region, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Keep what a replay of this call needs (see regions.py)."""
        cap = capture_inputs(args, kwargs)
        call.inputs = cap
        devices = cap.devices()
        if self._device is not None:
            devices.add(self._device)
        call.rng = capture_rng(devices)
        call.autocast = capture_autocast({d.type for d in devices})
        call.buffers = capture_buffers(region.slots)
        call.params = capture_params(region.param_slots)
        call.training = tuple(m.training for m in region.modules)
        if region.generators:  # NOTE [Private generators]
            call.generators = [(g, g.get_state()) for g in region.generators]
        if cap.objects:  # NOTE [Stateful arguments]
            call.arg_state = ArgState.capture(cap.objects)
        if p.recording or call.record:
            cuda_devs = sorted({d.index or 0 for d in devices if d.type == "cuda"})
            call.recorder = OpRecorder(
                use_cuda_events=bool(cuda_devs),
                cuda_devices=cuda_devs,
                known_ptrs=self._known_ptrs(p),
                passive=region.compiled,  # NOTE [Compiled regions]
            )
        for i, t in enumerate(cap.tensors):
            if t is None:
                continue
            assert self._placer is not None
            rec = self._placer.add_input_storage(p, call, t)
            if rec is not None and rec.placement == OFFLOAD and rec.group is not None:
                call.offloaded_inputs[i] = (rec, (tuple(t.shape), tuple(t.stride()), int(t.storage_offset()), t.dtype))

    def _exit_region(self, call: RegionCall) -> None:
        call.end_mark = self._clock.mark()
        self._forwards_running = max(0, self._forwards_running - 1)
        self._recording = False
        stack = self._stack.calls
        if stack and stack[-1] is call:
            stack.pop()
        region = call.region
        written: list[int] = []
        if region is not None:
            finish_buffers(call.buffers)
            written = finish_params(call.params)
            if call.buffers is not None and call.buffers.mutated:
                big = [
                    i
                    for i in call.buffers.mutated
                    if call.buffers.snapshots[i] is None
                    and call.buffers.objects[i] is buffer_of(*call.buffers.slots[i])
                ]
                if big:
                    _warn_once(
                        f"bigbuf:{region.name}",
                        "offrecomp: region %r mutates buffers larger than 1 MiB in its forward; "
                        "replay sees their post-forward values",
                        region.name,
                    )
        if call.watch is not None and region is not None:
            region.generators = [g for g, _ in call.watch.generators.values()]
            call.generators = list(call.watch.generators.values())
        if region is not None and call.inputs is not None and not call.writes_state:
            self._check_state_writes(region, call, written)
        if call.arg_state is not None and call.inputs is not None:
            self._check_arg_state(call)
        if call.group is not None:
            self._issue_group(call)
        if call.offloaded_inputs and call.inputs is not None:
            for i, (rec, _) in call.offloaded_inputs.items():
                if rec.placement is OFFLOAD:  # its copy is on the way: the group holds it
                    call.inputs.tensors[i] = None
        if call.recorder is not None:
            self._planner.record_structure(call)
        call.exited = True
        if not call.leased and self._placer is not None:
            self._placer.release_call(call)

    # NOTE [State written by its region]
    # A forward may write its own inputs in place: an in-place activation applied to the
    # block's input first thing (F.leaky_relu_(x)), x.mul_(scale). Autograd allows it when
    # nothing saved the input before the write. A replay starts from the captured inputs,
    # which alias the written tensors: it would start from the written values. A forward
    # may also write its parameters: a running average kept in a frozen parameter (as
    # some VQ codebooks are), nn.Embedding(max_norm=...) renormalising its weight. A
    # replay then read the written values and wrote them a second time, silently (buffers
    # are snapshotted for this, NOTE [Replay and module state]; weights are too large to
    # copy at every call). The first call of each region therefore runs under
    # FirstCallWatch (trace.py), which copies an input or a parameter just before an op
    # writes it. That call replays from the copies: an input as a fresh non-leaf, so
    # that the write is legal and the copy stays intact, and a parameter as a fresh
    # parameter in its slot, the written one put back afterwards. From then on the
    # region is known to write its state, and its activations are kept (or offloaded
    # under a plan), never dropped. (Copying the written state at every call would let
    # it recompute, for its bytes per call; the planner does not model such a copy.) A
    # write the watch cannot see (compiled code, a higher-order operator, a later call
    # that writes when the first did not) is found by versions at exit; that call's
    # replay raises, and the region is kept from then on.

    def _check_state_writes(self, region: Region, call: RegionCall, params: list[int]) -> None:
        """NOTE [State written by its region]: did this forward write its inputs, or the
        region's parameters (``params``: the slots it wrote)?"""
        cap = call.inputs
        assert cap is not None
        watched, call.watch = call.watch is not None, None
        unseen = [
            i for i, t in enumerate(cap.tensors)
            if t is not None and i not in cap.copied and int(t._version) != cap.versions[i]
        ]
        if not (cap.copied or unseen or params):
            if watched:
                region.writes_state = False
            return
        region.writes_state = True
        inputs = bool(cap.copied or unseen)
        what = " and ".join(w for w, hit in (("its own inputs", inputs), ("its parameters", params)) if hit)
        missed = bool(unseen) or (call.params is not None and bool(call.params.unseen))
        _warn_once(
            f"writes-state:{_kind(region)}" if not missed else f"writes-state-unseen:{region.name}",
            "offrecomp: region %r (and any other like it) writes %s in place in its forward "
            "(an in-place activation applied to its input first thing; a running average "
            "kept in a frozen parameter); a replay needs them as they were, so its "
            "activations are kept or offloaded from now on, never recomputed. An out-of-place "
            "op, or a buffer for such state, lets offrecomp recompute it.%s",
            region.name, what,
            "" if not missed else " This call's replay cannot be done: the write was not seen "
            "as it happened (compiled code, a higher-order operator, or a call that writes "
            "when the region's first call did not), so backward raises.",
        )

    def _check_arg_state(self, call: RegionCall) -> None:
        """NOTE [Stateful arguments]: keep the entry bindings only when the forward
        changed them."""
        entry = call.arg_state
        assert entry is not None and call.inputs is not None
        now = ArgState.capture(call.inputs.objects)
        if entry.same(now):  # for state too large to record, the part recorded
            call.arg_state = None
            return
        types = ", ".join(sorted({type(o).__name__ for o in call.inputs.objects}))
        if not (entry.complete and now.complete):
            call.arg_state = None
            _warn_once(
                f"argstate-big:{call.name}",
                "offrecomp: region %r changes the state of its arguments (%s) in its forward, "
                "and they hold more than %d bindings to track: a replay sees them as the "
                "forward left them. Hint: keep such state out of the block's arguments "
                "(for a transformers model in training: use_cache=False)",
                call.name, types, ARG_STATE_MAX_ITEMS,
            )
            return
        log.debug(
            "offrecomp: region %r changes the state of its arguments (%s); replays run on "
            "the state its forward saw",
            call.name, types,
        )

    def _current_call(self, p: PassState) -> RegionCall:
        stack = self._stack.calls
        if stack:
            return stack[-1]
        if p.root is None:
            p.root = RegionCall(name=ROOT, call_index=0, ordinal=-1)
            p.root.pass_state = p
            self._planner.assign(p, p.root)
            p.root.fixed = self._fixed_placement(p.root)
        return p.root

    def _known_ptrs(self, p: PassState) -> frozenset[int]:
        """Parameter and buffer storages, gathered once per measuring pass."""
        if p.known_ptrs is None:
            p.known_ptrs = self._model_storage_ptrs()
        return p.known_ptrs

    def _model_storage_ptrs(self) -> frozenset[int]:
        """Data pointers of every parameter and buffer (recorded passes only)."""
        if self.model is None:
            return frozenset()
        ptrs = set()
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            # Sharded parameters (FSDP2's DTensor) have no plain storage: skip them.
            if type(t) in (torch.Tensor, nn.Parameter) and t.layout == torch.strided and t.device.type != "meta":
                ptrs.add(int(t.untyped_storage().data_ptr()))
        return frozenset(ptrs)

    # NOTE [Buffer saves]
    # A save of one of the region's own buffers is saved as it is (NOTE [What is never
    # placed] in hooks.py), so every save in a region with buffers asks whether its
    # storage is one of theirs. Reading the buffer slots at every save cost about 0.4 us
    # per slot (5-6 us a save in a block with a dozen, as BatchNorm layers give). A call
    # reads them at its first save, and again only after a buffer was assigned
    # (``module.buf = t`` and ``register_buffer`` run torch's global buffer-registration
    # hook, which counts them while a runtime is entered). ``_buffer_ptrs`` checks the
    # slots' tensors at each such read, so a buffer replaced before the call, even
    # through ``_buffers`` directly, is seen.
    def _call_buffer_ptrs(self, call: RegionCall, region: Region) -> frozenset[int]:
        epoch = _buffer_assignments[0]
        ptrs = call.buffer_ptrs
        if ptrs is None or call.buffer_epoch != epoch:
            ptrs = call.buffer_ptrs = self._buffer_ptrs(region)
            call.buffer_epoch = epoch
        return ptrs

    def _buffer_ptrs(self, region: Region) -> frozenset[int]:
        """Storages of the region's buffers, cached while the same tensors fill its slots
        (a forward may replace a buffer by assignment)."""
        bufs = region.buffers
        key = tuple(map(id, bufs))
        hit = self._buffer_ptr_cache.get(id(region))
        if hit is not None and hit[0] == key:
            return hit[1]
        ptrs = frozenset(
            int(b.untyped_storage().data_ptr())
            for b in bufs
            if type(b) is torch.Tensor and b.layout == torch.strided  # a subclass has no data pointer
        )
        self._buffer_ptr_cache[id(region)] = (key, ptrs)
        return ptrs

    def _fixed_placement(self, call: RegionCall) -> Placement | None:
        """The placement every new storage of ``call`` gets whatever its index: a forced
        keep or offload (OFFLOAD still keeps storages under ``min_bytes``), when no plan
        and no rule of ``_placement_for`` can vary it. None: ask ``_placement_for``."""
        region = call.region
        if self._user_plan is not None or (
            region is not None and (region.reaches_out or region.backward_in_forward)
        ):
            return None
        mode = self.config.mode
        return KEEP if mode == "keep" else OFFLOAD if mode == "offload" else None

    # NOTE [Placement table]
    # A planned call's placements are known when it begins, so the pack hook should not
    # decide each new storage again: ``_placement_table`` applies ``_placement_for``'s
    # rules to the plan once per call (a storage the profile marks external is kept,
    # unless the most frugal plan drops it; a drop the call cannot replay is kept; an
    # offload under min_bytes is kept), and the
    # hook reads the k-th entry when the storage has the planned size. Anything else (a
    # size the plan did not see, a region input, a borrowed plan, a region whose forward
    # runs a backward) goes through ``_placement_for``, which also handles the mismatch.

    def _placement_table(self, call: RegionCall) -> None:
        """Fill ``call.table`` (NOTE [Placement table]) for a planned call."""
        placements, structure, region = call.placements, call.structure, call.region
        if (
            placements is None or structure is None or region is None or call.fixed is not None
            or call.borrowed_sizes is not None or call.mismatch
            or region.reaches_out or region.backward_in_forward
        ):
            return
        recs = structure.storage_records
        min_bytes = self.config.min_bytes
        droppable = (
            call.inputs is not None and not call.writes_state
            and not (call.collective and self.config.mode == "auto")
        )
        small = structure.small_storages  # NOTE [Small storages] (planning.py)
        table = []
        for i, (pl, r) in enumerate(zip(placements, recs)):
            if r.kind == "external" and not (pl == RECOMPUTE and i in small):
                pl = KEEP
            if (pl == RECOMPUTE and not droppable) or (pl == OFFLOAD and r.nbytes < min_bytes):
                pl = KEEP
            table.append(pl)
        call.table = table
        call.table_sizes = [r.nbytes for r in recs[: len(table)]]

    def _placement_for(self, p: PassState, call: RegionCall, index: int, nbytes: int, *, kind: str) -> Placement:
        """Placement of a new storage: plan or mode, then legality.

        Storages under ``min_bytes`` are never offloaded (a copy costs more than it
        saves); dropping them is free when their region replays anyway, so forced
        recompute drops them like torch.utils.checkpoint does, and plans keep them.
        """
        region = call.region
        if region is not None and (region.reaches_out or (region.forward_used and index in region.forward_used)):
            return KEEP  # NOTE [Backward inside a forward]: read in the forward, or not replayable
        wanted = self._planner.placement(p, call, index, nbytes, kind)
        if wanted == RECOMPUTE and (call.inputs is None or kind != "activation"):
            return KEEP  # the root, a region input, or a call without a replay checkpoint
        if wanted == OFFLOAD and nbytes < self.config.min_bytes:
            return KEEP
        return wanted

    # ------------------------------------------------------------ pass cycle

    def _forward_activity(self, *, between_backwards: bool = False) -> PassState:
        """The pass a save or a forward belongs to; a new one after a backward.
        ``between_backwards``: a save outside any forward (the root's ops), which belongs
        to a pass awaiting its second backward (NOTE [Double backward])."""
        p = self._pass
        if between_backwards and p is not None and p.awaiting and not p.aborted:
            return p
        if p is None or p.backward_started or p.aborted:
            if p is not None and self._stepped_in_backward:
                self._optimizer_stepped()  # its backward's end went unseen: end the step now
            elif p is not None:
                self._finish_pass()
            p = self._begin_pass()
        return p

    def _begin_pass(self) -> PassState:
        sig = self._signature or "unknown"
        p = PassState(index=self._passes, signature=sig, mode=self.config.mode)
        if self._signature is not None:
            p.family, p.dims = self._family, self._dims
        self._signature, self._family, self._dims = None, "", ()
        self._passes += 1
        self._planner.begin_pass(p)
        p.start_time = time.perf_counter()
        p.start_mark = self._clock.mark()
        if self._device is not None and self._device.type == "cuda":
            p.alloc_start = torch.cuda.memory_allocated(self._device)
            torch.cuda.reset_peak_memory_stats(self._device)
        self._pass = p
        return p

    # NOTE [Double backward]
    # A gradient penalty (WGAN-GP, StyleGAN's R1) differentiates the forward's graph with
    # create_graph=True, then the loss that holds the penalty is differentiated again:
    # two backwards of one pass. The first used to end the pass, and the penalty's ops and
    # the second backward, with its replays, made a pass of their own that the plan never
    # saw (a planned step measured 2x its prediction). Now a backward that saves tensors
    # outside any region's forward (create_graph) leaves its pass awaiting: saves outside
    # a forward still belong to it, the next backward that reads its saves ends it, and a
    # new forward or an optimizer step ends it if none does. The pass's backward then
    # spans both, as its step does.

    def _backward_activity(self, call: RegionCall) -> None:
        p = call.pass_state
        if p is None:
            return
        if p.backward_started:
            task = tc.current_graph_task_id()
            if p.awaiting and task != p.backward_task:  # NOTE [Double backward]: the next one
                p.awaiting = False
                p.backward_task = task
                with contextlib.suppress(RuntimeError):
                    tc.queue_backward_callback(functools.partial(self._backward_done, weakref.ref(p)))
            return
        p.backward_started = True
        p.backward_task = tc.current_graph_task_id()
        p.backward_start_mark = self._clock.mark()
        if p.root is not None and p.root.group is not None:
            self._issue_group(p.root)  # NOTE [Offload groups]: the last run of root saves
        with contextlib.suppress(RuntimeError):
            tc.queue_backward_callback(functools.partial(self._backward_done, weakref.ref(p)))

    # NOTE [Backward without saves]
    # A pass learns that its backward started from the first unpack of a save it took.
    # A pass that took none (regions that save nothing, an identity, x * 2.5; a forward
    # under the user's own save_on_cpu(), whose hooks then take every save) would never
    # see its backward: its measuring pass would never end, and its next forwards and
    # optimizer steps would all join it. Such a pass watches its root output's autograd
    # nodes instead, whose pre-hooks run when a backward reaches them.

    def _watch_unseen_backward(self, p: PassState, out: Any) -> None:
        if p.stats.saved_tensors or p is not self._pass or p.backward_started:
            return
        call = p.root if p.root is not None else (p.calls[0] if p.calls else None)
        if call is None:
            return
        hook = functools.partial(_unseen_backward, weakref.ref(self), weakref.ref(call))
        outs = [t for t in tc.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad][:8]
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

    def _backward_done(self, pref: weakref.ref[PassState]) -> None:
        p = pref()
        if p is None:
            return
        p.backward_end_mark = self._clock.mark()
        if p.create_graph and p is self._pass:
            p.create_graph = False
            p.awaiting = True  # NOTE [Double backward]: a later backward differentiates it
            p.double_backward = True
            return
        p.backward_done = True
        if p is self._pass:
            if self._stepped_in_backward:
                self._optimizer_stepped()  # NOTE [Passes and steps]: optimizer in backward
            else:
                self._finish_pass()  # the pass is over: plan, account, maybe close the step

    def _finish_pass(self) -> None:
        p = self._pass
        if p is None:
            return
        if p.awaiting:  # NOTE [Double backward]: no second backward came
            p.awaiting = False
            p.backward_done = True
        self._pass = None
        p.end_time = time.perf_counter()
        if self._device is not None and self._device.type == "cuda":
            p.device_peak = int(torch.cuda.max_memory_allocated(self._device)) - p.alloc_start
        calls = p.calls if p.root is None else [*p.calls, p.root]
        for call in calls:  # counted here, not on the save path
            p.stats.saved_tensors += call.pack_count
            p.stats.storages += len(call.storages)
            p.stats.replays += call.replays
            p.stats.served_ops += call.served_ops
            p.stats.rerun_ops += call.rerun_ops
        if self._engine is not None:
            p.offload_stats = self._engine.end_step()
        self._planner.end_pass(p)
        self._step_passes.append(p)
        if not self._saw_optimizer and not self._explicit_steps:
            self._end_step(explicit=False, provisional=not self._no_optimizer)

    def _on_optimizer_step(self, *_: Any) -> None:
        if self._explicit_steps:
            return  # the user marks steps with rt.step()
        if tc.current_graph_task_id() != -1:
            self._stepped_in_backward = True  # the step ends with this backward
            return
        self._optimizer_stepped()

    def _optimizer_stepped(self) -> None:
        self._stepped_in_backward = False
        p = self._pass
        if p is not None and p.backward_started:
            self._finish_pass()
        if not self._saw_optimizer and self._provisional:
            # NOTE [Passes and steps]: until the first optimizer step every pass was a
            # provisional step; they were micro-batches of this one.
            merged: list[PassState] = []
            for rec, passes in self._provisional:
                with contextlib.suppress(ValueError):  # already out of the bounded report
                    self._steps.remove(rec)
                self._step_count -= 1
                self._planner.discard(rec)
                merged += passes
            self._provisional = []
            self._step_passes = merged + self._step_passes
        self._saw_optimizer = True
        self._end_step(explicit=False)

    def _end_step(self, *, explicit: bool, provisional: bool = False) -> None:
        if explicit and self._pass is not None:
            self._finish_pass()
        passes, self._step_passes = self._step_passes, []
        if not passes:
            return
        rec = self._planner.step_record(self._step_count, passes)
        self._step_count += 1
        if self._step_count == REPORT_MAX_STEPS + 1:
            log.info(
                "offrecomp: the report holds the last %d steps; older ones leave it from now "
                "on (OFFRECOMP_REPORT=path writes every step)",
                REPORT_MAX_STEPS,
            )
        self._steps.append(rec)
        if provisional:
            self._provisional.append((rec, passes))
            if len(self._provisional) > _MAX_PROVISIONAL:
                self._no_optimizer = True  # no torch optimizer in this loop: a pass is a step
                self._confirm_provisional()
            else:
                self._resolve(wait=False)  # times and learning now; writing once confirmed
            return
        self._unwritten.append(rec)
        self._resolve(wait=False)

    def _confirm_provisional(self) -> None:
        self._unwritten += [rec for rec, _ in self._provisional]
        self._provisional = []
        self._resolve(wait=False)

    def _resolve(self, *, wait: bool) -> None:
        """Fill step times whose events landed; write confirmed, timed records in order."""
        self._planner.resolve(wait=wait)
        untimed = self._planner.pending_ids()
        while self._unwritten and id(self._unwritten[0]) not in untimed:
            rec = self._unwritten.pop(0)
            if self._report_file is not None:
                import json

                self._report_file.write(json.dumps(rec.to_dict()) + "\n")
                self._report_file.flush()

    def _on_forward_error(self, p: PassState | None, exc: BaseException) -> None:
        """An exception left the forward: the pass is over (the next forward starts anew)."""
        if p is None:
            return
        p.aborted = True
        if isinstance(exc, torch.OutOfMemoryError):
            self._on_oom(p)

    def _on_oom(self, p: PassState | None) -> None:
        if p is not None and not p.oom_seen:
            p.oom_seen = True
            self._planner.on_oom(p)

    # --------------------------------------------------------- offload side

    def _get_engine(self) -> Any:
        if self._engine is None:
            from offrecomp.backends import get_backend
            from offrecomp.offload import OffloadEngine
            from offrecomp.pool import default_host_limit

            device = self._device or torch.device("cpu")
            limit = self.config.host_limit
            if limit is None:
                host_limit = default_host_limit()
            elif limit.nbytes is not None:
                host_limit = limit.nbytes
            else:
                from offrecomp.config import local_world_size
                from offrecomp.measure import host_available_bytes

                host_limit = limit.resolve(host_available_bytes()) // local_world_size()
            self._engine = OffloadEngine(
                backend=get_backend(device), host_limit_bytes=host_limit, prefetch=self.config.prefetch
            )
            log.info("offrecomp: offload engine on %s, host limit %s", device, format_bytes(host_limit))
        return self._engine

    def _offloadable(self, t: torch.Tensor) -> bool:
        """Offload moves tensors of the runtime's device (on CPU: the emulated path)."""
        return t.device.type == (self._device.type if self._device is not None else "cpu")

    # NOTE [Offload groups]
    # The unit of transfer is a region call's group of offloaded storages (as in
    # TransformerEngine's and Megatron's offloaders), never a single tensor: the pack hook
    # appends a storage to its call's open group, the group is copied to host at the
    # call's exit under one event, reloaded in backward as one buffer on the first unpack
    # of any of its saves (with the next groups prefetched), and released as a whole
    # once each of its saves was unpacked. Saves outside every region form runs: the run
    # since the last region call is issued when the next region call begins, or when
    # backward begins, so it never joins a region's group. A group the pinned pool
    # refuses at issue keeps its storages (fallback offload_to_keep).

    def _group_add(self, call: RegionCall, rec: Any, source: Any) -> bool:
        """Add an OFFLOAD storage to ``call``'s open group; False when the pool cannot
        hold it (the caller falls back)."""
        engine = self._get_engine()
        if not engine.admit(rec.nbytes):
            return False
        group = call.group
        if group is None:
            p = call.pass_state
            group = call.group = engine.open_group(len(p.calls) if p is not None else 0, source.device)
            call.groups.append(group)
            self._engine_groups += 1
        rec.group = group
        rec.slot = group.add(source, rec.nbytes)
        self._sample_peak(call)
        return True

    def _issue_group(self, call: RegionCall) -> None:
        """Copy ``call``'s open group to host (its exit, or the end of a root run)."""
        group, call.group = call.group, None
        if group is None:
            return
        sources = list(group.sources)
        if self._engine is not None and self._engine.issue(group):
            return
        p = call.pass_state
        for rec in call.storages:  # refused by the pool: keep what it held
            if rec.group is not group:
                continue
            rec.group = None
            rec.placement = KEEP
            source = sources[rec.slot]
            if isinstance(source, torch.Tensor):
                rec.tensor = source
            else:
                rec.tensor = torch.empty(0, dtype=torch.uint8, device=source.device).set_(source)
            if p is not None:
                p.stats.offloaded_bytes -= rec.nbytes
                p.stats.fallback("offload_to_keep")
                p.stats.keep(rec)

    def _fetch_group(self, group: Any) -> torch.Tensor:
        buf = group.ready
        if buf is not None:  # compute already waited on this reload
            return buf
        engine = self._engine
        assert engine is not None
        buf = engine.fetch(group)
        p = self._pass
        if p is not None:
            p.stats.sample(engine.device_bytes)
        return buf

    def _release_group_device(self, group: Any) -> None:
        if self._engine is not None:
            self._engine.release_device(group)

    def _sample_peak(self, call: RegionCall) -> None:
        """Offloads not landed yet and reloads in use are device bytes too."""
        p = call.pass_state
        engine = self._engine
        if p is not None and engine is not None:
            p.stats.sample(engine.device_bytes)

    def _free_group(self, group: Any) -> None:
        if self._engine is None:
            return
        self._engine.free(group)
        self._engine_groups -= 1
        self._maybe_close_engine()

    def _maybe_close_engine(self) -> None:
        # NOTE [Pool lifetime]: pinning host memory is slow (cudaHostAlloc, and it
        # synchronises the device), so the pinned pool is the runtime's, not the
        # context's: a normal exit keeps it for the next entry (loops that enter the
        # runtime once per step would otherwise re-pin gigabytes every step). It is freed
        # by close(), when the runtime is garbage collected, and after an exit by
        # exception; in each case only once no saved tensor still needs it (a graph kept
        # alive past exit): the last freed offload group closes it then.
        if (
            self._engine is not None
            and self._closing
            and not self._entered
            and self._engine_groups <= 0
        ):
            engine, self._engine = self._engine, None
            engine.close()

    def close(self) -> None:
        """Free the pinned host pool (now, or once no saved tensor needs it any more)."""
        self._closing = True
        self._maybe_close_engine()

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            try:  # noqa: SIM105 - never raise from a finaliser
                engine.close()
            except Exception:
                pass

    # ----------------------------------------------------------- replay side

    def _clock_mark(self) -> Mark:
        return self._clock.mark()

    def _replay_started(
        self, call: RegionCall, start: Mark, end: Mark, dropped_bytes: int, *, timed: bool = True
    ) -> None:
        p = call.pass_state
        if p is None:
            return
        if timed:
            p.replay_marks.append((call.ordinal, start, end))
        p.stats.add_resident(dropped_bytes)
        call.replay_resident = dropped_bytes

    def _replay_done(self, call: RegionCall) -> None:
        p = call.pass_state
        if p is not None and call.replay_resident:
            p.stats.add_resident(-call.replay_resident)
            call.replay_resident = 0


def _unseen_backward(rref: weakref.ref[Runtime], cref: weakref.ref[RegionCall], _grads: Any) -> None:
    """NOTE [Backward without saves]: a backward reached a root output of a pass that
    saved nothing through the runtime's hooks."""
    rt, call = rref(), cref()
    if rt is not None and call is not None and call.pass_state is not None and not call.pass_state.backward_started:
        rt._backward_activity(call)


def _first_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    for x in tc.tree_flatten((args, kwargs))[0]:
        if isinstance(x, torch.Tensor):
            return x.device
    return None


def _signature_of(
    args: tuple[Any, ...], kwargs: dict[str, Any], training: bool, name: str = ""
) -> tuple[str, str, tuple[int, ...]]:
    """The pass's signature, its family (the signature without sizes) and its sizes;
    ``name``: the model of a container root the pass began in (NOTE [Container roots])."""
    leaves, _ = tc.tree_flatten((args, kwargs))
    parts, kinds = [], []
    dims: list[int] = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            if x.is_nested and x.layout == torch.jagged:
                # the ragged dimension is a symbol new to every nested tensor built: the
                # components and the packed values decide the memory instead
                sizes = (int(x.size(0)), *x.values().shape)
                shape = f"{x.size(0)}x{tuple(x.values().shape)}"
            else:
                sizes = tuple(x.shape)
                shape = str(sizes)
            kind = f"{str(x.dtype).replace('torch.', '')}:{x.device.type}"
            parts.append(f"{shape}:{kind}")
            kinds.append(f"{'n' if x.is_nested else ''}{len(sizes)}:{kind}")
            dims += [int(d) for d in sizes]
    mode = ("train|" if training else "eval|") + (f"{name}:" if name else "")
    return mode + ",".join(parts), mode + ",".join(kinds), tuple(dims)


# NOTE [Container roots]
# Several models trained together (a GAN, distillation) go to one runtime in a
# container, nn.ModuleDict({"gen": gen, "disc": disc}), whose forward the loop never
# calls: it calls the models. Wrapping the container's forward gave every pass the
# signature "unknown", so a GAN's discriminator pass on real data, its pass on
# generated data (the generator runs in it) and the generator's pass shared one
# profile: each pass type extended it, and one plan served them all, solved for the
# longest. The models inside a container are each wrapped as a root instead: a pass's
# signature names the model it began in ("train|gen:(4, 12, 8):float32:cpu"), and each
# kind of pass gets its own profile and plan.


def _is_container(m: nn.Module) -> bool:
    """A module whose own forward is not defined (ModuleDict, ModuleList, a plain
    nn.Module holding models): the loop calls the modules inside it."""
    return isinstance(m, (nn.ModuleDict, nn.ModuleList)) or type(m).forward is nn.Module.forward


_warned: set[str] = set()


# NOTE [Copies of a managed model]
# While the runtime is entered, a region's (and the root's) forward slot holds the
# runtime's wrapper. A copy of the module made meanwhile, copy.deepcopy(model) for an
# EMA or a teacher, copied that slot too: a plain function, which deepcopy shares, so
# the copy ran the original module's forward with the original weights, silently, and
# kept doing so after the runtime exited; torch.save(model) failed on it. The slot
# holds an _Installed instead: it calls the wrapper, and a deep copy or a pickle of it
# is what the slot held before (the module's own forward, bound to the copy), so the
# copy is a plain module the runtime does not manage. inspect.signature still sees the
# forward's signature through __wrapped__.


class _Installed:
    """The runtime's wrapper in a module's ``forward`` (or ``_compiled_call_impl``) slot."""

    def __init__(self, fn: Callable[..., Any], module: nn.Module, attr: str, previous: Any) -> None:
        functools.update_wrapper(self, fn)  # __wrapped__, __name__, __doc__: introspection
        self.fn = fn
        self.module = module
        self.attr = attr
        self.previous = previous  # the slot's instance value before, None for the class's

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        copy_of = memo.get(id(self.module))
        if copy_of is None:
            return self  # copied on its own, not as part of its module
        return _slot_as_before(copy_of, self.attr, copy.deepcopy(self.previous, memo))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_slot_as_before, (self.module, self.attr, self.previous))


def _slot_as_before(module: nn.Module, attr: str, previous: Any) -> Any:
    """What a copy's slot holds: the value before the runtime, or the class's method
    bound to the copy (NOTE [Copies of a managed model])."""
    if previous is not None:
        return previous
    return getattr(type(module), attr).__get__(module)


def _holds_compiled(model: nn.Module) -> bool:
    """Does the model hold torch.compile'd code (itself, or any submodule, wrapped or
    compiled in place)? Then the runtime's hooks and wrappers are excluded from dynamo's
    tracing: their own frames run for real, once per call (the frames they call are still
    compiled)."""
    return any(map(compiled_module, model.modules()))


# NOTE [Collective regions]
# Under auto, every rank solves its plans from its own timings, so two ranks may place a
# region differently. That is harmless for data parallelism: a replay there runs local
# ops (FSDP2's gathers happen in hooks outside the region, and its pre-forward hook
# does nothing during backward). A region whose forward runs collectives (tensor
# parallelism: its parameters are DTensors while it runs) is another matter: a replay
# on one rank alone would issue a collective that no other rank joins, and training
# would hang. Such a region is known before its first call when it holds DTensor
# parameters, and from the measuring pass when its recording saw a torch.distributed op
# (dist.all_reduce and the functional collectives dispatch as c10d ops); the measuring
# pass itself drops everything on every rank alike. From then on auto mode never drops
# its activations, in any pass or fallback, and plans it as KEEP or OFFLOAD
# (RegionRecord.replayable). mode="recompute" is symmetric: every rank replays every
# region.


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _runs_collectives(module: nn.Module) -> bool:
    """Does the module hold DTensor parameters while it runs (tensor parallelism)? By
    name: FSDP2's sharded DTensors are swapped for plain tensors during the forward."""
    return any(type(p).__name__ == "DTensor" for p in module.parameters())


def _inside_compiled(model: nn.Module, regions: list[Region]) -> list[str]:
    """Regions below a compiled module (the model, or a stage holding several blocks):
    dynamo traces them into that module's graph (NOTE [Compiled regions])."""
    tops = [(name, m) for name, m in model.named_modules() if compiled_module(m)]
    return [
        r.name
        for r in regions
        if any(m is not r.module and (not name or r.name.startswith(name + ".")) for name, m in tops)
    ]


def _skip_frame(fn: Callable[..., Any]) -> None:
    """Have dynamo run ``fn``'s frames as they are while still compiling the frames it
    calls. ``torch.compiler.disable(recursive=False)`` alone does not: it wraps ``fn`` in
    a new function and leaves ``fn``'s own frame to dynamo, which then traces it."""
    tc.dynamo_skip_code(fn.__code__)


_EVAL_FRAME_CALLBACK = tc.eval_frame_callback_getter()


#: Region calls without an activation of their own that are checked for saves another
#: hook took; blocks are alike, so the first calls tell (the check walks the graph).
HIDDEN_CHECKS = 64


def _check_hidden_saves(rt: Runtime, name: str, saves: int, inputs: Any, out: Any) -> None:
    """A region call saved no activation through our hooks (at most its inputs). If it
    returns a tensor it made that needs grad, and the autograd graph between its inputs
    and that tensor holds more saved tensors than went through our hooks (or a reentrant
    checkpoint node), a saved-tensor hook pair inside it (torch.utils.checkpoint, HF
    gradient_checkpointing_enable, save_on_cpu) took them: only the innermost pair runs,
    so offrecomp cannot place them. A call that hands an input back (LayerDrop) made
    nothing; a lone Linear saved through our hooks all its graph holds."""
    ins = [t for t in tc.tree_leaves(inputs) if type(t) is torch.Tensor]
    passed = {_storage_key(t) for t in ins}
    made = [
        t for t in tc.tree_leaves(out)
        if type(t) is torch.Tensor and t.requires_grad and t.grad_fn is not None and t.numel()
        and _storage_key(t) not in passed
    ]
    if not made:
        return
    in_graph, checkpoint_node = _graph_saves(made, ins)
    if checkpoint_node or in_graph > saves:
        top = tc.top_saved_tensors_hooks()
        ours = rt._hooks_ctx is not None and top is not None and top[0] is rt._hooks_ctx.pack_hook
        if ours:
            _warn_hidden(rt, name, "saved no activation through offrecomp")
        else:  # the call ran under a pair entered after the runtime's, around it
            _warn_hidden(rt, name, "saved no activation through offrecomp", where="around the model's forward")


def _storage_key(t: torch.Tensor) -> int:
    """The storage a tensor views, or the tensor itself for a layout without one (sparse
    tensors have no storage to ask for)."""
    return int(t.untyped_storage().data_ptr()) if t.layout == torch.strided else id(t)


def _graph_saves(outs: list[torch.Tensor], ins: list[torch.Tensor], limit: int = 4096) -> tuple[int, bool]:
    """Saved tensors held by the autograd nodes between a region's inputs and its
    outputs (read as SavedTensor objects, never unpacked), and whether a reentrant
    checkpoint node is among them. Visits at most ``limit`` nodes."""
    stop = {id(t.grad_fn) for t in ins if t.grad_fn is not None}
    todo = [t.grad_fn for t in outs]
    seen: set[int] = set()
    count = 0
    while todo and len(seen) < limit:
        fn = todo.pop()
        if fn is None or id(fn) in seen or id(fn) in stop:
            continue
        seen.add(id(fn))
        if type(fn).__name__ == "CheckpointFunctionBackward":
            return count, True
        for attr in dir(fn):
            if attr.startswith("_raw_saved_"):
                value = getattr(fn, attr, None)
                slots = value if isinstance(value, (list, tuple)) else (value,)
                # only slots a hook pair took: not the empty slot of a save that only an
                # input needing no gradient would read, nor a wrapped number (x * 2.5)
                count += sum(s is not None and tc.saved_slot_hooked(s) for s in slots)
        todo.extend(nxt for nxt, _ in fn.next_functions)
    return count, False


def _warn_hidden(rt: Runtime, names: str, what: str, *, where: str = "inside") -> None:
    if rt._hidden_warned:
        return  # once per runtime: the other blocks are most likely alike
    rt._hidden_warned = True
    log.warning(
        "offrecomp: region(s) %s %s: a saved-tensor hook %s (torch.utils.checkpoint, "
        "HF gradient_checkpointing_enable(), checkpoint_wrapper, save_on_cpu) owns their "
        "activations, and only the innermost hook runs, so offrecomp cannot keep, offload "
        "or recompute them. Turn that off and let offrecomp decide.",
        names, what, where,
    )


def _checkpoints_itself(m: nn.Module) -> bool:
    """HF layers after gradient_checkpointing_enable(), or torch's checkpoint_wrapper."""
    return any(
        getattr(x, "gradient_checkpointing", False) is True or type(x).__name__ == "CheckpointWrapper"
        for x in m.modules()
    )


def _warn_compiled(names: str) -> None:
    _warn_once(
        f"compiled:{names}",
        "offrecomp: region(s) %s run inside a torch.compile'd frame (torch.compile(model) or "
        "model.compile()): a replay could not reproduce the compiled graph's saves, so their "
        "activations are kept or offloaded, never recomputed. To recompute with "
        "torch.compile, compile each block instead: block.compile(), or "
        "model.blocks[i] = torch.compile(model.blocks[i])",
        names,
    )


def _kind(region: Region) -> str:
    """The class of a region's module: warnings about "a region and any other like it"
    come once per kind of block in the process, so another model's blocks still warn."""
    cls = type(region.module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _warn_once(key: str, msg: str, *args: Any) -> None:
    if key in _warned:
        return
    _warned.add(key)
    log.warning(msg, *args)


class _PlannerHost:
    """The runtime as its planner sees it (``offrecomp.planning.PlannerHost``), read live.
    Holds the runtime weakly: the runtime owns its planner, which holds this."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = weakref.proxy(rt)

    @property
    def config(self) -> Config:
        return self._rt.config

    @property
    def clock(self) -> Clock:
        return self._rt._clock

    @property
    def regions(self) -> list[Region]:
        return self._rt._regions

    @property
    def distributed(self) -> bool:
        return self._rt._distributed

    @property
    def user_plan(self) -> Plan | None:
        return self._rt._user_plan

    def device(self) -> torch.device:
        return self._rt._device or torch.device("cpu")

    def engine(self) -> Any:
        return self._rt._get_engine()

    def warn_collective(self, region: Region) -> None:
        self._rt._warn_collective(region)
