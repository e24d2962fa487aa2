"""Inference-mode tensors reaching a region (an argument, a buffer, a plain tensor
attribute), used only in ops that do not save them: plain autograd trains, but under
mode="recompute" / "auto" offrecomp reads their version counter and the forward raises
torch's 'Inference tensors do not track version counter.' (keep and offload train)."""
import os, sys, copy, traceback
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch
from torch import nn
import offrecomp

class Block(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.kind = kind
        if kind == "buffer":
            self.register_buffer("cache", None)
        else:
            self.cache = None
    def forward(self, x, extra):
        if self.kind == "argument":
            return torch.tanh(self.fc(x)) + extra            # `extra` is only added: never saved
        if self.cache is None:                               # built at first use, like a rotary/bias cache
            self.cache = torch.arange(8, dtype=x.dtype) * 0.01
        return torch.tanh(self.fc(x)) + self.cache

class Model(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.blocks = nn.ModuleList(Block(kind) for _ in range(3))
    def forward(self, x, extra):
        for b in self.blocks:
            x = b(x, extra)
        return x

def run(model, rt):
    grads = []
    ctx = rt if rt is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    with ctx:
        with torch.inference_mode():                       # an evaluation first: caches built here
            model(torch.randn(2, 8), torch.zeros(8))
        for b in model.blocks:
            assert b.kind == "argument" or b.cache.is_inference()
        for step in range(3):
            with torch.inference_mode(model.blocks[0].kind == "argument"):
                extra = torch.full((8,), 0.1 * step)       # an inference tensor (the argument case)
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
            model(x, extra).sum().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            model.zero_grad()
    return grads

bad = False
for kind in ["argument", "buffer", "attribute"]:
    torch.manual_seed(0)
    base = Model(kind)
    ref = run(copy.deepcopy(base), None)
    print(f"[{kind}] plain run: OK")
    for mode in ["keep", "offload", "recompute", "auto"]:
        m = copy.deepcopy(base)
        try:
            got = run(m, offrecomp.runtime(m, mode=mode, min_bytes=0))
            same = all(torch.equal(a, b) for ga, gb in zip(ref, got) for a, b in zip(ga, gb))
            print(f"[{kind}] {mode}: {'OK' if same else 'GRADIENTS DIFFER'}")
            bad |= not same
        except Exception as e:
            bad = True
            tb = traceback.extract_tb(e.__traceback__)
            where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(tb[-3:]))
            print(f"[{kind}] {mode}: raised {type(e).__name__}: {e}  (at {where})")
sys.exit(1 if bad else 0)
