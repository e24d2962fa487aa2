"""A modifying forward hook on a Linear inside a region, present during the forward and
removed (handle.remove()) before backward, or added after the forward: the replay runs
without / with it, so the recomputed activations differ from the forward's and the
gradients are silently wrong under recompute and auto (also under
torch.utils.checkpoint(use_reentrant=False)). No warning under recompute."""
import contextlib, logging, torch, offrecomp
import torch.utils.checkpoint as cp
from torch import nn
logging.basicConfig(level=logging.WARNING)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)
    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))

class Model(nn.Module):
    def __init__(self, ckpt=False):
        super().__init__()
        self.blocks, self.ckpt = nn.ModuleList([Block() for _ in range(2)]), ckpt
    def forward(self, x):
        for b in self.blocks:
            x = cp.checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        return x.square().mean()

def run(kind, mode=None):
    torch.manual_seed(0)
    m = Model(ckpt=(mode == "ckpt"))
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0) if mode not in (None, "ckpt") else contextlib.nullcontext()
    with rt:
        hs = [b.fc1.register_forward_hook(lambda mod, a, o: o * 1.3) for b in m.blocks] if kind == "removed" else []
        loss = m(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)))
        for h in hs:
            h.remove()                      # e.g. a perturbation/steering hook scoped to the forward
        if kind == "added":
            hs = [b.fc1.register_forward_hook(lambda mod, a, o: o * 1.3) for b in m.blocks]
        loss.backward()
        for h in hs:
            h.remove()
    return m.blocks[0].fc1.weight.grad

for kind in ("removed", "added"):
    ref = run(kind)
    for mode in ("keep", "recompute", "auto", "ckpt"):
        g = run(kind, mode)
        print(f"hook {kind} between fwd/bwd, {mode:9s}:", "equal" if torch.equal(ref, g) else f"DIFF {(ref - g).abs().max():.3g}")
