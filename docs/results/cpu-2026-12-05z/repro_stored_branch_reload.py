"""repro_stored_branch_reload: an activation a block stores on itself and the loss never
reads keeps its whole offload group's reload buffer on the device after backward, until
the next forward replaces the attribute (the step records' peak books do not show it: it sits between steps).

Each block: y = fc(x); self.aux = tanh(aux_fc(y)) (kept for logging, not in the loss).
The aux nodes never run in backward, so their saves are never unpacked, the group's
`uses` never reaches `handles`, and the engine never releases the reload buffer
(OffloadEngine._release_device is only called from hooks.unpack when uses >= handles,
or when the group is freed with its graph).

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05z/repro_stored_branch_reload.py
Exits 1 while the engine holds reload buffers after the step (device_bytes > 0).
"""
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import torch
from torch import nn

import offrecomp

torch.set_num_threads(1)
D = 64


class Block(nn.Module):
    def __init__(self, store: bool):
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.aux_fc = nn.Linear(D, D)
        self.store = store
        self.aux = None

    def forward(self, x):
        y = self.fc(x)
        aux = torch.tanh(self.aux_fc(y))
        if self.store:
            self.aux = aux  # kept for logging; the loss never reads it
        return x + torch.relu(y)


class Net(nn.Module):
    def __init__(self, store):
        super().__init__()
        self.blocks = nn.ModuleList([Block(store) for _ in range(4)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def run(store: bool):
    torch.manual_seed(0)
    m = Net(store)
    rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
    held = []
    with rt:
        for step in range(4):
            x = torch.randn(4, 32, D, generator=torch.Generator().manual_seed(step))
            m(x).pow(2).mean().backward()
            m.zero_grad(set_to_none=True)
            held.append(rt.offload_engine.device_bytes)
    return rt, held


def plain_retained():
    """Bytes plain autograd keeps after backward for the stored aux graphs: the saves of
    the nodes that never ran (aux_fc's input y, tanh's result), per block."""
    per = 4 * 32 * D * 4
    return 4 * 2 * per


rt_s, held_s = run(True)
rt_n, held_n = run(False)
peaks_s = [s.peak_activation_bytes for s in rt_s.report().steps]
peaks_n = [s.peak_activation_bytes for s in rt_n.report().steps]
print("engine.device_bytes after each step, stored aux :", held_s)
print("engine.device_bytes after each step, no stored  :", held_n)
print("plain autograd retains for the stored aux graphs (aux_fc input y + tanh result, per block):", plain_retained(), "bytes")
print("peak_activation_bytes per step, stored aux :", peaks_s)
print("peak_activation_bytes per step, no stored  :", peaks_n)
bad = any(h > 0 for h in held_s)
if bad:
    print(f"DEFECT: after backward the engine still holds {held_s[-1]} device bytes of reload buffers "
          f"({rt_s.offload_groups_held} groups) for saves no backward node will read; they stay until "
          f"the next forward rebinds self.aux; plain autograd retains {plain_retained()} bytes for the same "
          f"graphs (and the runtime keeps self.aux's own {plain_retained() // 2} bytes besides)")
    sys.exit(1)
print("OK")
