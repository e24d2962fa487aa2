"""torch.compile: a compiled block inside the runtime trains correctly (handled as
opaque); blocks that run inside a compiled frame (a compiled model) are kept."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch

import offrecomp
from tests import models
from tests.helpers import assert_bitwise, train, twin


def _compiled_gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    m = models.GPT(layers=2, h=32, heads=4, p=0.0)
    for i, blk in enumerate(m.blocks):
        m.blocks[i] = torch.compile(blk, backend="aot_eager", dynamic=False)
    return m


@pytest.mark.parametrize("mode", ["recompute", "auto", "offload"])
def test_compiled_blocks_train_like_the_plain_compiled_model(mode: str) -> None:
    torch._dynamo.reset()
    model = _compiled_gpt()

    def batch(s: int) -> torch.Tensor:
        return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s))

    ref = train(twin(model), batch, steps=3)
    m = twin(model)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
    assert rt.regions == ["blocks.0", "blocks.1"]
    got = train(m, batch, rt, steps=3)
    assert_bitwise(ref, got)
    if mode == "auto":
        entry = next(iter(rt._planner.entries.values()))
        assert all(st.opaque for st in entry.structures.values())  # compiled code is opaque
    if mode == "recompute":
        assert rt.report().steps[-1].replays == 2


def _whole(m: torch.nn.Module) -> torch.nn.Module:
    return torch.compile(m, backend="aot_eager")


def _whole_in_place(m: torch.nn.Module) -> torch.nn.Module:
    m.compile(backend="aot_eager")
    return m


def _blocks_in_place(m: torch.nn.Module) -> torch.nn.Module:
    for blk in m.blocks:  # type: ignore[union-attr]
        blk.compile(backend="aot_eager")
    return m


@pytest.mark.parametrize(
    ("how", "mode"),
    [
        (_whole, "recompute"),
        (_whole, "auto"),
        (_whole, "offload"),
        (_whole_in_place, "recompute"),
        (_blocks_in_place, "recompute"),
    ],
    ids=["whole-recompute", "whole-auto", "whole-offload", "whole_in_place-recompute", "blocks_in_place-recompute"],
)
def test_blocks_inside_a_compiled_frame_are_kept_not_replayed(
    how: Callable[[torch.nn.Module], torch.nn.Module], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """torch.compile(model), model.compile() and block.compile() run a block's forward as
    a compiled graph, whose saves a replay (eager) cannot reproduce: such a region is
    not a region. Its activations are kept (or offloaded), with a warning that says how
    to compile for recompute; gradients equal the plain compiled model's."""
    import sys

    torch._dynamo.reset()
    torch.manual_seed(0)
    base = models.GPT(layers=2, h=32, heads=4, p=0.0)

    def batch(s: int) -> torch.Tensor:
        return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s))

    ref = train(how(twin(base)), batch, steps=2)
    torch._dynamo.reset()
    m = how(twin(base))
    sys.modules["offrecomp.runtime"]._warned.clear()  # the package's `runtime` is the function
    with caplog.at_level(logging.WARNING, logger="offrecomp"):
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0, budget="50%")
        got = train(m, batch, rt, steps=2)
    assert_bitwise(ref, got)
    assert all(s.replays == 0 and s.recomputed_bytes == 0 for s in rt.report().steps)
    assert any("runs inside a torch.compile'd frame" in r.getMessage() for r in caplog.records)
