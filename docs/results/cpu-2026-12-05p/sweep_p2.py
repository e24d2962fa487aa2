"""Second batch: harder custom autograd.Function usages inside blocks (and around them).

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05p/sweep_p2.py [NAME,...|all] [VARIANT,...] [-v]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.argv, _argv = [sys.argv[0]], sys.argv  # sweep_p reads nothing at import, but be safe
sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_p as S  # noqa: E402

sys.argv = _argv

import torch  # noqa: E402
from sweep import run  # noqa: E402
from torch import nn  # noqa: E402
from torch.autograd import Function  # noqa: E402

from tests.helpers import ZOO_VARIANTS  # noqa: E402

H = S.H
MLP = S.MLP


# --- a Function keeping an inner graph for its backward -----------------------------


class InnerGraph(Function):
    """forward builds a graph under enable_grad (through the parameters, passed as inputs)
    and keeps it on ctx; backward differentiates that graph with autograd.grad."""

    @staticmethod
    def forward(ctx, x, w, b):
        with torch.enable_grad():
            xi = x.detach().requires_grad_(True)
            wi = w.detach().requires_grad_(True)
            bi = b.detach().requires_grad_(True)
            out = torch.tanh(xi @ wi.t() + bi).square()
        ctx.inner = (xi, wi, bi, out)
        return out.detach()

    @staticmethod
    def backward(ctx, g):
        xi, wi, bi, out = ctx.inner
        gx, gw, gb = torch.autograd.grad(out, (xi, wi, bi), g)
        return gx, gw, gb


class InnerGraphBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.lin = nn.Linear(H, H)

    def forward(self, x):
        return x + 0.5 * InnerGraph.apply(self.mlp(x), self.lin.weight, self.lin.bias)


class ReentrantCkpt(Function):
    """Old reentrant checkpoint: forward under no_grad saves the input; backward reruns the
    sub-module with grad and calls torch.autograd.backward (accumulates into .grad)."""

    @staticmethod
    def forward(ctx, mod, x):
        ctx.mod = mod
        ctx.save_for_backward(x)
        with torch.no_grad():
            return mod(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xi = x.detach().requires_grad_(True)
        with torch.enable_grad():
            out = ctx.mod(xi)
        torch.autograd.backward(out, g)
        return None, xi.grad


class ReentrantBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.inner = MLP()

    def forward(self, x):
        h = self.mlp(x)
        return ReentrantCkpt.apply(self.inner, h)


# --- several Functions sharing saves; reading saved_tensors twice ------------------


class ReadTwice(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x = ctx.saved_tensors[0]
        w = ctx.saved_tensors[1]
        return g * w, (g * x).reshape(-1, H).sum(0)


class SharedSaveBlock(nn.Module):
    """Two Functions save the same intermediate; one reads its saves twice."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.w = nn.Parameter(torch.randn(H) * 0.5 + 1)

    def forward(self, x):
        h = torch.tanh(self.mlp(x))
        return x + 0.3 * S.MulW.apply(h, self.w) + 0.3 * ReadTwice.apply(h, self.w.cos())


# --- a tensor from outside the call saved ------------------------------------------


class CrossStack(nn.Module):
    """The stem's output goes to every block as an argument; each block's Function saves it."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(H, H)
        self.blocks = nn.ModuleList([CrossBlock(i) for i in range(3)])

    def forward(self, x):
        x0 = torch.tanh(self.stem(x))
        for b in self.blocks:
            x = b(x, x0)
        return S._loss(x)


class CrossBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, x, x0):
        return x + 0.5 * S.MulW.apply(self.mlp(x), x0.mean((0, 1)))


# --- backward writing its unpacked save in place -----------------------------------


class BwdMutates(Function):
    """backward scales the unpacked intermediate in place and returns it as the gradient."""

    @staticmethod
    def forward(ctx, x):
        d = 1 - torch.tanh(x).square()
        ctx.save_for_backward(d)
        return torch.tanh(x)

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        return d.mul_(g)


def f_bwd_mutates(m, h):
    return BwdMutates.apply(h) * m.w


# --- shared stateful module --------------------------------------------------------


class SharedStat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("rm", torch.zeros(H))

    def forward(self, x):
        return S.RunningStatAttr.apply(x, self.rm)


class SharedStatStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = SharedStat()
        self.blocks = nn.ModuleList([SharedStatBlock(shared) for _ in range(3)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return S._loss(x)


class SharedStatBlock(nn.Module):
    def __init__(self, shared) -> None:
        super().__init__()
        self.mlp = MLP()
        self.stat = shared

    def forward(self, x):
        return x + 0.5 * self.stat(self.mlp(x))


# --- an int counter buffer advanced by the Function ---------------------------------


class CountScale(Function):
    @staticmethod
    def forward(ctx, x, count):
        count.add_(1)
        s = 1.0 / (1 + count.to(x.dtype))
        ctx.save_for_backward(count, s)
        return x * s

    @staticmethod
    def backward(ctx, g):
        count, s = ctx.saved_tensors
        return g * s * (count > 0).to(g.dtype), None


class CounterBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        return x + 0.5 * CountScale.apply(self.mlp(x), self.count)


# --- a Python float from .item() inside forward --------------------------------------


class ItemScale(Function):
    @staticmethod
    def forward(ctx, x):
        s = 1.0 / (1.0 + x.abs().max().item())
        ctx.s = s
        ctx.save_for_backward(x)
        return x * s

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ctx.s + 0 * x


def f_item(m, h):
    return ItemScale.apply(h) * m.w


# --- custom_fwd / custom_bwd under autocast ------------------------------------------


class AmpMul(Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).reshape(-1, H).sum(0)


class AmpMulNoCast(Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, w):
        y = x @ w  # autocast stays on: bf16 matmul
        ctx.save_for_backward(x, w)
        return y

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.t(), x.reshape(-1, H).t() @ g.reshape(-1, H)


class AmpBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.w = nn.Parameter(torch.randn(H) * 0.5 + 1)
        self.m = nn.Parameter(torch.randn(H, H) * 0.2)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.mlp.fc2(torch.relu(self.mlp.fc1(x)))  # bf16
            y = AmpMul.apply(h, self.w)  # fp32 inside
            z = AmpMulNoCast.apply(h, self.m)
        return x + 0.3 * y.float() + 0.3 * z.float()


# --- a Function at the root, saving region outputs ---------------------------------


class RootStack(nn.Module):
    """A Function between blocks (outside every region) saving block outputs, and a loss
    Function saving the last block's output and a tapped middle one."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([S.FnBlock(i, S.f_input) for i in range(3)])
        self.w = nn.Parameter(torch.randn(H) * 0.5 + 1)

    def forward(self, x):
        mids = []
        for i, b in enumerate(self.blocks):
            x = b(x)
            mids.append(x)
            if i == 0:
                x = S.MulW.apply(x, self.w)
        return S._loss(x) + LossFn.apply(x, mids[1])


class LossFn(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return (a * b).mean()

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        n = a.numel()
        return g * b / n, g * a / n


# --- a Function returning a view of an intermediate it saved -------------------------


class ViewOfSaved(Function):
    @staticmethod
    def forward(ctx, x):
        buf = torch.cat([x.sin(), x.cos()], -1)
        ctx.save_for_backward(buf)
        return buf[..., :H]  # a view of a saved intermediate

    @staticmethod
    def backward(ctx, g):
        (buf,) = ctx.saved_tensors
        return g * buf[..., H:]


def f_view_of_saved(m, h):
    return ViewOfSaved.apply(h) * m.w


# --- a block called twice per forward, Function reading saves twice ------------------


class TwiceStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([S.FnBlock(i, lambda m, h: ReadTwice.apply(h, m.w)) for i in range(2)])

    def forward(self, x):
        for b in self.blocks:
            x = b(b(x))
        return S._loss(x)


# --- forward draws and saves; backward reads twice ----------------------------------


class RandReadTwice(Function):
    @staticmethod
    def forward(ctx, x):
        m = (torch.rand(x.shape) > 0.3).to(x.dtype)
        ctx.save_for_backward(m, x)
        return x * m

    @staticmethod
    def backward(ctx, g):
        m = ctx.saved_tensors[0]
        return g * m + 0 * ctx.saved_tensors[1]


def f_rand_twice(m, h):
    return RandReadTwice.apply(h) * m.w


MODELS = {
    "inner_graph_bwd": S.stack(InnerGraphBlock),
    "reentrant_ckpt": S.stack(ReentrantBlock),
    "shared_save_2fn": S.stack(SharedSaveBlock),
    "cross_region": CrossStack,
    "bwd_mutates": S.fn_block(f_bwd_mutates),
    "shared_stat": SharedStatStack,
    "int_counter": S.stack(CounterBlock),
    "item_scale": S.fn_block(f_item),
    "amp_custom_fwd": S.stack(AmpBlock),
    "root_fn": RootStack,
    "view_of_saved": S.fn_block(f_view_of_saved),
    "twice_called": TwiceStack,
    "rand_read_twice": S.fn_block(f_rand_twice),
}


if __name__ == "__main__":
    sys.exit(run(MODELS, S.batch))
