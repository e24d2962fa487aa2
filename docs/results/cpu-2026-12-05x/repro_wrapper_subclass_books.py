"""Repro: activations that are __torch_dispatch__ wrapper subclasses (a "logging tensor"
built with torch.Tensor._make_wrapper_subclass, the kind DTensor and float8 training
tensors are) flowing between blocks. Every save is the subclass, which offrecomp never
places (NOTE [What is never placed] in offrecomp/hooks.py): mode="recompute" drops
nothing and replays nothing, with no warning, and the step records book a fraction of
what autograd holds. Gradients are bitwise. docs/reliability.md names this symptom for
nested (jagged) and sparse activations only.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/repro_wrapper_subclass_books.py
Exits 1 while recompute drops nothing without a warning.
"""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._pytree import tree_map  # noqa: E402

import offrecomp  # noqa: E402

H = 16
LOGS: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record):
        LOGS.append(record.getMessage())


logging.getLogger("offrecomp").addHandler(_Collect(logging.WARNING))


class LogTensor(torch.Tensor):
    @staticmethod
    def __new__(cls, elem):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(), dtype=elem.dtype,
                                                device=elem.device, requires_grad=False)
        r.elem = elem
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(t):
            return t.elem if isinstance(t, LogTensor) else t

        def wrap(t):
            return LogTensor(t) if isinstance(t, torch.Tensor) and not isinstance(t, LogTensor) else t

        return tree_map(wrap, func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {})))


class ToLog(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return LogTensor(x.detach())

    @staticmethod
    def backward(ctx, g):
        return g.elem if isinstance(g, LogTensor) else g


class FromLog(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.elem.detach().clone()

    @staticmethod
    def backward(ctx, g):
        return LogTensor(g)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc1 = nn.Linear(H, 4 * H)
        self.fc2 = nn.Linear(4 * H, H)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Model(nn.Module):
    def __init__(self, wrap):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.wrap = wrap

    def forward(self, x):
        if self.wrap:
            x = ToLog.apply(x)
        for b in self.blocks:
            x = b(x)
        if self.wrap:
            x = FromLog.apply(x)
        return x.square().mean()


def held_bytes(model, x) -> int:
    """Bytes of the distinct storages autograd saves in one forward (subclasses unwrapped),
    parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        e = t.elem if isinstance(t, LogTensor) else t
        s = e.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(seen.values())


def main() -> int:
    bad = False
    x = torch.randn(8, 32, H, generator=torch.Generator().manual_seed(0))
    for wrap in (False, True):
        torch.manual_seed(0)
        base = Model(wrap)
        held = held_bytes(copy.deepcopy(base), x)
        for mode in ("keep", "recompute"):
            LOGS.clear()
            m = copy.deepcopy(base)
            rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
            with rt:
                for _ in range(2):
                    m(x).backward()
            s = rt.report().steps[-1]
            rt.close()
            warned = [line[:120] for line in LOGS]
            print(f"{'wrapper' if wrap else 'plain  '} activations, {mode:9s}: autograd holds {held} B; booked peak "
                  f"{s.peak_activation_bytes} B, recomputed {s.recomputed_bytes} B, replays {s.replays}; warnings: {warned}")
            if wrap and mode == "recompute" and s.replays == 0 and not warned:
                bad = True
    print("GAP: recompute silently drops nothing for wrapper-subclass activations, books a fraction" if bad else "OK")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
