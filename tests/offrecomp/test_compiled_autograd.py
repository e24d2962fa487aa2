"""NOTE [Compiled autograd] (backward_entry.py): a backward under compiled autograd runs
eagerly while a runtime is installed, with one warning; dynamo failed tracing the
runtime's unpack hook."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

import offrecomp
from offrecomp import diagnostics
from tests import models

compiled_autograd = pytest.importorskip("torch._dynamo.compiled_autograd")


@pytest.mark.parametrize("mode", ["keep", "recompute", "offload"])
def test_a_backward_under_compiled_autograd_runs_eagerly_with_a_warning(
    mode: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(diagnostics, "_warned", set())
    torch.manual_seed(0)
    model = models.Stack([models.MLPBlock(16) for _ in range(3)])
    ref = copy.deepcopy(model)
    x = torch.randn(4, 8, 16)
    ref(x).backward()
    with caplog.at_level(logging.WARNING, logger="offrecomp"), offrecomp.runtime(model, mode=mode, min_bytes=0):
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            loss = model(x)
            with compiled_autograd._enable(torch.compile(backend="eager")):
                loss.backward()
    assert compiled_autograd.compiled_autograd_enabled is False  # as found
    for a, b in zip(ref.parameters(), model.parameters()):
        assert isinstance(b.grad, torch.Tensor) and torch.equal(a.grad, b.grad)  # type: ignore[arg-type]
    assert caplog.text.count("compiled autograd is on") == 1


def test_compiled_autograd_is_left_alone_without_a_runtime() -> None:
    """Only while a runtime is installed: the wrapper is gone after it."""
    m = nn.Linear(4, 4)
    with offrecomp.runtime(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))):
        pass
    seen: list[bool] = []
    m.weight.register_hook(lambda g: seen.append(bool(compiled_autograd.in_compiled_autograd_region)) or g)
    with compiled_autograd._enable(torch.compile(backend="eager")):
        m(torch.randn(2, 4)).sum().backward()
    assert seen == [True]
