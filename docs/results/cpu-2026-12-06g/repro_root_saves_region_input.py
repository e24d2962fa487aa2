"""The loop's own code (outside the regions) saves a tensor that is also a region input
held for replay (here the last block's input, multiplied with the last output). Under
mode='recompute' the books count that storage once; under auto's planned steps (same
placements: every activation dropped) it is counted twice, so peak_activation_bytes and
the planner's predicted peak are too high by its size, and a budget the step meets is
reported as out of reach / exceeded. Exits 1 while the two books disagree."""
import sys, os, copy, logging
sys.path.insert(0, os.environ.get("ORC", str(__import__("pathlib").Path(__file__).resolve().parents[3])))  # the repository root
import torch, torch.nn as nn
import offrecomp

D = 64
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.a = nn.Linear(D, D)
    def forward(s, x):
        return torch.tanh(s.a(x))

class Model(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.ModuleList([Block() for _ in range(4)])
    def forward(s, x):
        prev = x
        for b in s.blocks:
            prev, x = x, b(x)
        return (x * prev).sum()      # root op saving the last block's input `prev`

torch.manual_seed(0)
base = Model()
xs = [torch.randn(32, D) for _ in range(6)]
peaks = {}
for mode, kw in [("recompute", {}), ("auto", dict(budget=1)), ("auto native_keep=False", dict(budget=1, native_keep=False))]:
    m = copy.deepcopy(base)
    try:
        rt_cm = offrecomp.runtime(m, mode=mode.split()[0], min_bytes=0, **kw)
    except TypeError as e:
        print(mode, "skipped:", e); continue
    with rt_cm as rt:
        for x in xs:
            m(x).backward(); m.zero_grad()
    steps = rt.report().steps
    peaks[mode] = steps[-1].peak_activation_bytes
    print(f"{mode}: phases {[str(s.phase.value) for s in steps]} peaks {[s.peak_activation_bytes for s in steps]}")
    if mode.startswith("auto"):
        print("   ", "\n    ".join(rt.explain().splitlines()[:3]))
print(f"one block input = {32*D*4} B")
bad = peaks["auto"] != peaks["recompute"]
print("DEFECT: planned books differ from recompute's for the same placements" if bad else "consistent")
sys.exit(1 if bad else 0)
