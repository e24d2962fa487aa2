"""A block that also computes a side value it stores on itself (self.aux_loss, as MoE layers
do) that this step's loss does not use: its graph is dead.  Booked peak of recompute vs keep,
and real memory held after backward (tensors alive)."""
import sys, gc, torch, torch.nn as nn, torch.nn.functional as F
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import offrecomp

D = 64
class Blk(nn.Module):
    def __init__(self, dead):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.dead = dead
    def forward(self, x):
        h = self.ln(x)
        if self.dead:
            self.aux_loss = torch.logsumexp(h, -1).square().mean()  # saves h; unused by the loss
        return x + self.fc2(F.gelu(self.fc1(h)))

class M(nn.Module):
    def __init__(self, dead):
        super().__init__()
        self.blocks = nn.ModuleList(Blk(dead) for _ in range(4))
    def forward(self, x):
        for b in self.blocks: x = b(x)
        return x.square().mean()

for dead in (False, True):
    for mode in ("keep", "recompute"):
        torch.manual_seed(0); m = M(dead); x = torch.randn(256, D)
        with offrecomp.runtime(m, mode=mode, min_bytes=0) as rt:
            for _ in range(2):
                m(x).backward()
        s = rt.report().steps[-1]
        print(f"dead aux branch={dead!s:5s} {mode:9s} peak_activation_bytes={s.peak_activation_bytes:7d} recomputed={s.recomputed_bytes}")
