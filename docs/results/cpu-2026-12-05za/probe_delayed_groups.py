"""Probe: delayed_penalty under offload reports 6 offload groups held after the loop; they are the
last step's penalty graph the model keeps in m._pen (0 once it is deleted): not a leak.
Command: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05za/probe_delayed_groups.py"""
import sys, copy, gc, logging
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, sweep_autograd.py
import torch, warnings
warnings.simplefilter("ignore"); logging.getLogger("offrecomp").setLevel(logging.ERROR)
import sweep_autograd as S
from tests.helpers import variant_runtime
factory, loop, _ = S.CASES["delayed_penalty"]
torch.manual_seed(0); m = factory().train()
for steps in (2, 4, 8):
    mm = copy.deepcopy(m); rt = variant_runtime(mm, "offload")
    loop(mm, rt, steps); gc.collect()
    a = rt.offload_groups_held
    del mm._pen; gc.collect()
    print(steps, "held with _pen:", a, "after del _pen:", rt.offload_groups_held)
