"""The models the benchmark trains: a GPT-style decoder and, optionally, a Hugging Face LM.

Every model is wrapped so that the harness sees one interface: ``model(idx, targets)``
returns the scalar cross-entropy loss, and :func:`blocks_of` returns the
``nn.ModuleList`` of repeated transformer blocks (the regions that checkpointing
strategies wrap and that offrecomp discovers on its own).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "GPT",
    "HFCausalLM",
    "ModelSpec",
    "blocks_of",
    "build_model",
    "count_matmul_params",
    "hf_available",
    "make_batch",
]

BlocksRunner = Callable[[nn.ModuleList, torch.Tensor], torch.Tensor]

MODEL_KINDS: tuple[str, ...] = ("gpt", "hf-llama", "hf-gpt2")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of the model to build. All sizes are counts, not bytes."""

    kind: str = "gpt"
    """``gpt`` (built in), ``hf-llama`` or ``hf-gpt2`` (need ``transformers``)."""
    n_layers: int = 4
    """Number of transformer blocks."""
    hidden: int = 128
    """Model width h."""
    n_heads: int = 4
    """Attention heads; ``hidden`` must be divisible by it."""
    vocab: int = 2048
    """Vocabulary size (inputs are random token ids below it)."""
    max_seq: int = 1024
    """Longest sequence the position table (or config) supports."""
    dropout: float = 0.0
    """Dropout probability after attention and MLP (0 disables it)."""
    seed: int = 0
    """Seed of the deterministic weight initialisation."""

    def with_max_seq(self, max_seq: int) -> ModelSpec:
        return replace(self, max_seq=max(self.max_seq, max_seq))

    def approx_params(self) -> int:
        """Parameter count of the GPT model with this shape (embeddings included)."""
        h, layer = self.hidden, 12 * self.hidden * self.hidden + 13 * self.hidden
        return self.n_layers * layer + 2 * self.vocab * h + self.max_seq * h + 2 * h


class Block(nn.Module):
    """Pre-LN transformer block: causal self-attention and a 4h GELU MLP, each residual."""

    def __init__(self, hidden: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if hidden % n_heads:
            raise ValueError(f"hidden={hidden} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.n_heads, h // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, s, h)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class GPT(nn.Module):
    """Token + learned position embeddings, ``blocks``, final LayerNorm, untied LM head."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        self.pos = nn.Embedding(spec.max_seq, spec.hidden)
        self.drop = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(
            Block(spec.hidden, spec.n_heads, spec.dropout) for _ in range(spec.n_layers)
        )
        self.ln_f = nn.LayerNorm(spec.hidden)
        self.head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.run_blocks: BlocksRunner | None = None
        """Set by a strategy to run the block stack its own way (checkpoint_sequential)."""
        self._init_weights()

    def _init_weights(self) -> None:
        std, resid_std = 0.02, 0.02 / math.sqrt(2 * self.spec.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() < 2:
                nn.init.ones_(p)
            elif name.endswith(("proj.weight", "fc2.weight")):
                nn.init.normal_(p, 0.0, resid_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        s = idx.shape[1]
        if s > self.spec.max_seq:
            raise ValueError(f"sequence {s} exceeds the model's max_seq={self.spec.max_seq}")
        pos = torch.arange(s, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        if self.run_blocks is not None:
            x = self.run_blocks(self.blocks, x)
        else:
            for block in self.blocks:
                x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def hf_available() -> tuple[bool, str]:
    """Whether Hugging Face ``transformers`` can be imported (without importing it)."""
    if importlib.util.find_spec("transformers") is None:
        return False, "transformers not installed (pip install offrecomp[transformers])"
    return True, ""


class HFCausalLM(nn.Module):
    """A Hugging Face causal LM built from a config (random weights, nothing downloaded)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        import transformers

        self.spec = spec
        common: dict[str, Any] = {"vocab_size": spec.vocab, "attn_implementation": "sdpa"}
        hf: Any
        if spec.kind == "hf-llama":
            hf = transformers.LlamaForCausalLM(
                transformers.LlamaConfig(
                    hidden_size=spec.hidden,
                    intermediate_size=4 * spec.hidden,
                    num_hidden_layers=spec.n_layers,
                    num_attention_heads=spec.n_heads,
                    num_key_value_heads=spec.n_heads,
                    max_position_embeddings=spec.max_seq,
                    attention_dropout=spec.dropout,
                    **common,
                )
            )
            blocks = hf.model.layers
        elif spec.kind == "hf-gpt2":
            hf = transformers.GPT2LMHeadModel(
                transformers.GPT2Config(
                    n_embd=spec.hidden,
                    n_layer=spec.n_layers,
                    n_head=spec.n_heads,
                    n_positions=spec.max_seq,
                    resid_pdrop=spec.dropout,
                    embd_pdrop=spec.dropout,
                    attn_pdrop=spec.dropout,
                    **common,
                )
            )
            blocks = hf.transformer.h
        else:
            raise ValueError(f"model kind {spec.kind!r} is not a Hugging Face kind")
        hf.config.use_cache = False
        self.hf: nn.Module = hf
        self._blocks: nn.ModuleList = blocks

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.hf(input_ids=idx, use_cache=False).logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(spec: ModelSpec, device: torch.device | str = "cpu") -> nn.Module:
    """Build ``spec`` on ``device`` with weights that depend only on ``spec.seed``."""
    if spec.kind not in MODEL_KINDS:
        raise ValueError(f"model kind {spec.kind!r} is invalid; accepted: {', '.join(MODEL_KINDS)}")
    device = torch.device(device)
    if spec.kind != "gpt":
        ok, why = hf_available()
        if not ok:
            raise RuntimeError(f"cannot build {spec.kind}: {why}")
    fork_devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(spec.seed)
        with torch.device(device):
            model: nn.Module = GPT(spec) if spec.kind == "gpt" else HFCausalLM(spec)
    return model.train()


def blocks_of(model: nn.Module) -> nn.ModuleList:
    """The repeated transformer blocks of a model built by :func:`build_model`."""
    if isinstance(model, GPT):
        return model.blocks
    if isinstance(model, HFCausalLM):
        return model._blocks
    raise TypeError(f"no block list known for {type(model).__name__}")


def count_matmul_params(model: nn.Module) -> int:
    """Weights that take part in a matrix product per token (all ``nn.Linear`` weights)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def make_batch(
    spec: ModelSpec, batch: int, seq: int, device: torch.device | str, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids ``(idx, targets)`` of shape ``(batch, seq)``, reproducible from ``seed``."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + seq)
    tokens = torch.randint(0, spec.vocab, (batch, seq + 1), generator=gen)
    tokens = tokens.to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
