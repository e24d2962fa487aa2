"""A block registers a forward hook on a submodule on first use (guarded by an attribute),
as NOTE [Hooks a replay registers] describes.  During the replay of the registering call
both the hook the forward left and the one the replay registers again are active, so the
submodule's output is scaled twice inside the replay: silently wrong gradients under
recompute/auto (the hook is dropped only after the replay)."""
import sys, copy, os
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(1)
import offrecomp

class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.hooked = False
    def forward(self, x):
        if not self.hooked:
            self.fc2.register_forward_hook(lambda m, a, out: out * 1.5)
            self.hooked = True
        return x + torch.tanh(self.fc2(F.gelu(self.fc1(x))))

torch.manual_seed(0)
model = nn.Sequential(Block(), Block())
x = torch.randn(4, 16)
ref = copy.deepcopy(model)
ref(x).square().mean().backward()
with offrecomp.runtime(model, mode="recompute", min_bytes=0):
    model(x).square().mean().backward()
bad = [n for (n, p), q in zip(model.named_parameters(), ref.parameters()) if not torch.equal(p.grad, q.grad)]
print("grads differing from plain:", bad)
print("fc2 forward hooks after:", [len(b.fc2._forward_hooks) for b in model], "plain:", [len(b.fc2._forward_hooks) for b in ref])
sys.exit(1 if bad else 0)
