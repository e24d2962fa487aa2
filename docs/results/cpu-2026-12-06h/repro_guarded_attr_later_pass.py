"""docs/reliability.md promises: an attribute of a region's modules set only under
`if not offrecomp.in_replay():` (self.scale = schedule(step)) has in the replay its entry
value before the guard (NOTE [Module attributes], changes.py).  Attribute tables are copied only in a
signature's first pass or while the region is known to change attributes
(calls.py:247 `if p.new_signature or region.attr_quiet >= 0`; call_state.py:68-83), so a
forward that first changes an attribute in a later pass (here step 3; also any change
after ATTR_QUIET=64 quiet calls) replays with the NEW value -> silent wrong gradients
under mode="recompute".  Usage: repro [change_step] [mode].  Exit 1 when wrong."""
import sys, copy, contextlib
import torch, torch.nn as nn
import offrecomp

STEP = [0]
CHANGE_AT = int(sys.argv[1]) if len(sys.argv) > 1 else 3

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(8, 8); s.tau = 1.0
    def forward(s, x):
        h = torch.tanh(s.fc(x) * s.tau)                      # reads tau
        if not offrecomp.in_replay() and STEP[0] == CHANGE_AT:
            s.tau = 0.5                                       # schedule, guarded as documented
        return x + h

class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.ModuleList([Block() for _ in range(2)])
    def forward(s, x):
        for b in s.blocks: x = b(x)
        return x.pow(2).sum()

def run(model, ctx):
    grads = []
    with ctx:
        for step in range(CHANGE_AT + 1):
            STEP[0] = step
            model.zero_grad()
            model(torch.randn(2, 8, generator=torch.Generator().manual_seed(step))).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
    return grads

torch.manual_seed(0); base = Net()
ref = run(copy.deepcopy(base), contextlib.nullcontext())
m = copy.deepcopy(base)
MODE = sys.argv[2] if len(sys.argv) > 2 else "recompute"
got = run(m, offrecomp.runtime(m, mode=MODE, min_bytes=0, **({"budget": 2000} if MODE == "auto" else {})))
bad = [i for i, (a, b) in enumerate(zip(ref, got)) if not all(torch.equal(x, y) for x, y in zip(a, b))]
print(MODE, "change at step", CHANGE_AT, "-> steps with wrong gradients:", bad)
sys.exit(1 if bad else 0)
