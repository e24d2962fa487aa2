"""Blocks alternating between two forms whose storages shift place (tests/offrecomp/
test_native_keep.py::_MidForms), 16 steps under auto: each step's phase initial and
booked peak over the budget. Run: python midforms.py TREE BUDGET[,BUDGET...]."""
import sys; sys.path.insert(0, sys.argv[1])
import torch, offrecomp
from tests import models
sys.path.insert(0, sys.argv[1])
import importlib.util
spec = importlib.util.spec_from_file_location("tnk", sys.argv[1] + "/tests/offrecomp/test_native_keep.py"); tnk = importlib.util.module_from_spec(spec); spec.loader.exec_module(tnk)
for budget in [int(b) for b in sys.argv[2].split(",")]:
    torch.manual_seed(0)
    m = models.Stack([tnk._MidForms(32) for _ in range(6)])
    with offrecomp.runtime(m, budget=budget) as rt:
        for step in range(16):
            for blk in m.blocks: blk.classic = bool(step % 2)
            m(torch.randn(256, 32, generator=torch.Generator().manual_seed(step))).backward(); m.zero_grad()
    print(budget, " ".join(f"{r.phase[0]}{r.peak_activation_bytes/budget:.2f}" for r in rt.report().steps))
