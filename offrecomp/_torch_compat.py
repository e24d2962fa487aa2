"""Every private or semi-private torch API offrecomp uses, in one place.

Each entry says why it is needed. ``tests/offrecomp/test_torch_compat.py`` imports all of
them, so a torch release that removes one fails loudly there instead of deep inside a
training run.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.autograd.forward_ad as _fwad
import torch.nn.utils.parametrize as _parametrize

# TorchDispatchMode: the replay serves held op outputs instead of rerunning ops, and the
# measuring pass records every ATen op of a region (timings, outputs, aliasing). The same
# mechanism torch.utils.checkpoint's selective checkpointing uses; it lives in a private
# module.
from torch.utils import _python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

# pytree: flattening a call's arguments (replay inputs, signatures) and an op's arguments
# the dispatch modes do not walk themselves (NOTE [Op leaves]). Private, and the same
# helpers torch.utils.checkpoint uses.
from torch.utils._pytree import TreeSpec, tree_flatten, tree_leaves, tree_unflatten  # noqa: F401

#: The oldest torch release offrecomp runs on (pyproject.toml's range): older ones lack
#: private APIs it calls (2.7: the top of the saved-tensor hook stack), or differ where
#: it reads compiled code (2.9). Tested from 2.10 to 2.15.
MIN_TORCH = (2, 10)


def check_torch_version(version: str | None = None) -> None:
    """Raise for a torch release older than ``MIN_TORCH`` (``version``: torch's own by
    default), naming the one found and the one needed; a version that does not parse
    passes."""
    found = version or torch.__version__
    try:
        major, minor = (int(x) for x in found.split("+")[0].split(".")[:2])
    except ValueError:
        return
    if (major, minor) < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        raise RuntimeError(
            f"offrecomp needs torch>={need} (tested from {need} to 2.15); found torch {found}. "
            f"Upgrade it: pip install 'torch>={need}'"
        )


#: The C function behind ``current_graph_task_id``, called as it is on the save path
#: (one Python call less per saved tensor).
graph_task_id: Callable[[], int] = torch._C._current_graph_task_id

#: The slot ``nn.Module.compile()`` fills: a module compiled in place runs its calls
#: through it, and the runtime wraps it instead of ``forward`` (NOTE [Compiled regions]).
COMPILED_CALL_IMPL = "_compiled_call_impl"


def current_graph_task_id() -> int:
    """-1 outside backward, else the id of the running backward.

    Pack hooks that fire while backward runs (double backward, create_graph=True) belong
    to no forward pass and must not start one.
    """
    return int(torch._C._current_graph_task_id())


def _no_sequence_nr() -> int:
    return -1


#: The thread's next autograd sequence number: every saved tensor of one op reads the
#: same value in the pack hook (the op's node takes its number before it saves), the
#: next op's a larger one. Where torch lacks it, -1 for every op: a replay then runs its
#: forward to the end (NOTE [Replay], step 5).
sequence_nr: Callable[[], int] = getattr(torch._C._autograd, "_get_sequence_nr", _no_sequence_nr)


def _never_wrapped(t: torch.Tensor) -> bool:
    return False


#: Is a tensor wrapped by a functorch transform (vmap's batched tensors)? Where torch
#: lacks the check, no tensor is.
is_functorch_wrapped: Callable[[torch.Tensor], bool] = getattr(
    torch._C._functorch, "is_functorch_wrapped_tensor", _never_wrapped
)


def queue_backward_callback(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the current backward finishes (only valid inside backward).

    Used to mark the end of a backward pass without a host sync.
    """
    torch.autograd.Variable._execution_engine.queue_callback(fn)  # type: ignore[attr-defined]


def import_dynamo() -> None:
    """Import ``torch._dynamo`` (``torch.compiler.disable`` does on its first call) on a
    thread of its own. The import leaves cyclic garbage holding its frames, and with
    them, through their callers, the frame that called it: run on the caller's thread, a
    runtime's first entry stayed alive (its pinned pool open) after ``del rt`` until a
    collection."""
    if "torch._dynamo" in sys.modules:
        return
    t = threading.Thread(target=importlib.import_module, args=("torch._dynamo",), name="offrecomp-import")
    t.start()
    t.join()  # a failed import raises again where torch imports it next


def register_optimizer_step_post_hook(fn: Callable[..., None]) -> Any:
    """Global hook after any ``torch.optim.Optimizer.step``: the step boundary.

    Public in ``torch.optim.optimizer`` but not re-exported from ``torch.optim``.
    """
    from torch.optim.optimizer import register_optimizer_step_post_hook as _reg

    return _reg(fn)


def is_nondeterministic_seeded(func: Any) -> bool:
    """True for ops that may draw from an RNG (dropout, rand, fused attention)."""
    tags = getattr(func, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def is_higher_order(func: Any) -> bool:
    """A higher-order operator (flex_attention, cond, ...): it runs subgraphs of its own,
    has no schema, and reaches a dispatch mode only if the mode accepts it."""
    return isinstance(func, torch._ops.HigherOrderOperator)


def op_writes_inputs(func: Any) -> bool:
    """True for in-place and ``out=`` ops (some argument is written)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return True  # unknown: assume the worst
    for arg in schema.arguments:
        info = arg.alias_info
        if info is not None and info.is_write:
            return True
    return False


def op_returns_alias(func: Any) -> bool:
    """True for view ops (a return aliases an input)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return True
    return any(ret.alias_info is not None for ret in schema.returns)


def written_arg_names(func: Any) -> tuple[str, ...]:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return ()
    return tuple(
        a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write
    )


def top_saved_tensors_hooks() -> Any:
    """The innermost saved-tensor hook pair installed on this thread, or None."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


def saved_tensors_hooks_disabled() -> str | None:
    """The message of the ``torch.autograd.graph.disable_saved_tensors_hooks`` section this
    thread is in (torch refuses a hook pair there), or None."""
    get = getattr(torch._C._autograd, "_saved_tensors_hooks_get_disabled_error_message", None)
    return get() if get is not None else None


_DISABLE_CODE = getattr(getattr(torch.autograd.graph.disable_saved_tensors_hooks, "__wrapped__", None), "__code__", None)


def refused_hooks_disable(exc: BaseException) -> bool:
    """Was ``exc`` torch refusing to enter ``torch.autograd.graph.disable_saved_tensors_hooks``
    (it raises the section's own message while a saved-tensor hook pair is registered)?
    Told by its innermost frame: that context manager's own, where an error raised in the
    section's body has the body's."""
    tb = exc.__traceback__
    if not isinstance(exc, RuntimeError) or tb is None or _DISABLE_CODE is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code is _DISABLE_CODE


def autocast_cache_active() -> bool:
    """Is a CPU or CUDA autocast context with its weight cache on active?"""
    return torch.is_autocast_cache_enabled() and (
        torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
    )


def autocast_entered() -> bool:
    """Is any torch.autocast context entered on this thread (enabled or not)? Its cache
    of casts is cleared only when the outermost one exits."""
    level = torch.autocast_increment_nesting()
    try:
        return level > 1
    finally:
        torch.autocast_decrement_nesting()


def mutation_on_saved_tensors_allowed() -> bool:
    """Is ``torch.autograd.graph.allow_mutation_on_saved_tensors()`` active?"""
    return bool(getattr(torch.autograd.graph, "_allow_mutation_on_saved_tensors_enabled", False))


def pop_saved_tensors_hooks() -> None:
    """Take the innermost hook pair off this thread's stack (NOTE [Native keep]: a call
    that keeps everything saves natively; ``push_saved_tensors_hooks`` puts it back).
    The context manager that pushed the pair pops whatever is on top at its exit."""
    torch._C._autograd._pop_saved_tensors_default_hooks()


def push_saved_tensors_hooks(pack: Callable[..., Any], unpack: Callable[..., Any]) -> None:
    """Put a hook pair back on this thread's stack (NOTE [Native keep])."""
    torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)


def pop_sole_saved_tensors_hooks(top: tuple[Any, Any]) -> bool:
    """Take ``top`` (the innermost pair) off this thread's stack if no pair lies beneath
    it; otherwise leave the stack as it was. True if it came off (NOTE [Native keep],
    NOTE [Hooks off in backward]: a pair beneath would take the saves)."""
    pop_saved_tensors_hooks()
    if top_saved_tensors_hooks() is not None:
        push_saved_tensors_hooks(*top)
        return False
    return True


def backward_entry() -> Callable[..., Any]:
    """The function every Python backward goes through: ``torch.autograd.backward`` and
    ``torch.autograd.grad`` call ``torch.autograd._engine_run_backward(outputs, *args,
    **kwargs)``, looked up in ``torch.autograd`` at each call (NOTE [Hooks off in
    backward] in offrecomp/backward_entry.py). ``torch.compiler`` patches it the same way
    while it traces a backward."""
    return torch.autograd._engine_run_backward  # type: ignore[attr-defined,no-any-return]


def set_backward_entry(fn: Callable[..., Any]) -> None:
    """Replace :func:`backward_entry` (a wrapper that calls the one it replaced)."""
    torch.autograd._engine_run_backward = fn  # type: ignore[attr-defined]


def compiled_autograd_on() -> bool:
    """Compiled autograd (``torch._dynamo.compiled_autograd``) compiles the backwards
    started now."""
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    return ca is not None and bool(getattr(ca, "compiled_autograd_enabled", False))


def compiled_autograd_off() -> contextlib.AbstractContextManager[None]:
    """Backwards started inside run without compiled autograd."""
    from torch._dynamo import compiled_autograd

    return compiled_autograd._disable()


def backward_creates_graph(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a backward entered as ``backward_entry()(outputs, *args, **kwargs)`` makes
    a graph of its own: ``backward`` and ``grad`` pass ``(grad_outputs, retain_graph,
    create_graph, inputs, ...)`` positionally. Anything else there that is true reads as
    a graph, the side that changes nothing."""
    if "create_graph" in kwargs:
        return bool(kwargs["create_graph"])
    return len(args) > 2 and (type(args[2]) is not bool or args[2])


def backward_keeps_graph(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a backward entered as ``backward_entry()(outputs, *args, **kwargs)`` keeps
    the graph it runs (``retain_graph``, which defaults to ``create_graph``). Anything
    else there that is true reads as keeping it."""
    retain = kwargs["retain_graph"] if "retain_graph" in kwargs else (args[1] if len(args) > 1 else None)
    if retain is None:
        return backward_creates_graph(args, kwargs)
    return type(retain) is not bool or retain


def backward_accumulates(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a backward entered as ``backward_entry()(outputs, *args, **kwargs)``
    accumulates into ``.grad`` (``backward`` passes ``accumulate_grad=True``, ``grad``
    False). Anything else there that is true, or nothing, reads as accumulating."""
    if "accumulate_grad" in kwargs:
        return bool(kwargs["accumulate_grad"])
    return len(args) <= 5 or type(args[5]) is not bool or args[5]


def next_sequence_nr() -> int:
    """The number the next autograd node made on this thread gets (nodes are numbered in
    creation order); 0 where torch does not tell."""
    get = getattr(torch._C._autograd, "_get_sequence_nr", None)
    return int(get()) if get is not None else 0


def saved_slot_hooked(saved: Any) -> bool:
    """Whether a node's saved-tensor slot (``grad_fn._raw_saved_*``) went through a
    saved-tensor hook pair, read without unpacking it. ``SavedTensor`` has no query, so
    this asks ``register_hooks``, which refuses a slot that has hooks and an empty slot.
    A slot saved without hooks (autograd saves wrapped Python numbers, ``x * 2.5``'s
    ``2.5``, past every hook) accepts a pair that holds a detached alias (no reference
    back to a ``grad_fn``) and hands it back, which changes nothing backward computes.

    Outside any dispatch mode: ``register_hooks`` detaches the slot's tensor through the
    dispatcher, and a mode the user entered around the step (``FlopCounterMode``,
    ``allow_mutation_on_saved_tensors``) is handed a wrapped number as a Python float,
    which ``detach`` refuses after the slot's unpack hook is set: its backward would
    fail."""
    if torch._C._len_torch_dispatch_stack():
        with _python_dispatch._disable_current_modes():
            return _hooks_refused(saved)
    return _hooks_refused(saved)


def _hooks_refused(saved: Any) -> bool:
    try:
        saved.register_hooks(_detached, _same)
    except RuntimeError as e:
        return "already been set" in str(e)
    return False


def _detached(t: Any) -> Any:
    return t.detach()


def _same(t: Any) -> Any:
    return t


def is_optimized_module(m: Any) -> bool:
    """A ``torch.compile(module)`` wrapper (dynamo's private ``OptimizedModule``)? By name:
    importing torch._dynamo to check the class costs seconds."""
    cls = type(m)
    return cls.__name__ == "OptimizedModule" and cls.__module__.startswith("torch._dynamo")


def foreach_copy_(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """``dst.copy_(src)`` for each pair in one call (the emulated backend's group copy)."""
    torch._foreach_copy_(dsts, srcs)


@functools.cache
def _torch_holds_shared_storage_object() -> int:
    """1 where torch keeps a storage's Python object alive while tensors share the storage
    (a reference of its own to the object), else 0: measured once."""
    storage = torch.UntypedStorage(1)
    alone = sys.getrefcount(storage)
    shared = torch.empty(0, dtype=torch.uint8).set_(storage)
    held = sys.getrefcount(storage) - alone
    del shared
    return held


def _call_refs() -> int:
    """The references a call of a function of one argument adds to that argument, as
    ``sys.getrefcount`` inside it counts them: the frame's argument and getrefcount's
    own, and on Python 3.10 also the caller's stack slot."""

    def probe(x: object) -> int:
        return sys.getrefcount(x)

    held = object()
    return probe(held) - 1  # less ``held``'s own reference, this frame's


_CALL_REFS = _call_refs()


def storage_object_refs(storage: Any) -> int:
    """References to ``storage`` (an ``UntypedStorage`` object) from Python, the caller's
    included and torch's own not: every tensor on a storage hands out this one object
    from ``untyped_storage()``, so a holder of it adds no use to the storage (NOTE
    [Reused reload buffers] in offrecomp/transfer.py)."""
    held = _torch_holds_shared_storage_object() if storage_use_count(storage) > 1 else 0
    return sys.getrefcount(storage) - _CALL_REFS - held


def storage_use_count(storage: Any) -> int:
    """How many tensors (and storage objects) share ``storage``'s allocation: a reused
    reload buffer is emptied only when none but its own cached views do (NOTE [Reused
    reload buffers] in offrecomp/transfer.py). Private: ``torch._C._storage_Use_Count``."""
    return int(torch._C._storage_Use_Count(storage._cdata))


#: What ``torch.autograd.graph.increment_version`` calls, looked up at each call: AOT
#: autograd's runtime wrapper calls it for the graph inputs a compiled graph wrote in its
#: kernels, custom ops for the arguments they write. Private.
VERSION_INCREMENT: Callable[[Any], None] = torch._C._increment_version


def route_version_increments(report: Callable[[Any], None] | None) -> None:
    """Route ``increment_version`` through ``report`` (which calls ``VERSION_INCREMENT``
    itself), or back to ``VERSION_INCREMENT`` (None): the first-call watch hears of writes
    no op shows (NOTE [Storages no op made] in trace/recorder.py)."""
    torch._C._increment_version = report if report is not None else VERSION_INCREMENT  # type: ignore[assignment]


def host_empty_cache() -> None:
    """Hand the cached pinned host blocks back to the OS. Private (CUDA builds, torch
    2.5+), hence the guard: without it dropped slabs stay pinned in torch's cache."""
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


def at_trace_time(fn: Callable[[Any], None]) -> None:
    """Call ``fn`` (with dynamo's context, unused) while dynamo traces the caller: once per
    trace, no graph break, nothing in the graph. Called only where
    ``torch.compiler.is_compiling()`` holds, when dynamo is loaded."""
    from torch._dynamo.comptime import comptime

    comptime(fn)


def eval_frame_callback_getter() -> Callable[[], Any] | None:
    """Returns the callback dynamo's frame evaluator runs now (truthy while compiling
    the frames below); None without it, and whole-model compilation goes undetected."""
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
    except ImportError:  # pragma: no cover - older or stripped builds
        return None
    return get_eval_frame_callback  # type: ignore[no-any-return]


# NOTE [Torch function state]
# ``__torch_function__`` overrides change what a forward computes: a TorchFunctionMode
# around the forward (``with torch.device(...)``, a mode rewriting calls), or a tensor
# subclass whose override backward bypasses (``loss.backward()`` on a subclass runs
# under DisableTorchFunctionSubclass). A replay runs inside backward, so it takes on the
# forward's state: whether overrides run, and the stack of function modes.

_tf_state = getattr(torch._C, "_get_torch_function_state", None)
_tf_set = getattr(torch._C, "_set_torch_function_state", None)
_tf_len = getattr(torch._C, "_len_torch_function_stack", None)
_tf_pop = getattr(torch._C, "_pop_torch_function_stack", None)
_tf_push = getattr(torch._C, "_push_on_torch_function_stack", None)
_tf_enabled = getattr(torch._C, "_is_torch_function_enabled", None)  # state is ENABLED: a bool, no enum compared
_TF_ENABLED = torch._C._TorchFunctionState.ENABLED if hasattr(torch._C, "_TorchFunctionState") else None
_TF_API = None not in (_tf_state, _tf_set, _tf_len, _tf_pop, _tf_push, _tf_enabled, _TF_ENABLED)


def torch_function_state() -> tuple[Any, tuple[Any, ...]] | None:
    """The torch-function state to replay a forward under: (enabled state, function
    modes, innermost last); None for the usual one (enabled, no modes), and where the
    private API is missing."""
    if not _TF_API:
        return None
    n = _tf_len()  # type: ignore[misc]
    if n == 0 and _tf_enabled():  # type: ignore[misc]  # every region call's entry: no enum read
        return None
    state = _tf_state()  # type: ignore[misc]
    modes = tuple(torch.overrides._get_current_function_mode_stack()) if n else ()
    return state, modes


@contextlib.contextmanager
def torch_function_as(captured: tuple[Any, tuple[Any, ...]] | None) -> Iterator[None]:
    """Run the block under ``captured`` (from ``torch_function_state``), then restore the
    state and the mode stack found (NOTE [Torch function state])."""
    if not _TF_API:
        yield
        return
    state, modes = captured if captured is not None else (_TF_ENABLED, ())
    found = _tf_state()  # type: ignore[misc]
    n = _tf_len()  # type: ignore[misc]
    if n == 0 and not modes and found == state:
        yield
        return
    popped = [_tf_pop() for _ in range(n)]  # type: ignore[misc]  # innermost first
    for m in modes:
        _tf_push(m)  # type: ignore[misc]
    _tf_set(state)  # type: ignore[misc]
    try:
        yield
    finally:
        _tf_set(found)  # type: ignore[misc]
        for _ in modes:
            _tf_pop()  # type: ignore[misc]
        for m in reversed(popped):
            _tf_push(m)  # type: ignore[misc]


def process_rank() -> tuple[int, int]:
    """This process's rank and the world's size: the initialised default process group's,
    else ``RANK`` and ``WORLD_SIZE`` as torchrun sets them before the script starts (a
    group made later), else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def per_rank_path(path: str) -> str:
    """``path`` for this process's rank: as it is on rank 0 (and without a process group),
    ``.rankN`` before its suffix on rank N (``run.jsonl`` -> ``run.rank1.jsonl``), so the
    ranks of one run never write one file (NOTE [Files per rank] in config.py)."""
    rank, world = process_rank()
    if world <= 1 or rank == 0:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext}"


def collective_sequence() -> int:
    """The collectives issued so far on this rank, over every process group (the sum of
    their sequence numbers, which eager, functional and compiled collectives all move);
    0 without an initialised process group (NOTE [Collective regions] in diagnostics.py).
    Private: ``ProcessGroup._get_sequence_number_for_group`` and c10d's group table."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return 0
    from torch.distributed.distributed_c10d import _world

    total = 0
    for pg in list(_world.pg_map):
        try:
            total += int(pg._get_sequence_number_for_group())  # type: ignore[attr-defined]
        except (RuntimeError, AttributeError):  # a group without one (a fake or custom backend)
            continue
    return total


# NOTE [Inference tensors]
# A tensor made under torch.inference_mode has no version counter: reading ``_version``
# raises. Autograd never saves one, but an op that saves nothing of it (an add) may read
# it in a training forward: a bias or a rotary cache built at first use during an
# evaluation, an argument an inference-mode helper returned. A region's replay reads it
# again. It can be written only inside inference mode, and nothing can see such a write:
# ``version_of`` gives it INFERENCE_VERSION, which never moves, so the runtime treats it
# as the constant it is outside inference mode (docs/reliability.md, Known limits). Its
# ``detach()`` made outside inference mode (a region input's alias) has a counter of its
# own, which writes through that alias move: a version is read from the object that is
# read again later, never from another alias of it.

#: ``version_of`` an inference tensor (NOTE [Inference tensors]).
INFERENCE_VERSION = -2


def version_of(t: torch.Tensor) -> int:
    """``t._version``; INFERENCE_VERSION for a tensor made under inference mode, which has
    no version counter (NOTE [Inference tensors])."""
    try:
        return int(t._version)
    except RuntimeError:
        if t.is_inference():
            return INFERENCE_VERSION
        raise


_set_version = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)


def version_watch(t: torch.Tensor) -> torch.Tensor | None:
    """An alias of ``t`` without storage that shares its version counter: it shows later
    in-place writes to ``t`` and holds none of its memory (None where the private setter
    is missing). ``set_()`` bumps the shared counter; the setter puts it back (autograd
    compares saved versions to it)."""
    if _set_version is None:
        return None
    version = t._version
    watch = t.detach()
    watch.set_()  # type: ignore[call-overload]  # no argument: an empty storage
    _set_version((watch,), (version,))
    return watch


def dispatch_modes_active() -> bool:
    """Is any TorchDispatchMode on the stack (a caller's, around backward)?"""
    return bool(torch._C._len_torch_dispatch_stack())


def dispatch_mode_stack() -> list[Any]:
    """The TorchDispatchModes active now, outermost first."""
    return list(_python_dispatch._get_current_dispatch_mode_stack())


def _stack_proper() -> list[Any]:
    """The TorchDispatchModes active now, outermost first, less infra modes (which torch
    keeps beneath the others whenever they were entered)."""
    return [m for m in dispatch_mode_stack() if not m.is_infra_mode()]


def push_dispatch_mode_at(mode: TorchDispatchMode, depth: int) -> None:
    """Push ``mode`` onto this thread's dispatch stack right above its first ``depth``
    modes (the stack proper, as ``mode_stacks`` reads it): those above come off and go
    back on over it, so each one's exit still pops itself (NOTE [Stop mode popped first]
    in replay.py). On top where ``depth`` is out of range. Pushed bare, as
    ``leave_modes_entered_since`` pops it: a mode's ``__enter__`` and ``__exit__`` also
    set and restore torch's "in a dispatch mode" flags, which only exits in the reverse
    order of the entries restore. Pre-dispatch modes live on a stack of their own and
    are never among those moved. Private: ``_python_dispatch._push_mode`` and
    ``_pop_mode``."""
    stack = _stack_proper()
    above = stack[depth:] if 0 <= depth < len(stack) else []
    taken: list[Any] = []
    try:
        for _ in above:
            taken.append(_python_dispatch._pop_mode())
        _python_dispatch._push_mode(mode)
    finally:
        for m in reversed(taken):
            _python_dispatch._push_mode(m)


ModeStacks = tuple[tuple[Any, ...], tuple[Any, ...]]

try:
    from torch.utils._device import DeviceContext as _DeviceContext
except ImportError:  # pragma: no cover - every supported torch has it
    class _DeviceContext:  # type: ignore[no-redef]
        """Never matched."""


def mode_stacks() -> ModeStacks:
    """The dispatch modes of the stack proper and the function modes active now, each
    outermost first (``leave_modes_entered_since``)."""
    return tuple(_stack_proper()), tuple(_function_mode_stack())


def _function_mode_stack() -> list[Any]:
    return list(torch.overrides._get_current_function_mode_stack())


def leave_modes_entered_since(found: ModeStacks | None, bare: Any = None) -> None:
    """Set this thread's mode stacks back to ``found`` (``mode_stacks`` as a forward
    began) after the forward, which may have stopped early (NOTE [Modes a stopped forward
    left] in replay.py): from the top down to the first mode found there, ``bare``
    (pushed by ``push_dispatch_mode_at``) pops bare and every other mode leaves by its own
    ``__exit__`` (popped bare where that exit raises or leaves it on top). A
    ``torch.device`` context (whose exit rebuilds the whole function stack) stops the
    walk; pre-dispatch and infra modes, which torch keeps apart, stay.
    ``found`` None (the forward never began): only ``bare``, if on top, pops."""
    dispatch, function = found if found is not None else ((), ())
    _leave_down_to(dispatch, found is not None, bare, _stack_proper, _python_dispatch._pop_mode)
    if found is not None:
        _leave_down_to(function, True, None, _function_mode_stack, torch._C._pop_torch_function_stack)


def _leave_down_to(
    found: tuple[Any, ...], known: bool, bare: Any, stack: Callable[[], list[Any]], pop: Callable[[], Any]
) -> None:
    while True:
        modes = stack()
        if not modes:
            return
        top = modes[-1]
        if top is bare:
            pop()
            bare = None
            continue
        if not known or any(top is m for m in found) or isinstance(top, _DeviceContext):
            return  # a device context's exit rebuilds the whole stack: it and those beneath stay
        with contextlib.suppress(Exception):  # the user's exit; it comes off below if it failed
            top.__exit__(None, None, None)
        modes = stack()
        if modes and modes[-1] is top:  # an exit that raised, or left it: off, bare
            pop()


def forward_ad_active() -> bool:
    """Is a forward-mode AD level open (``torch.autograd.forward_ad.dual_level``)? A
    forward under one computes tangents whose graph a replay outside it cannot rebuild."""
    return int(getattr(_fwad, "_current_level", -1)) >= 0


# NOTE [Cached parametrizations]
# ``torch.nn.utils.parametrize.cached()`` computes each parametrized tensor once while it
# is entered (an orthogonal weight an RNN cell reads at every time step) and hands that
# tensor out on later reads. Entered around the model's loop, the first call computes
# the weight and the later calls read it: a replay after the context was left would
# compute it again, other ops than its forward's. A call that enters with the cache on
# keeps the cache as it found it (the tensors, not copies), and its replay runs with
# the cache on and that copy of it, so it reads what its forward read and computes what
# its forward computed (the first call: the weight); the state found is set back after.
# A forward with the cache off replays with it off, also under a backward inside
# ``cached()``.


def parametrize_cache() -> dict[Any, Any] | None:
    """The parametrization cache at a call's entry: a copy of its table while
    ``parametrize.cached()`` is entered, else None (NOTE [Cached parametrizations])."""
    if not _parametrize._cache_enabled:
        return None
    return dict(_parametrize._cache)


@contextlib.contextmanager
def parametrize_cache_as(cache: dict[Any, Any] | None) -> Iterator[None]:
    """Run a replay with the parametrization cache of its forward's entry, then set the
    state found back (NOTE [Cached parametrizations])."""
    enabled, found = _parametrize._cache_enabled, _parametrize._cache
    if cache is None and not enabled:
        yield
        return
    _parametrize._cache_enabled = 1 if cache is not None else 0
    _parametrize._cache = dict(cache) if cache is not None else {}
    try:
        yield
    finally:
        _parametrize._cache_enabled = enabled
        _parametrize._cache = found


def tensor_base_method(name: str) -> Any:
    """torch.Tensor's method ``name`` as its C base class defines it: what an attribute
    set on torch.Tensor (the recorder's host-read wrappers, offrecomp/trace/recorder.py)
    shadows, and deleting that attribute uncovers."""
    return getattr(torch._C.TensorBase, name)


def cuda_sleep(cycles: int) -> None:
    """Busy-wait the current CUDA stream (tests only: delays a stream to expose races)."""
    torch.cuda._sleep(cycles)  # type: ignore[attr-defined]


ALL_PRIVATE_APIS: tuple[str, ...] = (
    "torch.autograd.forward_ad._current_level",
    "torch._C._len_torch_dispatch_stack",
    "torch._C._autograd._unsafe_set_version_counter",
    "torch._C._get_torch_function_state / _set_torch_function_state / _len_torch_function_stack / "
    "_pop_torch_function_stack / _push_on_torch_function_stack, torch.overrides._get_current_function_mode_stack",
    "torch.utils._python_dispatch.TorchDispatchMode / _get_current_dispatch_mode_stack",
    "torch._C._current_graph_task_id",
    "torch.autograd.Variable._execution_engine.queue_callback",
    "torch.optim.optimizer.register_optimizer_step_post_hook",
    "torch.Tag.nondeterministic_seeded",
    "OpOverload._schema (alias_info.is_write)",
    "torch.cuda._sleep",
    "torch._C.TensorBase (tolist / numpy, read by tensor_base_method for offrecomp/trace/recorder.py)",
    "torch._C._autograd._top_saved_tensors_default_hooks",
    "torch.autograd.graph._allow_mutation_on_saved_tensors_enabled",
    "torch._C._autograd._saved_tensors_hooks_get_disabled_error_message, "
    "torch.autograd.graph.disable_saved_tensors_hooks (its frame: where torch refuses a section)",
    "torch.utils.flop_counter._FlopCounterMode (by name, in offrecomp/trace/scope.py)",
    "torch._C._autograd._pop_saved_tensors_default_hooks / _push_saved_tensors_default_hooks",
    "torch.autograd._engine_run_backward (wrapped while a runtime is installed, and its arguments' order)",
    "grad_fn._raw_saved_* (SavedTensor.register_hooks refusing a hooked slot)",
    "torch.utils._pytree.tree_flatten / tree_unflatten / tree_leaves / TreeSpec",
    "torch._foreach_copy_",
    "torch._C._storage_Use_Count",
    "torch._C._host_emptyCache (CUDA builds)",
    "torch._dynamo.comptime.comptime",
    "torch.nn.utils.parametrize._cache_enabled / _cache",
    "torch._C._dynamo.eval_frame.get_eval_frame_callback",
    "nn.Module._compiled_call_impl",
    "torch._dynamo.eval_frame.OptimizedModule (by name)",
    "torch._ops.HigherOrderOperator (TorchDispatchMode.supports_higher_order_operators)",
)
