"""resnet_bn: keep's books against an independent count of the distinct storages saved
(non-parameter) in a plain step, native keep on and off, and with min_bytes=0.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/probe/p_resnet.py
"""
import sys, copy, torch
from pathlib import Path
from torch import nn
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # sweep.py, harness.py
import offrecomp  # noqa: E402
from sweep import ResNet, img_batch  # noqa: E402
torch.manual_seed(0); base = ResNet(); batch = img_batch(8, 3, 32)
# independent count: distinct storages saved (non-parameter)
seen = {}
def pack(t):
    if not isinstance(t, nn.Parameter) and not isinstance(t._base, nn.Parameter):
        s = t.untyped_storage(); seen[s.data_ptr()] = (s.nbytes(), tuple(t.shape), t.dtype)
    return t
m = copy.deepcopy(base)
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    loss = m(batch(0))
loss.backward()
print("independent distinct storages:", sum(v[0] for v in seen.values()), len(seen))
for nk in (True, False):
    m = copy.deepcopy(base)
    with offrecomp.runtime(m, mode="keep", native_keep=nk) as rt:
        for s in range(3):
            m(batch(s)).backward()
    print("keep native_keep=%s books" % nk, [r.peak_activation_bytes for r in rt.report().steps], "kept", [r.kept_bytes for r in rt.report().steps])
m = copy.deepcopy(base)
with offrecomp.runtime(m, mode="keep", min_bytes=0) as rt:
    m(batch(0)).backward()
print("keep min_bytes=0", rt.report().steps[0].peak_activation_bytes)
