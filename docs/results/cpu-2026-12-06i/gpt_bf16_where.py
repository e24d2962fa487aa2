"""bf16 GPT at 0.3 (as gpt_bf16_ratio.py), then one more step under the memory profiler: its peak,
what it holds by category, where, and the plan per block. PYTHONPATH=. python THIS"""
import copy, gc, sys, torch
from collections import Counter
import offrecomp
from tests import models
from tests.offrecomp.test_memory import allocator_peak
from tests.offrecomp.test_replay_transients import _plain_saved, _step, _tokens, _warm
from scheduler.plan import Placement
from torch.profiler._memory_profiler import Action, MemoryProfile
torch.manual_seed(0)
model = models.GPT(layers=4, h=64, heads=4, p=0.1)
x = _tokens(0)
plain = _warm(model)
for _ in range(3): _step(plain, x, True)()
saved = _plain_saved(model, x, True)
overhead = allocator_peak(_step(plain, x, True)) - saved
budget = int(0.3 * saved)
m = _warm(model)
with offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0, drift=100.0) as rt:
    for _ in range(5): _step(m, x, True)()
    peak = allocator_peak(_step(m, x, True))
    gc.collect()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        _step(m, x, True)()
s = rt.report().steps[-1]
print(f"RATIO measured/budget {(peak - overhead) / budget:.3f} books/budget {s.peak_activation_bytes / budget:.3f} predicted/budget {s.predicted_peak_bytes / budget:.3f} overhead {overhead}", flush=True)
mp = MemoryProfile(prof.profiler.kineto_results)
live, cur, pk, at, held = {}, 0, 0, 0, {}
for t, action, (key, version), size in mp.timeline:
    if action == Action.CREATE:
        live[key] = (version, size); cur += size
    elif action == Action.DESTROY and key in live:
        cur -= live.pop(key)[1]
    if cur > pk:
        pk, at, held = cur, t, dict(live)
cats = Counter()
for key, (version, size) in held.items():
    cats[str(mp._categories.get(key, version)).removeprefix("Category.")] += size
evs = [e for e in prof.profiler.kineto_results.events() if e.name() != "[memory]" and e.start_ns() <= at <= e.start_ns() + e.duration_ns()]
evs.sort(key=lambda e: -e.duration_ns())
chain = [e.name() for e in evs if "offrecomp" in e.name() or e.name().startswith(("aten::", "autograd::"))]
print("   profiled peak", pk, "held:", dict(cats.most_common()))
print("   at:", " > ".join(chain[-6:]))
entry = next(iter(rt.planner.entries.values()))
for r in entry.profile.regions:
    pl = [entry.plan.placement((r.name, r.call_index, i)) for i in range(len(r.storages))]
    print("  ", r.name, "".join(p.name[0] for p in pl))
