"""Net allocations of collector-tracked objects per saved tensor in one forward.

    ROOT=<tree> python tracked_allocations.py offload|recompute [start_delay_s]

The collector runs a generation-0 collection whenever the tracked objects allocated
since the last one, less those freed, pass 700; this counts that figure over one warm
forward (collections off), divided by the saves. The emulated backend's workers start a
copy after ``start_delay_s`` (default: never, so every source is alive at the end of
the forward).
"""
import gc
import os
import sys
from pathlib import Path

ROOT = os.environ.get('ROOT', str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

import offrecomp  # noqa: E402

assert offrecomp.__file__.startswith(ROOT), offrecomp.__file__
from benchmarks.bench_host_overhead import _Model
from offrecomp import backends
backends.START_DELAY_S = float(sys.argv[2]) if len(sys.argv) > 2 else 3600.0
torch.manual_seed(0)
m = _Model(200, blocks=200//16); x = torch.randn(16)
rt = offrecomp.runtime(m, mode=sys.argv[1], min_bytes=0)
with rt:
    for _ in range(30): m(x).backward()
    gc.collect(); gc.disable()
    c = []
    for _ in range(5):
        gc.collect(); c0 = gc.get_count()[0]; y = m(x); c.append(gc.get_count()[0] - c0); y.backward()
    print(sys.argv[1], 'net tracked allocations per forward per save', [round(v/201, 2) for v in c])
    gc.enable()
