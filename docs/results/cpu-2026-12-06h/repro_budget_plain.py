"""auto under a byte budget, plain torch model: the loop keeps `out` and the target `y`
(which mse_loss saves) referenced through backward, as every training loop does. The
runtime's books count those saved storages as held until they die (after the step), but
the planner's timeline frees root saves when backward passes their node, so every plan's
peak is under-predicted by what the loop keeps alive during the replays. A plan predicted
within budget holds more than the budget, and no infeasibility is reported; the
'smallest feasible budget' named in other cases is not feasible either.

    python repro_budget_plain.py [OUT=256] [del]    # 'del': drop out/y before backward -> exit 0
Exit 1 when a planned step holds more than predicted / more than budget without an
infeasibility report / more than the smallest feasible budget named.
"""
import logging
import re
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import offrecomp

torch.set_num_threads(1)
OUT = int(sys.argv[1]) if len(sys.argv) > 1 else 256
DEL = "del" in sys.argv[2:]
msgs = []


class H(logging.Handler):
    def emit(self, r):
        msgs.append(r.getMessage())


logging.getLogger("offrecomp").addHandler(H())
logging.getLogger("offrecomp").setLevel(logging.INFO)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a = nn.Linear(d, 4 * d)
        self.b = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


class M(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(4))
        self.head = nn.Linear(d, OUT)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def run(m, steps):
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, 64, generator=g)
        y = torch.randn(32, OUT, generator=g)
        out = m(x)
        loss = F.mse_loss(out, y)   # saves out and y
        if DEL:
            del out, y
        loss.backward()
        opt.step()
        opt.zero_grad()


torch.manual_seed(0)
m = M()
with offrecomp.runtime(m, mode="keep") as rt:
    run(m, 1)
budget = rt.report().steps[-1].peak_activation_bytes // 2
torch.manual_seed(0)
m = M()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    with offrecomp.runtime(m, mode="auto", budget=budget) as rt:
        run(m, 6)
msgs += [str(x.message) for x in w]
ok = True
planned = [s for s in rt.report().steps if s.phase.value == "planned"]
for s in rt.report().steps:
    print(f"  step {s.step} {s.phase.value:9s} held {s.peak_activation_bytes} predicted {s.predicted_peak_bytes} budget {s.budget_bytes}")
feas = [int(x) for m_ in msgs for x in re.findall(r"smallest feasible budget is [^(]*\((\d+) bytes\)", m_)]
worst = max(s.peak_activation_bytes for s in planned)
pred = max(s.predicted_peak_bytes for s in planned)
print("feasible named:", feas[:1], "worst held:", worst, "predicted:", pred)
if worst > pred:
    print(f"FAIL: held {worst} > predicted {pred} (+{worst - pred})"); ok = False
if feas and worst > feas[0]:
    print("FAIL: held more than the smallest feasible budget named"); ok = False
if not feas and worst > budget:
    print("FAIL: over budget without an infeasibility report"); ok = False
print("OK" if ok else "WRONG")
sys.exit(0 if ok else 1)
