"""offrecomp in PyTorch Lightning::

    from offrecomp.integrations.lightning import OffrecompCallback

    callback = OffrecompCallback(budget="20GiB")
    trainer = lightning.Trainer(max_steps=1000, callbacks=[callback])
    trainer.fit(module, datamodule)
    print(callback.report())

The callback enters one runtime around the LightningModule when ``fit`` starts and
leaves it when ``fit`` ends: at ``on_fit_end``, or at ``on_exception`` when something
raised (Lightning calls it for any exception out of ``fit``, then ``teardown``, which
leaves it too). It turns off the activation checkpointing of any Hugging Face model (or
other module with a ``gradient_checkpointing`` switch) inside the module for the run,
with a logged notice, and back on when it ends; a ``checkpoint_wrapper``-ed module is an error. At the Trainer's logging steps
it logs ``offrecomp/*`` scalars (peak activation bytes, kept, offloaded and recomputed
bytes, recompute and step seconds, the predicted step time) with
``LightningModule.log_dict``, so they reach the Trainer's loggers. Gradient accumulation
(``accumulate_grad_batches``) needs nothing: a step is what ends with an optimizer step.
Validation runs under ``no_grad``/``inference_mode``, which the runtime leaves alone.
A tuner's trial steps (``BatchSizeFinder``, ``LearningRateFinder``, ``Tuner``'s
``scale_batch_size`` and ``lr_find``) run inside the runtime too (NOTE [Callbacks
before ours]).

It works with ``lightning`` (``lightning.pytorch``) or, when that is not installed, the
standalone ``pytorch_lightning``.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone distribution
    from pytorch_lightning import Callback  # type: ignore[assignment]

from offrecomp.integrations._common import ScopedCallback

__all__ = ["OffrecompCallback"]


class OffrecompCallback(ScopedCallback, Callback):
    """Runs a Lightning Trainer's ``fit`` inside ``offrecomp.runtime``.

    ``budget``, ``mode``, ``regions`` and ``options`` are those of
    :func:`offrecomp.runtime` (checked here). ``log_metrics``: log the step records'
    main fields at the Trainer's logging steps (``log_every_n_steps``).
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
        self._last_step = -1  # the trainer's global_step when metrics were last logged
        self._early: list[Any] = []  # the callbacks whose on_fit_start enters first

    # NOTE [Callbacks before ours]
    # Lightning runs its tuner callbacks first (``BatchSizeFinder``, ``LearningRateFinder``,
    # also those ``Tuner`` adds), and they run their trial steps inside their own
    # ``on_fit_start``, before this callback's: the batch size finder would pick the size
    # that fits without the runtime, and ``lr_find`` could run out of memory on a model
    # that fits only with it. So at ``setup`` for a fit, each callback ordered before
    # this one gets an ``on_fit_start`` of its instance's that enters the runtime first
    # (the model is on its device by then, as at this callback's own ``on_fit_start``),
    # taken off again as it runs, or at ``on_exception`` or ``teardown`` (one a fit left
    # behind all the same is replaced at the next ``setup``). The trials are then steps
    # of the run: measured and planned like the rest, in its report.

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        for cb in trainer.callbacks:
            if cb is self:
                break
            set_on = vars(cb).get("on_fit_start")
            if set_on is not None and not getattr(set_on, "_offrecomp_enters", False):
                continue  # set on the instance by someone else: left as it is

            def enter_first(trainer: Any, pl_module: Any, _cb: Any = cb) -> None:
                self._unwrap(_cb)
                self._enter(trainer, pl_module)
                _cb.on_fit_start(trainer, pl_module)

            enter_first._offrecomp_enters = True  # type: ignore[attr-defined]
            cb.on_fit_start = enter_first  # one a fit that raised left is replaced
            self._early.append(cb)

    def _unwrap(self, cb: Any) -> None:
        if cb in self._early:
            self._early.remove(cb)
            vars(cb).pop("on_fit_start", None)

    def _unwrap_all(self) -> None:
        for cb in list(self._early):
            self._unwrap(cb)

    def _enter(self, trainer: Any, pl_module: Any) -> None:
        if not self._scope.inside:
            self._last_step = trainer.global_step
            self._scope.enter(pl_module)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._unwrap_all()
        self._enter(trainer, pl_module)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._scope.exit(None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._unwrap_all()  # a fit that raised before on_fit_start: Lightning calls no teardown
        self._scope.exit(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._unwrap_all()
        self._scope.exit(None)  # a fit that ended by another path (a tuner's exit)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        every = trainer.log_every_n_steps
        if not self.log_metrics or not self._scope.inside or step == self._last_step or not every:
            return
        if step % every:
            return
        self._last_step = step
        metrics = self._scope.new_metrics()
        if metrics:
            # logger=False without a logger: still in trainer.callback_metrics, and no warning
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, logger=bool(trainer.loggers), prog_bar=False)
