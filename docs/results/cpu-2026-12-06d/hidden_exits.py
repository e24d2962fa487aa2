"""Solve the H200's 8K profile (h200-2026-11-30b) with synthetic host times: region host
0.5-1.1x device in forward, 0.5x in backward, 50-1000 us per group offload and reload,
6 us pack (3 us unpack) per save, 60 us per checkpoint; budgets 50% and 25% of keep's
peak. Prints solve's predicted step (ms) per case and the total (s).

    python docs/results/cpu-2026-12-06d/hidden_exits.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from scheduler import Plan, Profile, simulate, solve  # noqa: E402

P = ROOT / "docs/results/h200-2026-11-30b/run1/bench_planner_profile.json"

def load(hs, bhs, off_us, pack_us, cap_us):
    p = Profile.load(P)
    for r in p.regions:
        r.host_seconds = r.forward_seconds * hs
        r.backward_host_seconds = r.backward_seconds * bhs
    p.offload_host_seconds = p.reload_host_seconds = off_us * 1e-6
    p.pack_host_seconds = pack_us * 1e-6
    p.unpack_host_seconds = pack_us * 0.5e-6
    p.capture_host_seconds = cap_us * 1e-6
    p.native_keep = True
    return p


allkeep = simulate(load(0.75, 0.5, 0, 0, 0), Plan()).peak_bytes
tot = 0
for hs in (0.5, 0.75, 0.9, 1.1):
    for off in (50, 300, 1000):
        row = []
        for share in (0.5, 0.25):
            p = load(hs, 0.5, off, 6, 60)
            a = solve(p, budget_bytes=int(allkeep * share))
            row.append(a.predicted_step_seconds)
            tot += a.predicted_step_seconds
        print(hs, off, " ".join(f"{1e3*x:.3f}" for x in row))
print("total", tot)
