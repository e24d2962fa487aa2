"""The most frugal plan of auto (budget half of keep's peak, which no plan meets) on the
test models: its predicted peak against the peaks its planned steps book, with plain
replays (replay_op_us=1e5) and serving replays (replay_op_us=0). Run from the
repository root: OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-03/frees-before-replay/peaks.py"""
import sys
sys.path.insert(0, ".")
import offrecomp
from tests.helpers import make, tight_budget, train, twin
for case in ["cnn_batchnorm", "views_inplace", "shared_block", "gpt_dropout", "kwargs_tuple"]:
    model, batch = make(case)
    budget = tight_budget(model, batch) // 2
    for op_us in (1e5, 0.0):
        m = twin(model)
        rt = offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0, drift=100.0, replay_op_us=op_us)
        train(m, batch, rt, steps=5)
        e = rt.planner.last_entry
        print(case, op_us, "pred", e.plan.predicted_peak_bytes, "measured", sorted({s.peak_activation_bytes for s in rt.report().steps if s.phase == "planned"}))
