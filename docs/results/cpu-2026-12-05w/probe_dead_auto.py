import sys, logging, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).resolve().parent))
import offrecomp
import repro_dead_branch as R
logging.basicConfig(level=logging.WARNING)
for dead in (False, True):
    torch.manual_seed(0); m = R.M(dead); x = torch.randn(256, R.D)
    with offrecomp.runtime(m, mode="auto", budget=1_350_000, min_bytes=0) as rt:
        for _ in range(6):
            m(x).backward()
    print("dead", dead, [(s.phase.value if hasattr(s.phase,'value') else s.phase, s.peak_activation_bytes, s.predicted_peak_bytes, s.recomputed_bytes) for s in rt.report().steps])
