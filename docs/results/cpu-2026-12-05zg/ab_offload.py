"""The offload loop of benchmarks/bench_host_overhead.py alone (16 saves per region), in
the tree at ROOT: median of 5 thread-clock timings of 60 steps, per saved tensor over
plain. Run it for two trees alternately:

    cd REPO && git worktree add /tmp/before a55d556
    cd REPO && for i in 1 2 3; do for t in /tmp/before .; do OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zg/ab_offload.py $t; done; done
"""
import sys, time
root = sys.argv[1]
sys.path.insert(0, root)
import torch
import offrecomp
from benchmarks.bench_host_overhead import _Model
torch.manual_seed(0)
m = _Model(200, blocks=200 // 16)
x = torch.randn(16)
rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
plain = _Model(200, blocks=200 // 16)
def tstep(fn, n=60):
    best = []
    for _ in range(5):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        best.append((time.thread_time() - t0) / n)
    best.sort()
    return best[len(best) // 2]
def off():
    m(x).backward()
def pl():
    plain(x).backward()
with rt:
    for _ in range(30):
        off()
    o = tstep(off)
p = tstep(pl)
print(f"{root}: offload over plain per save {(o - p) / 201 * 1e6:.2f} us")
