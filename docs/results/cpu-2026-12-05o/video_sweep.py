"""torchvision video models and RAFT (sequence loss) under the six zoo variants.

cd REPO && PYTHONPATH=DIR OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05o/video_sweep.py [NAMES] [VARIANTS] [-v] [--det]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05b"))
import tv_stubs  # noqa: F401

# isort: split
import torch
import torch.nn.functional as F
from common import gen, run
from torch import nn
from torchvision.models import optical_flow, video


class Cls(nn.Module):
    def __init__(self, m: nn.Module, n: int = 3) -> None:
        super().__init__()
        self.m, self.n = m, n

    def forward(self, batch):
        x, y = batch
        return F.cross_entropy(self.m(x), y)


def clip(n, t, b=2):
    return lambda s: (torch.randn(b, 3, t, n, n, generator=gen(s)), torch.randint(0, 3, (b,), generator=gen(s)))


def s3d():
    m = video.s3d(num_classes=3)
    m.avgpool = nn.AdaptiveAvgPool3d(1)  # tiny clips: the 2x7x7 pool needs 16x224x224
    return m


class RaftSeq(nn.Module):
    """RAFT in training mode: flow predictions over iterations, the sequence loss of its
    reference training script (gamma-weighted L1 to the ground truth, valid mask)."""

    def __init__(self, m: nn.Module, iters: int, gamma: float = 0.8) -> None:
        super().__init__()
        self.m, self.iters, self.gamma = m, iters, gamma

    def forward(self, batch):
        a, b, flow_gt, valid = batch
        preds = self.m(a, b, num_flow_updates=self.iters)
        n = len(preds)
        loss = torch.zeros(())
        for i, p in enumerate(preds):
            w = self.gamma ** (n - i - 1)
            loss = loss + w * ((p - flow_gt).abs().sum(1) * valid).mean()
        return loss


def raft_batch(n, b=1):
    def f(s):
        g = gen(s)
        return (torch.randn(b, 3, n, n, generator=g), torch.randn(b, 3, n, n, generator=g),
                torch.randn(b, 2, n, n, generator=g), (torch.rand(b, n, n, generator=g) > 0.2).float())
    return f


def mvit():
    C = video.mvit.MSBlockConfig
    return video.MViT((32, 32), 8, [
        C(1, 16, 16, [3, 3, 3], [3, 3, 3], [1, 1, 1], [1, 4, 4]),
        C(1, 16, 32, [3, 3, 3], [3, 3, 3], [1, 2, 2], [1, 2, 2]),
        C(2, 32, 32, [3, 3, 3], [3, 3, 3], [1, 1, 1], [1, 1, 1]),
        C(1, 32, 64, [3, 3, 3], [3, 3, 3], [1, 2, 2], [1, 1, 1]),
    ], residual_pool=True, residual_with_cls_embed=False, rel_pos_embed=True, proj_after_attn=True,
        dropout=0.1, attention_dropout=0.1, stochastic_depth_prob=0.2, num_classes=3,
        patch_embed_kernel=(3, 7, 7), patch_embed_stride=(2, 4, 4), patch_embed_padding=(1, 3, 3))


def swin3d():
    S = video.swin_transformer
    return S.SwinTransformer3d(patch_size=[2, 4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                               window_size=[2, 4, 4], stochastic_depth_prob=0.2, dropout=0.1,
                               attention_dropout=0.1, num_classes=3)


Z = {
    "r3d_18": (lambda: Cls(video.r3d_18(num_classes=3)), clip(32, 4)),
    "mc3_18": (lambda: Cls(video.mc3_18(num_classes=3)), clip(32, 4)),
    "r2plus1d_18": (lambda: Cls(video.r2plus1d_18(num_classes=3)), clip(32, 4)),
    "s3d": (lambda: Cls(s3d()), clip(32, 8)),
    "mvit_v2": (lambda: Cls(mvit()), clip(32, 8)),
    "swin3d": (lambda: Cls(swin3d()), clip(32, 8)),
    "raft_small_seq": (lambda: RaftSeq(optical_flow.raft_small(weights=None), 4), raft_batch(128)),
    "raft_large_seq": (lambda: RaftSeq(optical_flow.raft_large(weights=None), 3), raft_batch(128)),
}

if __name__ == "__main__":
    raise SystemExit(run(Z))
