"""A model whose root module is itself the only region (regions=[Cell] matching the root):
offrecomp names that region "<model>" (regions.py: Region(prefix or "<model>", ...)) and
install._check_regions then looks it up with model.get_submodule("<model>"), which raises
AttributeError -> the region is reported as replaced ("no longer the model's modules ...
the new ones run plainly and their activations are kept"), although nothing was replaced
and the region is still recomputed (replays > 0).
    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05t/repro_root_region_warning.py
"""
import logging, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from torch import nn
import offrecomp

logging.basicConfig(level=logging.WARNING, format="LOG %(name)s: %(message)s")


class Cell(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRUCell(8, 8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x, h):
        return self.fc(torch.tanh(self.gru(x, h)))


torch.manual_seed(0)
m = Cell()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
with offrecomp.runtime(m, mode="recompute", regions=[Cell], min_bytes=0) as rt:
    print("regions:", rt.regions)
    for step in range(2):
        loss = m(torch.randn(4, 8), torch.randn(4, 8)).square().mean()
        loss.backward()
        opt.step(); opt.zero_grad()
print("replays per step:", [r.replays for r in rt.report().steps])
