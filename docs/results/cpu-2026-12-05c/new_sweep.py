"""Model families not swept before, under every zoo variant, gradients compared bitwise with
plain training (tests/helpers.check_variant, through ../cpu-2026-12-05/sweep.py): pure
PyTorch Mamba and Jamba, neural ODEs, Performer, Reformer, linear-attention and
Nystromformer transformers, PaLM, MEGABYTE, ESM-2 and the MSA Transformer, e3nn
equivariant layers, OpenCLIP (CLIP and CoCa), segmentation-models-pytorch, MONAI and
denoising-diffusion-pytorch.

    PYTHONPATH=DIR OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05c/new_sweep.py [NAME,NAME ...|all] [VARIANT,...] [-v]

DIR holds, installed with ``pip install --no-deps --target DIR``: mambapy 1.2.0,
torchdiffeq 0.2.5, performer-pytorch 1.1.4, reformer-pytorch 1.4.4,
linear-attention-transformer 0.19.1, nystrom-attention 0.0.14, palm-pytorch 0.2.2,
MEGABYTE-pytorch 0.3.6, fair-esm 2.0.0, e3nn 0.6.0, open-clip-torch 3.3.0,
segmentation-models-pytorch 0.6.0, timm 1.0.31, monai 1.6.1,
denoising-diffusion-pytorch 2.3.4, axial-attention 0.6.1, product-key-memory 0.3.0 and
what they import: einops 0.8.2, local-attention 1.11.2, axial-positional-embedding
0.3.12, hyper-connections 0.4.11, beartype 0.23.1, scipy 1.17.1, colt5-attention 0.11.2,
linformer 0.2.3, ftfy 6.3.1, wcwidth 0.9.4, ema-pytorch 0.8.3 and torchvision 0.28.0
(open_clip, smp and denoising-diffusion import it; set up as
../cpu-2026-12-05b/tv_stubs.py says). Tiny configurations, 4 steps each, on the CPU.

What the code brings: Mamba's parallel scan (in-place updates of views inside its
forward), Jamba's top-2 mixture of experts (data-dependent token counts: ``varying``);
an ODE function module called several times per forward by fixed-step and adaptive
solvers, and by the adjoint method's custom autograd Function, which integrates again
(and calls the module) inside its backward; Performer's random features redrawn into a
buffer inside the forward; Reformer's LSH buckets drawn with ``torch.randn`` inside
reversible layers (a custom autograd Function that records and replays RNG states
itself); reversible linear-attention and axial-attention stacks; product-key memory
(``EmbeddingBag`` with per-sample weights over a top-k); ESM-2's token dropout and dict
output, the MSA Transformer's row and column attention; e3nn's fx-generated tensor
products; CLIP with patch dropout, CoCa's captioning decoder; U-Nets and FPNs with
batch norm buffers, deep supervision lists (DynUNet), Swin windows (SwinUNETR), a VAE
branch sampling noise (SegResNetVAE); a diffusion loss drawing timesteps and noise
inside the forward, around a time-conditioned U-Net.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05b"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))

import tv_stubs  # noqa: F401  (before torchvision, which open_clip, smp and ddpm import)

# isort: split

import denoising_diffusion_pytorch as ddp
import e3nn.o3 as o3
import esm
import monai.networks.nets as mn
import open_clip
import performer_pytorch as pf
import reformer_pytorch as rf
import segmentation_models_pytorch as smp
import torch
import torchdiffeq
from axial_attention import AxialImageTransformer
from compressive_transformer_pytorch import CompressiveTransformer
from denoising_diffusion_pytorch.continuous_time_gaussian_diffusion import (
    ContinuousTimeGaussianDiffusion,
)
from denoising_diffusion_pytorch.karras_unet import KarrasUnet
from denoising_diffusion_pytorch.learned_gaussian_diffusion import LearnedGaussianDiffusion
from e3nn.nn import Gate
from linear_attention_transformer import LinearAttentionTransformerLM
from mambapy.jamba import JambaLM, JambaLMConfig
from mambapy.mamba import Mamba, MambaConfig
from mambapy.vim import MambaConfig as VimConfig
from mambapy.vim import VMamba
from MEGABYTE_pytorch import MEGABYTE
from nystrom_attention import Nystromformer
from palm_pytorch import PaLM
from product_key_memory import PKM
from routing_transformer import RoutingTransformerLM
from routing_transformer.routing_transformer import Kmeans
from sweep import run
from torch import nn


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _loss(o: Any) -> torch.Tensor:
    """A scalar from any output: per float tensor, the mean square plus a fixed weighting
    (a normalised output's mean square is the same for any input); containers summed."""
    if isinstance(o, torch.Tensor):
        if not o.is_floating_point():
            return torch.zeros(())
        x = o.float()
        x = x[x.isfinite()]
        w = torch.arange(x.numel(), dtype=x.dtype).sin()
        return (x.pow(2).sum() + (x * w).sum()) / max(1, x.numel())
    if isinstance(o, dict):
        return sum((_loss(v) for v in o.values()), torch.zeros(()))
    if isinstance(o, (tuple, list)):
        return sum((_loss(v) for v in o), torch.zeros(()))
    return torch.zeros(())


class Loss(nn.Module):
    """A model called on a batch (a tensor, or a tuple of positional arguments), and a loss
    on whatever it returns. Python's ``random`` is seeded from torch's seed of the step
    (denoising-diffusion draws self-conditioning from it), so both runs draw alike."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, batch: Any) -> torch.Tensor:
        random.seed(torch.initial_seed())
        return _loss(self.m(*batch) if isinstance(batch, tuple) else self.m(batch))


class LM(nn.Module):
    """Next-token cross entropy on a token model's logits (the first of its outputs)."""

    def __init__(self, m: nn.Module, vocab: int = 20) -> None:
        super().__init__()
        self.m, self.vocab = m, vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.m(x[:, :-1])
        logits = out[0] if isinstance(out, tuple) else out
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def tokens(n: int = 16, vocab: int = 20, b: int = 2, low: int = 0) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randint(low, vocab, (b, n), generator=_gen(s))


def img(n: int, c: int = 3, b: int = 2) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randn(b, c, n, n, generator=_gen(s))


# --- neural ODEs: one function module called many times per forward ---------------------


class ODEFunc(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 32), nn.Tanh(), nn.Linear(32, d))

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(y) * torch.cos(t)


class ODENet(nn.Module):
    """Two ODE blocks in sequence, each integrating its own function from 0 to 1."""

    def __init__(self, method: str = "rk4", adjoint: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.funcs = nn.ModuleList([ODEFunc(), ODEFunc()])
        self.method, self.adjoint = method, adjoint
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        t = torch.tensor([0.0, 1.0])
        opts = {"step_size": 0.25} if self.method == "rk4" else {}
        for f in self.funcs:
            solve = torchdiffeq.odeint_adjoint if self.adjoint else torchdiffeq.odeint
            extra = {"adjoint_params": tuple(f.parameters())} if self.adjoint else {}
            h = solve(f, h, t, method=self.method, options=opts, rtol=1e-3, atol=1e-4, **extra)[-1]
        return self.out(h)


# --- e3nn: equivariant blocks -------------------------------------------------------------


class E3Block(nn.Module):
    """A gated tensor product of node features with their spherical harmonics."""

    def __init__(self, irreps: o3.Irreps) -> None:
        super().__init__()
        self.sh = o3.Irreps.spherical_harmonics(2)
        self.gate = Gate("8x0e", [torch.tanh], "4x0e", [torch.sigmoid], "4x1o")
        self.tp = o3.FullyConnectedTensorProduct(irreps, self.sh, self.gate.irreps_in)
        self.lin = o3.Linear(self.gate.irreps_out, irreps)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        sh = o3.spherical_harmonics(self.sh, pos, normalize=True)
        return x + self.lin(self.gate(self.tp(x, sh)))


class E3Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.irreps = o3.Irreps("8x0e + 4x1o")
        self.emb = o3.Linear("4x0e", self.irreps)
        self.blocks = nn.ModuleList([E3Block(self.irreps) for _ in range(3)])

    def forward(self, feats: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.emb(feats)
        for b in self.blocks:
            x = b(x, pos)
        return x


def points(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    return torch.randn(24, 4, generator=g), torch.randn(24, 3, generator=g)


# --- product-key memory inside a small transformer -------------------------------------


class PKMBlock(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.pkm = PKM(d, heads=2, num_keys=16, topk=4, dim_head=16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.pkm(self.norm2(x))


class PKMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 32)
        self.blocks = nn.ModuleList([PKMBlock() for _ in range(2)])
        self.head = nn.Linear(32, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


# --- ESM ----------------------------------------------------------------------------------

ESM_ALPHABET = esm.data.Alphabet.from_architecture("ESM-1b")
MSA_ALPHABET = esm.data.Alphabet.from_architecture("msa_transformer")


class ESMLoss(nn.Module):
    """Masked-LM cross entropy of an ESM model on its logits, plus its contact head."""

    def __init__(self, m: nn.Module, contacts: bool = False) -> None:
        super().__init__()
        self.m, self.contacts = m, contacts

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        toks, target = batch
        out = self.m(toks, repr_layers=[1], return_contacts=self.contacts)
        loss = nn.functional.cross_entropy(out["logits"].reshape(-1, out["logits"].shape[-1]), target.reshape(-1))
        return loss + (_loss(out["contacts"]) if self.contacts else 0.0)


def esm_batch(alphabet: Any, msa: bool = False) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    def batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _gen(s)
        shape = (2, 3, 14) if msa else (2, 14)
        target = torch.randint(4, 24, shape, generator=g)
        toks = target.clone()
        toks[..., 0] = alphabet.cls_idx
        mask = torch.rand(shape, generator=g) < 0.2
        toks[mask] = alphabet.mask_idx
        if not msa:
            toks[1, -3:] = alphabet.padding_idx
        return toks, target

    return batch


# --- OpenCLIP -------------------------------------------------------------------------


class ClipLoss(nn.Module):
    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m
        self.loss = open_clip.ClipLoss()

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        out = self.m(*batch)
        return self.loss(out["image_features"], out["text_features"], out["logit_scale"])


class CocaLoss(nn.Module):
    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m
        self.loss = open_clip.CoCaLoss(caption_loss_weight=1.0, clip_loss_weight=1.0, pad_id=0)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        out = self.m(*batch)
        return sum(self.loss(**out, output_dict=False))


def clip_model(coca: bool = False, **vision: Any) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        vcfg = open_clip.CLIPVisionCfg(layers=2, width=32, head_width=16, patch_size=8, image_size=32, **vision)
        tcfg = open_clip.CLIPTextCfg(context_length=12, vocab_size=30, width=32, heads=2, layers=2)
        if coca:
            mcfg = open_clip.coca_model.MultimodalCfg(context_length=12, vocab_size=30, width=32, heads=2, layers=1,
                                                      dim_head=16, n_queries=4, attn_pooler_heads=2)
            vcfg.attentional_pool, vcfg.attn_pooler_queries, vcfg.attn_pooler_heads, vcfg.output_tokens = True, 4, 2, True
            tcfg.embed_cls, tcfg.output_tokens = True, True
            return CocaLoss(open_clip.CoCa(32, mcfg, tcfg, vcfg))
        return ClipLoss(open_clip.CLIP(16, vcfg, tcfg, output_dict=True))

    return make


def clip_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    text = torch.randint(3, 30, (2, 12), generator=g)
    text[:, -2:] = 0
    text[:, -3] = 29  # the argmax token pools the text
    return torch.randn(2, 3, 32, 32, generator=g), text


# --- MONAI and smp ------------------------------------------------------------------------


def vol(n: int = 32, c: int = 1, b: int = 2, dims: int = 2) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randn(b, c, *([n] * dims), generator=_gen(s))


def ddpm(unet_kw: dict[str, Any], **kw: Any) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        unet = ddp.Unet(dim=8, dim_mults=(1, 2), attn_dim_head=8, attn_heads=2, **unet_kw)
        return Loss(ddp.GaussianDiffusion(unet, image_size=16, timesteps=20, sampling_timesteps=5, **kw))

    return make


def ddpm_1d() -> nn.Module:
    unet = ddp.Unet1D(dim=8, dim_mults=(1, 2), channels=2, attn_dim_head=8, attn_heads=2)
    return Loss(ddp.GaussianDiffusion1D(unet, seq_length=16, timesteps=20))


def elucidated() -> nn.Module:
    unet = ddp.Unet(dim=8, dim_mults=(1, 2), attn_dim_head=8, attn_heads=2, random_fourier_features=True)
    return Loss(ddp.ElucidatedDiffusion(unet, image_size=16, num_sample_steps=4))


# --- models with state across calls and steps ----------------------------------------


class AuxLM(nn.Module):
    """Next-token cross entropy of a model returning ``(logits, aux_loss)``, plus the aux
    loss (routing transformer: k-means commitment, mixture-of-experts balance). The
    k-means centroids the forward gathered are folded into their buffers at the start of
    the next forward (in place; the library's own old-style module backward hook fires
    more than once per backward and fails plainly)."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k in self.m.modules():
            if isinstance(k, Kmeans) and k.new_means is not None:
                k.update()
        logits, aux = self.m(x[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)) + aux


class Recurrent(nn.Module):
    """A compressive transformer fed its own memories from the step before (detached, as
    truncated backpropagation through time does), plus its reconstruction loss."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m
        self.mems: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits, mems, aux = self.m(x[:, :-1], memories=self.mems)
        self.mems = type(mems)(*(t.detach() for t in mems))
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)) + aux


class SpectralConv(nn.Module):
    """A Fourier layer: complex weights on the lowest modes of an rfft2."""

    def __init__(self, c: int = 8, modes: int = 4) -> None:
        super().__init__()
        self.modes = modes
        self.w = nn.Parameter(torch.randn(c, c, modes, modes, dtype=torch.cfloat) / c)
        self.skip = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.fft.rfft2(x)
        out = torch.zeros_like(f)
        m = self.modes
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", f[:, :, :m, :m], self.w)
        return nn.functional.gelu(torch.fft.irfft2(out, s=x.shape[-2:]) + self.skip(x))


class FNO(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lift = nn.Conv2d(3, 8, 1)
        self.layers = nn.ModuleList([SpectralConv() for _ in range(3)])
        self.proj = nn.Conv2d(8, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lift(x)
        for layer in self.layers:
            h = layer(h)
        return self.proj(h)


def karras_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    return torch.randn(2, 3, 16, 16, generator=g), torch.rand(2, generator=g)


SMP = dict(encoder_weights=None, in_channels=3, classes=2)
MAMBA = dict(d_model=16, n_layers=3, d_state=4, expand_factor=2)

#: Shapes change from step to step: Jamba's experts take a data-dependent number of
#: tokens, an adaptive solver takes a data-dependent number of steps.
VARYING = frozenset({"jamba_moe", "ode_dopri5", "ode_adjoint"})
#: Nothing to drop, by design: reversible stacks and the ODE adjoint run their blocks
#: under no_grad in a custom autograd Function that reruns them in its backward, so no
#: region saves anything (offrecomp says so); KarrasUnet's layers renormalise their
#: weights in place in the forward, so offrecomp keeps those regions after the first
#: step (it says so). Their recompute and tight-budget runs are bitwise, but drop
#: nothing, which check_variant_report asserts: left out.
NO_DROP = frozenset({"ode_adjoint", "performer_rev", "reformer", "reformer_pkm", "linear_attn_rev", "axial_rev",
                     "karras_unet"})
Z: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any]]] = {
    # mambapy: pure PyTorch selective scans
    "mamba_pscan": (lambda: Loss(Mamba(MambaConfig(**MAMBA))), lambda s: torch.randn(2, 16, 16, generator=_gen(s))),
    "mamba_seq": (lambda: Loss(Mamba(MambaConfig(**MAMBA, pscan=False, inner_layernorms=True))),
                  lambda s: torch.randn(2, 12, 16, generator=_gen(s))),
    "jamba_moe": (lambda: LM(JambaLM(JambaLMConfig(
        d_model=16, n_layers=4, mlp_size=32, d_state=4, num_attention_heads=2, num_key_value_heads=1, num_experts=4,
        num_experts_per_tok=2, attn_layer_offset=1, attn_layer_period=2, vocab_size=20))), tokens()),
    "jamba_dense": (lambda: LM(JambaLM(JambaLMConfig(
        d_model=16, n_layers=4, mlp_size=32, d_state=4, num_attention_heads=2, num_key_value_heads=1, num_experts=1,
        attn_layer_offset=1, attn_layer_period=2, vocab_size=20, attention_dropout=0.1))), tokens()),
    # torchdiffeq
    "ode_rk4": (lambda: Loss(ODENet("rk4")), lambda s: torch.randn(4, 8, generator=_gen(s))),
    "ode_dopri5": (lambda: Loss(ODENet("dopri5")), lambda s: torch.randn(4, 8, generator=_gen(s))),
    "ode_adjoint": (lambda: Loss(ODENet("rk4", adjoint=True)), lambda s: torch.randn(4, 8, generator=_gen(s))),
    # lucidrains language models
    "performer": (lambda: LM(pf.PerformerLM(num_tokens=20, max_seq_len=16, dim=32, depth=2, heads=2, dim_head=16,
                                            causal=True, nb_features=16, feature_redraw_interval=2, attn_dropout=0.1)),
                  tokens()),
    "performer_rev": (lambda: LM(pf.PerformerLM(num_tokens=20, max_seq_len=16, dim=32, depth=2, heads=2, dim_head=16,
                                                nb_features=16, reversible=True, ff_chunks=2, ff_dropout=0.1,
                                                local_attn_heads=1, local_window_size=4, shift_tokens=True)),
                      tokens()),
    "reformer": (lambda: LM(rf.ReformerLM(num_tokens=20, dim=32, depth=2, max_seq_len=32, heads=2, dim_head=16,
                                          bucket_size=4, n_hashes=2, causal=True, lsh_dropout=0.1, ff_dropout=0.1)),
                 tokens(33)),
    "reformer_pkm": (lambda: LM(rf.ReformerLM(num_tokens=20, dim=32, depth=2, max_seq_len=32, heads=2, dim_head=16,
                                              bucket_size=4, n_hashes=2, layer_dropout=0.2, weight_tie=True,
                                              pkm_layers=(1,), pkm_num_keys=32, n_local_attn_heads=1)),
                     tokens(33)),
    "linear_attn": (lambda: LM(LinearAttentionTransformerLM(
        num_tokens=20, dim=32, depth=2, max_seq_len=16, heads=2, dim_head=16, causal=True, ff_dropout=0.1,
        n_local_attn_heads=1, local_attn_window_size=4)), tokens(17)),
    "linear_attn_rev": (lambda: LM(LinearAttentionTransformerLM(
        num_tokens=20, dim=32, depth=2, max_seq_len=16, heads=2, dim_head=16, reversible=True, ff_chunks=2,
        use_rotary_emb=True, use_axial_pos_emb=False, shift_tokens=True)), tokens()),
    "nystrom": (lambda: Loss(Nystromformer(dim=32, depth=2, heads=2, dim_head=16, num_landmarks=4, pinv_iterations=3,
                                           attn_values_residual_conv_kernel=3, attn_dropout=0.1)), lambda s: torch.randn(2, 16, 32, generator=_gen(s))),
    "palm": (lambda: LM(PaLM(num_tokens=20, dim=32, depth=3, heads=2, dim_head=16)), tokens()),
    "megabyte": (lambda: MegabyteLoss(MEGABYTE(num_tokens=20, dim=(32, 16), depth=(1, 1), max_seq_len=(4, 4),
                                               dim_head=8, heads=2, attn_dropout=0.1, ff_dropout=0.1)), tokens()),
    "pkm_transformer": (lambda: LM(PKMNet()), tokens()),
    "axial_rev": (lambda: Loss(nn.Sequential(nn.Conv2d(3, 8, 1), AxialImageTransformer(dim=8, depth=2, heads=2, reversible=True))),
                  img(8)),
    # ESM
    "esm2": (lambda: ESMLoss(esm.ESM2(num_layers=2, embed_dim=32, attention_heads=2, alphabet=ESM_ALPHABET),
                             contacts=True), esm_batch(ESM_ALPHABET)),
    "esm2_nodrop": (lambda: ESMLoss(esm.ESM2(num_layers=3, embed_dim=32, attention_heads=2, alphabet=ESM_ALPHABET,
                                             token_dropout=False)), esm_batch(ESM_ALPHABET)),
    "esm_msa": (lambda: ESMLoss(esm.MSATransformer(_msa_args(), MSA_ALPHABET)), esm_batch(MSA_ALPHABET, msa=True)),
    # e3nn
    "e3nn_gate": (lambda: Loss(E3Net()), points),
    # OpenCLIP
    "clip": (clip_model(), clip_batch),
    "clip_patch_drop": (clip_model(patch_dropout=0.25, ls_init_value=0.1), clip_batch),
    "coca": (clip_model(coca=True), clip_batch),
    # segmentation-models-pytorch (timm and torchvision-style encoders)
    "smp_unet": (lambda: Loss(smp.Unet("resnet18", encoder_depth=3, decoder_channels=(32, 16, 8), **SMP)), img(32)),
    "smp_unetpp": (lambda: Loss(smp.UnetPlusPlus("resnet18", encoder_depth=3, decoder_channels=(32, 16, 8), **SMP)),
                   img(32)),
    "smp_fpn": (lambda: Loss(smp.FPN("resnet18", decoder_pyramid_channels=32, decoder_segmentation_channels=32,
                                     decoder_dropout=0.2, **SMP)), img(64)),
    "smp_deeplabv3p": (lambda: Loss(smp.DeepLabV3Plus("resnet18", decoder_channels=32, **SMP)), img(64)),
    "smp_manet": (lambda: Loss(smp.MAnet("resnet18", encoder_depth=3, decoder_channels=(32, 16, 8),
                                         decoder_pab_channels=8, **SMP)), img(32)),
    "smp_segformer": (lambda: Loss(smp.Segformer("mit_b0", decoder_segmentation_channels=32, **SMP)), img(64)),
    # MONAI
    "monai_unet": (lambda: Loss(mn.UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(8, 16, 32),
                                        strides=(2, 2), num_res_units=2, dropout=0.1)), vol()),
    "monai_basicunet": (lambda: Loss(mn.BasicUNet(spatial_dims=2, in_channels=1, out_channels=2,
                                                  features=(8, 8, 16, 16, 32, 8), dropout=0.1)), vol()),
    "monai_attnunet": (lambda: Loss(mn.AttentionUnet(spatial_dims=2, in_channels=1, out_channels=2,
                                                     channels=(8, 16, 32), strides=(2, 2))), vol()),
    "monai_unetr": (lambda: Loss(mn.UNETR(in_channels=1, out_channels=2, img_size=(32, 32), feature_size=8,
                                          hidden_size=32, mlp_dim=64, num_heads=2, spatial_dims=2, dropout_rate=0.1)),
                    vol()),
    "monai_swinunetr": (lambda: Loss(mn.SwinUNETR(in_channels=1, out_channels=2, depths=(1, 1, 1, 1),
                                                  num_heads=(1, 1, 2, 2), feature_size=12, spatial_dims=2,
                                                  window_size=4, dropout_path_rate=0.1)), vol(64)),
    "monai_dynunet": (lambda: Loss(mn.DynUNet(spatial_dims=2, in_channels=1, out_channels=2, kernel_size=(3, 3, 3),
                                              strides=(1, 2, 2), upsample_kernel_size=(2, 2), filters=(8, 16, 32),
                                              deep_supervision=True, deep_supr_num=1, res_block=True)), vol()),
    "monai_segresnetvae": (lambda: Loss(mn.SegResNetVAE(input_image_size=(16, 16, 16), spatial_dims=3, init_filters=8,
                                                        in_channels=1, out_channels=2, blocks_down=(1, 2),
                                                        blocks_up=(1,))), vol(16, dims=3)),
    "monai_vitautoenc": (lambda: Loss(mn.ViTAutoEnc(in_channels=1, img_size=(16, 16), patch_size=(4, 4),
                                                    hidden_size=32, mlp_dim=64, num_layers=2, num_heads=2,
                                                    spatial_dims=2)), vol(16)),
    # denoising-diffusion-pytorch
    "ddpm_unet": (ddpm({}), img(16)),
    "ddpm_selfcond": (ddpm({"self_condition": True, "dropout": 0.1},
                           objective="pred_v"), img(16)),
    "ddpm_1d": (ddpm_1d, lambda s: torch.randn(2, 2, 16, generator=_gen(s))),
    "elucidated": (elucidated, img(16)),
    # state across calls and steps; complex parameters
    "routing": (lambda: AuxLM(RoutingTransformerLM(
        num_tokens=20, dim=32, depth=2, max_seq_len=16, heads=2, dim_head=16, window_size=4, causal=True,
        _register_kmeans_update=False, n_local_attn_heads=1, local_attn_window_size=4, attn_dropout=0.1)), tokens(17)),
    "routing_moe": (lambda: AuxLM(RoutingTransformerLM(
        num_tokens=20, dim=32, depth=2, max_seq_len=16, heads=2, dim_head=16, window_size=4, moe_layers=(1,),
        moe_num_experts=4, _register_kmeans_update=False)), tokens(17)),
    "compressive": (lambda: Recurrent(CompressiveTransformer(
        num_tokens=20, dim=32, depth=2, seq_len=8, mem_len=8, cmem_ratio=2, heads=2, attn_dropout=0.1,
        ff_dropout=0.1)), tokens(9)),
    "vim": (lambda: Loss(VMamba(VimConfig(d_model=16, n_layers=2, d_state=4))),
            lambda s: torch.randn(2, 12, 16, generator=_gen(s))),
    "fno_complex": (lambda: Loss(FNO()), img(16)),
    "karras_unet": (lambda: Loss(KarrasUnet(image_size=16, dim=8, dim_max=16, channels=3, num_downsamples=1,
                                            num_blocks_per_stage=1, attn_res=(8,), attn_dim_head=8, dropout=0.1)),
                    karras_batch),
    "ddpm_learned_var": (lambda: Loss(LearnedGaussianDiffusion(
        ddp.Unet(dim=8, dim_mults=(1, 2), attn_dim_head=8, attn_heads=2, learned_variance=True), image_size=16,
        timesteps=20)), img(16)),
    "ddpm_continuous": (lambda: Loss(ContinuousTimeGaussianDiffusion(
        ddp.Unet(dim=8, dim_mults=(1, 2), attn_dim_head=8, attn_heads=2, learned_sinusoidal_cond=True),
        image_size=16, noise_schedule="learned", learned_schedule_net_hidden_dim=16, min_snr_loss_weight=True)),
        img(16)),
}


class MegabyteLoss(nn.Module):
    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x, return_loss=True)


def _msa_args() -> Any:
    from argparse import Namespace

    return Namespace(layers=2, embed_dim=32, ffn_embed_dim=64, attention_heads=2, dropout=0.1, attention_dropout=0.1,
                     activation_dropout=0.1, max_tokens=2**14, max_tokens_per_msa=2**14, max_positions=64, embed_positions_msa=True)


def main() -> int:
    def skip(name: str, variant: str) -> bool:
        return name in NO_DROP and variant in ("recompute", "auto_tight", "auto_serve")

    return run({name: f for name, (f, _) in Z.items()}, lambda name, m: Z[name][1], skip, varying=VARYING)


if __name__ == "__main__":
    raise SystemExit(main())
