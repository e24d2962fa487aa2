"""A jagged nested tensor through a LayerNorm block under mode="recompute": the replay's
pack hook reads data_ptr() of the NJT's (invalid) python storage and crashes the backward.
Exits 1 while the defect is present."""
import os, sys, copy
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch
from torch import nn
import offrecomp

class Blk(nn.Module):
    def __init__(s, d=16):
        super().__init__(); s.ln = nn.LayerNorm(d); s.fc = nn.Linear(d, d)
    def forward(s, x):
        return x + torch.tanh(s.fc(s.ln(x)))

class Stack(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.ModuleList([Blk() for _ in range(3)])
    def forward(s, x):
        for b in s.blocks: x = b(x)
        return x

def batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.nested.nested_tensor([torch.randn(n, 16, generator=g) for n in (3, 7, 5)], layout=torch.jagged)

def train(m, rt_kw=None, steps=3):
    grads = []
    ctx = offrecomp.runtime(m, **rt_kw) if rt_kw else None
    if ctx: ctx.__enter__()
    try:
        for i in range(steps):
            m(batch(i)).values().pow(2).sum().backward()
            grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
            for p in m.parameters(): p.grad = None
    finally:
        if ctx: ctx.__exit__(None, None, None)
    return grads

torch.manual_seed(0)
base = Stack()
ref = train(copy.deepcopy(base))
try:
    got = train(copy.deepcopy(base), dict(mode="recompute", min_bytes=0))
except RuntimeError as e:
    print("DEFECT: recompute crashed:", type(e).__name__, e)
    import traceback; traceback.print_exc(limit=-3)
    sys.exit(1)
ok = all(torch.equal(r[n], g[n]) for r, g in zip(ref, got) for n in r)
print("bitwise" if ok else "DEFECT: gradients differ")
sys.exit(0 if ok else 1)
