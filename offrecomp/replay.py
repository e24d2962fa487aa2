"""Replay: regenerate a region call's dropped activations by rerunning its forward.

NOTE [Replay]
The first backward access to a dropped tensor of a region call replays that call:
  1. the region's captured inputs come back as fresh leaves (from the device, or from
     host memory when the inputs were offloaded);
  2. the CPU and CUDA RNG states are set to what they were when the forward entered
     the region, so dropout draws the same masks; the caller's RNG state is restored
     afterwards, so backward's own randomness is untouched. The same goes for the
     region's own generators (NOTE [Private generators]);
  3. the autocast state of the forward is re-entered, grad is enabled, and the
     region's modules are in the train/eval mode the forward saw;
  4. buffers the forward mutated get their entry values for the replay and their
     post-forward values back after it (NOTE [Replay and module state]);
  5. an inner saved-tensor hook pair numbers the saves exactly as the forward did and
     captures only the ones that were dropped and are still needed; right after the
     last of them it stops the forward by raising a private exception, so nothing past
     it is recomputed (early stop). Autograd saves an op's inputs before its kernel
     runs, and an op may fill an input it saves (``rrelu_with_noise`` writes its
     ``noise``); such an input cannot require grad (autograd would see a write to it),
     and no op wrote it yet (version 0: ``empty_like`` made it). So when the op that made
     the last needed save also made a needed save like that, that op finishes first:
     the replay stops at the first op after it (the saves of one op read one autograd
     sequence number, a later op's a larger one), under the serving mode before the op
     itself when it writes none of its arguments. A dropout mask (written by
     ``bernoulli_``), a tensor that requires grad, or one whose storage an earlier op
     saved already (an index an indexing op saved before ``index_add`` saves it: a
     write since would have bumped its version, which that op's backward checks)
     stops the replay at once;
  6. when the region has a recorded structure, ``ServingMode`` returns held outputs for
     the ops replay need not run (NOTE [Which ops replay runs] in trace/structure.py)
     and checks that replay dispatches the same ops as the forward;
  7. a plain replay of a forward that ran under one of the runtime's dispatch modes (the
     first call's watch, a measuring pass's recorder) runs under a passive mode: some
     composite ops take another path, saving other tensors, whenever any dispatch mode
     is active (``ctc_loss`` with tensor lengths saves them too).
The torch-function state is the forward's as well (NOTE [Torch function state] in
_torch_compat.py). Each replayed tensor is handed out by its handle and forgotten by the
call, so replayed memory lives only until autograd is done with it (the handle keeps it
for a second read by its node: NOTE [Saves read twice] in hooks.py); a second backward
(retain_graph) replays again.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from offrecomp import _torch_compat as tc
from offrecomp.arguments import replay_arguments
from offrecomp.attr_tables import entry_changes, swap_contents
from offrecomp.buffers import swap_buffers
from offrecomp.changes import (
    exit_values,
    left_at_entry,
    swap_attrs,
)
from offrecomp.diagnostics import log_once, named
from offrecomp.interrupts import finish
from offrecomp.regions import (
    autocast_as_now,
    autocast_contexts,
    capture_rng,
    restore_rng,
)
from offrecomp.replay_state import (
    children_as_forward,
    default_dtype_as_forward,
    entry_arg_state,
    external_as_entry,
    hooks_as_found,
    param_guard,
    params_as_arguments,
    reads_as_forward,
    state_as_found,
    swap_params,
    training_as_forward,
)
from offrecomp.state import RegionCall
from offrecomp.trace import (
    PassiveMode,
    ReplayDivergedError,
    ServingMode,
    ThreadDepth,
    internal,
    user_code,
)

__all__ = ["ReplayDivergedError", "in_replay", "replay_call", "replayed_regions"]

log = logging.getLogger(__name__)
_graph_task_id = tc.graph_task_id
_sequence_nr = tc.sequence_nr

_tls = ThreadDepth()  # replays running on this thread


class _Asked(threading.local):
    asked = False  # in_replay() answered True since the running replay began
    left: frozenset[str] = frozenset()  # that replay left these attributes at their entry values
    at_guard: Any = None  # the forward's values of the attributes it sets only outside a replay


_asked = _Asked()


def in_replay() -> bool:
    """True while offrecomp replays a region's forward on this thread.

    Region code with side effects that must happen once (logging, counters, caches) can
    skip them when this is true. Skip nothing that saves tensors for backward (ops on
    tensors that require grad): a replay numbers its saves as the forward did. An
    attribute of the region's modules the forward sets only when this is false keeps
    the value the forward set in the replay (NOTE [Module attributes] in changes.py).
    """
    if _tls.depth > 0:
        _asked.asked = True
        at_guard = _asked.at_guard
        if at_guard is not None:  # NOTE [Module attributes] (changes.py): past the guard
            _asked.at_guard = None
            swap_attrs(at_guard)
        return True
    return False


class _Replayed(threading.local):
    names: tuple[str, ...] = ()  # the class default answers threads that never set it


_replayed = _Replayed()


def replayed_regions() -> tuple[str, ...]:
    """The regions whose forwards replays run now on this thread, outermost first."""
    return _replayed.names


class _StopReplay(BaseException):
    """Raised from the replay's pack hook once every needed tensor is captured.

    A BaseException so that ``except Exception`` in user code does not swallow it.
    """


class _HoldSaves(BaseException):
    """Raised from the replay's unpack hook when the replayed forward differentiates a
    graph of its own: the replay starts again, holding what it saves."""


_THROWAWAY = object()  # what a replay's pack hook returns for a save it does not hold


def _no_unpack(_: Any) -> Any:
    raise RuntimeError(
        "offrecomp: backward reached a tensor saved during a replay; replayed graphs are "
        "throwaway and must not be differentiated (double backward through a replayed "
        "region is not supported)"
    )


# NOTE [Backward inside a forward]
# A forward may run a backward of its own: a force field (-d energy / d x with
# create_graph), a gradient-based inner step, and flex_attention, whose autograd rule
# traces its score_mod's joint graph with torch.autograd.grad on every call.
# - In the forward, that inner backward unpacks saves of the region call that is still
#   running (hooks.Placer.unpack): it is not the pass's backward, so the pass goes on;
#   a dropped or offloaded save whose tensor is still alive is handed back as it is, one
#   already freed is regenerated as in backward (this once); and the region is marked
#   (Region.backward_in_forward): the storages such a backward read are kept in every
#   later call (Region.forward_used), and its recording is opaque (it may hold the ops
#   of that regeneration), so its replays run plainly.
# - A replay throws its graph away, so its pack hook holds nothing but what it captures,
#   and the inner backward of the replayed forward would find nothing to unpack. The
#   replays of a marked region hold every save (their working set is their whole
#   prefix's saves); a replay that meets an inner backward first starts again, holding.
# - Saves made while the inner backward runs (another graph task than the one the replay
#   began in) are not forward saves: the forward's pack hook does not count them
#   (hooks.Placer._pack), and neither does the replay's, or every later index would shift.
# - What a replay holds is a detached alias of each saved tensor (a leaf as it is), as
#   a kept save is: the tensor itself, saved by the node that made it (tanh saves its
#   output), would close a cycle through C++ (tensor, node, saved variable, tensor) that
#   Python's collector cannot see, and every replay's saves would stay alive for good.
# - An inner backward that reaches activations from before the call (the gradient with
#   respect to an earlier block's output) reads other calls' saves while a region's
#   forward runs (early_unpacks._reached_from_forward). That is not the pass's backward
#   either; a dropped save it reads is regenerated then. A replay, which starts from
#   detached inputs, cannot run such a backward: the running regions keep their
#   activations from then on (Region.reaches_out), and what their calls dropped before
#   is held while its tensors live.
# - An inner backward run by the model's own forward between its regions' calls (an
#   input-gradient penalty in the root forward) reads the root call's saves or exited
#   calls' ones while a root forward of the pass runs (PassState.roots_running): not
#   the pass's backward either; a dropped save it reads is regenerated then.


# NOTE [Private generators]
# A block may draw from a torch.Generator of its own (noise injection with a seeded
# generator, a sampler): `torch.randn(shape, generator=self.g)`. Restoring the global
# RNG states does not restore it, and a replay would draw the next numbers from it:
# other activations than the forward's, silently (as torch.utils.checkpoint does). The
# first call of each region runs under FirstCallWatch (trace/recorder.py), which records
# every generator an op draws from, with its state at that first draw: the state at
# entry. Later calls capture at entry the states of those generators, of the generators
# their modules hold as attributes or one step from one (a config's attribute, a list's
# item, as ``host_rng.private_slots`` finds Python's and numpy's: one assigned anew each
# step, or one the first call did not draw from, noise turned on later), and of the
# generators among their arguments (a few KiB each). A replay sets them, and sets back
# afterwards what it found, as for the global RNG. A generator reached otherwise (a
# global, two objects away) is not known: a serving replay drawing from it diverges, a plain one draws
# other numbers. One created inside the forward needs nothing (the replay creates it
# again).


@contextlib.contextmanager
def _attrs_as_entry(call: RegionCall, attrs: Any, contents: Any) -> Iterator[None]:
    """NOTE [Module attributes] (changes.py), NOTE [Attributes at entry]
    (attr_tables.py): the modules' attributes and containers as they were at the call's
    entry, those the forward sets only outside a replay as it left them from the
    replay's first ``in_replay()`` on; what was there goes back afterwards. Which of
    them a replay that asked ``in_replay()`` left at their entry values goes to
    ``_replay_until_captured``."""
    region = call.region
    assert region is not None  # entry tables: a region's call
    changed = call.attrs  # those the forward changed, with their exit values
    guarded = region.guarded_attrs if changed else frozenset()
    back = swap_attrs(attrs)
    back_contents = swap_contents(contents) if contents else None
    outer, _asked.at_guard = _asked.at_guard, exit_values(changed, guarded) if guarded else None
    try:
        yield
    finally:
        if _asked.asked and changed:
            _asked.left = frozenset(left_at_entry(changed, guarded))
        _asked.at_guard = outer
        if back_contents:
            swap_contents(back_contents)
        swap_attrs(back)


def _replay_forward(
    call: RegionCall,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    saves: _SaveCapture,
    mode: ServingMode | None,
) -> None:
    """Run the region's forward once, as the replay sees it (NOTE [Replay]), under the
    saved-tensor hooks of ``saves``.

    Every context it enters exits, in order, also when an interrupt (Ctrl-C) lands in
    the exits; grad mode and the replay depth are set back as found, also when an
    interrupt came between a context's entry and the stack (NOTE [Interrupts in
    cleanup]). The depth is set, not counted down by a context: one an interrupt kept off
    the stack would count it down when collected, at any later time."""
    grad, depth, names = torch.is_grad_enabled(), _tls.depth, _replayed.names
    stack = contextlib.ExitStack()

    def unwind() -> None:
        saves.end_stop_mode()  # first: NOTE [Stop mode popped first]
        stack.close()  # the exits not yet run, innermost first
        torch.set_grad_enabled(grad)
        _tls.depth = depth
        _replayed.names = names

    try:
        _tls.depth = depth + 1
        _replayed.names = (*names, call.name)
        stack.enter_context(user_code())
        if torch.is_inference_mode_enabled():
            # a backward may run under inference_mode; the guard is entered only then: one
            # whose exit an interrupt skipped sets the grad mode it found when collected
            stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        if call.autocast is not None and not autocast_as_now(call.autocast):
            # NOTE [Autocast cache]: the weight cache on where the replay's contexts are
            # the outermost (their exit clears it), and for compiled code
            compiled = call.region is not None and call.region.compiled
            cache = compiled or not tc.autocast_entered()
            for ctx in autocast_contexts(call.autocast, cache=cache):
                stack.enter_context(ctx)
        # each context below is entered only where the call has state for it to restore
        buffers, params = call.buffers, call.params
        if buffers is not None and (buffers.mutated or buffers.untouched):
            stack.enter_context(swap_buffers(buffers, call.name))
        if params is not None:
            stack.enter_context(swap_params(call, params))
            args, kwargs = params_as_arguments(call, params, args, kwargs)  # NOTE [Aliased arguments]
        stack.enter_context(children_as_forward(call))
        stack.enter_context(training_as_forward(call))
        stack.enter_context(hooks_as_found(call))
        region = call.region
        if call.entry_tables is not None and call.exited and region is not None:
            attrs, contents = entry_changes(region.modules, call.entry_tables, call.entry_contents)
            if attrs or contents or call.attrs:  # what differs from the call's entry
                stack.enter_context(_attrs_as_entry(call, attrs, contents))
        dtype, now = call.default_dtype, torch.get_default_dtype()
        if dtype is not None and dtype != now:
            stack.enter_context(default_dtype_as_forward(dtype, now))
        if call.arg_state is not None and call.inputs is not None:
            stack.enter_context(entry_arg_state(call, call.arg_state, args, kwargs))
        if call.external:
            stack.enter_context(external_as_entry(call.name, call.external))
        if call.external_reads:
            stack.enter_context(reads_as_forward(call))
        if call.made_state:
            stack.enter_context(state_as_found(call))
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(saves.pack, saves.unpack))
        guard = param_guard(call)
        if guard is not None:
            stack.enter_context(guard)  # outside the serving mode: sees the ops that run
        if mode is not None:
            stack.enter_context(mode)
        elif call.under_mode:
            stack.enter_context(PassiveMode())
        assert call.forward_fn is not None
        saves.modes_found = tc.mode_stacks()  # NOTE [Modes a stopped forward left], [Stop mode popped first]
        call.forward_fn(*args, **kwargs)
    finally:
        try:
            unwind()
        except BaseException as e:  # NOTE [Interrupts in cleanup]: an interrupt, the rest to run
            finish(unwind, e)


class _StopAtALaterOp(PassiveMode):
    """Pushed by a plain replay's save hook once every needed save is captured but the op
    that made the last of them may still fill one (NOTE [Replay], step 5): stops the
    forward at the first op dispatched with another autograd sequence number, and runs
    the others as they are. The op being saved for took its dispatch keys before the
    push; ops its kernel calls, and ops without grad, carry its number or none new."""

    def __init__(self, saves: _SaveCapture) -> None:
        super().__init__()
        self.saves = saves

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.saves.stop_after_its_op()
        return super().__torch_dispatch__(func, types, args, kwargs)


class _SaveCapture:
    """The replay's saved-tensor hook pair (NOTE [Replay], step 5): numbers the saves as
    the forward did, captures the needed ones, and stops the forward right after the
    last of them (after its op, when that op also saved a needed tensor that does not
    require grad)."""

    def __init__(self, region_name: str, needed: set[int], *, hold: bool) -> None:
        self.region_name = region_name
        self.needed = needed
        self.last = max(needed)
        self.hold = hold
        """Hold every save, not only the needed ones (NOTE [Backward inside a forward])."""
        self.task = _graph_task_id()  # the backward the replay runs in (-1 outside one)
        self.captured: dict[int, torch.Tensor] = {}
        self.counter = 0  # saves numbered so far in this run of the forward
        self.complete = -2  # once every needed save is captured: the sequence number of its op
        self.unfilled = -2  # the sequence number of the last op with a needed save not requiring grad
        self.unwritten: dict[int, tuple[weakref.ref[Any], int]] = {}
        """Storages saved at version 0 without grad, by address: the storage and the
        sequence number of the first op that saved it."""
        self.stop_mode: _StopAtALaterOp | None = None
        self.modes_found: tc.ModeStacks | None = None  # the mode stacks as the forward starts
        self.stopped = False  # the forward was stopped
        self.running = False  # the replayed forward is running
        self.wants_hold = False  # the forward unpacked a save of its own: run it again, holding
        self.mode: ServingMode | None = None

    def begin(self, mode: ServingMode | None) -> None:
        """A run of the forward starts (again) from its first save."""
        self.counter = 0
        self.captured.clear()
        self.end_stop_mode()
        self.complete = -2
        self.unfilled = -2
        self.unwritten.clear()
        self.mode = mode

    def pack(self, t: torch.Tensor) -> Any:
        if _graph_task_id() != self.task:  # NOTE [Backward inside a forward]: saved by an inner backward
            return t if t.is_leaf else t.detach()
        if self.complete != -2:
            self.stop_after_its_op()
        i = self.counter
        self.counter += 1
        fillable = not t.requires_grad and t._version == 0 and self._fillable(t)
        if i in self.needed:
            with internal():
                mode = self.mode
                if mode is not None and mode.is_placeholder(t):  # NOTE [Placeholder guard]
                    raise mode.diverge(
                        f"offrecomp: replay of region {self.region_name!r} diverged at save #{i}: "
                        "it saves a tensor the recording did not compute",
                        placeholder=True,
                    )
                self.captured[i] = t.detach()
            seq = _sequence_nr()
            if fillable:
                self.unfilled = seq  # its op may still fill it (NOTE [Replay], step 5)
            if i >= self.last:
                if self.unfilled != seq:
                    self.stopped = True
                    raise _StopReplay
                self.complete = seq  # stop at a later op
                if mode is not None:
                    mode.before_op = self.stop_after_its_op
                else:
                    stop_mode = _StopAtALaterOp(self)
                    # NOTE [Stop mode popped first]: right above the dispatch modes found
                    depth = len(self.modes_found[0]) if self.modes_found is not None else -1
                    tc.push_dispatch_mode_at(stop_mode, depth)
                    self.stop_mode = stop_mode
        if not self.hold:
            return _THROWAWAY
        return t if t.is_leaf else t.detach()  # NOTE [Backward inside a forward]: no cycle

    def _fillable(self, t: torch.Tensor) -> bool:
        """May the op saving ``t`` (no grad, version 0) still fill it? Not when an earlier
        op saved its storage already (NOTE [Replay], step 5: a write would have bumped
        its version, which that op's backward checks)."""
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()  # a jagged nested tensor's storage has none
        except (RuntimeError, NotImplementedError):  # a layout or subclass without one
            return True
        if not ptr:
            return True
        seq = _sequence_nr()
        seen = self.unwritten.get(ptr)
        if seen is not None and seen[0]() is storage:
            return seen[1] == seq
        # a new storage, maybe at a freed one's address (an earlier op's noise, dropped)
        self.unwritten[ptr] = (weakref.ref(storage), seq)
        return True

    # NOTE [Stop mode popped first]
    # The stop mode is pushed by a save hook in the middle of the replayed forward, so it
    # sits on top of every dispatch mode the replay entered around the forward (the
    # PassiveMode of a region whose code changes under one, the parameter guard). A
    # mode's exit pops whatever is on top of torch's dispatch stack: were the stop mode
    # still there when those contexts exit, the first exit would pop it in place of its
    # own mode, which would stay active through the other exits until this pop took it
    # off. Before torch 2.11 that pop also reads the mode's Python object after dropping
    # the stack's reference to it, the last one once its context has exited: a read of
    # freed memory that crashed GRU and mixture-of-experts replays. So the stop mode
    # goes first, before the replay's contexts exit. Modes the block's own forward has
    # entered when the stop mode is pushed exit before it too (the early stop unwinds
    # through them): the stop mode goes in beneath them, right above the modes active
    # as the forward started, so that each of their exits pops its own mode
    # (``push_dispatch_mode_at``; on top where one of them is a pre-dispatch mode), and
    # their handlers see each op first, the one the replay stops at too (the stop is a
    # BaseException: ``except Exception`` in a handler lets it through). It is pushed and
    # popped bare, without the enter and exit that set torch's "in a dispatch mode"
    # flags, which the modes above it would restore out of order.

    # NOTE [Modes a stopped forward left]
    # An early stop raises through the block's code. A mode that code entered with a
    # ``with`` exits on the way out; one entered by a bare ``__enter__()``, to be left by
    # an ``__exit__()`` further down the forward, which the stop skips, would stay on the
    # stack: active for the rest of the program, and on top of the stop mode, which the
    # pop would leave in its place. So once the forward ends, stopped or not, each stack
    # is walked from the top down to the first mode active as the forward started: every
    # mode on the way leaves by its own exit, the stop mode bare in its place, and the
    # stacks are as the replay found them, as a forward run to its end would have left
    # them. A ``torch.device`` context stops the walk: its exit rebuilds the function
    # stack and insists on its own place in it.

    def end_stop_mode(self) -> None:
        """Pop the plain replay's stop mode, if one was pushed, with the modes the forward
        left above it, and take the serving mode's stop off: either refers back to this
        capture, a cycle that would keep every tensor it captured alive until a garbage
        collection, after backward has freed them. Run
        before the replay's contexts exit (NOTE [Stop mode popped first]); forgotten once
        popped, so that a rerun after an interrupt in the pop (NOTE [Interrupts in
        cleanup]) pops it still."""
        if self.mode is not None:
            self.mode.before_op = None
        # the modes the forward entered and did not leave go too (NOTE [Modes a stopped forward left])
        tc.leave_modes_entered_since(self.modes_found, self.stop_mode)
        self.stop_mode = None
        self.modes_found = None

    def stop_after_its_op(self, func: Any = None) -> None:
        """Stop the forward if the op running now (saving, or ``func`` dispatched under
        the serving mode) is a later one than the op that made the last needed save, or
        is that op and writes none of its arguments."""
        if _sequence_nr() != self.complete or (func is not None and not tc.op_writes_inputs(func)):
            self.stopped = True
            raise _StopReplay

    def unpack(self, x: Any) -> Any:
        if x is not _THROWAWAY:
            return x
        if self.running and not self.hold:
            self.wants_hold = True  # judged by this flag: C++ may hand the exception back as its own
            raise _HoldSaves  # NOTE [Backward inside a forward]
        return _no_unpack(x)


class _RngStates:
    """The random states a replay draws from (NOTE [Replay], step 2; NOTE [Private
    generators]): the forward's, set before each run of the forward, and the caller's,
    set back afterwards."""

    def __init__(self, call: RegionCall, devices: set[torch.device]) -> None:
        self.call = call
        rng = call.rng
        host = rng.host if rng is not None else None
        self.caller = None if rng is None else capture_rng(
            devices, host.kinds if host is not None else 0, [o for o, _ in host.private] if host is not None else ()
        )
        self.generators = call.generators or []
        self.caller_generators = [(g, g.get_state()) for g, _ in self.generators]

    def set_forward(self) -> None:
        if self.call.rng is not None:
            restore_rng(self.call.rng)
        for g, state in self.generators:
            g.set_state(state)

    def set_caller(self) -> None:
        if self.caller is not None:
            restore_rng(self.caller)
        for g, state in self.caller_generators:
            g.set_state(state)


def _guarded(call: RegionCall) -> None:
    """A replay that asked ``in_replay()`` and ran to its end (or failed) left attributes
    its forward changed at their entry values: the forward sets them only outside a
    replay, and its replays take their exit values at their first ``in_replay()`` from
    now on (NOTE [Module attributes] in changes.py)."""
    region = call.region
    assert region is not None
    region.guarded_attrs = region.guarded_attrs | _asked.left
    log_once(
        f"guarded-attrs:{named(region)}", logging.INFO,
        "offrecomp: region %r sets %s only outside replays (offrecomp.in_replay()); its "
        "replays take the values its forward left from that check on",
        region.name, ", ".join(sorted(_asked.left)),
    )


def _hold_saves_from_now_on(call: RegionCall) -> None:
    """NOTE [Backward inside a forward]: the region's replays, this one included, hold what
    they save and run plainly."""
    if call.region is not None:
        call.region.backward_in_forward = True
    if call.structure is not None:
        call.structure.opaque = True  # its recording holds an inner backward
    log.info(
        "offrecomp: region %r runs a backward inside its forward; its replays "
        "hold what they save and run plainly",
        call.name,
    )


def _replay_until_captured(
    call: RegionCall,
    saves: _SaveCapture,
    rng: _RngStates,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    program: list[int] | None,
    storage_tensors: dict[int, tuple[Any, int]] | None,
) -> ServingMode | None:
    """Run the forward until the last needed save is captured; run it again, plainly and
    holding its saves, when it turns out to run a backward of its own. Returns the
    serving mode of the last run (None: a plain replay)."""
    probing = False  # NOTE [Module attributes] (changes.py): a run to the end, to tell
    probed = False  # that run failed in the forward's tail: judge by the early-stopped run
    last = saves.last
    while True:
        mode: ServingMode | None = None
        if call.structure is not None and program is not None:
            mode = ServingMode(
                region_name=call.name,
                structure=call.structure,
                program=program,
                storage_tensors=storage_tensors or {},
                generators=[g for g, _ in call.generators or ()],
            )
        saves.begin(mode)
        saves.last = sys.maxsize if probing else last
        rng.set_forward()
        _asked.asked, _asked.left = False, frozenset()
        try:
            saves.running = True
            _replay_forward(call, args, kwargs, saves, mode)
            if _asked.left:  # ran to its end, leaving them: set only outside a replay
                _guarded(call)
                probing = False
                continue
            return mode
        except BaseException as exc:
            # Early stop (NOTE [Replay]), a replay that must hold its saves, or a
            # divergence. Code that runs in C++ (TorchScript) hands any of them back
            # as a RuntimeError of its own: judge by what was raised, not by what
            # arrives. An interrupt (KeyboardInterrupt, SystemExit) is the user's, even
            # when it lands while the early stop unwinds: it goes on.
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if _asked.left and not saves.stopped:  # failed on an attribute left at its entry value
                _guarded(call)
                probing = False
                continue
            if saves.stopped:
                if _asked.left and not probing and not probed:  # stopped before setting them, or never does?
                    probing = True
                    program = None
                    continue
                return mode
            if probing:  # the tail an early stop skips failed: run as before the probe
                probing, probed = False, True
                continue
            if saves.wants_hold and not saves.hold:
                saves.hold = True
                _hold_saves_from_now_on(call)
                program = None  # this replay, too, runs plainly
                continue
            if mode is not None and mode.diverged is not None and mode.diverged is not exc:
                raise mode.diverged from exc
            raise
        finally:
            saves.running = False
            saves.last = last
            saves.end_stop_mode()
            if mode is not None:
                # its divergence's traceback holds the mode and the replayed forward's
                # frames (its activations): a cycle, were it kept past this run
                mode.diverged = None


def replay_call(
    call: RegionCall,
    needed: set[int],
    *,
    inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
    program: list[int] | None = None,
    storage_tensors: dict[int, tuple[Any, int]] | None = None,
) -> dict[int, torch.Tensor]:
    """Replay ``call`` and return ``{pack index: tensor}`` for every index in ``needed``.

    ``inputs``: the arguments to use (default: the captured ones, as fresh leaves).
    ``program`` / ``storage_tensors``: what to do with each op and the held storages to
    serve from, by storage index: (an UntypedStorage, the byte in it where the storage
    starts) (see ``trace.RegionStructure.program``); requires ``call.structure``.
    """
    if not needed:
        return {}
    if call.inputs is None or call.forward_fn is None:
        raise RuntimeError(f"offrecomp: region {call.name!r} has no captured inputs to replay from")
    region = call.region
    saves = _SaveCapture(call.name, needed, hold=region is not None and region.backward_in_forward)
    rng = _RngStates(call, call.inputs.devices())
    t0 = time.perf_counter()
    # NOTE [Torch function state]: the leaves too (a subclass's detach stays a subclass)
    with tc.torch_function_as(call.torch_function), tc.parametrize_cache_as(call.inputs.parametrize_cache):
        args, kwargs = inputs if inputs is not None else replay_arguments(call.inputs, call.name)
        try:
            mode = _replay_until_captured(call, saves, rng, args, kwargs, program, storage_tensors)
        finally:
            captured, saves.captured, saves.mode = saves.captured, {}, None  # NOTE [Replay graphs kept alive]
            try:
                rng.set_caller()
            except BaseException as e:  # NOTE [Interrupts in cleanup]: it sets states, so runs again
                finish(rng.set_caller, e)
    call.replay_seconds += time.perf_counter() - t0
    call.replays += 1
    if mode is not None:
        call.served_ops += mode.served + mode.stubbed
        call.rerun_ops += mode.ran
    if needed - captured.keys():
        raise ReplayDivergedError(
            f"offrecomp: replay of region {call.name!r} (call {call.call_index}) saved "
            f"{saves.counter} tensors but the forward saved at least {saves.last + 1}"
        )
    return captured


# NOTE [Replay graphs kept alive]
# A replay's graph is never differentiated: it goes when its last reference does. Code in
# the block may tie it into a cycle Python's collector cannot see, through C++ (a
# ``register_multi_grad_hook`` over two of its tensors keeps their nodes in a hook on
# those nodes; a saved-tensor hook of the block's own whose pack returns the tensor, as
# an identity pair or ``save_on_cpu`` on a CPU tensor, has a node hold its own output):
# that graph then lives for good, as a ``torch.utils.checkpoint`` recomputation's does.
# Its nodes reach the replay's hook pair (``_SaveCapture``), whose saves are placeholders
# (``_THROWAWAY``) unless it holds them (NOTE [Backward inside a forward]); so once the
# replay returned or raised, the capture lets go of what it captured and of the serving
# mode (and the held storages it serves from): such a graph keeps its nodes, not the
# activations.
