"""Custom torch.autograd.Function usages inside blocks, under every zoo variant (bitwise
against plain via tests/helpers.check_variant through docs/results/cpu-2026-12-05/sweep.py).

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05p/sweep_p.py [NAME,...|all] [VARIANT,...] [-v]
"""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
import time
import traceback
import warnings
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from sweep import run
from torch import nn
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from tests.helpers import ZOO_VARIANTS, assert_bitwise, variant_runtime

H = 16


class _Print(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        print(f"LOG  {record.name}: {record.getMessage()[:600]}", flush=True)


logging.getLogger("offrecomp").addHandler(_Print(logging.WARNING))
logging.getLogger("offrecomp").propagate = False
logging.captureWarnings(True)
logging.getLogger("py.warnings").addHandler(_Print(logging.WARNING))
logging.getLogger("py.warnings").propagate = False
warnings.simplefilter("default")


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _loss(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    w = torch.arange(x.numel(), dtype=x.dtype).sin().view_as(x)
    return x.square().mean() + (x * w).mean()


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, batch: Any) -> torch.Tensor:
        x, *extra = batch if isinstance(batch, tuple) else (batch,)
        for b in self.blocks:
            x = b(x, *extra)
        return _loss(x)


def stack(block, n: int = 3):
    return lambda: Stack([block(i) for i in range(n)])


def randn(*shape: int):
    return lambda s: torch.randn(*shape, generator=_gen(s))


class MLP(nn.Module):
    def __init__(self, h: int = H) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 2 * h)
        self.fc2 = nn.Linear(2 * h, h)

    def forward(self, x: torch.Tensor, *_: Any) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class FnBlock(nn.Module):
    """mlp(x) -> f(self, h) -> residual; ``f`` is the block's Function usage."""

    def __init__(self, i: int, f) -> None:
        super().__init__()
        self.i = i
        self.mlp = MLP()
        self.w = nn.Parameter(torch.randn(H) * 0.5 + 1)
        self.f = f

    def forward(self, x: torch.Tensor, *extra: Any) -> torch.Tensor:
        h = self.mlp(x)
        return x + 0.5 * self.f(self, h, *extra)


def fn_block(f, n: int = 3):
    return lambda: Stack([FnBlock(i, f) for i in range(n)])


# --- save_for_backward variants -------------------------------------------------------


class MulW(Function):
    """Saves its inputs (activation and parameter)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).reshape(-1, x.shape[-1]).sum(0)


class ExpOut(Function):
    """Saves its output."""

    @staticmethod
    def forward(ctx, x):
        y = torch.exp(-x.square())
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y * (-2 * x)


class TanhSig(Function):
    """Saves two intermediates it made (neither input nor output)."""

    @staticmethod
    def forward(ctx, x):
        t = torch.tanh(x)
        s = torch.sigmoid(x)
        ctx.save_for_backward(t, s)
        return t * s

    @staticmethod
    def backward(ctx, g):
        t, s = ctx.saved_tensors
        return g * ((1 - t * t) * s + t * s * (1 - s))


class SaveInputView(Function):
    """Saves views of its input: a slice and a transpose."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x[..., : H // 2], x.transpose(-1, -2))
        a = x[..., : H // 2]
        return torch.cat([a * a, x[..., H // 2 :]], -1)

    @staticmethod
    def backward(ctx, g):
        a, xt = ctx.saved_tensors
        ga = g[..., : H // 2] * 2 * a
        gb = g[..., H // 2 :] * (xt.transpose(-1, -2)[..., H // 2 :] * 0 + 1)
        return torch.cat([ga, gb], -1)


class SaveTwice(Function):
    """Saves the same tensors twice (input twice, output twice)."""

    @staticmethod
    def forward(ctx, x, w):
        y = torch.sin(x) * w
        ctx.save_for_backward(x, x, w, y, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, x2, w, y, y2 = ctx.saved_tensors
        assert x is not None and x2 is not None
        gx = g * torch.cos(x2) * w + 0 * (y - y2)
        return gx, (g * torch.sin(x)).reshape(-1, H).sum(0)


class SaveNone(Function):
    """save_for_backward with None among the tensors."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(None, x, None, w)
        return x * w + x

    @staticmethod
    def backward(ctx, g):
        n1, x, n2, w = ctx.saved_tensors
        assert n1 is None and n2 is None
        return g * (w + 1), (g * x).reshape(-1, H).sum(0)


class AccessTwice(Function):
    """backward reads ctx.saved_tensors twice; also saves a tensor it never reads."""

    @staticmethod
    def forward(ctx, x, w):
        u = x.exp()
        ctx.save_for_backward(x, w, u)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w, _ = ctx.saved_tensors
        x2, w2, _ = ctx.saved_tensors
        return g * w2, (g * x2).reshape(-1, H).sum(0) + 0 * (x - x2).sum()


class SavedUnread(Function):
    """Saves tensors, never reads them (backward needs none)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x, x * 2)
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3


# --- ctx attributes ---------------------------------------------------------------


class CtxAttrInput(Function):
    """Input and parameter stashed on ctx as attributes (not save_for_backward)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.x, ctx.w = x, w
        return torch.tanh(x) * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.x, ctx.w
        t = torch.tanh(x)
        return g * w * (1 - t * t), (g * t).reshape(-1, H).sum(0)


class CtxAttrIntermediate(Function):
    """An intermediate and the output stashed on ctx as attributes, plus a list of tensors."""

    @staticmethod
    def forward(ctx, x):
        e = torch.exp(-x.abs())
        y = x * e
        ctx.e = e
        ctx.stuff = [x.sign(), y]
        return y

    @staticmethod
    def backward(ctx, g):
        sgn, _y = ctx.stuff
        return g * ctx.e * (1 - sgn * sgn * ctx.e.log().neg())


class CtxAttrOutput(Function):
    """The output stashed on ctx as an attribute (a reference cycle through grad_fn)."""

    @staticmethod
    def forward(ctx, x, w):
        y = torch.sin(x) * w
        ctx.y = y
        ctx.x = x
        return y

    @staticmethod
    def backward(ctx, g):
        return g * torch.cos(ctx.x) * ctx.y.detach() * 0 + g * torch.cos(ctx.x) * (ctx.y / torch.sin(ctx.x)).detach(), (g * torch.sin(ctx.x)).reshape(-1, H).sum(0)


def f_ctx_output(m, h):
    return CtxAttrOutput.apply(h, m.w)


# --- dirty, non-differentiable, materialize ----------------------------------------


class ReluInplaceSaveOut(Function):
    """In place on an input (a fresh tensor), marked dirty; saves the dirty output."""

    @staticmethod
    def forward(ctx, x):
        x.clamp_(min=0)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (y > 0).to(g.dtype)


class ArgmaxVals(Function):
    """Returns (max values, argmax indices) with indices non-differentiable; saves indices."""

    @staticmethod
    def forward(ctx, x):
        v, idx = x.max(dim=-1, keepdim=True)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(idx)
        ctx.shape = x.shape
        return v, idx

    @staticmethod
    def backward(ctx, gv, gidx):
        (idx,) = ctx.saved_tensors
        return torch.zeros(ctx.shape, dtype=gv.dtype).scatter_(-1, idx, gv)


class ThreeOut(Function):
    """Three outputs; set_materialize_grads(False); the block uses only some."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.set_materialize_grads(False)
        a, b, c = x * w, torch.sin(x), x.square()
        ctx.save_for_backward(x, w)
        return a, b, c

    @staticmethod
    def backward(ctx, ga, gb, gc):
        x, w = ctx.saved_tensors
        gx = torch.zeros_like(x)
        gw = None
        if ga is not None:
            gx = gx + ga * w
            gw = (ga * x).reshape(-1, H).sum(0)
        if gb is not None:
            gx = gx + gb * torch.cos(x)
        if gc is not None:
            gx = gx + gc * 2 * x
        return gx, gw


class OnceDiff(Function):
    @staticmethod
    def forward(ctx, x, w):
        y = torch.tanh(x * w)
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, w, y = ctx.saved_tensors
        d = g * (1 - y * y)
        return d * w, (d * x).reshape(-1, H).sum(0)


class ReturnView(Function):
    """Returns a view of its input (a slice), saving nothing but a shape."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x[..., : H // 2]

    @staticmethod
    def backward(ctx, g):
        out = torch.zeros(ctx.shape, dtype=g.dtype)
        out[..., : H // 2] = g
        return out


class ReturnInputAsIs(Function):
    """Returns its input as is (and saves it)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * 1.0, None


class NonTensorOutputs(Function):
    """Outputs include None and a Python int."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x, None, 3

    @staticmethod
    def backward(ctx, g, _n, _i):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class ListArg(Function):
    """Tensors passed inside a list argument (invisible to autograd), stashed on ctx."""

    @staticmethod
    def forward(ctx, x, ws):
        ctx.ws = ws
        ctx.save_for_backward(x)
        return x * ws[0] + ws[1]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.ws[0], None


class NeedsInputGrad(Function):
    """Saves different tensors depending on ctx.needs_input_grad."""

    @staticmethod
    def forward(ctx, x, w):
        if ctx.needs_input_grad[1]:
            ctx.save_for_backward(x, w)
        else:
            ctx.save_for_backward(w)
        ctx.flags = ctx.needs_input_grad
        return x * w

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors
        w = saved[-1]
        gw = (g * saved[0]).reshape(-1, H).sum(0) if ctx.needs_input_grad[1] else None
        return g * w, gw


class NeedsInputGradX(Function):
    """Saves w only when x needs grad (first block: x is the batch, no grad)."""

    @staticmethod
    def forward(ctx, x, w):
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(x, w)
        else:
            ctx.save_for_backward(x)
        return x * w

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors
        x = saved[0]
        gx = g * saved[1] if ctx.needs_input_grad[0] else None
        return gx, (g * x).reshape(-1, H).sum(0)


# --- setup_context / vmap ---------------------------------------------------------


class SCMul(Function):
    """setup_context style with an explicit vmap staticmethod."""

    @staticmethod
    def forward(x, w):
        return x * torch.tanh(w)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w = inputs
        ctx.save_for_backward(x, w, output)

    @staticmethod
    def backward(ctx, g):
        x, w, _y = ctx.saved_tensors
        t = torch.tanh(w)
        gw = (g * x * (1 - t * t)).sum_to_size(w.shape)
        return g * t, gw

    @staticmethod
    def vmap(info, in_dims, x, w):
        xd, wd = in_dims
        x = x.movedim(xd, 0) if xd is not None else x.unsqueeze(0)
        w = w.movedim(wd, 0) if wd is not None else w.unsqueeze(0)
        return SCMul.apply(x, w), 0


class SCGen(Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        y = torch.sin(x)
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)


# --- randomness ---------------------------------------------------------------------


class RandMask(Function):
    """Draws a dropout mask in forward (global RNG), saves it."""

    @staticmethod
    def forward(ctx, x):
        m = (torch.rand(x.shape) > 0.3).to(x.dtype) / 0.7
        ctx.save_for_backward(m)
        return x * m

    @staticmethod
    def backward(ctx, g):
        (m,) = ctx.saved_tensors
        return g * m


class RandBackward(Function):
    """Draws noise in backward (global RNG): a gradient-noise layer."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (1 + 0.1 * torch.randn(x.shape)) + 0 * x


class RandGenArg(Function):
    """Draws from a generator passed as an argument (the block's own)."""

    @staticmethod
    def forward(ctx, x, gen):
        n = torch.randn(x.shape, generator=gen)
        ctx.save_for_backward(n)
        return x * (1 + 0.1 * n)

    @staticmethod
    def backward(ctx, g):
        (n,) = ctx.saved_tensors
        return g * (1 + 0.1 * n), None


class GenBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.gen = torch.Generator().manual_seed(7 + i)

    def forward(self, x):
        return x + 0.5 * RandGenArg.apply(self.mlp(x), self.gen)


# --- nested graphs ----------------------------------------------------------------


class NestedGrad(Function):
    """forward runs enable_grad + autograd.grad on an energy (a force), saves the force."""

    @staticmethod
    def forward(ctx, x, w):
        with torch.enable_grad():
            xx = x.detach().requires_grad_(True)
            e = (torch.tanh(xx * w.detach()) ** 2).sum()
            (f,) = torch.autograd.grad(e, xx)
        ctx.save_for_backward(f, w)
        return x + 0.1 * f

    @staticmethod
    def backward(ctx, g):
        f, w = ctx.saved_tensors
        return g, (g * f).reshape(-1, H).sum(0) * 0.01


class SubmoduleNoGrad(Function):
    """Runs a sub-module (teacher) inside forward under no_grad, saves its output."""

    @staticmethod
    def forward(ctx, x, mod):
        with torch.no_grad():
            t = torch.sigmoid(mod(x))
        ctx.save_for_backward(t)
        return x * t

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return g * t, None


class TeacherBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.teacher = nn.Linear(H, H)

    def forward(self, x):
        return x + 0.5 * SubmoduleNoGrad.apply(self.mlp(x), self.teacher)


class InnerFunction(Function):
    """forward calls another Function; backward calls one too."""

    @staticmethod
    def forward(ctx, x, w):
        y = MulW.apply(x, w)  # grad off inside forward: saves nothing
        ctx.save_for_backward(x, w)
        return torch.tanh(y)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        y = MulW.apply(x, w)
        t = torch.tanh(y)
        d = g * (1 - t * t)
        return d * w, (d * x).reshape(-1, H).sum(0)


# --- dtypes and layouts -----------------------------------------------------------


class MaskGather(Function):
    """Float with a bool mask and integer indices; saves the mask and indices."""

    @staticmethod
    def forward(ctx, x, mask, idx):
        y = x.masked_fill(~mask, 0.0).gather(-1, idx)
        ctx.save_for_backward(mask, idx)
        ctx.shape = x.shape
        return y

    @staticmethod
    def backward(ctx, g):
        mask, idx = ctx.saved_tensors
        gx = torch.zeros(ctx.shape, dtype=g.dtype).scatter_add(-1, idx, g)
        return gx.masked_fill(~mask, 0.0), None, None


class ComplexMul(Function):
    @staticmethod
    def forward(ctx, z, c):
        ctx.save_for_backward(z, c)
        return z * c

    @staticmethod
    def backward(ctx, g):
        z, c = ctx.saved_tensors
        return g * c.conj(), (g * z.conj()).reshape(-1, c.shape[-1]).sum(0)


class ComplexBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.c = nn.Parameter(torch.randn(H // 2, 2) * 0.3 + torch.tensor([1.0, 0.0]))

    def forward(self, x):
        h = self.mlp(x)
        z = torch.view_as_complex(h.reshape(*h.shape[:-1], H // 2, 2).contiguous())
        y = ComplexMul.apply(z, torch.view_as_complex(self.c))
        return x + 0.5 * torch.view_as_real(y).reshape(h.shape)


class ChanScale(Function):
    """Per-channel scale of a channels_last 4-D input; saves it (channels_last)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w.view(1, -1, 1, 1)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w.view(1, -1, 1, 1), (g * x).sum((0, 2, 3))


class CLBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1).to(memory_format=torch.channels_last)
        self.w = nn.Parameter(torch.randn(8) * 0.3 + 1)

    def forward(self, x):
        h = self.conv(x.contiguous(memory_format=torch.channels_last))
        return x + 0.5 * ChanScale.apply(torch.tanh(h), self.w)


class SparseMM(Function):
    """Sparse COO constant times dense; saves both."""

    @staticmethod
    def forward(ctx, a, x):
        ctx.save_for_backward(a, x)
        return torch.sparse.mm(a, x)

    @staticmethod
    def backward(ctx, g):
        a, x = ctx.saved_tensors
        return None, torch.sparse.mm(a.t(), g)


def _sparse_adj(n: int) -> torch.Tensor:
    i = torch.arange(n)
    idx = torch.stack([torch.cat([i, i]), torch.cat([i, (i + 1) % n])])
    val = torch.cat([torch.full((n,), 0.5), torch.full((n,), 0.25)])
    return torch.sparse_coo_tensor(idx, val, (n, n)).coalesce()


class SparseBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.register_buffer("adj", _sparse_adj(18))

    def forward(self, x):
        h = self.mlp(x)
        y = SparseMM.apply(self.adj, h.reshape(-1, H))
        return x + 0.5 * y.reshape(h.shape)


class SparseInBlock(nn.Module):
    """The sparse matrix is built inside the forward from the activation (values require grad)."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, x):
        h = self.mlp(x).reshape(-1, H)
        hd = h.detach()
        a = ((hd @ hd.t()) > 1).float().mul(0.05).to_sparse()  # made from the activation
        y = SparseMM.apply(a, h)
        return x + 0.1 * y.reshape(x.shape)


# --- parameters, buffers, caches --------------------------------------------------


class SaveParamView(Function):
    """Saves a parameter and a transposed view of another parameter."""

    @staticmethod
    def forward(ctx, x, wt, b):
        ctx.save_for_backward(wt, b)
        return x @ wt + b

    @staticmethod
    def backward(ctx, g):
        wt, b = ctx.saved_tensors
        return g @ wt.t(), None, g.reshape(-1, H).sum(0) + 0 * b


class ParamBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.lin = nn.Linear(H, H)

    def forward(self, x):
        # the weight enters without grad (a frozen projection), bias with
        return x + 0.5 * SaveParamView.apply(self.mlp(x), self.lin.weight.t(), self.lin.bias)


class SaveBuffer(Function):
    @staticmethod
    def forward(ctx, x, buf):
        ctx.save_for_backward(buf)
        ctx.buf_attr = buf
        return x * buf

    @staticmethod
    def backward(ctx, g):
        (buf,) = ctx.saved_tensors
        return g * buf + 0 * ctx.buf_attr, None


class BufferBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, H))

    def forward(self, x):
        return x + 0.5 * SaveBuffer.apply(self.mlp(x), self.scale)


_GLOBAL = {"fixed": torch.linspace(-1, 1, H).cos()}
_LAZY: dict[tuple, torch.Tensor] = {}


def _lazy_cache(shape) -> torch.Tensor:
    key = tuple(shape)
    if key not in _LAZY:
        _LAZY[key] = torch.linspace(0, 1, int(torch.tensor(shape).prod())).reshape(shape).sin()
    return _LAZY[key]


class SaveGlobal(Function):
    @staticmethod
    def forward(ctx, x):
        c1 = _GLOBAL["fixed"]
        c2 = _lazy_cache(x.shape)
        ctx.save_for_backward(c1, c2)
        return x * c1 + c2 * x

    @staticmethod
    def backward(ctx, g):
        c1, c2 = ctx.saved_tensors
        return g * (c1 + c2)


class RunningStat(Function):
    """forward updates a running-mean buffer in place (passed in) and saves it."""

    @staticmethod
    def forward(ctx, x, rm):
        mean = x.reshape(-1, x.shape[-1]).mean(0)
        rm.mul_(0.9).add_(mean * 0.1)
        ctx.save_for_backward(rm)
        return x - rm

    @staticmethod
    def backward(ctx, g):
        (rm,) = ctx.saved_tensors
        return g * (1 + 0 * rm), None


class RunningStatAttr(Function):
    """Same, but the mutated buffer is stashed on ctx as an attribute and read in backward;
    a clone of its value saved for comparison."""

    @staticmethod
    def forward(ctx, x, rm):
        mean = x.reshape(-1, x.shape[-1]).mean(0)
        rm.mul_(0.9).add_(mean * 0.1)
        ctx.rm = rm
        y = x * rm.sigmoid()
        ctx.save_for_backward(rm.clone())
        return y

    @staticmethod
    def backward(ctx, g):
        (rm0,) = ctx.saved_tensors
        return g * rm0.sigmoid() + 0 * ctx.rm, None


class StatBlock(nn.Module):
    def __init__(self, i: int, fn) -> None:
        super().__init__()
        self.mlp = MLP()
        self.fn = fn
        self.register_buffer("rm", torch.zeros(H))

    def forward(self, x):
        return x + 0.5 * self.fn.apply(self.mlp(x), self.rm)


class WriteBufferDirty(Function):
    """mark_dirty on a buffer (no grad) written in place and returned."""

    @staticmethod
    def forward(ctx, x, buf):
        buf.add_(x.detach().reshape(-1, H).mean(0) * 0.01)
        ctx.mark_dirty(buf)
        ctx.save_for_backward(x)
        return buf, x * 2

    @staticmethod
    def backward(ctx, gb, gx):
        (x,) = ctx.saved_tensors
        return gx * 2 + 0 * x, None


class DirtyBufBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.register_buffer("acc", torch.zeros(H))

    def forward(self, x):
        b, y = WriteBufferDirty.apply(self.mlp(x), self.acc)
        return x + 0.5 * y + b


# --- block functions for FnBlock ----------------------------------------------------


def f_input(m, h):
    return MulW.apply(h, m.w)


def f_output(m, h):
    return ExpOut.apply(h)


def f_intermediate(m, h):
    return TanhSig.apply(h)


def f_view(m, h):
    return SaveInputView.apply(torch.tanh(h))


def f_twice(m, h):
    return SaveTwice.apply(h, m.w)


def f_none(m, h):
    return SaveNone.apply(h, m.w)


def f_access_twice(m, h):
    return AccessTwice.apply(h, m.w)


def f_unread(m, h):
    return SavedUnread.apply(h)


def f_ctx_input(m, h):
    return CtxAttrInput.apply(h, m.w)


def f_ctx_inter(m, h):
    return CtxAttrIntermediate.apply(h)


def f_dirty_out(m, h):
    return ReluInplaceSaveOut.apply(h * m.w)


def f_argmax(m, h):
    h = torch.tanh(h)
    v, idx = ArgmaxVals.apply(h)
    return h * v + 0.01 * idx.float()


def f_three_out(m, h):
    a, b, c = ThreeOut.apply(h, m.w)
    return a if m.i == 1 else a + b  # c never used; block 1 uses only a


def f_once(m, h):
    return OnceDiff.apply(h, m.w)


def f_return_view(m, h):
    v = ReturnView.apply(h)
    return torch.cat([v * 2, v.sin()], -1)


def f_return_input(m, h):
    return ReturnInputAsIs.apply(h, m.w) * m.w


def f_nontensor_out(m, h):
    y, n, k = NonTensorOutputs.apply(h)
    assert n is None and k == 3
    return y * 0.1


def f_list_arg(m, h):
    return ListArg.apply(h, [m.w.detach(), m.w.detach().cos()])


def f_needs_grad_w(m, h):
    # w requires grad only in block 0's Function call
    return NeedsInputGrad.apply(h, m.w if m.i == 0 else m.w.detach())


def f_sc_vmap(m, h):
    return SCMul.apply(h, m.w)


def f_sc_vmap_used(m, h):
    # the Function under torch.func.vmap inside the forward (per-row)
    return torch.func.vmap(SCMul.apply, in_dims=(0, None))(h, m.w)


def f_sc_gen_vmap(m, h):
    return torch.func.vmap(SCGen.apply)(h) * m.w


def f_rand_mask(m, h):
    return RandMask.apply(h)


def f_rand_bwd(m, h):
    return RandBackward.apply(h) * m.w


def f_nested_grad(m, h):
    return NestedGrad.apply(h, m.w)


def f_inner_fn(m, h):
    return InnerFunction.apply(h, m.w)


def f_mask_gather(m, h):
    mask = h > 0
    idx = h.detach().argsort(-1)
    return MaskGather.apply(h, mask, idx) * m.w


def f_noncontig(m, h):
    ht = h.transpose(0, 1)  # non-contiguous
    return MulW.apply(ht, m.w).transpose(0, 1)


def f_global(m, h):
    return SaveGlobal.apply(h)


class NeedsGradXBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.lin = nn.Linear(H, H)
        self.w = nn.Parameter(torch.randn(H) * 0.5 + 1)

    def forward(self, x):
        # x: the batch for block 0 (no grad), an activation later
        return self.lin(NeedsInputGradX.apply(x, self.w))


MODELS = {
    "sfb_input": fn_block(f_input),
    "sfb_output": fn_block(f_output),
    "sfb_intermediate": fn_block(f_intermediate),
    "sfb_view_input": fn_block(f_view),
    "sfb_twice": fn_block(f_twice),
    "sfb_none": fn_block(f_none),
    "sfb_access_twice": fn_block(f_access_twice),
    "sfb_unread": fn_block(f_unread),
    "ctx_attr_input": fn_block(f_ctx_input),
    "ctx_attr_inter": fn_block(f_ctx_inter),
    "dirty_save_out": fn_block(f_dirty_out),
    "nondiff_argmax": fn_block(f_argmax),
    "three_out_nomat": fn_block(f_three_out),
    "once_diff": fn_block(f_once),
    "return_view": fn_block(f_return_view),
    "return_input": fn_block(f_return_input),
    "nontensor_out": fn_block(f_nontensor_out),
    "list_arg": fn_block(f_list_arg),
    "needs_grad_w": fn_block(f_needs_grad_w),
    "needs_grad_x": stack(NeedsGradXBlock),
    "sc_vmap": fn_block(f_sc_vmap),
    "sc_vmap_used": fn_block(f_sc_vmap_used),
    "sc_genvmap_used": fn_block(f_sc_gen_vmap),
    "rand_mask": fn_block(f_rand_mask),
    "rand_bwd": fn_block(f_rand_bwd),
    "rand_gen_arg": stack(GenBlock),
    "nested_grad": fn_block(f_nested_grad),
    "submod_nograd": stack(TeacherBlock),
    "inner_fn": fn_block(f_inner_fn),
    "int_bool": fn_block(f_mask_gather),
    "complex": stack(ComplexBlock),
    "channels_last": stack(CLBlock),
    "noncontig": fn_block(f_noncontig),
    "sparse_buf": stack(SparseBlock),
    "sparse_made": stack(SparseInBlock),
    "param_view": stack(ParamBlock),
    "buffer": stack(BufferBlock),
    "global_cache": fn_block(f_global),
    "running_stat": stack(lambda i: StatBlock(i, RunningStat)),
    "running_stat_attr": stack(lambda i: StatBlock(i, RunningStatAttr)),
    "ctx_attr_output": fn_block(f_ctx_output),
}

BATCHES = {
    "channels_last": randn(2, 8, 6, 6),
}


def batch(name, model):
    return BATCHES.get(name, randn(3, 6, H))


# --- double backward (gradient penalty), a hand-written loop ------------------------


class SqFn(Function):
    """backward differentiable: uses saved input with differentiable ops."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return 2 * x * w * g, (g * x * x).reshape(-1, H).sum(0)


class ExpOutFn(Function):
    """Saves its output; its backward is differentiable through the output (whose grad_fn
    is this Function again)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.exp(-x.abs() * 0.5)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y * (-0.5) * torch.sign(x)


class DBBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.w = nn.Parameter(torch.randn(H) * 0.3 + 1)

    def forward(self, x):
        h = self.mlp(x)
        return x + 0.3 * SqFn.apply(torch.tanh(h), self.w) + 0.3 * ExpOutFn.apply(h)


def gp_loop(model, steps, rt=None):
    import contextlib

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    with rt if rt is not None else contextlib.nullcontext():
        for s in range(steps):
            torch.manual_seed(10 * s)
            x = torch.randn(3, 6, H, generator=_gen(s)).requires_grad_(True)
            loss = model(x)
            (gx,) = torch.autograd.grad(loss, x, create_graph=True)
            total = loss + 0.5 * gx.square().sum()
            total.backward()
            snap = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            snap["loss"] = total.detach().clone()
            out.append(snap)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return out


def run_gp(variants) -> int:
    failed = 0
    for v in variants:
        t0 = time.time()
        try:
            torch.manual_seed(0)
            model = stack(DBBlock)().train()
            ref = gp_loop(copy.deepcopy(model), 4)
            ref2 = gp_loop(copy.deepcopy(model), 4)
            assert_bitwise(ref, ref2)
            budget = None
            if v in ("auto_tight", "auto_serve"):
                probe = copy.deepcopy(model)
                keep = variant_runtime(probe, "keep")
                gp_loop(probe, 1, keep)
                budget = max(r.peak_activation_bytes for r in keep.report().steps) // 2
            m = copy.deepcopy(model)
            rt = variant_runtime(m, v, budget)
            assert_bitwise(ref, gp_loop(m, 4, rt))
            recs = rt.report().steps
            info = f"recs={len(recs)} replays={sum(r.replays for r in recs)} phases={[r.phase for r in recs]}"
            print(f"PASS {'double_bwd_gp':16s} {v:12s} {time.time() - t0:5.1f}s {info}", flush=True)
        except Exception as e:
            failed += 1
            print(f"FAIL {'double_bwd_gp':16s} {v:12s} {type(e).__name__}: {str(e)[:300]}", flush=True)
            if "-v" in sys.argv:
                traceback.print_exc()
    return failed


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "-v"]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ZOO_VARIANTS
    rc = 0
    if only is None or "double_bwd_gp" in only:
        rc |= run_gp(variants)
    rc |= run(MODELS, batch)
    sys.exit(1 if rc else 0)
