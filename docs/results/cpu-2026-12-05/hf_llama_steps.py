"""Step time of a Hugging Face Llama (12 layers of width 64, 2 x 32 tokens) under a
runtime mode, on the CPU's thread clock: median of 7 rounds of 10 steps.

    python docs/results/cpu-2026-12-05/hf_llama_steps.py TREE MODE[@BUDGET]

TREE is the root of the offrecomp tree to import (a git worktree of another commit, for
a side-by-side run); MODE keep, recompute, offload or auto (auto@50%: with a budget).
"""

from __future__ import annotations

import logging
import statistics
import sys
import time

root = sys.argv[1]
sys.path.insert(0, root)

import torch  # noqa: E402
import transformers as tf  # noqa: E402

import offrecomp  # noqa: E402

logging.getLogger("transformers").setLevel(logging.ERROR)
assert offrecomp.__file__.startswith(root), offrecomp.__file__
V = 100
cfg = tf.LlamaConfig(
    hidden_size=64, num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
    vocab_size=V, max_position_embeddings=128,
)
torch.manual_seed(0)


class LM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.m = tf.LlamaForCausalLM(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=x, labels=x).loss


m = LM().train()
x = torch.randint(0, V, (2, 32))
mode, _, budget = sys.argv[2].partition("@")
rt = offrecomp.runtime(m, mode=mode, min_bytes=0, **({"budget": budget} if budget else {}))


def run(k: int) -> None:
    with rt:
        for _ in range(k):
            m(x).backward()


run(5)
ts = []
for _ in range(7):
    t = time.thread_time()
    run(10)
    ts.append((time.thread_time() - t) / 10 * 1e3)
print(f"{sys.argv[2]}: {statistics.median(ts):.2f} ms/step")
