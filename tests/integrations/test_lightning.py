"""PyTorch Lightning with ``OffrecompCallback``: the same parameters as without it,
bitwise, under gradient accumulation and validation; one report record per optimizer
step; the step records in the logged metrics; a module's own checkpointing off while it
trains; and no saved-tensor hook left behind by an exception in ``training_step``."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import offrecomp.diagnostics
from offrecomp import _torch_compat as tc

pl = pytest.importorskip("lightning.pytorch", reason="lightning is an optional extra (pip install -e '.[lightning]')")
from offrecomp.integrations.lightning import OffrecompCallback  # noqa: E402

STEPS = 4
ACCUMULATE = 2


class Block(nn.Module):
    """A block with the switch Hugging Face layers carry: checkpoints itself when on."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.1)
        self.gradient_checkpointing = False

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.tanh(self.lin(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gradient_checkpointing and self.training:
            return checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)


class Module(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, *, fail_at: int | None = None, checkpointing: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 1)
        self.fail_at = fail_at
        self.checkpointing_seen: list[bool] = []
        for b in self.blocks:
            b.gradient_checkpointing = checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.fail_at:
            raise RuntimeError("boom in training_step")
        self.checkpointing_seen.append(any(b.gradient_checkpointing for b in self.blocks))
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8, 16, generator=g), torch.randn(32, 8, 1, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=4)


def _fit(callbacks: list[Any], **module_kw: Any) -> Module:
    logging.getLogger("lightning").setLevel(logging.ERROR)
    pl.seed_everything(0, verbose=False)
    module = Module(**module_kw)
    trainer = pl.Trainer(
        max_steps=STEPS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=ACCUMULATE,
        log_every_n_steps=1, val_check_interval=2, limit_val_batches=2, num_sanity_val_steps=1,
        callbacks=callbacks,
    )
    trainer.fit(module, _loader(), _loader())
    module.trainer_metrics = dict(trainer.callback_metrics)
    return module


def test_lightning_parameters_bitwise_equal_to_plain(caplog: pytest.LogCaptureFixture) -> None:
    plain = _fit([])
    cb = OffrecompCallback(mode="recompute", min_bytes=0)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        got = _fit([cb], checkpointing=True)
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), got.parameters()))
    assert got.checkpointing_seen == [False] * STEPS * ACCUMULATE
    assert "turned off the model's own activation checkpointing" in caplog.text
    assert tc.top_saved_tensors_hooks() is None and cb.runtime is not None and not cb.runtime.active
    steps = cb.report().steps
    assert [(s.step, s.passes) for s in steps] == [(i, ACCUMULATE) for i in range(STEPS)]
    assert all(s.recomputed_bytes > 0 and s.replays > 0 for s in steps)
    assert got.trainer_metrics["offrecomp/peak_activation_bytes"] == steps[-1].peak_activation_bytes
    assert got.trainer_metrics["offrecomp/recomputed_bytes"] == steps[-1].recomputed_bytes


def test_exception_in_training_step_leaves_no_hooks() -> None:
    cb = OffrecompCallback(mode="recompute", min_bytes=0)
    with pytest.raises(RuntimeError, match="boom in training_step"):
        _fit([cb], fail_at=2)
    assert tc.top_saved_tensors_hooks() is None
    assert cb.runtime is not None and not cb.runtime.active
    assert [s.step for s in cb.report().steps] == [0, 1]


def test_a_bad_regions_spec_is_an_error_at_construction() -> None:
    """Options are checked where the callback is made, ``regions=`` too, not once
    ``fit`` has started."""
    with pytest.raises(TypeError, match=r"regions='x' is invalid \(not every entry is a module type\); accepted: None"):
        OffrecompCallback(regions="x")
    with pytest.raises(TypeError, match=r"regions=\[\] is invalid \(it names no module type\)"):
        OffrecompCallback(regions=[])
    with pytest.raises(TypeError, match=r"regions= got a module instance \(Linear\)"):
        OffrecompCallback(regions=nn.Linear(2, 2))


def test_checkpoint_wrapper_is_refused() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    cb = OffrecompCallback()

    class Wrapped(Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(checkpoint_wrapper(Block()) for _ in range(3))

    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[cb])
    with pytest.raises(ValueError, match="checkpoint_wrapper"):
        trainer.fit(Wrapped(), _loader())
    assert tc.top_saved_tensors_hooks() is None


class _HFModule(pl.LightningModule):  # type: ignore[misc]
    """A Hugging Face GPT-2 trained by Lightning."""

    def __init__(self, use_cache: bool) -> None:
        super().__init__()
        tf = pytest.importorskip("transformers")
        cfg = tf.GPT2Config(n_embd=32, n_layer=3, n_head=4, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0)
        self.model = tf.GPT2LMHeadModel(cfg)
        self.model.config.use_cache = use_cache
        self.use_cache_seen: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.use_cache_seen.append(self.model.config.use_cache)
        (ids,) = batch
        return self.model(input_ids=ids, labels=ids).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_hugging_face_model_trains_without_its_cache_and_gets_it_back(caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Cache paused in training]: the decoder builds no key/value cache while the
    run lasts (each layer call would otherwise carry every earlier layer's cache), its
    config says use_cache=True again afterwards, and training is bitwise a plain fit's
    without the cache (with one, the backward runs other ops: other last bits)."""
    ids = torch.randint(0, 50, (16, 12), generator=torch.Generator().manual_seed(0))

    def fit(callbacks: list[Any], use_cache: bool) -> _HFModule:
        logging.getLogger("lightning").setLevel(logging.ERROR)
        logging.getLogger("transformers").setLevel(logging.ERROR)
        pl.seed_everything(0, verbose=False)
        module = _HFModule(use_cache)
        trainer = pl.Trainer(
            max_steps=STEPS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        )
        trainer.fit(module, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4))
        return module

    plain = fit([], use_cache=False)
    offrecomp.diagnostics.clear_warnings()  # the notice is given once per process
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        trained = fit([OffrecompCallback(mode="recompute", min_bytes=0)], use_cache=True)
    assert trained.use_cache_seen == [False] * STEPS and trained.model.config.use_cache is True
    assert "set use_cache=False" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), trained.parameters()))


class Tuned(Module):
    """A module a tuner may scale: its optimizer reads ``lr``, its loader ``batch_size``;
    each training step notes whether the runtime's hooks were on."""

    def __init__(self) -> None:
        super().__init__()
        self.lr, self.batch_size = 0.1, 2
        self.hooked: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.hooked.append(tc.top_saved_tensors_hooks() is not None)
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self) -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(32, 8, 16, generator=g), torch.randn(32, 8, 1, generator=g))
        return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

    def val_dataloader(self) -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
        return _loader()


@pytest.mark.parametrize("tuner", ["batch_size", "lr"])
def test_a_tuners_trial_steps_run_inside_the_runtime(tuner: str, tmp_path: Any) -> None:
    """NOTE [Callbacks before ours]: Lightning runs its tuner callbacks' ``on_fit_start``
    first, and they run their trial steps there: all without the runtime (the batch size
    finder would pick the size that fits without it). Parameters stay bitwise, and the
    callbacks are as they were afterwards."""
    from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder

    def fit(callbacks: list[Any]) -> Tuned:
        logging.getLogger("lightning").setLevel(logging.ERROR)
        pl.seed_everything(0, verbose=False)
        module = Tuned()
        finder = (
            BatchSizeFinder(mode="power", steps_per_trial=2, max_trials=2) if tuner == "batch_size"
            else LearningRateFinder(num_training_steps=3, early_stop_threshold=None)
        )
        trainer = pl.Trainer(
            max_steps=STEPS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[*callbacks, finder],
            default_root_dir=tmp_path,  # the finders' checkpoints
        )
        trainer.fit(module)
        assert "on_fit_start" not in vars(finder)
        return module

    plain = fit([])
    cb = OffrecompCallback(mode="recompute", min_bytes=0)
    got = fit([cb])
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), got.parameters()))
    assert len(got.hooked) > STEPS and all(got.hooked), got.hooked
    assert tc.top_saved_tensors_hooks() is None and cb.runtime is not None and not cb.runtime.active
    assert len(cb.report().steps) == len(got.hooked)


def test_a_fit_raising_before_on_fit_start_leaves_no_early_entry() -> None:
    """NOTE [Callbacks before ours]: a fit that raised between the callbacks' ``setup``
    and ``on_fit_start`` (the module's own ``setup``) gets no ``teardown`` from
    Lightning: the entry put on a callback ordered first stayed, holding the old
    runtime, and entered it at the next fit."""

    class Early(pl.Callback):  # type: ignore[misc]
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self.hooked = tc.top_saved_tensors_hooks() is not None

    class Fails(Module):
        def setup(self, stage: str) -> None:
            raise RuntimeError("boom in setup")

    early = Early()
    cb = OffrecompCallback(mode="recompute", min_bytes=0)
    kw: dict[str, Any] = dict(
        max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    with pytest.raises(RuntimeError, match="boom in setup"):
        pl.Trainer(callbacks=[early, cb], **kw).fit(Fails(), _loader())
    assert "on_fit_start" not in vars(early)
    second = OffrecompCallback(mode="recompute", min_bytes=0)
    pl.Trainer(callbacks=[early, second], **kw).fit(Module(), _loader())
    assert early.hooked and cb.runtime is None and second.runtime is not None
    assert tc.top_saved_tensors_hooks() is None and not second.runtime.active
