"""`param.data = new_tensor` between a forward and its backward, on a parameter that plain
autograd did not save (a Linear's bias: addmm saves input and weight only).  Plain
gradients are unaffected; offrecomp's replay reads the parameter slot, whose storage was
swapped (`.data =` moves no version counter and keeps the Parameter object, so
capture_params' object/version check in regions.py does not see it) -> silent wrong
gradients under recompute/auto.  Exit 1 when wrong."""
import sys, copy, contextlib; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import offrecomp

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(8, 8)
    def forward(s, x):
        return x + torch.tanh(s.fc(x))

class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.ModuleList([Block() for _ in range(2)])
    def forward(s, x):
        for b in s.blocks: x = b(x)
        return x.pow(2).sum()

def run(model, ctx):
    with ctx:
        y = model(torch.randn(2, 8, generator=torch.Generator().manual_seed(0)))
        for b in model.blocks:
            b.fc.bias.data = b.fc.bias.data + 1.0      # rebind, not in place
        y.backward()
    return [p.grad.clone() for p in model.parameters()]

torch.manual_seed(0); base = Net()
ref = run(copy.deepcopy(base), contextlib.nullcontext())
bad = False
for mode in ["keep", "offload", "recompute", "auto"]:
    m = copy.deepcopy(base)
    got = run(m, offrecomp.runtime(m, mode=mode, min_bytes=0))
    ok = all(torch.equal(a, b) for a, b in zip(ref, got))
    print(mode, "ok" if ok else "WRONG GRADIENTS"); bad |= not ok
sys.exit(1 if bad else 0)
