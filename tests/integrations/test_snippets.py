"""The Accelerate and torchtune snippets of docs/integrations.md, run as written there
(the test supplies ``model``, ``optimizer``, ``loader`` and ``loss_fn``): parameters
bitwise equal to the same code with the runtime turned off (``OFFRECOMP_DISABLE=1``),
and one report record per optimizer step."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def snippet(name: str) -> str:
    """The python block after ``<!-- snippet: name -->`` in docs/integrations.md."""
    m = re.search(rf"<!-- snippet: {name} -->\s*```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert m is not None, f"no snippet {name!r} in {DOC}"
    return m.group(1)


def run_snippet(name: str, namespace: dict[str, Any], monkeypatch: pytest.MonkeyPatch, *, disable: bool) -> dict[str, Any]:
    with monkeypatch.context() as m:
        m.setenv("OFFRECOMP_MODE", "recompute")  # replay every block: the snippets pass no mode
        m.setenv("OFFRECOMP_MIN_BYTES", "0")
        if disable:
            m.setenv("OFFRECOMP_DISABLE", "1")
        exec(compile(snippet(name), f"{DOC}:{name}", "exec"), namespace)
    return namespace


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.tanh(self.lin(x)))


class TinyLM(nn.Module):
    """A model that answers ``model(**batch).loss``, as Hugging Face models do."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 50)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> types.SimpleNamespace:
        x = self.emb(input_ids)
        for b in self.blocks:
            x = b(x)
        return types.SimpleNamespace(loss=nn.functional.cross_entropy(self.head(x).flatten(0, 1), labels.flatten()))


def _tokens(n: int, seq: int = 12, vocab: int = 50) -> list[torch.Tensor]:
    return [torch.randint(0, vocab, (seq,), generator=torch.Generator().manual_seed(i)) for i in range(n)]


def test_accelerate_snippet(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("accelerate", reason="accelerate is an optional extra (pip install -e '.[accelerate]')")
    from accelerate.state import AcceleratorState, GradientState

    def namespace() -> dict[str, Any]:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        torch.manual_seed(0)
        model = TinyLM()
        data = [{"input_ids": t, "labels": t} for t in _tokens(8)]
        return {
            "model": model,
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "loader": torch.utils.data.DataLoader(data, batch_size=2),
        }

    plain = run_snippet("accelerate", namespace(), monkeypatch, disable=True)
    got = run_snippet("accelerate", namespace(), monkeypatch, disable=False)
    assert all(torch.equal(a, b) for a, b in zip(plain["model"].parameters(), got["model"].parameters()))
    assert not plain["rt"].report().steps
    steps = got["rt"].report().steps
    # 4 batches, 2 accumulated per optimizer step
    assert [(s.step, s.passes) for s in steps] == [(0, 2), (1, 2)]
    assert all(s.replays > 0 for s in steps)


def test_torchtune_snippet(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        from torchtune.models.llama3_2 import llama3_2
    except ImportError as exc:  # not installed, or installed with a torchao it cannot import
        pytest.skip(
            f"torchtune is not importable here ({exc}); it is an optional extra, and torchtune "
            "0.6.1 imports only with an older torchao (0.11, say)"
        )

    def namespace() -> dict[str, Any]:
        torch.manual_seed(0)
        model = llama3_2(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32,
                         max_seq_len=64, intermediate_dim=64, attn_dropout=0.0)
        data = [{"tokens": t[:-1], "labels": t[1:]} for t in _tokens(4, seq=17, vocab=64)]
        return {
            "model": model,
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "loader": torch.utils.data.DataLoader(data, batch_size=2),
            "loss_fn": lambda logits, labels: nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()),
        }

    plain = run_snippet("torchtune", namespace(), monkeypatch, disable=True)
    got = run_snippet("torchtune", namespace(), monkeypatch, disable=False)
    assert got["rt"].regions == ["layers.0", "layers.1"]
    assert all(torch.equal(a, b) for a, b in zip(plain["model"].parameters(), got["model"].parameters()))
    steps = got["rt"].report().steps
    assert [s.step for s in steps] == [0, 1] and all(s.replays > 0 for s in steps)


def test_accelerate_prepare_inside_the_runtime_wraps_the_root_wrapper() -> None:
    """NOTE [Forwards replaced while entered]: ``Accelerator.prepare`` with autocast inside
    ``with rt:`` wraps the model's forward slot, the runtime's wrapper, and the runtime
    still sees each root forward: the pass's signature is the model's inputs (token
    ids), not the first block's (a wrapper with ``__func__`` was rebuilt around)."""
    pytest.importorskip("accelerate", reason="accelerate is an optional extra (pip install -e '.[accelerate]')")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    import offrecomp

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    torch.manual_seed(0)
    model = TinyLM()
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    with offrecomp.runtime(model, mode="recompute", min_bytes=0) as rt:
        prepared = acc.prepare(model)
        for t in _tokens(3):
            prepared(input_ids=t[None], labels=t[None]).loss.backward()
    steps = rt.report().steps
    assert len(steps) == 3 and all("int64" in s.signature for s in steps), [s.signature for s in steps]
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
