"""Many distinct lengths cycling under auto (plan cache), and offloading with varying
lengths over 30 steps (CPU sweep zj; the model and harness of sweep_zj.py).

  cycle20_up       20 lengths 40, 50, ..., 230 in ascending order, cycled 6 times (120
                   steps, batch 1), auto and auto_tight (half keep's largest books),
                   default plan cache (8) and plan_cache_size=32
  cycle20_shuf     the same 20 lengths in a fixed shuffled order, cycled 6 times
  offload_varlen   lengths cycling 64, 128, 96, 160, 80 over 30 steps (batch 2):
                   mode="offload", and mode="keep" with
                   rt.set_plan(Plan(default=Placement.OFFLOAD)); per step d2h_bytes ==
                   h2d_bytes > 0, pool_reserved_bytes not growing after the longest
                   length's first step, each length's d2h the same every time it comes
Every run is compared bitwise (grads, params, buffers, losses) with a plain run. Per
cycle: steps by phase, median host ms per step, step records' books against the budget.
Run (from the repository root):
  OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zj/cycle_zj.py cycle|offload
"""

from __future__ import annotations

import collections
import copy
import os
import random
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.getcwd())
import offrecomp  # noqa: E402
from sweep_zj import LM, diff, simple, train  # noqa: E402

LENS = list(range(40, 231, 10))
SHUF = LENS[:]
random.Random(3).shuffle(SHUF)


def cycle(order, label):
    seq = order * 6
    fn = simple(seq, B=1)
    torch.manual_seed(0)
    base = LM(2)
    ref, _, plain_host = train(copy.deepcopy(base), fn, len(seq), alloc=False)
    m = copy.deepcopy(base)
    keep = offrecomp.runtime(m, mode="keep", min_bytes=0)
    train(m, fn, len(seq), keep, alloc=False)
    budget = max(r.peak_activation_bytes for r in keep.report().steps) // 2
    print(f"== {label}: {len(order)} lengths x 6 cycles; budget {budget}; plain host ms/step median "
          f"{statistics.median(plain_host) * 1e3:.0f}")
    fails = 0
    for name, kw in (("auto", {}), ("auto_tight", {"budget": budget}),
                     ("auto_cache32", {"plan_cache_size": 32}),
                     ("auto_tight_cache32", {"budget": budget, "plan_cache_size": 32})):
        m = copy.deepcopy(base)
        rt = offrecomp.runtime(m, mode="auto", min_bytes=0, **kw)
        got, _, host = train(m, fn, len(seq), rt, alloc=False)
        bad = diff(ref, got)
        recs = rt.report().steps
        n = len(order)
        print(f"  {name}: bitwise {'yes' if not bad else 'NO ' + str(bad[:3])}, records {len(recs)}")
        for c in range(6):
            ph = collections.Counter(r.phase for r in recs[c * n:(c + 1) * n])
            hs = host[c * n:(c + 1) * n]
            line = f"    cycle {c}: {dict(ph)}; host ms median {statistics.median(hs) * 1e3:.0f} max {max(hs) * 1e3:.0f}"
            if "budget" in kw:
                over = [(seq[c * n + i], r.phase, round(r.peak_activation_bytes / budget, 2))
                        for i, r in enumerate(recs[c * n:(c + 1) * n]) if r.peak_activation_bytes > budget]
                line += f"; over budget: {over}"
            print(line)
        print("    phases by step: " + " ".join(f"{L}:{r.phase[:4]}" for L, r in zip(seq, recs)))
        fails += bool(bad)
    return fails


def offload():
    seq = [64, 128, 96, 160, 80] * 6
    fn = simple(seq, B=2)
    torch.manual_seed(0)
    base = LM(3)
    ref, _, _ = train(copy.deepcopy(base), fn, len(seq), alloc=False)
    fails = 0
    for label in ("mode_offload", "user_plan_offload"):
        m = copy.deepcopy(base)
        if label == "mode_offload":
            rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
        else:
            rt = offrecomp.runtime(m, mode="keep", min_bytes=0)
            rt.set_plan(offrecomp.Plan(default=offrecomp.Placement.OFFLOAD))
        got, _, _ = train(m, fn, len(seq), rt, alloc=False)
        bad = diff(ref, got)
        recs = rt.report().steps
        probs = []
        if bad:
            probs.append(f"not bitwise: {bad[:3]}")
        by_len = collections.defaultdict(set)
        for i, (L, r) in enumerate(zip(seq, recs)):
            if r.d2h_bytes != r.h2d_bytes or r.d2h_bytes == 0:
                probs.append(f"s{i} L{L} d2h {r.d2h_bytes} h2d {r.h2d_bytes}")
            by_len[L].add((r.d2h_bytes, r.offloaded_bytes))
        for L, s in by_len.items():
            if len(s) > 1:
                probs.append(f"L{L}: (d2h, offloaded) differ between its steps: {sorted(s)}")
        first_max = seq.index(max(seq))
        pool = [r.pool_reserved_bytes for r in recs]
        if max(pool[first_max:]) > pool[first_max]:
            probs.append(f"pool grows after step {first_max}: {pool}")
        print(f"== offload_varlen {label}: {'PASS' if not probs else 'FAIL'}; records {len(recs)}")
        print("  phases " + " ".join(r.phase[:4] for r in recs))
        print("  d2h KiB " + " ".join(str(r.d2h_bytes >> 10) for r in recs))
        print("  h2d KiB " + " ".join(str(r.h2d_bytes >> 10) for r in recs))
        print("  offloaded KiB " + " ".join(str(r.offloaded_bytes >> 10) for r in recs))
        print("  books KiB " + " ".join(str(r.peak_activation_bytes >> 10) for r in recs))
        print("  pool reserved KiB " + " ".join(str(p >> 10) for p in pool))
        print("  pool high water KiB " + " ".join(str(r.pool_high_water_bytes >> 10) for r in recs))
        for p in probs[:8]:
            print("  " + p)
        fails += bool(probs)
    return fails


if __name__ == "__main__":
    torch.set_num_threads(1)
    what = sys.argv[1]
    f = 0
    if what == "cycle":
        f += cycle(LENS, "cycle20_up")
        f += cycle(SHUF, "cycle20_shuf")
    else:
        f += offload()
    print("FAILURES", f)
