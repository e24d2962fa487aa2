"""offrecomp in the Hugging Face ``Trainer`` (and TRL's trainers, which are Trainers)::

    from offrecomp.integrations.transformers import OffrecompCallback

    callback = OffrecompCallback(budget="20GiB")
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[callback])
    trainer.train()
    print(callback.report())

The callback enters one runtime when ``train()`` starts its loop and leaves it when the
loop ends, by exception too (NOTE [Leaving on an exception]). It turns the model's own
activation checkpointing off for the run (``TrainingArguments(gradient_checkpointing=True)``),
with a logged notice, and back on when the run ends, and adds ``offrecomp/*`` scalars (peak activation bytes, kept,
offloaded and recomputed bytes, recompute and step seconds, the predicted step time) to
the Trainer's training logs, which carry them to TensorBoard, W&B and the rest.
Gradient accumulation needs nothing: a step is what ends with an optimizer step.
Evaluation runs under ``no_grad``, which the runtime leaves alone.
"""

from __future__ import annotations

import functools
import logging
import sys
from types import FrameType
from typing import Any

from transformers import TrainerCallback

from offrecomp.integrations._common import ScopedCallback

__all__ = ["OffrecompCallback"]

log = logging.getLogger(__name__)

# NOTE [Leaving on an exception]
# The Trainer calls no callback when train() raises: on_train_end is reached only by a
# loop that finished. A runtime entered in on_train_begin would stay entered, its
# saved-tensor hooks on the thread's stack, after a failed train(). So the callback wraps
# the Trainer's own train (an attribute of the instance, once): the wrapper leaves the
# runtime with the exception and re-raises it. Callbacks get no reference to their
# Trainer; _calling_trainer finds it as the caller of the event that called us. A
# callback the Trainer was built with wraps train() in on_init_end, before any run. One
# added later (trainer.add_callback) is first seen inside a run, in on_train_begin: it
# wraps train() for the runs after it and, for this one, the methods the loop calls
# through the instance at every step (RUN_GUARDS: the forwards and backwards, the batches
# with their collator, logging, evaluation and saving, and every callback's events),
# each put back when the run ends. Whatever still ends a run unseen (an optimizer's step
# raising, or a Trainer the lookup cannot find, which is logged), the next run's start
# leaves the runtime before entering it again, also the start of another callback's run
# on the same thread (NOTE [Runs left open] in _common.py).

#: (attribute path from the Trainer, method) the loop calls at each step, guarded for a
#: run that started before the callback was added; a method a version lacks is skipped.
RUN_GUARDS = (
    ("", "training_step"),
    ("", "get_batch_samples"),
    ("", "_maybe_log_save_evaluate"),
    ("callback_handler", "call_event"),
)


class OffrecompCallback(ScopedCallback, TrainerCallback):
    """Runs a Hugging Face Trainer's training loop inside ``offrecomp.runtime``.

    ``budget``, ``mode``, ``regions`` and ``options`` are those of
    :func:`offrecomp.runtime` (checked here). ``log_metrics``: add the step records'
    main fields to the Trainer's logs at each logging step.
    """

    def __init__(
        self,
        *,
        budget: int | str | None = None,
        mode: str | None = None,
        regions: Any = None,
        log_metrics: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(budget=budget, mode=mode, regions=regions, log_metrics=log_metrics, **options)
        self._run_guards: list[tuple[Any, str, Any]] = []  # (owner, method name, its attribute before ours)

    # ---------------------------------------------------------------- events

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = _calling_trainer(self)
        if trainer is not None:
            self._attach(trainer)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        trainer = _calling_trainer(self)
        if trainer is None:
            log.warning(
                "offrecomp: OffrecompCallback could not find the Trainer that called it, so an "
                "exception out of train() leaves the runtime entered until the next train() starts"
            )
        elif not _guarded(trainer.train, self):
            self._attach(trainer)
            self._guard_run(trainer)  # this run started unguarded
        if model is None:
            raise ValueError("offrecomp: the Trainer passed no model to on_train_begin")
        # NOTE [Cache paused in training]: unless the arguments ask for the cache (transformers
        # 5's TrainingArguments.use_cache), also in configs the Trainer did not set
        self._scope.enter(model, pause_cache=getattr(args, "use_cache", False) is not True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._leave(None)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        # A training step's log holds its "loss"; an evaluation's (eval_loss, the metrics
        # dict evaluate() returns) and the run's summary do not: the scalars wait for the
        # next training log, so its peak is the highest since the last one.
        if not self.log_metrics or logs is None or "loss" not in logs or not self._scope.inside:
            return
        metrics = self._scope.new_metrics()
        if not metrics:
            return
        history = state.log_history[-1] if state.log_history else None
        logs.update(metrics)
        # Trainer.log put a copy of these logs in the history before the callbacks ran
        if isinstance(history, dict) and all(history.get(k) == v for k, v in logs.items() if k not in metrics):
            history.update(metrics)

    # --------------------------------------------------------------- helpers

    def _leave(self, exc: BaseException | None) -> None:
        guards, self._run_guards = self._run_guards, []
        for owner, name, previous in reversed(guards):
            if previous is None:
                vars(owner).pop(name, None)
            else:
                setattr(owner, name, previous)
        self._scope.exit(exc)

    def _attach(self, trainer: Any) -> None:
        """Wrap ``trainer.train`` (NOTE [Leaving on an exception]) and run this
        callback's ``on_log`` before the reporting callbacks', so that the scalars it
        adds reach TensorBoard, W&B and the rest."""
        if not _guarded(trainer.train, self):
            trainer.train = _guard(trainer.train, self)
        callbacks = trainer.callback_handler.callbacks
        # Called while the handler walks this list: moving ourselves from index k to 0
        # leaves every later entry where it was, so none is skipped or called twice.
        if callbacks and callbacks[0] is not self and self in callbacks:
            callbacks.remove(self)
            callbacks.insert(0, self)

    def _guard_run(self, trainer: Any) -> None:
        """Guard the methods of RUN_GUARDS for the run under way (NOTE [Leaving on an
        exception])."""
        for path, name in RUN_GUARDS:
            owner = getattr(trainer, path, None) if path else trainer
            method = getattr(owner, name, None)
            if not callable(method) or _guarded(method, self):
                continue
            self._run_guards.append((owner, name, vars(owner).get(name)))
            setattr(owner, name, _guard(method, self))


def _guard(fn: Any, callback: OffrecompCallback) -> Any:
    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            callback._leave(exc)
            raise

    guarded._offrecomp_callback = callback  # type: ignore[attr-defined]
    return guarded


def _guarded(fn: Any, callback: OffrecompCallback) -> bool:
    while fn is not None:
        if getattr(fn, "_offrecomp_callback", None) is callback:
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def _calling_trainer(callback: OffrecompCallback, depth: int = 8) -> Any:
    """The Trainer whose event is calling ``callback``: the nearest caller whose
    ``self`` has a callback handler that holds it (NOTE [Leaving on an exception])."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        handler = getattr(owner, "callback_handler", None)
        if handler is not None and any(c is callback for c in getattr(handler, "callbacks", ())):
            return owner
        frame = frame.f_back
    return None
