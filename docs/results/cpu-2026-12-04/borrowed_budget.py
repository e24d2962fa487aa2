"""Activation peaks of auto under a byte budget when lengths vary: a tiny Hugging Face
Qwen2 (3 layers, hidden 64, batch 4), planned at length 32, then other lengths that
borrow its plan. Needs transformers. Run from the repository root:

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-04/borrowed_budget.py [budget bytes ...]
"""

from __future__ import annotations

import logging
import sys

import torch
import transformers as tf

import offrecomp

LENGTHS = [32, 32, 32, 20, 28, 32, 16, 24]


def run(budget: int) -> None:
    torch.manual_seed(0)
    config = tf.Qwen2Config(
        vocab_size=200, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=128, attention_dropout=0.1,
    )
    model = tf.Qwen2ForCausalLM(config)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with offrecomp.runtime(model, mode="auto", budget=budget) as rt:
        for step, n in enumerate(LENGTHS):
            x = torch.randint(0, 200, (4, n), generator=torch.Generator().manual_seed(step))
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()
    print(f"budget {budget} bytes")
    print("length  phase      peak activation bytes  within budget")
    for n, rec in zip(LENGTHS, rt.report().steps):
        print(f"{n:6d}  {rec.phase:9s}  {rec.peak_activation_bytes:21d}  {rec.peak_activation_bytes <= budget}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    for b in [int(a) for a in sys.argv[1:]] or [1_000_000, 1_200_000]:
        run(b)
