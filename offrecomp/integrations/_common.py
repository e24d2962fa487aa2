"""What the trainer callbacks share: one runtime entered per training run and left once,
the model's own activation checkpointing turned off, its key/value cache paused
(NOTE [Cache paused in training]), and the step records summed up as scalars for the
trainer's loggers."""

from __future__ import annotations

import logging
import statistics
import threading
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

from torch import nn

import offrecomp
from offrecomp.config import Config
from offrecomp.context import REPORT_MAX_STEPS, Runtime
from offrecomp.diagnostics import warn_once
from offrecomp.regions import check_region_spec, named_modules
from offrecomp.report import Report, StepRecord

__all__ = [
    "METRIC_PREFIX", "RunScope", "ScopedCallback", "own_checkpointing", "pause_training_cache", "restore_own_checkpointing",
    "step_metrics", "turn_off_own_checkpointing",
]

log = logging.getLogger(__name__)

METRIC_PREFIX = "offrecomp/"


def runtime_options(
    budget: int | str | None, mode: str | None, regions: Any, options: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of ``offrecomp.runtime``, checked now: a bad value is an
    error where the callback is made, not once training has started."""
    kwargs = dict(options)
    for name, value in (("budget", budget), ("mode", mode), ("regions", regions)):
        if value is not None:
            kwargs[name] = value
    if kwargs.get("regions") is not None:  # its shape now; the modules it names once there is a model
        kwargs["regions"] = check_region_spec(kwargs["regions"])
    Config.resolve(kwargs)  # raises ValueError/TypeError naming the bad option
    return kwargs


# NOTE [Runs left open]
# A trainer may end a run by an exception without calling any callback (NOTE [Leaving on
# an exception] in transformers.py): the runtime stays entered, and one runtime is active
# at a time in a process. The scope's next run leaves it first; so does the start of
# another scope's run on the same thread, since one thread runs one training loop at a
# time: a scope still inside there belongs to a run that is over. (A run on another
# thread may still be going: that start fails as runtimes do, naming the active one.)
_INSIDE: weakref.WeakSet[RunScope] = weakref.WeakSet()


class RunScope:
    """One runtime for a trainer's runs: entered when a run starts, left once when it
    ends, however it ends. The same runtime serves every run on the same model, so
    its plans and report carry over from one ``fit``/``train`` call to the next; a run
    on another model (``model_init``, a module resumed into) gets a runtime of its own,
    and the report keeps the steps of the ones before."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options
        self.runtime: Runtime | None = None
        self._inside = False
        self._thread = 0  # the thread that entered it
        self._logged = -1  # the last step number put into a trainer's logs
        self._paused: list[Any] = []  # configs whose use_cache the run set to False
        self._checkpointing: list[tuple[nn.Module, dict[str, Any]]] = []  # own_checkpointing at the run's start
        self._earlier: list[StepRecord] = []  # the steps of the runtimes of earlier models

    @property
    def inside(self) -> bool:
        """True between :meth:`enter` and :meth:`exit`."""
        return self._inside

    def enter(self, model: nn.Module, *, pause_cache: bool = True) -> Runtime:
        """Enter the runtime for a run on ``model``; ``pause_cache``: NOTE [Cache paused
        in training]."""
        if self._inside:
            # A run ended without a word to the callback (an exception the trainer
            # offers no hook for, NOTE [Leaving on an exception]): close it now.
            log.warning("offrecomp: the previous training run ended without leaving the runtime; leaving it now")
            self.exit(None)
        thread = threading.get_ident()
        for other in list(_INSIDE):
            if other._inside and other._thread == thread:  # NOTE [Runs left open]
                log.warning(
                    "offrecomp: another callback's training run on this thread ended without leaving its "
                    "runtime; leaving it now"
                )
                other.exit(None)
        self._checkpointing = own_checkpointing(model)
        turn_off_own_checkpointing(model)
        self._paused = pause_training_cache(model) if pause_cache else []
        if self.runtime is None or self.runtime.model is not model:
            if self.runtime is not None:
                self._earlier = (self._earlier + self.runtime.report().steps)[-REPORT_MAX_STEPS:]
                self.runtime.close()  # its pinned pool, once no saved tensor needs it
            self.runtime = offrecomp.runtime(model, **self._options)
            self._logged = -1
        self.runtime.__enter__()
        self._inside = True
        self._thread = thread
        _INSIDE.add(self)
        return self.runtime

    def exit(self, exc: BaseException | None) -> None:
        """Leave the runtime (once; later calls do nothing)."""
        if not self._inside or self.runtime is None:
            return
        self._inside = False
        _INSIDE.discard(self)
        resume_cache(self._paused)
        self._paused = []
        restore_own_checkpointing(self._checkpointing)
        self._checkpointing = []
        if exc is None:
            self.runtime.__exit__(None, None, None)
        else:
            self.runtime.__exit__(type(exc), exc, exc.__traceback__)

    def report(self) -> Report:
        if self.runtime is None:
            return Report(steps=list(self._earlier))
        now = self.runtime.report()
        if self._earlier:
            now.steps = (self._earlier + now.steps)[-REPORT_MAX_STEPS:]
        return now

    def new_metrics(self) -> dict[str, float]:
        """:func:`step_metrics` of the steps recorded since the last call ({} if none).
        Waits for the device times of those steps (one host sync on GPU), so call it
        where the trainer logs, not every step."""
        if self.runtime is None:
            return {}
        records = [r for r in self.runtime.report().steps if r.step > self._logged]
        if not records:
            return {}
        self._logged = records[-1].step
        return step_metrics(records)


class ScopedCallback:
    """What both trainers' callbacks share: the runtime options (checked when the
    callback is made), the run scope, and the read-only views of its runtime."""

    def __init__(
        self,
        *,
        budget: int | str | None = None,
        mode: str | None = None,
        regions: Any = None,
        log_metrics: bool = True,
        **options: Any,
    ) -> None:
        if not isinstance(log_metrics, bool):  # "false" would read as True
            raise TypeError(f"log_metrics={log_metrics!r} is invalid; accepted: True, False")
        self._scope = RunScope(runtime_options(budget, mode, regions, options))
        self.log_metrics = log_metrics

    @property
    def runtime(self) -> Runtime | None:
        """The runtime (None before the first run)."""
        return self._scope.runtime

    def report(self) -> Report:
        """The runtime's report: every step of every run so far."""
        return self._scope.report()


def step_metrics(records: Sequence[StepRecord]) -> dict[str, float]:
    """The step records' main fields as scalars named ``offrecomp/<field>``, for a
    trainer's loggers (TensorBoard, W&B, CSV). Over several steps: the highest peak, the
    placement bytes of the last step (the plan now in force), the mean of the times (the
    predicted one only where every step has a prediction: beside the mean of all steps,
    the mean over some would read as a ratio it is not)."""
    if not records:
        return {}
    last = records[-1]
    out: dict[str, float] = {
        "peak_activation_bytes": float(max(r.peak_activation_bytes for r in records)),
        "kept_bytes": float(last.kept_bytes),
        "offloaded_bytes": float(last.offloaded_bytes),
        "recomputed_bytes": float(last.recomputed_bytes),
        "recompute_seconds": statistics.fmean(r.recompute_seconds for r in records),
        "step_seconds": statistics.fmean(r.step_seconds for r in records),
    }
    predicted = [r.predicted_step_seconds for r in records]
    if all(x is not None for x in predicted):
        out["predicted_step_seconds"] = statistics.fmean(x for x in predicted if x is not None)
    return {METRIC_PREFIX + k: v for k, v in out.items()}


def turn_off_own_checkpointing(model: nn.Module) -> list[str]:
    """Turn off the activation checkpointing a model runs itself; return what was
    turned off (qualified module names, "" for the model).

    Only the innermost saved-tensor hook runs, so a layer that checkpoints itself hides
    its activations from offrecomp, which can then neither place nor measure them.
    Hugging Face models are switched off through their own method
    (``activation_checkpointing_disable``, or ``gradient_checkpointing_disable`` before
    transformers 5); any other module that carries the same switch, a
    ``gradient_checkpointing = True`` attribute, has it set to False. A module wrapped
    by torch's ``checkpoint_wrapper`` cannot be switched off in place: ValueError.
    """
    wrapped = [name or type(model).__name__ for name, m in named_modules(model) if type(m).__name__ == "CheckpointWrapper"]
    if wrapped:
        raise ValueError(
            f"offrecomp: {', '.join(wrapped[:4])}{', ...' if len(wrapped) > 4 else ''} are wrapped by torch's "
            "checkpoint_wrapper (apply_activation_checkpointing, Lightning's FSDP "
            "activation_checkpointing_policy), which checkpoints them itself and hides their activations "
            "from offrecomp; build the model without it and let offrecomp recompute instead"
        )
    turned: list[str] = []
    if not _checkpointing(model):
        return turned
    for name, m in named_modules(model):
        if not _checkpointing(m):
            continue
        disable = getattr(m, "activation_checkpointing_disable", None) or getattr(m, "gradient_checkpointing_disable", None)
        if callable(disable):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # the deprecated alias, transformers 5
                disable()
            turned.append(name)
    for name, m in named_modules(model):
        if getattr(m, "gradient_checkpointing", False) is True:
            m.gradient_checkpointing = False  # type: ignore[assignment]  # a flag, not a submodule
            turned.append(name)
    turned = list(dict.fromkeys(turned))  # a compiled wrapper and its module share a name
    if turned:
        shown = ", ".join(n or type(model).__name__ for n in turned[:4]) + (", ..." if len(turned) > 4 else "")
        log.warning(
            "offrecomp: turned off the model's own activation checkpointing (%s): offrecomp "
            "recomputes, offloads or keeps each activation itself, within its budget. Leave "
            "gradient_checkpointing / activation_checkpointing unset to silence this notice.",
            shown,
        )
    return turned


# NOTE [Cache paused in training]
# A Hugging Face decoder called without ``use_cache`` takes it from its config, True by
# default, and in training too builds a key/value cache and hands it to every layer,
# which the training loop never reads. A replay must see that cache as its forward did,
# so each layer call records the bindings the cache holds (NOTE [Stateful arguments] in
# arg_state.py), all layers' so far: host time that grows with depth squared (a 48-layer
# Llama on the CPU under recompute, 269 against 197 ms per step). Hugging Face's own
# gradient checkpointing sets ``use_cache=False`` in training for the same reason, as
# does the Trainer of transformers 5 from ``TrainingArguments.use_cache`` (False unless
# asked). The callbacks, which turn that checkpointing off, do as it does: for each
# distinct config among the model's modules whose ``use_cache`` is True, it is False
# while a run lasts, with a notice logged once per process, and True again when the run ends; except
# under a Trainer whose arguments ask for the cache (``use_cache=True``). The Trainer sets
# only the top config, once, at its construction: a nested one (T5's decoder) and a model
# ``model_init`` builds at each ``train()`` keep theirs, so the callback pauses those. A
# forward passed ``use_cache=True`` explicitly (generation inside a training step) is
# left as asked. The loss is the same either way; the gradients are those of training
# without the cache, whose backward runs other ops than with one (GPT-2: other last
# bits), as under Hugging Face's checkpointing.


def pause_training_cache(model: nn.Module) -> list[Any]:
    """Set ``use_cache`` False in the configs of ``model``'s modules where it is True
    (NOTE [Cache paused in training]); return those configs."""
    paused: list[Any] = []
    for m in model.modules():
        config = getattr(m, "config", None)
        if config is not None and getattr(config, "use_cache", None) is True and all(c is not config for c in paused):
            config.use_cache = False
            paused.append(config)
    if paused:
        warn_once(
            "training-cache",
            "offrecomp: set use_cache=False in the model's config while training runs (restored at its "
            "end), as Hugging Face's gradient checkpointing does: the key/value cache a decoder builds in "
            "training is never read, and offrecomp would track it at every layer call. Set "
            "model.config.use_cache = False before training to silence this notice (given once per process)."
        )
    return paused


def resume_cache(configs: list[Any]) -> None:
    """Undo :func:`pause_training_cache` (where nothing else changed ``use_cache`` since)."""
    for config in configs:
        if getattr(config, "use_cache", None) is False:
            config.use_cache = True


def own_checkpointing(model: nn.Module) -> list[tuple[nn.Module, dict[str, Any]]]:
    """What :func:`turn_off_own_checkpointing` changes and a run's end puts back: each
    module whose ``gradient_checkpointing`` is True, with that flag, the checkpoint
    function Hugging Face's switch resets (``_gradient_checkpointing_func``: a partial
    holding the user's ``gradient_checkpointing_kwargs``), and the modules whose input
    hooks (``enable_input_require_grads``) a PEFT model's switch removes."""
    state: list[tuple[nn.Module, dict[str, Any]]] = []
    if not _checkpointing(model):
        return state
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False) is True:
            attrs = {"gradient_checkpointing": True}
            if "_gradient_checkpointing_func" in vars(m):
                attrs["_gradient_checkpointing_func"] = vars(m)["_gradient_checkpointing_func"]
            state.append((m, attrs))
        if _input_hooked(m):
            state.append((m, {"input_require_grads": True}))
    return state


def restore_own_checkpointing(state: list[tuple[nn.Module, dict[str, Any]]]) -> None:
    """Undo :func:`turn_off_own_checkpointing` from :func:`own_checkpointing`'s
    ``state``, on the modules nothing else switched on again since."""
    for m, attrs in state:
        if "input_require_grads" in attrs:
            enable = getattr(m, "enable_input_require_grads", None)
            if not _input_hooked(m) and callable(enable):
                enable()  # a removed handle cannot be put back: new hooks, as the switch makes
            continue
        if getattr(m, "gradient_checkpointing", None) is not False:
            continue
        for name, value in attrs.items():
            setattr(m, name, value)


def _input_hooked(m: nn.Module) -> bool:
    """Does ``m`` hold Hugging Face's input hooks (``enable_input_require_grads``)?"""
    return bool(vars(m).get("_require_grads_hooks")) or "_require_grads_hook" in vars(m)


def _checkpointing(m: nn.Module) -> bool:
    return any(getattr(x, "gradient_checkpointing", False) is True for x in m.modules())
