"""A region's forward patched and un-patched around each step while the runtime is
entered (unittest.mock.patch.object, a library's temporary forward): un-patching puts
the runtime's own wrapper back, which _follow_forwards does not recognise, so it wraps
it again; the wrappers nest one level deeper every step and _restore grows."""
import sys, types
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
from unittest import mock
import torch
from torch import nn
import offrecomp
from offrecomp.install import _Installed

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
    def forward(self, x):
        return x + torch.tanh(self.fc(x))

def patched(self, x):  # a library's own forward, bound per use
    return x + torch.tanh(self.fc(x))

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.square().mean()

def depth(fn):
    d = 0
    while isinstance(fn, _Installed):
        d += 1
        fn = fn.previous if fn.previous is not None else None
    return d

m = Model()
x = torch.randn(4, 16)
rt = offrecomp.runtime(m, mode="recompute", min_bytes=0, regions=Block)
sizes, depths = [], []
with rt:
    for step in range(8):
        if step % 2 == 0:
            with mock.patch.object(m.blocks[0], "forward", types.MethodType(patched, m.blocks[0])):
                m(x).backward()
        else:
            m(x).backward()
        sizes.append(len(rt._installer._restore))
        depths.append(depth(m.blocks[0].__dict__.get("forward")))
print("restore list per step:", sizes); print("slot after exit:", m.blocks[0].__dict__.get("forward"))
print("wrapper nesting of blocks[0].forward per step:", depths)
sys.exit(1 if sizes[-1] > sizes[1] + 2 or max(depths) > 2 else 0)
