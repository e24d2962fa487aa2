"""nn.MultiheadAttention layers held in a ModuleList (so they are the regions) and called
for self-attention, attn(x, x, x). MHA picks its packed in-projection when query is key is
value; offrecomp's replay passes each argument as its own fresh leaf (arguments.py
replay_arguments), so the identity is lost, the replay takes the separate-projection path
and backward crashes with "not a deterministic function of its inputs".
Exit 1 when wrong."""
import os, sys, copy, contextlib; sys.path.insert(0, os.environ.get("OFFRECOMP_TREE", "."))
import torch, torch.nn as nn
import offrecomp

class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.attn = nn.ModuleList([nn.MultiheadAttention(16, 2, batch_first=True) for _ in range(2)])
    def forward(s, x):
        for a in s.attn:
            x = x + a(x, x, x, need_weights=False)[0]
        return x.pow(2).sum()

def run(model, ctx):
    with ctx:
        for step in range(4):
            model(torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(step))).backward()
    return [p.grad.clone() for p in model.parameters()]

torch.manual_seed(0); base = Net()
ref = run(copy.deepcopy(base), contextlib.nullcontext())
bad = False
for mode in ["keep", "offload", "recompute", "auto"]:
    m = copy.deepcopy(base)
    try:
        got = run(m, offrecomp.runtime(m, mode=mode))
        ok = all(torch.equal(a, b) for a, b in zip(ref, got)); msg = "ok" if ok else "WRONG GRADIENTS"
    except Exception as e:
        ok = False; msg = f"{type(e).__name__}: {str(e)[:300]}"
    print(mode, msg); bad |= not ok
sys.exit(1 if bad else 0)
