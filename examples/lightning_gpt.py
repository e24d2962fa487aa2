"""A PyTorch Lightning module trained with offrecomp's callback.

The nanoGPT example's model, wrapped in a LightningModule, learns the bytes of this
repository's Markdown files; the callback runs ``fit`` inside ``offrecomp.runtime``.
The defaults finish in about a minute on a 2-core CPU; scale up with flags on a GPU::

    python examples/lightning_gpt.py
    python examples/lightning_gpt.py --layers 12 --hidden 768 --heads 12 --seq 4096 --batch 4 \\
        --steps 200 --precision bf16-mixed --budget 20GiB

Needs ``pip install 'offrecomp[lightning]'``.
"""

from __future__ import annotations

import argparse
import itertools
import logging

import lightning.pytorch as pl
import torch
from nanogpt import GPT, batches, byte_corpus  # this folder's nanoGPT example

from offrecomp.integrations.lightning import OffrecompCallback


class LitGPT(pl.LightningModule):
    def __init__(self, *, seq: int, layers: int, hidden: int, heads: int, lr: float) -> None:
        super().__init__()
        self.model = GPT(seq=seq, layers=layers, hidden=hidden, heads=heads)
        self.lr = lr

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.model(idx, targets)

    # Call the module (self(...)), not self.model: the runtime wraps the LightningModule's
    # forward and learns each pass's input shapes there, to plan per shape.
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self(*batch)
        self.log("loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self(*batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.1)


class Windows(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """``count`` batches of random windows of the corpus (the loader does not batch again)."""

    def __init__(self, data: torch.Tensor, *, batch: int, seq: int, count: int, seed: int) -> None:
        self.data, self.batch, self.seq, self.count, self.seed = data, batch, seq, count, seed

    def __iter__(self):  # type: ignore[no-untyped-def]
        return itertools.islice(batches(self.data, batch=self.batch, seq=self.seq, seed=self.seed), self.count)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--budget", default=None, help="offrecomp's activation budget: 4MiB, 20GiB, 60%% (default: automatic)")
    p.add_argument("--mode", default=None, help="auto (default), keep, offload, recompute, off")
    p.add_argument("--precision", default=None, help="Lightning's precision, e.g. bf16-mixed")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    pl.seed_everything(0, verbose=False)
    module = LitGPT(seq=args.seq, layers=args.layers, hidden=args.hidden, heads=args.heads, lr=args.lr)
    data = byte_corpus()
    split = int(0.9 * len(data))
    train = Windows(data[:split], batch=args.batch, seq=args.seq, count=args.steps * args.accumulate, seed=0)
    val = Windows(data[split:], batch=args.batch, seq=args.seq, count=2, seed=1)
    callback = OffrecompCallback(budget=args.budget, mode=args.mode)
    trainer = pl.Trainer(
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        precision=args.precision,
        gradient_clip_val=1.0,
        val_check_interval=max(1, args.steps // 2),
        log_every_n_steps=max(1, args.steps // 4),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(module, torch.utils.data.DataLoader(train, batch_size=None), torch.utils.data.DataLoader(val, batch_size=None))
    metrics = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items()}
    print(f"\nlast logged metrics: {metrics}\n")
    print(callback.report())


if __name__ == "__main__":
    main()
