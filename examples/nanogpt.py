"""A nanoGPT-style training loop inside ``offrecomp.runtime``.

Trains a small GPT on the bytes of this repository's own Markdown files (no download),
then prints the runtime's report. The defaults finish in about a minute on a 2-core CPU;
on a GPU, scale up with flags::

    python examples/nanogpt.py                                  # tiny, CPU
    python examples/nanogpt.py --budget 4MiB                    # make it recompute
    python examples/nanogpt.py --layers 12 --hidden 768 --heads 12 --seq 4096 --batch 4 \\
        --steps 200 --budget 20GiB                              # a GPU
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import offrecomp

ROOT = Path(__file__).resolve().parent.parent


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.heads = heads
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads, dropout)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's model: token and position embeddings, a stack of blocks (offrecomp's
    regions, found on its own), a tied output head."""

    def __init__(self, *, vocab: int = 256, seq: int = 128, layers: int = 4, hidden: int = 128,
                 heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(hidden, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def byte_corpus() -> torch.Tensor:
    """The bytes of the repository's Markdown files: a small, always-present corpus."""
    files = sorted(ROOT.glob("*.md")) + sorted((ROOT / "docs").glob("*.md"))
    data = b"\n".join(f.read_bytes() for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def batches(data: torch.Tensor, *, batch: int, seq: int, seed: int = 0):  # type: ignore[no-untyped-def]
    """Endless random (input, target) windows of ``data``, shifted by one byte."""
    g = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s : s + seq] for s in start.tolist()])
        y = torch.stack([data[s + 1 : s + 1 + seq] for s in start.tolist()])
        yield x, y


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--budget", default=None, help="offrecomp's activation budget: 4MiB, 20GiB, 60%% (default: automatic)")
    p.add_argument("--mode", default=None, help="auto (default), keep, offload, recompute, off")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--bf16", action="store_true", help="autocast to bfloat16 (on a GPU)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # shows OFFRECOMP_LOG's lines
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = GPT(seq=args.seq, layers=args.layers, hidden=args.hidden, heads=args.heads).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    data = batches(byte_corpus(), batch=args.batch, seq=args.seq, seed=args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"nanogpt: {n_params / 1e6:.2f}M parameters, {args.layers} layers, seq {args.seq}, batch {args.batch}, {device}")
    start = time.perf_counter()
    with offrecomp.runtime(model, budget=args.budget, mode=args.mode) as rt:
        for step in range(args.steps):
            x, y = (t.to(device, non_blocking=True) for t in next(data))
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % max(1, args.steps // 6) == 0 or step == args.steps - 1:
                print(f"step {step:4d}  loss {loss.item():.3f}  ({loss.item() / math.log(2):.2f} bits/byte)")
    print(f"{args.steps} steps in {time.perf_counter() - start:.1f} s\n")
    print(rt.report())


if __name__ == "__main__":
    main()
