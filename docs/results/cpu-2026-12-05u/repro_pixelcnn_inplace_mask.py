"""PixelCNN masked conv masking its weight in place every forward: under mode='recompute'
the blocks are replayed at step 0 only, then kept for good (no memory saved); the same
model masking functionally (F.conv2d(x, w * mask)) recomputes every step. Gradients are
bitwise in both. Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05u/repro_pixelcnn_inplace_mask.py"""
import copy, logging, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch, torch.nn.functional as F
from torch import nn
import offrecomp
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

class MaskedConv(nn.Conv2d):
    def __init__(self, c, how):
        super().__init__(c, c, 3, padding=1)
        m = torch.ones_like(self.weight); m[:, :, 1, 2:] = 0; m[:, :, 2:] = 0
        self.register_buffer("mask", m); self.how = how
    def forward(self, x):
        if self.how == "data":
            self.weight.data *= self.mask              # the common PixelCNN idiom
        elif self.how == "nograd":
            with torch.no_grad(): self.weight.mul_(self.mask)
        else:
            return F.conv2d(x, self.weight * self.mask, self.bias, padding=1)
        return super().forward(x)

class Block(nn.Module):
    def __init__(self, c, how):
        super().__init__(); self.m = MaskedConv(c, how); self.p = nn.Conv2d(c, c, 1)
    def forward(self, x): return x + self.p(F.relu(self.m(F.relu(x))))

class Net(nn.Module):
    def __init__(self, how):
        super().__init__(); self.blocks = nn.ModuleList([Block(6, how) for _ in range(3)])
    def forward(self, x):
        for b in self.blocks: x = b(x)
        return x.pow(2).mean()

def run(m, rt=None):
    opt = torch.optim.SGD(m.parameters(), lr=0.1); out = []
    with rt if rt is not None else torch.enable_grad():
        for s in range(4):
            m(torch.randn(3, 6, 8, 8, generator=torch.Generator().manual_seed(s))).backward()
            out.append([p.grad.clone() for p in m.parameters()]); opt.step(); opt.zero_grad()
    return out

for how in ("data", "nograd", "functional"):
    torch.manual_seed(0); m = Net(how)
    ref = run(copy.deepcopy(m))
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
    got = run(m, rt)
    same = all(torch.equal(a, b) for x, y in zip(ref, got) for a, b in zip(x, y))
    print(f"{how:10s} bitwise={same} replays/step={[r.replays for r in rt.report().steps]} "
          f"peak/step={[r.peak_activation_bytes for r in rt.report().steps]}")
