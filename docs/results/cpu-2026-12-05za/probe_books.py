"""Probe: the books (rt.report().steps) of every case under keep / recompute / offload /
auto (4 steps): last step's peak activation bytes, kept, recomputed, offloaded bytes,
replays, records count, phases. Flags: recompute peak above keep's, zero peaks, record
count != steps.
Command: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05za/probe_books.py [CASE,...|all]"""
import sys, copy, logging
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, sweep_autograd.py
import torch
import sweep_autograd as S
from tests.helpers import variant_runtime
logging.getLogger("offrecomp").setLevel(logging.ERROR)
import warnings; warnings.simplefilter("ignore")
names = list(S.CASES) if len(sys.argv) < 2 or sys.argv[1] == "all" else sys.argv[1].split(",")
for name in names:
    factory, loop, _ = S.CASES[name]
    torch.manual_seed(0)
    m = factory().train()
    row = {}
    for v in ["keep", "recompute", "offload", "auto"]:
        mm = copy.deepcopy(m)
        rt = variant_runtime(mm, v)
        try:
            loop(mm, rt, 4)
        except Exception as e:
            row[v] = f"raised {type(e).__name__}"
            continue
        recs = rt.report().steps
        r = recs[-1] if recs else None
        row[v] = (len(recs), r.peak_activation_bytes, r.kept_bytes, r.recomputed_bytes, r.offloaded_bytes, r.replays, r.passes) if r else (0,)
    flags = []
    k, rc = row.get("keep"), row.get("recompute")
    if isinstance(k, tuple) and isinstance(rc, tuple) and len(k) > 1 and len(rc) > 1:
        if rc[1] > k[1]:
            flags.append(f"recompute peak {rc[1]} > keep {k[1]}")
        if k[1] == 0:
            flags.append("keep peak 0")
    for v, t in row.items():
        if isinstance(t, tuple) and t[0] != 4:
            flags.append(f"{v}: {t[0]} records")
    print(f"{name:26s} " + "  ".join(f"{v}={t}" for v, t in row.items()) + (f"  FLAG {flags}" if flags else ""), flush=True)
