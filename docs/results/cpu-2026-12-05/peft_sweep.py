"""PEFT adapters on Hugging Face models under every zoo variant, gradients compared
bitwise with plain training (tests/helpers.check_variant).

    PYTHONPATH=DIR python docs/results/cpu-2026-12-05/peft_sweep.py [NAME,NAME ...] [VARIANT,VARIANT ...]

DIR holds peft 0.21.0 (``pip install --no-deps --target DIR peft==0.21.0``). Llama and GPT-2
(3 layers of width 32) with LoRA (with dropout, on every linear layer, DoRA, rsLoRA on the
MLP), IA3, LoHa and prefix tuning, 4 steps each on the CPU. ``llama_gc_lora`` turns on the
model's own gradient checkpointing, which owns its layers' activations (offrecomp says so
once): its ``recompute`` and tight ``auto`` runs find nothing to drop, by design.
"""

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import peft
import torch
import transformers as tf

from hf_zoo_sweep import LM  # a causal LM's loss
from sweep import run

logging.getLogger("transformers").setLevel(logging.ERROR)
V = 100
small = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, vocab_size=V, max_position_embeddings=64)


def ids(s): return torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1000 + s))

def llama(): return tf.LlamaForCausalLM(tf.LlamaConfig(**small, num_key_value_heads=2))
def gpt2(): return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=3, n_head=4, vocab_size=V, n_positions=64))

def lora(base, **kw):
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=kw.pop("targets", ["q_proj", "v_proj"]), lora_dropout=kw.pop("dropout", 0.0), **kw)
    return peft.get_peft_model(base, cfg)

Z = {
 "llama_lora": lambda: LM(lora(llama())),
 "llama_lora_drop": lambda: LM(lora(llama(), dropout=0.1)),
 "llama_lora_all": lambda: LM(lora(llama(), targets="all-linear")),
 "llama_dora": lambda: LM(lora(llama(), use_dora=True)),
 "llama_rslora_mlp": lambda: LM(lora(llama(), targets=["gate_proj", "up_proj", "down_proj"], use_rslora=True)),
 "gpt2_lora": lambda: LM(lora(gpt2(), targets=["c_attn"], fan_in_fan_out=True)),
 "llama_ia3": lambda: LM(peft.get_peft_model(llama(), peft.IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]))),
 "llama_loha": lambda: LM(peft.get_peft_model(llama(), peft.LoHaConfig(r=4, target_modules=["q_proj", "v_proj"]))),
 "llama_prefix": lambda: LM(peft.get_peft_model(llama(), peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))),
 "llama_gc_lora": lambda: LM(_gc(lora(llama()))),
}

def _gc(m):
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return m

def main() -> int:
    return run(Z, lambda name, model: ids)


if __name__ == "__main__":
    raise SystemExit(main())
