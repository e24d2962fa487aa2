"""A K-FAC-style hook on the layer inside each block keeps an input covariance factor in a
dict of its own, made on the layer's first call and updated in place at each later one;
the loop preconditions the weight gradients with it. Parameters after 12 steps, compared
bitwise with the plain run under recompute, auto (a budget no plan meets: the most frugal
plan) and offload.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-07b/kfac_hook_state.py
"""

import contextlib
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import offrecomp


class Blk(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def train(mode: str | None) -> torch.Tensor:
    torch.manual_seed(0)
    m = nn.Sequential(*[Blk() for _ in range(4)])
    stats: dict[nn.Module, torch.Tensor] = {}

    def save_input(mod: nn.Module, inp: tuple[torch.Tensor, ...]) -> None:
        a = inp[0].detach()
        if mod not in stats:
            stats[mod] = torch.eye(16)  # made on first use
        stats[mod].mul_(0.9).add_(a.t() @ a / a.shape[0], alpha=0.1)  # then updated in place

    for b in m:
        b.fc.register_forward_pre_hook(save_input)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    kw = {"budget": 1000} if mode == "auto" else {}
    ctx = offrecomp.runtime(m, mode=mode, min_bytes=0, **kw) if mode else contextlib.nullcontext()
    with ctx:
        for i in range(12):
            torch.manual_seed(100 + i)
            m(torch.randn(8, 16)).pow(2).mean().backward()
            with torch.no_grad():
                for b in m:
                    b.fc.weight.grad.copy_(b.fc.weight.grad @ torch.linalg.inv(stats[b.fc] + 0.1 * torch.eye(16)))
            opt.step()
            opt.zero_grad()
    return torch.cat([p.detach().flatten() for p in m.parameters()])


if __name__ == "__main__":
    ref = train(None)
    for mode in ("recompute", "auto", "offload"):
        got = train(mode)
        print(mode, "bitwise" if torch.equal(ref, got) else f"differs, max {float((ref - got).abs().max()):.4g}")
