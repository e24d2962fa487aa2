"""PyTorch Geometric and torchaudio model families under every zoo variant, gradients
compared bitwise with plain training (tests/helpers.check_variant, through
../cpu-2026-12-05/sweep.py).

    PYTHONPATH=DIR OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05i/sweep_i.py [NAME,NAME ...|all] [VARIANT,...] [-v]

DIR holds, installed with ``pip install --no-deps --target DIR``: torch-geometric 2.8.1
(pure PyTorch: no pyg-lib, torch-scatter, torch-sparse or torch-cluster) and what it
imports: xxhash 4.1.0, requests 2.32.5, urllib3 2.5.0, charset-normalizer 3.4.4,
certifi 2025.10.5 (aiohttp, fsspec, jinja2, psutil, pyparsing, tqdm are in the venv);
torchaudio 2.11.1, whose wheel links a CUDA build of torch's libraries: its C++
libraries are moved out (``mv DIR/torchaudio/lib/*.so elsewhere``), after which
``torchaudio.models`` imports and its models (Python) run. Tiny configurations, 4 steps
each, on the CPU; prints PASS/FAIL per model and variant.

What the models bring. PyG: message passing through ``scatter``/``index_add`` on
edge indices, GCN's normalisation, attention softmax over edges (GAT, GATv2,
TransformerConv with edge features and a gated skip), node-classification with dropout
and a loss over a node mask, graph classification over a batch of graphs of different
sizes with global pooling, GPS (local GINE plus global multi-head attention over
``to_dense_batch``), data-dependent node selection (TopKPooling, SAGPooling, GraphUNet
with its sparse ``A @ A`` augmentation: edge counts vary with the data), dense DiffPool
(soft assignment, link and entropy losses), GCNII's initial residual passed to every
layer, DeepGCN res+ blocks with GENConv's learnable softmax aggregation, relational
GCN, GatedGraphConv's GRU, a heterogeneous HeteroConv with dict inputs, and SchNet with
a pure-PyTorch radius graph (DimeNet needs torch-sparse's SparseTensor: left out).
torchaudio: wav2vec 2.0 with layer drop and padding masks, HuBERT pretraining with time
and channel masking, WavLM with layer drop, Conformer (convolution first, group norm),
Emformer with a memory bank, DeepSpeech, Wav2Letter on waveforms, WaveRNN, Tacotron 2
with teacher forcing (a decoder loop of LSTM cells, prenet dropout always on), and the
SQUIM objective model (dual-path RNN blocks).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))

import torch
import torch.nn.functional as F
import torch_geometric.nn as gnn
import torchaudio
from sweep import run
from torch import nn
from torch_geometric.utils import to_dense_adj, to_dense_batch

ta = torchaudio.models


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _loss(o: Any) -> torch.Tensor:
    """A scalar from any output: per float tensor, the mean square plus a fixed weighting
    (over finite elements); containers summed."""
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
    """A model called on a batch (a tuple of positional arguments, or one argument), and a
    loss on whatever it returns."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, batch: Any) -> torch.Tensor:
        return _loss(self.m(*batch) if isinstance(batch, tuple) else self.m(batch))


# --- graphs ---------------------------------------------------------------------------

F_IN, N_CLS = 8, 4
SIZES = (6, 9, 13)  # a batch of three graphs of different sizes (fixed across steps)


def _edges(n: int, e: int, g: torch.Generator, offset: int = 0) -> torch.Tensor:
    """``e`` random directed edges among ``n`` nodes, no self loops (so GCN's added self
    loops leave the edge count fixed)."""
    src = torch.randint(0, n, (e,), generator=g)
    dst = (src + torch.randint(1, n, (e,), generator=g)) % n
    return torch.stack([src, dst]) + offset


def one_graph(s: int, n: int = 30, e: int = 90, edge_dim: int = 0) -> dict[str, torch.Tensor]:
    g = _gen(s)
    d = {"x": torch.randn(n, F_IN, generator=g), "edge_index": _edges(n, e, g),
         "y": torch.randint(0, N_CLS, (n,), generator=g), "mask": torch.rand(n, generator=g) < 0.5}
    if edge_dim:
        d["edge_attr"] = torch.randn(e, edge_dim, generator=g)
    return d


def graphs(s: int, edge_dim: int = 0, sizes: tuple[int, ...] = SIZES) -> dict[str, torch.Tensor]:
    """A batch of graphs of different sizes, PyG style: concatenated nodes, offset edges,
    a ``batch`` vector, one label per graph."""
    g = _gen(s)
    xs, es, bs, off = [], [], [], 0
    for i, n in enumerate(sizes):
        xs.append(torch.randn(n, F_IN, generator=g))
        es.append(_edges(n, 2 * n, g, off))
        bs.append(torch.full((n,), i))
        off += n
    ei = torch.cat(es, 1)
    d = {"x": torch.cat(xs), "edge_index": ei, "batch": torch.cat(bs),
         "y": torch.randint(0, N_CLS, (len(sizes),), generator=g)}
    if edge_dim:
        d["edge_attr"] = torch.randn(ei.shape[1], edge_dim, generator=g)
    return d


class NodeCls(nn.Module):
    """Node classification: cross entropy over the masked (training) nodes."""

    def __init__(self, m: nn.Module, edge_attr: bool = False) -> None:
        super().__init__()
        self.m, self.edge_attr = m, edge_attr

    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        kw = {"edge_attr": d["edge_attr"]} if self.edge_attr else {}
        out = self.m(d["x"], d["edge_index"], **kw)
        return F.cross_entropy(out[d["mask"]], d["y"][d["mask"]])


class GraphCls(nn.Module):
    """Graph classification: a node model, a global pooling over the batch vector, a
    linear head, cross entropy per graph."""

    def __init__(self, m: nn.Module, hidden: int, pool: Callable = gnn.global_mean_pool, edge_attr: bool = False) -> None:
        super().__init__()
        self.m, self.pool, self.edge_attr = m, pool, edge_attr
        self.head = nn.Linear(hidden, N_CLS)

    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        kw = {"edge_attr": d["edge_attr"]} if self.edge_attr else {}
        h = self.m(d["x"], d["edge_index"], **kw)
        return F.cross_entropy(self.head(self.pool(h, d["batch"])), d["y"])


class TransformerNet(nn.Module):
    """A graph transformer: TransformerConv layers with edge features, a gated skip
    (``beta``), attention dropout, and layer norms."""

    def __init__(self, hidden: int = 16, heads: int = 2, layers: int = 3, edge_dim: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(F_IN, hidden)
        self.convs = nn.ModuleList(
            gnn.TransformerConv(hidden, hidden // heads, heads=heads, edge_dim=edge_dim, beta=True, dropout=0.1)
            for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.out = nn.Linear(hidden, N_CLS)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + F.gelu(conv(h, edge_index, edge_attr)))
        return self.out(h)


class GPS(nn.Module):
    """GraphGPS: GPSConv layers (GINE local message passing plus global multi-head
    attention over the dense batch), batch norm, global add pooling."""

    def __init__(self, hidden: int = 16, layers: int = 2, edge_dim: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(F_IN, hidden)
        self.edge = nn.Linear(edge_dim, hidden)
        self.convs = nn.ModuleList()
        for _ in range(layers):
            mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
            self.convs.append(gnn.GPSConv(hidden, gnn.GINEConv(mlp), heads=2, dropout=0.1,
                                          attn_kwargs={"dropout": 0.1}))
        self.head = nn.Linear(hidden, N_CLS)

    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        h, ea = self.inp(d["x"]), self.edge(d["edge_attr"])
        for conv in self.convs:
            h = conv(h, d["edge_index"], d["batch"], edge_attr=ea)
        return F.cross_entropy(self.head(gnn.global_add_pool(h, d["batch"])), d["y"])


class PoolNet(nn.Module):
    """GCN layers, each followed by TopKPooling or SAGPooling (data-dependent node
    selection, per graph), a readout after each, graph classification."""

    def __init__(self, kind: str, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.convs = nn.ModuleList(gnn.GCNConv(F_IN if i == 0 else hidden, hidden) for i in range(layers))
        pool = (lambda: gnn.TopKPooling(hidden, ratio=0.6)) if kind == "topk" else (
            lambda: gnn.SAGPooling(hidden, ratio=0.6, GNN=gnn.GraphConv))
        self.pools = nn.ModuleList(pool() for _ in range(layers))
        self.head = nn.Linear(2 * hidden, N_CLS)

    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        x, ei, b = d["x"], d["edge_index"], d["batch"]
        r = 0
        for conv, pool in zip(self.convs, self.pools):
            x = F.relu(conv(x, ei))
            x, ei, _, b, _, _ = pool(x, ei, batch=b)
            r = r + torch.cat([gnn.global_max_pool(x, b), gnn.global_mean_pool(x, b)], 1)
        return F.cross_entropy(self.head(r), d["y"])


class GraphUNetNode(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.m = gnn.GraphUNet(F_IN, 16, N_CLS, depth=2, pool_ratios=0.6)

    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        x = F.dropout(d["x"], 0.2, self.training)
        return F.cross_entropy(self.m(x, d["edge_index"])[d["mask"]], d["y"][d["mask"]])


class DiffPool(nn.Module):
    """Dense DiffPool: DenseSAGEConv embedding and assignment networks, two pooling levels,
    link-prediction and entropy auxiliary losses."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.gnn1_pool = nn.ModuleList([gnn.DenseSAGEConv(F_IN, hidden), gnn.DenseSAGEConv(hidden, 5)])
        self.gnn1_embed = nn.ModuleList([gnn.DenseSAGEConv(F_IN, hidden), gnn.DenseSAGEConv(hidden, hidden)])
        self.gnn2_pool = nn.ModuleList([gnn.DenseSAGEConv(hidden, hidden), gnn.DenseSAGEConv(hidden, 2)])
        self.gnn2_embed = nn.ModuleList([gnn.DenseSAGEConv(hidden, hidden), gnn.DenseSAGEConv(hidden, hidden)])
        self.head = nn.Linear(hidden, N_CLS)

    @staticmethod
    def _gnn(convs: nn.ModuleList, x: torch.Tensor, adj: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for i, c in enumerate(convs):
            x = c(x, adj, mask)
            if i < len(convs) - 1:
                x = F.relu(x)
        return x

    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        x, mask = to_dense_batch(d["x"], d["batch"])
        adj = to_dense_adj(d["edge_index"], d["batch"])
        s = self._gnn(self.gnn1_pool, x, adj, mask)
        x = self._gnn(self.gnn1_embed, x, adj, mask)
        x, adj, l1, e1 = gnn.dense_diff_pool(x, adj, s, mask)
        s = self._gnn(self.gnn2_pool, x, adj, None)
        x = self._gnn(self.gnn2_embed, x, adj, None)
        x, adj, l2, e2 = gnn.dense_diff_pool(x, adj, s)
        return F.cross_entropy(self.head(x.mean(1)), d["y"]) + l1 + l2 + e1 + e2


class GCNII(nn.Module):
    """GCN2Conv layers: the initial representation x_0 passed to every layer."""

    def __init__(self, hidden: int = 16, layers: int = 4) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(F_IN, hidden), nn.Linear(hidden, N_CLS)
        self.convs = nn.ModuleList(gnn.GCN2Conv(hidden, alpha=0.1, theta=0.5, layer=i + 1) for i in range(layers))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x0 = h = F.relu(self.inp(F.dropout(x, 0.3, self.training)))
        for conv in self.convs:
            h = F.relu(conv(F.dropout(h, 0.3, self.training), x0, edge_index))
        return self.out(h)


class DeeperGCN(nn.Module):
    """DeepGCN res+ blocks around GENConv (learnable softmax aggregation, message norm)."""

    def __init__(self, hidden: int = 16, layers: int = 3, edge_dim: int = 4) -> None:
        super().__init__()
        self.inp, self.edge, self.out = nn.Linear(F_IN, hidden), nn.Linear(edge_dim, hidden), nn.Linear(hidden, N_CLS)
        self.layers = nn.ModuleList(
            gnn.DeepGCNLayer(gnn.GENConv(hidden, hidden, aggr="softmax", t=1.0, learn_t=True, num_layers=2,
                                         norm="layer", msg_norm=True, learn_msg_scale=True),
                             nn.LayerNorm(hidden, elementwise_affine=True), nn.ReLU(), block="res+", dropout=0.1)
            for _ in range(layers))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        h, ea = self.inp(x), self.edge(edge_attr)
        h = self.layers[0].conv(h, edge_index, ea)
        for layer in self.layers[1:]:
            h = layer(h, edge_index, ea)
        h = self.layers[0].act(self.layers[0].norm(h))
        return self.out(F.dropout(h, 0.1, self.training))


class RGCN(nn.Module):
    def __init__(self, hidden: int = 16, rels: int = 3) -> None:
        super().__init__()
        self.convs = nn.ModuleList([gnn.RGCNConv(F_IN, hidden, rels, num_bases=2),
                                    gnn.RGCNConv(hidden, hidden, rels, num_blocks=4),
                                    gnn.RGCNConv(hidden, N_CLS, rels)])

    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        h, et = d["x"], d["edge_type"]
        for i, c in enumerate(self.convs):
            h = c(h, d["edge_index"], et)
            if i < len(self.convs) - 1:
                h = F.dropout(F.relu(h), 0.2, self.training)
        return F.cross_entropy(h[d["mask"]], d["y"][d["mask"]])


def rgcn_graph(s: int) -> dict[str, torch.Tensor]:
    d = one_graph(s)
    d["edge_type"] = torch.randint(0, 3, (d["edge_index"].shape[1],), generator=_gen(s + 500))
    return d


class GatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(gnn.GatedGraphConv(16, num_layers=3) for _ in range(2))
        self.out = nn.Linear(16, N_CLS)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = x
        for c in self.convs:
            h = c(h, edge_index)
        return self.out(h)


class Hetero(nn.Module):
    """HeteroConv over two node types and three edge types, dict inputs and outputs."""

    def __init__(self, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.convs = nn.ModuleList(gnn.HeteroConv({
            ("paper", "cites", "paper"): gnn.GCNConv(-1, hidden),
            ("author", "writes", "paper"): gnn.SAGEConv((-1, -1), hidden),
            ("paper", "rev_writes", "author"): gnn.GATConv((-1, -1), hidden, add_self_loops=False),
        }, aggr="sum") for _ in range(layers))
        self.out = nn.Linear(hidden, N_CLS)

    def forward(self, d: dict[str, Any]) -> torch.Tensor:
        xd = dict(d["x"])
        for c in self.convs:
            xd = {k: F.relu(v) for k, v in c(xd, d["edge_index"]).items()}
        return F.cross_entropy(self.out(xd["paper"]), d["y"])


def hetero_graph(s: int) -> dict[str, Any]:
    g = _gen(s)
    npap, nau = 20, 10
    src_a = torch.randint(0, nau, (30,), generator=g)
    dst_p = torch.randint(0, npap, (30,), generator=g)
    return {
        "x": {"paper": torch.randn(npap, F_IN, generator=g), "author": torch.randn(nau, 6, generator=g)},
        "edge_index": {("paper", "cites", "paper"): _edges(npap, 40, g),
                       ("author", "writes", "paper"): torch.stack([src_a, dst_p]),
                       ("paper", "rev_writes", "author"): torch.stack([dst_p, src_a])},
        "y": torch.randint(0, N_CLS, (npap,), generator=g),
    }


def _radius_graph(pos: torch.Tensor, batch: torch.Tensor, cutoff: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A pure-PyTorch radius graph (no torch-cluster): pairs in the same molecule closer
    than ``cutoff``, no self loops; returns edges and their lengths."""
    with torch.no_grad():
        d = torch.cdist(pos, pos)
        ok = (d < cutoff) & (batch[:, None] == batch[None, :])
        ok.fill_diagonal_(False)
        edge_index = ok.nonzero().t()
    row, col = edge_index
    return edge_index, (pos[row] - pos[col]).norm(dim=-1)


class SchNetLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.m = gnn.SchNet(hidden_channels=16, num_filters=16, num_interactions=3, num_gaussians=10, cutoff=2.5,
                            interaction_graph=lambda pos, batch: _radius_graph(pos, batch, 2.5))

    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        return (self.m(d["z"], d["pos"], d["batch"]).squeeze(-1) - d["target"]).pow(2).mean()


def molecules(s: int) -> dict[str, torch.Tensor]:
    g = _gen(s)
    sizes = (5, 7, 9)
    return {"z": torch.randint(1, 10, (sum(sizes),), generator=g), "pos": torch.randn(sum(sizes), 3, generator=g),
            "batch": torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)]),
            "target": torch.randn(len(sizes), generator=g)}


# --- audio ----------------------------------------------------------------------------

CONV = [(32, 10, 5), (32, 3, 2), (32, 2, 2)]


def wav(n: int = 1600, b: int = 2) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    return lambda s: (torch.randn(b, n, generator=_gen(s)), torch.tensor([n, n - 300]))


def feats(t: int, f: int, b: int = 2) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    return lambda s: (torch.randn(b, t, f, generator=_gen(s)), torch.tensor([t, t - 3]))


class Tacotron2TF(nn.Module):
    """Tacotron 2 trained with teacher forcing: mel L2 before and after the postnet, gate
    BCE against the stop frames, over the valid frames (lengths sorted, as its packed
    encoder needs). ``mask_padding=False``: with True, Tacotron2.forward fills its
    pre-postnet output in place after the postnet's first convolution saved it, and
    plain training fails in backward."""

    def __init__(self) -> None:
        super().__init__()
        self.m = ta.Tacotron2(
            mask_padding=False, n_mels=8, n_symbol=20, n_frames_per_step=1, symbol_embedding_dim=16,
            encoder_embedding_dim=16, encoder_n_convolution=2, encoder_kernel_size=3, decoder_rnn_dim=16,
            decoder_max_step=50, decoder_dropout=0.1, decoder_early_stopping=True, attention_rnn_dim=16,
            attention_hidden_dim=16, attention_location_n_filter=4, attention_location_kernel_size=5,
            attention_dropout=0.1, prenet_dim=16, postnet_n_convolution=2, postnet_kernel_size=3,
            postnet_embedding_dim=16, gate_threshold=0.5)

    def forward(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        tokens, tlen, mel, mlen = batch
        mel_out, mel_post, gate, _ = self.m(tokens, tlen, mel, mlen)
        t = torch.arange(mel.shape[2])[None, :]
        valid = (t < mlen[:, None]).float()
        stop = (t >= (mlen[:, None] - 1)).float()
        w = valid[:, None, :] / valid.sum()
        mse = (((mel_out - mel) ** 2 + (mel_post - mel) ** 2) * w).sum()
        return mse + (F.binary_cross_entropy_with_logits(gate, stop, reduction="none") * valid).sum() / valid.sum()


def tts_batch(s: int) -> tuple[torch.Tensor, ...]:
    g = _gen(s)
    return (torch.randint(1, 20, (2, 7), generator=g), torch.tensor([7, 5]),
            torch.randn(2, 8, 12, generator=g), torch.tensor([12, 9]))


class Hubert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # mask_prob 0.5, length 2; channel masking 0.3, length 2; layer drop 0.5
        self.m = ta.hubert_pretrain_model(
            "group_norm", CONV, False, 32, 0.1, 16, 2, 2, 2, 0.1, 64, 0.1, 0.1, False, 0.5, 0.5, "static", 0.0, 2,
            True, 1, 0.3, "static", 0.0, 2, False, 0, False, False, 10, 16, 0.1)

    def forward(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        w, labels, lengths = batch
        return _loss(self.m(w, labels, lengths))


def hubert_batch(s: int) -> tuple[torch.Tensor, ...]:
    g = _gen(s)
    return torch.randn(2, 1600, generator=g), torch.randint(0, 10, (2, 79), generator=g), torch.tensor([1600, 1300])


Z: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any]]] = {
    # --- PyTorch Geometric
    "pyg_gcn_node": (lambda: NodeCls(gnn.GCN(F_IN, 16, num_layers=3, out_channels=N_CLS, dropout=0.5, norm="batch_norm")),
                     one_graph),
    "pyg_gat_node": (lambda: NodeCls(gnn.GAT(F_IN, 16, num_layers=3, out_channels=N_CLS, heads=4, dropout=0.3,
                                             jk="max")), one_graph),
    "pyg_gatv2_edge": (lambda: NodeCls(gnn.GAT(F_IN, 16, num_layers=3, out_channels=N_CLS, v2=True, heads=2,
                                               edge_dim=4, dropout=0.2, residual=True), edge_attr=True),
                       lambda s: one_graph(s, edge_dim=4)),
    "pyg_sage_graphs": (lambda: GraphCls(gnn.GraphSAGE(F_IN, 16, num_layers=3, dropout=0.2, aggr="max"), 16),
                        graphs),
    "pyg_gin_graphs": (lambda: GraphCls(gnn.GIN(F_IN, 16, num_layers=3, dropout=0.2, norm="batch_norm",
                                                train_eps=True), 16, gnn.global_add_pool), graphs),
    "pyg_transformer": (lambda: NodeCls(TransformerNet(), edge_attr=True), lambda s: one_graph(s, edge_dim=4)),
    "pyg_gps": (GPS, lambda s: graphs(s, edge_dim=4)),
    "pyg_topk_pool": (lambda: PoolNet("topk"), graphs),
    "pyg_sag_pool": (lambda: PoolNet("sag"), graphs),
    "pyg_graph_unet": (GraphUNetNode, one_graph),
    "pyg_diffpool": (DiffPool, graphs),
    "pyg_gcnii": (lambda: NodeCls(GCNII()), one_graph),
    "pyg_deepergcn": (lambda: NodeCls(DeeperGCN(), edge_attr=True), lambda s: one_graph(s, edge_dim=4)),
    "pyg_rgcn": (RGCN, rgcn_graph),
    "pyg_gated": (lambda: NodeCls(GatedNet()), one_graph),
    "pyg_hetero": (Hetero, hetero_graph),
    "pyg_schnet": (SchNetLoss, molecules),
    # --- torchaudio
    "ta_wav2vec2_ld": (lambda: Loss(ta.wav2vec2_model(
        "layer_norm", CONV, True, 32, 0.1, 16, 2, 3, 2, 0.1, 64, 0.1, 0.1, True, 0.5, 5)), wav()),
    "ta_hubert_mask": (Hubert, hubert_batch),
    # WavLM's attention asserts it gets no padding mask: waveforms alone; layer drop 0.5
    "ta_wavlm_ld": (lambda: Loss(ta.wavlm_model(
        "group_norm", CONV, False, 32, 0.1, 16, 2, 3, 2, 8, 16, 0.1, 64, 0.1, 0.1, False, 0.5, 5)),
                    lambda s: torch.randn(2, 1600, generator=_gen(s))),
    "ta_conformer": (lambda: Loss(ta.Conformer(16, 2, 32, 3, 5, dropout=0.1, use_group_norm=True,
                                               convolution_first=True)), feats(12, 16)),
    "ta_emformer_mem": (lambda: Loss(ta.Emformer(16, 2, 32, 2, segment_length=4, left_context_length=4,
                                                 right_context_length=1, max_memory_size=2, dropout=0.1,
                                                 tanh_on_mem=True)),
                        lambda s: (torch.randn(2, 17, 16, generator=_gen(s)), torch.tensor([17, 13]))),
    "ta_deepspeech": (lambda: Loss(ta.DeepSpeech(16, n_hidden=32, n_class=5, dropout=0.2)),
                      lambda s: torch.randn(2, 1, 10, 16, generator=_gen(s))),
    "ta_wav2letter_wave": (lambda: Loss(ta.Wav2Letter(num_classes=5, input_type="waveform", num_features=1)),
                           lambda s: torch.randn(2, 1, 1200, generator=_gen(s))),
    "ta_wavernn": (lambda: Loss(ta.WaveRNN([2, 2], 16, hop_length=4, n_res_block=3, n_rnn=16, n_fc=16, n_freq=8,
                                           n_hidden=8, n_output=8)),
                   lambda s: (torch.randn(2, 1, 24, generator=_gen(s)), torch.randn(2, 1, 8, 10, generator=_gen(s)))),
    "ta_tacotron2": (Tacotron2TF, tts_batch),
    "ta_squim_obj": (lambda: Loss(ta.squim_objective_model(
        feat_dim=16, win_len=16, d_model=16, nhead=2, hidden_dim=16, num_blocks=2, rnn_type="LSTM", chunk_size=8)),
                     lambda s: torch.randn(2, 400, generator=_gen(s))),
}

#: Models whose saves change from step to step: GraphUNet's ``A @ A`` edge count depends
#: on the random graph, SchNet's radius graph on the random positions; TopKPooling's and
#: SAGPooling's kept nodes, and so the edges the next layer sees, on the data; RGCN
#: splits the edges by their random types inside each layer; WavLM's layer drop skips
#: random layers (its relative position bias is passed from layer to layer, so the
#: next layer's saves change too). Auto measures such signatures again after a planned
#: step that differs (NOTE [Calibration sizes]; ``../../reliability.md``, "Regions
#: whose saves depend on the data"), so step 3 may still be measuring.
VARYING = frozenset({"pyg_graph_unet", "pyg_schnet", "pyg_topk_pool", "pyg_sag_pool", "pyg_rgcn", "ta_wavlm_ld"})


def main() -> int:
    return run({n: f for n, (f, _) in Z.items()}, lambda name, m: Z[name][1], varying=VARYING)


if __name__ == "__main__":
    raise SystemExit(main())
