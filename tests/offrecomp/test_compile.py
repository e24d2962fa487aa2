"""torch.compile: a compiled block inside the runtime trains correctly (handled as opaque)."""

from __future__ import annotations

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
