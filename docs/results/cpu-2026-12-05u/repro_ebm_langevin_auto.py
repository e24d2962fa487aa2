"""EBM step = 5 Langevin passes (one forward each, autograd.grad w.r.t. the sample) + one
training pass of two forwards (E(real), E(fake)) under one input signature. Under auto,
steps 1-3 run as full recompute (phase 'recompute', never planned) and only step 4 is
planned (borrowed); under a tight budget the first training pass (borrowing the
one-forward plan) goes over and warns 'Plan with a budget lower by that margin' although
every later step is within the budget. Gradients stay bitwise.
Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05u/repro_ebm_langevin_auto.py"""
import copy, logging, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch, torch.nn.functional as F
from torch import nn
import offrecomp
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

class Res(nn.Module):
    def __init__(self): super().__init__(); self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 16)
    def forward(self, x): return x + self.b(F.silu(self.a(x)))

class E(nn.Module):
    def __init__(self):
        super().__init__(); self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([Res() for _ in range(3)]); self.out = nn.Linear(16, 1)
    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks: h = b(h)
        return self.out(h)

def run(e, rt=None, steps=6):
    opt = torch.optim.SGD(e.parameters(), lr=1e-2); out = []
    with rt if rt is not None else torch.enable_grad():
        for s in range(steps):
            torch.manual_seed(s)
            real = torch.randn(6, 8); x = torch.rand(6, 8) * 2 - 1
            for _ in range(5):  # short-run Langevin
                x = x.detach().requires_grad_(True)
                g, = torch.autograd.grad(e(x).sum(), x)
                x = x - 0.05 * g + 0.01 * torch.randn_like(x)
            er, ef = e(real), e(x.detach())
            (er.mean() - ef.mean() + 0.1 * (er.pow(2).mean() + ef.pow(2).mean())).backward()
            out.append([p.grad.clone() for p in e.parameters()]); opt.step(); opt.zero_grad()
    return out

torch.manual_seed(0); e = E(); ref = run(copy.deepcopy(e))
for budget in (None, 7656):  # 7656: half of keep's 1-step peak (15312 B)
    m = copy.deepcopy(e); rt = offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0)
    got = run(m, rt)
    same = all(torch.equal(a, b) for x, y in zip(ref, got) for a, b in zip(x, y))
    print(f"budget={budget} bitwise={same}",
          [(r.phase.value, r.replays, r.peak_activation_bytes) for r in rt.report().steps])
