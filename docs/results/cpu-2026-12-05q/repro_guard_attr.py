"""A forward hook on a Linear inside a region sets a module attribute only outside
replays (offrecomp.in_replay() guard, as docs advise for side effects) and reads it.
offrecomp's replay restores module attributes to their values at the call's entry
(NOTE [Module attributes]), so the replay reads the previous call's value (or none)."""
import copy, torch, offrecomp
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)
    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.square().mean()

calls = {"n": 0}
def hook(mod, args, out):
    if not offrecomp.in_replay():          # a side effect done once per forward
        calls["n"] += 1
        mod.scale = 1.0 + 0.1 * calls["n"]  # e.g. a per-step annealed scale
    return out * mod.scale

def run(init_attr, use_rt):
    torch.manual_seed(0)
    m = Model()
    for b in m.blocks:
        if init_attr:
            b.fc1.scale = 1.0
        b.fc1.register_forward_hook(hook)
    calls["n"] = 0
    grads = []
    rt = offrecomp.runtime(m, mode="recompute", min_bytes=0) if use_rt else None
    import contextlib
    with rt if rt else contextlib.nullcontext():
        for s in range(3):
            m.zero_grad()
            m(torch.randn(4, 8, generator=torch.Generator().manual_seed(s))).backward()
            grads.append(m.blocks[0].fc1.weight.grad.clone())
    return grads

# reference: torch.utils.checkpoint with the same guard ("in a backward" = recomputing)
import torch.utils.checkpoint as cp
def run_ckpt():
    global in_rep
    torch.manual_seed(0)
    m = Model()
    for b in m.blocks:
        b.fc1.scale = 1.0
        b.fc1.register_forward_hook(hook)
    m.forward = lambda x: (lambda y: y.square().mean())(
        cp.checkpoint(m.blocks[1], cp.checkpoint(m.blocks[0], x, use_reentrant=False), use_reentrant=False))
    calls["n"] = 0
    grads = []
    for s in range(3):
        m.zero_grad()
        m(torch.randn(4, 8, generator=torch.Generator().manual_seed(s))).backward()
        grads.append(m.blocks[0].fc1.weight.grad.clone())
    return grads
_orig = offrecomp.in_replay
offrecomp.in_replay = lambda: _orig() or torch._C._current_graph_task_id() != -1
ref = run(True, False)
print("torch.utils.checkpoint, same guard:", ["equal" if torch.equal(a, b) else f"DIFF {(a-b).abs().max():.3g}" for a, b in zip(ref, run_ckpt())])
offrecomp.in_replay = _orig
for init in (True, False):
    ref = run(init, False)
    try:
        got = run(init, True)
        print(f"attr set at build={init}:", ["equal" if torch.equal(a, b) else f"DIFF {(a-b).abs().max():.3g}" for a, b in zip(ref, got)])
    except Exception as e:
        print(f"attr set at build={init}: {type(e).__name__}: {e}")
