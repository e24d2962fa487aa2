"""Repro: mode="auto" raises at the end of its first step when a region's input is a
__torch_dispatch__ wrapper subclass (torch.masked.MaskedTensor; a "logging tensor" made
with torch.Tensor._make_wrapper_subclass, the kind DTensor activations are):

    RuntimeError: Attempted to access the data pointer on an invalid python storage.
      offrecomp/planning/profiling.py record_structure -> call.layout()
      offrecomp/state.py RegionCall.layout: t.untyped_storage().data_ptr()

keep, recompute and offload run these models bitwise (they drop nothing: subclass saves
are never placed), and so does torch.utils.checkpoint. RegionCall.layout() tests
``t.layout is torch.strided and not t.is_nested`` before reading the storage pointer;
a wrapper subclass is strided but has no data pointer (offrecomp/trace/ops.py
``_describable`` already tells them apart, naming DTensor).

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/repro_wrapper_subclass_auto.py
Exits 1 while auto raises.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
import warnings

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._pytree import tree_map  # noqa: E402

import offrecomp  # noqa: E402

warnings.filterwarnings("ignore", message="The PyTorch API of MaskedTensors")
H = 16


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
        self.fc = nn.Linear(H, H)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.ln(x)))


class LogModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        x = ToLog.apply(x)
        for b in self.blocks:
            x = b(x)
        return FromLog.apply(x).square().mean()


class MaskedBlock(nn.Module):  # elementwise only: MaskedTensor has no mm or layer_norm
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(H) + 0.5)
        self.shift = nn.Parameter(torch.randn(H) * 0.1)

    def forward(self, x):
        y = x * self.scale + self.shift
        return x + y * y * 0.1


class MaskedModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([MaskedBlock() for _ in range(3)])

    def forward(self, x):
        from torch.masked import masked_tensor
        data, mask = x
        x = masked_tensor(data, mask, requires_grad=True)
        for b in self.blocks:
            x = b(x)
        return (x.get_data() * x.get_mask()).square().mean()


def batch(kind, s):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(4, 6, H, generator=g)
    return (x, torch.rand(4, 6, H, generator=g) > 0.2) if kind == "masked" else x


def grads_of(model):
    out = {}
    for n, p in model.named_parameters():
        g = p.grad
        if isinstance(g, LogTensor):
            g = g.elem
        elif g is not None and type(g) is not torch.Tensor:  # MaskedTensor grads
            g = g.get_data().masked_fill(~g.get_mask(), 0)
        out[n] = None if g is None else g.detach().clone()
    return out


def train(model, rt=None, steps=3):
    res = []
    with rt if rt is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        for s in range(steps):
            model(batch(kind_of(model), s)).backward()
            res.append(grads_of(model))
            for p in model.parameters():
                p.grad = None
    return res


def kind_of(model):
    return "masked" if isinstance(model, MaskedModel) else "log"


def main() -> int:
    bad = False
    for cls in (LogModel, MaskedModel):
        torch.manual_seed(0)
        base = cls()
        ref = train(copy.deepcopy(base))
        for mode in ("keep", "recompute", "offload", "auto"):
            m = copy.deepcopy(base)
            rt = offrecomp.runtime(m, mode=mode, min_bytes=0)
            try:
                got = train(m, rt)
                same = all(torch.equal(a[k], b[k]) for a, b in zip(ref, got) for k in a)
                print(f"{cls.__name__:12s} {mode:9s} {'bitwise' if same else 'NOT BITWISE'}")
                bad |= not same
            except RuntimeError as e:
                print(f"{cls.__name__:12s} {mode:9s} RuntimeError: {e}")
                bad = True
            finally:
                rt.close()
    print("DEFECT: auto raises on wrapper-subclass region inputs" if bad else "OK")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
