"""Probe: repro_buffer_snapshots.py with the buffer's rows set by K (default 1024: 1 MiB;
K=1025 is just over BUFFER_SNAPSHOT_MAX_BYTES, so its buffers are not snapshotted).

The repro's text: a region that updates a buffer of up to 1 MiB in its forward (an EMA of its
features, a VQ codebook average) gets that buffer cloned at each call's entry
(offrecomp/regions.py:capture_buffers, BUFFER_SNAPSHOT_MAX_BYTES), and the clone is held
until the call's replay. Under mode="recompute" and auto's plans that is 1 MiB of device
memory per call that peak_activation_bytes does not count, so a planned step within its
budget by the books holds well over it by the allocator, with no warning.

Prints allocator peaks of one step (torch.profiler profile_memory=True, as
tests/offrecomp/test_memory.allocator_peak) for plain, torch.utils.checkpoint per block,
keep, recompute, and auto at a budget half-way between recompute's and keep's books.
Exits 1 while auto's planned step holds over 1.1x what keep holds minus the bytes its
books say it saved (keep's allocator peak - (keep's books - B)).

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/probe/p_snapshot_k.py   (K=1025 before .venv/bin/python for the other size)
"""
import copy
import logging
from pathlib import Path
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
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


class EMABlock(nn.Module):
    def __init__(self, d=256, k=1024):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("ema", torch.zeros(k, d))  # 1 MiB

    def forward(self, x):
        h = F.gelu(self.fc1(self.ln(x)))
        out = x + self.fc2(h) + 0.01 * self.ema.mean(0)
        with torch.no_grad():
            self.ema.mul_(0.99).add_(0.01 * h[:, : self.ema.shape[1]].mean(0))
        return out


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
        return x.square().mean()


warnings = []
handler = logging.Handler(logging.WARNING)
handler.emit = lambda r: warnings.append(r.getMessage())
logging.getLogger("offrecomp").addHandler(handler)

torch.manual_seed(0)
import os; K = int(os.environ.get("K", "1024")); base = Stack([EMABlock(k=K) for _ in range(6)])
x = torch.randn(256, 256)


def measured(m, rt=None, steps=1):
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def step():
        m(x).backward()

    with rt if rt is not None else torch.enable_grad():
        for _ in range(steps):
            step()
            opt.step()
            opt.zero_grad(set_to_none=False)
        return allocator_peak(step)


ck = copy.deepcopy(base)
ck.blocks = nn.ModuleList(Ckpt(b) for b in ck.blocks)
peaks = {"plain": measured(copy.deepcopy(base)), "checkpoint": measured(ck)}
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
expect = peaks["keep"] - (books["keep"] - B)
print(f"allocator peak of one step (bytes): {peaks}")
print(f"books: keep {books['keep']}, recompute {books['recompute']}")
print(f"auto at B={B}: phase {rec.phase}, books {rec.peak_activation_bytes}, predicted {rec.predicted_peak_bytes}, "
      f"allocator {peaks['auto']}; keep's allocator - (keep's books - B) = {expect} -> {peaks['auto'] / expect:.2f}x")
print(f"recompute / torch.utils.checkpoint allocator peak: {peaks['recompute'] / peaks['checkpoint']:.2f}x "
      f"(6 buffers x 1 MiB = {6 << 20} bytes)")
print(f"offrecomp warnings: {warnings}")
if rec.phase == "planned" and rec.peak_activation_bytes <= B and peaks["auto"] > 1.1 * expect and not warnings:
    print("WRONG: the planned step is within its budget by the books, holds far more by the allocator, silently")
    sys.exit(1)
print("ok")
