"""The offload variant of bench_host_overhead.py in a loop, to sample with py-spy:

    py-spy record -r 400 -f raw -o spy.txt -- python profile_loop.py
    python spy_summary.py spy.txt > spy_summary.txt

RS: saves per region (16); SECS: seconds to loop (25)."""

import gc
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import offrecomp
from benchmarks.bench_host_overhead import _Model

rs = int(os.environ.get("RS", "16"))
m, x = _Model(200, blocks=200 // rs), torch.randn(16)
rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
with rt:
    for _ in range(30):
        m(x).backward()
    gc.collect()
    gc.freeze()
    t0 = time.time()
    while time.time() - t0 < float(os.environ.get("SECS", "25")):
        m(x).backward()  # the loop line: samples below it count
