"""offrecomp's training-cache warning on prefix tuning, where the loss does read the cache.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05h/repro_prefix_cache_warning.py

torch, transformers 5.25.0 and offrecomp only (no peft): a tiny GPT-2 trained through a
trainable prefix handed to it as a ``DynamicCache`` of key/value pairs, as peft's
``PrefixTuningConfig`` does (peft 0.21.2, ``PeftModel.get_prompt`` then
``DynamicCache(past_key_values)``), with ``use_cache=False`` as the warning advises.
The prefix parameters get non-zero gradients (the loss reads the cache), yet offrecomp
warns that "the loss never reads it" and advises ``use_cache=False``, which the model
already has and which cannot drop a cache the caller passes. Gradients stay bitwise.
"""

import copy
import logging

import torch
import transformers as tf
from torch import nn

import offrecomp

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
logging.getLogger("transformers").setLevel(logging.ERROR)


class PrefixGPT2(nn.Module):
    def __init__(self, n_prefix: int = 4) -> None:
        super().__init__()
        cfg = tf.GPT2Config(n_embd=32, n_layer=3, n_head=4, vocab_size=100, n_positions=64, use_cache=False)
        self.lm = tf.GPT2LMHeadModel(cfg).requires_grad_(False)  # frozen base, as in prefix tuning
        # one (key, value) pair per layer, (1, heads, n_prefix, head_dim), trainable
        self.prefix = nn.Parameter(torch.randn(3, 2, 1, 4, n_prefix, 8) * 0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b = ids.shape[0]
        kv = self.prefix.expand(-1, -1, b, -1, -1, -1)
        cache = tf.DynamicCache([(kv[i, 0], kv[i, 1]) for i in range(kv.shape[0])])
        mask = torch.ones(b, self.prefix.shape[4] + ids.shape[1], dtype=torch.long)
        return self.lm(input_ids=ids, attention_mask=mask, past_key_values=cache, labels=ids, use_cache=False).loss


def train(model: nn.Module, ctx=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (2, 12), generator=g)
    torch.manual_seed(1)  # GPT-2's dropout draws
    if ctx is None:
        model(ids).backward()
    else:
        with ctx:
            model(ids).backward()
    return model.prefix.grad


torch.manual_seed(0)
m = PrefixGPT2()
plain = train(copy.deepcopy(m))
print("plain: prefix grad abs sum", plain.abs().sum().item(), "(the loss reads the cache)")
m2 = copy.deepcopy(m)
got = train(m2, offrecomp.runtime(m2, mode="recompute", min_bytes=0))
print("recompute: bitwise equal:", torch.equal(plain, got))
