"""Exploratory probe (see README.md). Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05z/probe_pool.py"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py, sweep_z.py
import harness, sweep_z, torch, offrecomp
from offrecomp import offload as off
m = sweep_z.Net()
rt = offrecomp.runtime(m, mode="offload", min_bytes=0, host_limit=100000)
opt = torch.optim.SGD(m.parameters(), lr=0.05)
orig_add = off.OffloadEngine.add
refused = []
def add(self, g, src, n, *a, **k):
    r = orig_add(self, g, src, n, *a, **k)
    if r < 0:
        refused.append((g.ordinal, n, self.pool.in_use_bytes, len(self._deferred), self.pool.idle_bytes))
    return r
off.OffloadEngine.add = add
with rt:
    for step in range(16):
        e = rt.offload_engine
        if e: print(step, "start: in_use", e.pool.in_use_bytes, "deferred", len(e._deferred), "idle", e.pool.idle_bytes, "live", e.live_groups)
        refused.clear()
        sweep_z.loop_cycle(m, step); opt.step(); opt.zero_grad()
        print("   refused", refused)
for s in rt.report().steps: print(s.step, s.fallbacks)
