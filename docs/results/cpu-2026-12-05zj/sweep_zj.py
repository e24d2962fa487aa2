"""Long-sequence training patterns under every zoo variant (CPU sweep zj).

Every case: a plain run twice (determinism), then keep, recompute, offload, auto,
auto_tight, auto_serve (tests/helpers.py's ``variant_runtime``; auto_tight/serve at half
of the largest ``peak_activation_bytes`` a keep run books over the case's steps), each
from an identical deep copy and seeds; grads, params (after each optimizer step),
buffers and every loss compared bitwise (``torch.equal`` on the bits). Each step's
forwards and backwards run in a ``torch.profiler`` memory window
(``gc.collect()`` before, as tests/offrecomp/test_memory.py::allocator_peak) unless the
case turns it off. Books checks, per step:
  * auto_tight/serve steps whose phase is ``planned``: peak_activation_bytes <= budget
    (``borrowed`` steps are printed, and counted over budget separately);
  * every variant's allocator peak <= keep's allocator peak - (keep's books - its books)
    + 10% of keep's allocator peak + 64 KiB (+ the pinned pool reserved in that step's
    window under offload) ("keep-based bound", as results/cpu-2026-12-05zd, looser:
    only "far above its books" is flagged).
Model: embedding, 2-3 pre-norm transformer blocks (nn.ModuleList, d=32, 2 heads,
RoPE from position ids), final norm, tied-free head, cross-entropy. Cases:
  grow_each_step   lengths 64, 96, ..., 512 (15 steps, batch 1), causal SDPA
  grow_every3      lengths 64, 128, 192, 256, each for 3 steps (12 steps)
  random_len       a random length in [16, 256] per step (14 steps)
  packed_docids    packed rows of 2-5 documents; doc ids passed to every block, the
                   block-diagonal causal mask built inside each block; position ids
                   reset per document
  packed_mask_arg  the same, the boolean [B,1,T,T] mask built outside and passed
  sliding_window   a banded causal mask (window 16) built inside each block, lengths vary
  chunked_attn     attention over query chunks of 16 in a Python loop inside each block
  ce_chunked_out   loss over sequence chunks of 32 (vocab 512) in the root: each chunk's
                   logits materialized, CE, summed
  ce_chunked_in    the same chunked loss inside a region (its own module, ``regions=``)
  ce_liger_out     a custom autograd.Function computing the loss chunk by chunk and
                   recomputing logits in backward (Liger/CCE style), in the root
  ce_liger_in      the same Function inside a region
  accum_varlen     gradient accumulation: 3 micro-batches of lengths 48, 96, 32 per step
  accum_varlen_bf16  the same under torch.autocast("cpu", bfloat16) per micro-batch
  flex_doc         a document + causal BlockMask made per step by create_block_mask and
                   passed to the blocks; FlexAttention itself has no CPU backward in torch
                   2.13 (NotImplementedError: the end of run1_all.txt), so each block masks
                   SDPA with the BlockMask's mask_mod and its block sparsity (to_dense)
  flex_window      the same with a sliding-window (16) BlockMask per step
  rope_buffer      cos/sin caches as persistent=False buffers (512 x 64 fp32, 128 KiB
                   each) in every block, sliced per step, lengths vary
  rope_lazy        the same caches starting at 64 rows and replaced by larger ones in
                   forward when a longer sequence arrives (lengths 48, 64, 96, 128, 96, 200)
  offload_varlen   mode=offload and a user plan offloading by default
                   (``cycle.py`` covers the 30-step pool/transfer checks)
Run (from the repository root):
  OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zj/sweep_zj.py CASE [CASE ...] | all
"""

from __future__ import annotations

import contextlib
import copy
import gc
import math
import os
import random
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.getcwd())
import offrecomp  # noqa: E402
from tests.helpers import variant_runtime  # noqa: E402

VARIANTS = ["keep", "recompute", "offload", "auto", "auto_tight", "auto_serve"]
V = 128


# ---------------------------------------------------------------- model pieces

def rope(x, cos, sin):
    # x [B,H,T,hd]; cos/sin [B or 1,1,T,hd/2]
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)


def doc_mask(doc):
    # doc [B,T] -> bool [B,1,T,T], True = attend
    T = doc.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


class Block(nn.Module):
    def __init__(self, d=32, heads=2, attn="causal", rope_buf=0, window=16, chunk=16):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)
        self.attn, self.window, self.chunk = attn, window, chunk
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.rope_buf = rope_buf
        if rope_buf:
            self._cache(rope_buf)

    def _cache(self, n):
        # 64 columns as in a real head dim (n x 64 fp32); the first hd/2 used
        inv = 1.0 / (10000 ** (torch.arange(0, 128, 2).float() / 128))
        inv[: self.hd // 2] = self.inv_freq
        f = torch.arange(n).float()[:, None] * inv[None]
        self.register_buffer("cos_c", f.cos(), persistent=False)
        self.register_buffer("sin_c", f.sin(), persistent=False)

    def forward(self, x, pos=None, doc=None, mask=None, block_mask=None):
        B, T, D = x.shape
        if self.rope_buf:
            if T > self.cos_c.shape[0]:  # lazily grown cache
                self._cache(max(T, 2 * self.cos_c.shape[0]))
            cos = self.cos_c[:T, : self.hd // 2][None, None]
            sin = self.sin_c[:T, : self.hd // 2][None, None]
        else:
            p = pos if pos is not None else torch.arange(T, device=x.device)[None]
            f = p[..., None].float() * self.inv_freq
            cos, sin = f.cos()[:, None], f.sin()[:, None]
        h = self.n1(x)
        q, k, v = self.qkv(h).view(B, T, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = self.attn
        if a == "causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif a == "docids":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=doc_mask(doc))
        elif a == "mask_arg":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif a == "window":
            i = torch.arange(T, device=x.device)
            band = (i[:, None] >= i[None]) & (i[:, None] - i[None] < self.window)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
        elif a == "chunked":
            outs = []
            for s in range(0, T, self.chunk):
                e = min(T, s + self.chunk)
                sc = q[:, :, s:e] @ k[:, :, :e].transpose(-1, -2) / math.sqrt(self.hd)
                i = torch.arange(s, e, device=x.device)[:, None]
                j = torch.arange(e, device=x.device)[None]
                sc = sc.masked_fill(j > i, float("-inf"))
                outs.append(sc.softmax(-1) @ v[:, :, :e])
            y = torch.cat(outs, 2)
        elif a == "flex":
            # FlexAttention has no CPU backward in torch 2.13 ("FlexAttention does not
            # support backward on CPU"): the BlockMask made per step is passed in and its
            # mask_mod, with its block-level sparsity (to_dense), masks SDPA.
            bm = block_mask
            bi = torch.arange(B, device=x.device)[:, None, None, None]
            qi = torch.arange(T, device=x.device)[None, None, :, None]
            ki = torch.arange(T, device=x.device)[None, None, None, :]
            dense = bm.mask_mod(bi, torch.zeros_like(bi), qi, ki)
            blocks = bm.to_dense().bool()  # [B or 1, 1, T/16, T/16]
            bs = bm.BLOCK_SIZE[0]
            blocks = blocks.repeat_interleave(bs, -2).repeat_interleave(bs, -1)[..., :T, :T]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=dense & blocks)
        else:
            raise ValueError(a)
        x = x + self.drop(self.o(y.transpose(1, 2).reshape(B, T, D)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.n2(x)))))


class ChunkedCE(nn.Module):
    """Loss over sequence chunks: each chunk's logits made, CE, summed."""

    def __init__(self, d, vocab, chunk=32, liger=False):
        super().__init__()
        self.head = nn.Linear(d, vocab, bias=False)
        self.chunk, self.liger = chunk, liger

    def forward(self, h, tgt):
        h, tgt = h.flatten(0, 1), tgt.flatten()
        if self.liger:
            return LigerCE.apply(h, self.head.weight, tgt, self.chunk)
        tot = h.new_zeros(())
        for s in range(0, h.shape[0], self.chunk):
            tot = tot + F.cross_entropy(self.head(h[s:s + self.chunk]), tgt[s:s + self.chunk], reduction="sum")
        return tot / h.shape[0]


class LigerCE(torch.autograd.Function):
    """CE over a large vocabulary without keeping logits: recomputed chunk by chunk in
    backward."""

    @staticmethod
    def forward(ctx, h, w, tgt, chunk):
        tot = h.new_zeros(())
        for s in range(0, h.shape[0], chunk):
            tot = tot + F.cross_entropy(h[s:s + chunk] @ w.t(), tgt[s:s + chunk], reduction="sum")
        ctx.save_for_backward(h, w, tgt)
        ctx.chunk = chunk
        return tot / h.shape[0]

    @staticmethod
    def backward(ctx, g):
        h, w, tgt = ctx.saved_tensors
        n = h.shape[0]
        gh, gw = torch.zeros_like(h), torch.zeros_like(w)
        for s in range(0, n, ctx.chunk):
            hs = h[s:s + ctx.chunk]
            p = (hs @ w.t()).softmax(-1)
            p[torch.arange(hs.shape[0]), tgt[s:s + ctx.chunk]] -= 1
            p = p * (g / n)
            gh[s:s + ctx.chunk] = p @ w
            gw += p.t() @ hs
        return gh, gw, None, None


class LM(nn.Module):
    def __init__(self, n=2, d=32, vocab=V, loss="full", region_loss=False, **blk):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, **blk) for _ in range(n))
        self.ln = nn.LayerNorm(d)
        self.loss_kind = loss
        if loss == "full":
            self.head = nn.Linear(d, vocab, bias=False)
        else:
            self.lossmod = ChunkedCE(d, vocab, liger=(loss == "liger"))

    def forward(self, idx, tgt, pos=None, doc=None, mask=None, block_mask=None):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, pos=pos, doc=doc, mask=mask, block_mask=block_mask)
        h = self.ln(x)
        if self.loss_kind == "full":
            return F.cross_entropy(self.head(h).flatten(0, 1), tgt.flatten())
        return self.lossmod(h, tgt)


# ---------------------------------------------------------------- batches

def tokens(step, B, T, vocab=V):
    g = torch.Generator().manual_seed(1000 + step)
    idx = torch.randint(0, vocab, (B, T + 1), generator=g)
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()


def packed(step, B, T, vocab=V):
    idx, tgt = tokens(step, B, T, vocab)
    g = torch.Generator().manual_seed(5000 + step)
    doc = torch.zeros(B, T, dtype=torch.long)
    pos = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        ndoc = int(torch.randint(2, 6, (1,), generator=g))
        cuts = sorted(torch.randperm(T - 1, generator=g)[: ndoc - 1].add(1).tolist())
        start = 0
        for i, c in enumerate(cuts + [T]):
            doc[b, start:c] = i
            pos[b, start:c] = torch.arange(c - start)
            start = c
    return idx, tgt, doc, pos


def flex_mask(kind, doc, T, window=16):
    from torch.nn.attention.flex_attention import create_block_mask

    if kind == "doc":
        def mod(b, h, q, kv):
            return (doc[b, q] == doc[b, kv]) & (q >= kv)
        B = doc.shape[0]
    else:
        def mod(b, h, q, kv):
            return (q >= kv) & (q - kv < window)
        B = None
    return create_block_mask(mod, B, None, T, T, device="cpu", BLOCK_SIZE=16)


# ---------------------------------------------------------------- cases
# each: (model factory, steps, step_fn(model, step) -> list of losses [does backward],
#        runtime kwargs, stable)

def fwd_bwd(model, batches, autocast=False):
    losses = []
    for kw in batches:
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with ctx:
            loss = model(**kw)
        (loss / len(batches)).backward()
        losses.append(loss.detach().clone())
    return losses


def simple(lengths, B=2):
    def fn(model, s):
        idx, tgt = tokens(s, B, lengths[s])
        return fwd_bwd(model, [dict(idx=idx, tgt=tgt)])
    return fn


def rand_lengths(n, lo=16, hi=256, seed=7):
    r = random.Random(seed)
    return [r.randrange(lo, hi + 1) for _ in range(n)]


VAR = [64, 96, 48, 128, 80, 128, 112, 64, 128, 96]


def packed_fn(lengths, as_mask):
    def fn(model, s):
        idx, tgt, doc, pos = packed(s, 2, lengths[s])
        if as_mask:
            return fwd_bwd(model, [dict(idx=idx, tgt=tgt, pos=pos, mask=doc_mask(doc))])
        return fwd_bwd(model, [dict(idx=idx, tgt=tgt, pos=pos, doc=doc)])
    return fn


def flex_fn(lengths, kind):
    def fn(model, s):
        T = lengths[s]
        idx, tgt, doc, pos = packed(s, 2, T)
        bm = flex_mask(kind, doc, T)
        return fwd_bwd(model, [dict(idx=idx, tgt=tgt, pos=pos if kind == "doc" else None, block_mask=bm)])
    return fn


def accum_fn(lens, autocast):
    def fn(model, s):
        mbs = []
        for i, T in enumerate(lens):
            idx, tgt = tokens(10 * s + i, 2, T)
            mbs.append(dict(idx=idx, tgt=tgt))
        return fwd_bwd(model, mbs, autocast)
    return fn


def loss_regions(m, name):
    return isinstance(m, (Block, ChunkedCE))


FLEX_LEN = [64, 96, 128, 64, 112, 128, 80, 128]
GROW = list(range(64, 513, 32))
EVERY3 = [64] * 3 + [128] * 3 + [192] * 3 + [256] * 3
RAND = rand_lengths(14)
LAZY = [48, 64, 96, 128, 96, 200, 200, 128]

CASES = {
    "grow_each_step": (lambda: LM(2), len(GROW), simple(GROW, B=1), {}, False),
    "grow_every3": (lambda: LM(2), len(EVERY3), simple(EVERY3), {}, False),
    "random_len": (lambda: LM(2), len(RAND), simple(RAND), {}, False),
    "packed_docids": (lambda: LM(3, attn="docids"), len(VAR), packed_fn(VAR, False), {}, False),
    "packed_mask_arg": (lambda: LM(3, attn="mask_arg"), len(VAR), packed_fn(VAR, True), {}, False),
    "sliding_window": (lambda: LM(3, attn="window"), len(VAR), simple(VAR), {}, False),
    "chunked_attn": (lambda: LM(2, attn="chunked"), len(VAR), simple(VAR), {}, False),
    "ce_chunked_out": (lambda: LM(2, vocab=512, loss="chunked"), 8, simple([128] * 8), {}, True),
    "ce_chunked_in": (lambda: LM(2, vocab=512, loss="chunked"), 8, simple([128] * 8), {"regions": loss_regions}, True),
    "ce_liger_out": (lambda: LM(2, vocab=512, loss="liger"), 8, simple([128] * 8), {}, True),
    "ce_liger_in": (lambda: LM(2, vocab=512, loss="liger"), 8, simple([128] * 8), {"regions": loss_regions}, True),
    "accum_varlen": (lambda: LM(2), 6, accum_fn([48, 96, 32], False), {}, True),
    "accum_varlen_bf16": (lambda: LM(2), 6, accum_fn([48, 96, 32], True), {}, True),
    "flex_doc": (lambda: LM(2, attn="flex"), len(FLEX_LEN), flex_fn(FLEX_LEN, "doc"), {}, False),
    "flex_window": (lambda: LM(2, attn="flex"), len(FLEX_LEN), flex_fn(FLEX_LEN, "window"), {}, False),
    "rope_buffer": (lambda: LM(3, rope_buf=512), len(VAR), simple(VAR), {}, False),
    "rope_lazy": (lambda: LM(3, rope_buf=64), len(LAZY), simple(LAZY), {}, False),
}


# ---------------------------------------------------------------- harness

def allocator_window(fn):
    gc.collect()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        if e.name() == "[memory]":
            cur += e.nbytes()
            peak = max(peak, cur)
    return out, peak


def bits(t):
    m = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float64: torch.int64}
    return t.contiguous().view(m[t.dtype]) if t.dtype in m else t


def train(model, step_fn, steps, ctx=None, alloc=True, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    snaps, peaks, host = [], [], []
    with ctx if ctx is not None else contextlib.nullcontext():
        for s in range(steps):
            torch.manual_seed(s)
            random.seed(s)

            def one():
                return step_fn(model, s)

            t0 = time.perf_counter()
            if alloc:
                losses, pk = allocator_window(one)
            else:
                losses, pk = one(), 0
            host.append(time.perf_counter() - t0)
            peaks.append(pk)
            snap = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            snap.update({f"buf.{n}": b.detach().clone() for n, b in model.named_buffers()})
            for i, l in enumerate(losses):
                snap[f"loss{i}"] = l
            opt.step()
            opt.zero_grad(set_to_none=True)
            snap.update({f"param.{n}": p.detach().clone() for n, p in model.named_parameters()})
            snaps.append(snap)
    return snaps, peaks, host


def diff(ref, got):
    bad = []
    if len(ref) != len(got):
        return [f"steps {len(ref)} vs {len(got)}"]
    for s, (a, b) in enumerate(zip(ref, got)):
        if a.keys() != b.keys():
            bad.append(f"step {s} keys {sorted(a.keys() ^ b.keys())}")
            continue
        for k in a:
            x, y = a[k], b[k]
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(bits(x), bits(y)):
                d = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else float("nan")
                bad.append(f"step {s} {k} ({d:.3g})")
    return bad


def run_case(name, variants=VARIANTS, alloc=True):
    factory, steps, step_fn, kw, stable = CASES[name]
    torch.manual_seed(0)
    base = factory()
    ref, ref_pk, _ = train(copy.deepcopy(base), step_fn, steps, alloc=alloc)
    ref2, _, _ = train(copy.deepcopy(base), step_fn, steps, alloc=False)
    det = not diff(ref, ref2)
    print(f"== {name}: steps {steps}, plain deterministic: {det}; plain allocator peaks (KiB) "
          + " ".join(str(p >> 10) for p in ref_pk), flush=True)
    results, keep_books, keep_pk, budget = {}, None, None, None
    for v in variants:
        m = copy.deepcopy(base)
        w = []
        try:
            rt = variant_runtime(m, v, budget, **kw)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                got, pk, host = train(m, step_fn, steps, rt, alloc=alloc)
            bad = diff(ref, got)
            recs = rt.report().steps
            err = None
        except Exception as e:  # noqa: BLE001
            bad, recs, pk, host, err = [], [], [], [], f"{type(e).__name__}: {e}"
        books = [r.peak_activation_bytes for r in recs]
        if v == "keep" and recs:
            keep_books, keep_pk = books, pk
            budget = max(books) // 2
        problems = []
        if err:
            problems.append("ERROR " + err[:300])
        if bad:
            problems.append(f"NOT BITWISE ({len(bad)}): " + "; ".join(bad[:4]))
        if len(recs) != steps and not err:
            problems.append(f"{len(recs)} step records for {steps} steps")
        if v in ("auto_tight", "auto_serve"):
            over = [(i, r.peak_activation_bytes) for i, r in enumerate(recs) if r.phase == "planned" and r.peak_activation_bytes > budget]
            if over:
                problems.append(f"planned over budget {budget}: " + ", ".join(f"s{i}:{b}" for i, b in over))
        if alloc and keep_books and recs and len(pk) == len(keep_pk) and len(books) == len(keep_books):
            pool = [r.pool_reserved_bytes for r in recs]
            for i, (a, b) in enumerate(zip(pk, books)):
                grown = max(0, pool[i] - (pool[i - 1] if i else 0))  # the pinned pool reserved in this window
                bound = keep_pk[i] - (keep_books[i] - b) + 0.10 * keep_pk[i] + (64 << 10) + grown
                if a > bound:
                    problems.append(f"s{i} allocator {a} > keep-based bound {int(bound)} (books {b}, keep books {keep_books[i]}, keep alloc {keep_pk[i]})")
        status = "FAIL" if problems else "PASS"
        results[v] = status
        phases = " ".join(f"{r.phase[:4]}" for r in recs)
        print(f"  {v:11s} {status}  phases: {phases}", flush=True)
        if v.startswith("auto_") and budget:
            print(f"    budget {budget}; books/budget " + " ".join(f"{b / budget:.2f}" for b in books))
        print("    books KiB " + " ".join(str(b >> 10) for b in books))
        if alloc:
            print("    alloc KiB " + " ".join(str(p >> 10) for p in pk))
        print("    host ms " + " ".join(f"{h * 1e3:.0f}" for h in host))
        ws = sorted({str(x.message)[:160] for x in w if "offrecomp" in str(x.message).lower() or "budget" in str(x.message)})
        for x in ws[:4]:
            print(f"    warning: {x}")
        for p in problems:
            print(f"    {p}")
    print(f"RESULT {name} " + " ".join(f"{v}={s}" for v, s in results.items()), flush=True)
    return results


if __name__ == "__main__":
    names = sys.argv[1:]
    if names == ["all"]:
        names = list(CASES)
    torch.set_num_threads(1)
    for n in names:
        run_case(n)
