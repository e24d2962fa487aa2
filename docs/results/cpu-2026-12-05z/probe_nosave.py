"""Exploratory probe (see README.md). Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05z/probe_nosave.py mix"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py, sweep_z.py
import harness, sweep_z, torch, offrecomp
from offrecomp import offload as off
from scheduler.plan import Placement, Plan
log = []
oi, of = off.OffloadEngine.issue, off.OffloadEngine._reload
def issue(self, g, *a, **k):
    r = oi(self, g, *a, **k); log.append(("issue", g.ordinal, g.nbytes, g.payload_bytes, len(g.sizes))); return r
def rel(self, g, *a, **k):
    log.append(("reload", g.ordinal, g.nbytes, g.payload_bytes)); return of(self, g, *a, **k)
off.OffloadEngine.issue = issue; off.OffloadEngine._reload = rel
variant = sys.argv[1]
torch.manual_seed(0)
m = sweep_z.MixNet()
rt = offrecomp.runtime(m, mode="auto" if variant != "offload" else "offload", min_bytes=0, regions=lambda mm, n: n.startswith("blocks.") and n.count(".") == 1)
if variant == "mix":
    rt.set_plan(harness.mix_plan(rt))
if variant == "alloff":
    rt.set_plan(Plan(default=Placement.OFFLOAD))
with rt:
    for step in range(3):
        log.clear()
        sweep_z.loop_std(m, step)
        print(step, log)
print(rt.regions)
print(rt.explain())
for s in rt.report().steps: print(s.step, s.phase, s.offloaded_bytes, s.d2h_bytes, s.h2d_bytes, s.fallbacks)
