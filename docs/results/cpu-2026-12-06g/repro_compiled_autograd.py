"""Compiled autograd (torch._dynamo.compiled_autograd, as torchtitan enables it with
torch.compile) under the runtime: dynamo traces the runtime's saved-tensor unpack hook
and fails at its queue_callback call with "AssertionError: queue_callback() is only
supported when Compiled Autograd is enabled with fullgraph=True" (no offrecomp message;
compiled autograd is not mentioned in the docs). Gradients must equal the plain run's
under compiled autograd, or the runtime must refuse it with a clear error up front."""
import copy, sys, traceback, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
from torch._dynamo import compiled_autograd
import offrecomp



class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)

    def forward(self, x):
        return torch.tanh(self.a(x)) + x


torch.manual_seed(0)
model = nn.Sequential(*[Block() for _ in range(2)])
ref = copy.deepcopy(model)
x = torch.randn(4, 16)
with compiled_autograd._enable(torch.compile(backend="eager")):
    ref(x).sum().backward()
rc = 0
base = copy.deepcopy(model)
for mode in ["keep", "recompute"]:
    model = copy.deepcopy(base)
    t0 = time.time()
    try:
        with offrecomp.runtime(model, mode=mode, min_bytes=0):
            loss = model(x).sum()
            with compiled_autograd._enable(torch.compile(backend="eager")):
                loss.backward()
        ok = all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), model.parameters()))
        print(mode, "gradients equal:", ok)
        rc |= 0 if ok else 1
    except Exception as e:
        traceback.print_exc(limit=3)
        print(f"DEFECT ({mode}, after {time.time() - t0:.0f}s):", type(e).__name__, str(e)[:300])
        rc = 1
sys.exit(rc)
