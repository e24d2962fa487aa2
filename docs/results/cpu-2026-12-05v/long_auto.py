"""12-step auto_tight runs of the cases whose auto never planned in 4 steps; phases + logs (INFO too)."""
import sys, logging, copy
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
import sweep_v as S
from tests.helpers import check_variant, tight_budget, train, variant_runtime, assert_bitwise
class H(logging.Handler):
    def emit(self, r): print(f"    LOG {r.levelname} {r.getMessage()[:400]}")
h = H(logging.INFO); lg = logging.getLogger("offrecomp"); lg.addHandler(h); lg.setLevel(logging.INFO)
S.GRAB.setLevel(100)
names = sys.argv[1].split(",")
for n in names:
    print("==", n, flush=True)
    if n in S.F_CASES:
        fac, batch, kw = S.F_CASES[n]
        torch.manual_seed(0); m = fac().train()
        ref = train(copy.deepcopy(m), batch, steps=12)
        lg.setLevel(logging.WARNING)
        b = tight_budget(m, batch, **kw)
        lg.setLevel(logging.INFO)
        mm = copy.deepcopy(m); rt = variant_runtime(mm, "auto_tight", b, **kw)
        got = train(mm, batch, rt, steps=12)
    else:
        fac, step, kw = S.L_CASES[n]
        torch.manual_seed(0); m = fac().train()
        ref = S.run_loop(copy.deepcopy(m), step, 12)
        mm = copy.deepcopy(m); rt = variant_runtime(mm, "auto", None, **kw)
        got = S.run_loop(mm, step, 12, rt)
    try:
        assert_bitwise(ref, got); print("  bitwise OK")
    except AssertionError as e:
        print("  MISMATCH", str(e)[:300])
    print("  phases", "".join(r.phase[0] for r in rt.report().steps), "replays", [r.replays for r in rt.report().steps], flush=True)
