"""c2e0c0f: a replay that removes a hook registered before it (handles kept in a list the
forward empties in place) lets its own hooks stand.  A block CALLED TWICE per step (a
shared / weight-tied block, a recurrent cell) with that pattern and a hook depending on the
call's input: plain ends the forward with call 2's hook on the weight, which the
backward uses.  Under recompute, call 2 replays first (removes call 2's hook, registers its
own), then call 1 replays (removes that, registers call 1's hook), and AccumulateGrad runs
after both: the weight's gradient goes through call 1's hook.  Silently wrong gradients."""
import sys, copy
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(1)
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
        s = float(x.detach().abs().mean())
        self._hooks.append(self.fc1.weight.register_hook(lambda g: g / (1.0 + s)))
        return x + self.fc2(F.gelu(self.fc1(x)))

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
    def forward(self, x):
        for b in self.blocks:
            x = b(b(x))          # each block applied twice
        return x.square().mean()

def run(m):
    out = []
    for s in range(2):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(s))
        m(x).backward()
        out.append([p.grad.clone() for p in m.parameters()]); m.zero_grad()
    return out
torch.manual_seed(0)
base = Model()
ref = run(copy.deepcopy(base))
m = copy.deepcopy(base)
with offrecomp.runtime(m, mode="recompute", min_bytes=0):
    got = run(m)
bad = [(s, n) for s in range(2) for (n, _), a, b in zip(m.named_parameters(), ref[s], got[s]) if not torch.equal(a, b)]
print("grads differing from plain (step, name):", bad)
print("hooks on fc1.weight:", [len(b.fc1.weight._backward_hooks or {}) for b in m.blocks])
sys.exit(1 if bad else 0)
