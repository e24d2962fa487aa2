"""DeepSpeed ZeRO-3 on the CPU (gloo, WORLD_SIZE ranks started by hand) under offrecomp:
losses against plain, and the gathered parameter storages still alive when the forward
returns. Run each rank as RANK=r LOCAL_RANK=r WORLD_SIZE=2 python zero3_mem.py MODE."""
import os, sys, weakref
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29534")
os.environ.setdefault("RANK", "0"); os.environ.setdefault("WORLD_SIZE", "1"); os.environ.setdefault("LOCAL_RANK", "0")
import torch, deepspeed
from torch import nn
deepspeed.init_distributed(dist_backend="gloo")
class Block(nn.Module):
    def __init__(s, d):
        super().__init__(); s.a = nn.Linear(d, 4*d); s.b = nn.Linear(4*d, d); s.n = nn.LayerNorm(d)
        s.scale = nn.Parameter(torch.full((d,), 0.5))  # the block's own parameter
    def forward(s, x): return x + s.scale * s.b(torch.nn.functional.gelu(s.a(s.n(x))))
class M(nn.Module):
    def __init__(s, d=256, L=6):
        super().__init__(); s.blocks = nn.ModuleList(Block(d) for _ in range(L)); s.head = nn.Linear(d, 1)
    def forward(s, x):
        for b in s.blocks: x = b(x)
        return s.head(x).sum()
cfg = {"train_batch_size": int(os.environ["WORLD_SIZE"]), "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
       "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 0}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
torch.manual_seed(0)
with deepspeed.zero.Init(config_dict_or_path=cfg):
    model = M()
eng, *_ = deepspeed.initialize(model=model, config=cfg)
seen = []
def note(mod, args):
    for p in mod.parameters(recurse=False):
        if p.numel():
            seen.append(weakref.ref(p.untyped_storage()))
for m in eng.module.modules():
    m.register_forward_pre_hook(note)
mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
x = torch.randn(4, 256, 256)
import offrecomp
ctx = offrecomp.runtime(eng.module, mode=mode, budget="1MiB" if mode == "auto" else None) if mode != "plain" else None
if ctx: ctx.__enter__()
for step in range(4):
    seen.clear()
    loss = eng(x)
    alive = [r() for r in seen if r() is not None]
    print(f"step {step} loss {loss.item()!r} gathered storages alive after forward {len(alive)}/{len(seen)} "
          f"({sum(s.nbytes() for s in alive) / 2**20:.2f} MiB)", flush=True)
    eng.backward(loss); eng.step()
if ctx:
    ctx.__exit__(None, None, None)
