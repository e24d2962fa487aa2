"""A tensor attribute the loop binds on a block before each call (conditioning context,
`block.ctx = c`), with two micro-batch forwards before their backwards (grad accumulation).
Plain autograd uses each forward's ctx; offrecomp's replay reads whatever ctx is bound at
backward time -> silent wrong gradients under recompute/auto. Exit 1 when wrong."""
import sys, copy, os
import torch, torch.nn as nn
import offrecomp

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(16, 16); s.ctx = None
    def forward(s, x):
        return x + torch.tanh(s.fc(x) * s.ctx)

class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.ModuleList([Block() for _ in range(2)])
    def forward(s, x, c):
        for b in s.blocks:
            b.ctx = c          # bind the conditioning for this call
            x = b(x)
        return x.pow(2).sum()

def run(model, ctx):
    with ctx:
        losses = [model(torch.randn(2, 16, generator=torch.Generator().manual_seed(i)),
                        torch.randn(2, 16, generator=torch.Generator().manual_seed(10 + i))) for i in range(2)]
        for l in losses: l.backward()
    return [p.grad.clone() for p in model.parameters()]

torch.manual_seed(0); base = Net()
import contextlib
ref = run(copy.deepcopy(base), contextlib.nullcontext())
bad = False
for mode in ["keep", "offload", "recompute", "auto"]:
    m = copy.deepcopy(base)
    got = run(m, offrecomp.runtime(m, mode=mode, min_bytes=0))
    ok = all(torch.equal(a, b) for a, b in zip(ref, got))
    print(mode, "ok" if ok else "WRONG GRADIENTS (max diff %.3g)" % max((a - b).abs().max().item() for a, b in zip(ref, got)))
    bad |= not ok
sys.exit(1 if bad else 0)
