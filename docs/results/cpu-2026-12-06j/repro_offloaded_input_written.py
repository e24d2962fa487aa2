"""A region whose forward writes its input in place first thing (`x.mul_(2)` on a
previous block's output), under a plan set before the region's first call that places
the input OFFLOAD and the rest RECOMPUTE.  The first call's watch copies the input just
before the write, and that call replays from the copy; at the call's exit the offloaded
input is dropped from the capture, the copy with it, and the replay reads the input
from host memory, which holds the written values.  Exit 1 when gradients differ from
plain training."""
import sys, copy, contextlib; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import offrecomp

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(16, 16)
    def forward(s, x):
        x.mul_(2)                                 # writes its input (a non-leaf) first thing
        return torch.tanh(s.fc(x)) * x

class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.inp = nn.Linear(16, 16); s.blocks = nn.ModuleList([Block() for _ in range(3)])
    def forward(s, x):
        x = s.inp(x) * 1.0
        for b in s.blocks: x = b(x)
        return x.pow(2).sum()

def run(model, rt):
    out = []
    with rt if rt is not None else contextlib.nullcontext():
        for step in range(2):
            model.zero_grad(set_to_none=True)
            model(torch.randn(4, 16, generator=torch.Generator().manual_seed(step))).backward()
            out.append([p.grad.clone() for p in model.parameters()])
    return out

torch.manual_seed(0); base = Net()
ref = run(copy.deepcopy(base), None)
m = copy.deepcopy(base)
rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
rt.set_plan(offrecomp.Plan(
    placements={(f"blocks.{b}", 0, 0): offrecomp.Placement.OFFLOAD for b in range(3)},
    default=offrecomp.Placement.RECOMPUTE))
got = run(m, rt)
bad = 0
for s, (a, b) in enumerate(zip(ref, got)):
    wrong = sum(not torch.equal(x, y) for x, y in zip(a, b))
    err = max((x - y).abs().max().item() for x, y in zip(a, b))
    print(f"step {s}: {wrong} of {len(a)} gradients differ (max abs diff {err:.3g})")
    bad += wrong
st = rt.report().steps
print("replays per step:", [x.replays for x in st], "offloaded bytes:", [x.offloaded_bytes for x in st])
sys.exit(1 if bad else 0)
