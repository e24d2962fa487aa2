"""A region called with the same tensor for two arguments, block(x, x).
(a) the block branches on identity (`q is kv`, as nn.MultiheadAttention and many
    self-/cross-attention blocks do): the replay gets two distinct leaves, takes the other
    branch -> silent wrong gradients when both branches save alike;
(b) the block writes one argument in place and reads the other (h.mul_(s); ... + skip):
    plain autograd sees the write through the alias, the replay does not -> silent wrong
    gradients.  Exit 1 when wrong."""
import os, sys, copy, contextlib; sys.path.insert(0, os.environ.get("OFFRECOMP_TREE", "."))
import torch, torch.nn as nn
import offrecomp

class IsBlock(nn.Module):
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(16, 16)
    def forward(s, q, kv):
        scale = 1.0 if q is kv else 0.5      # self-attention vs cross-attention path
        return torch.tanh(s.fc(kv) * scale) + q

class InplaceBlock(nn.Module):
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(16, 16)
    def forward(s, h, skip):
        h.mul_(2.0)                           # in-place on an intermediate: legal in autograd
        return torch.tanh(s.fc(skip))         # skip is h: plain reads the doubled values

class Net(nn.Module):
    def __init__(s, blk):
        super().__init__(); s.inp = nn.Linear(16, 16); s.blocks = nn.ModuleList([blk() for _ in range(2)])
    def forward(s, x):
        x = s.inp(x)
        for b in s.blocks:
            x = x * 1.0
            x = b(x, x)
        return x.pow(2).sum()

def run(model, ctx):
    with ctx:
        model(torch.randn(2, 16, generator=torch.Generator().manual_seed(0))).backward()
    return [p.grad.clone() for p in model.parameters()]

bad = False
for blk in [IsBlock, InplaceBlock]:
    torch.manual_seed(0); base = Net(blk)
    ref = run(copy.deepcopy(base), contextlib.nullcontext())
    for mode in ["keep", "offload", "recompute", "auto"]:
        m = copy.deepcopy(base)
        got = run(m, offrecomp.runtime(m, mode=mode, min_bytes=0))
        ok = all(torch.equal(a, b) for a, b in zip(ref, got))
        print(blk.__name__, mode, "ok" if ok else "WRONG GRADIENTS (max diff %.3g)" % max((a - b).abs().max().item() for a, b in zip(ref, got)))
        bad |= not ok
sys.exit(1 if bad else 0)
