"""Repro: the freezing state in auto's signature goes stale when parameters are replaced
by new nn.Parameter objects under the SAME names while the runtime is entered
(``layer.weight = nn.Parameter(w.clone())``: re-initialising or swapping in weights of
layers that were frozen, which makes them train).

The model starts with inp, blocks[0], blocks[1] frozen (signature "train|frozen:14/28:..."),
auto plans that state under a budget of half the unfrozen model's keep peak. At step 4
those layers' parameters are replaced by new (trainable) Parameter objects. The signature
still says "frozen:14/28" (a parameter assigned under an existing name moves no
structure epoch, and the signature's frozen flags are read from a parameter list cached
per epoch), so the frozen pass's plan runs on a pass that saves about twice as much:
  * default (native keep on): steps 4..9 are booked at ~1.02x the budget, while the hooks
    see 1.94x (native_keep=False run, same loop); the over-run is found only by the
    native-keep audit at step 10 (warning "+94%"), then auto measures again;
  * mode="keep": books ~1.09x the budget for the rest of the run, the hooks see 2.0x.
Gradients are bitwise. Freezing/unfreezing with requires_grad_() on the same objects is
followed correctly (new signature, measured at once).

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zb/repro_frozen_signature_stale.py
Exits 1 while the defect exists.
"""

import sys

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(32, 32)
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.head = nn.Linear(32, 32)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x).square().mean()


def build(frozen=True):
    torch.manual_seed(0)
    m = Net()
    if frozen:
        for mod in (m.inp, m.blocks[0], m.blocks[1]):
            mod.requires_grad_(False)
    return m


def unfreeze_by_new_objects(m):
    for mod in (m.inp, *m.blocks[0].modules(), *m.blocks[1].modules()):
        for n, p in list(mod._parameters.items()):
            if p is not None:
                setattr(mod, n, nn.Parameter(p.detach().clone()))  # trainable new object, same name


def train(m, rt, steps=12, k=4):
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.05)
    grads = []
    with rt:
        for s in range(steps):
            if s == k:
                unfreeze_by_new_objects(m)
                opt = torch.optim.SGD(m.parameters(), lr=0.05)
            x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(s))
            m(x).backward()
            grads.append([p.grad.clone() for p in m.parameters() if p.grad is not None])
            opt.step()
            opt.zero_grad()
    return grads


probe = build(frozen=False)
krt = offrecomp.runtime(probe, mode="keep", min_bytes=0)
with krt:
    probe(torch.randn(4, 8, 32)).backward()
budget = krt.report().steps[0].peak_activation_bytes // 2

rows = {}
for label, mode, kw in [("auto (native keep)", "auto", {}), ("auto, native_keep=False", "auto", {"native_keep": False}),
                        ("keep (native keep)", "keep", {}), ("keep, native_keep=False", "keep", {"native_keep": False})]:
    m = build()
    if mode == "auto":
        kw = dict(kw, budget=budget)
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, **kw)
    train(m, rt)
    recs = rt.report().steps
    rows[label] = recs
    print(f"{label}: (phase, booked peak / budget) per step:")
    print("   ", [(str(r.phase).split(".")[-1][:4].lower(), round(r.peak_activation_bytes / budget, 2)) for r in recs])
print("signature after the unfreeze (step 5):", rows["auto (native keep)"][5].signature)

bad = False
sig_stale = "frozen:" in rows["auto (native keep)"][5].signature
if sig_stale:
    bad = True
    print("DEFECT: every parameter now trains, the signature still names frozen parameters")
a, b = rows["auto (native keep)"], rows["auto, native_keep=False"]
if b[4].peak_activation_bytes > 1.5 * budget and a[4].peak_activation_bytes <= 1.05 * budget:
    bad = True
    print(f"DEFECT: step 4 holds {b[4].peak_activation_bytes / budget:.2f}x the budget by the hooks, booked "
          f"{a[4].peak_activation_bytes / budget:.2f}x under native keep; planned steps booked within budget: "
          f"{[r.step for r in a[4:] if r.phase == 'planned' and r.peak_activation_bytes <= 1.05 * budget]}")
k1, k2 = rows["keep (native keep)"], rows["keep, native_keep=False"]
if k1[-1].peak_activation_bytes != k2[-1].peak_activation_bytes:
    bad = True
    print(f"DEFECT: keep books {k1[-1].peak_activation_bytes} B at the last step, the hooks see {k2[-1].peak_activation_bytes} B")
sys.exit(1 if bad else 0)
