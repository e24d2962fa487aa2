"""Repro: auto's calibration step (phase "calibrate": full recompute by its record) holds
far more than full recompute by the allocator, above the budget, and leaves that memory
allocated after its backward and the optimizer step, until the next step's forward.
No warning. Model: a small encoder-decoder transformer (3 nn.TransformerEncoderLayer, 3
nn.TransformerDecoderLayer with cross-attention, dropout 0.1). Budget: 30% of the way from
recompute's books to keep's. Allocator peaks from torch.profiler profile_memory=True, as
tests/offrecomp/test_memory.allocator_peak. Exits 1 while the calibrate step's allocator
peak is over 1.5x mode="recompute"'s.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/repro_calibrate_step_memory.py
"""
import copy
import logging
from pathlib import Path
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import offrecomp  # noqa: E402


def window(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = peak = 0
    for e in sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns()):
        if e.name() == "[memory]":
            cur += e.nbytes()
            peak = max(peak, cur)
    return peak, cur


class EncDec(nn.Module):
    def __init__(self, d=64, vocab=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.ModuleList(nn.TransformerEncoderLayer(d, 4, 4 * d, 0.1, batch_first=True) for _ in range(3))
        self.dec = nn.ModuleList(nn.TransformerDecoderLayer(d, 4, 4 * d, 0.1, batch_first=True) for _ in range(3))
        self.head = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        mem = self.emb(src)
        for layer in self.enc:
            mem = layer(mem)
        y = self.emb(tgt[:, :-1])
        mask = nn.Transformer.generate_square_subsequent_mask(y.shape[1])
        for layer in self.dec:
            y = layer(y, mem, tgt_mask=mask, tgt_is_causal=True)
        return F.cross_entropy(self.head(y).flatten(0, 1), tgt[:, 1:].flatten())


def batch(s):
    g = torch.Generator().manual_seed(s)
    return torch.randint(0, 128, (8, 64), generator=g), torch.randint(0, 128, (8, 48), generator=g)


def run(mode, budget=None, steps=4):
    torch.manual_seed(0)
    m = EncDec()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    rt = offrecomp.runtime(m, mode=mode, **({} if budget is None else {"budget": budget}))
    out = []
    with rt:
        for s in range(steps):
            torch.manual_seed(s)
            peak, left = window(lambda: m(*batch(s)).backward())
            opt.step()
            opt.zero_grad(set_to_none=False)
            out.append((peak, left))
    return out, rt.report().steps


msgs = []
h = logging.Handler(logging.WARNING)
h.emit = lambda r: msgs.append(r.getMessage())
logging.getLogger("offrecomp").addHandler(h)
kp, kr = run("keep")
rp, rr = run("recompute")
Kb, Rb = kr[-1].peak_activation_bytes, rr[-1].peak_activation_bytes
B = int(Rb + 0.3 * (Kb - Rb))
ap, ar = run("auto", B, steps=5)
print(f"keep: books {Kb}, allocator {kp[-1][0]}; recompute: books {Rb}, allocator {rp[-1][0]}; B = {B}")
for (peak, left), r in zip(ap, ar):
    print(f"  auto step {r.step} {r.phase.value:9}: books {r.peak_activation_bytes:>9}  allocator peak {peak:>9}  "
          f"left allocated after backward+optimizer {left:>9}")
print("warnings:", msgs)
cal = [p for (p, _), r in zip(ap, ar) if r.phase.value == "calibrate"]
if cal and max(cal) > 1.5 * rp[-1][0]:
    print(f"WRONG: the calibrate step (booked as full recompute, {Rb}) peaked at {max(cal)} by the allocator, "
          f"{max(cal) / rp[-1][0]:.2f}x recompute's, {max(cal) / B:.2f}x the budget")
    sys.exit(1)
print("ok")
