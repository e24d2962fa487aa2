"""The step records' fallbacks and notes, and the warnings and log lines, of auto on
repro_lazy_cache_calibrate.py's lazily grown model (a probe of the cause).
Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zj/probe_lazy_notes.py"""
import copy, logging, os, sys, warnings
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.getcwd())
import offrecomp
from sweep_zj import LM, LAZY, simple, train
logging.basicConfig(level=logging.INFO, format="log %(name)s: %(message)s")
torch.set_num_threads(1)
torch.manual_seed(0)
m = LM(3, rope_buf=64)
rt = offrecomp.runtime(m, mode="auto", min_bytes=0)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    train(m, simple(LAZY), len(LAZY), rt, alloc=False)
for x in w:
    print("warning:", str(x.message)[:300])
for i, r in enumerate(rt.report().steps):
    print(i, LAZY[i], r.phase, r.replays, r.served_ops, r.rerun_ops, r.recomputed_bytes, dict(r.fallbacks), r.notes[:3])
