"""Repro: a block's compiled function starts advancing a plain tensor attribute in place
(pos.add_(1)) only from the second step on; its first call never touched the attribute.
Under mode="recompute" (and auto's measure/calibrate steps) the replay in backward runs
the compiled function again: pos advances twice per step and the gradients differ from
plain training, with no error and no warning. The same happens with the advance written
eagerly (EAGER=1), and under torch.utils.checkpoint (shown for comparison), so this is
not specific to compiled code; the foreign-write detection (FirstCallWatch) runs only
while a region's writes_state is undecided (its first call).

Exit status 1 while offrecomp's result differs from plain training.

Run: cd /tmp/sweep_cfn && OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 \
  TORCHINDUCTOR_CACHE_DIR=/tmp/sweep_cfn/inductor_cache NUMBA_CACHE_DIR=/tmp/sweep_cfn/numba_cache \
  timeout 300 /work/main/.venv/bin/python repro_later_call_foreign_write.py   [EAGER=1 in env for the eager variant]
"""
import contextlib
import copy
import os
import sys

sys.path.insert(0, "/work/main")
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import offrecomp

EAGER = os.environ.get("EAGER") == "1"


def _advance(x, w, b, pos):
    pos.add_(1.0)
    return torch.tanh(F.linear(x, w, b) + pos)


def _plain(x, w, b):
    return torch.tanh(F.linear(x, w, b))


adv = _advance if EAGER else torch.compile(_advance, backend="inductor")
plain_fn = _plain if EAGER else torch.compile(_plain, backend="inductor")


class Block(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.fc, self.pos, self.advance = nn.Linear(h, h), torch.zeros(h), False

    def forward(self, x):
        y = torch.tanh(x)
        z = adv(y, self.fc.weight, self.fc.bias, self.pos) if self.advance else plain_fn(y, self.fc.weight, self.fc.bias)
        return x + z * y


class Stack(nn.Module):
    def __init__(self, ckpt=False):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.ckpt = ckpt

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        return x.square().mean()


def run(model, ctx=None, steps=3):
    grads = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ctx if ctx is not None else contextlib.nullcontext():
        for step in range(steps):
            for b in model.blocks:
                b.advance = step >= 1  # the loop switches the advance on after the first step
            x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(step))
            model(x).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
            opt.zero_grad()
    return grads, [float(b.pos[0]) for b in model.blocks]


torch.manual_seed(0)
base = Stack()
ref, ref_pos = run(copy.deepcopy(base))
m = copy.deepcopy(base)
got, got_pos = run(m, offrecomp.runtime(m, mode="recompute"))
c = copy.deepcopy(base)
c.ckpt = True
ck, ck_pos = run(c)

def diff(a, b):
    return max((x - y).abs().max().item() for sa, sb in zip(a, b) for x, y in zip(sa, sb))

print(f"{'eager' if EAGER else 'compiled'} advance")
print(f"plain:      pos[0] per block after 3 steps = {ref_pos}")
print(f"offrecomp:  pos[0] per block after 3 steps = {got_pos}; max |grad diff| vs plain = {diff(ref, got):.3g}")
print(f"checkpoint: pos[0] per block after 3 steps = {ck_pos}; max |grad diff| vs plain = {diff(ref, ck):.3g}")
bad = got_pos != ref_pos or diff(ref, got) != 0
print("DEFECT PRESENT" if bad else "ok")
sys.exit(1 if bad else 0)
