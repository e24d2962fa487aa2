"""Degenerate shapes and unusual tensors inside blocks (3 blocks per model), under the six
zoo variants; gradients/buffers/loss bitwise vs plain (tests.helpers), plus input
gradients where the input requires grad, plus a books check (rt.report().steps).

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05r/sweep_r.py [NAME,..|all] [VARIANT,..] [-v]
"""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
import time
import traceback
import warnings
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import (
    ZOO_VARIANTS,
    assert_bitwise,
    check_variant_report,
    tight_budget,
    train,
    variant_runtime,
)

torch.set_num_threads(1)


class _Print(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        print(f"LOG  {record.name}: {record.getMessage()[:400]}", flush=True)


logging.getLogger("offrecomp").addHandler(_Print(logging.WARNING))
logging.getLogger("offrecomp").propagate = False
logging.captureWarnings(True)
logging.getLogger("py.warnings").addHandler(_Print(logging.WARNING))
logging.getLogger("py.warnings").propagate = False
warnings.filterwarnings("ignore", message=".*nested tensors.*prototype.*")
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")

H = 16


def g(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module], loss: Callable[[Any], torch.Tensor] | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self._loss = loss

    def forward(self, x: Any) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        if self._loss is not None:
            return self._loss(x)
        return x.float().square().sum() / max(1, x.numel())


def stack(block: Callable[[], nn.Module], loss: Any = None, prep: Any = None) -> Callable[[], nn.Module]:
    def f() -> nn.Module:
        m = Stack([block() for _ in range(3)], loss)
        return prep(m) if prep is not None else m

    return f


class MLP(nn.Module):
    def __init__(self, h: int = H) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 2 * h)
        self.fc2 = nn.Linear(2 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


# ---------------------------------------------------------------- zero-size
class ZeroLenLinear(nn.Module):
    """A Linear(0, H) fed a (B, 0) slice: saves a zero-length-dim intermediate; bmm with a
    zero inner dim."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.z = nn.Linear(0, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        e = h[:, :0]
        a = self.z(e * 2.0)  # input (B, 0) saved
        b = torch.bmm(h.unsqueeze(1)[:, :, :0], h.unsqueeze(2)[:, :0, :])  # (B,1,1) zeros
        return x + h * a.sigmoid() + b.squeeze(1)


class CatEmpty(nn.Module):
    """torch.cat with torch.empty((0, d)) and a zero-size parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.p0 = nn.Parameter(torch.empty(0, H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        c = torch.cat([h, torch.empty((0, H)), self.p0], 0)
        c2 = torch.cat([torch.empty((0, H)), c.sin()], 0)
        return x + torch.tanh(c2) * c


class ZeroBlock(nn.Module):
    """Block whose intermediate is entirely zero-numel: a (B, 0, H) tensor via expand."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        z = h.unsqueeze(1).expand(-1, 0, -1)  # (B, 0, H), stride-0 + zero
        zz = torch.softmax(z * 3.0, -1)  # saves zero-numel result
        return x + torch.tanh(h) + zz.sum(1)


# ---------------------------------------------------------------- scalars, tiny, long, many dims
class Temperature(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.t = nn.Parameter(torch.tensor(1.5))  # 0-d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        p = torch.softmax(h / self.t, -1)  # div saves 0-d t
        s = h.norm()  # 0-d intermediate
        return x + p * s / (1 + s)


class OneElem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.a = nn.Parameter(torch.ones(1))
        self.b = nn.Parameter(torch.full((1, 1, 1), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        m = h.mean(dim=(0, 1), keepdim=True)  # (1, 1)
        q = torch.exp(m * self.a)  # (1,1) saved
        r = (h.unsqueeze(0) * self.b).squeeze(0)
        return x + torch.tanh(r) * q + m.sin()


class Long1D(nn.Module):
    """A 2**20-element 1-D activation saved by sin."""

    def __init__(self, n: int = 1 << 20) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.register_buffer("ramp", torch.linspace(-1, 1, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        s = h.mean()
        long = torch.sin(self.ramp * s)  # (1M,) saved by sin + mul
        flat = torch.tanh(h.reshape(-1))  # 1-D
        return x + flat.view_as(h) + long.mean()


class ManyDims(nn.Module):
    """8-d activations, permuted, saved by tanh/mul."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 2).reshape(1, 1, 2, 1, 1, 1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        h = self.fc(x).reshape(B, 1, 2, 2, 2, 2, 1, 1)
        p = h.permute(7, 1, 3, 2, 5, 4, 6, 0)
        t = torch.tanh(p * self.w.permute(7, 1, 3, 2, 5, 4, 6, 0))
        return x + t.permute(7, 1, 3, 2, 5, 4, 6, 0).reshape(B, H)


# ---------------------------------------------------------------- views
class ExpandStride0(nn.Module):
    """Saves expanded (stride-0) views; returns a stride-0 view to the next region."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.w = nn.Parameter(torch.randn(1, 5, H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        e = h[:, None, :].expand(-1, 5, -1)
        y = (e * self.w).tanh().mean(1)
        c = torch.broadcast_to(h.mean(0, keepdim=True), x.shape)  # stride 0 in dim 0
        out = x + y + c * c
        # the output: an expand of a row (stride 0 region input of the next block)
        return out.mean(0, keepdim=True).expand(x.shape[0], -1) + out


class Unfold(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.w = nn.Parameter(torch.linspace(0.1, 1.0, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        win = h.unfold(1, 4, 2)  # (B, 7, 4) overlapping
        y = (win * self.w).sum(-1)  # saves overlapping view
        asw = torch.as_strided(h, (h.shape[0], H - 3, 4), (H, 1, 1))
        z = (asw.exp()).sum(-1)
        return x + F.pad(y, (0, H - y.shape[1])) + F.pad(z, (0, 3))


class Flips(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        f = torch.flip(h, [0, 1])
        r = torch.rot90(h.view(-1, 4, 4), 1, [1, 2]).reshape_as(h)
        return x + torch.tanh(f).flip([0, 1]) * torch.sigmoid(r) + h.fliplr().sin().fliplr()


class Permuted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.w = nn.Parameter(torch.randn(H, H) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, H)
        h = self.fc(x)
        p = h.permute(2, 0, 1)  # non-contiguous
        a = torch.tanh(p)
        tt = h.transpose(1, 2)
        m = tt.mT @ self.w  # matmul saves transposed
        return x + a.permute(1, 2, 0) + m * h.transpose(0, 1).transpose(0, 1).sigmoid()


class NarrowOfBig(nn.Module):
    """Only a small slice of a large (B, 4096) intermediate is saved."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(H, 4096)
        self.down = nn.Linear(2, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = self.up(x)
        small = big.narrow(1, 100, 2)  # view of big's storage
        t = torch.tanh(small)  # tanh saves its result (fresh)
        s = small * small  # mul saves the view (keeps big's storage)
        sel = big.select(1, 7)  # (B,) view
        return x + self.down(t + s) + sel.unsqueeze(1).sin()


class Bitcast(nn.Module):
    """One int32 storage saved as int32 (index_select index) and as float32 (mul)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.p = nn.Parameter(torch.ones(H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        B = h.shape[0]
        idx = (torch.arange(H, dtype=torch.int32) * 7) % max(B, 1)  # int32 < B
        f = idx.view(torch.float32)  # denormals sharing idx's storage
        a = torch.index_select(h, 0, idx[:B] if B <= H else idx)  # saves int32 idx view
        w = f * self.p  # saves f (float view of int storage)
        h64 = h.detach().clone()
        i64 = h64.view(torch.int32)  # bit view of a float
        return x + a[:B].sin() * 0.5 + w.mean() * 1e30 + (i64 & 1).float() * h


# ---------------------------------------------------------------- dtypes
class DT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc = nn.Linear(H, 2 * H)
        self.fc2 = nn.Linear(2 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc(self.ln(x))) * F.silu(self.fc(x)))


class ComplexLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(H, H, dtype=torch.complex64) / 4)
        self.b = nn.Parameter(torch.zeros(H, dtype=torch.complex64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x real (B, 2H)
        z = torch.view_as_complex(x.reshape(x.shape[0], H, 2).contiguous())
        y = z @ self.w + self.b
        r = torch.view_as_real(y)  # (B, H, 2) view
        r = torch.tanh(r) * r
        y2 = torch.view_as_complex(r.contiguous()) * y.conj()
        return x + torch.view_as_real(y2).reshape(x.shape[0], 2 * H) * 0.1


class IndexOps(nn.Module):
    """gather/scatter/masked_fill/index_put_ with int64, bool and uint8 saves."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        idx = h.detach().argsort(-1)  # int64 (B, H)
        gth = torch.gather(h, 1, idx)  # saves idx
        sc = torch.zeros_like(h).scatter(1, idx, gth.sin())  # saves idx
        mask = h.detach() > 0  # bool
        mf = h.masked_fill(mask, 0.0) * h  # saves mask, h
        u8 = (h.detach() > 0.5).to(torch.uint8)
        mu = h * u8  # mul saves the uint8 tensor
        ip = torch.zeros_like(h).index_put((torch.arange(h.shape[0]).unsqueeze(1), idx), torch.tanh(h), accumulate=True)
        wh = torch.where(mask, h.exp(), h.cos())
        return x + sc + mf + mu + ip + wh * 0.1


# ---------------------------------------------------------------- nested / sparse
class NJTBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.q = nn.Linear(H, H)
        self.k = nn.Linear(H, H)
        self.v = nn.Linear(H, H)
        self.o = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # NJT (B, j, H)
        h = self.ln(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        sp = lambda t: t.unflatten(-1, (2, H // 2)).transpose(1, 2)  # (B, 2, j, 8)
        a = F.scaled_dot_product_attention(sp(q), sp(k), sp(v))
        a = a.transpose(1, 2).flatten(-2)
        return x + self.o(F.gelu(a))


def njt_loss(x: torch.Tensor) -> torch.Tensor:
    return x.values().square().mean()


class NJTLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.ln(x)))


class SparseMM(nn.Module):
    def __init__(self, n: int = 6, kind: str = "coo") -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        m = (torch.rand(n, n, generator=torch.Generator().manual_seed(3)) > 0.5).float()
        self.kind = kind
        self.register_buffer("s", m.to_sparse() if kind == "coo" else m)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (n, H)
        h = torch.tanh(self.fc(x))
        if self.kind == "coo":
            y = torch.sparse.mm(self.s, h)
            hs = (h * (h.detach() > 0)).to_sparse()  # a sparse tensor with grad, saved
            y = y + torch.sparse.mm(hs, torch.eye(H)) 
        else:
            y = self.s.to_sparse_csr() @ h  # (a CSR buffer does not deepcopy)
        return x + y.sin()


# ---------------------------------------------------------------- memory formats
class CL3d(nn.Module):
    def __init__(self, switch: bool = False) -> None:
        super().__init__()
        self.c = nn.Conv3d(4, 4, 3, padding=1).to(memory_format=torch.channels_last_3d)
        self.bn = nn.BatchNorm3d(4)
        self.switch = switch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c(x.contiguous(memory_format=torch.channels_last_3d))
        h = F.relu(self.bn(h))
        if self.switch:
            h = torch.tanh(h.contiguous()) * h  # NCDHW from NDHWC, saves both layouts
            h = h.contiguous(memory_format=torch.channels_last_3d).sigmoid()
        return x + h


class CL2dSwitch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(4, 4, 3, padding=1)
        self.d = nn.Conv2d(4, 4, 1).to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.c(x))  # whatever format x is
        h = self.d(h.to(memory_format=torch.channels_last))  # NHWC
        h = torch.tanh(h).contiguous()  # back to NCHW
        return x + h * x.sigmoid()


# ---------------------------------------------------------------- in place / .data / detach_
class InplaceUnsavedSlice(nn.Module):
    """A fresh tensor's slice is saved (exp saves result; mul saves a view); another slice
    is written through .data (no version bump) and another tensor in place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, H // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.fc(x) * 2
        s = u[:, : H // 2]
        t = s * self.w  # saves s (a view of u)
        u.data[:, H // 2 :].mul_(3)  # write to the unsaved half, unseen by autograd
        v = self.fc(x)  # not saved by anything (addmm saves input and weight)
        v[:, :4].add_(1.0)  # in place on an unsaved tensor
        return x + torch.cat([t, u[:, H // 2 :].tanh()], 1) + v


class Detach(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        g = h * 2  # nothing saves g
        g.detach_()
        d = h.detach()
        d.add_(0.5)  # in place on a detached alias of h; h not saved
        return x + torch.tanh(h + g) + d


class DataTrickSaved(nn.Module):
    """.data write to a saved tensor inside the forward, after its save (documented limit
    when after the save)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        y = torch.sin(h)  # saves h
        h.data.clamp_(-0.5, 0.5)
        return x + y + h


class DataTrickBefore(nn.Module):
    """.data write before any save."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h.data.clamp_(-0.5, 0.5)
        return x + torch.sin(h) * h


class ScalarChain(nn.Module):
    """0-d region inputs and outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1, 1, H))
        self.t = nn.Parameter(torch.tensor(0.7))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # 0-d
        v = torch.tanh(x * self.w) * self.t
        return (v.exp() * x).mean()


class ComplexChain(nn.Module):
    """Complex region inputs/outputs (complex saves are never placed)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(H, H, dtype=torch.complex64) / 4)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        y = z @ self.w
        r = torch.view_as_real(y)
        return z + torch.view_as_complex((torch.tanh(r) * r).contiguous())


def cplx_loss(z: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(z).square().mean()


class MixedDtypeViews(nn.Module):
    """One float32 storage saved as float32 (sin), as a bfloat16 bit view (mul) and as a
    complex64 view (mul; complex is never placed): mixed placements on one storage."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.pb = nn.Parameter(torch.ones(2 * H, dtype=torch.bfloat16))
        self.pc = nn.Parameter(torch.ones(H // 2, dtype=torch.complex64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.fc(x).bfloat16().float()  # low 16 bits zero: its bf16 view is finite
        ud = u.detach()
        a = ud.view(torch.bfloat16) * self.pb  # saves a bf16 view of u's storage
        c = ud.view(torch.complex64) * self.pc  # saves a complex view of u's storage
        return x + torch.sin(u) + 1e-3 * torch.tanh(a.float()[:, :H]) + 1e-3 * torch.view_as_real(c).reshape_as(x)


class Gapped(nn.Module):
    """Saves a tensor whose storage has gaps (empty_strided with padded rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        a = torch.empty_strided(h.shape, (H + 3, 1))
        a.copy_(h)  # differentiable copy into a padded buffer
        return x + torch.tanh(a * self.w)


# ---------------------------------------------------------------- batches
def randn(*shape: int) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randn(*shape, generator=g(s))


def empty_mid(shape: tuple[int, ...], at: int = 10) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randn(*((0,) + shape[1:]) if s == at else shape, generator=g(s))


def seqlen(s: int) -> torch.Tensor:
    L = {0: 5, 10: 9, 20: 3, 30: 12}[s]
    return torch.randn(2, L, H, generator=g(s))


def batch17(s: int) -> torch.Tensor:
    return torch.randn(1 if (s // 10) % 2 == 0 else 7, H, generator=g(s))


def noncontig(s: int) -> torch.Tensor:
    big = torch.randn(10, 3 * H + 5, generator=g(s))
    return big[1::2, 3 : 3 + 2 * H : 2]  # (5, H), strides (2*(3H+5), 2), offset


_PREV: dict[str, torch.Tensor] = {}


def prev_view(s: int) -> torch.Tensor:
    """A view of the previous step's tensor (a ring buffer written in place)."""
    base = _PREV.get("b")
    if base is None or s == 0:
        base = torch.randn(6, H, generator=g(s))
        _PREV["b"] = base
    else:
        base[: -1] = base[1:].clone()
        base[-1] = torch.randn(H, generator=g(s))
    return base[1:]


_INPUTS: list[torch.Tensor] = []


def req_grad(s: int) -> torch.Tensor:
    x = torch.randn(4, 3, H, generator=g(s)).requires_grad_()
    _INPUTS.append(x)
    return x


def req_grad_view(s: int) -> torch.Tensor:
    x = torch.randn(4, 2 * H, generator=g(s)).requires_grad_()
    _INPUTS.append(x)
    return x[:, ::2]  # a non-leaf view with grad


def njt(lens: list[int]) -> Callable[[int], torch.Tensor]:
    def f(s: int) -> torch.Tensor:
        gg = g(s)
        return torch.nested.nested_tensor([torch.randn(L, H, generator=gg) for L in lens], layout=torch.jagged)

    return f


def njt_var(s: int) -> torch.Tensor:
    lens = {0: [3, 5], 10: [2, 7, 4], 20: [6, 1], 30: [4, 4, 4]}[s]
    gg = g(s)
    return torch.nested.nested_tensor([torch.randn(L, H, generator=gg) for L in lens], layout=torch.jagged)


def njt_grad(s: int) -> torch.Tensor:
    gg = g(s)
    x = torch.nested.nested_tensor([torch.randn(L, H, generator=gg) for L in (3, 5, 2)], layout=torch.jagged, requires_grad=True)
    _INPUTS.append(x)
    return x


def cl_input(s: int) -> torch.Tensor:
    return torch.randn(2, 4, 6, 6, generator=g(s)).contiguous(memory_format=torch.channels_last)


def dt(dtype: torch.dtype) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randn(4, 3, H, generator=g(s)).to(dtype)


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any], bool]] = {
    # name: (factory, batch, stable)
    "empty_batch_step": (stack(MLP), empty_mid((4, 3, H), 10), False),
    "empty_batch_first": (stack(MLP), empty_mid((4, 3, H), 0), False),
    "empty_every_step": (stack(MLP), randn(0, 3, H), True),
    "zero_len_linear": (stack(ZeroLenLinear), randn(5, H), True),
    "cat_empty": (stack(CatEmpty), randn(5, H), True),
    "zero_numel_expand": (stack(ZeroBlock), randn(5, H), True),
    "scalar_temperature": (stack(Temperature), randn(5, H), True),
    "one_element": (stack(OneElem), randn(5, H), True),
    "one_row_batch": (stack(MLP), randn(1, 1, H), True),
    "long_1d": (stack(Long1D), randn(5, H), True),
    "many_dims": (stack(ManyDims), randn(5, H), True),
    "expand_stride0": (stack(ExpandStride0), randn(5, H), True),
    "unfold_as_strided": (stack(Unfold), randn(5, H), True),
    "flips": (stack(Flips), randn(5, H), True),
    "permuted": (stack(Permuted), randn(3, 4, H), True),
    "narrow_of_big": (stack(NarrowOfBig), randn(5, H), True),
    "bitcast_views": (stack(Bitcast), randn(5, H), True),
    "fp16_params": (stack(DT, prep=lambda m: m.half()), dt(torch.float16), True),
    "bf16_params": (stack(DT, prep=lambda m: m.bfloat16()), dt(torch.bfloat16), True),
    "fp64_params": (stack(DT, prep=lambda m: m.double()), dt(torch.float64), True),
    "complex64": (stack(ComplexLinear), randn(5, 2 * H), True),
    "index_ops": (stack(IndexOps), randn(5, H), True),
    "var_seqlen": (stack(MLP), seqlen, False),
    "batch_1_vs_7": (stack(MLP), batch17, False),
    "noncontig_input": (stack(MLP), noncontig, True),
    "prev_step_view_input": (stack(MLP), prev_view, True),
    "requires_grad_input": (stack(MLP), req_grad, True),
    "requires_grad_view_input": (stack(MLP), req_grad_view, True),
    "njt_linear": (stack(NJTLinear, loss=njt_loss), njt([3, 5, 2]), True),
    "njt_sdpa": (stack(NJTBlock, loss=njt_loss), njt([3, 5, 2]), True),
    "njt_var_lengths": (stack(NJTLinear, loss=njt_loss), njt_var, False),
    "njt_requires_grad": (stack(NJTLinear, loss=njt_loss), njt_grad, True),
    "sparse_coo_mm": (stack(lambda: SparseMM(6, "coo")), randn(6, H), True),
    "sparse_csr_mm": (stack(lambda: SparseMM(6, "csr")), randn(6, H), True),
    "channels_last_3d": (stack(CL3d), lambda s: torch.randn(2, 4, 3, 4, 4, generator=g(s)), True),
    "cl3d_switch": (stack(lambda: CL3d(True)), lambda s: torch.randn(2, 4, 3, 4, 4, generator=g(s)), True),
    "cl2d_switch_cl_input": (stack(CL2dSwitch), cl_input, True),
    "inplace_unsaved_slice": (stack(InplaceUnsavedSlice), randn(5, H), True),
    "detach_inplace": (stack(Detach), randn(5, H), True),
    "data_after_save": (stack(DataTrickSaved), randn(5, H), True),
    "data_before_save": (stack(DataTrickBefore), randn(5, H), True),
    "mixed_dtype_views": (stack(MixedDtypeViews), randn(5, H), True),
    "gapped_strides": (stack(Gapped), randn(5, H), True),
    "overlapping_input": (stack(MLP), lambda s: torch.randn(5 + H, generator=g(s)).as_strided((5, H), (1, 1)), True),
    "eight_dim_input": (stack(MLP), randn(1, 1, 1, 1, 1, 1, 2, H), True),
    "scalar_chain": (stack(ScalarChain, loss=lambda x: x * x), lambda s: torch.randn((), generator=g(s)), True),
    "expanded_input": (stack(MLP), lambda s: torch.randn(1, H, generator=g(s)).expand(6, H), True),
    "complex_chain": (stack(ComplexChain, loss=cplx_loss), lambda s: torch.randn(5, H, dtype=torch.complex64, generator=g(s)), True),
}

EMPTY = {"empty_batch_step", "empty_batch_first", "empty_every_step"}
_LAST_BOOKS: list = []
INPUT_GRAD = {"requires_grad_input", "requires_grad_view_input", "njt_requires_grad"}


def input_grads() -> list[torch.Tensor]:
    out = []
    for x in _INPUTS:
        gr = x.grad
        if gr is None:
            out.append(torch.tensor(float("nan")))
        else:
            out.append(gr.values().clone() if gr.is_nested else gr.clone())
    return out


def books(rt: Any) -> list[tuple]:
    return [
        (s.phase, s.peak_activation_bytes, s.kept_bytes, s.offloaded_bytes, s.recomputed_bytes, s.input_bytes, s.replays, s.saved_tensors)
        for s in rt.report().steps
    ]


def run_case(name: str, variant: str, steps: int = 4) -> list[tuple]:
    factory, batch, stable = CASES[name]
    torch.manual_seed(0)
    model = factory().train()
    _INPUTS.clear()
    _PREV.clear()
    ref = train(copy.deepcopy(model), batch, steps=steps)
    ref_in = input_grads()
    budget = None
    if variant in ("auto_tight", "auto_serve"):
        try:
            budget = tight_budget(model, batch)
        except AssertionError:  # keep booked 0 in step 0 (an empty batch)
            budget = 1
    m = copy.deepcopy(model)
    _INPUTS.clear()
    _PREV.clear()
    rt = variant_runtime(m, variant, budget)
    got = train(m, batch, rt, steps=steps)
    b = books(rt)
    _LAST_BOOKS[:] = [b]
    assert_bitwise(ref, got)
    got_in = input_grads()
    twice = train(copy.deepcopy(model), batch, steps=steps)
    try:
        assert_bitwise(ref, twice)
    except AssertionError as e:
        print(f"NOTE plain not deterministic: {str(e)[:200]}")
    if name in INPUT_GRAD:
        assert len(got_in) == len(ref_in) == steps, (len(got_in), len(ref_in))
        for i, (a, c) in enumerate(zip(ref_in, got_in)):
            assert a.shape == c.shape and torch.equal(a, c), f"input grad step {i} differs"
    recs = rt.report().steps
    if name in EMPTY:  # steps that save nothing can recompute/offload nothing
        recs = [r for r in recs if r.peak_activation_bytes > 0]
        if not recs:
            return b
    check_variant_report(recs, variant, n_steps=len(recs), stable=stable)
    return b


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "-v"]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ZOO_VARIANTS
    failed = 0
    for name in CASES:
        if only and name not in only:
            continue
        for v in variants:
            t0 = time.time()
            try:
                b = run_case(name, v)
                print(f"PASS {name:26s} {v:11s} {time.time() - t0:5.1f}s", flush=True)
            except Exception as e:
                failed += 1
                print(f"FAIL {name:26s} {v:11s} {type(e).__name__}: {str(e)[:400]}", flush=True)
                if "-v" in sys.argv:
                    traceback.print_exc(file=sys.stdout)
                b = _LAST_BOOKS[0] if _LAST_BOOKS else None
            _LAST_BOOKS.clear()
            if b is not None:
                print(f"BOOKS {name:26s} {v:11s} {b}", flush=True)
    print(f"failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
