"""A block writes a saved activation through .data after sin() saved it (documented
known limit, docs/design.md 'Writes offrecomp does not see'): plain autograd's backward
reads the clamped values; recompute/auto replay the block and stop early after the last
save, so the replayed save holds the unclamped values -> different gradients, silently."""
import copy, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from torch import nn
import offrecomp

torch.set_num_threads(1)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
    def forward(self, x):
        h = self.fc(x)
        y = torch.sin(h)        # saves h
        h.data.clamp_(-0.5, 0.5)  # no version bump: plain backward reads the clamped h
        return x + y + h

def grads(m, ctx=None):
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    if ctx is None:
        m(x).square().sum().backward()
    else:
        with ctx:
            m(x).square().sum().backward()
    return [p.grad.clone() for p in m.parameters()]

torch.manual_seed(0)
model = nn.Sequential(*[Block() for _ in range(3)])
ref = grads(copy.deepcopy(model))
ref2 = grads(copy.deepcopy(model))
print("plain deterministic:", all(torch.equal(a, b) for a, b in zip(ref, ref2)))
for mode in ("keep", "offload", "recompute"):
    m = copy.deepcopy(model)
    got = grads(m, offrecomp.runtime(m, mode=mode, min_bytes=0))
    d = max((a - b).abs().max().item() for a, b in zip(ref, got))
    print(f"{mode:9s} bitwise={all(torch.equal(a, b) for a, b in zip(ref, got))} max|diff|={d:.3g}")
