"""Repro: a signal handler's exception (SIGALRM -> TimeoutError, a step watchdog) that
lands while `with rt:` installs the runtime, between `module.forward = wrapped` and
`self._restore.append(restore)` in offrecomp/install.py:Installer._wrap_forward, leaves
the runtime's wrapper in the module's `forward` slot for good: the failed entry's
cleanup (`_uninstall`) does not know it, and every later exit restores the slot to that
stale wrapper (it is the "previous" value the next entry saves).

Seen first in sweep_threads.py case sigalrm_random (auto_tight): "wrapped forwards left:
['blocks.0']" after a random SIGALRM. Here the exception is injected deterministically at
that bytecode boundary with a trace function (a signal handler's exception is raised at
such a boundary too), once, on the first region.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05y/repro_interrupt_in_install.py
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import torch
from torch import nn

import offrecomp
from offrecomp import install
from offrecomp import _torch_compat as tc
from offrecomp import context as octx

torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 64), nn.Linear(64, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.pow(2).mean()


def batch(s):
    return torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(s))


def train(m, rt, steps=4):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = []
    for s in range(steps):
        with rt if rt is not None else torch.enable_grad():
            loss = m(batch(s))
            loss.backward()
        out.append([p.grad.clone() for p in m.parameters()])
        opt.step()
        opt.zero_grad()
    return out


code = install.Installer._wrap_forward.__code__
src_lines = [i for i, l in enumerate(open(code.co_filename).read().splitlines(), 1)]
# the line `self._restore.append(restore)` inside _wrap_forward
target = None
for i, line in enumerate(open(code.co_filename).read().splitlines(), 1):
    if i > code.co_firstlineno and "self._restore.append(restore)" in line:
        target = i
        break
assert target is not None
fired = []


def tracer(frame, event, arg):
    if frame.f_code is code:
        def local(fr, ev, a):
            if ev == "line" and fr.f_lineno == target and not fired:
                fired.append(1)
                raise TimeoutError("alarm (injected where a SIGALRM handler's exception can land)")
            return local
        return local
    return None


torch.manual_seed(0)
model = Net()
ref = train(copy.deepcopy(model), None)

m = copy.deepcopy(model)
rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
sys.settrace(tracer)
try:
    with rt:
        pass
except TimeoutError as e:
    print("entry interrupted:", e)
finally:
    sys.settrace(None)

bad = False
left = [n for n, mod in m.named_modules() if "forward" in mod.__dict__]
print("after the failed entry: active runtime:", octx._active, "| hook pair:", tc.top_saved_tensors_hooks(),
      "| wrapped forwards left:", left)
bad |= bool(left)

got = train(m, rt)
same = all(torch.equal(a, b) for x, y in zip(ref, got) for a, b in zip(x, y))
print("4 steps under the runtime afterwards: grads bitwise:", same)
bad |= not same
left = [n for n, mod in m.named_modules() if "forward" in mod.__dict__]
print("after 4 normal entries/exits: wrapped forwards left:", left,
      type(m.blocks[0].__dict__.get("forward")).__name__ if left else "")
bad |= bool(left)
print("records:", [(r.phase.value, r.replays) for r in rt.report().steps])
import gc, weakref
w = weakref.ref(rt)
del rt
gc.collect()
print("runtime object still alive after `del rt` + gc (held by the stale wrapper):", w() is not None)
if bad:
    print("WRONG: the runtime's wrapper stays in blocks.0.forward after the runtime exited")
sys.exit(1 if bad else 0)
