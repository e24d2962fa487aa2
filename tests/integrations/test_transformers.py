"""The Hugging Face Trainer with ``OffrecompCallback``: the same parameters as without
it, bitwise, under gradient accumulation and evaluation passes; one report record per
optimizer step; the step records in the Trainer's logs; the model's own checkpointing
off while it trains; and no saved-tensor hook left behind by an exception."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from offrecomp import _torch_compat as tc

tf = pytest.importorskip("transformers", reason="transformers is an optional extra (pip install -e '.[transformers]')")
pytest.importorskip("accelerate", reason="the Hugging Face Trainer needs accelerate (pip install -e '.[accelerate]')")
from offrecomp.integrations.transformers import OffrecompCallback  # noqa: E402

STEPS = 3
# transformers 5 renamed TrainingArguments.gradient_checkpointing
CHECKPOINTING_ARG = (
    "activation_checkpointing" if "activation_checkpointing" in tf.TrainingArguments.__dataclass_fields__
    else "gradient_checkpointing"
)
ACCUMULATE = 2


class _Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x}


class _Probe(tf.TrainerCallback):  # type: ignore[misc]
    """Records, at every step, whether any module of the model checkpoints itself, and
    its config's ``use_cache``."""

    def __init__(self) -> None:
        self.checkpointing: list[bool] = []
        self.use_cache: list[bool] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.checkpointing.append(any(getattr(m, "gradient_checkpointing", False) for m in model.modules()))
        self.use_cache.append(model.config.use_cache)


class _FailingTrainer(tf.Trainer):  # type: ignore[misc]
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.state.global_step == 1:
            raise RuntimeError("boom in training_step")
        return super().training_step(*args, **kwargs)


def _trainer(
    tmp_path: Any, callbacks: list[Any], *, checkpointing: bool = False, cls: Any = None, **extra: Any
) -> Any:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0)
    model = tf.GPT2LMHeadModel(cfg)
    kw: dict[str, Any] = dict(
        output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=2,
        gradient_accumulation_steps=ACCUMULATE, learning_rate=1e-3, logging_steps=1,
        eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4, report_to="none",
        save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )
    args = tf.TrainingArguments(**{**kw, CHECKPOINTING_ARG: checkpointing, **extra})
    return (cls or tf.Trainer)(model=model, args=args, train_dataset=_Tokens(), eval_dataset=_Tokens(), callbacks=callbacks)


def _params(trainer: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_trainer_parameters_bitwise_equal_to_plain(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    plain = _trainer(tmp_path, [])
    plain.train()
    cb, probe = OffrecompCallback(mode="recompute", min_bytes=0), _Probe()
    # the user asked for the Trainer's own checkpointing: the callback turns it off
    trainer = _trainer(tmp_path, [cb, probe], checkpointing=True)
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(_params(plain), _params(trainer)))
    assert probe.checkpointing == [False] * STEPS
    assert "turned off the model's own activation checkpointing" in caplog.text
    assert tc.top_saved_tensors_hooks() is None and cb.runtime is not None and not cb.runtime.active
    # one record per optimizer step, its micro-batches its passes; evaluation (no_grad) adds none
    steps = cb.report().steps
    assert [(s.step, s.passes) for s in steps] == [(i, ACCUMULATE) for i in range(STEPS)]
    assert all(s.recomputed_bytes > 0 and s.replays > 0 for s in steps)
    # the step records reach the Trainer's logs (and so its reporting callbacks)
    train_logs = [h for h in trainer.state.log_history if "loss" in h]
    eval_logs = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(train_logs) == STEPS and len(eval_logs) == 2
    for h, s in zip(train_logs, steps):
        assert h["offrecomp/peak_activation_bytes"] == s.peak_activation_bytes
        assert h["offrecomp/recomputed_bytes"] == s.recomputed_bytes
        assert h["offrecomp/step_seconds"] == s.step_seconds
    assert not any(k.startswith("offrecomp/") for h in eval_logs for k in h)
    # on_log runs first, so the reporting callbacks see the scalars
    assert trainer.callback_handler.callbacks[0] is cb


def test_scalars_go_to_training_logs_only(tmp_path: Any) -> None:
    """Logging and evaluation steps that do not line up: an evaluation's log (and the
    metrics evaluate() returns) gets no offrecomp scalars, and each training log's peak
    is the highest of the steps since the previous training log."""
    cb = OffrecompCallback(mode="recompute", min_bytes=0)
    trainer = _trainer(tmp_path, [cb], max_steps=6, logging_steps=2, eval_steps=3)
    trainer.train()
    steps = cb.report().steps
    assert len(steps) == 6
    history = trainer.state.log_history
    assert not any(k.startswith("offrecomp/") for h in history if "eval_loss" in h for k in h)
    train_logs = [h for h in history if "loss" in h]
    assert [h["step"] for h in train_logs] == [2, 4, 6]
    for h in train_logs:  # steps are 1-based in the logs, 0-based in the records
        since = steps[h["step"] - 2 : h["step"]]
        assert h["offrecomp/peak_activation_bytes"] == max(s.peak_activation_bytes for s in since)
    metrics = trainer.evaluate()
    assert not any(k.startswith("offrecomp/") for k in metrics)


@pytest.mark.skipif(
    "use_cache" not in tf.TrainingArguments.__dataclass_fields__, reason="a Trainer without TrainingArguments.use_cache"
)
def test_the_model_s_own_checkpointing_is_back_after_training(tmp_path: Any) -> None:
    """The callback turns the model's checkpointing off for the run and back on at its
    end, with the checkpoint function the Trainer set (a partial holding the arguments'
    ``use_reentrant=False``): before, it stayed off after ``train()``."""
    probe = _Probe()
    trainer = _trainer(
        tmp_path, [OffrecompCallback(mode="recompute", min_bytes=0), probe], checkpointing=True,
        **{f"{CHECKPOINTING_ARG}_kwargs": {"use_reentrant": False}},
    )
    trainer.train()
    assert probe.checkpointing == [False] * STEPS
    on = [m for m in trainer.model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    assert len(on) == 3  # GPT2Model and its two blocks
    assert all(m._gradient_checkpointing_func.keywords == {"use_reentrant": False} for m in on)


def test_a_cache_the_trainer_was_asked_for_is_left(tmp_path: Any) -> None:
    """NOTE [Cache paused in training]: transformers 5's Trainer sets the config's
    use_cache from its arguments; asked for a cache, the run keeps it."""
    probe = _Probe()
    trainer = _trainer(tmp_path, [OffrecompCallback(mode="recompute", min_bytes=0), probe], use_cache=True)
    trainer.train()
    assert probe.use_cache == [True] * STEPS


def test_the_cache_of_a_model_the_trainer_did_not_set_is_paused(tmp_path: Any) -> None:
    """NOTE [Cache paused in training]: the Trainer sets ``use_cache`` only in the top
    config of the model it was given, at its construction. A model ``model_init`` builds
    at ``train()`` (as hyperparameter search does) kept its cache in training: each layer
    was handed one, and the runtime recorded its state at every call. Paused while the
    run lasts, as in nested configs (T5's decoder), and restored after."""
    probe = _Probe()

    def model_init() -> Any:
        torch.manual_seed(0)
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0)
        return tf.GPT2LMHeadModel(cfg)

    args = _trainer(tmp_path, []).args  # the suite's arguments (use_cache not asked for)
    trainer = tf.Trainer(
        model_init=model_init, args=args, train_dataset=_Tokens(), eval_dataset=_Tokens(),
        callbacks=[OffrecompCallback(mode="recompute", min_bytes=0), probe],
    )
    trainer.train()
    assert probe.use_cache == [False] * STEPS
    assert trainer.model.config.use_cache is True  # the model's own setting, back
    # a second train() builds another model, with a runtime of its own: the callback's
    # report still holds every step of every train()
    callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, OffrecompCallback))
    trainer.train()
    assert [s.step for s in callback.report().steps] == [*range(STEPS), *range(STEPS)]


@pytest.mark.parametrize("added", ["constructor", "add_callback"])
def test_exception_in_training_step_leaves_no_hooks(tmp_path: Any, added: str) -> None:
    cb = OffrecompCallback(mode="recompute", min_bytes=0)
    trainer = _trainer(tmp_path, [cb] if added == "constructor" else [], cls=_FailingTrainer)
    if added == "add_callback":
        trainer.add_callback(cb)
    with pytest.raises(RuntimeError, match="boom in training_step"):
        trainer.train()
    assert tc.top_saved_tensors_hooks() is None
    assert cb.runtime is not None and not cb.runtime.active
    assert [s.step for s in cb.report().steps] == [0]  # the step that finished
    # the next run enters and leaves again
    trainer.args.max_steps = 1
    trainer.training_step = tf.Trainer.training_step.__get__(trainer)
    trainer.train()
    assert tc.top_saved_tensors_hooks() is None and not cb.runtime.active


class _FailingCallback(tf.TrainerCallback):  # type: ignore[misc]
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 1:
            raise RuntimeError("boom in another callback")


@pytest.mark.parametrize("source", ["collator", "callback"])
def test_exception_outside_training_step_of_a_run_the_callback_joined_late_leaves_no_hooks(
    tmp_path: Any, source: str
) -> None:
    """NOTE [Leaving on an exception]: a callback added to a Trainer that already ran
    guards the loop's methods for its first run too; a new callback starts after it."""
    cb = OffrecompCallback(mode="recompute", min_bytes=0)
    trainer = _trainer(tmp_path, [_FailingCallback()] if source == "callback" else [])
    if source == "collator":
        batches = [0]

        def collate(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
            batches[0] += 1
            if batches[0] == 3:
                raise RuntimeError("boom in the collator")
            return tf.default_data_collator(features)

        trainer.data_collator = collate
    trainer.add_callback(cb)
    with pytest.raises(RuntimeError, match="boom in"):
        trainer.train()
    assert tc.top_saved_tensors_hooks() is None
    assert cb.runtime is not None and not cb.runtime.active
    assert "training_step" not in vars(trainer) and "call_event" not in vars(trainer.callback_handler)
    other = OffrecompCallback(mode="recompute", min_bytes=0)
    fresh = _trainer(tmp_path, [other])
    fresh.train()
    assert tc.top_saved_tensors_hooks() is None and other.runtime is not None and not other.runtime.active


def test_bad_option_is_an_error_at_construction() -> None:
    with pytest.raises(ValueError, match="fast"):
        OffrecompCallback(mode="fast")
    with pytest.raises(TypeError, match="budgett"):
        OffrecompCallback(budgett="1GiB")
    with pytest.raises(TypeError, match=r"regions='x' is invalid \(not every entry is a module type\); accepted: None"):
        OffrecompCallback(regions="x")
