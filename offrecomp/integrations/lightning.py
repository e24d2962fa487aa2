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

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_step = trainer.global_step
        self._scope.enter(pl_module)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._scope.exit(None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._scope.exit(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
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
