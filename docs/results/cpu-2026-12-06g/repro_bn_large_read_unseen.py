"""BatchNorm evaluated, then trained, before one backward of both (reliability.md: 'a
small buffer written after the forward that read it replays with the forward's values, a
larger one raises'). With 20000 features (running stats 80 KB > READ_SNAPSHOT_MAX_BYTES =
64 KiB) the CPU BatchNorm kernel's unseen write is not detected: the eval call's replay
silently runs on the train call's updated statistics -> gradients differ from a plain run,
with no error. Exit 1 while the defect exists."""
import sys, copy
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import offrecomp

C = 20000  # 80 KB statistics; 16000 (64 000 B) passes
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.bn = nn.BatchNorm1d(C); s.scale = nn.Parameter(torch.ones(C))
    def forward(s, x): return x + torch.tanh(s.bn(x * s.scale))
class M(nn.Module):
    def __init__(s):
        super().__init__(); s.blocks = nn.ModuleList([Block() for _ in range(2)])
    def forward(s, x):
        for b in s.blocks: x = b(x)
        return x

def grads(model, x1, x2, rt_mode=None):
    def body():
        model.eval(); o1 = model(x1)        # reads running stats (eval)
        model.train(); o2 = model(x2)       # CPU kernel updates them, no version bump
        (o1.pow(2).mean() + o2.pow(2).mean()).backward()
    if rt_mode is None:
        body()
    else:
        with offrecomp.runtime(model, mode=rt_mode, min_bytes=0):
            body()
    return {n: p.grad.clone() for n, p in model.named_parameters()}

torch.manual_seed(0)
base = M()
g = torch.Generator().manual_seed(1)
x1, x2 = torch.randn(4, C, generator=g), torch.randn(4, C, generator=g)
ref = grads(copy.deepcopy(base), x1, x2)
bad = 0
for mode in ("keep", "recompute"):
    try:
        got = grads(copy.deepcopy(base), x1, x2, mode)
    except Exception as e:  # the documented behaviour for a large buffer: an error
        print(f"{mode}: raised {type(e).__name__}: {str(e)[:200]}")
        continue
    diff = {n: (ref[n] - got[n]).abs().max().item() for n in ref if not torch.equal(ref[n], got[n])}
    print(f"{mode}: gradients bitwise equal to plain: {not diff}" + (f"  max diffs {diff}" if diff else ""))
    bad += bool(diff)
print("DEFECT PRESENT (silent wrong gradients)" if bad else "OK")
sys.exit(1 if bad else 0)
