"""MoE sweep: hand-written transformer blocks with MoE feed-forwards under every zoo variant,
bitwise vs plain.  usage: python sweep_w.py [NAME,...|all] [VARIANT,...]"""
from __future__ import annotations

import copy
from pathlib import Path
import logging
import math
import random
import sys
import time
import traceback
import warnings

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import ZOO_VARIANTS, assert_bitwise, check_variant, variant_runtime

D, T, B, V = 16, 8, 2, 32


class Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.msgs = []

    def emit(self, r):
        self.msgs.append(f"{r.levelname}: {r.getMessage()}")


CATCH = Catch()
logging.getLogger("offrecomp").addHandler(CATCH)


def _gen(s):
    return torch.Generator().manual_seed(1000 + s)


# ---------------- building blocks ----------------
class Attn(nn.Module):
    def __init__(self, d=D, nh=2):
        super().__init__()
        self.nh = nh
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.nh, d // self.nh).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Expert(nn.Module):
    def __init__(self, d=D, h=2 * D):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def balance_loss(probs, idx, E):
    frac = F.one_hot(idx, E).float().mean(0)
    return E * (frac * probs.mean(0)).sum()


def z_loss(logits):
    return torch.logsumexp(logits, -1).square().mean()


class TokenChoice(nn.Module):
    """top-k token choice with capacity factor and token dropping (GShard slot-major priority);
    experts in a ModuleList on index_select'ed tokens, index_add_ back."""

    def __init__(self, E=4, k=1, cf=1.0, skip_empty=True, noisy=False, jitter=0.0, fp32_router=False,
                 bpr=False, cap_item=False, bias_router=False):
        super().__init__()
        self.E, self.k, self.cf = E, k, cf
        self.skip_empty, self.noisy, self.jitter, self.fp32_router = skip_empty, noisy, jitter, fp32_router
        self.bpr, self.cap_item = bpr, cap_item
        self.router = nn.Linear(D, E, bias=bias_router)
        if bias_router:  # make expert 0 starve at most steps, sometimes not
            with torch.no_grad():
                self.router.bias.copy_(torch.tensor([-1.0] + [0.0] * (E - 1)))
        if noisy:
            self.w_noise = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(E))
        self.aux_loss = None

    def forward(self, x):
        n = x.shape[0]
        xr = x
        if self.jitter and self.training:
            xr = x * torch.empty_like(x).uniform_(1 - self.jitter, 1 + self.jitter)
        if self.fp32_router:
            with torch.autocast("cpu", enabled=False):
                logits = F.linear(xr.float(), self.router.weight.float())
        else:
            logits = self.router(xr)
        if self.noisy and self.training:
            logits = logits + torch.randn_like(logits) * F.softplus(self.w_noise(xr)).float()
        probs = logits.softmax(-1)
        w, idx = probs.topk(self.k, -1)
        if self.k > 1:
            w = w / w.sum(-1, keepdim=True)
        flat = idx.t().reshape(-1)  # slot-major
        if self.bpr:  # batch prioritized routing: order by gate value
            order = w.t().reshape(-1).argsort(descending=True, stable=True)
            inv = torch.empty_like(order)
            inv[order] = torch.arange(order.numel())
            oh = F.one_hot(flat[order], self.E)
            pos = ((oh.cumsum(0) * oh).sum(-1) - 1)[inv]
        else:
            oh = F.one_hot(flat, self.E)
            pos = (oh.cumsum(0) * oh).sum(-1) - 1
        if self.cap_item:
            counts = torch.bincount(flat, minlength=self.E)
            cap = int(math.ceil(counts.float().mean().item() * self.cf))
        else:
            cap = int(math.ceil(self.cf * n * self.k / self.E))
        keep = pos < cap
        out = torch.zeros_like(x)
        for e, ex in enumerate(self.experts):
            sel = ((flat == e) & keep).nonzero(as_tuple=True)[0]
            if self.skip_empty and sel.numel() == 0:
                continue
            tok, slot = sel % n, sel // n
            y = ex(x.index_select(0, tok)) * w[tok, slot].unsqueeze(-1).to(x.dtype)
            out.index_add_(0, tok, y.to(out.dtype))
        self.aux_loss = 0.01 * balance_loss(probs, idx[:, 0], self.E) + 0.001 * z_loss(logits)
        return out


class ExpertChoice(nn.Module):
    def __init__(self, E=4, cf=1.0):
        super().__init__()
        self.E, self.cf = E, cf
        self.router = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(E))
        self.aux_loss = None

    def forward(self, x):
        n = x.shape[0]
        logits = self.router(x)
        s = logits.softmax(-1)
        c = max(1, int(n * self.cf / self.E))
        g, tok = s.t().topk(c, -1)  # E, c
        out = torch.zeros_like(x)
        for e, ex in enumerate(self.experts):
            out.index_add_(0, tok[e], ex(x.index_select(0, tok[e])) * g[e].unsqueeze(-1))
        self.aux_loss = 0.001 * z_loss(logits)
        return out


class SharedRouted(nn.Module):
    """DeepSeek-MoE: shared experts + fine-grained routed experts (top-3 of 8, no renorm)."""

    def __init__(self, E=8, k=3, shared=1):
        super().__init__()
        self.E, self.k = E, k
        self.router = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(Expert(D, D // 2) for _ in range(E))
        self.shared = nn.ModuleList(Expert(D, D) for _ in range(shared))
        self.aux_loss = None

    def forward(self, x):
        logits = self.router(x)
        probs = logits.softmax(-1)
        w, idx = probs.topk(self.k, -1)
        out = sum(s(x) for s in self.shared)
        for e, ex in enumerate(self.experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            out = out.index_add(0, tok, ex(x[tok]) * w[tok, slot, None])  # empty allowed
        # device-limited-ish balance over all k choices
        frac = F.one_hot(idx, self.E).float().sum(1).mean(0) / self.k
        self.aux_loss = 0.01 * self.E * (frac * probs.mean(0)).sum()
        return out


class BatchedBMM(nn.Module):
    """experts as [E,d,h] params; argsort by expert id, gather, bincount, position via cumsum;
    padded [E, C, d] buffer, bmm. split=True: counts.tolist() + torch.split instead."""

    def __init__(self, E=4, k=2, h=2 * D, split=False):
        super().__init__()
        self.E, self.k, self.split = E, k, split
        self.router = nn.Linear(D, E, bias=False)
        self.w1 = nn.Parameter(torch.randn(E, D, h) / math.sqrt(D))
        self.w2 = nn.Parameter(torch.randn(E, h, D) / math.sqrt(h))
        self.aux_loss = None

    def forward(self, x):
        n = x.shape[0]
        logits = self.router(x)
        probs = logits.softmax(-1)
        w, idx = probs.topk(self.k, -1)
        w = w / w.sum(-1, keepdim=True)
        fe = idx.reshape(-1)
        fw = w.reshape(-1)
        ftok = torch.arange(n).repeat_interleave(self.k)
        order = fe.argsort(stable=True)
        e_s, tok_s, w_s = fe[order], ftok[order], fw.gather(0, order)
        xs = x.index_select(0, tok_s)
        counts = torch.bincount(fe, minlength=self.E)
        if self.split:
            parts = torch.split(xs, counts.tolist())
            ys = [F.gelu(p @ self.w1[e]) @ self.w2[e] for e, p in enumerate(parts)]
            y = torch.cat(ys)
        else:
            starts = counts.cumsum(0) - counts
            pos = torch.arange(xs.shape[0]) - starts[e_s]
            buf = x.new_zeros(self.E, n * self.k, D)
            buf = buf.index_put((e_s, pos), xs)
            hb = torch.bmm(F.gelu(torch.bmm(buf, self.w1)), self.w2)
            y = hb[e_s, pos]
        out = torch.zeros_like(x).index_add_(0, tok_s, y * w_s.unsqueeze(-1))
        self.aux_loss = 0.01 * balance_loss(probs, idx[:, 0], self.E)
        return out


class DenseFF(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = Expert(D, 4 * D)
        self.aux_loss = None

    def forward(self, x):
        self.aux_loss = x.new_zeros(())
        return self.ff(x)


class Block(nn.Module):
    """pre-norm attention + FF; ret: return (x, aux) instead of x."""

    def __init__(self, ff, ret=False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn, self.ff, self.ret = Attn(), ff, ret

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        b, t, d = x.shape
        x = x + self.ff(self.ln2(x).reshape(-1, d)).view(b, t, d)
        return (x, self.ff.aux_loss) if self.ret else x


class MoDLayer(nn.Module):
    """Mixture-of-Depths: per sequence, top-c tokens by router score go through the block,
    others skip; output scaled by sigmoid(score)."""

    def __init__(self, frac=0.5):
        super().__init__()
        self.router = nn.Linear(D, 1)
        self.block = Block(Expert())
        self.frac = frac

    def forward(self, x):
        b, t, d = x.shape
        r = self.router(x).squeeze(-1)
        c = max(1, int(t * self.frac))
        rw, ti = r.topk(c, -1)
        ti, perm = ti.sort(-1)  # keep causal order
        rw = rw.gather(-1, perm)
        sel = x.gather(1, ti.unsqueeze(-1).expand(-1, -1, d))
        y = (self.block(sel) - sel) * torch.sigmoid(rw).unsqueeze(-1)
        return x.scatter_add(1, ti.unsqueeze(-1).expand(-1, -1, d), y)


class LM(nn.Module):
    """aux: 'ret' (blocks return aux, summed), 'attr' (model sums ff.aux_loss after the loop),
    'loop' (model returns main loss only; the loop reads attributes), 'logits' (returns router logits)."""

    def __init__(self, ffs, aux="attr", blocks=None):
        super().__init__()
        self.aux = aux
        self.emb = nn.Embedding(V, D)
        self.blocks = blocks if blocks is not None else nn.ModuleList(Block(f, ret=aux == "ret") for f in ffs)
        self.lnf = nn.LayerNorm(D)
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        x = self.emb(ids)
        tot = x.new_zeros(())
        for b in self.blocks:
            x = b(x)
            if isinstance(x, tuple):
                x, a = x
                tot = tot + a
        loss = F.cross_entropy(self.head(self.lnf(x)).flatten(0, 1)[:-1], ids.flatten()[1:])
        if self.aux == "attr":
            tot = tot + sum(b.ff.aux_loss for b in self.blocks if hasattr(b, "ff"))
        return loss + tot if self.aux in ("attr", "ret") else loss


class BF16(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, *a):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.m(*a)


def ids(s, t=T):
    return torch.randint(0, V, (B, t), generator=_gen(s))


def ids_varying(s):
    return ids(s, 6 + 2 * (s % 3))


N3 = 3
MODELS = {
    "top1_cap": lambda: LM([TokenChoice(k=1, cf=1.0) for _ in range(N3)]),
    "top2_cap": lambda: LM([TokenChoice(k=2, cf=1.25) for _ in range(N3)]),
    "top2_cap_ret": lambda: LM([TokenChoice(k=2, cf=1.0) for _ in range(N3)], aux="ret"),
    "top2_bpr": lambda: LM([TokenChoice(k=2, cf=0.75, bpr=True) for _ in range(N3)]),
    "expert_choice": lambda: LM([ExpertChoice() for _ in range(N3)]),
    "noisy_topk": lambda: LM([TokenChoice(k=2, cf=1.0, noisy=True) for _ in range(N3)]),
    "jitter": lambda: LM([TokenChoice(k=1, cf=1.25, jitter=0.05) for _ in range(N3)]),
    "fp32_router_bf16": lambda: BF16(LM([TokenChoice(k=2, cf=1.0, fp32_router=True) for _ in range(N3)])),
    "shared_routed": lambda: LM([SharedRouted() for _ in range(N3)]),
    "dense_alt": lambda: LM([DenseFF() if i % 2 == 0 else TokenChoice(k=2, cf=1.0) for i in range(4)]),
    "bmm_pad": lambda: LM([BatchedBMM() for _ in range(N3)]),
    "bmm_split_tolist": lambda: LM([BatchedBMM(split=True) for _ in range(N3)]),
    "empty_noskip": lambda: LM([TokenChoice(k=1, cf=2.0, skip_empty=False, bias_router=True) for _ in range(N3)]),
    "empty_skip": lambda: LM([TokenChoice(k=1, cf=2.0, skip_empty=True, bias_router=True) for _ in range(N3)]),
    "cap_item": lambda: LM([TokenChoice(k=2, cf=1.0, cap_item=True) for _ in range(N3)]),
    "mod": lambda: LM(None, aux="none", blocks=nn.ModuleList(MoDLayer() for _ in range(N3))),
    "sampled_pyrandom": lambda: LM([Sampled(k=1) for _ in range(N3)]),
    "top2_varylen": lambda: LM([TokenChoice(k=2, cf=1.0) for _ in range(N3)]),
}
BATCH = {"top2_varylen": ids_varying}
# MoD has fixed shapes; everything else routes data-dependently (as test_model_zoo's moe_top2)
STABLE = {"mod"}


# ---------------- custom loops ----------------
def moe_mods(m):
    return [x for x in m.modules() if hasattr(x, "aux_loss") and isinstance(x, (TokenChoice, ExpertChoice, SharedRouted, BatchedBMM))]


def mixtral_lb(gate_logits, E, k):
    logits = torch.cat(gate_logits, 0)
    p = logits.softmax(-1)
    _, sel = p.topk(k, -1)
    mask = F.one_hot(sel, E).float()
    tokens_per_expert = mask.mean(0)  # k, E
    router_prob = p.mean(0)
    return E * (tokens_per_expert * router_prob.unsqueeze(0)).sum()


class BlockLogits(Block):
    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        b, t, d = x.shape
        h = self.ln2(x).reshape(-1, d)
        logits = self.ff.router(h)
        x = x + self.ff(h).view(b, t, d)
        return x, logits


class LMLogits2(LM):
    def __init__(self, n=N3):
        super().__init__([], aux="loop", blocks=nn.ModuleList(BlockLogits(TokenChoice(k=2, cf=1.0)) for _ in range(n)))

    def forward(self, ids):
        x = self.emb(ids)
        lg = []
        for b in self.blocks:
            x, l = b(x)
            lg.append(l)
        loss = F.cross_entropy(self.head(self.lnf(x)).flatten(0, 1)[:-1], ids.flatten()[1:])
        return loss, lg


def grads(m):
    return {f"g.{n}": p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


def step_attr_loop(m, opt, s):
    """Switch style: the loop sums aux_loss attributes after the forward; also reads them
    after backward (logging) and checks they are the same objects."""
    loss = m(ids(s))
    auxes = [x.aux_loss for x in moe_mods(m)]
    total = loss + sum(auxes)
    total.backward()
    after = [x.aux_loss for x in moe_mods(m)]
    same = all(a is b for a, b in zip(auxes, after))
    snap = grads(m) | {"loss": total.detach().clone(), "aux_after": torch.stack([a.detach() for a in after]),
                       "aux_same_obj": torch.tensor(same)}
    opt.step(); opt.zero_grad(set_to_none=True)
    return snap


def step_logits_loop(m, opt, s):
    loss, lg = m(ids(s))
    total = loss + 0.01 * mixtral_lb(lg, 4, 2) + 0.001 * sum(z_loss(l) for l in lg)
    total.backward()
    snap = grads(m) | {"loss": total.detach().clone()}
    opt.step(); opt.zero_grad(set_to_none=True)
    return snap


def step_accum_attr(m, opt, s):
    """two micro-batches of different lengths, aux attributes summed by the loop each."""
    tot = 0
    for j, t in enumerate((T, T // 2)):
        torch.manual_seed(100 * s + j)
        loss = m(ids(10 * s + j, t))
        l = (loss + sum(x.aux_loss for x in moe_mods(m))) / 2
        l.backward()
        tot = tot + l.detach()
    snap = grads(m) | {"loss": tot.clone()}
    opt.step(); opt.zero_grad(set_to_none=True)
    return snap


def step_attr_bwd_twice_read(m, opt, s):
    """aux collected from attributes, backward of aux separately first (retain_graph) then main."""
    loss = m(ids(s))
    aux = sum(x.aux_loss for x in moe_mods(m))
    aux.backward(retain_graph=True)
    loss.backward()
    snap = grads(m) | {"loss": (loss + aux).detach().clone()}
    opt.step(); opt.zero_grad(set_to_none=True)
    return snap




class BlockLogits1(Block):
    """the ff's own router logits (one router call) returned as an output"""
    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        b, t, d = x.shape
        x = x + self.ff(self.ln2(x).reshape(-1, d)).view(b, t, d)
        return x, self.ff.last_logits


class TCLogits(TokenChoice):
    def forward(self, x):
        self.last_logits = None
        out = super().forward(x)
        return out


class LMLogits1(LMLogits2):
    def __init__(self, n=N3):
        LM.__init__(self, [], aux="loop", blocks=nn.ModuleList(BlockLogits1(TCLogitsKeep(k=2, cf=1.0)) for _ in range(n)))


class TCLogitsKeep(TokenChoice):
    def forward(self, x):
        logits = self.router(x)
        self.last_logits = logits
        probs = logits.softmax(-1)
        w, idx = probs.topk(self.k, -1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, ex in enumerate(self.experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            out.index_add_(0, tok, ex(x.index_select(0, tok)) * w[tok, slot].unsqueeze(-1))
        self.aux_loss = 0.001 * z_loss(logits)
        return out


class Sampled(TokenChoice):
    """stochastic routing: expert sampled with torch.multinomial in training, plus expert
    dropout decided by Python's random (drawn from the first call on)."""
    def forward(self, x):
        logits = self.router(x)
        probs = logits.softmax(-1)
        idx = torch.multinomial(probs, 1).squeeze(-1) if self.training else probs.argmax(-1)
        drop = random.random() < 0.3 if self.training else False
        out = torch.zeros_like(x)
        for e, ex in enumerate(self.experts):
            tok = (idx == e).nonzero(as_tuple=True)[0]
            if drop and e == 0:
                continue
            out.index_add_(0, tok, ex(x.index_select(0, tok)) * probs[tok, e].unsqueeze(-1))
        self.aux_loss = 0.01 * balance_loss(probs, idx, self.E)
        self.n_dropped = torch.tensor(int(drop))
        return out


LOOPS = {
    "L_attr_loop": (lambda: LM([TokenChoice(k=2, cf=1.0) for _ in range(N3)], aux="loop"), step_attr_loop),
    "L_attr_loop_noisy_bf16": (lambda: BF16(LM([TokenChoice(k=2, cf=1.0, noisy=True, fp32_router=True) for _ in range(N3)], aux="loop")), step_attr_loop),
    "L_mixtral_logits": (LMLogits2, step_logits_loop),
    "L_accum_attr": (lambda: LM([TokenChoice(k=1, cf=1.0) for _ in range(N3)], aux="loop"), step_accum_attr),
    "L_logits_one_router": (LMLogits1, step_logits_loop),
    "L_aux_bwd_first": (lambda: LM([ExpertChoice() for _ in range(N3)], aux="loop"), step_attr_bwd_twice_read),
}


def seed(s):
    torch.manual_seed(s); random.seed(s); np.random.seed(s)


def run_loop(m, step, steps, rt=None):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    out = []
    if rt is not None:
        rt.__enter__()
    try:
        for s in range(steps):
            seed(s)
            out.append(step(m, opt, s))
    finally:
        if rt is not None:
            rt.__exit__(None, None, None)
    return out


def check_loop(make, step, variant, steps=4):
    torch.manual_seed(0)
    model = make().train()
    ref = run_loop(copy.deepcopy(model), step, steps)
    ref2 = run_loop(copy.deepcopy(model), step, steps)
    assert_bitwise(ref, ref2)  # plain determinism
    budget = None
    if variant in ("auto_tight", "auto_serve"):
        probe = copy.deepcopy(model)
        keep = variant_runtime(probe, "keep")
        run_loop(probe, step, 1, keep)
        budget = max(r.peak_activation_bytes for r in keep.report().steps) // 2
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, budget)
    assert_bitwise(ref, run_loop(m, step, steps, rt))
    recs = rt.report().steps
    if variant == "recompute":
        assert any(r.replays > 0 for r in recs), "recompute replayed nothing"
    if variant == "offload":
        assert any(r.offloaded_bytes > 0 for r in recs), "offload offloaded nothing"
    if variant.startswith("auto"):
        assert recs[0].phase == "measure", [r.phase for r in recs]
    if variant in ("auto_tight", "auto_serve"):
        assert any(r.recomputed_bytes > 0 for r in recs[len(recs) // 2:]), "a tight budget dropped nothing"
    return rt


def main():
    argv = [a for a in sys.argv[1:] if a != "-v"]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ZOO_VARIANTS
    counts = {v: [0, 0] for v in variants}
    mem = {}
    for name in list(MODELS) + list(LOOPS):
        if only and name not in only:
            continue
        for v in variants:
            CATCH.msgs.clear()
            t0 = time.time()
            with warnings.catch_warnings(record=True) as ws:
                warnings.simplefilter("always")
                try:
                    if name in MODELS:
                        torch.manual_seed(0)
                        model = MODELS[name]().train()
                        rt, _ = check_variant(model, BATCH.get(name, ids), v, steps=4, stable=name in STABLE)
                    else:
                        rt = check_loop(*LOOPS[name], v)
                    counts[v][0] += 1
                    print(f"PASS {name:22s} {v:11s} {time.time() - t0:5.1f}s", flush=True)
                    if v in ("keep", "recompute"):
                        mem.setdefault(name, {})[v] = rt.report().steps[-1].peak_activation_bytes
                except Exception as e:
                    counts[v][1] += 1
                    print(f"FAIL {name:22s} {v:11s} {type(e).__name__}: {str(e)[:400]}", flush=True)
                    if "-v" in sys.argv:
                        traceback.print_exc()
            for msg in dict.fromkeys(CATCH.msgs):
                print(f"    LOG {msg[:400]}", flush=True)
            for w in dict.fromkeys(str(w.message) for w in ws):
                print(f"    PYWARN {w[:300]}", flush=True)
    print("\nCOUNTS (pass/fail):", {v: f"{p}/{f}" for v, (p, f) in counts.items()})
    print("\nMEMORY peak_activation_bytes last step (keep vs recompute):")
    for name, d in mem.items():
        k, r = d.get("keep"), d.get("recompute")
        flag = "" if k is None or r is None or r < k else "  <-- recompute NOT less"
        print(f"  {name:22s} keep={k} recompute={r}{flag}")


if __name__ == "__main__":
    main()
