"""HF Trainer with a DeepSpeed ZeRO-3 config and OffrecompCallback, 2 CPU ranks."""
import os, sys
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch, torch._dynamo, torch._dynamo.polyfills.tensor  # noqa
import deepspeed, transformers
import transformers.models.llama.modeling_llama  # noqa
from transformers import Trainer, TrainingArguments
mode = sys.argv[1]; FSDPV = int(sys.argv[2])
ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}}}
args = TrainingArguments(output_dir="/tmp/probe_ds/run/out_tr", per_device_train_batch_size=2, max_steps=4, fsdp="full_shard auto_wrap", fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "version": FSDPV}, report_to=[], logging_steps=1, use_cpu=True, save_strategy="no", seed=0, data_seed=0)
cfg = transformers.LlamaConfig(num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg)
class DS(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 128, (32,), generator=g)
        return {"input_ids": ids, "labels": ids}
cbs = []
if mode != "plain":
    from offrecomp.integrations.transformers import OffrecompCallback
    cbs.append(OffrecompCallback(mode=mode))
tr = Trainer(model=model, args=args, train_dataset=DS(), callbacks=cbs)
tr.train()
losses = [h["loss"] for h in tr.state.log_history if "loss" in h]
print("LOSSES", losses)
if cbs: print("REPLAYS", [s.replays for s in cbs[0].report().steps])
