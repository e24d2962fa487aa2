"""Plain training only (no offrecomp): timm selecsls42b (timm_sweep.py Z) trained 4 SGD steps
under CPU bf16 autocast, repeated; some runs give NaN in grad of head.2.0.weight (step 0).
    cd REPO && OMP_NUM_THREADS=1 PYTHONPATH=DIR .venv/bin/python docs/results/cpu-2026-12-05n/repro_selecsls_bf16_plain_nondeterminism.py [N] [--fp32]"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))
import copy, torch, timm
from torch import nn
from tests.helpers import train, _bits
import timm_sweep as T
bf16 = "--fp32" not in sys.argv
torch.manual_seed(0)
m = T.Z["selecsls"][0]()
model = (T.BF16Autocast(T.Cls(m)) if bf16 else T.Cls(m)).train()
b = T.img(32)
ref = train(copy.deepcopy(model), b, steps=4)
bad = 0
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 10):
    got = train(copy.deepcopy(model), b, steps=4)
    diffs = [(s, k) for s, (x, y) in enumerate(zip(ref, got)) for k in x if not torch.equal(_bits(x[k]), _bits(y[k]))]
    if diffs:
        bad += 1
        s, k = diffs[0]
        g = got[s][k]
        where = g.isnan().flatten(0, 1).any(0) if g.dim() == 4 else None
        print("  NaN taps (3x3, any channel):", where.int().tolist() if where is not None else "-", "| non-NaN values at non-centre taps nonzero:", (g[:, :, [0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 2, 0, 2, 0, 1, 2]].nan_to_num(0) != 0).sum().item() if g.dim() == 4 else "-")
        print(f"run {i}: {len(diffs)} entries differ, first step {s} {k}; nan in ref {ref[s][k].isnan().sum().item()} got {got[s][k].isnan().sum().item()}")
print("plain runs differing:", bad)
print("ref loss", [r["loss"].item() for r in ref])
