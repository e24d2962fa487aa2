"""Books against the planner's simulator where the root (code outside the regions) saves
a storage a region call also saved: each block keeps a tensor on itself (`self.gate`)
that its own op saves, and the loss multiplies by the blocks' gates (the root saves them
again).  Under a plan that keeps everything, with native keep on and off, prints each
step's booked peak (`peak_activation_bytes`) and the simulator's prediction
(`predicted_peak_bytes`).  Exit 1 when they differ."""
import sys, copy; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import offrecomp

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(256, 256)
    def forward(s, x):
        s.gate = torch.sigmoid(s.fc(x))       # saved by the mul below, and kept on the block
        return x * s.gate

class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.ModuleList([Block() for _ in range(4)])
    def forward(s, x):
        for b in s.blocks: x = b(x)
        loss = x.square().sum()
        for b in s.blocks: loss = loss + (x * b.gate).sum()   # the root saves each gate again
        return loss

bad = False
for native in (True, False):
    torch.manual_seed(0); m = Net()
    rt = offrecomp.runtime(m, mode="auto", min_bytes=0, native_keep=native, budget=sys.argv[1] if len(sys.argv) > 1 else "60%")
    with rt:
        for step in range(4):
            m.zero_grad(set_to_none=True)
            m(torch.randn(64, 256, generator=torch.Generator().manual_seed(step))).backward()
    for s in rt.report().steps:
        if s.predicted_peak_bytes is None: continue
        d = s.peak_activation_bytes - s.predicted_peak_bytes
        print(f"native_keep={native!s:5s} step {s.step} {s.phase:10s} booked {s.peak_activation_bytes:>9,} predicted {s.predicted_peak_bytes:>9,} diff {d:+,}")
        bad |= d != 0
sys.exit(1 if bad else 0)
