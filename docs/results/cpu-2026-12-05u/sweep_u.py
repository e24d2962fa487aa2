"""Generative models written by hand, under every zoo variant, bitwise against plain.

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05u/sweep_u.py [NAME,...|all] [VARIANT,...] [-v]
"""

from __future__ import annotations

import copy
import logging
import math
import random
import sys
from pathlib import Path
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import ZOO_VARIANTS, assert_bitwise, check_variant, variant_runtime

H = 16


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.recs: list[str] = []

    def emit(self, r: logging.LogRecord) -> None:
        self.recs.append(f"{r.levelname} {r.name}: {r.getMessage()}")


LOG = Collect()
logging.getLogger("offrecomp").addHandler(LOG)


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _seed(s: int) -> None:
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)


def vec(s: int, b: int = 6, d: int = 8) -> torch.Tensor:
    return torch.randn(b, d, generator=_gen(s))


def img(s: int, b: int = 4, c: int = 3, n: int = 8) -> torch.Tensor:
    return torch.randn(b, c, n, n, generator=_gen(s))


# --- shared blocks --------------------------------------------------------------------


class Res(nn.Module):
    def __init__(self, d: int = H, p: float = 0.0, temb: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.drop = nn.Dropout(p)
        self.t = nn.Linear(d, 2 * d) if temb else None

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        h = self.fc1(self.norm(x))
        if self.t is not None:
            h = h + self.t(temb)
        return x + self.fc2(self.drop(F.silu(h)))


class ConvRes(nn.Module):
    def __init__(self, c: int = 8, temb: bool = False, p: float = 0.0) -> None:
        super().__init__()
        self.n1, self.n2 = nn.GroupNorm(2, c), nn.GroupNorm(2, c)
        self.c1, self.c2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)
        self.t = nn.Linear(H, c) if temb else None
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x)))
        if self.t is not None:
            h = h + self.t(temb)[:, :, None, None]
        return x + self.c2(self.drop(F.silu(self.n2(h))))


class MLP(nn.Module):
    def __init__(self, din: int, dout: int, n: int = 3, p: float = 0.0, act: str = "") -> None:
        super().__init__()
        self.inp = nn.Linear(din, H)
        self.blocks = nn.ModuleList([Res(H, p) for _ in range(n)])
        self.out = nn.Linear(H, dout)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        h = self.out(h)
        return torch.tanh(h) if self.act == "tanh" else h


def temb_of(t: torch.Tensor) -> torch.Tensor:
    """sinusoidal embedding of shape (B, H) of a (B,) float tensor"""
    f = torch.exp(-math.log(1000.0) * torch.arange(H // 2) / (H // 2))
    a = t[:, None] * f[None] * 100
    return torch.cat([a.sin(), a.cos()], -1)


# --- VAEs -----------------------------------------------------------------------------


class VAE(nn.Module):
    def __init__(self, d: int = 8, z: int = 4, p: float = 0.1) -> None:
        super().__init__()
        self.inp = nn.Linear(d, H)
        self.enc = nn.ModuleList([Res(H, p) for _ in range(2)])
        self.mu, self.lv = nn.Linear(H, z), nn.Linear(H, z)
        self.zin = nn.Linear(z, H)
        self.dec = nn.ModuleList([Res(H, p) for _ in range(2)])
        self.out = nn.Linear(H, d)
        self.beta = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.enc:
            h = b(h)
        mu, lv = self.mu(h), self.lv(h)
        q = torch.distributions.Normal(mu, (0.5 * lv).exp())
        z = q.rsample()
        kl = torch.distributions.kl_divergence(q, torch.distributions.Normal(torch.zeros_like(mu), torch.ones_like(mu)))
        h = self.zin(z)
        for b in self.dec:
            h = b(h)
        rec = F.mse_loss(self.out(h), x)
        return rec + self.beta * kl.sum(-1).mean()


class StochRes(nn.Module):
    """A hierarchical VAE block: a latent drawn inside the block (randn_like), its KL
    returned beside the stream."""

    def __init__(self, d: int = H, z: int = 4) -> None:
        super().__init__()
        self.res = Res(d)
        self.q = nn.Linear(d, 2 * z)
        self.p = nn.Linear(z, d)
        self.register_buffer("noise_scale", torch.ones(()))  # annealed by beta_vae_buf
        self.temp = 1.0  # annealed by beta_vae_attr

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.res(h)
        mu, lv = self.q(h).chunk(2, -1)
        z = mu + (0.5 * lv).exp() * torch.randn_like(mu) * self.noise_scale * self.temp
        kl = 0.5 * (mu.pow(2) + lv.exp() - 1 - lv).sum(-1)
        return h + self.p(z), kl


class HVAE(nn.Module):
    def __init__(self, d: int = 8, n: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(d, H)
        self.blocks = nn.ModuleList([StochRes() for _ in range(n)])
        self.out = nn.Linear(H, d)
        self.beta = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        kls = []
        for b in self.blocks:
            h, kl = b(h)
            kls.append(kl)
        return F.mse_loss(self.out(h), x) + self.beta * torch.stack(kls).sum(0).mean()


# --- VQ-VAE ---------------------------------------------------------------------------


class EMAQuant(nn.Module):
    """VQ with EMA codebook updates inside the forward (buffers mutated under no_grad,
    codebook reassigned, dead codes restarted from random batch rows)."""

    def __init__(self, k: int = 8, d: int = H, decay: float = 0.8, use_data: bool = False,
                 dead_thr: float = 0.7) -> None:
        super().__init__()
        self.k, self.decay, self.use_data, self.dead_thr = k, decay, use_data, dead_thr
        self.register_buffer("embed", torch.randn(k, d))
        self.register_buffer("cluster_size", torch.ones(k))
        self.register_buffer("embed_avg", self.embed.clone())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = x.shape[-1]
        flat = x.reshape(-1, d)
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.embed.t() + self.embed.pow(2).sum(1)
        idx = dist.argmin(1)
        q = F.embedding(idx, self.embed).view_as(x)
        if self.training:
            with torch.no_grad():
                onehot = F.one_hot(idx, self.k).type(flat.dtype)
                cs = self.cluster_size.data if self.use_data else self.cluster_size
                ea = self.embed_avg.data if self.use_data else self.embed_avg
                cs.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
                ea.mul_(self.decay).add_(onehot.t() @ flat.detach(), alpha=1 - self.decay)
                n = cs.sum()
                norm = (cs + 1e-5) / (n + self.k * 1e-5) * n
                self.embed = ea / norm.unsqueeze(1)  # reassigned
                dead = cs < self.dead_thr
                if dead.any():
                    nd = int(dead.sum())
                    ridx = torch.randint(0, flat.shape[0], (nd,))
                    new = self.embed.clone()
                    new[dead] = flat.detach()[ridx]
                    self.embed = new
                    ea[dead] = flat.detach()[ridx]
                    cs[dead] = 1.0
        commit = F.mse_loss(x, q.detach())
        return x + (q - x).detach(), commit


class VQVAE(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.enc = nn.ModuleList([ConvRes(c) for _ in range(2)])
        self.pre = nn.Conv2d(c, H, 1)
        self.quant = EMAQuant(d=H)
        self.post = nn.Conv2d(H, c, 1)
        self.dec = nn.ModuleList([ConvRes(c) for _ in range(2)])
        self.out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for b in self.enc:
            h = b(h)
        z = self.pre(h).permute(0, 2, 3, 1)
        q, commit = self.quant(z)
        h = self.post(q.permute(0, 3, 1, 2))
        for b in self.dec:
            h = b(h)
        return F.mse_loss(self.out(h), x) + 0.25 * commit


class RVQVAE(nn.Module):
    """Residual VQ: a ModuleList of EMA quantizers (each a region) over an MLP encoder."""

    def __init__(self, d: int = 8, nq: int = 3, use_data: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(d, H)
        self.enc = nn.ModuleList([Res(H) for _ in range(2)])
        self.quants = nn.ModuleList([EMAQuant(d=H, use_data=use_data) for _ in range(nq)])
        self.dec = nn.ModuleList([Res(H) for _ in range(2)])
        self.out = nn.Linear(H, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.enc:
            h = b(h)
        resid, total, commit = h, torch.zeros_like(h), 0.0
        for qz in self.quants:
            q, c = qz(resid)
            total = total + q
            resid = resid - q.detach()
            commit = commit + c
        h = total
        for b in self.dec:
            h = b(h)
        return F.mse_loss(self.out(h), x) + 0.25 * commit


class VQBlock(nn.Module):
    """A residual block with its own quantizer inside (buffers written through .data)."""

    def __init__(self) -> None:
        super().__init__()
        self.res = Res(H)
        self.quant = EMAQuant(d=H, use_data=True)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.res(h)
        q, c = self.quant(h)
        return h + 0.5 * q, c


class VQInBlock(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.inp = nn.Linear(d, H)
        self.blocks = nn.ModuleList([VQBlock() for _ in range(3)])
        self.out = nn.Linear(H, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, commit = self.inp(x), 0.0
        for b in self.blocks:
            h, c = b(h)
            commit = commit + c
        return F.mse_loss(self.out(h), x) + 0.25 * commit


# --- PixelCNN -------------------------------------------------------------------------


def _mask(w: torch.Tensor, kind: str, vertical_only: bool = False) -> torch.Tensor:
    m = torch.ones_like(w)
    kh, kw = w.shape[-2:]
    if vertical_only:
        m[:, :, kh // 2 + (kind == "B"):, :] = 0  # rows strictly above (A) / up to centre (B)
        return m
    m[:, :, kh // 2, kw // 2 + (kind == "B"):] = 0
    m[:, :, kh // 2 + 1:, :] = 0
    return m


class MaskedConv(nn.Conv2d):
    def __init__(self, cin: int, cout: int, k: int, kind: str, how: str = "data", vertical_only: bool = False) -> None:
        super().__init__(cin, cout, k, padding=k // 2)
        self.register_buffer("mask", _mask(self.weight.detach(), kind, vertical_only))
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "data":
            self.weight.data *= self.mask
        elif self.how == "nograd":
            with torch.no_grad():
                self.weight.mul_(self.mask)
        else:
            return F.conv2d(x, self.weight * self.mask, self.bias, padding=self.padding)
        return super().forward(x)


class PixRes(nn.Module):
    def __init__(self, c: int, how: str) -> None:
        super().__init__()
        self.a = nn.Conv2d(2 * c, c, 1)
        self.m = MaskedConv(c, c, 3, "B", how)
        self.b = nn.Conv2d(c, 2 * c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(F.relu(self.m(F.relu(self.a(F.relu(x))))))


class PixelCNN(nn.Module):
    def __init__(self, c: int = 6, levels: int = 4, how: str = "data") -> None:
        super().__init__()
        self.levels = levels
        self.stem = MaskedConv(1, 2 * c, 5, "A", how)
        self.blocks = nn.ModuleList([PixRes(c, how) for _ in range(3)])
        self.out = nn.Conv2d(2 * c, levels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, 1, n, n) ints in [0, levels)
        h = self.stem(x.float() / (self.levels - 1))
        for b in self.blocks:
            h = b(h)
        return F.cross_entropy(self.out(F.relu(h)), x[:, 0])


class GatedBlock(nn.Module):
    def __init__(self, c: int, ncls: int = 3, how: str = "data") -> None:
        super().__init__()
        self.v = MaskedConv(c, 2 * c, 3, "B", how, vertical_only=True)
        self.h = MaskedConv(c, 2 * c, 3, "B", how)
        self.v2h = nn.Conv2d(2 * c, 2 * c, 1)
        self.h_out = nn.Conv2d(c, c, 1)
        self.cond = nn.Embedding(ncls, 2 * c)

    def forward(self, v: torch.Tensor, h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cy = self.cond(y)[:, :, None, None]
        hv = self.v(v)
        # shift the vertical stack down by one row before feeding the horizontal stack
        hv_shift = F.pad(hv, (0, 0, 1, 0))[:, :, :-1]
        a, b = (hv + cy).chunk(2, 1)
        v_out = torch.tanh(a) * torch.sigmoid(b)
        hh = self.h(h) + self.v2h(hv_shift) + cy
        a, b = hh.chunk(2, 1)
        h_out = h + self.h_out(torch.tanh(a) * torch.sigmoid(b))
        return v_out, h_out


class GatedPixelCNN(nn.Module):
    def __init__(self, c: int = 6, levels: int = 4) -> None:
        super().__init__()
        self.levels = levels
        self.stem_v = MaskedConv(1, c, 5, "A", vertical_only=True)
        self.stem_h = MaskedConv(1, c, 5, "A")
        self.blocks = nn.ModuleList([GatedBlock(c) for _ in range(3)])
        self.out = nn.Conv2d(c, levels, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        f = x.float() / (self.levels - 1)
        v, h = self.stem_v(f), self.stem_h(f)
        for b in self.blocks:
            v, h = b(v, h, y)
        return F.cross_entropy(self.out(F.relu(h)), x[:, 0])


def pix(s: int) -> torch.Tensor:
    return torch.randint(0, 4, (3, 1, 8, 8), generator=_gen(s))


# --- MaskGIT --------------------------------------------------------------------------


class Attn(nn.Module):
    def __init__(self, d: int = H, heads: int = 2, p: float = 0.1, block_rand: str = "") -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.heads, self.p, self.block_rand = heads, p, block_rand

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)).softmax(-1)
        a = F.dropout(a, self.p, self.training)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, n, d))
        h = self.ff(self.n2(x))
        if self.block_rand == "py" and self.training:
            # token drop with a rate drawn from Python's random inside the block
            r = random.random() * 0.3
            h = h * (torch.rand(b, n, 1) > r).float() / (1 - r)
        return x + h


class MaskGIT(nn.Module):
    def __init__(self, vocab: int = 10, n: int = 16, rng: str = "torch") -> None:
        super().__init__()
        self.vocab, self.mask_id, self.rng = vocab, vocab, rng
        self.tok = nn.Embedding(vocab + 1, H)
        self.pos = nn.Parameter(torch.randn(n, H) * 0.02)
        self.blocks = nn.ModuleList([Attn(block_rand="py" if rng == "py" else "") for _ in range(3)])
        self.norm = nn.LayerNorm(H)
        self.head = nn.Linear(H, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, n = tokens.shape
        u = random.random() if self.rng == "py" else float(torch.rand(()))
        ratio = math.cos(u * math.pi / 2)
        k = max(1, int(math.floor(ratio * n)))
        order = torch.rand(b, n).argsort(-1)
        mask = torch.zeros(b, n, dtype=torch.bool).scatter_(1, order[:, :k], True)
        inp = torch.where(mask, torch.full_like(tokens, self.mask_id), tokens)
        h = self.tok(inp) + self.pos
        for blk in self.blocks:
            h = blk(h)
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits[mask], tokens[mask], label_smoothing=0.1)


# --- score / diffusion models (losses inside the forward) -------------------------------


class ScoreNet(nn.Module):
    def __init__(self, d: int = 8, n: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(d, H)
        self.blocks = nn.ModuleList([Res(H, temb=True) for _ in range(n)])
        self.out = nn.Linear(H, d)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        e = temb_of(t)
        h = self.inp(x)
        for b in self.blocks:
            h = b(h, temb=e)
        return self.out(h)


class DSM(nn.Module):
    """Denoising score matching with sigma drawn in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.net = ScoreNet()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sigma = torch.exp(torch.empty(x.shape[0]).uniform_(math.log(0.01), 0.0))
        noise = torch.randn_like(x)
        s = self.net(x + sigma[:, None] * noise, sigma)
        return ((sigma[:, None] * s + noise) ** 2).sum(-1).mean()


class SlicedSM(nn.Module):
    """Sliced score matching: a Hutchinson trace term through autograd.grad(create_graph)
    inside the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, H)
        self.blocks = nn.ModuleList([Res(H) for _ in range(3)])
        self.out = nn.Linear(H, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone().requires_grad_(True)
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        s = self.out(h)
        v = torch.randn_like(x)
        gsv, = torch.autograd.grad((s * v).sum(), x, create_graph=True)
        return (gsv * v).sum(-1).mean() + 0.5 * s.pow(2).sum(-1).mean()


class DDPM(nn.Module):
    def __init__(self, c: int = 8, T: int = 50) -> None:
        super().__init__()
        betas = torch.linspace(1e-4, 0.05, T)
        self.register_buffer("abar", torch.cumprod(1 - betas, 0))
        self.T = T
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.ModuleList([ConvRes(c, temb=True, p=0.1) for _ in range(3)])
        self.out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.randint(0, self.T, (x.shape[0],))
        noise = torch.randn_like(x)
        ab = self.abar[t][:, None, None, None]
        xt = ab.sqrt() * x + (1 - ab).sqrt() * noise
        e = temb_of(t.float() / self.T)
        h = self.stem(xt)
        for b in self.blocks:
            h = b(h, temb=e)
        return F.mse_loss(self.out(h), noise)


F_CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any]]] = {
    "vae": (VAE, lambda s: vec(s)),
    "hvae": (HVAE, lambda s: vec(s)),
    "vqvae_ema": (VQVAE, lambda s: img(s)),
    "rvq_ema": (RVQVAE, lambda s: vec(s, b=8)),
    "rvq_ema_data": (lambda: RVQVAE(use_data=True), lambda s: vec(s, b=8)),
    "vq_in_block": (VQInBlock, lambda s: vec(s, b=8)),
    "pixelcnn_data": (PixelCNN, pix),
    "pixelcnn_nograd": (lambda: PixelCNN(how="nograd"), pix),
    "pixelcnn_mul": (lambda: PixelCNN(how="mul"), pix),
    "gated_pixelcnn": (GatedPixelCNN, lambda s: (pix(s), torch.randint(0, 3, (3,), generator=_gen(s + 50)))),
    "maskgit_torch": (MaskGIT, lambda s: torch.randint(0, 10, (3, 16), generator=_gen(s))),
    "maskgit_py": (lambda: MaskGIT(rng="py"), lambda s: torch.randint(0, 10, (3, 16), generator=_gen(s))),
    "dsm": (DSM, lambda s: vec(s)),
    "sliced_sm": (SlicedSM, lambda s: vec(s)),
    "ddpm": (DDPM, lambda s: img(s)),
}
F_VARYING: frozenset[str] = frozenset()


def _call(model: nn.Module, b: Any) -> Any:
    return model(*b) if isinstance(b, tuple) else model(b)


class TupleIn(nn.Module):
    """check_variant calls model(batch): unpack tuple batches."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, b: Any) -> Any:
        return _call(self.m, b)


# --- loops ----------------------------------------------------------------------------

Snap = dict[str, torch.Tensor]


def grads(m: nn.Module, tag: str) -> Snap:
    return {f"{tag}.{n}": p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


@dataclass
class LoopCase:
    make: Callable[[], nn.Module]
    setup: Callable[[nn.Module], dict[str, Any]]
    step: Callable[[nn.Module, dict[str, Any], int], Snap]
    steps: int = 4


def sgd(lr: float = 0.05) -> Callable[[nn.Module], dict[str, Any]]:
    return lambda m: {"opt": torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=lr)}


def std_step(m: nn.Module, st: dict[str, Any], loss: torch.Tensor, tag: str = "g") -> Snap:
    loss.backward()
    out = grads(m, tag) | {"loss": loss.detach().clone()}
    st["opt"].step()
    st["opt"].zero_grad(set_to_none=True)
    return out


def beta_attr_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    m.beta = min(1.0, 0.25 * (s + 1))  # KL annealing on the root
    for b in m.blocks:  # and a temperature on each region
        b.temp = 1.0 - 0.2 * s
    return std_step(m, st, m(vec(s)))


def beta_buf_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    m.beta = min(1.0, 0.25 * (s + 1))
    with torch.no_grad():
        for b in m.blocks:
            b.noise_scale.fill_(1.0 - 0.2 * s)
    return std_step(m, st, m(vec(s)))


# GAN with hinge loss, R1, EMA generator


class ConvD(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.ModuleList([ConvRes(c) for _ in range(3)])
        self.fc = nn.Linear(c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for b in self.blocks:
            h = F.leaky_relu(b(h), 0.2)
        return self.fc(h.mean((2, 3)))


class ConvG(nn.Module):
    def __init__(self, z: int = 8, c: int = 8) -> None:
        super().__init__()
        self.c = c
        self.fc = nn.Linear(z, c * 64)
        self.blocks = nn.ModuleList([ConvRes(c) for _ in range(3)])
        self.to_img = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.fc(z).view(-1, self.c, 8, 8)
        for b in self.blocks:
            h = b(h)
        return torch.tanh(self.to_img(h))


def gan_make(conv: bool) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        g = ConvG() if conv else MLP(4, 8, act="tanh")
        d = ConvD() if conv else MLP(8, 1, p=0.1)
        return nn.ModuleDict({"g": g, "d": d, "g_ema": copy.deepcopy(g).requires_grad_(False)})
    return make


def gan_setup(m: nn.Module) -> dict[str, Any]:
    return {"opt_d": torch.optim.Adam(m["d"].parameters(), lr=2e-3, betas=(0.0, 0.99)),
            "opt_g": torch.optim.Adam(m["g"].parameters(), lr=2e-3, betas=(0.0, 0.99))}


def gan_r1_step(m: nn.Module, st: dict[str, Any], s: int, conv: bool, lazy: bool = False) -> Snap:
    g, d, ge = m["g"], m["d"], m["g_ema"]
    zdim = 8 if conv else 4
    real = (img(s) if conv else vec(s)).requires_grad_(True)
    fake = g(torch.randn(real.shape[0], zdim)).detach()
    d_real = d(real)
    loss_d = F.relu(1 - d_real).mean() + F.relu(1 + d(fake)).mean()
    out: Snap = {}
    if not lazy or s % 2 == 0:
        gr, = torch.autograd.grad(d_real.sum(), real, create_graph=True)
        r1 = gr.pow(2).flatten(1).sum(1).mean()
        loss_d = loss_d + 5.0 * r1
        out["r1"] = r1.detach().clone()
    st["opt_d"].zero_grad(set_to_none=True)
    loss_d.backward()
    out |= grads(d, "d") | {"loss_d": loss_d.detach().clone()}
    st["opt_d"].step()
    loss_g = -d(g(torch.randn(real.shape[0], zdim))).mean()
    st["opt_g"].zero_grad(set_to_none=True)
    loss_g.backward()
    out |= grads(g, "g") | {"loss_g": loss_g.detach().clone()}
    st["opt_g"].step()
    with torch.no_grad():
        for pe, p in zip(ge.parameters(), g.parameters()):
            pe.lerp_(p, 0.1)
        for be, b in zip(ge.buffers(), g.buffers()):
            be.copy_(b)
        out["ema_sample"] = ge(torch.randn(2, zdim)).clone()
    return out


# EBM with short-run Langevin


def ebm_step(m: nn.Module, st: dict[str, Any], s: int, frozen: bool = False) -> Snap:
    e = m["e"]
    real = vec(s)
    if frozen:  # persistent chains from a replay buffer; parameters frozen, eval mode
        idx = torch.randint(0, m["pool"].buf.shape[0], (real.shape[0],))
        x = m["pool"].buf[idx].clone()
        e.requires_grad_(False)
        e.eval()
    else:
        x = torch.rand_like(real) * 2 - 1
    out: Snap = {}
    for k in range(5):
        x = x.detach().requires_grad_(True)
        gx, = torch.autograd.grad(e(x).sum(), x)
        x = x - 0.05 * gx + 0.01 * torch.randn_like(x)
        out[f"gx{k}"] = gx.detach().clone()
    x = x.detach()
    if frozen:
        e.requires_grad_(True)
        e.train()
        with torch.no_grad():
            m["pool"].buf[idx] = x
    er, ef = e(real), e(x)
    loss = er.mean() - ef.mean() + 0.1 * (er.pow(2).mean() + ef.pow(2).mean())
    return out | std_step(e, st, loss)


class Pool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.rand(20, 8) * 2 - 1)


# consistency training with an EMA target under no_grad


def cm_make() -> nn.Module:
    f = ScoreNet()
    return nn.ModuleDict({"f": f, "f_ema": copy.deepcopy(f).requires_grad_(False)})


def cm_f(net: nn.Module, x: torch.Tensor, t: torch.Tensor, eps: float = 0.002, sd: float = 0.5) -> torch.Tensor:
    c_skip = sd**2 / ((t - eps) ** 2 + sd**2)
    c_out = sd * (t - eps) / (sd**2 + t**2).sqrt()
    return c_skip[:, None] * x + c_out[:, None] * net(x, t)


def cm_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    x = vec(s)
    N = 10
    ts = torch.linspace(0.002, 1.0, N)
    n = torch.randint(0, N - 1, (x.shape[0],))
    z = torch.randn_like(x)
    t1, t0 = ts[n + 1], ts[n]
    pred = cm_f(m["f"], x + t1[:, None] * z, t1)
    with torch.no_grad():
        tgt = cm_f(m["f_ema"], x + t0[:, None] * z, t0)
    loss = (pred - tgt).pow(2).sum(-1).mean()
    out = std_step(m["f"], st, loss)
    with torch.no_grad():
        for pe, p in zip(m["f_ema"].parameters(), m["f"].parameters()):
            pe.mul_(0.9).add_(p, alpha=0.1)
    return out


L_CASES: dict[str, LoopCase] = {
    "beta_vae_attr": LoopCase(HVAE, sgd(), beta_attr_step),
    "beta_vae_buf": LoopCase(HVAE, sgd(), beta_buf_step),
    "gan_r1_mlp": LoopCase(gan_make(False), gan_setup, lambda m, st, s: gan_r1_step(m, st, s, False)),
    "gan_r1_conv": LoopCase(gan_make(True), gan_setup, lambda m, st, s: gan_r1_step(m, st, s, True)),
    "gan_r1_lazy": LoopCase(gan_make(False), gan_setup, lambda m, st, s: gan_r1_step(m, st, s, False, True)),
    "ebm_langevin": LoopCase(lambda: nn.ModuleDict({"e": MLP(8, 1)}),
                             lambda m: {"opt": torch.optim.Adam(m["e"].parameters(), lr=1e-3)}, ebm_step),
    "ebm_pcd_frozen": LoopCase(lambda: nn.ModuleDict({"e": MLP(8, 1, p=0.1), "pool": Pool()}),
                               lambda m: {"opt": torch.optim.Adam(m["e"].parameters(), lr=1e-3)},
                               lambda m, st, s: ebm_step(m, st, s, True)),
    "consistency": LoopCase(cm_make, lambda m: {"opt": torch.optim.Adam(m["f"].parameters(), lr=1e-3)}, cm_step),
}
L_VARYING = frozenset({"gan_r1_lazy"})


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def run_loop(case: LoopCase, model: nn.Module, steps: int, rt: Any = None) -> list[Snap]:
    st = case.setup(model)
    out = []
    with rt if rt is not None else _null():
        for s in range(steps):
            _seed(s)
            snap = case.step(model, st, s)
            snap |= {f"p.{n}": p.detach().clone() for n, p in model.named_parameters()}
            snap |= {f"b.{n}": b.detach().clone() for n, b in model.named_buffers()}
            out.append(snap)
    return out


def check_loop(name: str, case: LoopCase, variant: str) -> Any:
    torch.manual_seed(0)
    model = case.make().train()
    ref = run_loop(case, copy.deepcopy(model), case.steps)
    budget = None
    if variant in ("auto_tight", "auto_serve"):
        probe = copy.deepcopy(model)
        keep = variant_runtime(probe, "keep")
        run_loop(case, probe, 1, keep)
        budget = max(r.peak_activation_bytes for r in keep.report().steps) // 2
        assert budget > 0
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, budget)
    assert_bitwise(ref, run_loop(case, m, case.steps, rt))
    recs = rt.report().steps
    assert recs, "no step records"
    if variant == "recompute":
        assert any(r.replays > 0 for r in recs), "recompute replayed nothing"
    if variant == "offload":
        assert any(r.offloaded_bytes > 0 for r in recs), "offload offloaded nothing"
    if variant.startswith("auto"):
        phases = [r.phase for r in recs]
        assert phases[0] == "measure", phases
        if name not in L_VARYING:
            assert phases[-1] in ("planned", "borrowed", "calibrate"), phases
    if variant in ("auto_tight", "auto_serve"):
        assert any(r.recomputed_bytes > 0 for r in recs[len(recs) // 2:]), "a tight budget dropped nothing"
    return rt


def summary(rt: Any) -> str:
    recs = rt.report().steps
    return f"recs={len(recs)} replays={sum(r.replays for r in recs)} phases={''.join(r.phase[0] for r in recs)}"


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "-v"]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ZOO_VARIANTS
    failed = 0
    names = [("F", n) for n in F_CASES] + [("L", n) for n in L_CASES]
    for kind, name in names:
        if only and name not in only:
            continue
        for v in variants:
            t0 = time.time()
            LOG.recs.clear()
            try:
                if kind == "L":
                    rt = check_loop(name, L_CASES[name], v)
                else:
                    factory, batch = F_CASES[name]
                    torch.manual_seed(0)
                    model = TupleIn(factory()).train()
                    rt, _ = check_variant(model, batch, v, steps=4, stable=name not in F_VARYING)
                print(f"PASS {kind} {name:16s} {v:10s} {time.time() - t0:5.1f}s {summary(rt)}", flush=True)
            except Exception as e:
                failed += 1
                print(f"FAIL {kind} {name:16s} {v:10s} {type(e).__name__}: {str(e)[:400]}", flush=True)
                if "-v" in sys.argv:
                    traceback.print_exc()
            seen = []
            for r in LOG.recs:
                if r not in seen:
                    seen.append(r)
            for r in seen:
                print(f"    LOG {r[:400]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
