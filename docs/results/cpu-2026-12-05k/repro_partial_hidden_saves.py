"""A saved-tensor hook pair around *part* of a region's forward (``save_on_cpu``, or
``torch.utils.checkpoint`` of the block's MLP half, the usual way to checkpoint inside a
transformer block) takes those saves away from offrecomp without any warning: offrecomp
names such a hook only when a region call saved no activation at all through its own
pair (``Diagnostics.check_hidden_saves``, called from ``install.py`` only for calls with
no "activation" storage, and not for native calls: under ``mode="keep"`` a whole-block
checkpoint is not named either). The same hook around the whole block is named under
recompute. Gradients stay bitwise; the step report (and so auto's budget and plan)
misses the hidden saves: compare the peak activation bytes with the "none" row.

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05k/repro_partial_hidden_saves.py
"""

import copy
import logging

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import offrecomp

H = 32


class Block(nn.Module):
    def __init__(self, how: str, whole: bool) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.attn = nn.Linear(H, H)
        self.fc1 = nn.Linear(H, 4 * H)
        self.fc2 = nn.Linear(4 * H, H)
        self.how, self.whole = how, whole

    def _mlp(self, y: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(y)))

    def _hidden(self, f, y):
        if self.how == "none":
            return f(y)
        if self.how == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu():
                return f(y)
        return checkpoint(f, y, use_reentrant=False)

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        return x + self._mlp(torch.tanh(self.attn(self.ln(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.whole:  # the hook around the whole block: named
            return self._hidden(self._body, x)
        x = x + torch.tanh(self.attn(self.ln(x)))  # saved through offrecomp
        return x + self._hidden(self._mlp, x)  # hidden from offrecomp: not named


class Stack(nn.Module):
    def __init__(self, how: str, whole: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(how, whole) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


class Grab(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.msgs: list[str] = []

    def emit(self, r: logging.LogRecord) -> None:
        self.msgs.append(r.getMessage())


def run(how: str, whole: bool, mode: str) -> None:
    torch.manual_seed(0)
    base = Stack(how, whole)
    x = torch.randn(4, 16, H, generator=torch.Generator().manual_seed(1)).requires_grad_()
    plain = copy.deepcopy(base)
    plain(x).backward()
    m = copy.deepcopy(base)
    grab = Grab()
    logging.getLogger("offrecomp").addHandler(grab)
    with offrecomp.runtime(m, mode=mode, min_bytes=0) as rt:
        m(x).backward()
    logging.getLogger("offrecomp").removeHandler(grab)
    same = all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), m.parameters()))
    named = [s for s in grab.msgs if "saved-tensor hook" in s or "owns" in s]
    print(f"{mode:9s} {how:12s} around {'the whole block' if whole else 'the MLP half  '}: bitwise={same} "
          f"peak activation bytes={rt.report().steps[0].peak_activation_bytes:6d} "
          f"warned={bool(named)}")
    for msg in grab.msgs:
        print("    LOG", msg[:160])


if __name__ == "__main__":
    for mode in ("recompute", "keep"):
        run("none", False, mode)  # no inner hook: what the block saves
        for how in ("save_on_cpu", "checkpoint"):
            for whole in (True, False):
                run(how, whole, mode)
