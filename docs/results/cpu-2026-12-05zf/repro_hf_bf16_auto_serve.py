"""Regression (hf_auto_sweep --bf16, auto_serve): ReplayDivergedError "the recorded forward
ran aten._to_copy.default, the replay ran aten.view.default" for BERT-like blocks under
CPU bf16 autocast, auto mode with a tight budget and replay_op_us=0.
Pure torch + offrecomp. Exit 1 while it fails.
Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zf/repro_hf_bf16_auto_serve.py"""
import copy, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from torch import nn
import offrecomp

H = 32

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(H, H) for _ in range(4))
        self.ln1 = nn.LayerNorm(H)
        self.f1, self.f2 = nn.Linear(H, 64), nn.Linear(64, H)
        self.ln2 = nn.LayerNorm(H)

    def forward(self, x):
        B, T, _ = x.shape
        sh = lambda t: t.view(B, T, 4, H // 4).transpose(1, 2)
        a = nn.functional.scaled_dot_product_attention(sh(self.q(x)), sh(self.k(x)), sh(self.v(x)))
        x = self.ln1(x + self.o(a.transpose(1, 2).reshape(B, T, H)))
        return self.ln2(x + self.f2(nn.functional.gelu(self.f1(x))))

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, H)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(H, 100)

    def forward(self, ids):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return self.head(x).float().square().mean()

def batch(s):
    return torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1000 + s))

def train(m, ctx=None, steps=4):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = []
    import contextlib
    with ctx if ctx is not None else contextlib.nullcontext():
        for s in range(steps):
            torch.manual_seed(10 * s)
            loss = m(batch(10 * s))
            loss.backward()
            out.append([p.grad.clone() for p in m.parameters()])
            opt.step(); opt.zero_grad(set_to_none=True)
    return out

torch.manual_seed(0)
model = Model()
ref = train(copy.deepcopy(model))
probe = copy.deepcopy(model)
keep = offrecomp.runtime(probe, mode="keep", min_bytes=0)
train(probe, keep, steps=1)
budget = keep.report().steps[0].peak_activation_bytes // 2
m = copy.deepcopy(model)
rt = offrecomp.runtime(m, mode="auto", min_bytes=0, budget=budget, replay_op_us=0)
try:
    got = train(m, rt)
except Exception as e:
    print("FAIL:", type(e).__name__, str(e)[:300])
    sys.exit(1)
ok = all(torch.equal(a, b) for ra, rb in zip(ref, got) for a, b in zip(ra, rb))
print("phases", [s.phase for s in rt.report().steps], "bitwise", ok)
sys.exit(0 if ok else 1)
