"""Jagged nested tensors saved inside regions are 'saved as they are' (never placed) and
also missing from the books: keep reports ~4% of what autograd holds, and recompute still
replays every block while holding every NJT save (reports 'recomputed')."""
import gc, sys, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from torch import nn
import offrecomp

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
H = 64

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(H), nn.Linear(H, H)
    def forward(self, x):
        return x + torch.tanh(self.fc(self.ln(x)))

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.values().square().mean()

def batch():
    g = torch.Generator().manual_seed(0)
    return torch.nested.nested_tensor([torch.randn(L, H, generator=g) for L in (30, 50, 20)], layout=torch.jagged)

def live_njt_bytes():
    gc.collect()
    return sum(o.values().nbytes for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_nested)

# what plain autograd saves (bytes of the saved tensors' storages; NJT: its values)
saved = []
def pack(t):
    saved.append(t.values().untyped_storage().nbytes() if t.is_nested else t.untyped_storage().nbytes())
    return t
torch.manual_seed(0); m = Model(); x = batch()
base = live_njt_bytes()
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    loss = m(x)
print(f"plain: {len(saved)} saves; NJT values held by the graph after forward: {live_njt_bytes() - base} bytes")
del loss, x

for mode in ("keep", "recompute"):
    torch.manual_seed(0); m = Model()
    with offrecomp.runtime(m, mode=mode, min_bytes=0) as rt:
        for _ in range(2):
            x = batch()
            base = live_njt_bytes()
            loss = m(x)
            live = live_njt_bytes() - base
            loss.backward()
    s = rt.report().steps[-1]
    print(f"{mode:9s}: peak_activation_bytes={s.peak_activation_bytes} kept={s.kept_bytes} "
          f"recomputed={s.recomputed_bytes} replays={s.replays} saved_tensors={s.saved_tensors}; "
          f"NJT values held after forward {live} bytes")
