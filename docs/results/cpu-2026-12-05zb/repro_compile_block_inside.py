"""Repro: a block compiled in place (``block.compile()``, torchtune's per-layer compile,
which the README recommends) WHILE the runtime is entered is silently no longer
recomputed: under mode="recompute" its activations are kept from then on (replays per
step 4 -> 3, booked peak +46%), no warning; under auto with a tight budget the plan made
before the compile keeps running and every later planned step holds ~1.1x the budget,
never measured again (the only warning tells the user to lower the budget). Gradients
stay bitwise. Compiling the same block after building the runtime but before entering
it (or exiting and re-entering) recomputes it (test_compile.py::
test_a_block_compiled_after_the_runtime_was_built).

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zb/repro_compile_block_inside.py
Exits 1 while the defect exists.
"""

import logging
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
        self.blocks = nn.ModuleList([Block() for _ in range(4)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


class Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.msgs = []

    def emit(self, r):
        self.msgs.append(r.getMessage())


def run(mode, where, budget=None, steps=8, k=4):
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = Net()
    kw = {"budget": budget} if budget else {}
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, **kw)
    if where == "before_entry":
        m.blocks[1].compile(backend="aot_eager")
    catch = Catch()
    logging.getLogger("offrecomp").addHandler(catch)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    with rt:
        for s in range(steps):
            if where == "inside" and s == k:
                m.blocks[1].compile(backend="aot_eager")
            m(torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(s))).backward()
            opt.step()
            opt.zero_grad()
    logging.getLogger("offrecomp").removeHandler(catch)
    return rt.report().steps, catch.msgs


bad = False
for where in ("before_entry", "inside"):
    recs, msgs = run("recompute", where)
    print(f"recompute, block compiled {where}: (peak, replays) per step "
          f"{[(r.peak_activation_bytes, r.replays) for r in recs]}; warnings: {len(msgs)}")
    if where == "inside" and recs[-1].replays < recs[0].replays:
        bad = True
        print(f"  DEFECT: replays {recs[0].replays} -> {recs[-1].replays}, peak {recs[0].peak_activation_bytes} -> "
              f"{recs[-1].peak_activation_bytes} B, warnings: {msgs}")

keep_peak = run("keep", "none", steps=1)[0][0].peak_activation_bytes
budget = keep_peak // 2
recs, msgs = run("auto", "inside", budget=budget, steps=10)
print(f"auto budget={budget}: (phase, peak/budget) per step "
      f"{[(r.phase, round(r.peak_activation_bytes / budget, 2)) for r in recs]}")
over = [r.step for r in recs if r.phase == "planned" and r.peak_activation_bytes > 1.05 * budget]
if over:
    bad = True
    print(f"  DEFECT: planned steps {over} over budget, never measured again; warnings: {[m_[:160] for m_ in msgs]}")
sys.exit(1 if bad else 0)
