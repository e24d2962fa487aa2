"""offrecomp region auto-detection: a model whose layers are an nn.ModuleList of
nn.ModuleDicts driven by the parent's forward (rtdl_revisiting_models.FTTransformerBackbone:
blocks[i]['attention'], blocks[i]['ffn'], ...) gets no regions at all ("has no repeated
blocks" warning; mode='recompute' recomputes nothing), while the same layout with
nn.ModuleList per layer (x-transformers) gets each layer's attention/ffn as regions."""
import sys
from pathlib import Path
import logging
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from torch import nn
import offrecomp

logging.basicConfig(level=logging.WARNING, format="LOG %(name)s: %(message).160s")


class Attn(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        a = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2), -1)
        return a @ self.v(x)


def layer(d, container):
    parts = dict(norm1=nn.LayerNorm(d), attention=Attn(d), norm2=nn.LayerNorm(d),
                 ffn=nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d)))
    return nn.ModuleDict(parts) if container == "dict" else nn.ModuleList(parts.values())


class Net(nn.Module):
    def __init__(self, container, d=16, n=3):
        super().__init__()
        self.container = container
        self.blocks = nn.ModuleList(layer(d, container) for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            n1, at, n2, ff = (b["norm1"], b["attention"], b["norm2"], b["ffn"]) if self.container == "dict" else b
            x = x + at(n1(x))
            x = x + ff(n2(x))
        return x.pow(2).mean()


for container in ("list", "dict"):
    torch.manual_seed(0)
    m = Net(container)
    with offrecomp.runtime(m, mode="recompute", min_bytes=0) as rt:
        for s in range(2):
            m(torch.randn(2, 5, 16)).backward()
    st = rt.report().steps[-1]
    print(f"layers as nn.Module{container.title()}: regions={[r for r in rt.regions]} recomputed_bytes={st.recomputed_bytes}")
