"""The re-plans of 160 steps of test_drift.py's model under auto at half keep's peak when
every other window of planned steps runs 60% under its prediction (the test's
``alternating`` check, printed): 10 before the latest six windows were remembered, 5 after.

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zn/alternating_windows.py
"""
import sys; sys.path.insert(0, "/work/main")
import logging, torch, offrecomp
from offrecomp.planning import drift
from tests.helpers import train
from tests.models import MLPBlock, stack
import tests.offrecomp.test_drift as T
check = drift.check_drift
windows = [0]
def alternating(entry, rec, tol):
    if rec.predicted_step_seconds:
        if not entry.drift_ratios:
            windows[0] += 1
        rec.step_seconds = rec.predicted_step_seconds * (0.4 if windows[0] % 2 else 1.0)
    check(entry, rec, tol)
drift.check_drift = alternating
torch.manual_seed(0)
m = stack(lambda: MLPBlock(32), n=3)()
rt = offrecomp.runtime(m, min_bytes=0, budget="50%")
train(m, T._batch, rt, steps=160)
print(sum("drift: re-plan" in s.notes for s in rt.report().steps))
