"""rt.__exit__ called on another thread than the one that entered it returns without error but
leaves the runtime's saved-tensor hook pair on the entering thread's stack: every later save there
goes through the dead runtime's pack (Python objects pile up step after step, plain steps slower),
and a new runtime warns of a foreign hook pair around it."""
import sys, gc, threading, copy, logging
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import offrecomp
logging.basicConfig(level=logging.ERROR)

class Block(nn.Module):
    def __init__(self, d):
        super().__init__(); self.ln = nn.LayerNorm(d); self.fc = nn.Linear(d, d)
    def forward(self, x): return x + torch.tanh(self.fc(self.ln(x)))
class Net(nn.Module):
    def __init__(self):
        super().__init__(); self.blocks = nn.ModuleList([Block(32) for _ in range(4)])
    def forward(self, x):
        for b in self.blocks: x = b(x)
        return x.pow(2).mean()

def steps(m, n):
    for _ in range(n):
        m(torch.randn(16, 32)).backward()

torch.manual_seed(0)
m = Net()
rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
rt.__enter__()
steps(m, 3)
err = []
def leave():
    try:
        rt.__exit__(None, None, None)
    except Exception as e:
        err.append(e)
t = threading.Thread(target=leave); t.start(); t.join()
print("exit on another thread raised:", [repr(e)[:200] for e in err])
stale = torch._C._autograd._top_saved_tensors_default_hooks(False)
print("saved-tensor hook pair left on the entering thread:", stale)
plain = Net()
gc.collect(); n0 = len(gc.get_objects())
steps(plain, 200)
gc.collect(); n1 = len(gc.get_objects())
print(f"gc-tracked objects across 200 plain steps after the exit: {n0} -> {n1} (+{n1 - n0})")
if err:
    print("OK: refused with an error"); sys.exit(0)
if stale is not None or n1 - n0 > 1000:
    print("DEFECT: runtime reported exited, but its hook pair stays on the entering thread and leaks")
    sys.exit(1)
sys.exit(0)
