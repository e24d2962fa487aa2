"""Third batch: RNG draws in backward around the saved-tensor reads, dirty saved inputs,
requires_grad branches, unused outputs, a parameter returned as is.

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05p/sweep_p3.py [NAME,...|all] [VARIANT,...] [-v]
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
import time
import traceback

_argv = sys.argv
sys.argv = [sys.argv[0]]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_p as S  # noqa: E402

sys.argv = _argv

import torch  # noqa: E402
from sweep import run  # noqa: E402
from torch import nn  # noqa: E402
from torch.autograd import Function  # noqa: E402

from tests.helpers import ZOO_VARIANTS, assert_bitwise, variant_runtime  # noqa: E402

H = S.H
MLP = S.MLP


class GenDrawBwd(Function):
    """forward draws from the block's generator; backward draws from it before reading the
    saves and again between two reads."""

    @staticmethod
    def forward(ctx, x, gen):
        n = torch.randn(x.shape, generator=gen)
        ctx.gen = gen
        ctx.save_for_backward(x, n)
        return x * (1 + 0.1 * n)

    @staticmethod
    def backward(ctx, g):
        a = torch.randn(g.shape, generator=ctx.gen)
        x, n = ctx.saved_tensors
        return g * (1 + 0.1 * n) * (1 + 0.01 * a) + 0 * x, None


class GenDrawBwdTwice(GenDrawBwd):
    @staticmethod
    def backward(ctx, g):
        a = torch.randn(g.shape, generator=ctx.gen)
        n = ctx.saved_tensors[1]
        b = torch.randn(g.shape, generator=ctx.gen)
        x = ctx.saved_tensors[0]
        return g * (1 + 0.1 * n) * (1 + 0.01 * a) * (1 + 0.01 * b) + 0 * x, None


class GenBlock(nn.Module):
    def __init__(self, i: int, fn) -> None:
        super().__init__()
        self.mlp = MLP()
        self.gen = torch.Generator().manual_seed(7 + i)
        self.fn = fn

    def forward(self, x):
        return x + 0.5 * self.fn.apply(self.mlp(x), self.gen)


class GlobalDrawBwd(Function):
    """forward draws a mask from the global RNG; backward draws from the global RNG before
    reading its saves and between two reads."""

    @staticmethod
    def forward(ctx, x):
        m = (torch.rand(x.shape) > 0.3).to(x.dtype)
        ctx.save_for_backward(x, m)
        return x * m

    @staticmethod
    def backward(ctx, g):
        a = torch.randn(g.shape)
        m = ctx.saved_tensors[1]
        b = torch.randn(g.shape)
        x = ctx.saved_tensors[0]
        return g * m * (1 + 0.01 * a) * (1 + 0.01 * b) + 0 * x


def f_global_bwd(m, h):
    return GlobalDrawBwd.apply(h) * m.w


class DirtySaved(Function):
    """Saves its input, then writes it in place and marks it dirty (the save sees the
    written value)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        x.mul_(2).add_(0.5)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * 2 + 0.001 * g * y


def f_dirty_saved(m, h):
    return DirtySaved.apply(h * m.w)


class ReqGradBranch(Function):
    """Saves another value depending on whether the input requires grad."""

    @staticmethod
    def forward(ctx, x, w):
        s = x * 2 if x.requires_grad else x * 3
        ctx.save_for_backward(s, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        s, w = ctx.saved_tensors
        return g * w, (g * s).reshape(-1, H).sum(0)


class ReqGradBlock(nn.Module):
    """The Function sees the block's input: the batch (no grad) at block 0."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.lin = nn.Linear(H, H)
        self.w = nn.Parameter(torch.randn(H) * 0.5 + 1)

    def forward(self, x):
        return self.lin(ReqGradBranch.apply(x, self.w))


class ReqGradPlainBlock(nn.Module):
    """Same branch in the block's own code (not in a Function)."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x):
        s = 2.0 if x.requires_grad else 3.0
        return torch.tanh(self.lin(x * s))


class UnusedOut(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x.exp())
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (e,) = ctx.saved_tensors
        return g * e


class UnusedBlock(nn.Module):
    """A Function whose output the block drops (its node never runs); the block's other
    saves are used."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, x):
        h = self.mlp(x)
        _ = UnusedOut.apply(h)
        return h


class ReturnParam(Function):
    """Returns a parameter as is (and a product)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return w, x * w

    @staticmethod
    def backward(ctx, gw_out, gy):
        x, w = ctx.saved_tensors
        return gy * w, gw_out + (gy * x).reshape(-1, H).sum(0)


def f_return_param(m, h):
    w2, y = ReturnParam.apply(h, m.w)
    return y * w2


MODELS = {
    "gen_draw_bwd": S.stack(lambda i: GenBlock(i, GenDrawBwd)),
    "gen_draw_bwd_twice": S.stack(lambda i: GenBlock(i, GenDrawBwdTwice)),
    "global_draw_bwd": S.fn_block(f_global_bwd),
    "dirty_saved_input": S.fn_block(f_dirty_saved),
    "req_grad_fn": S.stack(ReqGradBlock),
    "req_grad_plain": S.stack(ReqGradPlainBlock),
    "unused_fn_out": S.stack(UnusedBlock),
    "return_param": S.fn_block(f_return_param),
}


# --- gradient penalty through a Function reading its saves twice ---------------------


class SqTwice(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * x * w

    @staticmethod
    def backward(ctx, g):
        x = ctx.saved_tensors[0]
        w = ctx.saved_tensors[1]
        return 2 * x * w * g, (g * x * x).reshape(-1, H).sum(0)


class DB2Block(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.w = nn.Parameter(torch.randn(H) * 0.3 + 1)

    def forward(self, x):
        h = self.mlp(x)
        return x + 0.3 * SqTwice.apply(torch.tanh(h), self.w)


def run_gp2(variants) -> int:
    failed = 0
    for v in variants:
        t0 = time.time()
        try:
            torch.manual_seed(0)
            model = S.stack(DB2Block)().train()
            ref = S.gp_loop(copy.deepcopy(model), 4)
            budget = None
            if v in ("auto_tight", "auto_serve"):
                probe = copy.deepcopy(model)
                keep = variant_runtime(probe, "keep")
                S.gp_loop(probe, 1, keep)
                budget = max(r.peak_activation_bytes for r in keep.report().steps) // 2
            m = copy.deepcopy(model)
            rt = variant_runtime(m, v, budget)
            assert_bitwise(ref, S.gp_loop(m, 4, rt))
            recs = rt.report().steps
            info = (f"replays={[r.replays for r in recs]} peak={[r.peak_activation_bytes for r in recs]} "
                    f"phases={[r.phase.value for r in recs]}")
            print(f"PASS {'gp_read_twice':16s} {v:12s} {time.time() - t0:5.1f}s {info}", flush=True)
        except Exception as e:
            failed += 1
            print(f"FAIL {'gp_read_twice':16s} {v:12s} {type(e).__name__}: {str(e)[:300]}", flush=True)
            if "-v" in sys.argv:
                traceback.print_exc()
    return failed


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "-v"]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ZOO_VARIANTS
    rc = 0
    if only is None or "gp_read_twice" in only:
        rc |= run_gp2(variants)
    rc |= run(MODELS, S.batch)
    sys.exit(1 if rc else 0)
