"""I-BERT (transformers' tiny sweep configuration) under CPU bf16 autocast, auto at half
keep's peak: the allocator's peak of a planned step against a plain step's, and the
plan's books.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-06l/ibert_bf16_peak.py REPO_ROOT
"""
import sys

import torch

root = sys.argv[1]
sys.path.insert(0, root); sys.path.insert(0, root + "/docs/results/cpu-2026-12-05f")
sys.argv = ["x", "ibert", "auto_tight", "--bf16"]
import hf_auto_sweep as H
import offrecomp
from tests.helpers import tight_budget, variant_runtime
from tests.offrecomp.test_memory import allocator_peak
cands = H.candidates(); k, c = cands["ibert"]
torch.manual_seed(0)
model = H.build("ibert", k, c).train()
batch = H.BATCHES.get(k, H._ids)
budget = tight_budget(model, batch)
def step(m, s):
    def f():
        out = m(batch(s))
        out.backward()
    return f
import copy
plain = copy.deepcopy(model)
for s in range(3): step(plain, s)()
print("plain peak", allocator_peak(step(plain, 3)))
rt = variant_runtime(model, "auto_tight", budget)
with rt:
    for s in range(5): step(model, s)()
    pk = allocator_peak(step(model, 5))
st = rt.report().steps[-1]
print("auto peak", pk, "booked", st.peak_activation_bytes, "predicted", st.predicted_peak_bytes, "recomputed", st.recomputed_bytes, "budget", budget)
