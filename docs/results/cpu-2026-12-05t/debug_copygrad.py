import sys, copy
from pathlib import Path
sys.argv = ["x"]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_t as S
from tests.helpers import variant_runtime
import torch
for name in ["dqn_copygrad", "dqn_gradtarget"]:
    case = S.CASES[name]
    torch.manual_seed(0)
    model = case.make().train()
    probe = copy.deepcopy(model)
    keep = variant_runtime(probe, "keep")
    S.run_loop(case, probe, 1, keep)
    budget = max(r.peak_activation_bytes for r in keep.report().steps) // 2
    m = copy.deepcopy(model)
    rt = variant_runtime(m, "auto_tight", budget)
    S.CAP.msgs.clear()
    S.run_loop(case, m, 6, rt)
    print(name, "budget", budget)
    for r in rt.report().steps:
        print("  ", r.step, r.phase, "peak", r.peak_activation_bytes, "kept", r.kept_bytes, "recomp", r.recomputed_bytes, "inp", r.input_bytes, "replays", r.replays)
    for msg in S.CAP.msgs:
        print("   WARN", msg[:300])
