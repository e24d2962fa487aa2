"""torch-only: a parent sets a plain (non-tensor) attribute of its blocks before running them
and puts it back after (diffusers' @apply_lora_scale does exactly this to PEFT's
`scaling` dict; so do `with scale(...)`-style context managers). Plain autograd's backward
never re-reads it; offrecomp's replay, run after the forward restored it, reads the
restored value.  Exit 1 when gradients differ from plain training.

    python repro_attr_after_forward.py [dict|float] [recompute|auto]
"""
import copy
import sys

import torch
import torch.nn as nn

import offrecomp

torch.set_num_threads(1)
kind = sys.argv[1] if len(sys.argv) > 1 else "dict"
mode = sys.argv[2] if len(sys.argv) > 2 else "recompute"


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)
        self.scaling = {"default": 1.0}   # as peft's LoraLayer.scaling
        self.scale = 1.0

    def forward(self, x):
        s = self.scaling["default"] if kind == "dict" else self.scale
        h = torch.tanh(self.a(x) * s)     # the scale reaches a saved tensor (tanh's output)
        return x + self.b(h)


class Model(nn.Module):
    def __init__(self, d=16, n=3):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x, scale=1.0):
        for b in self.blocks:                 # scale_lora_layers
            if kind == "dict":
                b.scaling["default"] *= scale
            else:
                b.scale = b.scale * scale
        try:
            for b in self.blocks:
                x = b(x)
            return x
        finally:
            for b in self.blocks:             # unscale_lora_layers
                if kind == "dict":
                    b.scaling["default"] /= scale
                else:
                    b.scale = b.scale / scale


def train(m, steps=3):
    out = []
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i in range(steps):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
        loss = m(x, scale=0.5).pow(2).mean()
        loss.backward()
        out.append({n: p.grad.clone() for n, p in m.named_parameters()})
        opt.step()
        opt.zero_grad()
    return out


torch.manual_seed(0)
m0 = Model()
ref = train(copy.deepcopy(m0))
m = copy.deepcopy(m0)
with offrecomp.runtime(m, mode=mode, min_bytes=0) as rt:
    got = train(m)
bad = [(i, n) for i, (a, b) in enumerate(zip(ref, got)) for n in a if not torch.equal(a[n], b[n])]
print(f"kind={kind} mode={mode} phases={[s.phase.value for s in rt.report().steps]} replays={[s.replays for s in rt.report().steps]}")
print(f"{len(bad)} of {sum(len(a) for a in ref)} gradients differ from plain training: {bad[:4]}")
sys.exit(1 if bad else 0)
