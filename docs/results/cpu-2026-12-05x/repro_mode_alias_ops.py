"""Repro: a user TorchDispatchMode entered inside a block's forward that post-processes an
op's output with ``.to(dtype)``, ``.contiguous()`` or ``.reshape()`` (a mode rounding
matmul outputs to bf16: ``out.to(torch.bfloat16).to(torch.float32)``) gives other
gradients under mode="auto" (from the calibration step, and in the measuring step when
replays may serve: ``replay_op_us=0``), NaN in some runs; keep, recompute, offload and
torch.utils.checkpoint are bitwise.

Inside ``__torch_dispatch__`` the code runs below autograd, so ``out.to(dtype)`` reaches
the modes below (offrecomp's recorder and serving mode) as ``aten.to.dtype`` (not
decomposed into ``aten._to_copy``), and likewise ``aten.contiguous`` and ``aten.reshape``.
Their schemas mark the result as a possible alias of the input (``-> Tensor(a)``), so
offrecomp takes them for view ops although here they copy: the structure then gives the
producer (``addmm``) a placeholder, the "view" runs on the placeholder's garbage, and the
placeholder guard skips view ops.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/repro_mode_alias_ops.py
Exits 1 while the defect exists.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint as cp  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import offrecomp  # noqa: E402

aten = torch.ops.aten
H = 16


class RoundMatmuls(TorchDispatchMode):
    """Rounds every addmm output to bf16 precision (values stay float32)."""

    def __init__(self, post):
        super().__init__()
        self.post = post

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is aten.addmm.default:
            out = self.post(out)
        return out


POSTS = {
    "to(bf16).to(f32)": lambda o: o.to(torch.bfloat16).to(torch.float32),
    "to(f64).to(f32) (value-preserving)": lambda o: o.to(torch.float64).to(torch.float32),
    "t().contiguous().t().contiguous()": lambda o: o.t().contiguous().t().contiguous(),
    "aten._to_copy directly (control)": lambda o: aten._to_copy.default(
        aten._to_copy.default(o, dtype=torch.bfloat16), dtype=torch.float32),
}


class Block(nn.Module):
    def __init__(self, post):
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc1 = nn.Linear(H, 2 * H)
        self.fc2 = nn.Linear(2 * H, H)
        self.post = post

    def forward(self, x):
        with RoundMatmuls(self.post):
            return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Model(nn.Module):
    def __init__(self, post):
        super().__init__()
        self.blocks = nn.ModuleList([Block(post) for _ in range(3)])
        self.ckpt = False

    def forward(self, x):
        for b in self.blocks:
            x = cp.checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        return x.square().mean()


def run(model, ctx=None, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    with ctx if ctx is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        for s in range(steps):
            x = torch.randn(4, 6, H, generator=torch.Generator().manual_seed(s))
            model(x).backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            opt.step()
            opt.zero_grad()
    return grads


def worst(ref, got):
    d, nan = 0.0, False
    for a, b in zip(ref, got):
        for k in a:
            if not torch.equal(a[k], b[k]):
                nan |= bool(torch.isnan(b[k]).any())
                d = max(d, (a[k] - b[k]).abs().nan_to_num(float("inf")).max().item())
    return d, nan


def main() -> int:
    torch.manual_seed(0)
    bad = False
    for label, post in POSTS.items():
        base = Model(post)
        ref = run(copy.deepcopy(base))
        ck = copy.deepcopy(base)
        ck.ckpt = True
        results = {"checkpoint": worst(ref, run(ck))}
        for name, kw in [("keep", dict(mode="keep")), ("recompute", dict(mode="recompute")),
                         ("auto", dict(mode="auto")), ("auto, replay_op_us=0", dict(mode="auto", replay_op_us=0))]:
            m = copy.deepcopy(base)
            rt = offrecomp.runtime(m, min_bytes=0, **kw)
            results[name] = worst(ref, run(m, rt))
            rt.close()
        line = ", ".join(f"{k}: {'bitwise' if d == 0 else f'max |diff| {d:.3g}' + (' NaN' if n else '')}"
                         for k, (d, n) in results.items())
        print(f"{label:38s} {line}")
        if "control" not in label and any(d != 0 for d, _ in results.values()):
            bad = True
    print("DEFECT: gradients differ from plain training under auto" if bad else "OK: all bitwise")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
