"""Probe (same root cause as repro_auto_calibrates_forever_forward_ad.py): a user TorchDispatchMode
around one of two forwards per step keeps auto calibrating for good.
Command: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05za/probe_dispatch_mode.py"""
import sys, copy, logging
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, sweep_autograd.py
import torch, warnings
warnings.simplefilter("ignore"); logging.getLogger("offrecomp").setLevel(logging.ERROR)
from torch.utils._python_dispatch import TorchDispatchMode
from common import Net, X
from tests.helpers import variant_runtime
class Pass(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))
torch.manual_seed(0); m = Net()
rt = variant_runtime(m, "auto")
with rt:
    for s in range(8):
        loss = (m(X(s)) ** 2).mean()
        with Pass():
            loss = loss + (m(X(s + 1)) ** 2).mean()
        loss.backward(); m.zero_grad()
print("dispatch mode around one of two forwards:", [str(r.phase.value) for r in rt.report().steps], [r.replays for r in rt.report().steps])
