"""Probe: is the ~5.5-6 KB/step RSS growth seen under every mode (out_long2000_*.txt) the
report's step records (rt.report() keeps the last REPORT_MAX_STEPS = 10,000, "about 2 KB
each" per docs/tuning.md), or something else? Runs the GPT of soak.py, fixed (2, 32)
batches, AdamW, STEPS steps under MODE, with offrecomp.lifecycle.REPORT_MAX_STEPS set to
CAP before the runtime is made (CAP=0: left at 10,000), or PLAIN=plain (no runtime), and
prints RSS every 250 steps and the slope from step 500 to the end. No tracemalloc.

cd /work/main && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python /tmp/sweep_soak/probe_rss_report_cap.py MODE CAP [STEPS]
"""

import gc
import sys

sys.path.insert(0, "/work/main")
import psutil
import torch

import offrecomp
import offrecomp.lifecycle as lifecycle
from tests import models

MODE, CAP = sys.argv[1], int(sys.argv[2])
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
torch.set_num_threads(1)
if CAP:
    lifecycle.REPORT_MAX_STEPS = CAP
torch.manual_seed(0)
m = models.GPT(layers=3, h=32, heads=4, p=0.1)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
proc = psutil.Process()
rt = offrecomp.runtime(m, mode=MODE, min_bytes=0) if MODE != "plain" else None
rss = {}
if rt is not None:
    rt.__enter__()
for step in range(STEPS):
    torch.manual_seed(step)
    x = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(step))
    m(x).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if (step + 1) % 250 == 0:
        gc.collect()
        rss[step + 1] = proc.memory_info().rss
if rt is not None:
    rt.__exit__(None, None, None)
held = len(rt.report().steps) if rt is not None else 0
print(f"mode={MODE} cap={CAP or 'default'} records held={held}")
print("RSS KiB every 250 steps:", [v // 1024 for v in rss.values()])
print(f"slope step 500..{STEPS}: {(rss[STEPS] - rss[500]) / (STEPS - 500):.0f} B/step")
