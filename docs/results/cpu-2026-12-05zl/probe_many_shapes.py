"""Probe: a never-seen input shape at EVERY step, for many steps (a data loader with
jagged batch sizes and lengths, no bucketing). Do per-shape tables grow without bound?

Model: the GPT of soak.py (3 blocks, width 32), AdamW. Step s uses batch (b, t) from a
seeded permutation of the grid b in 1..40, t in 8..47 (1,600 distinct shapes; no shape
repeats within 1,600 steps). offrecomp.lifecycle.REPORT_MAX_STEPS is set to 50 so the
report's records (documented, bounded at 10,000) do not mask other growth. Every 100
steps: gc-tracked objects (after gc.collect), objects reachable from the Runtime (walk of
soak.py), RSS, and the sizes of offrecomp's module-level tables (handles.INTERNED_SHAPES /
INTERNED_STRIDES, arguments._SPECS, transfer._LAYOUTS, diagnostics._warned,
trace.ops._TRAITS) and of the runtime's per-signature tables. Losses compared bitwise
with a plain run of the same steps.

cd /work/main && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python /tmp/sweep_soak/probe_many_shapes.py MODE [STEPS]
"""

import gc
import sys

sys.path.insert(0, "/work/main")
sys.path.insert(0, "/tmp/sweep_soak")
import psutil
import torch

import offrecomp
import offrecomp.lifecycle as lifecycle
from offrecomp import arguments, diagnostics, handles, transfer
from offrecomp.trace import ops as trace_ops
from tests import models
from soak import walk

MODE = sys.argv[1]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 1200
torch.set_num_threads(1)
lifecycle.REPORT_MAX_STEPS = 50
grid = [(b, t) for b in range(1, 41) for t in range(8, 48)]
perm = torch.randperm(len(grid), generator=torch.Generator().manual_seed(3)).tolist()
SHAPES = [grid[i] for i in perm]


def batch(step):
    b, t = SHAPES[step % len(SHAPES)]
    return torch.randint(0, 64, (b, t), generator=torch.Generator().manual_seed(step))


def train(model, rt):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, rows = [], []
    proc = psutil.Process()
    if rt is not None:
        rt.__enter__()
    try:
        for step in range(STEPS):
            torch.manual_seed(step)
            loss = model(batch(step))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if rt is not None and (step + 1) % 100 == 0:
                gc.collect()
                sizes, n_obj, _, _ = walk(rt)
                tables = {
                    "INTERNED_SHAPES": len(handles.INTERNED_SHAPES),
                    "INTERNED_STRIDES": len(handles.INTERNED_STRIDES),
                    "_SPECS": len(arguments._SPECS),
                    "_LAYOUTS": len(transfer._LAYOUTS),
                    "_warned": len(diagnostics._warned),
                    "_TRAITS": len(trace_ops._TRAITS),
                }
                top = sorted(((v, k) for k, v in sizes.items() if not k.startswith("REPORT")), reverse=True)[:4]
                rows.append((step + 1, len(gc.get_objects()), n_obj, proc.memory_info().rss // 1024, tables, top))
    finally:
        if rt is not None:
            rt.__exit__(None, None, None)
    return losses, rows


torch.manual_seed(0)
base = models.GPT(layers=3, h=32, heads=4, p=0.1)
import copy

ref, _ = train(copy.deepcopy(base), None)
m = copy.deepcopy(base)
rt = offrecomp.runtime(m, mode=MODE, min_bytes=0)
got, rows = train(m, rt)
bad = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
print(f"mode={MODE} steps={STEPS}: loss mismatches {len(bad)} {bad[:5]}")
print("step gc_objects rt_objects rss_KiB module_tables top_rt_containers")
for r in rows:
    print(*r[:4], r[4])
    print("     ", r[5])
first, last = rows[1], rows[-1]
print(f"slopes step {first[0]}..{last[0]}: gc objects {(last[1]-first[1])/(last[0]-first[0]):.2f}/step, "
      f"rt objects {(last[2]-first[2])/(last[0]-first[0]):.2f}/step, RSS {(last[3]-first[3])*1024/(last[0]-first[0]):.0f} B/step")
if rt.report().steps:
    from collections import Counter
    print("phases of the last 50 records:", Counter(s.phase for s in rt.report().steps))
