"""Byte counts past int64 are not rejected cleanly: three storages of 2**62 B (a total
of 1.4e19 B) simulate to a peak of 2**62 B (the int64 sum wrapped) and solve() calls a
2**62 B budget feasible while keeping all three; nbytes = 2**63 is accepted; nbytes =
2**64 fails with a bare AssertionError. Adversarial (no device holds 2**62 B), noted for
completeness. Where: scheduler/flat.py flatten / scheduler/checks.py int_array (int64
columns; `assert cols.nbytes is not None` after bad_storage finds nothing to name).
Exits 1 while any of this holds.
Run: cd REPO && NUMBA_CACHE_DIR=/tmp/numba OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05ze/repro_nbytes_int64.py
"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
from scheduler import Plan, Profile, RegionRecord, StorageRecord, simulate, solve


def prof(*sizes: int) -> Profile:
    return Profile(signature="s", forward_seconds=float(len(sizes)), regions=[
        RegionRecord(name=f"l{i}", call_index=0, start_seconds=float(i), forward_seconds=1.0, backward_seconds=2.0,
                     storages=[StorageRecord(nbytes=n, offset_seconds=1.0)]) for i, n in enumerate(sizes)])


bad = []
p = prof(2**62, 2**62, 2**62)
t = simulate(p, Plan())
print(f"3 x 2**62 B: activation_bytes={p.activation_bytes}, simulate(keep).peak_bytes={t.peak_bytes}")
if t.peak_bytes != p.activation_bytes:
    bad.append("int64 wrap of the peak")
plan = solve(p, budget_bytes=2**62)
print(f"solve(budget=2**62): feasible={plan.feasible} predicted_peak={plan.predicted_peak_bytes} counts={dict((k.name, n) for k, n in plan.counts().items())}")
if plan.feasible and plan.counts()[0] == 3:
    bad.append("keep-all plan called feasible under a budget a third of its bytes")
for n in (2**63, 2**64):
    try:
        t = simulate(prof(n), Plan())
        print(f"nbytes=2**{n.bit_length() - 1}: accepted, peak_bytes={t.peak_bytes}")
        bad.append(f"nbytes={n} accepted")
    except Exception as e:  # noqa: BLE001
        print(f"nbytes=2**{n.bit_length() - 1}: {type(e).__name__}: {e!r}")
        if not str(e):
            bad.append(f"nbytes={n}: {type(e).__name__} without a message")
if bad:
    print("VIOLATION:", "; ".join(bad))
    sys.exit(1)
print("ok")
