"""Where the allocator's peak of a planned step lies, and what it holds, by the memory
profiler's categories: GPT (4 blocks, h=64), under bf16 autocast or fp32, plain, recompute
and auto at FRAC of keep's booked peak.

    python replay_working_set.py FRAC bf16|fp32

Prints, per mode, the books, the allocator's peak less what a plain step holds besides
its saves, the categories held at that peak, the call chain at the peak, and for auto
each region's replayed prefix and whether any storage the plan keeps lies inside it
(the replay would make it again beside the kept one)."""
import contextlib, copy, gc, sys
from collections import Counter
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "cpu-2026-12-06f"))
from repro_common import *  # noqa
from tests import models
from scheduler.plan import Placement
from torch.profiler._memory_profiler import Action, MemoryProfile

FRAC, AC = float(sys.argv[1]), sys.argv[2] == "bf16"
torch.manual_seed(0)
model = models.GPT(layers=4, h=64, heads=4, p=0.1)
batch = torch.randint(0, 64, (4, 64), generator=torch.Generator().manual_seed(1000))
overhead = measure(model, batch, AC)[0] - plain_saved(model, batch, AC)
_, keep_rec, _ = measure(model, batch, AC, mode="keep", min_bytes=0)
budget = int(FRAC * keep_rec.peak_activation_bytes)


def profiled(mode):
    m = copy.deepcopy(model)
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    run = step_fn(m, batch, AC)
    rt = None
    with contextlib.ExitStack() as stack:
        if mode != "plain":
            rt = stack.enter_context(offrecomp.runtime(m, mode=mode, budget=budget, min_bytes=0, drift=100.0))
        for _ in range(5):
            run()
        gc.collect()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                    record_shapes=True, with_stack=True) as prof:
            run()
    return prof, rt


for mode in ("plain", "recompute", "auto"):
    prof, rt = profiled(mode)
    mp = MemoryProfile(prof.profiler.kineto_results)
    live, cur, peak, at, held = {}, 0, 0, 0, {}
    for t, action, (key, version), size in mp.timeline:
        if action == Action.CREATE:
            live[key] = (version, size)
            cur += size
        elif action == Action.DESTROY and key in live:
            cur -= live.pop(key)[1]
        if cur > peak:
            peak, at, held = cur, t, dict(live)
    cats = Counter()
    for key, (version, size) in held.items():
        cats[str(mp._categories.get(key, version)).removeprefix("Category.")] += size
    evs = [e for e in prof.profiler.kineto_results.events()
           if e.name() != "[memory]" and e.start_ns() <= at <= e.start_ns() + e.duration_ns()]
    evs.sort(key=lambda e: -e.duration_ns())
    chain = [e.name() for e in evs if "offrecomp" in e.name() or e.name().startswith(("aten::", "autograd::"))]
    books = rt.report().steps[-1].peak_activation_bytes if rt else None
    print(f"{mode}: budget {budget} books {books} allocator peak {peak} - plain overhead {overhead} = "
          f"{peak - overhead} ({(peak - overhead) / budget:.3f}x budget)")
    print("   held at the peak:", dict(cats.most_common()))
    print("   at:", " > ".join(chain[-6:]))
    if mode == "auto":
        entry = next(iter(rt.planner.entries.values()))
        for r in entry.profile.regions:
            pl = [entry.plan.placement((r.name, r.call_index, i)) for i in range(len(r.storages))]
            k = max((s.last_save_op for s, p in zip(r.storages, pl) if p == Placement.RECOMPUTE), default=0)
            inside = sum(s.nbytes for s, p in zip(r.storages, pl)
                         if k and s.kind == "activation" and p != Placement.RECOMPUTE and s.first_save_op < k)
            print(f"   {r.name}: replays ops 0..{k - 1} of {len(r.ops)}; kept bytes made inside that prefix: {inside}")
