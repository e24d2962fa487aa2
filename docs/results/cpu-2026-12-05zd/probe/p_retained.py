"""Memory a step leaves allocated after its backward and optimizer step (the next step's
window frees it), per step and phase, plain and auto on a case of sweep.py at a budget
in bytes.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/probe/p_retained.py <case> <budget bytes>
"""
import sys, copy, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # sweep.py, harness.py
import offrecomp  # noqa: E402
from sweep import CASES  # noqa: E402
case = CASES[sys.argv[1]]; frac = 0.3
def lowpeak(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = peak = low = 0
    for e in sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns()):
        if e.name() == "[memory]":
            cur += e.nbytes(); peak = max(peak, cur); low = min(low, cur)
    return low, peak, cur
for mode in ("plain", "auto"):
    torch.manual_seed(0); m = case.build(); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    rt = offrecomp.runtime(m, mode="auto", budget=int(sys.argv[2])) if mode == "auto" else None
    rows = []
    with rt if rt else torch.enable_grad():
        for s in range(5):
            torch.manual_seed(s)
            lo, pk, end = lowpeak(lambda: m(case.batch(10 * s)).backward())
            opt.step(); opt.zero_grad(set_to_none=False)
            rows.append((s, lo, pk, end))
    ph = [r.phase.value for r in rt.report().steps] if rt else ["-"] * 5
    for (s, lo, pk, end), p in zip(rows, ph):
        print(f"{mode} step {s} {p:9}: lowest {lo:>10} peak {pk:>10} left allocated at the end {end:>10}")
