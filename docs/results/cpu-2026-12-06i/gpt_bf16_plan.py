"""bf16 GPT at 0.3 of a plain step's saves under the plan auto chose on the tree before in its
1.131x run of gpt_bf16_where.py (gpt_bf16_where_before.txt; blocks.3 kept nearly whole): what the simulator predicts for
it, what the books say and what the allocator holds, over the budget. PYTHONPATH=. python THIS"""
import sys, torch, offrecomp
from tests import models
from tests.offrecomp.test_memory import allocator_peak
from tests.offrecomp.test_replay_transients import _plain_saved, _step, _tokens, _warm
from scheduler.plan import Placement, Plan
from scheduler import simulate
torch.manual_seed(0)
model = models.GPT(layers=4, h=64, heads=4, p=0.1)
x = _tokens(0)
plain = _warm(model)
for _ in range(3): _step(plain, x, True)()
saved = _plain_saved(model, x, True)
overhead = allocator_peak(_step(plain, x, True)) - saved
budget = int(0.3 * saved)
codes = {"blocks.0": "K" + "R" * 22, "blocks.1": "K" + "R" * 22, "blocks.2": "K" + "R" * 22, "blocks.3": "KRRRR" + "K" * 18}
m = _warm(model)
with offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0, drift=100.0) as rt:
    for _ in range(3): _step(m, x, True)()
    prof = rt.planner.last_entry.profile
    pl = {}
    for r in prof.regions:
        for i, c in enumerate(codes[r.name]):
            if r.storages[i].kind == "activation":
                pl[(r.name, r.call_index, i)] = Placement.RECOMPUTE if c == "R" else Placement.KEEP
    plan = Plan(placements=pl)
    print("simulated peak/budget", simulate(prof, plan).peak_bytes / budget)
    rt.set_plan(plan)
    for _ in range(3): _step(m, x, True)()
    peak = allocator_peak(_step(m, x, True))
s = rt.report().steps[-1]
print(f"PLAN measured/budget {(peak - overhead) / budget:.3f} books/budget {s.peak_activation_bytes / budget:.3f} phase {s.phase}")
