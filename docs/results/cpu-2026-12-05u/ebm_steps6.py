import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_u as S
for n in ("ebm_langevin",):
    S.L_CASES[n].steps = 6
sys.exit(S.main())
