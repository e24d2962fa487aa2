"""Repro: an optimizer of ANOTHER model, stepped on ANOTHER thread (plain training, no
runtime) while the runtime's model is in its backward, ends the runtime's pass/step
mid-backward. Gradients stay bitwise, but the books are wrong: under recompute the step
is split into records with 0 replays; under auto the signature never leaves "measure".

Model A (3 blocks) trains under offrecomp in the main thread. A gradient hook on A's
activation after block 1 (in A's root forward, so not replayed) makes thread B run
`optB.step()` for its own, unrelated model B and waits for it, i.e. B's optimizer steps
while A's backward runs. Expected: A's step records equal those of a run without B.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05y/repro_other_thread_optimizer.py
"""

import copy
import sys
from pathlib import Path
import threading

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import torch
from torch import nn

import offrecomp

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
        self.hook = None

    def forward(self, x):
        for i, b in enumerate(self.blocks):
            x = b(x)
            if i == 1 and self.hook is not None:
                x.register_hook(self.hook)  # runs during A's backward
        return x.pow(2).mean()


def train_a(mode, other_step):
    torch.manual_seed(0)
    a = Net()
    torch.manual_seed(1)
    b = nn.Linear(8, 8)
    optb = torch.optim.SGD(b.parameters(), lr=0.1)

    def b_step():  # another thread trains model B plainly
        b(torch.randn(2, 8)).sum().backward()
        optb.step()
        optb.zero_grad()

    if other_step:
        def hook(g):
            t = threading.Thread(target=b_step)
            t.start()
            t.join()
        a.hook = hook
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    grads = []
    rt = offrecomp.runtime(a, mode=mode, min_bytes=0)
    with rt:
        for s in range(6):
            loss = a(torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(s)))
            loss.backward()
            grads.append([p.grad.clone() for p in a.parameters()])
            opt.step()
            opt.zero_grad()
    recs = [(r.phase.value if hasattr(r.phase, "value") else r.phase, r.replays, r.recomputed_bytes, r.saved_tensors)
            for r in rt.report().steps]
    return grads, recs


bad = False
for mode in ("recompute", "auto"):
    g0, solo = train_a(mode, False)
    g1, withb = train_a(mode, True)
    same_grads = all(torch.equal(x, y) for a, b in zip(g0, g1) for x, y in zip(a, b))
    print(f"[{mode}] grads bitwise: {same_grads}")
    print(f"[{mode}] records without B's step (phase, replays, recomputed_bytes, saved_tensors):\n   {solo}")
    print(f"[{mode}] records with B's optimizer stepping on another thread during A's backward:\n   {withb}")
    if solo != withb:
        bad = True
        print(f"[{mode}] WRONG: A's books changed by another model's optimizer on another thread")
sys.exit(1 if bad else 0)
