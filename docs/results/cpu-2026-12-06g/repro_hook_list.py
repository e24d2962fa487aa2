"""A forward that swaps its gradient hook each call, keeping the handles in a list
attribute it empties in place (a common pattern: `for h in self._hooks: h.remove()`).
Plain: one hook per step. Under recompute the replay removes the forward's hook (the
list is the same object), registers its own, and _hooks_as_found deletes that one:
the backward runs with no hook at all."""
import sys, os, copy
ROOT = os.environ.get("ROOT", str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
sys.path.insert(0, ROOT)
import torch
import torch.nn.functional as F
from torch import nn
import offrecomp

class Block(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)
        self._hooks = []

    def forward(self, x):
        for hd in self._hooks:
            hd.remove()
        self._hooks.clear()
        self._hooks.append(self.fc1.weight.register_hook(lambda g: g * 0.5))
        return x + self.fc2(F.gelu(self.fc1(x)))

def run(m, rt):
    grads = []
    for s in range(3):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(s))
        m(x).square().mean().backward()
        grads.append([p.grad.clone() for p in m.parameters()])
        m.zero_grad()
    return grads

torch.manual_seed(0)
base = nn.Sequential(*[Block() for _ in range(3)])
ref = run(copy.deepcopy(base), None)
m = copy.deepcopy(base)
with offrecomp.runtime(m, mode="recompute", min_bytes=0, regions=Block):
    got = run(m, True)
diff = max((a - b).abs().max().item() for ra, rb in zip(ref, got) for a, b in zip(ra, rb))
print(ROOT, "max grad diff vs plain:", diff, "hooks on fc1.weight:", [len(b.fc1.weight._backward_hooks or {}) for b in m])
sys.exit(1 if diff != 0 else 0)
