"""The pass and step lifecycle: which pass a save or a forward belongs to, when its
backward begins and ends, and when a step ends.

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
backward before the next forward starts. A pass's stages: NOTE [Pass stages].

NOTE [Double backward]
A gradient penalty (WGAN-GP, StyleGAN's R1) differentiates the forward's graph with
create_graph=True, then the loss that holds the penalty is differentiated again: two
backwards of one pass. A backward that saves tensors outside any region's forward
(create_graph), or makes a graph under another saved-tensor hook pair than the runtime's
on its thread (its saves unseen: ``graph_made_unseen``; such a backward of another graph
makes the pass wait for the next forward or optimizer step), leaves its pass AWAITING:
saves outside a forward still belong to it, the next backward that reads its saves ends
it, and a new forward or an optimizer step ends it if none does. The pass's backward then spans both, as its step does, so the plan sees
the penalty's ops and the second backward's replays as part of the pass they belong to.

NOTE [Several backwards]
Two forwards whose losses are differentiated one at a time (multi-task losses, a loop
that backwards each micro-batch's loss only after all forwards ran) make one pass with
two backwards. Each root forward's output nodes carry a marker that a backward running
them sets (``GraphMarker.reached``); a backward that ends while a forward of its pass
has an output graph alive that no backward reached leaves the pass AWAITING, as a
double backward does: the next backward that reads its saves runs as the pass's, and a
new forward or an optimizer step ends it if none comes (a backward of it that runs
later is split off: NOTE [Split backwards] in planning/profiling.py). The pass's record
and its step then hold every backward's replays and time (the time between the
backwards included, as for a double backward). A measuring pass times each call's
backward from its replay's end to what came next in time, the next replay or its
backward's end (``backward_ends``), since the backwards run the calls out of reverse
forward order.
While it awaits, a save outside any forward begins the next pass (the next step's
work before its forward; a double backward's pass takes such saves instead), and a pass
ended so ends at its last backward's end (its wall time holds no idle wait). A loop
without an optimizer sees such a step's record only once the next forward began.
``retain_graph=True`` twice, or two losses over one output, reach the output on the
first backward: the pass ends there, and the second backward counts in no step (the
planner models one backward per pass; a pass with several through one graph would
calibrate against replays it does not predict): neither its replays nor the offload
engine's reloads of a finished pass's groups (their stalls, bytes and host time).

A root forward's outputs are watched from outputs.py (NOTE [Backward without saves],
NOTE [Saves outside the forward]).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from offrecomp import _torch_compat as tc
from offrecomp import outputs
from offrecomp.config import Config
from offrecomp.diagnostics import warn_once
from offrecomp.measure import DeviceClock, Mark
from offrecomp.params import let_go_released, note_stepped
from offrecomp.phases import Phase
from offrecomp.report import StepRecord
from offrecomp.signatures import UNNAMED, Part, PassSignatures, shown
from offrecomp.state import PassState, RegionCall, Stage
from offrecomp.transfer import BACKWARD_START
from scheduler.plan import ROOT

if TYPE_CHECKING:
    from offrecomp.groups import OffloadGroups
    from offrecomp.placement import Placements
    from offrecomp.planning import Planner

log = logging.getLogger(__name__)

__all__ = ["REPORT_MAX_STEPS", "Lifecycle"]

#: Passes without an optimizer step before every pass counts as a step: accumulation over
#: up to this many micro-batches (with steps a gradient scaler skipped) is one first step;
#: the passes held meanwhile hold their records, no tensor (about 8 objects per region call).
_MAX_PROVISIONAL = 64
#: Root forwards one pass joins at most (NOTE [Dropped graphs]); the next begins a new pass.
MAX_FORWARDS = 64
#: Step records ``report()`` holds (the most recent; about 3 KB each, 30 MB in all). A run of a million
#: steps would otherwise hold gigabytes of host memory; OFFRECOMP_REPORT writes every step.
REPORT_MAX_STEPS = 10_000

FORWARD, BACKWARD, AWAITING, DONE = Stage.FORWARD, Stage.BACKWARD, Stage.AWAITING, Stage.DONE
#: The phases whose passes teach a profile (measured, calibrated, planned).
_LEARNT = frozenset((Phase.MEASURE, Phase.CALIBRATE, Phase.PLANNED))


class _CallStack(threading.local):
    def __init__(self) -> None:
        self.calls: list[RegionCall] = []
        self.roots = 0  # root forwards running (NOTE [Pass signatures]: an inner one adds nothing)


class Lifecycle:
    """Passes, the region calls running now, and steps (NOTE [Passes and steps])."""

    def __init__(
        self,
        config: Config,
        device: DeviceClock,
        planner: Planner,
        groups: OffloadGroups,
        placements: Placements,
    ) -> None:
        self._config = config
        self._device = device
        self._planner = planner
        self._groups = groups
        self._placements = placements
        self.current: PassState | None = None  # the pass forward activity joins
        self.stack = _CallStack()  # region calls whose forward runs (this thread)
        self.forwards_running = 0  # region calls whose forward has not returned (any thread)
        self.recording = False  # an op recorder is active (measuring pass, inside a region)
        # the part the next forward activity takes (``next_part``) and the region whose
        # call named it ("": a root forward)
        self._next: tuple[Part, str] | None = None
        self.parts_begun = 0  # ``next_part`` calls: root forwards, and region calls naming a pass
        self._signs = PassSignatures(planner, placements)  # NOTE [Pass signatures]
        self._ooms: int | None = None  # the allocator's OOM count when the last pass ended
        self.steps: deque[StepRecord] = deque(maxlen=REPORT_MAX_STEPS)
        self.explicit_steps = False  # inside rt.step(): only the block's end closes the step
        self.report_file: Any = None
        self._passes = 0
        self._step_passes: list[PassState] = []
        self._step_count = 0  # steps recorded (the next record's number)
        self._saw_optimizer = False
        self._stepped_in_backward = False  # an optimizer stepped inside the running backward
        self._no_optimizer = False
        self._provisional: list[tuple[StepRecord, list[PassState]]] = []
        self._unwritten: list[StepRecord] = []  # confirmed steps not yet written to the report file
        self._retiring: list[PassState] = []  # ended steps' passes (NOTE [Pass retirement])
        self._live: weakref.WeakSet[PassState] = weakref.WeakSet()  # every pass not collected yet
        self._step_folded = 0  # passes folded into the running step's others (NOTE [Dropped graphs])
        self._warned_forwards = False
        # per optimizer: its parameter lists' identities, and whether it steps the model's
        # parameters (NOTE [Optimizers of other models])
        self._optimizers: weakref.WeakKeyDictionary[Any, tuple[tuple[tuple[int, int], ...], bool]] = (
            weakref.WeakKeyDictionary()
        )
        self._reached: outputs.Reached = weakref.WeakMethod(self.output_reached)  # what watched outputs call
        self._other_task = -1  # the latest backward timed as another pass's (``other_backward``)

    # ----------------------------------------------------------------- calls

    def current_call(self, p: PassState) -> RegionCall:
        """The region call running now, or the pass's root call."""
        stack = self.stack.calls
        if stack:
            return stack[-1]
        if p.root is None:
            p.root = RegionCall(name=ROOT, call_index=0, ordinal=-1)
            p.root.pass_state = p
            self._planner.assign(p, p.root)
            p.root.fixed = self._placements.fixed(p.root)
        return p.root

    def call_started(self, call: RegionCall) -> None:
        self.stack.calls.append(call)
        self.forwards_running += 1
        self.recording = call.recorder is not None

    def call_ended(self, call: RegionCall) -> None:
        self.forwards_running = max(0, self.forwards_running - 1)
        self.recording = False
        stack = self.stack.calls
        if stack and stack[-1] is call:
            stack.pop()

    def reset_calls(self) -> None:
        """The runtime exits: no region call runs any more."""
        self.stack.calls.clear()
        self.stack.roots = 0
        self.forwards_running = 0

    def mark(self) -> Mark:
        return self._device.mark()

    # ---------------------------------------------------------------- passes

    def forward_activity(self, *, between_backwards: bool = False) -> PassState:
        """The pass a save or a forward belongs to; a new one after a backward.
        ``between_backwards``: a save outside any forward (the root's ops), which belongs
        to a pass awaiting its second backward (NOTE [Double backward])."""
        p = self.current
        if between_backwards and p is not None and p.stage is AWAITING and not p.aborted and not p.awaits_other:
            return p  # NOTE [Double backward]; not [Several backwards]: the next pass's
        pending = self._next
        if pending is not None and p is not None and p.stage is FORWARD and not p.aborted and self._ends_here(p):
            p.aborted = True  # NOTE [Dropped graphs]: the root forward begins a pass of its own
        if p is None or p.stage is not FORWARD or p.aborted:
            if p is not None and self._stepped_in_backward:
                self._optimizer_stepped()  # its backward's end went unseen: end the step now
            elif p is not None:
                self.finish_pass()
            p = self._begin_pass()
        elif pending is not None:
            # a root forward joining the running pass (taken here: it must not become the
            # next pass's): the pass's first when the pass began at a save before any
            # forward (``model(model.embed(x))``), else one more (NOTE [Pass signatures])
            self._next = None
            part, region = pending
            if p.parts:
                p.named_by = p.named_by or region  # its later calls outside a forward are parts too
                self._signs.join(p, part)
            elif not p.calls:
                self._signs.adopt(p, part, region)
        return p

    def _ends_here(self, p: PassState) -> bool:
        """NOTE [Dropped graphs]: does a root forward that begins now end the running pass
        ``p`` and begin one of its own, rather than join it?"""
        if p.graphs and all(r() is None for r in p.graphs[0]):
            return True  # its first forward's graphs are gone: dropped without backward
        if len(p.parts) < MAX_FORWARDS:
            return False
        if not self._warned_forwards:
            self._warned_forwards = True
            log.warning(
                "offrecomp: %d root forwards joined one pass (signature %s) and no backward "
                "began; a pass holds at most %d, so the next begins a new one. Gradients are "
                "unchanged, but step records and auto's plans see such a pass in pieces. A "
                "forward with grad whose output is kept but never differentiated "
                "(predictions collected in a list) belongs under torch.no_grad()",
                len(p.parts), shown(p.signature), MAX_FORWARDS,
            )
        return True

    def wants_signature(self, region: str) -> bool:
        """Does a call of ``region`` outside every root forward name a part of the pass
        (NOTE [Pass signatures])? Yes when it begins a pass, joins one that has no
        signature yet, or is one more call of the region that named its pass (a loop
        calling ``model.compute_loss`` twice)."""
        if self._next is not None:
            return False  # a root forward named it already
        p = self.current
        if p is None or p.stage is not FORWARD or p.aborted or not p.parts:
            return True
        return not self.stack.roots and p.named_by in ("", region)

    def next_part(self, part: Part, region: str = "") -> None:
        """The next forward activity is a root forward (or a call of ``region``) whose
        inputs have signature, family and sizes ``part``."""
        self._next = (part, region)
        self.parts_begun += 1

    def _begin_pass(self) -> PassState:
        p = PassState(index=self._passes, signature=UNNAMED, mode=self._config.mode)
        pending, self._next = self._next, None
        if pending is not None:
            self._signs.choose(p, *pending)
        self._passes += 1
        self._live.add(p)
        self._signs.note(p)
        self._planner.begin_pass(p)
        if self._ooms is None:
            self._ooms = self._device.oom_count()  # those before the first pass are not ours
        p.start_time = time.perf_counter()
        p.start_mark = self._device.mark()
        device = self._device.device
        if self._device.cuda:
            p.alloc_start = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        self.current = p
        return p

    def backward_activity(self, call: RegionCall, *, reached: bool = False) -> None:
        """An unpack of ``call``'s save in a backward (or, ``reached``, a backward reached
        its pass's output): its pass's backward began, or a later one of it (NOTE
        [Double backward])."""
        p = call.pass_state
        if p is None:
            return
        if p.stage is FORWARD and call is p.root and p.graphs and not reached:
            return  # NOTE [Saves outside the forward] (outputs.py): maybe another model's backward
        if p.stage is not FORWARD:
            task = tc.current_graph_task_id()
            if p.stage is AWAITING and task != p.backward_task:  # NOTE [Double backward]: the next one
                p.stage = BACKWARD
                p.awaits_other = False
                p.backward_task = task
                with contextlib.suppress(RuntimeError):
                    tc.queue_backward_callback(functools.partial(self._backward_done, weakref.ref(p)))
            return
        for c in p.calls:  # NOTE [Parameters released by their owner]: hooks may free them late
            if c.region is not None:
                let_go_released(c.params, c.region.param_data, p.index)
        self._signs.settle(p)
        if p.parts and not p.aborted:
            self._signs.ran(p)
        p.stage = BACKWARD
        p.backward_task = tc.current_graph_task_id()
        p.backward_start_mark = self._device.mark()
        if p.root is not None and p.root.group is not None:
            self._groups.issue(p.root)  # NOTE [Offload groups]: the last run of root saves
        if p.releases:  # NOTE [Planned release] (groups.py): forward's last unit ends
            self._groups.release_due(p, BACKWARD_START)
        with contextlib.suppress(RuntimeError):
            tc.queue_backward_callback(functools.partial(self._backward_done, weakref.ref(p)))

    def output_reached(self, call: RegionCall) -> None:
        """A backward reached a watched output of ``call``'s pass (outputs.py)."""
        self.backward_activity(call, reached=True)

    def watch_graphs(self, p: PassState, outs: list[torch.Tensor]) -> None:
        """NOTE [Dropped graphs]: mark the graphs ``outs`` (a root forward's, or those of
        a call of the region that names a pass without one) while ``p`` runs forward."""
        if p is self.current and p.stage is FORWARD:
            outputs.mark_graphs(p, outs, self._reached)
            self._watch_other_backwards(p, outs)

    def _watch_other_backwards(self, p: PassState, outs: list[torch.Tensor]) -> None:
        """NOTE [Backwards of other passes] (planning/profiling.py): a backward through
        ``outs`` (an output of ``p``) that runs while another pass is the running one is
        timed into that pass's ``other_backwards``. Only auto learns from the times."""
        if self._config.mode != "auto":
            return
        hook = functools.partial(_other_backward, weakref.ref(self), weakref.ref(p))
        nodes = {id(t.grad_fn): t.grad_fn for t in outs if t.grad_fn is not None}
        for fn in nodes.values():
            fn.register_prehook(hook)

    def other_backward(self, q: PassState) -> None:
        """A backward reached an output of ``q``: when another pass runs now, and the
        backward is not that pass's own, its start and end go into that pass's
        ``other_backwards`` (NOTE [Backwards of other passes] in planning/profiling.py)."""
        p = self.current
        task = tc.current_graph_task_id()
        if p is None or p is q or task in (-1, p.backward_task, self._other_task):
            return
        self._other_task = task  # once per backward, whichever of q's outputs it reaches
        start = self._device.mark()
        with contextlib.suppress(RuntimeError):
            tc.queue_backward_callback(functools.partial(self._other_backward_done, weakref.ref(p), start))

    def _other_backward_done(self, pref: weakref.ref[PassState], start: Mark) -> None:
        p = pref()
        if p is not None:
            p.other_backwards.append((start, self._device.mark()))

    def device_moved(self) -> None:
        """The runtime's device changed (NOTE [Model devices] in context.py): the next pass
        end reads its allocator's out-of-memory count as a baseline, not as new errors."""
        self._ooms = None

    def graph_made_unseen(self) -> None:
        """A backward that makes a graph is about to run under another saved-tensor hook
        pair than the runtime's, which sees none of its saves: outside a forward, the pass
        it differentiates awaits the backward that reads them (NOTE [Double backward])."""
        p = self.current
        if p is not None and not self.forwards_running and p.stage is not DONE:
            p.create_graph = True

    def _backward_done(self, pref: weakref.ref[PassState]) -> None:
        p = pref()
        if p is None:
            return
        p.backward_ends.append(self._device.mark())
        if p.create_graph and p is self.current:
            p.create_graph = False
            p.stage = AWAITING  # NOTE [Double backward]: a later backward differentiates it
            p.double_backward = True
            return
        if p is self.current and not self._stepped_in_backward and outputs.awaits_backward(p.graphs):
            p.stage = AWAITING  # NOTE [Several backwards]: a forward's graph still waits for one
            p.awaits_other = True
            return
        if p.phase in _LEARNT:
            p.mark_held()  # NOTE [Held past backward] (scheduler/timeline.py)
        p.stage = DONE
        if p is self.current:
            if self._stepped_in_backward:
                self._optimizer_stepped()  # NOTE [Passes and steps]: optimizer in backward
            else:
                self.finish_pass()  # the pass is over: plan, account, maybe close the step

    def finish_pass(self) -> None:
        p = self.current
        if p is None:
            return
        end = time.perf_counter()
        if p.stage is AWAITING:  # NOTE [Double backward], [Several backwards]: no other backward came
            p.stage = DONE
            if p.backward_end_mark is not None:
                end = p.backward_end_mark.host  # its work ended there, not at this call
        elif p.stage is FORWARD:
            self._signs.settle(p)
        self.current = None
        p.end_time = end
        stats = self._device.allocator_stats()
        if self._device.cuda:  # torch.cuda.max_memory_allocated reads the same counter
            p.device_peak = int(stats.get("allocated_bytes.all.peak", 0)) - p.alloc_start
        self._count_ooms(p, stats)
        for call in p.all_calls():  # counted here, not on the save path
            p.stats.saved_tensors += call.pack_count
            if not call.native:
                p.stats.hooked_saves += call.pack_count
            p.stats.storages += len(call.storages)
        if p.stage is DONE:
            self._groups.release_reloads(p)  # NOTE [Reloads at a backward's end] in groups.py
        p.offload_stats = self._groups.end_step()
        self._placements.end_pass(p)
        self._planner.end_pass(p)
        step = self._step_passes
        if step and _unfinished(step[-1]) and _unfinished(p):
            self._fold(step[-1], p)
        else:
            step.append(p)
        if not self._saw_optimizer and not self.explicit_steps:
            self.end_step(explicit=False, provisional=not self._no_optimizer)

    def _fold(self, into: PassState, p: PassState) -> None:
        """NOTE [Dropped graphs]: ``p`` and the step's last pass ``into`` both ended
        before a backward: ``into`` takes ``p``'s counts for the step record, and ``p``
        retires now unless a saved tensor still leases one of its calls."""
        _add_counts(into, p)
        self._step_folded += 1
        if not self._planner.holds(p) and not any(c.leased for c in p.all_calls()):
            p.stage = DONE  # no backward can replay or reload it, and it was counted
            p.retire()

    def root_returned(self, p: PassState, out: Any) -> None:
        """A root forward of ``p`` returned ``out``."""
        self.stack.roots = max(0, self.stack.roots - 1)
        p.roots_running = max(0, p.roots_running - 1)
        if p is self.current and p.stage is FORWARD:
            outs = outputs.output_tensors(out)
            outputs.watch_unseen_backward(p, outs, self._reached)  # NOTE [Backward without saves]
            outputs.mark_graphs(p, outs, self._reached)
            self._watch_other_backwards(p, outs)

    def root_failed(self, p: PassState, exc: BaseException) -> None:
        """A root forward of ``p`` raised ``exc``."""
        self.stack.roots = max(0, self.stack.roots - 1)
        p.roots_running = max(0, p.roots_running - 1)
        self.abort(p, exc)

    def abort(self, p: PassState | None, exc: BaseException | type[BaseException] | None = None) -> None:
        """A forward error (or a fault at exit) ends the pass; the next forward starts
        anew. An out-of-memory error tells the planner."""
        if p is None:
            return
        p.aborted = True
        oom = isinstance(exc, torch.OutOfMemoryError) or (
            isinstance(exc, type) and issubclass(exc, torch.OutOfMemoryError)
        )
        if oom:
            self.on_oom(p)

    def _count_ooms(self, p: PassState, stats: dict[str, Any]) -> None:
        """NOTE [Unseen out-of-memory errors]: did the allocator raise one since the last
        pass ended (``stats``: its counters now)?"""
        ooms = self._device.oom_count(stats)
        seen, self._ooms = self._ooms, ooms
        if seen is not None and ooms > seen:
            self.on_oom(p)

    def on_oom(self, p: PassState | None) -> None:
        if self._ooms is not None:
            self._ooms = self._device.oom_count()  # this one is told: the pass end must not count it again
        if p is not None and not p.oom_seen:
            p.oom_seen = True
            self._planner.on_oom(p)

    # ----------------------------------------------------------------- steps

    def on_optimizer_step(self, optimizer: Any, *_: Any) -> None:
        p = self.current
        if (
            p is not None and p.parts
            and (p.stage is FORWARD or (p.stage is BACKWARD and tc.current_graph_task_id() == -1))
            and not self._steps_model(optimizer)
        ):
            return  # NOTE [Optimizers of other models]
        if self._config.mode != "keep" and tc.autocast_cache_active():
            warn_once(
                "autocast_step",
                "offrecomp: an optimizer stepped inside a torch.autocast context whose weight "
                "cache is on: the forwards after it in that context run on casts made before "
                "the step, which a replay cannot reproduce (it casts the updated weights). "
                "Enter autocast around each forward (the AMP recipe), or pass "
                "cache_enabled=False",
            )
        in_backward = tc.current_graph_task_id() != -1
        if not in_backward and self.stack.roots and p is not None and p.stage is FORWARD:
            warn_once(
                "step-in-forward",
                "offrecomp: an optimizer stepped inside the forward of the model the runtime "
                "was given: its forward runs a training step of its own (test-time adaptation), "
                "whose backward runs inside the forward and so is not the pass's; auto never "
                "plans such passes. Give the runtime the module that step trains "
                "(offrecomp.runtime(inner_model)), or call the outer one under torch.no_grad()",
            )
        if not in_backward:
            self._stepped_before_backward(optimizer)
        if self.explicit_steps:
            return  # inside rt.step(): the block's end closes the step
        if in_backward:
            self._stepped_in_backward = True  # the step ends with this backward
            return
        self._optimizer_stepped()

    def _stepped_before_backward(self, optimizer: Any) -> None:
        """NOTE [Steps before the backward] (params.py): ``optimizer`` stepped outside a
        backward: the replays of calls a backward may still reach (not released, in any
        pass: one a later forward ended too) must not read what it stepped."""
        stepped = {  # a parameter without a gradient is skipped by the step
            id(q) for g in getattr(optimizer, "param_groups", None) or () for q in g.get("params", ())
            if getattr(q, "grad", None) is not None
        }
        if not stepped:
            return
        for p in list(self._live):
            for call in p.all_calls():
                if call.params is not None and not call.released:
                    note_stepped(call.params, stepped)

    def _steps_model(self, optimizer: Any) -> bool:
        """NOTE [Optimizers of other models]: does ``optimizer`` step a parameter of the
        model (or is there no model whose parameters tell)? Answered again only when its
        parameter lists change."""
        groups = getattr(optimizer, "param_groups", None)
        try:
            key = tuple((id(g["params"]), len(g["params"])) for g in groups or ())
        except (KeyError, TypeError):
            return True
        hit = self._optimizers.get(optimizer)
        if hit is not None and hit[0] == key:
            return hit[1]
        model = {id(q) for q in self._groups.parameters()}
        ours = not model or any(id(q) in model for g in groups or () for q in g["params"])
        with contextlib.suppress(TypeError):  # an optimizer without weak references: asked each time
            self._optimizers[optimizer] = (key, ours)
        return ours

    def _optimizer_stepped(self) -> None:
        self._stepped_in_backward = False
        p = self.current
        if p is not None and (
            p.stage is not FORWARD
            or not (self.stack.roots or self.forwards_running or outputs.awaits_backward(p.graphs))
        ):
            # a pass whose forward ran for no backward (its outputs dropped: an evaluation
            # with grad on, a callback's forwards) ends with the step it ran in, not in the
            # next one; one whose output graph lives may still get its backward
            self.finish_pass()
        if not self._saw_optimizer and self._provisional:
            # NOTE [Passes and steps]: until the first optimizer step every pass was a
            # provisional step; they were micro-batches of this one.
            merged: list[PassState] = []
            for rec, passes in self._provisional:
                with contextlib.suppress(ValueError):  # already out of the bounded report
                    self.steps.remove(rec)
                self._step_count -= 1
                self._planner.discard(rec)
                merged += passes
            self._provisional = []
            self._step_passes = merged + self._step_passes
        self._saw_optimizer = True
        self.end_step(explicit=False)

    def end_step(self, *, explicit: bool, provisional: bool = False) -> None:
        if explicit and self.current is not None:
            p = self.current
            if p.stage is FORWARD and any(c.pack_count for c in p.all_calls()):
                warn_once(
                    "step-before-backward",
                    "offrecomp: rt.step() closed a step whose forward saved tensors for a backward "
                    "that had not begun: a backward after the block belongs to no step, so its "
                    "pass never shows a whole step (auto measures it again every time). Put the "
                    "backward inside the `with rt.step():` block.",
                )
            self.finish_pass()
        passes, self._step_passes = self._step_passes, []
        folded, self._step_folded = self._step_folded, 0
        if not passes:
            return
        rec = self._planner.step_record(self._step_count, passes)
        rec.passes += folded  # NOTE [Dropped graphs]
        self._step_count += 1
        if self._step_count == REPORT_MAX_STEPS + 1:
            log.info(
                "offrecomp: the report holds the last %d steps; older ones leave it from now "
                "on (OFFRECOMP_REPORT=path writes every step)",
                REPORT_MAX_STEPS,
            )
        self.steps.append(rec)
        if provisional:
            self._provisional.append((rec, passes))
            if len(self._provisional) > _MAX_PROVISIONAL:
                self._no_optimizer = True  # no torch optimizer in this loop: a pass is a step
                self._confirm_provisional()
            else:
                self.resolve(wait=False)  # times and learning now; writing once confirmed
            return
        self._unwritten.append(rec)
        self._retiring += passes
        self.resolve(wait=False)

    def close_steps(self) -> None:
        """The runtime exits: the running pass and step end here; a step of nothing but
        saves outside every forward, for no backward (a weight made once from parameters,
        as pruning's ``weight_orig * mask``), is no step."""
        if self._stepped_in_backward:
            self._optimizer_stepped()
        self.finish_pass()
        passes = self._step_passes
        if passes and all(not p.parts and not p.calls and p.backward_start_mark is None for p in passes):
            self._step_passes = []
            self._step_folded = 0
            self._retiring += passes
        self.end_step(explicit=False, provisional=not self._saw_optimizer and not self._no_optimizer)
        self._confirm_provisional()
        self.resolve(wait=True)

    def _confirm_provisional(self) -> None:
        self._unwritten += [rec for rec, _ in self._provisional]
        for _, passes in self._provisional:
            self._retiring += passes
        self._provisional = []
        self.resolve(wait=False)

    def resolve(self, *, wait: bool) -> None:
        """Fill step times whose events landed; write confirmed, timed records in order."""
        self._planner.resolve(wait=wait)
        untimed = self._planner.pending_ids()
        while self._unwritten and id(self._unwritten[0]) not in untimed:
            rec = self._unwritten.pop(0)
            if self.report_file is not None:
                self.report_file.write(json.dumps(rec.to_dict()) + "\n")
                self.report_file.flush()
        self._retire()

    def __del__(self) -> None:
        # NOTE [Pass retirement]: gone, it reads its passes no more, nor does a backward
        # (a save through the hooks holds them, and they this); those the planner holds
        # it retires when it goes (PassHolder in state.py)
        try:  # never raise from a finaliser
            for p in list(self._live):
                if not self._planner.holds(p):
                    p.retire(orphaned=True)
        except Exception:
            pass

    def _retire(self) -> None:
        """Retire the ended steps' passes the planner holds no longer; one that cannot
        retire is left to the collector, or to ``__del__`` (NOTE [Pass retirement])."""
        held = []
        for p in self._retiring:
            if self._planner.holds(p):
                held.append(p)
            else:
                p.retire()
        self._retiring = held

    # ---------------------------------------------------------------- replays

    def replay_started(self, call: RegionCall, start: Mark, end: Mark, *, timed: bool = True) -> None:
        p = call.pass_state
        if p is None:
            return
        if timed:
            p.replay_marks.append((call.ordinal, start, end))
        p.backward_reached(call.ordinal)


# NOTE [Unseen out-of-memory errors]
# An out-of-memory error raised where the runtime has no wrapper (the loss or the LM
# head computed in the loop, the backward, the optimizer's first step that allocates its
# state) is caught by the loop's retry logic and never reaches the planner, which then
# runs the same plan into the same wall. The CUDA caching allocator counts every OOM it
# raises (``num_ooms``): each pass, as it ends, compares the count with the one at the
# last pass's end, and a rise tells the planner as an OOM inside the pass would (a
# smaller budget for its signature). A pass whose graph was dropped after an error ends
# when the next root forward finds it so (NOTE [Dropped graphs]), and counts then.


# NOTE [Dropped graphs]
# A forward with grad whose graph is dropped without backward (a metric or validation
# forward, an EMA model evaluated with grad on) leaves its pass in the forward stage; the
# next training forward would join it, and run under the metric's signature and plan.
# Each root forward (and, in a pass without one, each call of the region that names it:
# NOTE [Pass signatures]) hangs a marker object on the autograd nodes of the tensors it
# returns (``grad_fn.metadata``; the first WATCHED_OUTPUTS tensors that require grad, in
# any container pytree flattens and in dataclass fields), and the pass keeps weak
# references to them, per forward; a backward reaching one of those nodes begins the
# pass (NOTE [Saves outside the forward]).
# A root forward that begins while the running pass's first forward has no graph left
# ends that pass (as aborted: it taught nothing) and begins its own. Graphs still
# referenced (two forwards, then one backward of both) keep their markers, and the
# forward joins the pass. The first forward decides, not every one: in an evaluation
# loop without no_grad (``out = model(x)``), the previous batch's graph lives until
# ``out`` is rebound, after the next forward ran, so every forward finds a live graph;
# its oldest is always gone, and the loop runs as passes of two forwards. A loss of
# several forwards whose middle one is detached (a target) keeps its first graph, and
# stays one pass. A forward that left a graph alive in an ended pass may still be
# differentiated: its backward reads its own saves and replays its own calls, and counts
# in no step (the pass was recorded when it ended).
#
# A pass joins at most MAX_FORWARDS root forwards; the next begins a new pass, with one
# warning per runtime. That bounds a pass whose every graph is held and never
# differentiated (predictions collected with grad on), and one whose forwards return no
# graph at all (a frozen model evaluated with grad on), as their records and joined
# signature (NOTE [Pass signatures]) would otherwise grow with every forward.
#
# A step keeps one pass for a run of passes that ended before a backward (dropped
# graphs, failed forwards): each later one adds its counts to it (its record counts them
# all) and retires at once when no saved tensor leases one of its calls, so an
# evaluation loop with grad on between two optimizer steps holds one pass's records,
# not one per batch.


def _other_backward(lref: weakref.ref[Lifecycle], pref: weakref.ref[PassState], _grads: Any) -> None:
    """A backward reached an output of a pass (NOTE [Backwards of other passes] in
    planning/profiling.py)."""
    life, q = lref(), pref()
    if life is not None and q is not None:
        life.other_backward(q)


def _unfinished(p: PassState) -> bool:
    """``p`` ended before a backward began (NOTE [Dropped graphs])."""
    return p.aborted and p.stage is FORWARD


def _add_counts(into: PassState, p: PassState) -> None:
    """``p``'s counts into ``into``, as a step record sums them (NOTE [Dropped graphs])."""
    into.stats.add(p.stats)
    into.end_time = p.end_time
    into.planner_seconds += p.planner_seconds
    if p.device_peak is not None:
        into.device_peak = max(into.device_peak or 0, p.device_peak)
    o, q = into.offload_stats, p.offload_stats
    if o is None or q is None:
        into.offload_stats = q if o is None else o
    else:  # the sums a step record reads; the rest is the latest's
        into.offload_stats = dataclasses.replace(
            q,
            bytes_d2h=o.bytes_d2h + q.bytes_d2h,
            bytes_h2d=o.bytes_h2d + q.bytes_h2d,
            stall_seconds=o.stall_seconds + q.stall_seconds,
        )


# NOTE [Optimizers of other models]
# Steps end at an optimizer step, seen through torch's global post-step hook, which every
# optimizer in the process calls. An optimizer that steps while the running pass is
# between its forward and its backward is another model's (the model's own parameters
# stepped there would change what its backward reads): a GAN's discriminator, trained
# between the generator's forward and its backward. Ending the step there would cut a
# step of several micro-batches in two, so there only an optimizer with a parameter of
# the runtime's model among its parameters ends the step, and so while its backward runs
# and the optimizer's thread runs none (another thread's model, stepping meanwhile; an
# optimizer stepping inside a backward ends the step with it). The answer is kept per
# optimizer until its parameter lists change (a group added, a list replaced or grown),
# so the hook reads one tuple per step. A runtime whose model has no parameters (or none
# given) counts every optimizer. Anywhere else every optimizer ends the step: one over
# parameters outside the model (a prompt or input embeddings trained while the model is
# frozen, fp32 master copies of the weights) is the loop's.
