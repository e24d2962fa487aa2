"""NOTE [Hooks a replay registers] fixed a block that registers a gradient hook on first
use (guarded by an attribute): its replays registered it again.  The same pattern aimed at
a module of the model outside the region (a sibling block's weight, e.g. a block that
scales the next block's gradient; or the root's head) still piles up: the replay sees the
guard at its entry value, registers the hook again, and only the region's own modules are
cleaned.  The sibling's gradient passes through the hook twice: silently wrong
gradients from step 1 on."""
import sys, copy
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(1)
import offrecomp

class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.hooked = False
        self.peer = []          # a list, so the peer is not a child
    def forward(self, x):
        if not self.hooked:
            self.hooked = True
            if self.peer:
                self.peer[0].fc1.weight.register_hook(lambda g: g * 0.5)
        return x + torch.tanh(self.fc2(F.gelu(self.fc1(x))))

torch.manual_seed(0)
model = nn.Sequential(Block(), Block())
model[0].peer.append(model[1])
ref = copy.deepcopy(model)
ref[0].peer[0] = ref[1]
def loop(m, ctx):
    grads = []
    with ctx:
        for step in range(2):
            x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
            m(x).square().mean().backward()
            grads.append(m[1].fc1.weight.grad.clone()); m.zero_grad()
    return grads
import contextlib
r = loop(ref, contextlib.nullcontext())
g = loop(model, offrecomp.runtime(model, mode="recompute", min_bytes=0))
bad = [i for i in range(2) if not torch.equal(r[i], g[i])]
print("steps whose block 1 fc1.weight grad differs:", bad)
print("hooks on block 1 fc1.weight: runtime", len(model[1].fc1.weight._backward_hooks), "plain", len(ref[1].fc1.weight._backward_hooks))
sys.exit(1 if bad else 0)
