"""A block keeps its membrane as a buffer it rebinds every call (snntorch init_hidden=True);
the model calls it T times per step and resets the buffer at the start of forward.
Plain vs mode='recompute', 2 SGD steps, bitwise."""
import copy, sys, logging
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from torch import nn
import offrecomp

logging.basicConfig(level=logging.WARNING)
READ_MEM = "--no-read" not in sys.argv      # loss reads the last block's buffer
ATTR = "--attr" in sys.argv          # a plain tensor attribute instead of a buffer
ZERO_RESET = "--no-reset" not in sys.argv    # forward re-creates the buffer as zeros(0)

class Spike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x > 0).float()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / (1 + 25 * x.abs()) ** 2

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        if ATTR:
            self.mem = torch.zeros(0)
        else:
            self.register_buffer("mem", torch.zeros(0), persistent=False)
        self.beta = nn.Parameter(torch.tensor(0.9))
    def forward(self, x):
        if self.mem.shape != x.shape:
            self.mem = torch.zeros_like(x)
        self.mem = self.beta * self.mem + self.fc(x)  # mul saves beta only when mem requires grad
        spk = Spike.apply(self.mem - 1.0)
        self.mem = self.mem - spk
        return spk

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
    def forward(self, x):
        for b in self.blocks:
            b.mem = torch.zeros(0) if ZERO_RESET else torch.zeros_like(x[0])
        acc = 0
        for t in range(x.shape[0]):
            h = x[t] * 3
            for b in self.blocks:
                h = b(h)
            acc = acc + h
        loss = acc.square().mean()
        return loss + self.blocks[-1].mem.square().mean() if READ_MEM else loss

def train(m, ctx=None):
    opt = torch.optim.SGD(m.parameters(), lr=0.1); out = []
    import contextlib
    with ctx or contextlib.nullcontext():
        for s in range(2):
            loss = m(torch.randn(4, 2, 8, generator=torch.Generator().manual_seed(s)))
            loss.backward()
            out.append([p.grad.clone() for p in m.parameters()]); opt.step(); opt.zero_grad()
    return out

torch.manual_seed(0); net = Net()
ref = train(copy.deepcopy(net))
got = train(copy.deepcopy(net), None) if False else None
m = copy.deepcopy(net)
got = train(m, offrecomp.runtime(m, mode="recompute", min_bytes=0))
print("bitwise:", all(torch.equal(a, b) for x, y in zip(ref, got) for a, b in zip(x, y)))
