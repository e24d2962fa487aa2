"""SNNs (snntorch, norse), liquid nets (ncps), xLSTM, DiT under every zoo variant.

    cd REPO && PYTHONPATH=DIR OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05s/sweep_s.py [NAME,...|all] [VARIANT,...] [-v]
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
import warnings
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))

import numpy as np
import torch
import torch.nn.functional as F
from sweep import run
from torch import nn

from tests.helpers import ZOO_VARIANTS, assert_bitwise, check_variant_report, variant_runtime

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
warnings.filterwarnings("ignore", category=DeprecationWarning)


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _loss(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    w = torch.arange(x.numel(), dtype=x.dtype).sin().view_as(x)
    return x.square().mean() + (x * w).mean()


# ---------------------------------------------------------------- snntorch
import snntorch as snn  # noqa: E402
from snntorch import surrogate  # noqa: E402
from snntorch import utils as snn_utils  # noqa: E402
import snntorch.functional as SF  # noqa: E402


def _neurons(m: nn.Module):
    return [n for n in m.modules() if isinstance(n, snn.SpikingNeuron)]


class LeakyHiddenBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.lif = snn.Leaky(beta=0.8 + 0.05 * i, init_hidden=True, learn_beta=True, learn_threshold=True,
                             spike_grad=surrogate.fast_sigmoid(25),
                             reset_mechanism="subtract" if i % 2 == 0 else "zero")

    def forward(self, x):
        return self.lif(self.fc(x))


class LeakyExplicitBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.lif = snn.Leaky(beta=0.9, learn_beta=True, spike_grad=surrogate.atan(),
                             reset_mechanism="subtract" if i % 2 == 0 else "zero")

    def forward(self, x, mem):
        return self.lif(self.fc(x), mem)


class SynapticHiddenBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.lif = snn.Synaptic(alpha=0.7, beta=0.85, init_hidden=True, learn_alpha=True, learn_beta=True,
                                spike_grad=surrogate.fast_sigmoid(10))

    def forward(self, x):
        return self.lif(self.fc(x))


class SynapticExplicitBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.lif = snn.Synaptic(alpha=0.7, beta=0.85, learn_alpha=True, spike_grad=surrogate.sigmoid(slope=5))

    def forward(self, x, syn, mem):
        return self.lif(self.fc(x), syn, mem)


class RLeakyBlock(nn.Module):
    def __init__(self, i: int, all_to_all: bool = True) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        if all_to_all:
            self.lif = snn.RLeaky(beta=0.85, linear_features=H, learn_beta=True, spike_grad=surrogate.fast_sigmoid())
        else:
            self.lif = snn.RLeaky(beta=0.85, all_to_all=False, V=0.5, learn_recurrent=True, learn_beta=True)

    def forward(self, x, spk, mem):
        return self.lif(self.fc(x), spk, mem)


class SNNTime(nn.Module):
    """Blocks called at each of T time steps; state either in the neurons (hidden) or
    carried by the model's loop (explicit, ``nstate`` tensors a block returns after its
    spike)."""

    def __init__(self, block, n: int = 3, nstate: int = 0, init=None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([block(i) for i in range(n)])
        self.nstate = nstate
        self.init = init

    def forward(self, x):
        for m in _neurons(self):
            m.reset_mem()
        states = [self.init(b.lif) for b in self.blocks] if self.nstate else None
        acc = 0
        last = None
        for t in range(x.shape[0]):
            h = x[t]
            for j, b in enumerate(self.blocks):
                if self.nstate:
                    out = b(h, *states[j])
                    h = out[0]
                    states[j] = [out[0], out[1]] if isinstance(b.lif, snn.RLeaky) else list(out[1:])
                else:
                    h = b(h)
            acc = acc + h
            last = h
        mem = self.blocks[-1].lif.mem
        return _loss(acc / x.shape[0]) + mem.square().mean() + 0.1 * last.sum()


def _leaky_init(lif):
    return [lif.init_leaky()]


def _syn_init(lif):
    return list(lif.init_synaptic())


def _rleaky_init(lif):
    return list(lif.init_rleaky())


class ConvSNNBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.lif = snn.Leaky(beta=0.9, init_hidden=True, learn_threshold=True,
                             spike_grad=surrogate.atan() if i % 2 else surrogate.fast_sigmoid(25))

    def forward(self, x):
        return self.lif(self.bn(self.conv(x)))


class ConvSNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(2, 4, 3, padding=1)
        self.blocks = nn.ModuleList([ConvSNNBlock(i) for i in range(3)])
        self.head = nn.Linear(4 * 4 * 4, 5)
        self.out = snn.Leaky(beta=0.9, init_hidden=True, output=True)

    def forward(self, batch):
        x, y = batch
        for m in _neurons(self):
            m.reset_mem()
        spk_rec, mem_rec = [], []
        for t in range(x.shape[0]):
            h = self.stem(x[t])
            for b in self.blocks:
                h = b(h)
            h = F.max_pool2d(h, 2).flatten(1)
            spk, mem = self.out(self.head(h))
            spk_rec.append(spk)
            mem_rec.append(mem)
        spk_rec, mem_rec = torch.stack(spk_rec), torch.stack(mem_rec)
        return SF.ce_rate_loss()(spk_rec, y) + SF.mse_membrane_loss()(mem_rec, y) * 0.1


def conv_batch(s: int):
    g = _gen(s)
    return (torch.rand(6, 2, 2, 8, 8, generator=g) * 2, torch.randint(0, 5, (2,), generator=g))


# ---------------------------------------------------------------- norse
import norse.torch as norse  # noqa: E402


class NorseCellBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.lif = norse.LIFCell(norse.LIFParameters(v_th=torch.as_tensor(0.3)))

    def forward(self, x, s):
        return self.lif(self.fc(x) * 4, s)


class NorseRecBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.lif = norse.LIFRecurrentCell(H, H, p=norse.LIFParameters(v_th=torch.as_tensor(0.3)))

    def forward(self, x, s):
        return self.lif(x * 4, s)


class NorseTime(nn.Module):
    def __init__(self, block) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([block(i) for i in range(3)])

    def forward(self, x):
        states = [None] * len(self.blocks)
        acc = 0
        for t in range(x.shape[0]):
            h = x[t]
            for j, b in enumerate(self.blocks):
                h, states[j] = b(h, states[j])
            acc = acc + h
        return _loss(acc) + states[-1].v.square().mean()


class NorseSeqBlock(nn.Module):
    """A whole sequence per call: Linear over time, then norse's LIF (its own time loop)."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.lif = norse.LIF(norse.LIFParameters(v_th=torch.as_tensor(0.3)))
        self.li = norse.LI()

    def forward(self, x):
        z, s = self.lif(self.fc(x) * 4)
        v, _ = self.li(z)
        return z + 0.1 * v


class NorseSeq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([NorseSeqBlock(i) for i in range(3)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return _loss(x)


# ---------------------------------------------------------------- ncps
from ncps.torch import CfC, LTC  # noqa: E402
from ncps.wirings import AutoNCP  # noqa: E402


class NcpBlock(nn.Module):
    def __init__(self, make) -> None:
        super().__init__()
        self.rnn = make()

    def forward(self, x, ts=None):
        y, h = self.rnn(x, timespans=ts) if ts is not None else self.rnn(x)
        return x + y


class NcpStack(nn.Module):
    def __init__(self, make, n: int = 3, timespans: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([NcpBlock(make) for _ in range(n)])
        self.timespans = timespans

    def forward(self, batch):
        x, ts = batch if self.timespans else (batch, None)
        for b in self.blocks:
            x = b(x, ts)
        return _loss(x)


def ts_batch(s: int, b: int = 2):
    g = _gen(s)
    return torch.randn(b, 5, H, generator=g), torch.rand(b, 5, 1, generator=g) + 0.5


def _seeded(f):
    def make():
        return f()
    return make


# ---------------------------------------------------------------- xLSTM
from xlstm import (  # noqa: E402
    FeedForwardConfig, mLSTMBlockConfig, mLSTMLayerConfig, sLSTMBlockConfig, sLSTMLayerConfig,
    xLSTMBlockStack, xLSTMBlockStackConfig,
)


class XL(nn.Module):
    def __init__(self, slstm_at, mlstm: bool = True, slstm: bool = True) -> None:
        super().__init__()
        cfg = xLSTMBlockStackConfig(
            mlstm_block=mLSTMBlockConfig(mlstm=mLSTMLayerConfig(conv1d_kernel_size=4, qkv_proj_blocksize=4, num_heads=2)) if mlstm else None,
            slstm_block=sLSTMBlockConfig(
                slstm=sLSTMLayerConfig(backend="vanilla", num_heads=2, conv1d_kernel_size=4, bias_init="powerlaw_blockdependent"),
                feedforward=FeedForwardConfig(proj_factor=1.3, act_fn="gelu"),
            ) if slstm else None,
            context_length=8, num_blocks=3, embedding_dim=H, slstm_at=slstm_at,
        )
        self.stack = xLSTMBlockStack(cfg)
        self.stack.reset_parameters()

    def forward(self, x):
        return _loss(self.stack(x))


# ---------------------------------------------------------------- DiT
def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden_size, frequency_embedding_size=256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden_size, bias=True), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size, bias=True))
        self.frequency_embedding_size = frequency_embedding_size

    @staticmethod
    def timestep_embedding(t, dim, max_period=10000):
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half).to(device=t.device)
        args = t[:, None].float() * freqs[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
        return embedding

    def forward(self, t):
        return self.mlp(self.timestep_embedding(t, self.frequency_embedding_size))


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes, hidden_size, dropout_prob):
        super().__init__()
        use_cfg_embedding = dropout_prob > 0
        self.embedding_table = nn.Embedding(num_classes + use_cfg_embedding, hidden_size)
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob

    def token_drop(self, labels, force_drop_ids=None):
        if force_drop_ids is None:
            drop_ids = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        else:
            drop_ids = force_drop_ids == 1
        return torch.where(drop_ids, self.num_classes, labels)

    def forward(self, labels, train, force_drop_ids=None):
        if (train and self.dropout_prob > 0) or (force_drop_ids is not None):
            labels = self.token_drop(labels, force_drop_ids)
        return self.embedding_table(labels)


class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class DiTBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads=num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


def get_2d_sincos_pos_embed(embed_dim, grid_size):
    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.meshgrid(grid_w, grid_h)
    grid = np.stack(grid, axis=0).reshape([2, 1, grid_size, grid_size])

    def _1d(d, pos):
        omega = np.arange(d // 2, dtype=np.float64) / (d / 2.0)
        omega = 1.0 / 10000**omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    return np.concatenate([_1d(embed_dim // 2, grid[0]), _1d(embed_dim // 2, grid[1])], axis=1)


class DiT(nn.Module):
    def __init__(self, input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=3, num_heads=4,
                 mlp_ratio=4.0, class_dropout_prob=0.1, num_classes=10, learn_sigma=True, zero_init=True):
        super().__init__()
        self.learn_sigma = learn_sigma
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.patch_size = patch_size
        self.x_embedder = nn.Conv2d(in_channels, hidden_size, patch_size, stride=patch_size, bias=True)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        num_patches = (input_size // patch_size) ** 2
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, hidden_size), requires_grad=False)
        self.blocks = nn.ModuleList([DiTBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio) for _ in range(depth)])
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights(zero_init)

    def initialize_weights(self, zero_init):
        def _basic_init(module):
            if isinstance(module, nn.Linear):
                torch.nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.constant_(module.bias, 0)
        self.apply(_basic_init)
        pos_embed = get_2d_sincos_pos_embed(self.pos_embed.shape[-1], int(self.pos_embed.shape[1] ** 0.5))
        self.pos_embed.data.copy_(torch.from_numpy(pos_embed).float().unsqueeze(0))
        w = self.x_embedder.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.constant_(self.x_embedder.bias, 0)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        if zero_init:
            for block in self.blocks:
                nn.init.constant_(block.adaLN_modulation[-1].weight, 0)
                nn.init.constant_(block.adaLN_modulation[-1].bias, 0)
            nn.init.constant_(self.final_layer.adaLN_modulation[-1].weight, 0)
            nn.init.constant_(self.final_layer.adaLN_modulation[-1].bias, 0)
            nn.init.constant_(self.final_layer.linear.weight, 0)
            nn.init.constant_(self.final_layer.linear.bias, 0)

    def unpatchify(self, x):
        c = self.out_channels
        p = self.patch_size
        h = w = int(x.shape[1] ** 0.5)
        x = x.reshape(shape=(x.shape[0], h, w, p, p, c))
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(shape=(x.shape[0], c, h * p, h * p))

    def forward(self, x, t, y):
        x = self.x_embedder(x).flatten(2).transpose(1, 2) + self.pos_embed
        t = self.t_embedder(t)
        y = self.y_embedder(y, self.training)
        c = t + y
        for block in self.blocks:
            x = block(x, c)
        x = self.final_layer(x, c)
        return self.unpatchify(x)


class Diffusion(nn.Module):
    """DDPM epsilon loss (linear betas, 1000 steps) plus a small term on the learned
    variance output; t and noise drawn here (inside) or given by the batch."""

    def __init__(self, zero_init: bool, inside: bool) -> None:
        super().__init__()
        self.dit = DiT(zero_init=zero_init)
        betas = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
        ab = torch.cumprod(1 - betas, 0)
        self.register_buffer("sqrt_ab", ab.sqrt().float(), persistent=False)
        self.register_buffer("sqrt_1mab", (1 - ab).sqrt().float(), persistent=False)
        self.inside = inside

    def forward(self, batch):
        if self.inside:
            x0, y = batch
            t = torch.randint(0, 1000, (x0.shape[0],))
            noise = torch.randn_like(x0)
        else:
            x0, y, t, noise = batch
        xt = self.sqrt_ab[t].view(-1, 1, 1, 1) * x0 + self.sqrt_1mab[t].view(-1, 1, 1, 1) * noise
        out = self.dit(xt, t, y)
        eps, var = out.chunk(2, dim=1)
        return F.mse_loss(eps, noise) + 0.01 * var.square().mean()


def dit_batch_in(s):
    g = _gen(s)
    return torch.randn(2, 4, 8, 8, generator=g), torch.randint(0, 10, (2,), generator=g)


def dit_batch_out(s):
    g = _gen(s)
    return (torch.randn(2, 4, 8, 8, generator=g), torch.randint(0, 10, (2,), generator=g),
            torch.randint(0, 1000, (2,), generator=g), torch.randn(2, 4, 8, 8, generator=g))


# ---------------------------------------------------------------- tables
def randn(*shape):
    return lambda s: torch.randn(*shape, generator=_gen(s))


MODELS = {
    # snntorch
    "snn_leaky_hid": lambda: SNNTime(LeakyHiddenBlock),
    "snn_leaky_exp": lambda: SNNTime(LeakyExplicitBlock, nstate=1, init=_leaky_init),
    "snn_syn_hid": lambda: SNNTime(SynapticHiddenBlock),
    "snn_syn_exp": lambda: SNNTime(SynapticExplicitBlock, nstate=2, init=_syn_init),
    "snn_rleaky": lambda: SNNTime(lambda i: RLeakyBlock(i, True), nstate=2, init=_rleaky_init),
    "snn_rleaky_v": lambda: SNNTime(lambda i: RLeakyBlock(i, False), nstate=2, init=_rleaky_init),
    "snn_conv": ConvSNN,
    # norse
    "norse_cell": lambda: NorseTime(NorseCellBlock),
    "norse_rec": lambda: NorseTime(NorseRecBlock),
    "norse_seq": NorseSeq,
    # ncps
    "cfc_default": lambda: NcpStack(lambda: CfC(H, 12, proj_size=H, backbone_units=16, backbone_layers=1)),
    "cfc_mixed": lambda: NcpStack(lambda: CfC(H, H, mixed_memory=True, mode="no_gate")),
    "cfc_pure": lambda: NcpStack(lambda: CfC(H, H, mode="pure")),
    "cfc_ncp_ts": lambda: NcpStack(lambda: CfC(H, AutoNCP(20, H)), timespans=True),
    "ltc_autoncp": lambda: NcpStack(lambda: LTC(H, AutoNCP(20, H), batch_first=True)),
    "ltc_mixed_ts": lambda: NcpStack(lambda: LTC(H, H, mixed_memory=True, ode_unfolds=3), timespans=True),
    # xLSTM
    "xlstm_m": lambda: XL([], slstm=False),
    "xlstm_s": lambda: XL("all", mlstm=False),
    "xlstm_ms": lambda: XL([1]),
    # DiT
    "dit_zero_in": lambda: Diffusion(True, True),
    "dit_rand_in": lambda: Diffusion(False, True),
    "dit_rand_out": lambda: Diffusion(False, False),
}

BATCHES = {
    "snn_conv": conv_batch,
    "norse_seq": randn(6, 2, H),
    "cfc_ncp_ts": lambda s: ts_batch(s, 1),
    "ltc_mixed_ts": lambda s: ts_batch(s, 1),
    "xlstm_m": randn(2, 8, H),
    "xlstm_s": randn(2, 8, H),
    "xlstm_ms": randn(2, 8, H),
    "dit_zero_in": dit_batch_in,
    "dit_rand_in": dit_batch_in,
    "dit_rand_out": dit_batch_out,
}


def batch(name, model):
    if name.startswith(("cfc", "ltc")):
        return BATCHES.get(name, randn(2, 5, H))
    return BATCHES.get(name, randn(6, 2, H))


if __name__ == "__main__":
    sys.exit(run(MODELS, batch))
