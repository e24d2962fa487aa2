import os, sys, copy
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch
import torch.nn.functional as F
from torch import nn
import offrecomp
torch.set_num_threads(1)

class Blk(nn.Module):
    def __init__(s, h, get):
        super().__init__(); s.fc = nn.Linear(h, h); s.__dict__["get"] = get
    def forward(s, x, state):
        return x + torch.tanh(s.fc(x)) * s.get(state)

class Model(nn.Module):
    """The loop carries a memory to the next block through an argument object
    (`state.mem = ...` after each block), as NOTE [Stateful arguments] describes."""
    def __init__(s, make_state, get, setm, h=16, n=4):
        super().__init__(); s.blocks = nn.ModuleList(Blk(h, get) for _ in range(n)); s.g = nn.Linear(h, h)
        s.__dict__.update(make_state=make_state, setm=setm)
    def forward(s, x):
        st = s.make_state()
        s.setm(st, torch.ones_like(x))
        for b in s.blocks:
            y = b(x, st)
            s.setm(st, torch.sigmoid(s.g(y)))
            x = y
        return x.square().mean()

def grads(model, ctx=None):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    if ctx is None:
        model(x).backward()
    else:
        with ctx:
            model(x).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}

def run(make_state, get, setm, label):
    torch.manual_seed(0)
    model = Model(make_state, get, setm)
    ref = grads(copy.deepcopy(model))
    ref2 = grads(copy.deepcopy(model))
    assert all(torch.equal(ref[k], ref2[k]) for k in ref), "plain not deterministic"
    bad = 0
    for mode in ("keep", "recompute"):
        m = copy.deepcopy(model)
        got = grads(m, offrecomp.runtime(m, mode=mode, min_bytes=0))
        diff = {k: (ref[k] - got[k]).abs().max().item() for k in ref if not torch.equal(ref[k], got[k])}
        print(f"{label} mode={mode}: " + ("bitwise equal to plain" if not diff else f"DIFFERS: {diff}"))
        bad += bool(diff)
    sys.exit(1 if bad else 0)
