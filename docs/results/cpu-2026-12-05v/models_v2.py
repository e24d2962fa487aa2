"""Harder variants: caches in argument dicts / reassigned buffers, partial chunks, attention state as
module attributes, losses inside regions with per-step lengths, tau annealed inside the forward."""
from __future__ import annotations
import math
import torch
import torch.nn.functional as F
from torch import nn
import models_v as M
from models_v import D, FEAT, VOCAB, _gen


class StreamBlock2(nn.Module):
    def __init__(self, store: str, left: int = 4) -> None:
        super().__init__()
        self.store, self.left = store, left
        self.ln, self.qkv, self.o = nn.LayerNorm(D), nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.dr = nn.Dropout(0.1)
        if store == "buf_assign":
            self.register_buffer("kc", None); self.register_buffer("vc", None)

    def forward(self, x, cache=None):
        B, C, _ = x.shape
        q, k, v = self.qkv(self.ln(x)).chunk(3, -1)
        if self.store == "buf_assign":
            prev = (self.kc, self.vc) if self.kc is not None else None
        else:  # argument dict, mutated in place
            prev = cache.get("kv")
        if prev is not None:
            K, V = torch.cat([prev[0], k], 1), torch.cat([prev[1], v], 1)
        else:
            K, V = k, v
        if self.store == "buf_assign":
            self.kc, self.vc = K[:, -self.left:], V[:, -self.left:]  # non-detached, into registered buffers
        else:
            cache["kv"] = (K[:, -self.left:], V[:, -self.left:])
            cache["n"] = cache.get("n", 0) + C
        P = K.shape[1] - C
        s = q @ K.transpose(1, 2) / math.sqrt(D)
        s = s.masked_fill(~(torch.arange(P + C)[None] <= torch.arange(C)[:, None] + P), float("-inf"))
        return x + self.dr(self.o(s.softmax(-1) @ V))


class Streamer2(nn.Module):
    def __init__(self, store: str, chunk: int = 4) -> None:
        super().__init__()
        self.store, self.chunk = store, chunk
        self.inp = nn.Linear(FEAT, D)
        self.blocks = nn.ModuleList([StreamBlock2(store) for _ in range(3)])
        self.out = nn.Linear(D, VOCAB)

    def forward(self, b):
        x, y = b
        if self.store == "buf_assign":
            for blk in self.blocks:
                blk.kc = None; blk.vc = None
        caches = [{} for _ in self.blocks]
        h = self.inp(x)
        outs = []
        for c in h.split(self.chunk, 1):
            for blk, cc in zip(self.blocks, caches):
                c = blk(c, cc) if self.store == "argdict" else blk(c)
            outs.append(c)
        logits = self.out(torch.cat(outs, 1))
        out = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        if self.store == "buf_assign":  # do not leave graph tensors in buffers (snapshots clone them)
            for blk in self.blocks:
                blk.kc = None; blk.vc = None
        return out


def stream_partial_batch(s: int):  # T=15: chunks 4,4,4,3
    g = _gen(s)
    return torch.randn(2, 15, FEAT, generator=g), torch.randint(0, VOCAB, (2, 15), generator=g)


# ---- Tacotron with location-attention state held as module attributes across steps
class LocAttentionAttr(M.LocAttention):
    def reset(self, B, L):
        self.w = torch.zeros(B, L); self.wcum = torch.zeros(B, L)

    def forward(self, query, memory, pm, mmask):
        ctx, a = super().forward(query, memory, pm, self.w, self.wcum, mmask)
        self.w = a
        self.wcum = self.wcum + a
        return ctx, a


class DecoderStepAttr(M.DecoderStep):
    def __init__(self) -> None:
        super().__init__()
        self.att = LocAttentionAttr()

    def forward(self, prev, state, memory, pm, mmask):
        h1, c1, h2, c2, ctx = state
        p = F.dropout(F.relu(self.pre2(F.dropout(F.relu(self.pre1(prev)), 0.5, True))), 0.5, True)
        h1, c1 = self.att_rnn(torch.cat([p, ctx], -1), (h1, c1))
        ctx, _ = self.att(h1, memory, pm, mmask)
        h2, c2 = self.dec_rnn(torch.cat([h1, ctx], -1), (h2, c2))
        o = torch.cat([h2, ctx], -1)
        return self.mel(o), self.stop(o).squeeze(-1), (h1, c1, h2, c2, ctx)


class TacotronAttr(M.Tacotron):
    def __init__(self) -> None:
        super().__init__()
        self.step = DecoderStepAttr()

    def forward(self, b):
        txt, tl, mel, stop = b
        B, L = txt.shape
        x = self.emb(txt).transpose(1, 2)
        for c in self.enc:
            x = c(x)
        memory = x.transpose(1, 2)
        mmask = M.lengths_mask(tl, L)
        pm = self.step.att.m(memory)
        self.step.att.reset(B, L)
        z = memory.new_zeros(B, D)
        state = (z, z, z, z, z)
        prev = mel.new_zeros(B, mel.shape[2])
        outs, stops = [], []
        for t in range(mel.shape[1]):
            o, st, state = self.step(prev, state, memory, pm, mmask)
            outs.append(o); stops.append(st)
            prev = mel[:, t]
        return F.mse_loss(torch.stack(outs, 1), mel) + F.binary_cross_entropy_with_logits(torch.stack(stops, 1), stop)


# ---- losses inside regions, lengths changing per step under one shape signature
class CTCHead(nn.Module):
    def __init__(self, lists: bool) -> None:
        super().__init__()
        self.lists = lists
        self.out = nn.Linear(D, VOCAB)

    def forward(self, h, il, y, yl):
        lp = self.out(h).log_softmax(-1).transpose(0, 1)
        if self.lists:
            return F.ctc_loss(lp, y, il, yl, zero_infinity=True)  # il, yl: Python lists, y padded 2-D
        return F.ctc_loss(lp, y, il, yl, zero_infinity=True)


class CTCRegion(nn.Module):
    def __init__(self, lists: bool) -> None:
        super().__init__()
        self.lists = lists
        self.front = nn.Linear(FEAT, D)
        self.blocks = nn.ModuleList([M.ConformerBlock(), M.ConformerBlock()])
        self.head = CTCHead(lists)

    def forward(self, b):
        x, xl, y, yl = b["x"], b["xl"], b["y"], b["yl"]
        mask = M.lengths_mask(xl, x.shape[1])
        h = self.front(x)
        for blk in self.blocks:
            h = blk(h, mask)
        if self.lists:
            return self.head(h, xl.tolist(), y, yl.tolist())
        return self.head(h, xl, y, yl)


def ctc_varlen_batch(s: int):
    g = _gen(s)
    T = 16
    k = s // 10
    xl = torch.tensor([T, T - 1 - k % 3, T - 3 - 2 * (k % 2)])
    yl = torch.tensor([4, 1 + k % 3, 2 + (k % 2)])
    return {"x": torch.randn(3, T, FEAT, generator=g), "xl": xl, "y": torch.randint(1, VOCAB, (3, 4), generator=g), "yl": yl}


class RNNTLoss(nn.Module):
    """Joint + hand-written transducer DP inside one region; lengths as Python lists."""

    def __init__(self) -> None:
        super().__init__()
        self.joint = M.Joint()

    def forward(self, h, g, y, tl, ul):
        return M.transducer_loss(self.joint(h, g), y, tl, ul)


class RNNT2(M.RNNT):
    def __init__(self) -> None:
        super().__init__()
        self.lossmod = RNNTLoss()
        del self.joint

    def forward(self, b):
        x, xl, y, yl = b
        h = self.inp(x)
        for e in self.enc:
            h = e(h)
        g, _ = self.pred(self.emb(F.pad(y, (1, 0))))
        return self.lossmod(h, g, y, xl.tolist(), yl.tolist())


def rnnt_varlen_batch(s: int):
    g = _gen(s)
    return (torch.randn(2, 6, FEAT, generator=g), torch.tensor([6, 3 + (s // 10) % 3]),
            torch.randint(1, VOCAB, (2, 3), generator=g), torch.tensor([3, 1 + (s // 10) % 3]))


# ---- gumbel temperature annealed inside the forward (a side effect on a module attribute)
class W2VHeadAnneal(M.W2VHead):
    def forward(self, feats, ctx, mask):
        self.tau = max(self.tau * 0.8, 0.5)
        return super().forward(feats, ctx, mask)


class Wav2Vec2Anneal(M.Wav2Vec2):
    def __init__(self) -> None:
        super().__init__()
        self.head = W2VHeadAnneal()
