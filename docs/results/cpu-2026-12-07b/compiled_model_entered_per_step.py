"""A model compiled whole (torch.compile(model)) and its runtime entered per step, 12
steps: graphs dynamo made, and the first step whose gradients differ from the plain
compiled model's.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-07b/compiled_model_entered_per_step.py MODE BACKEND

MODE: recompute, auto, offload or keep; BACKEND: aot_eager or inductor.
"""

import copy
import sys
from pathlib import Path

import torch
from torch import nn
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import offrecomp


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def train(m: nn.Module, rt: offrecomp.Runtime | None) -> list[list[torch.Tensor]]:
    opt, out = torch.optim.SGD(m.parameters(), lr=0.1), []
    for s in range(12):
        with rt if rt is not None else torch.enable_grad():  # entered per step
            m(torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(s))).backward()
        out.append([p.grad.clone() for p in m.parameters()])
        opt.step()
        opt.zero_grad()
    return out


if __name__ == "__main__":
    mode, backend = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    base = Net()
    ref = train(torch.compile(copy.deepcopy(base), backend=backend), None)
    print("plain graphs:", counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    counters.clear()
    m = torch.compile(copy.deepcopy(base), backend=backend)
    got = train(m, offrecomp.runtime(m, mode=mode))
    print("offrecomp graphs:", counters["stats"]["unique_graphs"])
    first = next((i for i, (a, b) in enumerate(zip(ref, got)) if not all(torch.equal(x, y) for x, y in zip(a, b))), None)
    print("first differing step:", first)
