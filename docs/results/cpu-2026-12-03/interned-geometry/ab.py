"""Offload against plain, interleaved in one process, with the collector's work counted.

    ROOT=<tree> [OPS=200] [RS=16] [ROUNDS=15] [MODE=offload] [FREEZE=1] python ab.py

The host-overhead model (``OPS`` tanh ops, every output saved, regions of ``RS`` saves)
under ``offrecomp.runtime(mode=MODE, min_bytes=0)`` on the tree at ``ROOT``, against the
same model plainly: rounds of 20 steps each, alternated, on the main thread's CPU clock.
Prints the median per-save time over plain, the fastest round's, the median time in
collections per step and the collections per step by generation. ``FREEZE=1`` calls
``gc.freeze()`` after the warm-up.
"""
import gc
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = os.environ.get('ROOT', str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, ROOT)
import torch, offrecomp
from benchmarks.bench_host_overhead import _Model
assert offrecomp.__file__.startswith(ROOT), offrecomp.__file__
torch.manual_seed(0)
OPS = int(os.environ.get("OPS", "200")); RS = int(os.environ.get('RS', '16'))
m = _Model(OPS, blocks=OPS // RS); p = _Model(OPS, blocks=OPS // RS); x = torch.randn(16)
rt = offrecomp.runtime(m, mode=os.environ.get('MODE', 'offload'), min_bytes=0)
gct = [0.0]; st = [0.0]; ng = [0, 0, 0]
def cb(phase, info):
    if phase == 'start': st[0] = time.thread_time()
    else: gct[0] += time.thread_time() - st[0]; ng[info['generation']] += 1
gc.callbacks.append(cb)
def plain():
    for _ in range(20): p(x).backward()
def off():
    with rt:
        for _ in range(20): m(x).backward()
for _ in range(3): plain(); off()
if os.environ.get('FREEZE'): gc.collect(); gc.freeze()
P, O, G = [], [], []
ng[:] = [0, 0, 0]
for r in range(int(os.environ.get('ROUNDS', '15'))):
    t0 = time.thread_time(); plain(); P.append(time.thread_time() - t0)
    g0 = gct[0]; t0 = time.thread_time(); off(); O.append(time.thread_time() - t0); G.append(gct[0] - g0)
mp, mo = statistics.median(P) / 20, statistics.median(O) / 20
print(f"{os.path.basename(ROOT)}: plain {mp*1e3:.3f} ms/step, over plain {(mo-mp)/(OPS+1)*1e6:.2f} us/save, min-round {(min(O)-min(P))/20/(OPS+1)*1e6:.2f}, gc {statistics.median(G)/20*1e6:.0f} us/step, collections per step {[round(n / (20 * len(O)), 2) for n in ng]}")
