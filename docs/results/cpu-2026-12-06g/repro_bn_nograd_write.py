"""NOTE [Buffers written unseen]: BatchNorm statistics over 64 KiB read by an eval forward
and written (CPU kernel, no version bump) by a later train-mode forward before the eval
forward's backward.  The fix of 2026-12-06 covers a writing forward that is itself a
region call with grad (its entry copy is handed to the reader); a train-mode forward
under torch.no_grad() (pseudo-labels / a BN recalibration pass of the same model) is no
region call, so the eval call's replay reads the NEW statistics: silently wrong
gradients (plain autograd keeps what the eval forward saved).  20,000 features = 80 KB."""
import sys, copy
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
torch.set_num_threads(1)
import offrecomp
C = 20000
class Block(nn.Module):
    def __init__(self):
        super().__init__(); self.w = nn.Parameter(1 + 0.1 * torch.randn(C)); self.bn = nn.BatchNorm1d(C)
    def forward(self, x):
        return x + torch.tanh(self.bn(x * self.w))
def step(m, x):
    m.eval(); loss = m(x * 0.5).square().mean()
    m.train()
    with torch.no_grad():
        m(x)                      # updates running stats in place, no version bump
    loss.backward()
torch.manual_seed(0)
model = nn.Sequential(Block(), Block())
ref = copy.deepcopy(model)
x = torch.randn(8, C)
for _ in range(2): step(ref, x)
with offrecomp.runtime(model, mode="recompute", min_bytes=0):
    for _ in range(2): step(model, x)
bad = [n for (n, p), q in zip(model.named_parameters(), ref.parameters()) if not torch.equal(p.grad, q.grad)]
print("grads differing from plain under recompute:", bad)
sys.exit(1 if bad else 0)
