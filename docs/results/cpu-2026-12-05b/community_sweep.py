"""Community model code under every zoo variant, gradients compared bitwise with plain
training (tests/helpers.check_variant, through ../cpu-2026-12-05/sweep.py): x-transformers,
vit-pytorch, perceiver-pytorch, local-attention and PyTorch Geometric.

    PYTHONPATH=DIR python docs/results/cpu-2026-12-05b/community_sweep.py [NAME,NAME ...] [VARIANT,VARIANT ...]

DIR holds, installed with ``pip install --no-deps --target DIR``: x-transformers 2.31.10,
vit-pytorch 1.26.14, perceiver-pytorch 0.11.0, local-attention 1.11.2, torch-geometric
2.8.1, einops 0.8.2, einx 0.4.3, rotary-embedding-torch 0.9.1 and what they import
(loguru, frozendict, torch-einops-utils, xxhash, hyper-connections); vit-pytorch imports
torchvision, set up as tv_stubs.py says. Tiny configurations, 4 steps each, on the CPU.

What the code brings: blocks held as ``ModuleList``s of ``ModuleList``s (x-transformers,
vit-pytorch), attention of one layer passed to the next (``residual_attn``), shifted
tokens, layer dropout drawn per step, hyper-connection residual streams, memory tokens,
encoder-decoder cross-attention with masks; weight-tied layers called many times per
forward (Perceiver, LoopedViT); token sampling that changes shapes within a forward
(ATS); graph layers with scatter reductions over an edge index.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))

import tv_stubs  # noqa: F401  (before torchvision, which vit-pytorch imports)

# isort: split

import local_attention as la
import perceiver_pytorch as pp
import torch
import torch_geometric.nn as gnn
import x_transformers as xt
from sweep import run
from torch import nn
from vision_audio_sweep import Loss, img
from vit_pytorch import (
    ats_vit,
    cait,
    cct,
    cross_vit,
    crossformer,
    cvt,
    deepvit,
    levit,
    looped_vit,
    max_vit,
    mobile_vit,
    na_vit,
    nest,
    normalized_vit,
    parallel_vit,
    pit,
    regionvit,
    rvt,
    scalable_vit,
    simple_vit,
    simple_vit_with_register_tokens,
    simple_vit_with_value_residual,
    t2t,
    twins_svt,
    vit,
    vit_with_patch_merger,
    vivit,
    xcit,
)


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def tokens(n: int = 16, vocab: int = 20, b: int = 2) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randint(0, vocab, (b, n), generator=_gen(s))


class LM(nn.Module):
    """Causal LM loss of a token model: next-token cross entropy on its logits. Python's
    random module is seeded from torch's seed of the step (x-transformers draws its
    layer dropout from it), so plain and runtime steps draw alike."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        random.seed(torch.initial_seed())
        logits = self.m(x[:, :-1])
        return nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:])


def decoder(**flags: Any) -> Callable[[], nn.Module]:
    return lambda: LM(xt.TransformerWrapper(
        num_tokens=20, max_seq_len=16, attn_layers=xt.Decoder(dim=32, depth=3, heads=2, **flags)))


def encoder(**flags: Any) -> Callable[[], nn.Module]:
    return lambda: Loss(xt.TransformerWrapper(
        num_tokens=20, max_seq_len=16, attn_layers=xt.Encoder(dim=32, depth=3, heads=2, **flags)))


def seq2seq(s: int) -> tuple[torch.Tensor, ...]:
    g = _gen(s)
    src, tgt = torch.randint(1, 20, (2, 12), generator=g), torch.randint(1, 20, (2, 10), generator=g)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    return src, tgt, mask


class Graph(nn.Module):
    """A node-level model on one graph: node features and an edge index in."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, edge_index = batch
        return self.m(x, edge_index).pow(2).mean()


def graph(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    return torch.randn(30, 8, generator=g), torch.randint(0, 30, (2, 90), generator=g)


def navit_batch(s: int) -> list[list[torch.Tensor]]:
    g = _gen(s)
    return [[torch.randn(3, 32, 16, generator=g), torch.randn(3, 16, 32, generator=g)], [torch.randn(3, 32, 32, generator=g)]]


class Wrapped(nn.Module):
    """A model whose forward takes its batch as one positional argument that is a list."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, batch: Any) -> torch.Tensor:
        out = self.m(batch)
        return out.float().pow(2).mean()


#: Shapes change from step to step: ATS samples a data-dependent number of tokens, GCN
#: and GAT add the self-loops a random graph lacks.
VARYING = frozenset({"ats_vit", "gcn", "gat"})
V = dict(num_classes=3)
Z: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any]]] = {
    # x-transformers: decoders with the flags that change the block structure or its state
    "xt_decoder": (decoder(), tokens()),
    "xt_rotary_glu": (decoder(rotary_pos_emb=True, ff_glu=True, attn_qk_norm=True), tokens()),
    "xt_residual_attn": (decoder(residual_attn=True), tokens()),
    "xt_macaron_sandwich": (decoder(macaron=True, sandwich_norm=True), tokens()),
    "xt_shift_tokens": (decoder(shift_tokens=1), tokens()),
    "xt_layer_dropout": (decoder(layer_dropout=0.3, attn_dropout=0.1, ff_dropout=0.1), tokens()),
    "xt_hyper_conn": (decoder(num_residual_streams=4), tokens()),
    "xt_alibi_gate": (decoder(alibi_pos_bias=True, gate_residual=True), tokens()),
    "xt_value_residual": (decoder(add_value_residual=True), tokens()),
    "xt_memory_tokens": (lambda: LM(xt.TransformerWrapper(
        num_tokens=20, max_seq_len=16, num_memory_tokens=4, attn_layers=xt.Decoder(dim=32, depth=3, heads=2))), tokens()),
    "xt_encoder": (encoder(attn_num_mem_kv=2, use_rmsnorm=True), tokens()),
    "xt_seq2seq": (lambda: Loss(xt.XTransformer(
        dim=32, enc_num_tokens=20, enc_depth=2, enc_heads=2, enc_max_seq_len=12, dec_num_tokens=20, dec_depth=2,
        dec_heads=2, dec_max_seq_len=10)), seq2seq),
    "xt_continuous": (lambda: Loss(xt.ContinuousTransformerWrapper(
        dim_in=8, dim_out=4, max_seq_len=16, attn_layers=xt.Encoder(dim=32, depth=2, heads=2))),
        lambda s: torch.randn(2, 16, 8, generator=_gen(s))),
    "xt_vit": (lambda: Loss(xt.ViTransformerWrapper(
        image_size=32, patch_size=8, num_classes=3, attn_layers=xt.Encoder(dim=32, depth=2, heads=2))), img(32)),
    # vit-pytorch
    "vit": (lambda: vit.ViT(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, dropout=0.1, **V), img(32)),
    "simple_vit": (lambda: simple_vit.SimpleViT(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, **V),
                   img(32)),
    "vit_registers": (lambda: simple_vit_with_register_tokens.SimpleViT(
        image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, **V), img(32)),
    "vit_value_res": (lambda: simple_vit_with_value_residual.SimpleViT(
        image_size=32, patch_size=8, dim=32, depth=3, heads=2, mlp_dim=64, **V), img(32)),
    "parallel_vit": (lambda: parallel_vit.ViT(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, **V), img(32)),
    "patch_merger": (lambda: vit_with_patch_merger.ViT(
        image_size=32, patch_size=4, dim=32, depth=4, heads=2, mlp_dim=64, patch_merge_layer=2, patch_merge_num_tokens=8,
        **V), img(32)),
    "cait": (lambda: cait.CaiT(image_size=32, patch_size=8, dim=32, depth=2, cls_depth=1, heads=2, mlp_dim=64,
                               layer_dropout=0.1, **V), img(32)),
    "cct": (lambda: cct.CCT(img_size=32, embedding_dim=32, n_conv_layers=1, kernel_size=3, stride=1, padding=1,
                            num_layers=2, num_heads=2, mlp_ratio=2.0, num_classes=3), img(32)),
    "cross_vit": (lambda: cross_vit.CrossViT(
        image_size=32, sm_dim=16, lg_dim=32, sm_patch_size=4, lg_patch_size=8, sm_enc_mlp_dim=32, lg_enc_mlp_dim=64,
        sm_enc_heads=2, lg_enc_heads=2, cross_attn_heads=2, depth=2, **V), img(32)),
    "crossformer": (lambda: crossformer.CrossFormer(
        dim=(32, 64, 128, 256), depth=(1, 1, 1, 1), global_window_size=(2, 2, 1, 1), local_window_size=2, **V), img(64)),
    "cvt": (lambda: cvt.CvT(s1_emb_dim=16, s2_emb_dim=32, s2_heads=2, s3_emb_dim=64, s3_heads=2, s3_depth=2, **V), img(32)),
    "deepvit": (lambda: deepvit.DeepViT(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, **V), img(32)),
    "levit": (lambda: levit.LeViT(image_size=64, dim=(32, 48, 64), depth=1, heads=(2, 3, 4), mlp_mult=2, **V), img(64)),
    "max_vit": (lambda: max_vit.MaxViT(dim=16, depth=(1, 1), dim_head=8, window_size=4, **V), img(32)),
    "mobile_vit": (lambda: mobile_vit.MobileViT(image_size=(64, 64), dims=[24, 32, 40], channels=[8, 8, 16, 16, 24, 24, 32,
                                                                                                32, 48, 48, 160],
                                                depths=(1, 1, 1), **V), img(64)),
    "nest": (lambda: nest.NesT(image_size=32, patch_size=4, dim=32, heads=2, num_hierarchies=2, block_repeats=(1, 1), **V),
             img(32)),
    "pit": (lambda: pit.PiT(image_size=32, patch_size=4, dim=32, depth=(1, 1), heads=2, mlp_dim=64, **V), img(32)),
    "regionvit": (lambda: regionvit.RegionViT(dim=(16, 32, 64, 128), depth=(1, 1, 1, 1), window_size=2, **V), img(64)),
    "rvt": (lambda: rvt.RvT(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, **V), img(32)),
    "scalable_vit": (lambda: scalable_vit.ScalableViT(
        dim=16, depth=(1, 1, 1, 1), heads=(1, 2, 2, 4), reduction_factor=(2, 2, 1, 1), window_size=(2, 2, None, None),
        **V), img(64)),
    "t2t": (lambda: t2t.T2TViT(image_size=32, dim=32, depth=2, heads=2, mlp_dim=64, t2t_layers=((3, 2), (3, 2)), **V),
            img(32)),
    "twins_svt": (lambda: twins_svt.TwinsSVT(
        s1_emb_dim=16, s1_local_patch_size=2, s1_global_k=2, s2_emb_dim=32, s2_local_patch_size=2, s2_global_k=2,
        s3_emb_dim=32, s3_local_patch_size=2, s3_global_k=1, s3_depth=1, s4_emb_dim=64, s4_local_patch_size=1,
        s4_global_k=1, s4_depth=1, **V), img(64)),
    "xcit": (lambda: xcit.XCiT(image_size=32, patch_size=8, dim=32, depth=2, cls_depth=1, heads=2, mlp_dim=64,
                               layer_dropout=0.1, **V), img(32)),
    "looped_vit": (lambda: looped_vit.LoopedViT(
        image_size=32, patch_size=8, dim=32, pre_loop_depth=1, num_looped_blocks=3, post_loop_depth=1, loop_depth=1,
        heads=2, dim_head=16, mlp_dim=64, **V), img(32)),
    "nvit": (lambda: normalized_vit.nViT(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, **V), img(32)),
    "ats_vit": (lambda: ats_vit.ViT(image_size=32, patch_size=4, dim=32, depth=3, max_tokens_per_depth=(48, 32, 16),
                                    heads=2, mlp_dim=64, **V), img(32)),
    "navit": (lambda: Wrapped(na_vit.NaViT(image_size=32, patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64,
                                           token_dropout_prob=0.1, **V)), navit_batch),
    "vivit": (lambda: vivit.ViViT(image_size=32, frames=4, image_patch_size=8, frame_patch_size=2, dim=32,
                                  spatial_depth=1, temporal_depth=1, heads=2, mlp_dim=64, **V),
              lambda s: torch.randn(1, 3, 4, 32, 32, generator=_gen(s))),
    # perceiver: weight-tied layers (one block called at every depth)
    "perceiver": (lambda: pp.Perceiver(num_freq_bands=4, depth=3, max_freq=10.0, input_channels=3, num_latents=8,
                                       latent_dim=32, latent_heads=2, latent_dim_head=16, cross_dim_head=16,
                                       num_classes=3, attn_dropout=0.1, ff_dropout=0.1),
                  lambda s: torch.randn(2, 8, 8, 3, generator=_gen(s))),
    "perceiver_tied": (lambda: pp.Perceiver(num_freq_bands=4, depth=3, max_freq=10.0, input_channels=3, num_latents=8,
                                            latent_dim=32, latent_heads=2, latent_dim_head=16, cross_dim_head=16,
                                            num_classes=3, weight_tie_layers=True),
                       lambda s: torch.randn(2, 8, 8, 3, generator=_gen(s))),
    "perceiver_lm": (lambda: LM(pp.PerceiverLM(dim=32, num_tokens=20, max_seq_len=16, depth=2, num_latents=8,
                                               latent_dim=32, latent_heads=2, latent_dim_head=16, cross_dim_head=16)),
                     tokens()),
    # local attention
    "local_transformer": (lambda: LM(la.LocalTransformer(num_tokens=20, max_seq_len=16, dim=32, depth=2, heads=2,
                                                         dim_head=16, local_attn_window_size=4)), tokens()),
    # PyTorch Geometric
    "gcn": (lambda: Graph(gnn.GCN(8, 16, num_layers=3, out_channels=4, dropout=0.1)), graph),
    "gat": (lambda: Graph(gnn.GAT(8, 16, num_layers=3, out_channels=4, heads=2, dropout=0.1)), graph),
    "gin": (lambda: Graph(gnn.GIN(8, 16, num_layers=3, out_channels=4, norm="batch_norm")), graph),
    "sage": (lambda: Graph(gnn.GraphSAGE(8, 16, num_layers=3, out_channels=4, jk="cat")), graph),
    "pna": (lambda: Graph(gnn.PNA(8, 16, num_layers=2, out_channels=4, aggregators=["mean", "max", "std"],
                                  scalers=["identity", "amplification"], deg=torch.tensor([0, 4, 8, 6, 3, 1]))), graph),
    "edgecnn": (lambda: Graph(gnn.EdgeCNN(8, 16, num_layers=2, out_channels=4)), graph),
}


def main() -> int:
    def model(f: Callable[[], nn.Module]) -> nn.Module:
        m = f()
        return m if isinstance(m, (LM, Loss, Graph, Wrapped)) else Loss(m)

    return run({name: (lambda f=f: model(f)) for name, (f, _) in Z.items()}, lambda name, m: Z[name][1], varying=VARYING)


if __name__ == "__main__":
    raise SystemExit(main())
