"""Two planned steps whose allocator peak lies in a forward, as what auto's plan holds
against its budget (run from the repository root: PYTHONPATH=. python THIS).

late: six blocks, each making an outer product no op saves after its twelve sines
  (NOTE [Forward transients]); budget = a plain step's saves + half the product.
casts: six Linear(256, 256) on 16 rows under bf16 autocast, whose weights' casts are
  most of what the blocks save and which autocast's cache holds until it exits;
  budget = 0.7 of a plain step's saves.

Prints the allocator's peak (for casts less what a plain step holds at its peak beyond
its saves), the books and the prediction, each over the budget."""
import copy

import torch
from torch import nn

import offrecomp
from tests.offrecomp.test_memory import allocator_peak

ROWS, D, PAIRS = 32, 64, 40


class Late(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        h = self.lin(x)
        for _ in range(12):
            h = torch.sin(h)
        c = h.detach()
        g = (c.unsqueeze(-1) * c[:, :PAIRS].unsqueeze(-2)).sum(-1)
        return h * torch.sigmoid(g)


class Cast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4 * D, 4 * D)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Chain(nn.Module):
    def __init__(self, block, bf16: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(block() for _ in range(6))
        self.bf16 = bf16

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.float().square().sum()


def step(model, x, bf16):
    def run():
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x)
        loss.backward()
    return run


def warm(model):
    m = copy.deepcopy(model)
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    return m


def plain_saved(model, x, bf16):
    seen = {}

    def pack(t):
        if not isinstance(t, nn.Parameter) and not isinstance(t._base, nn.Parameter):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(warm(model), x, bf16)()
    return sum(seen.values())


for name, block, bf16, rows in (("late", Late, False, ROWS), ("casts", Cast, True, 16)):
    torch.manual_seed(0)
    model = Chain(block, bf16)
    x = torch.randn(rows, D if block is Late else 4 * D, generator=torch.Generator().manual_seed(0))
    saved = plain_saved(model, x, bf16)
    budget = saved + ROWS * D * PAIRS * 4 // 2 if name == "late" else int(0.7 * saved)
    overhead = 0
    if name == "casts":
        plain = warm(model)
        for _ in range(3):
            step(plain, x, bf16)()
        overhead = allocator_peak(step(plain, x, bf16)) - saved
    m = warm(model)
    with offrecomp.runtime(m, mode="auto", budget=budget, min_bytes=0, drift=100.0) as rt:
        for _ in range(5):
            step(m, x, bf16)()
        peak = allocator_peak(step(m, x, bf16)) - overhead
    s = rt.report().steps[-1]
    print(f"{name}: budget {budget} allocator {peak} ({peak / budget:.3f}x) books {s.peak_activation_bytes} "
          f"({s.peak_activation_bytes / budget:.3f}x) predicted {s.predicted_peak_bytes} "
          f"({s.predicted_peak_bytes / budget:.3f}x) replays {s.replays}")
