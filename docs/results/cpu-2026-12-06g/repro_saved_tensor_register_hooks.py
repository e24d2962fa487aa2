"""A block sets a pack/unpack pair on one saved tensor of its own graph
(grad_fn._raw_saved_<name>.register_hooks, torch's per-SavedTensor API). Plain autograd
accepts it. Under offrecomp every save already carries the runtime's pair, so torch
raises "Calling register_hooks on a saved tensor whose hooks have already been set",
which names no hook the user set and does not mention offrecomp (compare the dedicated
message for torch.func.grad inside `with rt:`); reliability.md does not list it."""
import sys, warnings
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn, offrecomp

class Block(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.fc = nn.Linear(h, h)
    def forward(self, x):
        a = torch.tanh(self.fc(x))
        if a.grad_fn is not None:   # compress this one save (exact here: x2, /2)
            a.grad_fn._raw_saved_result.register_hooks(lambda t: t * 2, lambda t: t / 2)
        return x + a

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.sum()

x = torch.randn(4, 16)
torch.manual_seed(0); m = Model()
m(x).backward(); print("plain: ok")
bad = False
for mode in ("keep", "recompute", "offload", "auto"):
    torch.manual_seed(0); m = Model()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with offrecomp.runtime(m, mode=mode, min_bytes=0):
                for _ in range(3):
                    m(x).backward()
        print(f"{mode}: ok")
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        print(f"{mode}: RuntimeError: {msg}")
        if "offrecomp" not in msg:
            bad = True
print("DEFECT PRESENT (error names no offrecomp cause)" if bad else "ok")
sys.exit(1 if bad else 0)
