"""A 4-block GPT whose block 1 runs 6 extra elementwise ops (each output saved), under
auto at a budget of 617 KiB: the peak each run's plan holds, three fresh runs, and the
most frugal peak ``offrecomp plan`` finds on the profile one such run saved.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-07i/frugal_floor.py
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from scheduler import Profile, solve

BUDGET = 631_938
VOCAB = 64


class Block(nn.Module):
    def __init__(self, h: int = 32, heads: int = 4, extra: int = 0) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.heads, self.extra = heads, extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + F.dropout(self.proj(a), 0.1, self.training)
        hdn = F.gelu(self.fc1(self.ln2(x)))
        for _ in range(self.extra):
            hdn = torch.tanh(hdn) * 0.5 + hdn * 0.5
        return x + F.dropout(self.fc2(hdn), 0.1, self.training)


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, 32), nn.Embedding(128, 32)
        self.blocks = nn.ModuleList(Block(extra=6 if i == 1 else 0) for i in range(4))
        self.ln, self.head = nn.LayerNorm(32), nn.Linear(32, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return F.cross_entropy(self.head(self.ln(x)).flatten(0, 1), idx.flatten())


def main() -> None:
    logging.getLogger("offrecomp").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    for trial in range(3):
        torch.manual_seed(0)
        model = GPT()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with offrecomp.runtime(model, mode="auto", budget=BUDGET, min_bytes=0) as rt:
            for step in range(20):
                idx = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(step))
                model(idx).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        last = rt.report().steps[-1]
        print(f"run {trial}: plan {last.plan_id}, held {last.peak_activation_bytes} B "
              f"({last.peak_activation_bytes / BUDGET:.2f}x the budget)")
    profile = Profile.load(Path(__file__).with_name("floor_profile.json"))
    plan = solve(profile, budget_bytes=BUDGET, infeasible="warn")
    print(f"floor_profile.json: most frugal plan at this budget predicts {plan.predicted_peak_bytes} B "
          f"(feasible: {plan.feasible})")


if __name__ == "__main__":
    main()
