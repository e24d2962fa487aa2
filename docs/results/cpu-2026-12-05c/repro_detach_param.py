"""A region whose forward detaches one of its parameters in place (``weight.detach_()``,
as compressive-transformer-pytorch's SelfAttention does to ``to_kv.weight``): plainly the
parameter stops requiring grad, so AccumulateGrad skips it and its .grad stays None.
Under recompute, the replay's _swap_params (offrecomp/replay.py) flips requires_grad back
to the entry flag (True), the replayed forward detaches it again (False), and the
``finally`` toggles it (not p.requires_grad) -> True: the parameter requires grad again
after backward and gets a gradient the plain run does not.

    cd /work/main && .venv/bin/python /tmp/sweep5c/repro_detach_param.py
"""

import contextlib
import copy

import torch
from torch import nn

import offrecomp


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x).relu()
        self.a.weight.detach_()  # freeze a.weight from here on (leaf: requires_grad -> False)
        return self.b(h).tanh()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x.pow(2).mean()


def run(model: nn.Module, ctx=None) -> tuple[bool, torch.Tensor | None]:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with ctx if ctx is not None else contextlib.nullcontext():
        model(x).backward()
    w = model.blocks[0].a.weight
    return w.requires_grad, w.grad


torch.manual_seed(0)
net = Net()
plain = run(copy.deepcopy(net))
m = copy.deepcopy(net)
rec = run(m, offrecomp.runtime(m, mode="recompute", min_bytes=0))
print("plain:     requires_grad", plain[0], "grad", plain[1] is not None)
print("recompute: requires_grad", rec[0], "grad", rec[1] is not None)
assert plain[0] == rec[0] and (plain[1] is None) == (rec[1] is None), "offrecomp changed requires_grad/grad"
print("OK")
