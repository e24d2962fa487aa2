"""Repro: under bf16 autocast, a replayed region that uses one weight several times in a
call (a Linear applied in a loop; a GRU's time steps on the CPU) holds one fresh bf16 cast
of the weight per use while it replays, where the forward (autocast's weight cache) and
torch.utils.checkpoint hold one. The runtime's books do not count them.

Prints the allocator peak of one training step (torch.profiler profile_memory=True, as
tests/offrecomp/test_memory.allocator_peak) under torch.utils.checkpoint per block and
under offrecomp mode="recompute", and an auto step planned at a budget half-way between
recompute's and keep's books. Exits 1 while recompute's peak is over 1.1x checkpoint's
(docs/reliability.md: "recompute's allocator peak <= torch.utils.checkpoint's").

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/repro_autocast_replay_casts.py
"""
import copy
import logging
from pathlib import Path
import sys

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import offrecomp  # noqa: E402


def allocator_peak(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = peak = 0
    for e in sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns()):
        if e.name() == "[memory]":
            cur += e.nbytes()
            peak = max(peak, cur)
    return peak


class Loop(nn.Module):
    """One Linear applied 16 times (iterative refinement / a weight-shared loop)."""

    def __init__(self, d=256, n=16):
        super().__init__()
        self.lin, self.n = nn.Linear(d, d), n

    def forward(self, x):
        h = x
        for _ in range(self.n):
            h = torch.tanh(self.lin(h))
        return x + h


class Ckpt(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False)


class Stack(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.float().square().mean()


warnings = []
handler = logging.Handler(logging.WARNING)
handler.emit = lambda r: warnings.append(r.getMessage())
logging.getLogger("offrecomp").addHandler(handler)

torch.manual_seed(0)
base = Stack([Loop() for _ in range(4)])
x = torch.randn(64, 256)


def step(m):
    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(x)
        loss.backward()
    return run


def measured(m, rt=None, steps=1):
    with rt if rt is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        for _ in range(steps):
            step(m)()  # warm-up / measuring steps
        peak = allocator_peak(step(m))
    return peak


ck = copy.deepcopy(base)
ck.blocks = nn.ModuleList(Ckpt(b) for b in ck.blocks)
plain_m = copy.deepcopy(base)
peaks = {"plain": measured(plain_m), "checkpoint": measured(ck)}
books = {}
for mode in ("keep", "recompute"):
    m = copy.deepcopy(base)
    rt = offrecomp.runtime(m, mode=mode)
    peaks[mode] = measured(m, rt)
    books[mode] = rt.report().steps[-1].peak_activation_bytes
B = (books["keep"] + books["recompute"]) // 2
m = copy.deepcopy(base)
rt = offrecomp.runtime(m, mode="auto", budget=B)
peaks["auto"] = measured(m, rt, steps=4)
rec = rt.report().steps[-1]
print(f"allocator peak of one step (bytes): {peaks}")
print(f"books: keep {books['keep']}, recompute {books['recompute']}")
print(f"auto at B={B}: phase {rec.phase}, books {rec.peak_activation_bytes}, predicted {rec.predicted_peak_bytes}, "
      f"allocator {peaks['auto']} (keep's allocator - (keep's books - B) = {peaks['keep'] - (books['keep'] - B)})")
ratio = peaks["recompute"] / peaks["checkpoint"]
print(f"recompute / torch.utils.checkpoint allocator peak: {ratio:.2f}x")
print(f"offrecomp warnings: {warnings}")
print(f"one bf16 cast of a block's weight: {256 * 256 * 2} bytes; uses per call: 16")
if ratio > 1.1:
    print("WRONG: offrecomp's recompute holds more than torch.utils.checkpoint (replays cast the weight at every use)")
    sys.exit(1)
print("ok")
