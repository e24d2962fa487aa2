"""Training-loop styles not swept before (loops_sweep, sweep_d), bitwise against plain.

    OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05l/sweep_l.py [CASE,CASE ...|all] [VARIANT,...] [-v]

Each case is a training loop written out in full, run for 6 steps on a fresh model made
from one seed, plainly and under ``offrecomp.runtime(root, mode=..., min_bytes=0)``
entered around the whole loop (or entered by the loop itself where the case says so).
The losses, every gradient at every point the loop reads it, every parameter and buffer
after each step, and the errors the loop catches (for cases that expect plain PyTorch to
raise) are compared bitwise. Seeds (torch, random) are set at every step. Variants:
keep, recompute, offload (emulated on CPU), auto, auto_tight (auto with budget = half
the last step's ``peak_activation_bytes`` of a keep run of the same loop), auto_serve
(auto_tight with ``replay_op_us=0``). WARNING records of the ``offrecomp`` logger and
Python warnings are printed per run.

Cases: DPO with the frozen reference model in the root under no_grad (dpo_in), outside
the root (dpo_out), and run with the runtime exited (dpo_exit, the runtime entered per
step); Transformer-XL style truncated BPTT with a detached memory carried across steps
(txl); an eval() and a train() forward of one model in one step (consistency); two task
losses backwarded separately with retain_graph in an alternating order (multitask);
sequence length growing every step (curriculum); accumulation over micro-batches of
different batch size and length (accum_varlen); an EMA teacher updated in place between
forward and backward (ema_between); a triplet loss, three forwards of one model on
inputs of different batch sizes (triplet); a forward returning a dict of losses summed
outside (dict_losses); mode switched mid-run by exiting one runtime and entering another
(mode_switch); half the blocks frozen after step 2 and unfrozen after step 4
(freeze_thaw); ``autograd.grad`` w.r.t. a subset of parameters, grads set by hand
(grad_subset); ``backward(inputs=)`` with parameters and a non-leaf activation
(bwd_inputs_nonleaf); ``zero_grad(set_to_none=False)`` every second optimizer step
(zero_false_accum); an optimizer step between the forward and the backward of a second
micro-batch with weights used through a copy so plain PyTorch runs (stale_copy) and used
directly so plain PyTorch raises (stale_raise); per-sample gradient clipping from forward
and backward module hooks (per_sample_clip); three micro-batch losses summed and one
backward (sum_then_backward); two micro-batch graphs backwarded in reverse order
(reverse_backward); a forward whose graph is dropped without backward every third step
(skip_graph); an exception thrown mid-forward and caught (exception_mid); a validation
pass in eval() under inference_mode between steps (val_between).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import random
import sys
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
import torch.nn.functional as F
from torch import nn

import offrecomp
from tests import models

STEPS = 6
VARIANTS = ["keep", "recompute", "offload", "auto", "auto_tight", "auto_serve"]
NEXT_MODE = {"keep": "recompute", "recompute": "offload", "offload": "auto", "auto": "keep",
             "auto_tight": "recompute", "auto_serve": "offload"}


# ----------------------------------------------------------------------------- models
class LM(nn.Module):
    """GPT blocks of tests/models.py returning logits; optional per-layer memory."""

    def __init__(self, layers=3, h=32, vocab=48, p=0.1):
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(models.Block(h, 4, p) for _ in range(layers))
        self.ln = nn.LayerNorm(h)
        self.head = nn.Linear(h, vocab)

    def forward(self, idx, mems=None):
        x = self.emb(idx)
        t = x.shape[1]
        new = []
        for i, blk in enumerate(self.blocks):
            new.append(x.detach())
            if mems is not None:
                x = blk(torch.cat([mems[i], x], 1))[:, -t:]
            else:
                x = blk(x)
        logits = self.head(self.ln(x))
        return (logits, new) if mems is not None else logits


def mlp(n=4, h=16):
    return models.Stack([models.MLPBlock(h) for _ in range(n)])


class Trunk(nn.Module):
    def __init__(self, h=16, n=4):
        super().__init__()
        self.inp = nn.Linear(8, h)
        self.blocks = nn.ModuleList(models.MLPBlock(h) for _ in range(n))
        self.head_a = nn.Linear(h, 3)
        self.head_b = nn.Linear(h, 1)

    def feats(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return x

    def forward(self, x):
        f = self.feats(x)
        ya = torch.randint(0, 3, (x.shape[0],))
        return {"ce": F.cross_entropy(self.head_a(f), ya), "reg": self.head_b(f).square().mean(),
                "l2": 1e-3 * f.pow(2).mean(), "logged": f.detach().abs().mean()}


class CopyLinear(nn.Module):
    """Linear whose weight enters the graph through a copy (as parametrizations do)."""

    def __init__(self, i, o):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(o, i) / math.sqrt(i))
        self.bias = nn.Parameter(torch.zeros(o))

    def forward(self, x):
        return F.linear(x, self.weight * 1.0, self.bias * 1.0)


class CopyBlock(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.ln = nn.LayerNorm(h, elementwise_affine=False)
        self.fc1 = CopyLinear(h, 2 * h)
        self.fc2 = CopyLinear(2 * h, h)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def toks(s, b=4, t=8, v=48):
    return torch.randint(0, v, (b, t), generator=torch.Generator().manual_seed(1000 + s))


def xb(s, b=4, h=16):
    return torch.randn(b, h, generator=torch.Generator().manual_seed(2000 + s))


def seq_logp(logits, idx):
    lp = logits[:, :-1].log_softmax(-1).gather(-1, idx[:, 1:, None]).squeeze(-1)
    return lp.sum(-1)


# ----------------------------------------------------------------------------- harness
class Env:
    def __init__(self, variant, budget):
        self.variant, self.budget = variant, budget
        self.snaps, self.events, self.rts, self.msgs = [], [], {}, []

    def snap(self, root, tag=""):
        d = {}
        for n, p in root.named_parameters():
            if p.grad is not None:
                d["g." + n] = p.grad.clone()
        self.snaps.append(d)

    def ev(self, x):
        self.events.append(x)
        if isinstance(x, torch.Tensor):
            self.snaps.append({"ev": x.detach().clone()})

    def rt(self, root, key="a"):
        """The runtime for ``key`` (a: the variant, b: the next mode); plain: nullcontext."""
        if self.variant is None:
            return contextlib.nullcontext()
        if key not in self.rts:
            v = self.variant if key == "a" else NEXT_MODE[self.variant]
            self.rts[key] = make_rt(root, v, self.budget)
        return self.rts[key]


def make_rt(root, variant, budget):
    kw = dict(min_bytes=0)
    mode = variant
    if variant in ("auto_tight", "auto_serve"):
        mode = "auto"
        kw["budget"] = budget
        if variant == "auto_serve":
            kw["replay_op_us"] = 0
    return offrecomp.runtime(root, mode=mode, **kw)


class Case:
    def __init__(self, make, step, opt=lambda m: torch.optim.SGD(m.parameters(), lr=0.05), manage=False):
        self.make, self.step, self.opt, self.manage = make, step, opt, manage


def run_case(case, variant, budget=None):
    torch.manual_seed(0)
    random.seed(0)
    root = case.make()
    opt = case.opt(root)
    env = Env(variant, budget)
    ctx = contextlib.nullcontext() if (case.manage or variant is None) else env.rt(root)
    with ctx:
        for s in range(STEPS):
            torch.manual_seed(100 + s)
            random.seed(100 + s)
            case.step(root, opt, s, env)
            env.snap(root)
            env.snaps.append({"p." + n: p.detach().clone() for n, p in root.named_parameters()}
                             | {"b." + n: b.clone() for n, b in root.named_buffers()})
    return env


def _bits(t):
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}.get(t.dtype)
    return t.contiguous().view(ints) if ints is not None else t


def compare(ref, got):
    if ref.events.__len__() != got.events.__len__():
        return f"events differ: {len(ref.events)} vs {len(got.events)}"
    for a, b in zip(ref.events, got.events):
        if isinstance(a, str) or isinstance(b, str):
            if a != b:
                return f"event differs: plain {a!r} vs offrecomp {b!r}"
    if len(ref.snaps) != len(got.snaps):
        return f"snapshot count {len(ref.snaps)} vs {len(got.snaps)}"
    for i, (a, b) in enumerate(zip(ref.snaps, got.snaps)):
        if a.keys() != b.keys():
            return f"snap {i}: keys differ {sorted(a.keys() ^ b.keys())}"
        bad = [k for k in a if a[k].shape != b[k].shape or not torch.equal(_bits(a[k]), _bits(b[k]))]
        if bad:
            k = bad[0]
            d = (a[k].double() - b[k].double()).abs().max().item() if a[k].shape == b[k].shape else float("nan")
            return f"snap {i}: {len(bad)} differ, e.g. {k} max abs diff {d:.3g}"
    return None


class Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.msgs = []

    def emit(self, record):
        self.msgs.append(record.getMessage())


# ----------------------------------------------------------------------------- loops
def dpo_root():
    pol = LM()
    ref = copy.deepcopy(pol).requires_grad_(False).eval()
    return nn.ModuleDict(dict(pol=pol, ref=ref))


def dpo_loss(pol, refm, s, env, exit_ctx=None):
    ch, rj = toks(s), toks(s + 500)
    pc, pr = seq_logp(pol(ch), ch), seq_logp(pol(rj), rj)
    with (exit_ctx or contextlib.nullcontext()), torch.no_grad():
        rc, rr = seq_logp(refm(ch), ch), seq_logp(refm(rj), rj)
    loss = -F.logsigmoid(0.1 * ((pc - rc) - (pr - rr))).mean()
    env.ev(loss)
    return loss


def dpo_in(root, opt, s, env):
    opt.zero_grad()
    dpo_loss(root["pol"], root["ref"], s, env).backward()
    opt.step()


_REF = {}


def dpo_out_make():
    pol = LM()
    _REF["m"] = copy.deepcopy(pol).requires_grad_(False).eval()
    return pol


def dpo_out(root, opt, s, env):
    opt.zero_grad()
    dpo_loss(root, _REF["m"], s, env).backward()
    opt.step()


def dpo_exit(root, opt, s, env):
    # the policy forward and backward under the runtime, the reference outside it
    opt.zero_grad()
    with torch.no_grad():
        ch, rj = toks(s), toks(s + 500)
        rc, rr = seq_logp(_REF["m"](ch), ch), seq_logp(_REF["m"](rj), rj)
    with env.rt(root):
        pc, pr = seq_logp(root(ch), ch), seq_logp(root(rj), rj)
        loss = -F.logsigmoid(0.1 * ((pc - rc) - (pr - rr))).mean()
        env.ev(loss)
        loss.backward()
    opt.step()


_MEM = {}


def txl(root, opt, s, env):
    if s == 0:
        _MEM.clear()
    seq = toks(s, t=16)
    for c in range(2):
        part = seq[:, 8 * c: 8 * c + 8]
        mems = _MEM.get("m") or [torch.zeros(4, 4, 32) for _ in range(3)]
        logits, new = root(part, [m[:, -4:] for m in mems])
        _MEM["m"] = new
        loss = F.cross_entropy(logits.flatten(0, 1), part.flatten())
        env.ev(loss)
        loss.backward()
        env.snap(root)
    opt.step()
    opt.zero_grad()


def consistency(root, opt, s, env):
    opt.zero_grad()
    x = toks(s)
    root.eval()
    le = root(x)
    root.train()
    lt = root(x)
    loss = F.cross_entropy(lt.flatten(0, 1), x.flatten()) + (lt.softmax(-1) - le.softmax(-1)).square().mean()
    env.ev(loss)
    loss.backward()
    opt.step()


def multitask(root, opt, s, env):
    opt.zero_grad()
    d = root(torch.randn(6, 8))
    la, lb = d["ce"], d["reg"]
    first, second = (la, lb) if s % 2 == 0 else (lb, la)
    first.backward(retain_graph=True)
    env.snap(root)
    torch.nn.utils.clip_grad_norm_(root.parameters(), 0.5)
    second.backward()
    opt.step()


def curriculum(root, opt, s, env):
    opt.zero_grad()
    x = toks(s, t=4 + 2 * s)
    loss = F.cross_entropy(root(x).flatten(0, 1), x.flatten())
    env.ev(loss)
    loss.backward()
    opt.step()


def accum_varlen(root, opt, s, env):
    opt.zero_grad()
    shapes = [(2, 6), (5, 3), (3, 9)] if s % 2 == 0 else [(4, 8), (1, 12)]
    ntok = sum(b * t for b, t in shapes)
    for i, (b, t) in enumerate(shapes):
        x = toks(10 * s + i, b=b, t=t)
        loss = F.cross_entropy(root(x).flatten(0, 1), x.flatten(), reduction="sum") / ntok
        env.ev(loss)
        loss.backward()
    opt.step()


def ema_root():
    st = mlp()
    return nn.ModuleDict(dict(st=st, te=copy.deepcopy(st).requires_grad_(False)))


def ema_between(root, opt, s, env):
    opt.zero_grad()
    x = xb(s)
    with torch.no_grad():
        tgt = root["te"].blocks[-1](root["te"].blocks[0](x))
    h = x
    for b in root["st"].blocks:
        h = b(h)
    loss = (h - tgt).square().mean()
    with torch.no_grad():  # EMA between forward and backward
        for pt, ps in zip(root["te"].parameters(), root["st"].parameters()):
            pt.mul_(0.9).add_(ps, alpha=0.1)
    env.ev(loss)
    loss.backward()
    opt.step()


def triplet(root, opt, s, env):
    opt.zero_grad()
    a, p, n = xb(s, b=4), xb(s, b=4) + 0.1 * xb(s + 50, b=4), xb(s + 99, b=6)

    def emb(x):
        for b in root.blocks:
            x = b(x)
        return x

    ea, ep, en = emb(a), emb(p), emb(n)
    dn = torch.cdist(ea, en).min(1).values
    loss = F.relu((ea - ep).norm(dim=-1) - dn + 1.0).mean()
    env.ev(loss)
    loss.backward()
    opt.step()


def dict_losses(root, opt, s, env):
    opt.zero_grad()
    d = root(torch.randn(6, 8))
    env.ev(d["logged"])
    sum(v for k, v in d.items() if k != "logged").backward()
    opt.step()


def mode_switch(root, opt, s, env):
    opt.zero_grad()
    with env.rt(root, "a" if s < 3 else "b"):
        x = toks(s)
        loss = F.cross_entropy(root(x).flatten(0, 1), x.flatten())
        env.ev(loss)
        loss.backward()
    opt.step()


def freeze_thaw(root, opt, s, env):
    half = list(root.blocks)[:2]
    if s == 2:
        for b in half:
            b.requires_grad_(False)
    if s == 4:
        for b in half:
            b.requires_grad_(True)
    opt.zero_grad()
    x = toks(s)
    loss = F.cross_entropy(root(x).flatten(0, 1), x.flatten())
    env.ev(loss)
    loss.backward()
    opt.step()


def grad_subset(root, opt, s, env):
    opt.zero_grad()
    x = toks(s)
    loss = F.cross_entropy(root(x).flatten(0, 1), x.flatten())
    sub = list(root.blocks[1].parameters()) + [root.head.weight]
    gs = torch.autograd.grad(loss, sub)
    for p, g in zip(sub, gs):
        p.grad = g
    opt.step()


def bwd_inputs_nonleaf(root, opt, s, env):
    opt.zero_grad()
    x = toks(s)
    h = root.emb(x)
    acts = []
    for b in root.blocks:
        h = b(h)
        acts.append(h)
    loss = F.cross_entropy(root.head(root.ln(h)).flatten(0, 1), x.flatten())
    mid = acts[0]
    loss.backward(inputs=[mid, root.blocks[2].fc1.weight, root.emb.weight])
    env.ev(mid.grad)
    opt.step()


def zero_false_accum(root, opt, s, env):
    if s % 2 == 0:
        opt.zero_grad(set_to_none=False)
    x = toks(s)
    loss = F.cross_entropy(root(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()


def _stale(root, opt, s, env):
    opt.zero_grad()
    l1 = root(xb(s))
    l2 = root(xb(s + 77))
    l1.backward()
    opt.step()
    opt.zero_grad()
    try:
        l2.backward()
        env.ev("ok")
    except RuntimeError as e:
        env.ev("RuntimeError")  # the class only: offrecomp words it its own way
        env.msgs.append(str(e).split("\n")[0][:160])
    env.snap(root)
    opt.step()


def per_sample_make():
    m = mlp(n=3)
    store = {}

    def fwd(mod, inp, out):
        store[mod] = inp[0].detach()

    def bwd(mod, gin, gout):
        a, g = store[mod], gout[0].detach()
        mod._gs_w = torch.einsum("bo,bi->boi", g, a)
        mod._gs_b = g.clone()

    for mod in m.modules():
        if isinstance(mod, nn.Linear):
            mod.register_forward_hook(fwd)
            mod.register_full_backward_hook(bwd)
    return m


def per_sample_clip(root, opt, s, env):
    opt.zero_grad()
    x = xb(s, b=5)
    out = x
    for b in root.blocks:
        out = b(out)
    per = out.square().mean(-1)  # per-sample losses
    per.sum().backward()
    lins = [m for m in root.modules() if isinstance(m, nn.Linear)]
    norms = torch.stack([torch.cat([m._gs_w.flatten(1), m._gs_b.flatten(1)], 1).norm(dim=1) for m in lins]).norm(dim=0)
    f = (0.1 / (norms + 1e-6)).clamp(max=1.0)
    env.ev(norms)
    for m in lins:
        m.weight.grad = torch.einsum("b,boi->oi", f, m._gs_w) / 5
        m.bias.grad = torch.einsum("b,bo->o", f, m._gs_b) / 5
    for n, p in root.named_parameters():  # LayerNorm params: plain grads kept
        pass
    opt.step()


def sum_then_backward(root, opt, s, env):
    opt.zero_grad()
    losses = []
    for i in range(3):
        x = toks(10 * s + i)
        losses.append(F.cross_entropy(root(x).flatten(0, 1), x.flatten()))
    (sum(losses) / 3).backward()
    opt.step()


def reverse_backward(root, opt, s, env):
    opt.zero_grad()
    x1, x2 = toks(s), toks(s + 300, b=3, t=6)
    l1 = F.cross_entropy(root(x1).flatten(0, 1), x1.flatten())
    l2 = F.cross_entropy(root(x2).flatten(0, 1), x2.flatten())
    l2.backward()
    env.snap(root)
    l1.backward()
    opt.step()


def skip_graph(root, opt, s, env):
    opt.zero_grad()
    x = toks(s)
    loss = F.cross_entropy(root(x).flatten(0, 1), x.flatten())
    env.ev(loss)
    if s % 3 == 1:  # "loss spike": skip the step, drop the graph
        del loss
        return
    loss.backward()
    opt.step()


class Boom(Exception):
    pass


def exception_mid(root, opt, s, env):
    opt.zero_grad()
    x = toks(s)
    if s in (1, 3):
        try:
            h = root.emb(x)
            h = root.blocks[0](h)
            h = root.blocks[1](h)
            raise Boom()
        except Boom:
            env.ev("boom")
    loss = F.cross_entropy(root(x).flatten(0, 1), x.flatten())
    env.ev(loss)
    loss.backward()
    opt.step()


def val_between(root, opt, s, env):
    opt.zero_grad()
    x = toks(s)
    loss = F.cross_entropy(root(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    root.eval()
    with torch.inference_mode():
        v = toks(s + 900)
        env.ev(F.cross_entropy(root(v).flatten(0, 1), v.flatten()).clone())
    with torch.no_grad():
        env.ev(root(toks(s + 901, b=2, t=5)).clone())
    root.train()


CASES = dict(
    dpo_in=Case(dpo_root, dpo_in),
    dpo_out=Case(dpo_out_make, dpo_out),
    dpo_exit=Case(dpo_out_make, dpo_exit, manage=True),
    txl=Case(LM, txl),
    consistency=Case(LM, consistency),
    multitask=Case(Trunk, multitask),
    curriculum=Case(LM, curriculum),
    accum_varlen=Case(LM, accum_varlen),
    ema_between=Case(ema_root, ema_between),
    triplet=Case(mlp, triplet),
    dict_losses=Case(Trunk, dict_losses, opt=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2)),
    mode_switch=Case(LM, mode_switch, manage=True),
    freeze_thaw=Case(LM, freeze_thaw, opt=lambda m: torch.optim.Adam(m.parameters(), lr=1e-2)),
    grad_subset=Case(LM, grad_subset),
    bwd_inputs_nonleaf=Case(LM, bwd_inputs_nonleaf),
    zero_false_accum=Case(LM, zero_false_accum, opt=lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)),
    stale_copy=Case(lambda: models.Stack([CopyBlock(16) for _ in range(4)]), _stale),
    stale_raise=Case(mlp, _stale),
    per_sample_clip=Case(per_sample_make, per_sample_clip),
    sum_then_backward=Case(LM, sum_then_backward),
    reverse_backward=Case(LM, reverse_backward),
    skip_graph=Case(LM, skip_graph),
    exception_mid=Case(LM, exception_mid),
    val_between=Case(LM, val_between),
)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    verbose = "-v" in sys.argv
    names = list(CASES) if not args or args[0] == "all" else args[0].split(",")
    variants = VARIANTS if len(args) < 2 else args[1].split(",")
    catch = Catch()
    logging.getLogger("offrecomp").addHandler(catch)
    counts = {v: [0, 0] for v in variants}
    for name in names:
        case = CASES[name]
        try:
            ref = run_case(case, None)
            ref2 = run_case(case, None)
            det = compare(ref, ref2)
        except Exception as e:
            print(f"{name}: SKIP plain fails: {type(e).__name__}: {e}")
            continue
        if det:
            print(f"{name}: SKIP plain nondeterministic: {det}")
            continue
        budget = None
        if any(v in ("auto_tight", "auto_serve") for v in variants):
            k = run_case(case, "keep")
            rts = list(k.rts.values())
            budget = max(1, rts[0].report().steps[-1].peak_activation_bytes // 2)
        for v in variants:
            catch.msgs.clear()
            with warnings.catch_warnings(record=True) as wl:
                warnings.simplefilter("always")
                try:
                    got = run_case(case, v, budget)
                    err = compare(ref, got)
                except Exception as e:
                    err = f"raised {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                    if verbose:
                        traceback.print_exc()
                    got = None
            notes = []
            if got is not None:
                for key, rt in got.rts.items():
                    st = rt.report().steps
                    phases = ",".join(x.phase for x in st)
                    if verbose or v == "recompute":
                        notes.append(f"[{key}] phases={phases} recomputed={[x.recomputed_bytes for x in st]} offl={[x.offloaded_bytes for x in st]}")
            status = "FAIL" if err else "PASS"
            counts[v][0 if not err else 1] += 1
            print(f"{name} {v}: {status}" + (f" -- {err}" if err else "") + (f" budget={budget}" if v.startswith("auto_") else ""))
            for n in (got.msgs if got is not None else []):
                print(f"    caught: {n}")
            for n in notes if verbose else []:
                print("    ", n)
            for m in catch.msgs:
                print(f"    WARN(log): {m[:300]}")
            for w in wl:
                print(f"    WARN(py): {w.category.__name__}: {str(w.message)[:300]}")
            sys.stdout.flush()
    print()
    for v, (p, f) in counts.items():
        print(f"{v}: pass {p} fail {f}")


if __name__ == "__main__":
    main()
