"""Hand-written speech / streaming models for the offrecomp sweep (tiny sizes)."""
from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

D = 16
FEAT = 8
VOCAB = 6  # blank = 0


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def lengths_mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    return torch.arange(T)[None, :] < lengths[:, None]  # True = valid


# ---------------------------------------------------------------- Conformer + CTC
class FF(nn.Module):
    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.ln, self.l1, self.l2, self.dr = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.Dropout(0.1)

    def forward(self, x):
        return self.dr(self.l2(self.dr(F.silu(self.l1(self.ln(x))))))


class RelMHSA(nn.Module):
    """Shaw-style relative attention; the relative table is learned or sinusoidal (+Linear)."""

    def __init__(self, d: int = D, h: int = 2, max_rel: int = 8, sinus: bool = False) -> None:
        super().__init__()
        self.h, self.dh, self.max_rel, self.sinus = h, d // h, max_rel, sinus
        self.ln, self.qkv, self.o, self.dr = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Dropout(0.1)
        if sinus:
            self.pos = nn.Linear(d, self.dh, bias=False)
            self.u = nn.Parameter(torch.zeros(h, self.dh))
        else:
            self.table = nn.Embedding(2 * max_rel + 1, self.dh)

    def rel(self, T: int) -> torch.Tensor:
        idx = torch.arange(T)[None, :] - torch.arange(T)[:, None]
        idx = idx.clamp(-self.max_rel, self.max_rel) + self.max_rel
        if self.sinus:
            pos = torch.arange(2 * self.max_rel + 1, dtype=torch.float32)[:, None]
            div = torch.exp(torch.arange(0, D, 2, dtype=torch.float32) * (-math.log(10000.0) / D))
            pe = torch.zeros(2 * self.max_rel + 1, D)
            pe[:, 0::2] = torch.sin(pos * div)
            pe[:, 1::2] = torch.cos(pos * div)
            return self.pos(pe)[idx]
        return self.table(idx)  # (T, T, dh)

    def forward(self, x, mask):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.ln(x)).view(B, T, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)
        R = self.rel(T)
        ac = (q + (self.u[None, :, None] if self.sinus else 0)) @ k.transpose(-1, -2)
        bd = torch.einsum("bhid,ijd->bhij", q, R)
        s = (ac + bd) / math.sqrt(self.dh)
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
        a = self.dr(s.softmax(-1))
        return self.dr(self.o((a @ v).transpose(1, 2).reshape(B, T, -1)))


class ConvModule(nn.Module):
    def __init__(self, d: int = D, k: int = 5) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.pw1 = nn.Conv1d(d, 2 * d, 1)
        self.dw = nn.Conv1d(d, d, k, padding=k // 2, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.pw2 = nn.Conv1d(d, d, 1)
        self.dr = nn.Dropout(0.1)

    def forward(self, x, mask):
        y = self.ln(x).masked_fill(~mask[..., None], 0.0).transpose(1, 2)
        y = F.glu(self.pw1(y), dim=1)
        y = F.silu(self.bn(self.dw(y)))
        return self.dr(self.pw2(y).transpose(1, 2))


class ConformerBlock(nn.Module):
    def __init__(self, sinus: bool = False, specaug: str | None = None) -> None:
        super().__init__()
        self.ff1, self.att, self.conv, self.ff2 = FF(), RelMHSA(sinus=sinus), ConvModule(), FF()
        self.ln = nn.LayerNorm(D)
        self.specaug = specaug

    def forward(self, x, mask):
        if self.specaug is not None:
            x = specaugment(x, self.specaug)
        x = x + 0.5 * self.ff1(x)
        x = x + self.att(x, mask)
        x = x + self.conv(x, mask)
        x = x + 0.5 * self.ff2(x)
        return self.ln(x)


def specaugment(x: torch.Tensor, rng: str) -> torch.Tensor:
    """One time mask and one frequency mask per utterance, drawn from torch or Python RNG."""
    B, T, Fd = x.shape
    m = torch.ones_like(x)
    for b in range(B):
        if rng == "torch":
            tw = int(torch.randint(1, 4, ()).item())
            t0 = int(torch.randint(0, T - tw, ()).item())
            fw = int(torch.randint(1, 4, ()).item())
            f0 = int(torch.randint(0, Fd - fw, ()).item())
        else:
            tw = random.randint(1, 3)
            t0 = random.randint(0, T - tw - 1)
            fw = random.randint(1, 3)
            f0 = random.randint(0, Fd - fw - 1)
        m[b, t0:t0 + tw, :] = 0
        m[b, :, f0:f0 + fw] = 0
    return x * m


def specaugment_tensor(x: torch.Tensor) -> torch.Tensor:
    """Vectorised masks drawn with torch.rand (no host reads)."""
    B, T, Fd = x.shape
    t0 = (torch.rand(B, 1) * (T - 3)).floor()
    f0 = (torch.rand(B, 1) * (Fd - 3)).floor()
    tt = torch.arange(T)[None]
    ff = torch.arange(Fd)[None]
    tm = (tt >= t0) & (tt < t0 + 3)
    fm = (ff >= f0) & (ff < f0 + 3)
    return x.masked_fill(tm[:, :, None] | fm[:, None, :], 0.0)


class TimeReduce(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2 * D, D)

    def forward(self, x, mask):
        B, T, _ = x.shape
        T2 = T // 2
        x = x[:, : 2 * T2].reshape(B, T2, 2 * D)
        return self.proj(x), mask[:, : 2 * T2 : 2]


class ConformerCTC(nn.Module):
    def __init__(self, lists: bool = False, sinus: bool = False, specaug: str | None = None,
                 input_specaug: bool = False) -> None:
        super().__init__()
        self.lists, self.input_specaug = lists, input_specaug
        self.front = nn.Linear(FEAT, D)
        self.blocks = nn.ModuleList([ConformerBlock(sinus, specaug), ConformerBlock(sinus, specaug),
                                     TimeReduce(), ConformerBlock(sinus, specaug)])
        self.out = nn.Linear(D, VOCAB)

    def forward(self, b):
        x, xl, y, yl = b["x"], b["xl"], b["y"], b["yl"]
        if self.input_specaug:
            x = specaugment_tensor(x)
        mask = lengths_mask(xl, x.shape[1])
        h = self.front(x)
        for blk in self.blocks:
            if isinstance(blk, TimeReduce):
                h, mask = blk(h, mask)
            else:
                h = blk(h, mask)
        lp = self.out(h).log_softmax(-1).transpose(0, 1)  # (T, B, C)
        il = mask.sum(1)
        if self.lists:
            return F.ctc_loss(lp, torch.cat([y[i, : yl[i]] for i in range(len(yl))]), il.tolist(), yl.tolist(),
                              zero_infinity=True)
        return F.ctc_loss(lp, y, il, yl, zero_infinity=True)


def ctc_batch(varT: bool = False, B: int = 3):
    def f(s: int):
        g = _gen(s)
        T = 24 + (4 * (s % 3) if varT else 0)
        xl = torch.tensor([T, T - 3, T - 7][:B])
        yl = torch.tensor([4, 3, 2][:B])
        return {"x": torch.randn(B, T, FEAT, generator=g), "xl": xl,
                "y": torch.randint(1, VOCAB, (B, 4), generator=g), "yl": yl}
    return f


# ---------------------------------------------------------------- streaming chunked attention
class StreamBlock(nn.Module):
    """Causal-chunk attention over [left-context cache, chunk]; cache as attribute or buffer."""

    def __init__(self, store: str, left: int = 4) -> None:
        super().__init__()
        self.store, self.left = store, left
        self.ln, self.qkv, self.o = nn.LayerNorm(D), nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.ff = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.dr = nn.Dropout(0.1)
        if store in ("buffer", "buffer_persist"):
            self.register_buffer("kc", torch.zeros(2, left, D))
            self.register_buffer("vc", torch.zeros(2, left, D))
            self.register_buffer("n", torch.zeros((), dtype=torch.long))
        self.reset()

    def reset(self) -> None:
        if self.store in ("buffer", "buffer_persist"):
            if self.store == "buffer":
                self.kc.zero_(); self.vc.zero_(); self.n.zero_()
        else:
            self.cache = None

    def forward(self, x):
        B, C, _ = x.shape
        q, k, v = self.qkv(self.ln(x)).chunk(3, -1)
        if self.store in ("attr", "attr_detach"):
            if self.cache is not None:
                pk, pv = self.cache
                K, V = torch.cat([pk, k], 1), torch.cat([pv, v], 1)
            else:
                K, V = k, v
            keep = (K[:, -self.left:], V[:, -self.left:])
            self.cache = tuple(t.detach() for t in keep) if self.store == "attr_detach" else keep
            P = K.shape[1] - C
        else:  # fixed-size buffer, written in place, valid count n
            K, V = torch.cat([self.kc, k], 1), torch.cat([self.vc, v], 1)
            P = self.left
            valid = torch.arange(P + C)[None, :] >= (P - self.n.clamp(max=P))
            with torch.no_grad():
                self.kc.copy_(K[:, -self.left:].detach())
                self.vc.copy_(V[:, -self.left:].detach())
                self.n.add_(C)
        s = q @ K.transpose(1, 2) / math.sqrt(D)
        causal = torch.arange(P + C)[None, :] <= (torch.arange(C)[:, None] + P)
        m = causal
        if self.store.startswith("buffer"):
            m = causal & valid
        s = s.masked_fill(~m, float("-inf"))
        x = x + self.dr(self.o(s.softmax(-1) @ V))
        return x + self.dr(self.ff(x))


class Streamer(nn.Module):
    def __init__(self, store: str, chunk: int = 4) -> None:
        super().__init__()
        self.chunk = chunk
        self.inp = nn.Linear(FEAT, D)
        self.blocks = nn.ModuleList([StreamBlock(store) for _ in range(3)])
        self.out = nn.Linear(D, VOCAB)

    def forward(self, b):
        x, y = b
        for blk in self.blocks:
            blk.reset()
        h = self.inp(x)
        outs = []
        for c in h.split(self.chunk, 1):
            for blk in self.blocks:
                c = blk(c)
            outs.append(c)
        logits = self.out(torch.cat(outs, 1))
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def stream_batch(s: int):
    g = _gen(s)
    return torch.randn(2, 16, FEAT, generator=g), torch.randint(0, VOCAB, (2, 16), generator=g)


# ---------------------------------------------------------------- wav2vec2 gumbel quantizer
class ConvFeat(nn.Module):
    def __init__(self, cin: int, stride: int) -> None:
        super().__init__()
        self.c = nn.Conv1d(cin, D, 3, stride=stride, padding=1)
        self.n = nn.GroupNorm(1, D)

    def forward(self, x):
        return F.gelu(self.n(self.c(x)))


class TfBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(D, 2, dropout=0.1, batch_first=True)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * D, D))

    def forward(self, x, kpm=None):
        h = self.ln1(x)
        x = x + self.att(h, h, h, key_padding_mask=kpm, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class W2VHead(nn.Module):
    """Gumbel quantizer (G groups x V entries, hard) + contrastive loss with K sampled negatives."""

    def __init__(self, G: int = 2, V: int = 8, K: int = 4) -> None:
        super().__init__()
        self.G, self.V, self.K = G, V, K
        self.logits = nn.Linear(D, G * V)
        self.codebook = nn.Parameter(torch.randn(G * V, D // G))
        self.proj_q, self.proj_c = nn.Linear(D, D), nn.Linear(D, D)
        self.tau = 2.0  # annealed by the loop

    def forward(self, feats, ctx, mask):
        B, T, _ = feats.shape
        lg = self.logits(feats).view(B * T * self.G, self.V)
        oh = F.gumbel_softmax(lg.float(), tau=self.tau, hard=True).view(B * T, self.G, self.V)
        q = torch.einsum("ngv,gvd->ngd", oh, self.codebook.view(self.G, self.V, -1)).reshape(B, T, D)
        q = self.proj_q(q)
        c = self.proj_c(ctx)
        neg = torch.randint(0, T - 1, (B, T, self.K))
        neg = neg + (neg >= torch.arange(T)[None, :, None]).long()  # never the positive
        negs = q[torch.arange(B)[:, None, None], neg]  # (B,T,K,D)
        cands = torch.cat([q[:, :, None], negs], 2)
        sim = F.cosine_similarity(c[:, :, None], cands, dim=-1) / 0.1
        ce = F.cross_entropy(sim[mask], torch.zeros(int(mask.sum()), dtype=torch.long))
        avg = lg.view(B * T, self.G, self.V).softmax(-1).mean(0)
        div = (self.G * self.V - torch.exp(-(avg * avg.clamp_min(1e-7).log()).sum(-1)).sum()) / (self.G * self.V)
        return ce + 0.1 * div


class Wav2Vec2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.feat = nn.ModuleList([ConvFeat(1, 2), ConvFeat(D, 2)])
        self.mask_emb = nn.Parameter(torch.randn(D))
        self.blocks = nn.ModuleList([TfBlock() for _ in range(2)])
        self.head = W2VHead()

    def forward(self, wav):
        x = wav[:, None]
        for c in self.feat:
            x = c(x)
        feats = x.transpose(1, 2)
        B, T, _ = feats.shape
        mask = torch.rand(B, T) < 0.4
        mask[:, 0] = True
        h = torch.where(mask[..., None], self.mask_emb.expand_as(feats), feats)
        for blk in self.blocks:
            h = blk(h)
        return self.head(feats, h, mask)


# ---------------------------------------------------------------- HuBERT masked prediction (numpy masks)
class HubertMaskBlock(nn.Module):
    """A transformer block; when `draw`, computes span masks with numpy's RNG and applies a mask embedding."""

    def __init__(self, draw: bool) -> None:
        super().__init__()
        self.draw = draw
        self.tf = TfBlock()
        if draw:
            self.mask_emb = nn.Parameter(torch.randn(D))

    def forward(self, x, mask):
        if self.draw:
            B, T, _ = x.shape
            m = np.zeros((B, T), dtype=bool)
            for b in range(B):
                starts = np.random.choice(T - 3, size=2, replace=False)
                for s0 in starts:
                    m[b, s0 : s0 + 3] = True
            mask = torch.from_numpy(m)
            x = torch.where(mask[..., None], self.mask_emb.to(x.dtype).expand_as(x), x)
        return self.tf(x), mask


class Hubert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEAT, D)
        self.blocks = nn.ModuleList([HubertMaskBlock(i == 0) for i in range(3)])
        self.out = nn.Linear(D, 10)

    def forward(self, b):
        x, y = b
        h = self.inp(x)
        mask = torch.zeros(x.shape[:2], dtype=torch.bool)
        for blk in self.blocks:
            h, mask = blk(h, mask)
        return F.cross_entropy(self.out(h)[mask], y[mask])


def hubert_batch(s: int):
    g = _gen(s)
    return torch.randn(2, 20, FEAT, generator=g), torch.randint(0, 10, (2, 20), generator=g)


# ---------------------------------------------------------------- Tacotron decoder
class EncConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.bn = nn.Conv1d(D, D, 5, padding=2), nn.BatchNorm1d(D)

    def forward(self, x):
        return F.dropout(F.relu(self.bn(self.c(x))), 0.1, self.training)


class LocAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.m = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        self.loc_conv = nn.Conv1d(2, 4, 5, padding=2, bias=False)
        self.loc = nn.Linear(4, D, bias=False)
        self.v = nn.Linear(D, 1)

    def forward(self, query, memory, pm, w, wcum, mmask):
        f = self.loc(self.loc_conv(torch.stack([w, wcum], 1)).transpose(1, 2))
        e = self.v(torch.tanh(self.q(query)[:, None] + pm + f)).squeeze(-1)
        e = e.masked_fill(~mmask, float("-inf"))
        a = e.softmax(-1)
        return (a[:, :, None] * memory).sum(1), a


class DecoderStep(nn.Module):
    def __init__(self, n_mel: int = 6) -> None:
        super().__init__()
        self.pre1, self.pre2 = nn.Linear(n_mel, D), nn.Linear(D, D)
        self.att_rnn = nn.LSTMCell(2 * D, D)
        self.att = LocAttention()
        self.dec_rnn = nn.LSTMCell(2 * D, D)
        self.mel, self.stop = nn.Linear(2 * D, n_mel), nn.Linear(2 * D, 1)

    def forward(self, prev, state, memory, pm, mmask):
        h1, c1, h2, c2, ctx, w, wcum = state
        p = F.dropout(F.relu(self.pre2(F.dropout(F.relu(self.pre1(prev)), 0.5, True))), 0.5, True)  # always-on prenet dropout
        h1, c1 = self.att_rnn(torch.cat([p, ctx], -1), (h1, c1))
        ctx, w = self.att(h1, memory, pm, w, wcum, mmask)
        wcum = wcum + w
        h2, c2 = self.dec_rnn(torch.cat([h1, ctx], -1), (h2, c2))
        o = torch.cat([h2, ctx], -1)
        return self.mel(o), self.stop(o).squeeze(-1), (h1, c1, h2, c2, ctx, w, wcum)


class Tacotron(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, D)
        self.enc = nn.ModuleList([EncConv() for _ in range(2)])
        self.step = DecoderStep()

    def forward(self, b):
        txt, tl, mel, stop = b
        B, L = txt.shape
        x = self.emb(txt).transpose(1, 2)
        for c in self.enc:
            x = c(x)
        memory = x.transpose(1, 2)
        mmask = lengths_mask(tl, L)
        pm = self.step.att.m(memory)
        z = memory.new_zeros(B, D)
        state = (z, z, z, z, z, memory.new_zeros(B, L), memory.new_zeros(B, L))
        prev = mel.new_zeros(B, mel.shape[2])
        outs, stops = [], []
        for t in range(mel.shape[1]):
            o, st, state = self.step(prev, state, memory, pm, mmask)
            outs.append(o); stops.append(st)
            prev = mel[:, t]  # teacher forcing
        out = torch.stack(outs, 1)
        return F.mse_loss(out, mel) + F.binary_cross_entropy_with_logits(torch.stack(stops, 1), stop)


def taco_batch(s: int):
    g = _gen(s)
    B, L, T = 2, 7, 8
    stop = torch.zeros(B, T); stop[0, -1] = 1; stop[1, -3:] = 1
    return (torch.randint(0, 12, (B, L), generator=g), torch.tensor([7, 5]), torch.randn(B, T, 6, generator=g), stop)


# ---------------------------------------------------------------- TDNN x-vector
class TDNN(nn.Module):
    def __init__(self, cin: int, dil: int) -> None:
        super().__init__()
        self.c, self.bn = nn.Conv1d(cin, D, 3, dilation=dil, padding=dil), nn.BatchNorm1d(D)

    def forward(self, x):
        return self.bn(F.relu(self.c(x)))


class XVector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tdnn = nn.ModuleList([TDNN(FEAT, 1), TDNN(D, 2), TDNN(D, 3)])
        self.seg = nn.Sequential(nn.Linear(2 * D, D), nn.ReLU(), nn.BatchNorm1d(D))
        self.cls = nn.Linear(D, 5)

    def forward(self, b):
        x, xl, spk = b
        h = x.transpose(1, 2)
        for l in self.tdnn:
            h = l(h)
        m = lengths_mask(xl, h.shape[2]).to(h.dtype)[:, None]  # (B,1,T)
        n = m.sum(-1)
        mean = (h * m).sum(-1) / n
        var = (((h - mean[..., None]) ** 2) * m).sum(-1) / n
        std = torch.sqrt(var.clamp_min(1e-5))
        return F.cross_entropy(self.cls(self.seg(torch.cat([mean, std], -1))), spk)


def xvec_batch(varT: bool = False):
    def f(s: int):
        g = _gen(s)
        T = 20 + (6 * (s % 3) if varT else 0)
        xl = torch.randint(T // 2, T + 1, (4,), generator=g)
        return torch.randn(4, T, FEAT, generator=g), xl, torch.randint(0, 5, (4,), generator=g)
    return f


# ---------------------------------------------------------------- RNN-T
class EncBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.c, self.l = nn.LayerNorm(D), nn.Conv1d(D, D, 3, padding=1), nn.Linear(D, D)

    def forward(self, x):
        y = F.gelu(self.c(self.ln(x).transpose(1, 2))).transpose(1, 2)
        return x + F.dropout(self.l(y), 0.1, self.training)


class Joint(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.e, self.p, self.o = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, VOCAB)

    def forward(self, enc, pred):
        return self.o(torch.tanh(self.e(enc)[:, :, None] + self.p(pred)[:, None])).log_softmax(-1)


def transducer_loss(lp: torch.Tensor, y: torch.Tensor, tl: list[int], ul: list[int]) -> torch.Tensor:
    """lp (B,T,U+1,V); alpha DP in Python loops."""
    total = []
    for b in range(lp.shape[0]):
        T, U = tl[b], ul[b]
        alpha = [[None] * (U + 1) for _ in range(T)]
        for t in range(T):
            for u in range(U + 1):
                if t == 0 and u == 0:
                    alpha[t][u] = lp.new_zeros(())
                    continue
                terms = []
                if t > 0:
                    terms.append(alpha[t - 1][u] + lp[b, t - 1, u, 0])
                if u > 0:
                    terms.append(alpha[t][u - 1] + lp[b, t, u - 1, y[b, u - 1]])
                alpha[t][u] = torch.logsumexp(torch.stack(terms), 0)
        total.append(-(alpha[T - 1][U] + lp[b, T - 1, U, 0]))
    return torch.stack(total).mean()


class RNNT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEAT, D)
        self.enc = nn.ModuleList([EncBlock() for _ in range(2)])
        self.emb = nn.Embedding(VOCAB, D)
        self.pred = nn.LSTM(D, D, batch_first=True)
        self.joint = Joint()

    def forward(self, b):
        x, xl, y, yl = b
        h = self.inp(x)
        for e in self.enc:
            h = e(h)
        yin = F.pad(y, (1, 0))  # blank first
        g, _ = self.pred(self.emb(yin))
        return transducer_loss(self.joint(h, g), y, xl.tolist(), yl.tolist())


def rnnt_batch(s: int):
    g = _gen(s)
    return (torch.randn(2, 6, FEAT, generator=g), torch.tensor([6, 4]), torch.randint(1, VOCAB, (2, 3), generator=g),
            torch.tensor([3, 2]))
