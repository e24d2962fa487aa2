"""TabNet (pytorch-tabnet 4.1.0) and FT-Transformer (rtdl_revisiting_models 0.0.2) under
the six zoo variants.

cd REPO && PYTHONPATH=DIR OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05o/tabular_sweep.py [NAMES] [VARIANTS] [-v] [--det]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05b"))
import rtdl_revisiting_models as rtdl
import torch
import torch.nn.functional as F
from common import gen, run
from pytorch_tabnet import tab_network as tn
from torch import nn

NF = 10
B = 32
LAMBDA_SPARSE = 1e-3


def group_matrix(groups, d):
    """pytorch_tabnet.utils.create_group_matrix, by hand (its module imports scipy)."""
    if not groups:
        return torch.eye(d)
    m = torch.zeros(len(groups) + d - sum(len(g) for g in groups), d)
    rest = [i for i in range(d) if not any(i in g for g in groups)]
    r = 0
    for g in groups:
        for j in g:
            m[r, j] = 1 / len(g)
        r += 1
    for j in rest:
        m[r, j] = 1
        r += 1
    return m


class TabSup(nn.Module):
    """The trainer's loss: task loss - lambda_sparse * M_loss (abstract_model.py)."""

    def __init__(self, net: nn.Module, multi: bool = False) -> None:
        super().__init__()
        self.net, self.multi = net, multi

    def forward(self, batch):
        x, y = batch
        out, m_loss = self.net(x)
        if self.multi:
            loss = sum(F.cross_entropy(o, y[:, i]) for i, o in enumerate(out)) / len(out)
        else:
            loss = F.cross_entropy(out, y[:, 0])
        return loss - LAMBDA_SPARSE * m_loss


def unsupervised_loss(y_pred, embedded_x, obf_vars, eps=1e-9):
    """pytorch_tabnet.metrics.UnsupervisedLoss."""
    errors = y_pred - embedded_x
    reconstruction_errors = torch.mul(errors, obf_vars) ** 2
    batch_means = torch.mean(embedded_x, dim=0)
    batch_means[batch_means == 0] = 1
    batch_stds = torch.std(embedded_x, dim=0) ** 2
    batch_stds[batch_stds == 0] = batch_means[batch_stds == 0]
    features_loss = torch.matmul(reconstruction_errors, 1 / batch_stds)
    nb_reconstructed_variables = torch.sum(obf_vars, dim=1)
    features_loss = features_loss / (nb_reconstructed_variables + eps)
    return torch.mean(features_loss)


class TabPre(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, batch):
        x, _ = batch
        return unsupervised_loss(*self.net(x))


CAT_IDX = [1, 4, 7]
CAT_DIMS = [5, 3, 7]


def tab_batch(cat=False, tasks=1, b=B):
    def f(s):
        g = gen(s)
        x = torch.randn(b, NF, generator=g)
        if cat:
            for i, d in zip(CAT_IDX, CAT_DIMS):
                x[:, i] = torch.randint(0, d, (b,), generator=g).float()
        y = torch.randint(0, 3, (b, tasks), generator=g)
        return x, y
    return f


def ft(n_blocks=2, cat=(), **kw):
    args = dict(d_out=3, n_blocks=n_blocks, d_block=16, attention_n_heads=4, attention_dropout=0.1,
                ffn_d_hidden=None, ffn_d_hidden_multiplier=4 / 3, ffn_dropout=0.1, residual_dropout=0.05)
    args.update(kw)
    return rtdl.FTTransformer(n_cont_features=NF - len(cat), cat_cardinalities=list(cat), **args)


class FTLoss(nn.Module):
    def __init__(self, m, ncat=0):
        super().__init__()
        self.m, self.ncat = m, ncat

    def forward(self, batch):
        xc, xcat, y = batch
        return F.cross_entropy(self.m(xc, xcat), y)


def ft_batch(ncat=0, card=(4, 6)):
    def f(s):
        g = gen(s)
        xc = torch.randn(B, NF - ncat, generator=g)
        xcat = torch.stack([torch.randint(0, c, (B,), generator=g) for c in card], 1) if ncat else None
        return xc, xcat, torch.randint(0, 3, (B,), generator=g)
    return f


class HandFT(nn.Module):
    """Hand-written FT-Transformer: per-feature linear tokenizer (weight, bias per feature),
    a [CLS] token, pre-norm blocks with a Linformer key/value projection shared by all
    blocks (the "layerwise" sharing rtdl's new package dropped), the last block attending
    from [CLS] alone."""

    class Block(nn.Module):
        def __init__(self, d, heads, first, shared_kv):
            super().__init__()
            self.n1 = nn.Identity() if first else nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
            self.n2 = nn.LayerNorm(d)
            self.ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * d, d))
            self.kv = shared_kv  # nn.Linear(tokens, compressed), the same object in every block
            self.drop = nn.Dropout(0.05)

        def forward(self, x, last: bool):
            h = self.n1(x)
            kv = self.kv(h.transpose(1, 2)).transpose(1, 2)
            q = h[:, :1] if last else h
            a, _ = self.attn(q, kv, kv, need_weights=False)
            x = (x[:, :1] if last else x) + self.drop(a)
            return x + self.drop(self.ffn(self.n2(x)))

    def __init__(self, nf, d, heads, n_blocks):
        super().__init__()
        self.w = nn.Parameter(torch.randn(nf, d) / d ** 0.5)
        self.b = nn.Parameter(torch.randn(nf, d) / d ** 0.5)
        self.cls = nn.Parameter(torch.randn(d) / d ** 0.5)
        kv = nn.Linear(nf + 1, (nf + 1) // 2, bias=False)
        self.blocks = nn.ModuleList(HandFT.Block(d, heads, i == 0, kv) for i in range(n_blocks))
        self.head = nn.Sequential(nn.LayerNorm(d), nn.ReLU(), nn.Linear(d, 3))

    def forward(self, xc, xcat):
        t = xc[..., None] * self.w + self.b
        x = torch.cat([self.cls.expand(len(xc), 1, -1), t], 1)
        for i, blk in enumerate(self.blocks):
            x = blk(x, last=i == len(self.blocks) - 1)
        return self.head(x[:, 0])


Z = {
    # TabNet: GBN chunks the batch of 32 into virtual batches of 8; shared GLU layers
    "tabnet_noemb": (lambda: TabSup(tn.TabNetNoEmbeddings(NF, 3, n_d=8, n_a=8, n_steps=3, virtual_batch_size=8,
                                                          group_attention_matrix=torch.eye(NF))), tab_batch()),
    "tabnet_emb_entmax": (lambda: TabSup(tn.TabNet(NF, 3, n_d=8, n_a=8, n_steps=4, cat_idxs=CAT_IDX, cat_dims=CAT_DIMS,
                                                   cat_emb_dim=[2, 1, 3], virtual_batch_size=8, mask_type="entmax",
                                                   group_attention_matrix=group_matrix([[0, 2], [5, 6, 8]], NF))),
                          tab_batch(cat=True)),
    "tabnet_multitask": (lambda: TabSup(tn.TabNet(NF, [3, 3], n_d=4, n_a=4, n_steps=3, n_independent=1, n_shared=1,
                                                  virtual_batch_size=16, group_attention_matrix=torch.eye(NF)), multi=True),
                         tab_batch(tasks=2)),
    "tabnet_pretrain": (lambda: TabPre(tn.TabNetPretraining(NF, pretraining_ratio=0.3, n_d=8, n_a=8, n_steps=3,
                                                            virtual_batch_size=8, group_attention_matrix=torch.eye(NF))),
                        tab_batch()),
    # FT-Transformer: ModuleDict blocks driven by the backbone's forward
    "ft_transformer": (lambda: FTLoss(ft(3)), ft_batch()),
    "ft_cat_relu": (lambda: FTLoss(ft(2, cat=(4, 6), ffn_activation="ReLU", ffn_d_hidden_multiplier=2.0), 2),
                    ft_batch(2)),
    "ft_linformer": (lambda: FTLoss(ft(3, linformer_kv_compression_ratio=0.5,
                                       linformer_kv_compression_sharing="headwise")), ft_batch()),
    "ft_handwritten": (lambda: FTLoss(HandFT(NF, 16, 4, 3)), ft_batch()),
    "ft_linformer_kv": (lambda: FTLoss(ft(2, linformer_kv_compression_ratio=0.5,
                                          linformer_kv_compression_sharing="key-value")), ft_batch()),
}

import re

RT = {"regions": lambda m, n: re.fullmatch(r".*blocks\.\d+\.(attention|ffn)", n) is not None}
for _n in ("ft_transformer", "ft_cat_relu", "ft_linformer", "ft_linformer_kv"):
    Z[_n + "_rg"] = (*Z[_n], RT)

if __name__ == "__main__":
    raise SystemExit(run(Z))
