"""A custom Function whose backward reads ctx.saved_tensors twice (or indexes it twice:
ctx.saved_tensors[0], ctx.saved_tensors[1]): under mode="recompute" each read replays the
region again (2 replays per block per step) and the step peaks above mode="keep"."""
import torch
from torch import nn
import offrecomp


class MulW(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w, x.exp())
        return x * w

    @staticmethod
    def backward(ctx, g):
        x = ctx.saved_tensors[0]      # unpacks every save
        w = ctx.saved_tensors[1]      # unpacks every save again
        return g * w, (g * x).reshape(-1, x.shape[-1]).sum(0)


class MulWOnce(MulW):
    @staticmethod
    def backward(ctx, g):
        x, w, _ = ctx.saved_tensors   # one read
        return g * w, (g * x).reshape(-1, x.shape[-1]).sum(0)


FN = MulW


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.w = nn.Parameter(torch.ones(64))

    def forward(self, x):
        return x + FN.apply(torch.tanh(self.fc(x)), self.w)


def run(mode):
    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(4)])
    x = torch.randn(32, 64)
    if mode == "plain":
        model(x).square().mean().backward()
        return [p.grad.clone() for p in model.parameters()], None
    with offrecomp.runtime(model, mode=mode, min_bytes=0) as rt:
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
    s = rt.report().steps[-1]
    return [p.grad.clone() for p in model.parameters()], s


for FN in (MulWOnce, MulW):
  ref, _ = run("plain")
  for mode in ["keep", "recompute"]:
    g, s = run(mode)
    same = all(torch.equal(a, b) for a, b in zip(ref, g))
    print(f"{FN.__name__:9s} {mode:10s} bitwise={same} replays/step={s.replays} recomputed_bytes={s.recomputed_bytes} "
          f"peak_activation_bytes={s.peak_activation_bytes}")
print("4 blocks: recompute should replay 4 times per step and peak below keep")
