"""The runtime: one context manager that owns every activation autograd saves.

``offrecomp.runtime(model, ...)`` returns a :class:`Runtime`. Entering it installs one
saved-tensor hook pair, wraps the forward of every region module (and of the model, to
read input shapes), and registers a global optimizer step hook that marks step
boundaries. Leaving it, normally or by exception, removes all of that and frees the
offload pool as soon as no saved tensor needs it. A Runtime can be entered and left
many times (e.g. once per step); what it learned (plans, timings) survives.

The Runtime is a facade over its parts, each with the narrow interface it needs:

- ``Installer`` (install.py): hooks and wrappers in and out of the model;
- ``Lifecycle`` (lifecycle.py): passes, the running region calls, steps, the report;
- ``RegionCalls`` (calls.py): what a region call's entry and exit do;
- ``Placements`` (placement.py): the one placement decision per storage;
- ``Placer`` (hooks.py): the saved-tensor hook pair (its replays: ``Regenerator``, regenerate.py);
- ``OffloadGroups`` (groups.py): offload groups and the engine's lifetime;
- ``Planner`` (planning): plans, profiles, learning;
- ``Diagnostics`` (diagnostics.py): what the runtime warns about.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from offrecomp import _torch_compat as tc
from offrecomp.calls import RegionCalls, model_storage_ptrs
from offrecomp.changes import BufferPtrs
from offrecomp.config import Budget, Config, Prefetch, apply_log_level, tell_ignored
from offrecomp.diagnostics import Diagnostics, refused_transform, warn_collective
from offrecomp.groups import OffloadGroups
from offrecomp.hooks import Placer
from offrecomp.install import Installer
from offrecomp.lifecycle import REPORT_MAX_STEPS, Lifecycle
from offrecomp.measure import Clock, DeviceClock
from offrecomp.placement import Placements
from offrecomp.planning import Planner
from offrecomp.regions import Region, discover_regions
from offrecomp.report import Report
from offrecomp.slots import weak_call
from offrecomp.state import PassState
from offrecomp.verify import Verifier
from scheduler.plan import ROOT, Placement, Plan

if TYPE_CHECKING:
    from offrecomp.offload import OffloadEngine

log = logging.getLogger(__name__)

__all__ = ["REPORT_MAX_STEPS", "Runtime", "runtime"]

_active_lock = threading.Lock()
_active: Runtime | None = None
#: Pack hooks of pairs left on a thread's stack (NOTE [Runtimes left on another thread]),
#: weakly: the stack holds each while it is on it.
_orphans: list[weakref.ref[Any]] = []


# NOTE [Runtimes across fork]
# A process forked while a runtime is entered (a DataLoader worker, a multiprocessing
# child started inside the loop) inherits a copy of it as active: its hook pair on the
# forking thread and its wrappers in the model's copy. The child is another program: its
# autograd would go through the copy's books, and a runtime of its own would be refused
# as a second one. So the child takes the copy out (the model's copy runs plainly, the
# forking thread's stack loses the pair) and marks none active, with a fresh lock (another
# thread may have held it at the fork). The parent's runtime is untouched.


def _leave_in_child() -> None:
    global _active, _active_lock
    _active_lock = threading.Lock()
    rt, _active = _active, None
    if rt is not None:
        with contextlib.suppress(Exception):  # forked: never raise here
            rt._leave()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_leave_in_child)


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
    percentage of device memory (``"60%"``), or ``"auto"``/``"none"`` (automatic; None
    or ``""``: ``OFFRECOMP_BUDGET``, else automatic). ``mode``: ``auto``
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


class Runtime:
    """Owns the hooks, the per-pass state, the plans and the report. See module doc."""

    def __init__(self, model: nn.Module | None, config: Config) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        self.model = model
        config = self.config = config.checked()  # one built directly is resolved, its fields the arguments
        if config.active:
            tc.check_torch_version()
        apply_log_level(config)
        tell_ignored(config)
        self._regions = _regions_of(model, config)
        self._plan = _PlanSlot()
        self._entered = False
        self._thread: threading.Thread | None = None  # the thread that entered it
        self._device = DeviceClock(_model_device(model))
        self._groups = OffloadGroups(config, self._device)
        if model is not None:
            self._groups.parameters = model.parameters
        self._planner_host = _PlannerHost(config, self._device, self._regions, self._groups, self._plan)
        self._planner = Planner(self._planner_host)
        self._placements = Placements(config, self._planner, self._groups, self._plan.get)
        self._life = Lifecycle(config, self._device, self._planner, self._groups, self._placements)
        self._calls = RegionCalls(
            config, self._device, self._life, self._planner, self._placements, self._groups,
            functools.partial(model_storage_ptrs, model),
        )
        self._planner_host._bind(self._calls)
        self._verifier = Verifier()
        self._buffers = BufferPtrs()
        self._diag = Diagnostics()
        self._installer = Installer(model, self._regions, config, self._life, self._calls, self._diag)
        self._diag.own_pack = weak_call(self._installer, "own_pack")  # NOTE [Wrappers and the installer] (slots.py)
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

    @property
    def planner(self) -> Planner:
        """The planner (read-only view for inspection: its ``entries`` per signature,
        ``last_entry``, learnt figures). Changing it changes what the runtime does."""
        return self._planner

    @property
    def current_pass(self) -> PassState | None:
        """The pass forward activity joins now (None between passes); for inspection."""
        return self._life.current

    @property
    def offload_engine(self) -> OffloadEngine | None:
        """The offload engine, None until a storage was offloaded or once closed."""
        return self._groups.engine

    @property
    def offload_groups_held(self) -> int:
        """Offload groups opened and not yet freed (saved tensors that still need them)."""
        return self._groups.live_groups

    def report(self) -> Report:
        """Per-step statistics so far (a completed step appears once it has ended): the
        last ``REPORT_MAX_STEPS`` (10,000) steps; ``OFFRECOMP_REPORT`` writes every step.

        Waits for the device times of finished steps (a host sync on GPU)."""
        with self._lock:
            self._life.resolve(wait=True)
            cfg = {k: _json_value(v) for k, v in vars(self.config).items() if k not in ("sources", "_parsed")}
            return Report(steps=list(self._life.steps), config=cfg)

    def set_plan(self, plan: Plan | None) -> None:
        """Use ``plan`` for every pass (None: back to the configured mode); under
        ``mode="auto"``, every pass but a new signature's measuring pass, which drops
        what it may to record the regions' ops.

        Storages the plan does not name get ``plan.default``; illegal placements (dropping
        a region input or a root storage, offloading one under ``min_bytes``) fall back to
        KEEP: those the plan names are logged once, at the end of its first pass, and
        marked in :meth:`explain`. The runtime keeps a copy of the plan it checked: a
        change to ``plan`` afterwards takes effect at the next ``set_plan(plan)``.
        """
        if plan is not None and not isinstance(plan, Plan):
            raise TypeError(f"plan must be a scheduler.Plan or None, got {type(plan).__name__}")
        if plan is not None:
            # the runtime keeps a copy of what it checked: a change to the caller's plan
            # afterwards (a placement given as a string) would meet no check
            _check_plan(plan, self.regions)
            plan = dataclasses.replace(plan, placements=dict(plan.placements), notes=list(plan.notes))
            if not self.config.active:
                log.warning("offrecomp: set_plan() under mode='off' (or disabled) has no effect: nothing is placed")
        self._plan.plan = plan

    def explain(self, storages: bool = False) -> str:
        """Per region call: placements, bytes, predicted and measured times, and why; with
        ``storages=True``, each (region, call, storage) key as ``set_plan()`` places it,
        with its placement, size and kind."""
        if not isinstance(storages, bool):
            raise TypeError(f"explain(storages={storages!r}) is invalid; accepted: True or False")
        return self._planner.explain(storages)

    @contextlib.contextmanager
    def step(self) -> Iterator[Runtime]:
        """One explicit step, for loops automatic detection cannot follow.

        ``with rt.step(): ...`` closes a step when the block ends, whatever ran in it
        (optimizer steps inside it close none). It works inside ``with rt:`` (only the
        boundary) and on its own (it also enters and leaves the runtime around the
        block). Outside such blocks steps are found automatically.
        """
        life = self._life
        outer, life.explicit_steps = life.explicit_steps, True
        try:
            if self._entered:
                yield self
                life.end_step(explicit=True)
                return
            with self:
                yield self
                life.end_step(explicit=True)
        finally:
            life.explicit_steps = outer

    def close(self) -> None:
        """Free the pinned host pool (now, or once no saved tensor needs it any more)."""
        self._groups.closing = True
        self._groups.maybe_close()

    # -------------------------------------------------------- enter and exit

    def __enter__(self) -> Runtime:
        global _active
        self._groups.closing = False
        if not self.config.active:
            self._entered = True
            return self
        with _active_lock:
            if _active is not None:
                which = "this runtime is" if _active is self else "another offrecomp runtime is"
                raise RuntimeError(
                    f"offrecomp: {which} already active; one runtime is active at a time in a "
                    "process (on any thread), so runtimes neither nest nor run side by side. Enter one "
                    "runtime around the whole training loop (or exit the first one before "
                    "entering another). For several models trained together, give one "
                    "runtime a container of them: offrecomp.runtime(nn.ModuleDict("
                    "{'gen': gen, 'disc': disc})). A runtime entered with rt.__enter__() "
                    "stays active until rt.__exit__(None, None, None)."
                )
            _active = self
        try:
            _drop_orphans()
            self._follow_device()
            self._install()
        except BaseException:
            self._uninstall()
            with _active_lock:
                _active = None
            raise
        self._entered = True
        self._groups.entered = True
        self._thread = threading.current_thread()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        global _active
        if not self.config.active:
            self._entered = False
            return
        entered_on = self._thread
        if (
            self._entered and entered_on is not None and entered_on is not threading.current_thread()
            and entered_on.is_alive()
        ):
            # saved-tensor hooks are per thread: the pair is on the entering thread's stack,
            # which no other thread can reach (a thread that ended took its stack with it)
            if exc_type is GeneratorExit:  # NOTE [Runtimes left on another thread]
                self._orphan(entered_on)
            else:
                raise RuntimeError(
                    f"offrecomp: the runtime was entered on thread {entered_on.name!r} and is left on "
                    f"thread {threading.current_thread().name!r}; its hooks are on the entering "
                    "thread's stack, which only that thread can take them off. Leave it on the "
                    "thread that entered it (the runtime stays active until then)."
                )
        try:
            assert self._installer is not None
            self._installer.end_stale_calls(0)  # NOTE [Stale calls] (install.py)
            if exc_type is not None:
                self._groups.closing = True  # a fault: start the next entry from scratch
                self._life.abort(self._life.current, exc_type)
            self._life.close_steps()
        finally:
            self._leave()
            with _active_lock:
                if _active is self:
                    _active = None
            self._life.reset_calls()
            self._groups.settle()
            self._groups.maybe_close()
        refused = refused_transform(exc, None) if exc is not None else None
        if refused is not None:  # torch's message names no runtime
            raise refused from exc

    # NOTE [Model devices]
    # The runtime reads the model's device when it is made: where its offload engine
    # copies from, what its clock times, which tensors count as device memory. A model
    # moved after that (``rt = offrecomp.runtime(model); model.cuda()``, or built on the
    # meta device and materialised later) would leave the runtime on the old one: no save
    # on the new device would ever be offloaded, silently. So each entry reads the
    # model's device again (its first parameter's, else its first buffer's) and takes a
    # new one, with its clock and, no group being live, a new engine on first use. A
    # model moved while entered is followed at the next entry (a pass on another device
    # has another signature, and so another plan, either way).

    def _follow_device(self) -> None:
        """NOTE [Model devices]: the model's device now, if it moved since."""
        if self._groups.live_groups > 0:
            return  # saved tensors still held on the old device: followed at a later entry
        if self._device.follow(_model_device(self.model)):
            log.info("offrecomp: the model is on %s now; the runtime follows it", self._device.device)
            self._groups.device_moved()
            self._life.device_moved()

    # NOTE [Runtimes left on another thread]
    # A generator that holds ``with rt:`` (a trainer's ``self._it = self._steps()``) and is
    # dropped before its end is closed wherever its last reference goes: for one in a
    # reference cycle, on whichever thread runs the collector (a data loader's pin-memory
    # thread). The runtime's exit then runs on a thread that cannot reach the hook pair on
    # the entering thread's stack. Refusing it would leave the runtime active for good
    # (the generator cannot run again), its wrappers in the model, every later runtime
    # refused. So a GeneratorExit on another thread exits all the same, but for the pair:
    # its placer passes every save through as it is (a plain saved tensor), and the next
    # entry of any runtime on that thread takes the pair off where it is on top. Any other
    # exit on another thread is refused (the entering thread may still be training).

    def _orphan(self, entered_on: threading.Thread) -> None:
        """Let the pair on ``entered_on``'s stack pass saves through, first (that thread
        may be saving meanwhile), and remember it for the next entry there (NOTE
        [Runtimes left on another thread])."""
        placer = self._calls.placer
        if placer is not None:
            placer.orphan()
        installer = self._installer
        hooks = installer.hooks_ctx if installer is not None else None
        if hooks is not None:
            _orphans.append(weakref.ref(hooks.pack_hook))
        log.warning(
            "offrecomp: the runtime entered on thread %r was left by a generator closed on "
            "thread %r; its hooks stay on the entering thread's stack, passing every save "
            "through, until a runtime is entered there again",
            entered_on.name, threading.current_thread().name,
        )

    def _install(self) -> None:
        placer = Placer(
            self.config, self._life, self._placements, self._groups, self._planner, self._verifier, self._buffers
        )
        self._calls.placer = placer
        assert self._installer is not None
        self._installer.install(placer.pack, placer.unpack)

    def _leave(self) -> None:
        """Take the hooks off and mark the runtime left: its exit, and in a forked child
        the copy of an entered runtime (NOTE [Runtimes across fork])."""
        self._uninstall()
        self._entered = False
        self._groups.entered = False

    def _uninstall(self) -> None:
        self._calls.placer = None  # saved handles still reach theirs; the runtime no longer does
        assert self._installer is not None
        self._installer.uninstall()

    def __del__(self) -> None:
        # NOTE [Pool lifetime]: a graph kept past the runtime still reaches its groups
        # (the handles hold them): the last one freed closes the engine then
        groups = getattr(self, "_groups", None)
        if groups is not None:
            try:  # never raise from a finaliser
                groups.closing = True
                groups.entered = False
                groups.maybe_close()
            except Exception:
                pass


def _drop_orphans() -> None:
    """Take off this thread's stack the pairs of runtimes left on another thread that are
    on top of it (NOTE [Runtimes left on another thread])."""
    _orphans[:] = [r for r in _orphans if r() is not None]
    while _orphans:
        top = tc.top_saved_tensors_hooks()
        if top is None or not any(top[0] is r() for r in _orphans):
            return
        _orphans[:] = [r for r in _orphans if r() is not top[0] and r() is not None]
        tc.pop_saved_tensors_hooks()


class _PlanSlot:
    """The user's plan (``Runtime.set_plan``), read by the parts that place storages."""

    def __init__(self) -> None:
        self.plan: Plan | None = None

    def get(self) -> Plan | None:
        return self.plan


class _PlannerHost:
    """What the planner reads of its runtime (``planning.PlannerHost``): the parts
    themselves, never the Runtime, so the planner holds no reference back to it."""

    def __init__(
        self, config: Config, device: DeviceClock, regions: list[Region], groups: OffloadGroups, plan: _PlanSlot
    ) -> None:
        self._config = config
        self._dev = device
        self._regions = regions
        self._groups = groups
        self._plan = plan
        # bound once the parts exist; weakly, as RegionCalls holds the planner, which holds
        # this host: read only in a region call's exit, while the runtime (and so its
        # RegionCalls) lives
        self._calls: weakref.ref[RegionCalls] | None = None

    def _bind(self, calls: RegionCalls) -> None:
        self._calls = weakref.ref(calls)

    @property
    def config(self) -> Config:
        return self._config

    @property
    def clock(self) -> Clock:
        return self._dev.clock

    @property
    def regions(self) -> list[Region]:
        return self._regions

    @property
    def distributed(self) -> bool:
        calls = self._calls() if self._calls is not None else None
        return calls is not None and calls.distributed

    @property
    def user_plan(self) -> Plan | None:
        return self._plan.plan

    def device(self) -> torch.device:
        return self._dev.device or torch.device("cpu")

    def engine(self) -> OffloadEngine:
        return self._groups.get_engine()

    def host_limit_bytes(self) -> int:
        return self._groups.host_limit_bytes()

    def warn_collective(self, region: Region) -> None:
        warn_collective(region, self._config.mode)


def _check_plan(plan: Plan, regions: list[str]) -> None:
    """A plan's placements are ``Placement`` members and its regions this runtime's: a
    string or a number would be taken for OFFLOAD (the placement is compared by identity
    on the save path), a region name the model lacks is never used."""
    accepted = ", ".join(f"Placement.{p.name}" for p in Placement)
    if not isinstance(plan.placements, dict):
        raise TypeError(
            f"plan.placements={plan.placements!r} is invalid; accepted: a dict "
            "{(region name, call index, storage index): Placement}"
        )
    for key, pl in [(None, plan.default), *plan.placements.items()]:
        if type(pl) is not Placement:
            where = "plan.default" if key is None else f"plan.placements[{key!r}]"
            raise TypeError(
                f"{where}={pl!r} is not a placement; accepted: {accepted} "
                "(Placement.parse turns a name into one)"
            )
    for key in plan.placements:
        if not (
            isinstance(key, tuple) and len(key) == 3 and isinstance(key[0], str)
            and all(type(k) is int and k >= 0 for k in key[1:])
        ):
            raise TypeError(
                f"plan.placements key {key!r} is not (region name, call index, storage index): "
                "a str and two ints >= 0, as ('blocks.3', 0, 2)"
            )
    depth = plan.prefetch_regions
    if depth is not None and (type(depth) is not int or depth < 1):
        raise ValueError(
            f"plan.prefetch_regions={depth!r} is invalid; accepted: None (as the runtime's prefetch "
            "setting) or a number of regions, 1 or more"
        )
    known = {*regions, ROOT}
    unknown = sorted({key[0] for key in plan.placements if key[0] not in known})
    if unknown:
        log.warning(
            "offrecomp: the plan names regions this runtime does not have, which it ignores: %s "
            "(its regions: %s)",
            ", ".join(map(repr, unknown[:5])) + (", ..." if len(unknown) > 5 else ""),
            ", ".join(map(repr, regions[:5])) + (", ..." if len(regions) > 5 else ""),
        )


def _refuse_data_parallel(model: nn.Module) -> None:
    """``nn.DataParallel`` over several devices makes shallow copies of the modules at
    each forward and runs them on threads of its own: the copies share the runtime's
    wrappers, which run the original module (NOTE [Copies of a managed model] in
    slots.py), on threads without its hooks."""
    for name, m in model.named_modules():
        if isinstance(m, nn.DataParallel) and len(m.device_ids) > 1:
            raise ValueError(
                f"offrecomp: {name or 'the model'} is an nn.DataParallel over devices {m.device_ids}; "
                "its replicas would run the original modules' forwards on threads without the "
                "runtime's hooks. Use DistributedDataParallel (one process per device, a "
                "runtime in each), or give the runtime the module on one device"
            )


def _regions_of(model: nn.Module | None, config: Config) -> list[Region]:
    if model is None:
        if config.regions is not None:
            raise ValueError("regions= needs a model: offrecomp.runtime(model, regions=...)")
        return []
    if not config.active and config.regions is None:
        return []
    if config.active:
        _refuse_data_parallel(model)
    # a bad regions= fails alike when the runtime is off (mode="off", OFFRECOMP_DISABLE=1)
    regions = discover_regions(model, config.regions)
    if not regions:
        if config.regions is not None:
            raise ValueError(
                f"regions={config.regions!r} matched no module of {type(model).__name__}; "
                "pass module types that occur in the model, a filter fn(module, name) -> bool "
                "that selects some, or None for automatic discovery"
            )
        log.warning(
            "offrecomp: %s has no repeated blocks (children of nn.ModuleList/Sequential/ModuleDict "
            "sharing a class, any child of an nn.ModuleList, or sibling attributes of one class "
            "that holds modules; torch's own layers, such as nn.Linear or nn.ReLU, are not blocks), "
            "so nothing can be recomputed; activations can still be kept or offloaded. Pass "
            "regions= to choose the modules to replay.",
            type(model).__name__,
        )
    return regions if config.active else []


def _json_value(value: Any) -> Any:
    """A config value as JSON holds it: its own types as they are, a list or tuple as a
    list, a size in bytes as its byte count, a share or a prefetch window as it reads
    (``60%``, ``2 regions``), and anything else (a module type, a ``regions=`` function)
    as its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, Budget) and value.nbytes is not None:
        return value.nbytes  # exact, where its str rounds
    if isinstance(value, (Budget, Prefetch)):
        return str(value)
    return repr(value)


def _model_device(model: nn.Module | None) -> torch.device | None:
    if model is None:
        return None
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return None
