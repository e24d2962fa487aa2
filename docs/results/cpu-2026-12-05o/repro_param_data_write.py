"""offrecomp: a region whose forward writes its own parameter through `.data` (no_grad),
as efficient-kan's KANLinear.update_grid does (self.spline_weight.data.copy_(...)).
Plain PyTorch and mode="keep" agree; mode="recompute" diverges from step 1 on, silently.
The same write without `.data` (`self.w.copy_(...)` under no_grad) is caught by the
first-call watch (NOTE [State written by its region]) and the variant passes."""
import sys
from pathlib import Path
import copy
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from torch import nn
import offrecomp


class Block(nn.Module):
    def __init__(self, via_data: bool):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 3)
        self.via_data = via_data

    def forward(self, x):
        with torch.no_grad():  # "adapt" the weight to the batch, then use it
            new = self.w * 0.9 + 0.01 * x.mean(0, keepdim=True).T
            (self.w.data if self.via_data else self.w).copy_(new)
        return torch.tanh(x @ self.w) + x


class Net(nn.Module):
    def __init__(self, via_data):
        super().__init__()
        self.blocks = nn.ModuleList(Block(via_data) for _ in range(2))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.pow(2).mean()


def train(m, mode=None, steps=3):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = []
    ctx = offrecomp.runtime(m, mode=mode, min_bytes=0) if mode else None
    with ctx if ctx else torch.no_grad.__new__(torch.enable_grad):
        for s in range(steps):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(s))
            m(x).backward()
            out.append([p.grad.clone() for p in m.parameters()] + [p.detach().clone() for p in m.parameters()])
            opt.step(); opt.zero_grad()
    return out


for via_data in (True, False):
    torch.manual_seed(0)
    base = Net(via_data)
    ref = train(copy.deepcopy(base))
    for mode in ("keep", "recompute"):
        got = train(copy.deepcopy(base), mode)
        diffs = [max((a - b).abs().max().item() for a, b in zip(r, g)) for r, g in zip(ref, got)]
        ok = all(d == 0 for d in diffs)
        print(f"via_data={via_data!s:5} mode={mode:9} {'EQUAL' if ok else 'MISMATCH'} max|diff| per step={diffs}")
