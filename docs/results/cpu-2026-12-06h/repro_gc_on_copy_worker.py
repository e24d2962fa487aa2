"""A collection on an emulated copy worker during backward: no patching of offrecomp; only gc thresholds and a user
hook. Per step: graph A (never backpropagated) is made first; B is trained. While B's
backward runs, a tensor hook on B's block-0 input moves the last reference to A into a
fresh reference cycle (any cycle: a traceback, a closure). The next tracked
allocation is then likely the H2D worker's, inside
the copy job of A's prefetched group: the collection runs there. The hook sleeps 20 ms
after making the cycle (a hook doing I/O or waiting on a lock) so the main thread does
not allocate meanwhile.
Exit 1 on hang (faulthandler), 0 if fine."""
import faulthandler, gc, sys, time
import os
sys.path.insert(0, os.environ.get("OFFRECOMP_TREE", "."))
import torch
import torch.nn.functional as F
from torch import nn
import offrecomp

LIMIT = int(sys.argv[1]) if len(sys.argv) > 1 else 30
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 200
faulthandler.dump_traceback_later(LIMIT, exit=True)
torch.set_num_threads(1)

class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)
    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))

class Net(nn.Module):
    def __init__(self, h=64, n=3):
        super().__init__()
        self.blocks = nn.ModuleList(Block(h) for _ in range(n))
        self.bias = nn.Parameter(torch.zeros(h))
    def forward(self, x, hook=None):
        x = x + self.bias               # saves nothing
        if hook is not None:
            x.register_hook(hook)
        for b in self.blocks:
            x = b(x)
        return x.mean()

torch.manual_seed(0)
model = Net()
x = torch.randn(4, 256, 64)
import os
T0 = int(os.environ.get("GC0", "2"))
gc.set_threshold(T0, int(os.environ.get("GC1", "1")), int(os.environ.get("GC2", "1")))
box = {}
def hook(g):
    a = box.pop("a")            # the last plain reference to graph A ...
    cyc = [a]; cyc.append(cyc)  # ... now held only by a young cycle
    del a, cyc
    time.sleep(0.02)            # the main thread waits without allocating (I/O, a lock, a C call)
    return None

t_start = time.time()
with offrecomp.runtime(model, mode="offload", min_bytes=0) as rt:
    for step in range(STEPS):
        box["a"] = model(x)                      # graph A, dropped in B's backward
        loss = model(x + 1, hook=hook)           # graph B
        loss.backward()
        model.zero_grad(set_to_none=True)
        if step % int(os.environ.get("EVERY", "50")) == 0:
            e = rt.offload_engine
            print(f"step {step} t={time.time()-t_start:.1f}s live_groups={e.live_groups} "
                  f"pool_in_use={e.pool.stats().in_use_bytes}", flush=True)
print("OK, no hang in", STEPS, "steps")
