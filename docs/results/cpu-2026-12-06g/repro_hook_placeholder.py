"""A forward hook (KD / activation-monitor style) on a module inside a region stores the
module's output in a dict outside the modules. After backward, under a serving replay
(auto, replay_op_us=0, a plan that keeps `a + 1` and drops gelu's output), the dict holds
an uninitialized placeholder tensor instead of the output (plain run and
torch.utils.checkpoint both leave the real values there). Exit 1 while the defect exists."""
import sys, copy
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn, torch.nn.functional as F
import offrecomp

class Block(nn.Module):
    def __init__(s, d):
        super().__init__(); s.l1 = nn.Linear(d, 2 * d); s.l2 = nn.Linear(2 * d, d)
    def forward(s, x):
        a = s.l1(x)           # saved by nothing
        g = F.gelu(a + 1.0)   # gelu saves a + 1 (kept by the plan)
        return x + s.l2(g)    # l2 saves g (dropped by the plan)

class M(nn.Module):
    def __init__(s, d):
        super().__init__(); s.blocks = nn.ModuleList([Block(d) for _ in range(3)])
    def forward(s, x):
        for b in s.blocks: x = b(x)
        return x

FEATS = {}   # e.g. a feature logger / KD feature store keyed by layer
torch.manual_seed(0)
model = M(16)
for i, b in enumerate(model.blocks):
    b.l1.register_forward_hook(lambda mod, inp, out, i=i: FEATS.__setitem__(i, out.detach()))
g = torch.Generator().manual_seed(1)
batches = [torch.randn(8, 16, generator=g) for _ in range(4)]

plan = offrecomp.Plan(placements={(f"blocks.{b}", 0, 2): offrecomp.Placement.RECOMPUTE for b in range(3)},
                      default=offrecomp.Placement.KEEP)
bad = 0
with offrecomp.runtime(model, mode="auto", min_bytes=0, replay_op_us=0) as rt:
    rt.set_plan(plan)
    for step, x in enumerate(batches):
        loss = model(x).pow(2).mean()
        before = {k: v.clone() for k, v in FEATS.items()}
        loss.backward()
        for k in before:
            same = torch.equal(before[k], FEATS[k])
            print(f"step {step} FEATS[{k}] after backward equals the forward's output: {same}"
                  + ("" if same else f"  (got {FEATS[k].flatten()[:3].tolist()}, expected {before[k].flatten()[:3].tolist()})"))
            bad += not same
print("served ops per step:", [r.served_ops for r in rt.report().steps])
print("DEFECT PRESENT" if bad else "OK")
sys.exit(1 if bad else 0)
