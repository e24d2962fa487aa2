"""Sweep: functions compiled with torch.compile (inductor, CPU) called inside the eager
blocks (regions) of a ``tests.models.Stack``, under offrecomp variants, compared BITWISE
with plain training (grads, buffers, loss after every step; the plain tensor attributes
the compiled code advances are compared after the last step, and against the number of
steps: they must advance exactly once per step).

Every block has a few eager ops before and after the compiled call (but case
``ret_direct``), dims 16-32, 2-3 blocks, 4 steps (3 for the attribute cases).

Cases
-----
mlp            compiled linear-gelu-linear; eager LayerNorm before, gated residual after.
attn           compiled causal attention softmax(q k^T / sqrt(d)) v with a -inf mask; eager
               q/k/v projections before, eager out-projection + residual after.
dropout        compiled linear-gelu-dropout(p=0.25, training=True); random numbers must
               replay identically.
adv_saved      compiled fn advances a plain tensor attribute ``pos`` (16 floats) in place;
               the block saves y = tanh(x) before the call and saves y again after
               (``x + z * y``).
adv_read       same, but y = sin(x + pos) reads the attribute before the call.
adv_big_read   same as adv_read with pos of 32768 float32 (128 KiB, > READ_COPY_MAX_BYTES);
               the block reads pos[:16]. Expected: bitwise PASS, or (where a replay of the
               first call would need the pre-write value) a RuntimeError naming the region
               (counted as EXPECTED-RAISE). A silent mismatch is a defect.
adv_big_saved  pos of 32768 floats advanced, NOT read before the call (y = tanh(x)).
ema            compiled fn updates a registered buffer in place (EMA:
               buf.mul_(0.9).add_(0.1 * x.detach().mean((0, 1)))) and uses it in its output.
ret_direct     the block returns the compiled MLP's output directly (no eager op after).
two_fns        two different compiled fns (attention then MLP) in one block.
shared3        one compiled MLP object shared by 3 blocks (a fresh compile, its own name).
shared_dims    one compiled MLP shared by 3 blocks whose hidden widths differ (16, 24, 32):
               dynamo recompiles (then goes dynamic) across blocks.
autocast       block calls the compiled MLP under torch.autocast('cpu', bfloat16), casts
               the result back to float32.

Variants: keep (control), recompute, offload, auto, auto_tight (tests/helpers.py) by default;
auto_serve when named (out_all_auto_serve.txt: `sweep_cfn.py all auto_serve`).

For every (case, variant): plain run twice (determinism), runtime run on a deep copy,
bitwise compare; print replays per step, recomputed/kept bytes, phases, and the
offrecomp warnings (logger ``offrecomp``) seen.

Run (from /tmp/sweep_cfn, one process at a time):
  cd /tmp/sweep_cfn && OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 \
    TORCHINDUCTOR_CACHE_DIR=/tmp/sweep_cfn/inductor_cache NUMBA_CACHE_DIR=/tmp/sweep_cfn/numba_cache \
    timeout 300 /work/main/.venv/bin/python sweep_cfn.py CASE[,CASE...]|all [VARIANT,...]
The outputs in this folder were made one case per process:
  for c in mlp attn dropout adv_saved adv_read adv_big_read adv_big_saved ema ret_direct \
           two_fns shared3 shared_dims autocast; do ... sweep_cfn.py $c > out_$c.txt 2>&1; done
"""

from __future__ import annotations

import copy
import logging
import math
import os
import sys
import time
import traceback

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/sweep_cfn/inductor_cache")
os.environ.setdefault("NUMBA_CACHE_DIR", "/tmp/sweep_cfn/numba_cache")
sys.path.insert(0, "/work/main")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import offrecomp  # noqa: E402
import offrecomp.diagnostics  # noqa: E402
from tests import models  # noqa: E402
from tests.helpers import assert_bitwise, tight_budget, train, variant_runtime  # noqa: E402

torch.set_num_threads(1)

# ---------------------------------------------------------------- compiled functions


def _mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def _mlp2(x, w1, b1, w2, b2):  # a distinct function for shared3 / shared_dims
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def _mlp3(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def _attn(q, k, v):
    t, d = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _drop(x, w, b):
    return F.dropout(F.gelu(F.linear(x, w, b)), 0.25, training=True)


def _advance(x, w, b, pos):
    pos.add_(1.0)
    return torch.tanh(F.linear(x, w, b) + pos)


def _advance_big(x, w, b, pos):
    pos.add_(1.0)
    return torch.tanh(F.linear(x, w, b) + pos[: x.shape[-1]])


def _ema(x, w, b, buf):
    buf.mul_(0.9).add_(0.1 * x.detach().mean((0, 1)))
    return torch.tanh(F.linear(x, w, b)) + buf


C = {name: torch.compile(fn, backend="inductor") for name, fn in {
    "mlp": _mlp, "mlp2": _mlp2, "mlp3": _mlp3, "attn": _attn, "drop": _drop,
    "advance": _advance, "advance_big": _advance_big, "ema": _ema}.items()}

# ---------------------------------------------------------------- blocks


class MlpBlock(nn.Module):
    def __init__(self, fn, h=16, hid=32):
        super().__init__()
        self.fn, self.ln = fn, nn.LayerNorm(h)
        self.fc1, self.fc2 = nn.Linear(h, hid), nn.Linear(hid, h)

    def forward(self, x):
        y = self.ln(x)
        z = self.fn(y, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)
        return x + torch.sigmoid(z) * y


class AttnBlock(nn.Module):
    def __init__(self, fn, h=16):
        super().__init__()
        self.fn, self.ln = fn, nn.LayerNorm(h)
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x):
        y = self.ln(x)
        a = self.fn(torch.tanh(self.q(y)), self.k(y), self.v(y))
        return x + self.o(F.gelu(a))


class DropBlock(nn.Module):
    def __init__(self, fn, h=16):
        super().__init__()
        self.fn, self.ln, self.fc = fn, nn.LayerNorm(h), nn.Linear(h, h)

    def forward(self, x):
        y = torch.tanh(self.ln(x))
        return x + self.fn(y, self.fc.weight, self.fc.bias) * y


class AdvBlock(nn.Module):
    def __init__(self, fn, reads_pos, h=16, n=16):
        super().__init__()
        self.fn, self.reads_pos, self.fc = fn, reads_pos, nn.Linear(h, h)
        self.pos = torch.zeros(n)  # a plain attribute, not a buffer
        self.h = h

    def forward(self, x):
        y = torch.sin(x + self.pos[: self.h]) if self.reads_pos else torch.tanh(x)
        z = self.fn(y, self.fc.weight, self.fc.bias, self.pos)
        return x + z * y


class EmaBlock(nn.Module):
    def __init__(self, fn, h=16):
        super().__init__()
        self.fn, self.ln, self.fc = fn, nn.LayerNorm(h), nn.Linear(h, h)
        self.register_buffer("ema", torch.zeros(h))

    def forward(self, x):
        y = torch.tanh(self.ln(x))
        z = self.fn(y, self.fc.weight, self.fc.bias, self.ema)
        return x + z * y


class RetDirectBlock(nn.Module):
    def __init__(self, fn, h=16):
        super().__init__()
        self.fn, self.ln = fn, nn.LayerNorm(h)
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)

    def forward(self, x):
        y = torch.tanh(self.ln(x)) * 1.5
        return self.fn(y, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)


class TwoFnBlock(nn.Module):
    def __init__(self, attn, mlp, h=16):
        super().__init__()
        self.attn_blk, self.mlp_blk = AttnBlock(attn, h), MlpBlock(mlp, h)

    def forward(self, x):
        return self.mlp_blk(self.attn_blk(x))


class AutocastBlock(nn.Module):
    def __init__(self, fn, h=16):
        super().__init__()
        self.fn, self.ln = fn, nn.LayerNorm(h)
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)

    def forward(self, x):
        y = torch.tanh(self.ln(x))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = self.fn(y, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)
        return x + z.float() * y


def _b(shape):
    return lambda s: torch.randn(*shape, generator=torch.Generator().manual_seed(1000 + s))


B16 = _b((2, 8, 16))

# name -> (factory, batch, steps, attribute-advancing?)
CASES = {
    "mlp": (lambda: models.Stack([MlpBlock(C["mlp"]) for _ in range(3)]), B16, 4, False),
    "attn": (lambda: models.Stack([AttnBlock(C["attn"]) for _ in range(3)]), B16, 4, False),
    "dropout": (lambda: models.Stack([DropBlock(C["drop"]) for _ in range(3)]), B16, 4, False),
    "adv_saved": (lambda: models.Stack([AdvBlock(C["advance"], False) for _ in range(2)]), B16, 3, True),
    "adv_read": (lambda: models.Stack([AdvBlock(C["advance"], True) for _ in range(2)]), B16, 3, True),
    "adv_big_read": (lambda: models.Stack([AdvBlock(C["advance_big"], True, n=32768) for _ in range(2)]), B16, 3, True),
    "adv_big_saved": (lambda: models.Stack([AdvBlock(C["advance_big"], False, n=32768) for _ in range(2)]), B16, 3, True),
    "ema": (lambda: models.Stack([EmaBlock(C["ema"]) for _ in range(3)]), B16, 4, False),
    "ret_direct": (lambda: models.Stack([RetDirectBlock(C["mlp"]) for _ in range(3)]), B16, 4, False),
    "two_fns": (lambda: models.Stack([TwoFnBlock(C["attn"], C["mlp"]) for _ in range(2)]), B16, 4, False),
    "shared3": (lambda: models.Stack([MlpBlock(C["mlp2"]) for _ in range(3)]), B16, 4, False),
    "shared_dims": (lambda: models.Stack([MlpBlock(C["mlp3"], 16, hid) for hid in (16, 24, 32)]), B16, 4, False),
    "autocast": (lambda: models.Stack([AutocastBlock(C["mlp"]) for _ in range(3)]), B16, 4, False),
}

VARIANTS = ["keep", "recompute", "offload", "auto", "auto_tight"]


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


def _attrs(model):
    return [b.pos.clone() for b in model.blocks if hasattr(b, "pos")]


def run_case(name, variant):
    factory, batch, steps, adv = CASES[name]
    torch.manual_seed(0)
    model = factory().train()
    p1, p2 = copy.deepcopy(model), copy.deepcopy(model)
    ref = train(p1, batch, steps=steps)
    ref2 = train(p2, batch, steps=steps)
    assert_bitwise(ref, ref2)  # the plain run is deterministic
    budget = tight_budget(model, batch) if variant in ("auto_tight", "auto_serve") else None
    m = copy.deepcopy(model)
    offrecomp.diagnostics.clear_warnings()
    CATCH.msgs.clear()
    rt = variant_runtime(m, variant, budget)
    got = None
    try:
        got = train(m, batch, rt, steps=steps)
    except RuntimeError as e:
        if name == "adv_big_read" and "region 'blocks." in str(e):
            return "EXPECTED-RAISE", f"{type(e).__name__}: {str(e)[:400]}", rt
        raise
    problems = []
    try:
        assert_bitwise(ref, got)
    except AssertionError as e:
        problems.append(f"MISMATCH {e}")
    if adv:
        for i, (a, b) in enumerate(zip(_attrs(p1), _attrs(m))):
            if not torch.equal(a, b):
                problems.append(f"blocks.{i}.pos runtime {float(b[0])} plain {float(a[0])}")
            if float(a[0]) != steps:
                problems.append(f"plain blocks.{i}.pos {float(a[0])} != {steps}")
    recs = rt.report().steps
    if len(recs) != steps:
        problems.append(f"{len(recs)} step records for {steps} steps")
    for s in recs:
        if s.peak_activation_bytes <= 0 or s.kept_bytes < 0 or s.recomputed_bytes < 0:
            problems.append(f"odd books step {s.step}: peak {s.peak_activation_bytes} kept {s.kept_bytes}")
    if variant == "offload" and not all(s.offloaded_bytes > 0 for s in recs):
        problems.append("offload variant offloaded nothing in some step")
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
                print(f"{status} {name:14s} {v:11s} {time.time() - t0:5.1f}s {books(rt)}", flush=True)
                if why:
                    print(f"     why: {why}", flush=True)
                failed += status == "FAIL"
            except Exception as e:
                failed += 1
                print(f"FAIL {name:14s} {v:11s} {type(e).__name__}: {str(e)[:500]}", flush=True)
                traceback.print_exc(limit=-6)
            for msg in dict.fromkeys(CATCH.msgs):
                print(f"     warn: {msg[:300]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
