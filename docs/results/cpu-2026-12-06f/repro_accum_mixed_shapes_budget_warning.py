"""Gradient accumulation whose micro-batches differ in shape (dynamic padding): the
step's budget check uses the FIRST micro-batch's signature and plan but the peak of ALL
micro-batches. Result: a false "+N% ... Plan with a budget lower by that margin" warning
naming the short signature, whose own passes stay within budget, and no warning at all
for the long signature whose plan is infeasible. Exits 1 on the defect."""
import os, sys, logging
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch
from torch import nn
import offrecomp

torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).mean()


class Catch(logging.Handler):
    def __init__(self):
        super().__init__(); self.msgs = []
    def emit(self, r):
        self.msgs.append(r.getMessage())


def loop(rt_kwargs, schedule):
    torch.manual_seed(0)
    m = Net(); opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    with offrecomp.runtime(m, min_bytes=0, **rt_kwargs) as rt:
        for lens in schedule:
            for L in lens:              # one optimizer step = len(lens) micro-batches
                m(torch.randn(4, L, 64)).backward()
            opt.step(); opt.zero_grad()
    return rt


SHORT, LONG = 16, 64
# keep's peak of the short shape, and recompute's of the long one
keep_short = loop(dict(mode="keep"), [(SHORT,)]).report().steps[0].peak_activation_bytes
rec_long = loop(dict(mode="recompute"), [(LONG,)]).report().steps[0].peak_activation_bytes
budget = keep_short // 2
print(f"keep peak (short) {keep_short}, recompute peak (long) {rec_long}, budget {budget}")
assert budget < rec_long, "the long shape should be infeasible for this budget"

h = Catch(); logging.getLogger("offrecomp").addHandler(h)
# every step: a short micro-batch first, then a long one (bucketed lengths, DataCollatorWithPadding)
rt = loop(dict(mode="auto", budget=budget), [(SHORT, LONG)] * 8 + [(SHORT, SHORT)] * 3)
for s in rt.report().steps:
    print(s.step, s.phases, s.signature[:40], "peak", s.peak_activation_bytes, "budget", s.budget_bytes,
          "predicted_peak", s.predicted_peak_bytes)
over = [m for m in h.msgs if "planned step held" in m]
infeasible = [m for m in h.msgs if "cannot be met" in m]
print("over-budget warnings:", over)
print("infeasible warnings:", infeasible)
short_only = [s for s in rt.report().steps[-3:]]
bad = False
if any(f"({4}, {SHORT}" in m for m in over) and all(s.peak_activation_bytes <= 1.05 * budget for s in short_only):
    print("DEFECT: the short signature is blamed for the long micro-batch's peak; its own steps hold",
          [s.peak_activation_bytes for s in short_only], "<= budget", budget)
    bad = True
long_entries = [e for sig, e in rt.planner.entries.items() if f"({4}, {LONG}" in str(sig)]
if not infeasible and long_entries and any(getattr(e.plan, "feasible", True) is False for e in long_entries):
    print("DEFECT: the long signature's plan is infeasible (plan.feasible=False), but no infeasible warning was given")
    bad = True
sys.exit(1 if bad else 0)
