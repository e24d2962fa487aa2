"""Point-cloud models in plain torch under the six zoo variants: PointNet++ set abstraction
(farthest point sampling from a torch.randint start, ball query by cdist + topk, gather by
index), single- and multi-scale grouping, a segmentation net with feature propagation
(3-NN inverse-distance interpolation), and DGCNN EdgeConv (knn by topk on pairwise
distances, recomputed on features each block; gathered neighbours, max over them).

cd REPO && PYTHONPATH=DIR OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05o/points_sweep.py [NAMES] [VARIANTS] [-v] [--det]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05b"))
import torch
import torch.nn.functional as F
from common import gen, run
from torch import nn


def fps(xyz: torch.Tensor, n: int) -> torch.Tensor:
    """Farthest point sampling: (B, N, 3) -> (B, n) indices; the start drawn by torch.randint."""
    B, N, _ = xyz.shape
    idx = torch.zeros(B, n, dtype=torch.long)
    dist = torch.full((B, N), 1e10)
    far = torch.randint(0, N, (B,), dtype=torch.long)
    ar = torch.arange(B)
    for i in range(n):
        idx[:, i] = far
        c = xyz[ar, far].unsqueeze(1)
        d = ((xyz - c) ** 2).sum(-1)
        dist = torch.minimum(dist, d)
        far = dist.argmax(-1)
    return idx


def gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (B, N, C), idx (B, ...) -> (B, ..., C)."""
    B = x.shape[0]
    flat = idx.reshape(B, -1)
    out = torch.gather(x, 1, flat.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    return out.reshape(*idx.shape, x.shape[-1])


def ball_query(radius: float, k: int, xyz: torch.Tensor, new_xyz: torch.Tensor) -> torch.Tensor:
    """k nearest within radius (topk of cdist), points outside the ball replaced by the nearest."""
    d = torch.cdist(new_xyz, xyz)  # (B, S, N)
    dk, ik = d.topk(k, dim=-1, largest=False)
    first = ik[..., :1].expand_as(ik)
    return torch.where(dk > radius, first, ik)


class SA(nn.Module):
    """Set abstraction: sample, group (one scale or several), shared MLP, max-pool."""

    def __init__(self, npoint, radii, ks, cin, mlps, group_all=False):
        super().__init__()
        self.npoint, self.radii, self.ks, self.group_all = npoint, radii, ks, group_all
        self.mlps = nn.ModuleList()
        for mlp in mlps:
            layers, c = [], cin + 3
            for co in mlp:
                layers += [nn.Conv2d(c, co, 1), nn.BatchNorm2d(co), nn.ReLU()]
                c = co
            self.mlps.append(nn.Sequential(*layers))

    def forward(self, xyz, feats):
        if self.group_all:
            new_xyz = xyz.mean(1, keepdim=True)
            g = torch.cat([xyz - new_xyz, feats], -1).unsqueeze(1) if feats is not None else (xyz - new_xyz).unsqueeze(1)
            groups = [g]
        else:
            with torch.no_grad():
                idx = fps(xyz, self.npoint)
            new_xyz = gather(xyz, idx)
            groups = []
            for r, k in zip(self.radii, self.ks):
                nb = ball_query(r, k, xyz, new_xyz)  # (B, S, k)
                gx = gather(xyz, nb) - new_xyz.unsqueeze(2)
                g = torch.cat([gx, gather(feats, nb)], -1) if feats is not None else gx
                groups.append(g)
        outs = []
        for g, mlp in zip(groups, self.mlps):
            h = mlp(g.permute(0, 3, 1, 2))  # (B, C, S, k)
            outs.append(h.max(-1)[0].transpose(1, 2))
        return new_xyz, torch.cat(outs, -1)


class FP(nn.Module):
    """Feature propagation: 3-NN inverse-distance interpolation, skip concat, MLP."""

    def __init__(self, cin, mlp):
        super().__init__()
        layers, c = [], cin
        for co in mlp:
            layers += [nn.Conv1d(c, co, 1), nn.BatchNorm1d(co), nn.ReLU()]
            c = co
        self.mlp = nn.Sequential(*layers)

    def forward(self, xyz1, xyz2, f1, f2):
        if xyz2.shape[1] == 1:
            interp = f2.expand(-1, xyz1.shape[1], -1)
        else:
            d = torch.cdist(xyz1, xyz2)
            dk, ik = d.topk(3, dim=-1, largest=False)
            w = 1.0 / (dk + 1e-8)
            w = w / w.sum(-1, keepdim=True)
            interp = (gather(f2, ik) * w.unsqueeze(-1)).sum(2)
        h = torch.cat([interp, f1], -1) if f1 is not None else interp
        return self.mlp(h.transpose(1, 2)).transpose(1, 2)


class PointNet2Cls(nn.Module):
    def __init__(self, msg=False, nc=4):
        super().__init__()
        if msg:
            self.sa = nn.ModuleList([
                SA(32, [0.2, 0.4], [8, 16], 0, [[16, 16], [16, 32]]),
                SA(16, [0.4, 0.8], [8, 16], 48, [[32, 32], [32, 64]]),
                SA(None, None, None, 96, [[64, 128]], group_all=True),
            ])
        else:
            self.sa = nn.ModuleList([
                SA(32, [0.3], [16], 0, [[16, 16, 32]]),
                SA(16, [0.6], [8], 32, [[32, 32, 64]]),
                SA(None, None, None, 64, [[64, 128]], group_all=True),
            ])
        self.head = nn.Sequential(nn.Linear(128, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.4), nn.Linear(64, nc))

    def forward(self, batch):
        xyz, y = batch
        f = None
        for sa in self.sa:
            xyz, f = sa(xyz, f)
        return F.cross_entropy(self.head(f.squeeze(1)), y)


class PointNet2Seg(nn.Module):
    def __init__(self, nc=5):
        super().__init__()
        self.sa = nn.ModuleList([SA(32, [0.3], [16], 0, [[16, 32]]), SA(8, [0.6], [8], 32, [[32, 64]])])
        self.fp = nn.ModuleList([FP(64 + 32, [32]), FP(32, [32, 32])])
        self.head = nn.Conv1d(32, nc, 1)

    def forward(self, batch):
        xyz, y = batch
        xs, fs = [xyz], [None]
        for sa in self.sa:
            x, f = sa(xs[-1], fs[-1])
            xs.append(x)
            fs.append(f)
        f = fs[-1]
        for i, fp in enumerate(self.fp):
            f = fp(xs[-2 - i], xs[-1 - i], fs[-2 - i], f)
        return F.cross_entropy(self.head(f.transpose(1, 2)), y)


def knn(x: torch.Tensor, k: int) -> torch.Tensor:
    """x (B, C, N) -> (B, N, k) neighbour indices, DGCNN's way."""
    inner = -2 * torch.matmul(x.transpose(2, 1), x)
    xx = torch.sum(x ** 2, dim=1, keepdim=True)
    pairwise = -xx - inner - xx.transpose(2, 1)
    return pairwise.topk(k=k, dim=-1)[1]


def graph_feature(x: torch.Tensor, k: int) -> torch.Tensor:
    B, C, N = x.shape
    idx = knn(x, k)
    idx = (idx + torch.arange(B).view(-1, 1, 1) * N).view(-1)
    xt = x.transpose(2, 1).contiguous()
    feature = xt.view(B * N, -1)[idx, :].view(B, N, k, C)
    xt = xt.view(B, N, 1, C).repeat(1, 1, k, 1)
    return torch.cat((feature - xt, xt), dim=3).permute(0, 3, 1, 2).contiguous()


class EdgeConv(nn.Module):
    def __init__(self, cin, cout, k):
        super().__init__()
        self.k = k
        self.conv = nn.Sequential(nn.Conv2d(cin * 2, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.2))

    def forward(self, x):
        return self.conv(graph_feature(x, self.k)).max(dim=-1)[0]


class DGCNN(nn.Module):
    def __init__(self, k=8, nc=4, emb=64):
        super().__init__()
        self.edge = nn.ModuleList([EdgeConv(3, 16, k), EdgeConv(16, 16, k), EdgeConv(16, 32, k), EdgeConv(32, 64, k)])
        self.conv5 = nn.Sequential(nn.Conv1d(128, emb, 1, bias=False), nn.BatchNorm1d(emb), nn.LeakyReLU(0.2))
        self.head = nn.Sequential(nn.Linear(emb * 2, 32, bias=False), nn.BatchNorm1d(32), nn.LeakyReLU(0.2),
                                  nn.Dropout(0.5), nn.Linear(32, nc))

    def forward(self, batch):
        x, y = batch
        x = x.transpose(1, 2)
        outs = []
        for e in self.edge:
            x = e(x)
            outs.append(x)
        x = self.conv5(torch.cat(outs, 1))
        x = torch.cat([F.adaptive_max_pool1d(x, 1).flatten(1), F.adaptive_avg_pool1d(x, 1).flatten(1)], 1)
        return F.cross_entropy(self.head(x), y, label_smoothing=0.2)


class FPSInRegion(nn.Module):
    """PointNet++ variant whose FPS runs with grad on and whose sampling start is drawn inside
    each region, plus dropout of points (torch.rand) inside the region."""

    class Block(nn.Module):
        def __init__(self, cin, cout, npoint, k):
            super().__init__()
            self.npoint, self.k = npoint, k
            self.mlp = nn.Sequential(nn.Linear(cin + 3, cout), nn.LayerNorm(cout), nn.GELU(), nn.Linear(cout, cout))

        def forward(self, xyz, f):
            keep = (torch.rand(xyz.shape[:2]) > 0.1).float().unsqueeze(-1)  # random point dropout
            idx = fps(xyz, self.npoint)
            new = gather(xyz, idx)
            nb = ball_query(0.5, self.k, xyz, new)
            g = torch.cat([gather(xyz, nb) - new.unsqueeze(2), gather(f * keep, nb)], -1)
            return new, self.mlp(g).max(2)[0]

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([FPSInRegion.Block(3, 16, 32, 8), FPSInRegion.Block(16, 32, 16, 8),
                                     FPSInRegion.Block(32, 32, 8, 4)])
        self.head = nn.Linear(32, 4)

    def forward(self, batch):
        xyz, y = batch
        f = xyz
        for b in self.blocks:
            xyz, f = b(xyz, f)
        return F.cross_entropy(self.head(f.max(1)[0]), y)


def cloud(n=64, b=4, nc=4, seg=False):
    def f(s):
        g = gen(s)
        xyz = torch.rand(b, n, 3, generator=g) * 2 - 1
        y = torch.randint(0, nc, (b, n) if seg else (b,), generator=g)
        return xyz, y
    return f


Z = {
    "pointnet2_ssg": (lambda: PointNet2Cls(), cloud()),
    "pointnet2_msg": (lambda: PointNet2Cls(msg=True), cloud()),
    "pointnet2_seg": (lambda: PointNet2Seg(), cloud(nc=5, seg=True)),
    "dgcnn": (lambda: DGCNN(), cloud()),
    "pn_fps_in_region": (FPSInRegion, cloud()),
}

if __name__ == "__main__":
    raise SystemExit(run(Z))
