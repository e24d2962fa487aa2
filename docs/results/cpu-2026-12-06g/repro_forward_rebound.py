"""A region whose instance `forward` is re-bound while the runtime is entered (a library
patching `block.forward = MethodType(fn, block)`, here the class forward itself, so the
computation is unchanged) silently stops being a region: mode="recompute" keeps all its
activations from then on, with no warning, and rt.explain() simply omits the region.
Exit 1 while that happens silently."""
import sys, types, logging, io
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import offrecomp
torch.set_num_threads(1)

class Block(nn.Module):
    def __init__(self):
        super().__init__(); self.fc1 = nn.Linear(32, 128); self.fc2 = nn.Linear(128, 32)
    def forward(self, x): return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))

class Net(nn.Module):
    def __init__(self):
        super().__init__(); self.blocks = nn.ModuleList(Block() for _ in range(4))
    def forward(self, x):
        for b in self.blocks: x = b(x)
        return x.square().mean()

torch.manual_seed(0); m = Net(); x = torch.randn(4, 64, 32)
log = io.StringIO(); h = logging.StreamHandler(log); logging.getLogger("offrecomp").addHandler(h)
with offrecomp.runtime(m, mode="recompute", min_bytes=0) as rt:
    for _ in range(2): m(x).backward()
    b = m.blocks[1]
    b.forward = types.MethodType(type(b).forward, b)   # same computation, rebound
    for _ in range(2): m(x).backward()
    peaks = [s.peak_activation_bytes for s in rt.report().steps]
    explain = rt.explain()
print("peak_activation_bytes per step:", peaks)
print("warnings:", log.getvalue().strip() or "(none)")
print("blocks.1 in explain():", "blocks.1" in explain)
grew = peaks[-1] > peaks[0] * 1.2
warned = "blocks.1" in log.getvalue()
if grew and not warned:
    print("DEFECT: region blocks.1 silently unmanaged after its forward was rebound "
          f"(recompute peak {peaks[0]} -> {peaks[-1]} bytes, no warning)")
    sys.exit(1)
print("ok"); sys.exit(0)
