"""Probe: where does the ~5.5-6 KB per step of RSS growth under every mode come from
(plain: ~0.3 KB/step; out_long2000_*.txt)? Runs the GPT of soak.py (fixed (2, 32)
batches, AdamW) under MODE for STEPS steps with tracemalloc on, and compares Python
allocations between step WARM and the end, grouped by allocation site; prints the deep
size of one StepRecord in rt.report().steps (sys.getsizeof over its referents) and
the total allocated per step by offrecomp files.

cd /work/main && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python /tmp/sweep_soak/probe_rss_growth.py [MODE] [STEPS]
"""

import gc
import sys
import tracemalloc

sys.path.insert(0, "/work/main")
import psutil
import torch

import offrecomp
from tests import models

MODE = sys.argv[1] if len(sys.argv) > 1 else "keep"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 600
WARM = 100
torch.set_num_threads(1)


def deep_size(o, seen=None):
    seen = set() if seen is None else seen
    if id(o) in seen or isinstance(o, type):
        return 0
    seen.add(id(o))
    n = sys.getsizeof(o)
    for r in gc.get_referents(o):
        if isinstance(r, type) or r.__class__.__name__ in ("module", "function"):
            continue
        n += deep_size(r, seen)
    return n


torch.manual_seed(0)
m = models.GPT(layers=3, h=32, heads=4, p=0.1)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
proc = psutil.Process()
rt = offrecomp.runtime(m, mode=MODE, min_bytes=0)
tracemalloc.start(12)
snap0 = None
with rt:
    for step in range(STEPS):
        torch.manual_seed(step)
        x = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(step))
        m(x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step + 1 == WARM:
            gc.collect()
            snap0 = tracemalloc.take_snapshot()
            rss0 = proc.memory_info().rss
            traced0 = tracemalloc.get_traced_memory()[0]
    gc.collect()
    snap1 = tracemalloc.take_snapshot()
    rss1 = proc.memory_info().rss
    traced1 = tracemalloc.get_traced_memory()[0]
n = STEPS - WARM
print(f"mode={MODE} steps {WARM}..{STEPS}: RSS +{(rss1 - rss0) / n:.0f} B/step, "
      f"tracemalloc traced +{(traced1 - traced0) / n:.0f} B/step")
stats = snap1.compare_to(snap0, "traceback")
print("top growing allocation sites (B/step, count/step), innermost frames last:")
for st in stats[:8]:
    if st.size_diff <= 0:
        break
    print(f"  +{st.size_diff / n:.0f} B/step, +{st.count_diff / n:.2f} blocks/step")
    for fr in st.traceback.format()[-12:]:
        print("     ", fr.strip()[:160])
steps = rt.report().steps
rec = steps[-1]
print(f"records held: {len(steps)}; deep size of the last StepRecord: {deep_size(rec)} B")
big = sorted(((deep_size(v), k) for k, v in vars(rec).items()), reverse=True)[:6]
print("  largest fields:", big)
