"""Region calls: what the runtime does when a region's forward begins and returns.

At entry a call joins its pass, gets its plan, captures what a replay needs (inputs,
RNG, autocast, buffers, parameters: regions.py, arguments.py and arg_state.py) and, in a
measuring pass, starts its op recorder. At exit it checks whether the forward wrote
state a replay would need as it was (call_state.py), issues its offload group, and
derives the region's structure from the recording.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from offrecomp import _torch_compat as tc
from offrecomp import host_rng
from offrecomp.arg_state import ARG_STATE_MAX_ITEMS, ArgState
from offrecomp.arguments import capture_inputs
from offrecomp.attr_tables import enter_tables
from offrecomp.buffers import capture_buffers, finish_buffers, settle_buffers, snapshot_bytes
from offrecomp.call_state import (
    check_arg_state,
    check_attr_writes,
    check_state_writes,
    check_training_cache,
    finish_attrs,
    hold_dropped,
    note_attr_versions,
    note_external_reads,
    saved_by,
    warn_big_buffers,
    warn_foreign,
    writes_foreign,
)
from offrecomp.changes import (
    count_tree_change,
    forward_hooks,
    hook_ids,
    module_children,
    same_objects,
    structure_epoch,
)
from offrecomp.config import Config
from offrecomp.diagnostics import kind, log_once, runs_collectives, warn_collective, warn_once
from offrecomp.groups import reads_bytes_as_stored
from offrecomp.measure import DeviceClock
from offrecomp.params import capture_params, finish_params, let_go_released
from offrecomp.regenerate import book_forward
from offrecomp.regions import (
    Region,
    capture_autocast,
    capture_rng,
    has_lazy_parameters,
    storage_ptrs,
)
from offrecomp.replay import replayed_regions
from offrecomp.state import PassState, RegionCall
from offrecomp.trace import FirstCallWatch, OpRecorder, user_dispatch_modes
from scheduler.plan import Placement

if TYPE_CHECKING:
    from offrecomp.groups import OffloadGroups
    from offrecomp.hooks import Placer
    from offrecomp.lifecycle import Lifecycle
    from offrecomp.placement import Placements
    from offrecomp.planning import Planner

log = logging.getLogger(__name__)

__all__ = ["RegionCalls", "first_device"]

KEEP, OFFLOAD, RECOMPUTE = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE

# NOTE [Inputs held by arguments]
# A region call may take its inputs inside an argument object rather than as tensors
# among its arguments: blocks that take and return a dataclass (``State(h=...)``), a
# memory a loop hands from block to block. The replay checkpoint holds such an object and
# the tensors its bindings held at entry (NOTE [Stateful arguments] in arg_state.py)
# until the call is released, as it holds a tensor argument (a capture cut short at its
# limit of bindings holds none past the call's exit), so each storage among those
# tensors is a region input of the call: registered at the capture, before the tensor
# arguments, and counted once as a kept input (NOTE [Inputs counted once] in shared.py),
# under a forced recompute, in a measuring pass and under a plan alike. Left out, an op's
# save of it would be an activation that a forced recompute or a measuring pass drops,
# booking nothing while the checkpoint holds it. Such an input is only kept: no replay
# regenerates it, and a copy to host memory frees nothing the object holds; its profile
# record says so (``StorageRecord.keep_only``), so no plan offloads it. The op recording
# does not take it for an input: its strides are no part of the call's layout (NOTE
# [Stale recordings] in regenerate.py), so, as for any tensor from outside the call, no
# op its geometry may reach is served (NOTE [Which ops replay runs] in trace/structure.py).
# A call that takes no checkpoint (a forced keep or offload, a call its plan keeps whole)
# holds no argument object, and an op's save of such a tensor is one of its activations.


class RegionCalls:
    """Entry and exit of region calls for one runtime."""

    def __init__(
        self,
        config: Config,
        device: DeviceClock,
        lifecycle: Lifecycle,
        planner: Planner,
        placements: Placements,
        groups: OffloadGroups,
        model_storages: Callable[[], frozenset[int]],
    ) -> None:
        self._config = config
        self._device = device
        self._life = lifecycle
        self._planner = planner
        self._placements = placements
        self._groups = groups
        self._model_storages = model_storages
        self.placer: Placer | None = None  # while installed
        self.distributed = False  # more than one rank (set at install)
        self.arg_state_limit = ARG_STATE_MAX_ITEMS  # NOTE [Stateful arguments] (set at install)
        self._last_arg_state: weakref.ref[ArgState] | None = None
        self._unsettled: deque[weakref.ref[RegionCall]] = deque()  # NOTE [Buffer comparisons] (buffers.py)
        # per block class: the global RNGs one of its blocks drew from (NOTE [Host random states])
        self._host_draws: weakref.WeakKeyDictionary[type, int] = weakref.WeakKeyDictionary()

    def enter(
        self, region: Region, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RegionCall:
        p = self._life.forward_activity()
        if region.children_at != self._life.parts_begun:  # NOTE [Region refresh] (changes.py)
            region.children_at = self._life.parts_begun
            if not same_objects(region.children, module_children(region.modules)):
                count_tree_change(region.module)
        if region.epoch != structure_epoch():
            region.refresh()
            if region.writes_state is False:
                region.writes_state = None  # watch a call again: new state may be written
        if p.root is not None and p.root.group is not None:
            self._groups.issue(p.root)  # NOTE [Offload groups]: the root's run ends here
        if p.releases:  # NOTE [Planned release] (groups.py): the gap before this call ends
            self._groups.release_due(p, 2 * len(p.calls))
        n = p.call_counts.get(region.name, 0)
        p.call_counts[region.name] = n + 1
        call = RegionCall(name=region.name, call_index=n, ordinal=len(p.calls), region=region, forward_fn=original)
        call.pass_state = p
        call.hooks_from = hook_ids()  # NOTE [Hooks a replay registers] (changes.py)
        if self.distributed and (
            region.name in self._planner.collective_regions or runs_collectives(region.module)
        ):
            call.collective = True
            warn_collective(region, self._config.mode)
        elif self.distributed:  # NOTE [Collective regions]: seen at exit, whatever runs them
            call.collectives_at_entry = tc.collective_sequence()
        if p.calls:  # NOTE [Parameters released by their owner]: the last call's, freed since its exit
            last = p.calls[-1]
            if last.region is not None and last.exited:
                let_go_released(last.params, last.region.param_data, p.index)
        p.calls.append(call)
        self._planner.assign(p, call)
        call.fixed = self._placements.fixed(call)
        if self._device.device is None:  # a model without parameters: its first input tells
            self._device.discover(first_device(args, kwargs))
        if region.lazy:
            region.lazy = has_lazy_parameters(region.modules)
        call.start_mark = self._device.mark()  # the checkpoint's host time is the call's
        if not region.lazy and self._planner.needs_capture(p, call):
            t0 = time.perf_counter()
            self._capture(p, call, region, args, kwargs)
            if call.inputs is not None:  # else it keeps its activations: no checkpoint
                call.capture_seconds = dt = time.perf_counter() - t0
                p.stats.capture_seconds += dt
                p.stats.captures += 1
                if call.lacks_in is not None:
                    call.lacks_in.lend_no_more(call)
            elif call.record:
                self._planner.unrecordable(p, call)
        if region.writes_state:
            call.writes_state = True
        elif region.writes_state is None and call.inputs is not None and not region.compiled:
            # see NOTE [State written by its region]
            call.watch = FirstCallWatch(
                call.inputs, call.params, self._own_storages(region, call), lambda after: writes_foreign(call, after),
                call.arg_state,
            )
        self._placements.build_table(call)
        call.drops = self._placements.drops(call)
        self._life.call_started(call)
        return call

    def _own_storages(self, region: Region, call: RegionCall) -> frozenset[int]:
        """Storages ``call`` owns (its region's parameters and buffers) or takes as an
        argument: what its forward may write besides what it makes (NOTE [State written
        by its region])."""
        inputs = call.inputs.tensors if call.inputs is not None else ()
        return frozenset(storage_ptrs([*region.module.parameters(), *region.module.buffers(), *inputs]))

    def _capture(
        self, p: PassState, call: RegionCall, region: Region, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Keep what a replay of this call needs (see regions.py). Not for a call under a
        functorch transform (``torch.func.vmap``): its inputs are wrapped tensors of a
        transform level that is gone when backward runs, so no replay could start from
        them; nor under forward-mode AD, whose tangents' graph a replay outside the dual
        level would not rebuild. Such a call keeps its activations."""
        if tc.forward_ad_active():
            warn_once(
                f"forward-ad:{kind(region)}",
                "offrecomp: region %r (and any other like it) runs under forward-mode AD "
                "(torch.autograd.forward_ad.dual_level); its calls there keep their "
                "activations (a replay in backward, outside the dual level, would not rebuild "
                "the tangents' graph)",
                region.name,
            )
            return
        modes = user_dispatch_modes()
        if modes:
            warn_once(
                f"dispatch-mode:{kind(region)}:{modes[0]}",
                "offrecomp: region %r (and any other like it) runs under a dispatch mode of "
                "the caller's (%s); its calls there keep their activations (a replay in "
                "backward, outside that mode, could compute other values)",
                region.name, ", ".join(modes),
            )
            return
        cap = capture_inputs(args, kwargs)
        if any(t is not None and tc.is_functorch_wrapped(t) for t in cap.tensors):
            warn_once(
                f"functorch:{kind(region)}",
                "offrecomp: region %r (and any other like it) runs under a functorch "
                "transform (torch.func.vmap); "
                "its calls there keep their activations (no replay can start from "
                "transform-wrapped inputs)",
                region.name,
            )
            return
        call.inputs = cap
        devices = cap.devices()
        if self._device.device is not None:
            devices.add(self._device.device)
        drawn = self._host_draws.get(type(region.module), 0) if self._host_draws else 0
        if drawn & ~region.host_rng:  # another block of its class drew (NOTE [Host random states])
            region.host_rng |= drawn
        call.rng = capture_rng(devices, region.host_rng, _host_rngs(region, cap.host_rngs))
        n = region.host_calls = region.host_calls + 1
        if (n <= host_rng.PROBES or not n % host_rng.REPROBE) and region.host_rng & host_rng.ALL != host_rng.ALL:
            call.rng.probe = host_rng.capture(host_rng.ALL)  # NOTE [Host random states]: does it draw from them?
        call.autocast = capture_autocast({d.type for d in devices})
        call.torch_function = tc.torch_function_state()
        cap.parametrize_cache = tc.parametrize_cache()
        call.buffers = capture_buffers(region.slots)
        call.params = capture_params(region.param_slots, region.param_data)
        call.training = tuple(m.training for m in region.modules)
        call.forward_hooks = forward_hooks(region.modules[1:])  # NOTE [Hooks a replay registers] (changes.py)
        call.tree = region.tree  # NOTE [Children at entry] (replay_state.py)
        call.default_dtype = torch.get_default_dtype()
        call.attrs, contents = enter_tables(region, p.new_signature)  # NOTE [Attributes at entry]
        call.entry_contents = contents or None
        if (region.tensor_attrs or region.made_state) and region.writes_state is False:
            # see NOTE [Attributes written after the first call] (call_state.py)
            call.attr_versions = note_attr_versions(region.tensor_attrs, region.made_state)
        if region.generators or region.generator_slots or cap.generators:  # NOTE [Private generators]
            call.generators = _entry_generators(region, cap.generators)
        if region.external_reads:  # NOTE [State read from outside]
            call.external_reads = note_external_reads(region.external_reads)
        if cap.objects:  # NOTE [Stateful arguments]
            if p.new_signature:
                check_training_cache(region, cap.objects)
            last = self._last_arg_state() if self._last_arg_state is not None else None
            call.arg_state = ArgState.capture(cap.objects, self.arg_state_limit, region.arg_writes, last)
            self._last_arg_state = weakref.ref(call.arg_state)  # NOTE [Capture reuse] in arg_state.py
            if not call.arg_state.complete and region.untracked_state is not False:
                call.writes_state = True  # a replay might not restore it: kept until seen
            if call.arg_state.uncopied:
                call.writes_state = True  # NOTE [State written by the forward]: too large to copy
        if p.recording or call.record:
            cuda_devs = sorted({d.index or 0 for d in devices if d.type == "cuda"})
            if p.known_ptrs is None:
                p.known_ptrs = self._model_storages()  # once per measuring pass
            call.recorder = OpRecorder(
                use_cuda_events=bool(cuda_devs),
                cuda_devices=cuda_devs,
                known_ptrs=p.known_ptrs,
                passive=region.compiled,  # NOTE [Compiled regions]
            )
        placer = self.placer
        assert placer is not None
        state = call.arg_state
        if state is not None and state.complete and state.tensors:  # NOTE [Inputs held by arguments]
            placer.inputs.add_arguments(p, call, state.tensors)
        for i, t in enumerate(cap.tensors):
            if t is None:
                continue
            rec = placer.inputs.add(p, call, t)
            if rec is not None and rec.placement == OFFLOAD and rec.group is not None and reads_bytes_as_stored(t):
                call.offloaded_inputs[i] = (rec, (tuple(t.shape), tuple(t.stride()), int(t.storage_offset()), t.dtype))

    def _settle_buffers(self) -> None:
        """Apply the buffer comparisons of earlier exits whose flags are back, in order,
        and take the copies they let go off the books (NOTE [Buffer comparisons])."""
        queue = self._unsettled
        while queue:
            call = queue[0]()
            state = call.buffers if call is not None else None  # None: released, its copies off the books
            if state is not None and not settle_buffers(state, wait=False):
                return
            queue.popleft()
            if call is not None and state is not None and call.pass_state is not None:
                held = snapshot_bytes(state, self._device.device)
                call.pass_state.stats.resident_bytes -= call.snapshot_bytes - held  # a decrease sets no peak
                call.snapshot_bytes = held

    def exit(self, call: RegionCall) -> None:
        call.hooks_to = hook_ids()
        self._life.call_ended(call)
        region = call.region
        if call.collectives_at_entry >= 0 and tc.collective_sequence() != call.collectives_at_entry:
            self._planner.ran_collective(call)
        rng = call.rng
        if rng is not None and rng.probe is not None and region is not None:
            _note_host_draws(call, region, rng.probe, self._host_draws)
            rng.probe = None
        written: list[int] = []
        if region is not None:
            finish_buffers(call.buffers)
            if call.buffers is not None and call.pass_state is not None:
                if call.buffers.pending and call.pass_state.recording:
                    settle_buffers(call.buffers, wait=True)  # the profile counts the copies kept
                call.snapshot_bytes = copies = snapshot_bytes(call.buffers, self._device.device)
                call.pass_state.stats.add_resident(copies)  # NOTE [Replay and module state]
                if call.buffers.pending:
                    self._unsettled.append(weakref.ref(call))
            if self._unsettled:
                self._settle_buffers()
            written = finish_params(call.params)
            warn_big_buffers(call, region)
            if call.attrs is not None:
                finish_attrs(call, region)  # NOTE [Module attributes], NOTE [Attributes at entry]
        if call.attr_versions is not None and region is not None:
            check_attr_writes(call, region, lambda: self._own_storages(region, call))
        if call.watch is not None and region is not None:
            call.watch.read_copies.clear()  # those a write needs are in its ``external``
            # NOTE [State read from outside]: those the call did not write are as it read them
            wrote = call.watch.written
            region.external_reads = tuple(weakref.ref(t) for ptr, t in call.watch.read.items() if ptr not in wrote)
            call.external_reads = note_external_reads(region.external_reads)
            # NOTE [State the first call made]: read from outside by the later calls
            own = self._own_storages(region, call)
            call.made_state = region.made_state = tuple(
                weakref.ref(t) for t in call.watch.made_state(lambda ptr, st: ptr in own or saved_by(call, ptr, st))
            )
            region.external_reads += region.made_state
            region.generators = [g for g, _ in call.watch.generators.values()]
            region.generator_slots = host_rng.private_slots(region.modules, host_rng.is_generator)
            call.generators = list(call.watch.generators.values())
        scratch = call.kept_from_write  # NOTE [Storages no op made]: unless one was from outside
        if (
            region is not None and call.watch is not None and call.watch.foreign_written
            and call.watch.wrote_outside(lambda ptr, storage: saved_by(call, ptr, storage))
        ):
            scratch = False
            call.external = list(call.watch.external.values())  # its replay runs on them as they were
            call.watch = None
            region.writes_state = True
            warn_foreign(region)
        if region is not None and call.inputs is not None and (not call.writes_state or scratch):
            check_state_writes(region, call, written)
        if call.arg_state is not None and call.inputs is not None:
            check_arg_state(call)
        structure = call.structure
        if (
            call.kept_whole
            and call.fixed is KEEP
            and structure is not None
            and call.storages  # hooked (NOTE [Native keep])
            and call.pass_state is not None
        ):
            self._planner.grew(call.pass_state, call)  # NOTE [Kept planned calls]: if it saved more
        if call.group is not None:
            if call.leased:
                self._groups.issue(call)
            else:
                _unsent_inputs(call)  # NOTE [Calls that saved nothing]: released below, copied for nothing
        # the call's span holds its exit's work and its group's issue, which the learner
        # takes off it as the model adds them back (NOTE [Host time] in scheduler/timeline.py);
        # not a planned release's wait for a copy, below, which no unit of the model holds
        call.end_mark = self._device.mark()
        if call.recorder is None:
            book_forward(call, self._groups)  # before the groups its end frees (NOTE [Forward transients])
        p = call.pass_state
        if p is not None and p.releases:  # NOTE [Planned release] (groups.py)
            self._groups.release_due(p, 2 * call.ordinal + 1)
        if call.offloaded_inputs and call.inputs is not None:
            for i, (rec, _) in call.offloaded_inputs.items():
                # its copy is on the way: the group holds it; not one the forward wrote, whose
                # host copy holds the written values: its replay starts from the watch's copy
                if rec.placement is OFFLOAD and i not in call.inputs.copied:
                    held = call.inputs.tensors[i]
                    watch = tc.version_watch(held) if held is not None else None
                    if watch is not None:  # a later write to it must still show at replay
                        call.inputs.watches[i] = watch
                    call.inputs.tensors[i] = None
        if call.recorder is not None:
            self._planner.record_structure(call)
            book_forward(call, self._groups)
        call.exited = True
        if not call.leased and self.placer is not None:
            self.placer.release_call(call)

    # NOTE [Accumulating backward in a forward]
    # A forward may train something of its own mid-forward: a probe or a local loss whose
    # ``loss.backward()`` accumulates into ``.grad`` (greedy layer-wise and local-learning
    # setups). A replay of that forward would run the backward again and add its
    # gradients a second time, with no error (as under torch.utils.checkpoint). The
    # backward entry tells the runtime of every such backward before it runs (NOTE [Hooks
    # off in backward] in backward_entry.py): each region call whose forward runs on this
    # thread keeps (or offloads) every storage it saves from then on, and its region is
    # never recomputed again (``Region.accumulates``, read by ``Placements.droppable`` and
    # by the planner's profile). What those calls dropped before and still exists is
    # held from then on (a later save of the same storage, after the backward, would
    # otherwise need a replay through it); what they dropped and freed is regenerated
    # by a replay that stops right after its last save (NOTE [Replay], step 5), before
    # the backward. A replay that reaches such a backward all the same (a forward that
    # runs it only in some calls, on a Python counter, say) raises rather than add
    # twice.

    def accumulating_backward(self) -> None:
        """A backward that accumulates into ``.grad`` is about to run on this thread (NOTE
        [Accumulating backward in a forward])."""
        replayed = replayed_regions()
        if replayed:
            raise RuntimeError(
                f"offrecomp: a replay of region {replayed[-1]!r} reached a backward that "
                "accumulates into .grad; running it again would add its gradients twice. "
                "Hint: keep this region (mode='keep', or leave it out with regions=)."
            )
        for call in self._life.stack.calls:
            region = call.region
            if call.exited or region is None:
                continue
            call.forget_placements()  # its later saves go to the rules: kept or offloaded
            hold_dropped(call)
            if region.accumulates:
                continue
            region.accumulates = True
            warn_once(
                f"accumulates:{kind(region)}",
                "offrecomp: region %r (and any other like it) runs a backward that accumulates "
                "into .grad inside its forward; a replay would add those gradients again, so "
                "it is never recomputed",
                call.name,
            )


# NOTE [Calls that saved nothing]
# A region call's inputs join its offload group at its entry (the replay checkpoint),
# before its forward shows whether it saves anything. A call that exits with no dropped
# or offloaded save alive (a block of ``x + bias``, which autograd saves nothing for; one
# whose saves were all kept) has no replay to run: it is released at its exit (NOTE
# [Call leases] in hooks.py), so its group is freed there without its copies being
# issued, and its inputs leave the step's offloaded bytes.


def _unsent_inputs(call: RegionCall) -> None:
    """NOTE [Calls that saved nothing]: ``call``'s open group goes unissued, so its
    storages are not offloaded bytes of the pass."""
    group, p = call.group, call.pass_state
    for rec in call.storages:
        if rec.group is group and rec.placement is OFFLOAD and p is not None:
            p.stats.offloaded_bytes -= rec.nbytes


def first_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    for x in tc.tree_flatten((args, kwargs))[0]:
        if isinstance(x, torch.Tensor):
            return x.device
    return None


def model_storage_ptrs(model: nn.Module | None) -> frozenset[int]:
    """Data pointers of every parameter and buffer (recorded passes and first calls)."""
    if model is None:
        return frozenset()
    return frozenset(storage_ptrs([*model.parameters(), *model.buffers()]))


def _entry_generators(region: Region, arguments: list[torch.Generator]) -> list[tuple[torch.Generator, torch.Tensor]]:
    """The states at entry of the generators a call may draw from (NOTE [Private
    generators] in replay.py): those its region's first call drew from, those its
    modules hold now as attributes or one step from one (one assigned since, each step,
    say, or one the first call did not draw from), and those among its arguments."""
    seen: dict[int, torch.Generator] = {id(g): g for g in region.generators}
    for slot in region.generator_slots:
        g = host_rng.at(slot)
        if isinstance(g, torch.Generator):
            seen.setdefault(id(g), g)
    for g in arguments:
        seen.setdefault(id(g), g)
    return [(g, g.get_state()) for g in seen.values()]


def _host_rngs(region: Region, arguments: list[Any]) -> list[Any]:
    """The RNG objects of Python's or numpy's that a call of ``region`` may draw from:
    its modules' (found at its first call) and its arguments' (NOTE [Host random
    states])."""
    slots = region.rng_slots
    if slots is None:
        slots = region.rng_slots = host_rng.private_slots(region.modules)
    if not slots and not arguments:
        return arguments
    objects = host_rng.private_objects(slots, arguments)
    if objects and not region.host_rng & host_rng.PRIVATE:
        region.host_rng |= host_rng.PRIVATE
        log_once(
            f"host-rng:{kind(region)}:private", logging.INFO,
            "offrecomp: region %r (and any other like it) holds or takes RNG objects of "
            "Python's or numpy's (%s); its calls capture their states for their replays",
            region.name, ", ".join(sorted({type(o).__name__ for o in objects})),
        )
    return objects


def _note_host_draws(
    call: RegionCall, region: Region, entry: host_rng.HostStates, by_class: MutableMapping[type, int]
) -> None:
    """A probed call's exit: the global RNGs of Python and numpy its forward drew from
    are captured at the calls of its region, and of every region of its block's class
    (``by_class``), from now on, and this call's replays run from its entry's states
    (NOTE [Host random states])."""
    kinds = host_rng.drawn(entry)
    if not kinds or kinds & ~region.host_rng == 0:
        return
    region.host_rng |= kinds
    by_class[type(region.module)] = by_class.get(type(region.module), 0) | kinds
    rng = call.rng
    if rng is not None:
        rng.host = host_rng.only(entry, region.host_rng, rng.host.private if rng.host is not None else ())
    names = " and ".join(n for bit, n in ((host_rng.PY, "Python's random"), (host_rng.NUMPY, "numpy's global RNG")) if kinds & bit)
    if region.host_calls > host_rng.PROBES:
        warn_once(
            f"host-rng-late:{kind(region)}:{kinds}",
            "offrecomp: region %r (and any other like it) drew from %s at its call %d, "
            "none of its first %d having drawn; one call in %d is checked after those, so "
            "replays of its calls since the previous check may have drawn other numbers "
            "than their forward (those steps' gradients then differ from a plain run's). "
            "Its calls capture that state from now on; to be safe from the start, keep "
            "its activations (leave it out with regions=)",
            region.name, names, region.host_calls, host_rng.PROBES, host_rng.REPROBE,
        )
        return
    log_once(
        f"host-rng:{kind(region)}:{kinds}", logging.INFO,
        "offrecomp: region %r (and any other like it) draws from %s; its calls capture that "
        "state for their replays",
        region.name, names,
    )

