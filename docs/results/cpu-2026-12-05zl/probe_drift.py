"""Probe: over a long quiet auto run (fixed shapes, no harness work between steps), does
the plan's predicted step time converge to the measured one, or do the drift re-plans
(NOTE [Drift], docs/tuning.md OFFRECOMP_DRIFT) keep firing? Runs the GPT of soak.py,
(2, 32) batches, AdamW, STEPS steps under mode=auto (BUDGET: none or tight = half keep's
step-0 peak), and prints per 100-step window: median measured step_seconds, median
predicted_step_seconds of planned records, re-plans ("drift: re-plan" notes), phases.

cd /work/main && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python /tmp/sweep_soak/probe_drift.py [none|tight] [STEPS]
"""
import collections
import statistics
import sys
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/tmp/sweep_soak")
import torch
from soak import build, batch, keep_budget
from tests.helpers import variant_runtime

BUDGET = sys.argv[1] if len(sys.argv) > 1 else "none"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
torch.set_num_threads(1)
budget = keep_budget("fixed") if BUDGET == "tight" else None
m = build()
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
rt = variant_runtime(m, "auto_tight" if budget else "auto", budget)
with rt:
    for step in range(STEPS):
        torch.manual_seed(step)
        m(batch(step, 2, 32)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
recs = rt.report().steps
print(f"auto budget={budget}: {len(recs)} records")
notes = collections.Counter(n[:110] for r in recs for n in r.notes)
print("distinct notes (count):")
for n, c in notes.most_common(8):
    print(f"  {c:4d}  {n}")
for w in range(0, STEPS, 100):
    win = recs[w:w + 100]
    pl = [r for r in win if r.predicted_step_seconds]
    meas = statistics.median(r.step_seconds for r in win)
    pred = statistics.median(r.predicted_step_seconds for r in pl) if pl else float("nan")
    replans = sum(1 for r in win for n in r.notes if "re-plan" in n)
    print(f"  steps {w:4d}-{w+99:4d}: measured median {meas*1e3:.2f} ms, predicted median {pred*1e3:.2f} ms "
          f"(x{meas/pred:.2f}), re-plans {replans}, phases {dict(collections.Counter(str(r.phase.value) for r in win))}")
