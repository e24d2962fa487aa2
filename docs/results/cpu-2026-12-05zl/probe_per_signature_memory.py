"""Probe: what does offrecomp keep per never-seen input signature (probe_many_shapes.py:
RSS grows ~35 KB per new shape under recompute until the 1,024-signature tables are full)?
Runs the GPT of soak.py under MODE with a new (b, t) every step (as probe_many_shapes.py),
report records capped at 50, tracemalloc on from step 100 to STEPS; prints the growing
allocation sites (bytes per step, i.e. per new signature). No plain run.

cd /work/main && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python /tmp/sweep_soak/probe_per_signature_memory.py MODE [STEPS]
"""
import gc
import sys
import tracemalloc

sys.path.insert(0, "/work/main")
import psutil
import torch

import offrecomp
import offrecomp.lifecycle as lifecycle
from tests import models

MODE = sys.argv[1]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 400
torch.set_num_threads(1)
lifecycle.REPORT_MAX_STEPS = 50
grid = [(b, t) for b in range(1, 41) for t in range(8, 48)]
perm = torch.randperm(len(grid), generator=torch.Generator().manual_seed(3)).tolist()
SHAPES = [grid[i] for i in perm]
torch.manual_seed(0)
m = models.GPT(layers=3, h=32, heads=4, p=0.1)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
proc = psutil.Process()
rt = offrecomp.runtime(m, mode=MODE, min_bytes=0)
with rt:
    for step in range(STEPS):
        torch.manual_seed(step)
        b, t = SHAPES[step]
        m(torch.randint(0, 64, (b, t), generator=torch.Generator().manual_seed(step))).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step + 1 == 100:
            gc.collect()
            tracemalloc.start(10)
            s0 = tracemalloc.take_snapshot()
            rss0 = proc.memory_info().rss
    gc.collect()
    s1 = tracemalloc.take_snapshot()
    rss1 = proc.memory_info().rss
n = STEPS - 100
print(f"mode={MODE}: RSS +{(rss1 - rss0) / n:.0f} B per step (each step a new signature), "
      f"traced +{sum(s.size_diff for s in s1.compare_to(s0, 'filename')) / n:.0f} B/step")
for st in s1.compare_to(s0, "traceback")[:6]:
    if st.size_diff <= 0:
        break
    print(f"  +{st.size_diff / n:.0f} B/step, +{st.count_diff / n:.2f} blocks/step")
    for fr in st.traceback.format()[-8:]:
        print("     ", fr.strip()[:150])
