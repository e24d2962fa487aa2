"""repro_nosave_checkpoint: a region whose forward saves nothing (x + bias) still holds its
input as a replay checkpoint that no replay will ever read: kept on the device under
mode="recompute" (booked in kept/input bytes and in the peak), and under a plan that
offloads (rt.set_plan, OFFLOAD by default) copied to host (d2h) and never reloaded.

Same model, same weights: regions = every block (the NoSave blocks are regions) against
regions = only the Blocks (the NoSave blocks run at the root, where x + bias saves nothing).

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05z/repro_nosave_checkpoint.py
Exits 1 while making the saving-nothing blocks regions costs booked/held bytes.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from scheduler.plan import Placement, Plan

torch.set_num_threads(1)
D = 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class NoSave(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.zeros(D))

    def forward(self, x):
        return x + self.b  # saves nothing for backward


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), NoSave(), Block(), NoSave(), Block()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


ALL = lambda m, n: n.startswith("blocks.") and n.count(".") == 1  # noqa: E731
SAVING = lambda m, n: ALL(m, n) and int(n.split(".")[1]) % 2 == 0  # noqa: E731


def run(mode, regions, plan=False):
    torch.manual_seed(0)
    m = Net()
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, regions=regions)
    if plan:
        rt.set_plan(Plan(default=Placement.OFFLOAD))
    with rt:
        for step in range(3):
            m(torch.randn(4, 256, D, generator=torch.Generator().manual_seed(step))).pow(2).mean().backward()
            m.zero_grad(set_to_none=True)
    return rt.report().steps[-1]


bad = False
a, b = run("recompute", ALL), run("recompute", SAVING)
print(f"recompute, NoSave as regions : peak={a.peak_activation_bytes} kept={a.kept_bytes} input={a.input_bytes}")
print(f"recompute, NoSave not regions: peak={b.peak_activation_bytes} kept={b.kept_bytes} input={b.input_bytes}")
if a.peak_activation_bytes > b.peak_activation_bytes:
    bad = True
    print(f"DEFECT: regions that save nothing add {a.peak_activation_bytes - b.peak_activation_bytes} bytes "
          f"to recompute's booked peak (their inputs, kept for a replay that never runs)")
c = run("auto", ALL, plan=True)
print(f"user plan OFFLOAD default, NoSave as regions: off={c.offloaded_bytes} d2h={c.d2h_bytes} h2d={c.h2d_bytes}")
if c.d2h_bytes > c.h2d_bytes:
    bad = True
    print(f"DEFECT: {c.d2h_bytes - c.h2d_bytes} bytes copied to host (the NoSave regions' input checkpoints) "
          f"are never reloaded: D2H traffic and pinned memory for nothing")
sys.exit(1 if bad else 0)
