"""Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/cases_sub.py all [CASES [VARIANTS]] \
    | grep -v '^USDT' > docs/results/cpu-2026-12-05x/out_sub.txt

Sweep x, part B: tensor subclasses between and inside the blocks: __torch_function__
subclasses (plain, carrying metadata, changing results), __torch_dispatch__ wrapper
subclasses (logging, rounding) as activations, parameter subclasses (plain, counting
__torch_function__, a wrapper subclass parameter), MaskedTensor, nested (jagged) tensors.
Named tensors are gone from torch 2.13 (no ``refine_names``, factories take no names)."""

from __future__ import annotations

import collections
from typing import Any

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py

from harness import Block, Case, H, Stack, main, nn, torch, F, _gen
from torch.utils._pytree import tree_map

aten = torch.ops.aten
MM = {aten.mm.default, aten.addmm.default, aten.bmm.default}
COUNTS: collections.Counter = collections.Counter()


def stack(blocks=None, n=3, **kw) -> Stack:
    return Stack(blocks if blocks is not None else [Block() for _ in range(n)], **kw)


# --- __torch_function__ subclasses ------------------------------------------------------

class TagTensor(torch.Tensor):
    """Default __torch_function__: results stay TagTensor."""


class AsSub(nn.Linear):
    def __init__(self, cls, **attrs):
        super().__init__(H, H)
        self.cls, self.attrs = cls, attrs

    def forward(self, x):
        y = super().forward(x).as_subclass(self.cls)
        for k, v in self.attrs.items():
            setattr(y, k, v)
        return y


def tfsub_act() -> Case:
    return Case(stack(stem=AsSub(TagTensor)))


class MetaTensor(torch.Tensor):
    """Carries ``scale`` to every result of an op on it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        scale = None
        for a in args:
            if isinstance(a, MetaTensor) and hasattr(a, "scale"):
                scale = a.scale
                break
        if scale is not None:
            def put(t):
                if isinstance(t, MetaTensor):
                    t.scale = scale
                return t
            out = tree_map(put, out)
        return out


class ScaleReader(Block):
    def forward(self, x):
        s = getattr(x, "scale", 1.0)
        return super().forward(x) * s


def tfsub_meta() -> Case:
    c = Case(stack([ScaleReader() for _ in range(3)], stem=AsSub(MetaTensor, scale=0.75)))
    return c


class BareTag(torch.Tensor):
    """Default __torch_function__, attribute set on the stem output only: a block's input
    has it, its output has not."""


def tfsub_attr_input() -> Case:
    return Case(stack([ScaleReader() for _ in range(3)], stem=AsSub(BareTag, scale=0.75)))


class HalfLinear(torch.Tensor):
    """F.linear on it gives half the result."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if func is F.linear:
            out = out * 0.5
        return out


def tfsub_scale() -> Case:
    return Case(stack(stem=AsSub(HalfLinear)))


# --- __torch_dispatch__ wrapper subclasses -------------------------------------------------

class WrapTensor(torch.Tensor):
    ROUND = False
    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem):
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, device=elem.device, requires_grad=False,
        )
        r.elem = elem
        return r

    def __repr__(self):
        return f"{type(self).__name__}({self.elem!r})"

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        COUNTS[f"{cls.__name__}.ops"] += 1

        def unwrap(t):
            return t.elem if isinstance(t, WrapTensor) else t

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        if cls.ROUND and func in MM:
            out = out.to(torch.bfloat16).to(torch.float32)

        def wrap(t):
            return cls(t) if isinstance(t, torch.Tensor) and not isinstance(t, WrapTensor) else t

        return tree_map(wrap, out)


class LogTensor(WrapTensor):
    pass


class RoundTensor(WrapTensor):
    ROUND = True


class ToWrap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cls):
        return cls(x.detach())

    @staticmethod
    def backward(ctx, g):
        return (g.elem if isinstance(g, WrapTensor) else g), None


class FromWrap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.cls = type(x)
        return x.elem.detach().clone()

    @staticmethod
    def backward(ctx, g):
        return ctx.cls(g)


class WrapStem(nn.Linear):
    def __init__(self, cls):
        super().__init__(H, H)
        self.cls = cls

    def forward(self, x):
        return ToWrap.apply(super().forward(x), self.cls)


def _dsub(cls) -> Case:
    c = Case(stack(stem=WrapStem(cls), head=FromWrap.apply))
    COUNTS.clear()
    c.counts = COUNTS
    return c


def dsub_log() -> Case:
    return _dsub(LogTensor)


def dsub_round() -> Case:
    return _dsub(RoundTensor)


def dsub_log_loss() -> Case:
    """The wrapper reaches the loss (no unwrapping head)."""
    c = Case(stack(stem=WrapStem(LogTensor)))
    COUNTS.clear()
    c.counts = COUNTS
    return c


# --- parameter subclasses ------------------------------------------------------------------

class MyParam(nn.Parameter):
    pass


def _swap_params(model: nn.Module, cls, names=("fc1", "fc2")) -> None:
    for b in model.blocks:
        for n in names:
            lin = getattr(b, n)
            lin.weight = cls(lin.weight.detach().clone())


def psub_plain() -> Case:
    c = Case(stack())
    _swap_params(c.model, MyParam)
    return c


class CountParam(nn.Parameter):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        COUNTS["param.tf"] += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def psub_tf() -> Case:
    c = Case(stack())
    _swap_params(c.model, CountParam)
    COUNTS.clear()
    c.counts = COUNTS
    return c


class ScaledWeight(torch.Tensor):
    """A weight stored as int8-like rounded values times a scale: every op sees the
    dequantized value (a wrapper subclass parameter, as in weight-only quantization)."""

    @staticmethod
    def __new__(cls, elem, requires_grad=True):
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), dtype=elem.dtype, device=elem.device,
            requires_grad=requires_grad,
        )
        r.elem = elem
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return f"ScaledWeight({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        COUNTS["sw.ops"] += 1

        def unwrap(t):
            if isinstance(t, ScaledWeight):
                e = t.elem
                s = e.abs().amax() / 127
                return (e / s).round() * s
            return t

        if func in (aten.detach.default, aten.clone.default, aten.alias.default) and isinstance(args[0], ScaledWeight):
            return ScaledWeight(func(args[0].elem), requires_grad=False)
        if func in (aten.add_.Tensor, aten.sub_.Tensor, aten.mul_.Tensor, aten.copy_.default) and isinstance(args[0], ScaledWeight):
            a = args[0]
            func(a.elem, *tree_map(lambda t: t.elem if isinstance(t, ScaledWeight) else t, args[1:]), **(kwargs or {}))
            return a
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


def psub_wrapper() -> Case:
    c = Case(stack())
    for b in c.model.blocks:
        b.fc1.weight = nn.Parameter(ScaledWeight(b.fc1.weight.detach().clone(), requires_grad=False))
    COUNTS.clear()
    c.counts = COUNTS
    return c


# --- MaskedTensor ----------------------------------------------------------------------------

class MaskedBlock(nn.Module):
    """Elementwise only (MaskedTensor has no mm/layer_norm/gelu, and no tanh backward)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(H) + 0.5)
        self.shift = nn.Parameter(torch.randn(H) * 0.1)

    def forward(self, x):
        y = x * self.scale + self.shift
        return x + y * y * 0.1


class MaskedStem(nn.Module):
    """The batch as a MaskedTensor leaf that requires grad (a MaskedTensor times a plain
    parameter fails in torch's backward: 'MaskedTensor' object has no attribute
    '_masked_mask')."""

    def forward(self, x):
        from torch.masked import masked_tensor
        data, mask = x
        return masked_tensor(data, mask, requires_grad=True)


def _masked_loss_head(x):
    from torch.masked import MaskedTensor
    return x.get_data() * x.get_mask() if isinstance(x, MaskedTensor) else x


def masked() -> Case:
    blocks = [MaskedBlock() for _ in range(3)]
    c = Case(Stack(blocks, stem=MaskedStem(), head=_masked_loss_head))
    c.batch = lambda s: (torch.randn(4, 6, H, generator=_gen(s)), torch.rand(4, 6, H, generator=_gen(s + 1)) > 0.2)

    def conv(t):
        from torch.masked import MaskedTensor
        if t is None:
            return None
        if isinstance(t, MaskedTensor):
            return (t.get_data() * t.get_mask()).detach().clone()
        return t.detach().clone()

    c.to_plain = conv
    c.opt = lambda m: _MaskedSGD(m.parameters())
    return c


class _MaskedSGD:
    """Parameter grads come back as MaskedTensors; SGD's add_(alpha=) refuses them."""

    def __init__(self, params):
        self.params = list(params)

    @torch.no_grad()
    def step(self):
        from torch.masked import MaskedTensor
        for p in self.params:
            g = p.grad
            if isinstance(g, MaskedTensor):
                g = g.get_data().masked_fill(~g.get_mask(), 0)
            p.sub_(0.1 * g)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


# --- nested jagged tensors between blocks --------------------------------------------------

class NJTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc1 = nn.Linear(H, 2 * H)
        self.fc2 = nn.Linear(2 * H, H)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.fc2(self.drop(F.gelu(self.fc1(self.ln(x)))))


class NJTStem(nn.Linear):
    def __init__(self):
        super().__init__(H, H)

    def forward(self, xs):
        nt = torch.nested.nested_tensor(list(xs), layout=torch.jagged)
        return super().forward(nt)


def njt() -> Case:
    c = Case(Stack([NJTBlock() for _ in range(3)], stem=NJTStem(), head=lambda x: x.values()))
    c.batch = lambda s: [torch.randn(n, H, generator=_gen(s + n)) for n in (3, 7, 5)]
    return c


CASES = {f.__name__: f for f in [
    tfsub_act, tfsub_meta, tfsub_attr_input, tfsub_scale,
    dsub_log, dsub_round, dsub_log_loss,
    psub_plain, psub_tf, psub_wrapper,
    masked, njt,
]}

if __name__ == "__main__":
    main(CASES)
