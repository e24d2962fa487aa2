"""A Hugging Face causal-LM trained with ``Trainer`` and offrecomp's callback.

A GPT-2 made from a small config (no download) learns the bytes of this repository's
Markdown files. ``--gradient-checkpointing`` turns on the Trainer's own checkpointing to
show the callback turning it off. The defaults finish in about a minute on a 2-core CPU;
scale up with flags on a GPU::

    python examples/hf_trainer.py
    python examples/hf_trainer.py --layers 12 --hidden 768 --heads 12 --seq 1024 --batch 8 \\
        --steps 200 --bf16 --budget 20GiB

Needs ``pip install 'offrecomp[transformers,accelerate]'``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile

import torch
from nanogpt import byte_corpus  # this folder's nanoGPT example: the same corpus
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from offrecomp.integrations.transformers import OffrecompCallback

# transformers 5 renamed TrainingArguments.gradient_checkpointing
CHECKPOINTING_ARG = (
    "activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
    else "gradient_checkpointing"
)


class ByteWindows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Consecutive windows of ``seq`` bytes: a causal LM's inputs, which are its labels."""

    def __init__(self, data: torch.Tensor, seq: int) -> None:
        self.data, self.seq = data, seq

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.data[i * self.seq : (i + 1) * self.seq]
        return {"input_ids": x, "labels": x}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--accumulate", type=int, default=2, help="gradient accumulation steps")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--budget", default=None, help="offrecomp's activation budget: 4MiB, 20GiB, 60%% (default: automatic)")
    p.add_argument("--mode", default=None, help="auto (default), keep, offload, recompute, off")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="ask the Trainer for its own checkpointing (the callback turns it off)")
    p.add_argument("--output-dir", default=None, help="the Trainer's output directory (default: a temporary one)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=args.seq, n_embd=args.hidden, n_layer=args.layers,
                        n_head=args.heads, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    data = byte_corpus()
    split = int(0.9 * len(data))
    callback = OffrecompCallback(budget=args.budget, mode=args.mode)
    with tempfile.TemporaryDirectory() as tmp:
        training = TrainingArguments(
            output_dir=args.output_dir or tmp,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch,
            per_device_eval_batch_size=args.batch,
            gradient_accumulation_steps=args.accumulate,
            learning_rate=1e-3,
            warmup_steps=max(1, args.steps // 10),
            logging_steps=max(1, args.steps // 4),
            eval_strategy="steps",
            eval_steps=max(1, args.steps // 2),
            save_strategy="no",
            report_to="none",
            bf16=args.bf16,
            disable_tqdm=True,
            dataloader_num_workers=0,
            dataloader_pin_memory=torch.cuda.is_available(),
            **{CHECKPOINTING_ARG: args.gradient_checkpointing},
        )
        trainer = Trainer(
            model=model,
            args=training,
            train_dataset=ByteWindows(data[:split], args.seq),
            eval_dataset=torch.utils.data.Subset(ByteWindows(data[split:], args.seq), range(4 * args.batch)),
            callbacks=[callback],
        )
        trainer.train()
    print()
    print(callback.report())


if __name__ == "__main__":
    main()
