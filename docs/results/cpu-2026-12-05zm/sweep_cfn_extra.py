"""Extra probes around compiled (inductor, CPU) functions inside eager blocks, beyond the
brief's list, compared BITWISE with plain training under keep (control), recompute,
offload, auto, auto_tight. Models are built fresh from a seed for each run (no deepcopy:
a compiled submodule cannot be copied). Plain is run twice (determinism check).
Attributes (plain tensor attributes, listed per case) are compared after the last step.

Cases
-----
cond_adv_read    first step: the block's compiled fn only READS the plain attribute pos
                 (sin(x+pos) before it too); from step 1 on (flag set by the loop between
                 steps) it calls the compiled fn that ADVANCES pos in place.
cond_adv_noread  first step: block never touches pos; from step 1 on the compiled fn
                 advances pos (and the block reads pos through it only).
cond_adv_noread_eager  the same with the advance done eagerly (pos.add_(1) in the block):
                 a control telling whether cond_adv_noread is compile-specific.
write_input      compiled fn scales the block's input in place (x.detach() passed, so the
                 region input's storage is written by the kernel), then uses it.
clamp_param      compiled fn clamps the block's own weight in place under no_grad
                 (weight clipping) then uses it.
compiled_sub     the block holds a compiled nn.Sequential (torch.compile(module)), eager
                 LayerNorm before, residual after.
graph_break      compiled fn with torch._dynamo.graph_break() in its middle (two graphs,
                 eager code between).
accum_adv        adv_read (sin(x+pos) before, compiled advance) with 2 micro-batches per
                 step (pos must advance 2 per step).
shared_pos       ONE plain tensor shared by all blocks, each block reads it (sin(x+pos))
                 then its compiled fn advances it (+1 per block per micro-batch).
adv_dropout      compiled fn advances pos AND draws dropout; block saves tanh(x) before.
cache_saved      compiled fn overwrites a plain attribute whole (cache.copy_(h)); the
                 block then saves it (z * cache): the "scratch held by saves" path.
cache_unsaved    the same, the cache only read by an add after (not saved).
dyn_shapes       compiled MLP with dynamic=True, the sequence length changing per step
                 (8, 12, 8, 12).

Variants as in sweep_cfn.py (auto_serve when named: xout_all_auto_serve.txt).

Run (from /tmp/sweep_cfn, one process at a time):
  cd /tmp/sweep_cfn && OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 \
    TORCHINDUCTOR_CACHE_DIR=/tmp/sweep_cfn/inductor_cache NUMBA_CACHE_DIR=/tmp/sweep_cfn/numba_cache \
    timeout 300 /work/main/.venv/bin/python sweep_cfn_extra.py CASE[,CASE...]|all [VARIANT,...]
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sys
import time
import traceback

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/sweep_cfn/inductor_cache")
os.environ.setdefault("NUMBA_CACHE_DIR", "/tmp/sweep_cfn/numba_cache")
sys.path.insert(0, "/work/main")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import offrecomp.diagnostics  # noqa: E402
from tests import models  # noqa: E402
from tests.helpers import assert_bitwise, variant_runtime  # noqa: E402

torch.set_num_threads(1)


def _read(x, w, b, pos):
    return torch.tanh(F.linear(x, w, b) + pos)


def _advance(x, w, b, pos):
    pos.add_(1.0)
    return torch.tanh(F.linear(x, w, b) + pos)


def _plain(x, w, b):
    return torch.tanh(F.linear(x, w, b))


def _scale_(t, w, b):
    t.mul_(0.5)
    return torch.tanh(F.linear(t, w, b))


def _clamp(x, w, b):
    with torch.no_grad():
        w.clamp_(-0.2, 0.2)
    return torch.tanh(F.linear(x, w, b))


def _gb(x, w1, b1, w2, b2):
    h = F.gelu(F.linear(x, w1, b1))
    torch._dynamo.graph_break()
    return F.linear(torch.tanh(h), w2, b2)


def _adv_drop(x, w, b, pos):
    pos.add_(1.0)
    return F.dropout(torch.tanh(F.linear(x, w, b) + pos), 0.25, training=True)


def _cache(x, w, b, cache):
    h = torch.tanh(F.linear(x, w, b))
    cache.copy_(h.detach())
    return h


def _mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


C = {n: torch.compile(f, backend="inductor") for n, f in {
    "read": _read, "advance": _advance, "plain": _plain, "scale_": _scale_, "clamp": _clamp, "gb": _gb,
    "adv_drop": _adv_drop, "cache": _cache}.items()}
C["dyn_mlp"] = torch.compile(_mlp, backend="inductor", dynamic=True)


class CondAdv(nn.Module):
    """``advance`` False: ``reads`` tells whether the block reads pos at all."""

    def __init__(self, reads, eager=False, h=16):
        super().__init__()
        self.fc, self.pos, self.reads, self.eager, self.advance = nn.Linear(h, h), torch.zeros(h), reads, eager, False

    def forward(self, x):
        if self.advance:
            y = torch.sin(x + self.pos) if self.reads else torch.tanh(x)
            if self.eager:
                self.pos.add_(1.0)
                z = C["read"](y, self.fc.weight, self.fc.bias, self.pos)
            else:
                z = C["advance"](y, self.fc.weight, self.fc.bias, self.pos)
        elif self.reads:
            y = torch.sin(x + self.pos)
            z = C["read"](y, self.fc.weight, self.fc.bias, self.pos)
        else:
            y = torch.tanh(x)
            z = C["plain"](y, self.fc.weight, self.fc.bias)
        return x + z * y


class WriteInput(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.fc, self.ln = nn.Linear(h, h), nn.LayerNorm(h)

    def forward(self, x):
        y = torch.tanh(x)  # saves its output, not x (a LayerNorm would save x)
        z = C["scale_"](x.detach(), self.fc.weight, self.fc.bias)
        return x + z * y


class ClampParam(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.fc, self.ln = nn.Linear(h, h), nn.LayerNorm(h)

    def forward(self, x):
        y = torch.tanh(self.ln(x))
        return x + C["clamp"](y, self.fc.weight, self.fc.bias) * y


class CompiledSub(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.ff = torch.compile(nn.Sequential(nn.Linear(h, 2 * h), nn.GELU(), nn.Linear(2 * h, h)), backend="inductor")

    def forward(self, x):
        y = self.ln(x)
        return x + torch.sigmoid(self.ff(y)) * y


class GraphBreak(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(h), nn.Linear(h, 2 * h), nn.Linear(2 * h, h)

    def forward(self, x):
        y = self.ln(x)
        return x + torch.sigmoid(C["gb"](y, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)) * y


class AdvRead(nn.Module):
    def __init__(self, fn, pos=None, reads=True, h=16):
        super().__init__()
        self.fn, self.fc, self.reads = fn, nn.Linear(h, h), reads
        self.pos = torch.zeros(h) if pos is None else pos

    def forward(self, x):
        y = torch.sin(x + self.pos) if self.reads else torch.tanh(x)
        return x + self.fn(y, self.fc.weight, self.fc.bias, self.pos) * y


class Cache(nn.Module):
    def __init__(self, saved, h=16):
        super().__init__()
        self.fc, self.ln, self.saved = nn.Linear(h, h), nn.LayerNorm(h), saved
        self.cache = torch.zeros(2, 8, h)

    def forward(self, x):
        y = torch.tanh(self.ln(x))
        z = C["cache"](y, self.fc.weight, self.fc.bias, self.cache)
        return x + z * (self.cache if self.saved else y) + (0 if self.saved else self.cache)


class DynMlp(nn.Module):
    def __init__(self, h=16):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(h), nn.Linear(h, 2 * h), nn.Linear(2 * h, h)

    def forward(self, x):
        y = self.ln(x)
        return x + torch.sigmoid(C["dyn_mlp"](y, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)) * y


def _b(s, t=8):
    return torch.randn(2, t, 16, generator=torch.Generator().manual_seed(1000 + s))


def _set_advance(model, step):
    for b in model.blocks:
        b.advance = step >= 1


def _shared():
    pos = torch.zeros(16)
    return models.Stack([AdvRead(C["advance"], pos=pos) for _ in range(3)])


# name -> (factory, batch, steps, accumulate, attrs to compare, hook before each step)
CASES = {
    "cond_adv_read": (lambda: models.Stack([CondAdv(True) for _ in range(2)]), _b, 4, 1, ["pos"], _set_advance),
    "cond_adv_noread": (lambda: models.Stack([CondAdv(False) for _ in range(2)]), _b, 4, 1, ["pos"], _set_advance),
    "cond_adv_noread_eager": (lambda: models.Stack([CondAdv(False, eager=True) for _ in range(2)]), _b, 4, 1, ["pos"], _set_advance),
    "write_input": (lambda: models.Stack([WriteInput() for _ in range(3)]), _b, 4, 1, [], None),
    "clamp_param": (lambda: models.Stack([ClampParam() for _ in range(3)]), _b, 4, 1, [], None),
    "compiled_sub": (lambda: models.Stack([CompiledSub() for _ in range(3)]), _b, 4, 1, [], None),
    "graph_break": (lambda: models.Stack([GraphBreak() for _ in range(3)]), _b, 4, 1, [], None),
    "accum_adv": (lambda: models.Stack([AdvRead(C["advance"]) for _ in range(2)]), _b, 3, 2, ["pos"], None),
    "shared_pos": (_shared, _b, 3, 1, ["pos"], None),
    "adv_dropout": (lambda: models.Stack([AdvRead(C["adv_drop"], reads=False) for _ in range(3)]), _b, 3, 1, ["pos"], None),
    "cache_saved": (lambda: models.Stack([Cache(True) for _ in range(3)]), _b, 4, 1, ["cache"], None),
    "cache_unsaved": (lambda: models.Stack([Cache(False) for _ in range(3)]), _b, 4, 1, ["cache"], None),
    "dyn_shapes": (lambda: models.Stack([DynMlp() for _ in range(3)]), lambda s: _b(s, 8 if (s // 10) % 2 == 0 else 12), 4, 1, [], None),
}

VARIANTS = ["keep", "recompute", "offload", "auto", "auto_tight"]


def train2(model, batch, ctx=None, *, steps, accumulate=1, hook=None, attrs=(), lr=0.1):
    """tests.helpers.train plus a hook before each step and plain attributes snapshotted."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    with ctx if ctx is not None else contextlib.nullcontext():
        for step in range(steps):
            if hook is not None:
                hook(model, step)
            for micro in range(accumulate):
                torch.manual_seed(10 * step + micro)
                random.seed(10 * step + micro)
                np.random.seed(10 * step + micro)
                loss = model(batch(10 * step + micro))
                loss.backward()
            snap = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            snap.update({f"buf.{n}": b.detach().clone() for n, b in model.named_buffers()})
            snap.update({f"param.{n}": p.detach().clone() for n, p in model.named_parameters()})
            for i, b in enumerate(model.blocks):
                for a in attrs:
                    snap[f"attr.{i}.{a}"] = getattr(b, a).clone()
            snap["loss"] = loss.detach().clone()
            out.append(snap)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return out


class _Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.msgs = []

    def emit(self, record):
        if record.levelno >= logging.WARNING:
            self.msgs.append(record.getMessage())


CATCH = _Catch()
logging.getLogger("offrecomp").addHandler(CATCH)
logging.getLogger("offrecomp").propagate = False


def build(factory):
    torch.manual_seed(0)
    return factory().train()


def run_case(name, variant):
    factory, batch, steps, acc, attrs, hook = CASES[name]
    kw = dict(steps=steps, accumulate=acc, hook=hook, attrs=attrs)
    ref = train2(build(factory), batch, **kw)
    assert_bitwise(ref, train2(build(factory), batch, **kw))  # plain deterministic
    budget = None
    if variant in ("auto_tight", "auto_serve"):
        probe = build(factory)
        keep = variant_runtime(probe, "keep")
        train2(probe, batch, keep, **dict(kw, steps=1))
        budget = keep.report().steps[0].peak_activation_bytes // 2
    m = build(factory)
    offrecomp.diagnostics.clear_warnings()
    CATCH.msgs.clear()
    rt = variant_runtime(m, variant, budget)
    try:
        got = train2(m, batch, rt, **kw)
    except RuntimeError as e:
        if "region 'blocks." in str(e):
            return "RAISE", f"{type(e).__name__}: {str(e)[:500]}", rt
        raise
    problems = []
    try:
        assert_bitwise(ref, got)
    except AssertionError as e:
        problems.append(f"MISMATCH {str(e)[:700]}")
    recs = rt.report().steps
    if len(recs) != steps:
        problems.append(f"{len(recs)} step records for {steps} steps")
    if variant == "offload" and not all(s.offloaded_bytes > 0 for s in recs):
        problems.append("offload variant offloaded nothing in some step")
    for a in attrs:
        vals = [float(ref[-1][f"attr.{i}.{a}"].flatten()[0]) for i in range(len(m.blocks))]
        got_vals = [float(got[-1][f"attr.{i}.{a}"].flatten()[0]) for i in range(len(m.blocks))]
        if a == "pos":
            print(f"     {a}[0] after last step: plain {vals} runtime {got_vals}")
    return ("FAIL" if problems else "PASS"), "; ".join(problems), rt


def books(rt):
    recs = rt.report().steps
    return (
        f"phases={[str(getattr(s.phase, 'value', s.phase)) for s in recs]} replays={[s.replays for s in recs]} "
        f"recomp={[s.recomputed_bytes for s in recs]} kept={[s.kept_bytes for s in recs]} "
        f"offl={[s.offloaded_bytes for s in recs]} peak={[s.peak_activation_bytes for s in recs]}"
    )


def main():
    argv = sys.argv[1:]
    names = list(CASES) if not argv or argv[0] == "all" else argv[0].split(",")
    variants = argv[1].split(",") if len(argv) > 1 else VARIANTS
    failed = 0
    for name in names:
        for v in variants:
            t0 = time.time()
            try:
                status, why, rt = run_case(name, v)
                print(f"{status} {name:22s} {v:11s} {time.time() - t0:5.1f}s {books(rt)}", flush=True)
                if why:
                    print(f"     why: {why}", flush=True)
                failed += status == "FAIL"
            except Exception as e:
                failed += 1
                print(f"FAIL {name:22s} {v:11s} {type(e).__name__}: {str(e)[:600]}", flush=True)
                traceback.print_exc(limit=-8)
            for msg in dict.fromkeys(CATCH.msgs):
                print(f"     warn: {msg[:300]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
