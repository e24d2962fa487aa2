"""What the trainer callbacks share, without any framework: turning a model's own
checkpointing off, the logged scalars, and a run scope that leaves its runtime once."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

import offrecomp.diagnostics
from offrecomp import StepRecord
from offrecomp import _torch_compat as tc
from offrecomp.integrations._common import (
    RunScope,
    own_checkpointing,
    pause_training_cache,
    restore_own_checkpointing,
    runtime_options,
    step_metrics,
    turn_off_own_checkpointing,
)
from tests import models


class Flagged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        for b in self.blocks:
            b.gradient_checkpointing = True


class WithDisable(nn.Module):
    """A model with Hugging Face's switch method (transformers 5's name)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Flagged()
        self.calls = 0

    def activation_checkpointing_disable(self) -> None:
        self.calls += 1
        for b in self.inner.blocks:
            b.gradient_checkpointing = False


def test_turn_off_own_checkpointing(caplog: pytest.LogCaptureFixture) -> None:
    m = WithDisable()
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        assert turn_off_own_checkpointing(m) == [""]
    assert m.calls == 1 and not any(b.gradient_checkpointing for b in m.inner.blocks)
    assert "turned off the model's own activation checkpointing (WithDisable)" in caplog.text
    f = Flagged()  # no method: the switch itself is set
    assert turn_off_own_checkpointing(f) == ["blocks.0", "blocks.1"]
    assert not any(b.gradient_checkpointing for b in f.blocks)
    assert turn_off_own_checkpointing(models.GPT()) == []
    wrapped = nn.Sequential(checkpoint_wrapper(nn.Linear(4, 4)), nn.Linear(4, 4))
    with pytest.raises(ValueError, match="checkpoint_wrapper"):
        turn_off_own_checkpointing(wrapped)


class WithInputHooks(WithDisable):
    """A PEFT-style model: its switch also removes the input hooks its enable made."""

    def __init__(self) -> None:
        super().__init__()
        self.enable_input_require_grads()

    def enable_input_require_grads(self) -> None:
        self._require_grads_hooks = [self.register_forward_hook(lambda *a: None)]

    def activation_checkpointing_disable(self) -> None:
        super().activation_checkpointing_disable()
        for h in self._require_grads_hooks:
            h.remove()
        self._require_grads_hooks = []


def test_own_checkpointing_is_restored() -> None:
    """What the switch turned off comes back at a run's end, the checkpoint function a
    switch reset and the input hooks it removed too; a module switched on again since
    is left as it is."""
    m = WithInputHooks()
    fn = m.inner.blocks[0]._gradient_checkpointing_func = object()
    state = own_checkpointing(m)
    turn_off_own_checkpointing(m)
    m.inner.blocks[0]._gradient_checkpointing_func = None  # as Hugging Face's switch resets it
    assert not any(b.gradient_checkpointing for b in m.inner.blocks) and not m._require_grads_hooks
    m.inner.blocks[1].gradient_checkpointing = "on again"  # type: ignore[assignment]
    restore_own_checkpointing(state)
    assert m.inner.blocks[0].gradient_checkpointing is True and m.inner.blocks[0]._gradient_checkpointing_func is fn
    assert m.inner.blocks[1].gradient_checkpointing == "on again"
    assert len(m._require_grads_hooks) == 1
    assert own_checkpointing(models.GPT()) == []


def test_log_metrics_must_be_a_bool() -> None:
    """A string would be read as True ("false" too): refused when the callback is made."""
    from offrecomp.integrations._common import ScopedCallback

    assert ScopedCallback(log_metrics=False).log_metrics is False
    with pytest.raises(TypeError, match=r"log_metrics='false' is invalid; accepted: True, False"):
        ScopedCallback(log_metrics="false")  # type: ignore[arg-type]


def test_runtime_options_check_the_shape_of_regions() -> None:
    """``regions=`` is checked as discover_regions checks it, with no model yet; an
    iterable is read once, here, and handed on as the tuple of its types."""
    with pytest.raises(TypeError, match=r"regions=5 is invalid; accepted: None, a module type"):
        runtime_options(None, None, 5, {})
    with pytest.raises(TypeError, match=r"\(not every entry is a module type\); accepted: None"):
        runtime_options(None, None, (nn.Linear, "x"), {})
    assert runtime_options(None, None, (t for t in [nn.Linear]), {})["regions"] == (nn.Linear,)
    assert runtime_options(None, None, nn.Linear, {})["regions"] is nn.Linear
    assert "regions" not in runtime_options(None, None, None, {})

    def pick(m: nn.Module, name: str) -> bool:
        return name == "0"

    assert runtime_options(None, None, pick, {})["regions"] is pick


def test_step_metrics() -> None:
    recs = [
        StepRecord(step=0, peak_activation_bytes=10, kept_bytes=1, recomputed_bytes=9, step_seconds=1.0),
        StepRecord(step=1, peak_activation_bytes=30, kept_bytes=5, recomputed_bytes=5, step_seconds=3.0,
                   recompute_seconds=0.5, predicted_step_seconds=2.5),
    ]
    assert step_metrics(recs) == {
        "offrecomp/peak_activation_bytes": 30.0, "offrecomp/kept_bytes": 5.0, "offrecomp/offloaded_bytes": 0.0,
        "offrecomp/recomputed_bytes": 5.0, "offrecomp/recompute_seconds": 0.25, "offrecomp/step_seconds": 2.0,
    }  # the first step has no prediction: a mean of the second's beside both steps' would read as 1.25x
    assert step_metrics(recs[1:])["offrecomp/predicted_step_seconds"] == 2.5
    assert step_metrics([]) == {}


def test_run_scope_leaves_once_and_recovers_a_run_that_ended_unseen(caplog: pytest.LogCaptureFixture) -> None:
    model = models.GPT()
    scope = RunScope(runtime_options(None, "recompute", None, {}))
    rt = scope.enter(model)
    model(torch.randint(0, 64, (2, 8))).backward()
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        assert scope.enter(model) is rt  # the first run never said it ended
    assert "ended without leaving the runtime" in caplog.text
    scope.exit(RuntimeError("x"))
    scope.exit(None)  # once only
    assert tc.top_saved_tensors_hooks() is None and not rt.active
    assert scope.new_metrics()["offrecomp/recomputed_bytes"] > 0
    assert scope.new_metrics() == {}  # nothing new since
    with pytest.raises(ValueError, match="fast"):
        runtime_options(None, "fast", None, {})


def test_a_run_on_the_same_thread_leaves_another_scope_left_open(caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Runs left open]: another scope still inside on this thread belongs to a run
    that is over; on another thread it may still be going, and the start fails."""
    import threading

    stale, fresh = (RunScope(runtime_options(None, "recompute", None, {})) for _ in range(2))
    stale_rt = stale.enter(models.GPT())
    errors: list[BaseException] = []

    def elsewhere() -> None:
        try:
            fresh.enter(models.GPT())
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "already active" in str(errors[0]) and stale.inside and not fresh.inside
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        fresh_rt = fresh.enter(models.GPT())
    assert "another callback's training run on this thread ended" in caplog.text
    assert not stale.inside and not stale_rt.active and fresh_rt.active
    fresh.exit(None)
    assert tc.top_saved_tensors_hooks() is None and not fresh_rt.active


class _Config:
    use_cache = True


class _Decoder(nn.Module):
    """A Hugging Face-style model: the config it and its base model share, and an
    encoder with a config of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.config = _Config()
        self.base = models.GPT(layers=2)
        self.base.config = self.config  # type: ignore[assignment]
        self.encoder = nn.Linear(4, 4)
        self.encoder.config = _Config()  # type: ignore[assignment]


def test_a_run_pauses_the_key_value_cache_and_restores_it(caplog: pytest.LogCaptureFixture) -> None:
    """NOTE [Cache paused in training]: every distinct config with use_cache True is
    False while the run lasts, with a notice (once per process), and True after it; a run told not to
    (a Trainer that set the config from its arguments) leaves it."""
    offrecomp.diagnostics.clear_warnings()
    model = _Decoder()
    scope = RunScope({"mode": "keep"})
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        scope.enter(model)
        assert model.config.use_cache is False and model.encoder.config.use_cache is False
        assert caplog.text.count("set use_cache=False") == 1
        scope.exit(None)
        assert model.config.use_cache is True and model.encoder.config.use_cache is True
        scope.enter(model)  # the notice is given once per process: a loop of runs logs it once
        assert model.config.use_cache is False
        scope.exit(None)
    assert caplog.text.count("set use_cache=False") == 1
    scope.enter(model, pause_cache=False)
    assert model.config.use_cache is True
    scope.exit(None)
    assert pause_training_cache(nn.Linear(2, 2)) == []
