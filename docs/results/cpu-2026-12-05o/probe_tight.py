"""Per-step books of auto under half keep's peak, for models whose infeasible-budget warning
names a 'smallest feasible budget' below the plan's own predicted/booked peak."""
import sys
from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parent)); sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import common  # noqa: F401  (logging handler)
import copy, torch
from tests.helpers import tight_budget, variant_runtime, train
import tabular_sweep, kan_sweep
Z = {**tabular_sweep.Z, **kan_sweep.Z}
for name in sys.argv[1].split(","):
    f, b = Z[name][:2]
    for v in ("recompute", "auto_tight"):
        torch.manual_seed(0); m = f().train()
        budget = tight_budget(m, b)
        rt = variant_runtime(copy.deepcopy(m), v, budget)
        mm = rt.model if hasattr(rt, "model") else None
    # rebuild properly: train on the runtime's model
        torch.manual_seed(0); m = f().train()
        rt = variant_runtime(m, v, budget)
        train(m, b, rt, steps=6)
        print(f"== {name} {v} budget={budget}")
        for s in rt.report().steps:
            print(f"  step {s.step} {s.phase:9} peak={s.peak_activation_bytes} pred={s.predicted_peak_bytes} kept={s.kept_bytes} rec={s.recomputed_bytes} in={s.input_bytes} storages={s.storages}")
        if v == "auto_tight":
            print(rt.explain())
