"""offload mode on a model with lazy modules (nn.LazyLinear; PyG's ``in_channels=-1``):
the first forward raises ValueError where plain training runs.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05i/repro_lazy_offload.py

The first leaf saved under offload (here the input batch, saved by the first block's
linear) makes OffloadGroups._param_storages (offrecomp/groups.py) read
``untyped_storage()`` of every model parameter, among them the blocks' parameters not
materialised yet; an UninitializedParameter raises ValueError there, which the
``except (RuntimeError, NotImplementedError)`` does not catch.
"""

import copy

import torch
from torch import nn

import offrecomp


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.LazyLinear(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


def train(model: nn.Module, ctx=None) -> list[torch.Tensor]:
    grads = []
    with ctx if ctx is not None else torch.enable_grad():
        for step in range(2):
            torch.manual_seed(step)  # the lazy layers initialise at the first forward
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
            model(x).pow(2).mean().backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
            model.zero_grad(set_to_none=True)
    return grads


torch.manual_seed(0)
model = nn.Sequential(Block(), Block(), Block())
ref = train(copy.deepcopy(model))
print("plain: ok")
for mode in ("keep", "recompute", "offload"):
    m = copy.deepcopy(model)
    try:
        got = train(m, offrecomp.runtime(m, mode=mode, min_bytes=0))
        print(mode, "bitwise" if all(torch.equal(a, b) for a, b in zip(ref, got)) else "DIFFERS")
    except Exception as e:  # offload: ValueError: Attempted to use an uninitialized parameter ...
        print(mode, "raises", type(e).__name__, str(e)[:120])
