"""Profile.host_limit_bytes is not checked like the other fields: NaN raises
"ValueError: cannot convert float NaN to integer", inf an OverflowError, neither naming
the field; -1 is taken silently as unlimited (only 0 is documented so) and 1.5 silently
as 1. Every other numeric field raises "ValueError: <field> = nan is invalid; accepted:
...". Where: scheduler/flat.py flatten, host_limit_bytes=int(profile.host_limit_bytes).
Exits 1 while NaN/inf give an error without the field's name, or -1 is accepted.
Run: cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/repro_host_limit_values.py
"""
import math
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
from scheduler import Profile, RegionRecord, StorageRecord, solve

bad = []
for v in (math.nan, math.inf, -1, 1.5):
    p = Profile(signature="s", forward_seconds=1.0, d2h_gbps=10.0, h2d_gbps=10.0, host_limit_bytes=v,
                regions=[RegionRecord(name="l0", call_index=0, start_seconds=0.0, forward_seconds=1.0,
                                      backward_seconds=2.0, storages=[StorageRecord(nbytes=100)])])
    try:
        plan = solve(p, budget_bytes=0)
        print(f"host_limit_bytes={v!r}: accepted, plan feasible={plan.feasible} counts={dict((k.name, n) for k, n in plan.counts().items())}")
        if isinstance(v, int) and v < 0:
            bad.append(f"host_limit_bytes={v} accepted")
    except Exception as e:  # noqa: BLE001
        print(f"host_limit_bytes={v!r}: {type(e).__name__}: {e}")
        if "host_limit" not in str(e):
            bad.append(f"host_limit_bytes={v!r}: {type(e).__name__} without the field's name")
if bad:
    print("VIOLATION:", "; ".join(bad))
    sys.exit(1)
print("ok")
