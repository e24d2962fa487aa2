"""Repro: a block calling a function compiled with backend="inductor" (the pattern of
test_compile.py::test_a_compiled_function_inside_a_block_stays_compiled, there only with
aot_eager) is never recomputed under mode="recompute" (nor dropped by auto): the first
call's watch reports that the region "writes in place a tensor that it neither owns nor
takes as an argument", and from then on the region is kept. The compiled function writes
nothing foreign: inductor's CPU code allocates its buffers with
torch._C._dynamo.guards._empty_strided_cpu (no dispatch, so the watch never sees them
made) and fills them with extern kernels called with out= (addmm/bmm), which the watch
reads as writes to tensors from outside the call. Elementwise-only compiled functions
(no extern kernel) and aot_eager are recomputed. Gradients stay bitwise equal to plain.

Run: cd /tmp/sweep_compile && OMP_NUM_THREADS=1 TORCHINDUCTOR_CACHE_DIR=/tmp/sweep_compile/inductor_cache \
     /work/main/.venv/bin/python repro_inductor_fn_in_block.py
Exits 1 while the defect exists."""
import copy
import logging
import os
import sys
import warnings

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/sweep_compile/inductor_cache")
sys.path.insert(0, "/work/main")
warnings.filterwarnings("ignore")
import torch
import torch.nn.functional as F
import offrecomp
from tests import models

torch.set_num_threads(1)
msgs = []


class H(logging.Handler):
    def emit(self, r):
        msgs.append(r.getMessage())


logging.getLogger("offrecomp").addHandler(H())


def mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def elementwise(x, w1, b1, w2, b2):
    return torch.tanh(x) * torch.sigmoid(x + b2)


class Blk(torch.nn.Module):
    def __init__(self, fn, h=32):
        super().__init__()
        self.fn = fn
        self.ln = torch.nn.LayerNorm(h)
        self.fc1 = torch.nn.Linear(h, 4 * h)
        self.fc2 = torch.nn.Linear(4 * h, h)

    def forward(self, x):
        y = self.ln(x)
        return x + self.fn(y, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias) * y


def run(fn, backend, mode):
    torch._dynamo.reset()
    msgs.clear()
    torch.manual_seed(0)
    c = torch.compile(fn, backend=backend) if backend else fn
    m = models.Stack([Blk(c) for _ in range(2)])
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0) if mode else None
    grads = []
    with rt if rt is not None else torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x):
        for s in range(3):
            m(torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(s))).backward()
            grads.append([p.grad.clone() for p in m.parameters() if p.grad is not None])
            for p in m.parameters():
                p.grad = None
    return grads, rt


bad = False
for name, fn in (("mlp (linear, gelu, linear)", mlp), ("elementwise only", elementwise)):
    for backend in ("aot_eager", "inductor"):
        ref, _ = run(fn, backend, None)
        got, rt = run(fn, backend, "recompute")
        same = all(torch.equal(a, b) for x, y in zip(ref, got) for a, b in zip(x, y))
        st = rt.report().steps
        recomputed = all(s.replays == 2 and s.recomputed_bytes > 0 for s in st)
        foreign = [w for w in msgs if "neither owns nor takes" in w]
        print(f"{name:27s} {backend:9s} recompute: replays {[s.replays for s in st]} recomputed bytes "
              f"{[s.recomputed_bytes for s in st]} bitwise={same} foreign-write warning={bool(foreign)}")
        bad |= not recomputed or not same
print("DEFECT: an inductor-compiled function in a block makes the block 'write foreign state': never recomputed"
      if bad else "ok")
sys.exit(1 if bad else 0)
