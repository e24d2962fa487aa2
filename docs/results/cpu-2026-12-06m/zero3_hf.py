"""HF GPT-2 and Llama (tiny configs) under DeepSpeed ZeRO-3 on 2 CPU ranks: losses plain vs offrecomp."""
import os, sys, weakref
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch, torch._dynamo, deepspeed, transformers
import torch._dynamo.polyfills.tensor  # noqa: before zero.Init patches Tensor.__new__
import transformers.models.gpt2.modeling_gpt2, transformers.models.llama.modeling_llama
deepspeed.init_distributed(dist_backend="gloo")
arch, mode = sys.argv[1], sys.argv[2]
if arch == "gpt2":
    cfg = transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.1)
    make = lambda: transformers.GPT2LMHeadModel(cfg)
else:
    cfg = transformers.LlamaConfig(num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    make = lambda: transformers.LlamaForCausalLM(cfg)
ds = {"train_batch_size": int(os.environ["WORLD_SIZE"]), "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
      "stage3_prefetch_bucket_size": 0, "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
torch.manual_seed(0)
with deepspeed.zero.Init(config_dict_or_path=ds):
    model = make()
model.config.use_cache = False
eng, *_ = deepspeed.initialize(model=model, config=ds)
import offrecomp
ctx = offrecomp.runtime(eng.module, mode=mode) if mode != "plain" else None
if ctx: ctx.__enter__()
rank = int(os.environ["RANK"])
for step in range(4):
    idx = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(step * 10 + rank))
    loss = eng(input_ids=idx, labels=idx).loss
    eng.backward(loss); eng.step()
    print(f"step {step} loss {loss.item()!r}", flush=True)
if ctx:
    ctx.__exit__(None, None, None)
    if rank == 0: print(ctx.regions[:2], [s.replays for s in ctx.report().steps])
