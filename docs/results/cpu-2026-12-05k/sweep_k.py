"""PyTorch features used inside model blocks, under every zoo variant, gradients compared
bitwise with plain training (tests/helpers.check_variant, through
../cpu-2026-12-05/sweep.py).

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05k/sweep_k.py [NAME,NAME ...|all] [VARIANT,...] [-v]

torch only (2.13.0+cpu). Tiny models: 3 or 4 blocks in an ``nn.ModuleList`` (the
regions), 4 SGD steps each, on the CPU. offrecomp's log records (and Python warnings)
are printed as ``LOG`` lines before the PASS/FAIL line of the run that gave them.

What the blocks bring, beyond tests/offrecomp/test_model_zoo.py, test_layout_zoo.py and
the earlier sweeps:

* ``torch.nn.utils.parametrize``: ``orthogonal`` (matrix_exp, cayley, householder maps),
  ``parametrizations.weight_norm`` on Conv1d (dim 0 and None) next to the old hook-based
  ``torch.nn.utils.weight_norm``, a custom parametrization used twice under
  ``parametrize.cached()`` inside the block's forward, one with a ``right_inverse``
  returning two originals (magnitude and direction);
* ``torch.nn.utils.prune``: L1 unstructured on Linear weights and biases, Ln structured
  on Conv2d weights (a forward pre-hook computes ``weight = weight_orig * weight_mask``);
* quantization-aware training: ``prepare_qat`` on linear blocks (fused moving-average
  observer fake-quant, buffers updated in the forward) and on fused conv-bn-relu blocks
  (``fuse_modules_qat``, non-fused ``FakeQuantize`` observers, qconfig version 0);
  ``fake_quantize_per_tensor_affine`` / ``per_channel`` and the learnable op directly;
* module hooks: forward pre-hooks and forward hooks with kwargs on blocks and on
  submodules inside them, ``always_call`` hooks, ``register_full_backward_pre_hook`` on
  blocks and ``register_full_backward_hook`` on submodules inside blocks,
  ``Tensor.register_hook`` inside the forward scaling a gradient, a hook counting its
  calls in a Python attribute (the count sets the scale);
* custom ``autograd.Function``: ``save_for_backward`` with non-tensor ctx attributes,
  ``mark_dirty`` (in place on a fresh tensor), ``mark_non_differentiable`` (sort indices),
  ``once_differentiable``, ``setup_context`` style with ``generate_vmap_rule``, a Function
  saving an intermediate it created;
* sparse gradients: ``nn.Embedding(sparse=True)`` and ``nn.EmbeddingBag`` (sum, with
  ``per_sample_weights``, sparse) inside blocks;
* RNNs: LSTM over ``pack_padded_sequence(enforce_sorted=False)`` with ``proj_size``,
  bidirectional 2-layer GRU with dropout between layers, ``nn.RNN(nonlinearity='relu')``;
* ``nn.MultiheadAttention`` with ``key_padding_mask`` and need_weights True / False,
  ``TransformerEncoderLayer(norm_first=True, activation='gelu')`` with a padding mask,
  ``TransformerDecoderLayer`` with memory and a causal mask;
* channels_last convolutions and transposed convolutions, GroupNorm, InstanceNorm2d with
  ``track_running_stats``, ``SyncBatchNorm.convert_sync_batchnorm`` (no process group),
  ``nn.Upsample``/``interpolate`` with ``align_corners``, pixel (un)shuffle, unfold/fold;
* dtype detours: float64 and float16/bfloat16 inside blocks, cast back; ``torch.autocast
  ('cpu', bfloat16)`` around some blocks only;
* in place: ``add_`` on a fresh tensor after saving a view of another, ``torch.where(...,
  out=)`` on a no-grad buffer, ``index_put_(accumulate=True)``, ``scatter_reduce``
  (amax, mean);
* ``torch.func``: ``vmap`` and ``jacrev`` inside a block.

Second batch, edges of the above: ``Embedding(max_norm=...)`` (renormalises its weight
in place in the forward), the old hook-based ``spectral_norm`` (power iteration on
buffers in a pre-hook), one orthogonal-parametrized Linear shared by every block, with
and without ``parametrize.cached()`` around the model's loop (documented limit), a
Function returning its input unchanged plus an output it made with
``set_materialize_grads(False)``, forward hooks tapping inner activations into a list
the loss reads and a counter hook guarded by ``offrecomp.in_replay()``, GRU blocks
handing their hidden state on in a tuple with an LSTMCell loop, EmbeddingBag max with
``padding_idx`` and ``include_last_offset`` next to an Embedding shared by the blocks
with ``scale_grad_by_freq``, BatchNorm with ``momentum=None`` and a FakeQuantize whose
observer the forward disables after two steps, grad-mode changes (no_grad, enable_grad
inside it, inference_mode, ``set_default_dtype``) inside a block, and ``mark_dirty`` on
the block's own input.

Third batch: ``torch.func.jacfwd``, a JVP through ``torch.autograd.forward_ad`` inside
the forward, ``save_on_cpu`` and a user's own ``saved_tensors_hooks`` pair around part
of a block, and model ensembling (``stack_module_state`` + ``vmap`` over
``functional_call``) inside a block.

``NO_DROP`` pairs (recompute, auto_tight, auto_serve of models offrecomp keeps by
design) are left out.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))

import torch
import torch.nn.functional as F
from sweep import run
from torch import nn
from torch.nn.utils import parametrizations as P
from torch.nn.utils import parametrize, prune

H = 16


class _Print(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        print(f"LOG  {record.name}: {record.getMessage()[:400]}", flush=True)


logging.getLogger("offrecomp").addHandler(_Print(logging.WARNING))
logging.getLogger("offrecomp").propagate = False
logging.captureWarnings(True)
logging.getLogger("py.warnings").addHandler(_Print(logging.WARNING))
logging.getLogger("py.warnings").propagate = False
warnings.simplefilter("default")
warnings.filterwarnings("ignore", category=DeprecationWarning, message="torch.ao.quantization")
warnings.filterwarnings("ignore", message="Please use quant_min and quant_max")


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _loss(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    w = torch.arange(x.numel(), dtype=x.dtype).sin().view_as(x)
    return x.square().mean() + (x * w).mean()


class Stack(nn.Module):
    """An optional stem, the blocks (the regions) in turn, then a scalar loss; extra batch
    entries go to every block."""

    def __init__(self, blocks: list[nn.Module], stem: nn.Module | None = None) -> None:
        super().__init__()
        self.stem = stem if stem is not None else nn.Identity()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, batch: Any) -> torch.Tensor:
        x, *extra = batch if isinstance(batch, tuple) else (batch,)
        x = self.stem(x)
        for b in self.blocks:
            x = b(x, *extra)
        return _loss(x)


def stack(block: Callable[[int], nn.Module], n: int = 3, stem: Callable[[], nn.Module] | None = None):
    return lambda: Stack([block(i) for i in range(n)], stem() if stem else None)


def randn(*shape: int) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randn(*shape, generator=_gen(s))


class MLP(nn.Module):
    def __init__(self, h: int = H) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 2 * h)
        self.fc2 = nn.Linear(2 * h, h)

    def forward(self, x: torch.Tensor, *_: Any) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


# --- parametrize ----------------------------------------------------------------------


class OrthoBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        maps = ["matrix_exp", "cayley", "householder"]
        self.q = P.orthogonal(nn.Linear(H, H), orthogonal_map=maps[i % 3])
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(torch.tanh(self.q(self.ln(x))))


class WeightNormConvBlock(nn.Module):
    """New-style weight norm (a parametrization) on two Conv1d, dim 0 and dim None, and the
    old hook-based ``torch.nn.utils.weight_norm`` (a forward pre-hook sets ``weight``)."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.a = P.weight_norm(nn.Conv1d(8, 8, 3, padding=1), dim=0)
        self.b = P.weight_norm(nn.Conv1d(8, 8, 3, padding=1), dim=None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.c = torch.nn.utils.weight_norm(nn.Conv1d(8, 8, 1))
        # the hook recomputes it at each call; a detached leaf lets the model be deep-copied
        self.c.weight = self.c.weight.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.c(F.silu(self.b(F.silu(self.a(x)))))


class Symmetric(nn.Module):
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return X.triu() + X.triu(1).transpose(-1, -2)


class CachedBlock(nn.Module):
    """A custom parametrization whose value is used twice under ``parametrize.cached()``
    inside the block's forward (computed once per call)."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.lin = nn.Linear(H, H)
        parametrize.register_parametrization(self.lin, "weight", Symmetric())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with parametrize.cached():
            y = torch.tanh(self.lin(self.ln(x)))
            z = F.linear(y, self.lin.weight)  # the cached symmetric weight again
        return x + z


class MagDir(nn.Module):
    """W = m * V / |V| (row-wise), two originals from ``right_inverse``."""

    def forward(self, m: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        return m * V / V.norm(dim=1, keepdim=True)

    def right_inverse(self, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return W.norm(dim=1, keepdim=True), W


class Softplus(nn.Module):
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return F.softplus(X)

    def right_inverse(self, W: torch.Tensor) -> torch.Tensor:
        return W.expm1().log()


class RightInverseBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc1 = nn.Linear(H, 2 * H)
        parametrize.register_parametrization(self.fc1, "weight", MagDir())
        self.fc2 = nn.Linear(2 * H, H)
        with torch.no_grad():
            self.fc2.weight.abs_().add_(1e-3)
        parametrize.register_parametrization(self.fc2, "weight", Softplus())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.1 * self.fc2(F.gelu(self.fc1(self.ln(x))))


# --- prune ----------------------------------------------------------------------------


def _leaf_attrs(m: nn.Module) -> nn.Module:
    """prune sets ``weight = weight_orig * weight_mask`` (not a leaf) at once, and its
    pre-hook again at each call: a detached leaf meanwhile lets the model be deep-copied."""
    for mod in m.modules():
        for k, v in list(vars(mod).items()):
            if isinstance(v, torch.Tensor) and not v.is_leaf:
                setattr(mod, k, v.detach())
    return m


def pruned_mlp(i: int) -> nn.Module:
    b = MLP()
    prune.l1_unstructured(b.fc1, "weight", amount=0.3)
    prune.l1_unstructured(b.fc2, "weight", amount=0.5)
    prune.l1_unstructured(b.fc2, "bias", amount=0.25)
    return _leaf_attrs(b)


class ConvBlock(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.relu(self.bn(self.conv1(x))))


def pruned_conv(i: int) -> nn.Module:
    b = ConvBlock()
    prune.ln_structured(b.conv1, "weight", amount=0.25, n=2, dim=0)
    prune.ln_structured(b.conv2, "weight", amount=0.5, n=1, dim=1)
    return _leaf_attrs(b)


# --- quantization-aware training ------------------------------------------------------


class QMLP(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(H, 2 * H)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(2 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.relu(self.fc1(x)))


def qat_linear() -> nn.Module:
    m = stack(QMLP, 3)()
    m.blocks.qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm")
    return torch.ao.quantization.prepare_qat(m.train(), inplace=False)


class QConv(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.relu(self.bn(self.conv(x)))


def qat_conv() -> nn.Module:
    m = stack(QConv, 3)().train()
    for b in m.blocks:
        torch.ao.quantization.fuse_modules_qat(b, [["conv", "bn", "relu"]], inplace=True)
    m.blocks.qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm", version=0)
    return torch.ao.quantization.prepare_qat(m, inplace=False)


class FakeQuantBlock(nn.Module):
    """The fake-quant ops called directly: per tensor (float and tensor qparams), per
    channel on the weight, and the learnable per-tensor op with a learned scale."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(H, 2 * H)
        self.fc2 = nn.Linear(2 * H, H)
        self.scale = nn.Parameter(torch.tensor([0.05]))
        self.zp = nn.Parameter(torch.tensor([0.0]))
        self.register_buffer("s2", torch.tensor([0.04]))
        self.register_buffer("z2", torch.tensor([3], dtype=torch.int32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = torch.fake_quantize_per_tensor_affine(x, 0.05, 0, -128, 127)
        w = torch.fake_quantize_per_channel_affine(
            self.fc1.weight, self.fc1.weight.detach().abs().amax(1) / 127, torch.zeros(2 * H, dtype=torch.int32), 0, -128, 127
        )
        h = F.relu(F.linear(x0, w, self.fc1.bias))
        h = torch._fake_quantize_learnable_per_tensor_affine(h, self.scale, self.zp, 0, 255, 1.0)
        y = self.fc2(h)
        return x + torch.fake_quantize_per_tensor_affine(y, self.s2, self.z2, -128, 127)


# --- hooks ----------------------------------------------------------------------------


class KwBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor, *, gain: float = 1.0) -> torch.Tensor:
        return self.mlp(x) * gain


class KwStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(KwBlock(i) for i in range(3))
        for b in self.blocks:
            b.register_forward_pre_hook(lambda m, a, kw: ((a[0] * 0.9,), {**kw, "gain": 1.1}), with_kwargs=True)
            b.register_forward_hook(lambda m, a, kw, out: out + 0.05 * a[0] * kw["gain"], with_kwargs=True)
            b.register_forward_hook(lambda m, a, out: out * 0.98, always_call=True)
            # hooks on submodules inside the block
            b.mlp.fc1.register_forward_pre_hook(lambda m, a: (F.layer_norm(a[0], a[0].shape[-1:]),))
            b.mlp.fc2.register_forward_hook(lambda m, a, out: torch.tanh(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, gain=1.0)
        return _loss(x)


def _half_grad_out(m: nn.Module, gout: tuple) -> tuple:
    return tuple(None if g is None else g * 0.5 for g in gout)


def _clip_grad_in(m: nn.Module, gin: tuple, gout: tuple) -> tuple:
    return tuple(None if g is None else g.clamp(-0.01, 0.01) for g in gin)


def bwd_hooks() -> nn.Module:
    m = stack(lambda i: MLP(), 4)()
    for b in m.blocks:
        b.register_full_backward_pre_hook(_half_grad_out)
        b.fc1.register_full_backward_hook(_clip_grad_in)
        b.ln.register_full_backward_pre_hook(lambda mod, go: (go[0] * 2.0,))
    return m


class TensorHookBlock(nn.Module):
    """``register_hook`` on an intermediate inside the forward scales its gradient; a second
    hook counts its calls in a Python attribute, and the count sets its scale."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.count = 0

    def _counted(self, g: torch.Tensor) -> torch.Tensor:
        self.count += 1
        return g * (1.0 + 0.25 * (self.count % 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mlp.fc1(self.mlp.ln(x))
        if h.requires_grad:
            h.register_hook(lambda g: g * 0.5)
        a = F.gelu(h)
        if a.requires_grad:
            a.register_hook(self._counted)
        return x + self.mlp.fc2(a)


# --- custom autograd.Function ---------------------------------------------------------


class ScaledTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, alpha: float, mode: str) -> torch.Tensor:
        y = torch.tanh(x * w) * alpha
        ctx.save_for_backward(x, w, y)
        ctx.alpha, ctx.mode, ctx.shape = alpha, mode, x.shape
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        x, w, y = ctx.saved_tensors
        assert ctx.mode == "fast" and ctx.shape == x.shape
        t = y / ctx.alpha
        d = g * ctx.alpha * (1 - t * t)
        return d * w, (d * x).sum(dim=tuple(range(x.dim() - 1))), None, None


class CtxAttrBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.w = nn.Parameter(torch.randn(H) * 0.5 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(ScaledTanh.apply(x, self.w, 0.9, "fast"))


class InplaceSquare(torch.autograd.Function):
    """x.mul_(x) in place, marked dirty; saves the input's value before the write."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.clone())
        x.mul_(x)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x0,) = ctx.saved_tensors
        return 2 * x0 * g


class DirtyBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mlp.fc1(self.mlp.ln(x)) * 0.5  # fresh, not a leaf
        h = InplaceSquare.apply(h)
        return x + self.mlp.fc2(h)


class SortTopk(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v, idx = x.sort(dim=-1, descending=True)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(idx)
        return v, idx

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, gv: torch.Tensor, gidx: Any) -> torch.Tensor:
        (idx,) = ctx.saved_tensors
        return torch.zeros_like(gv).scatter_(-1, idx, gv)


class SortBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.pos = nn.Parameter(torch.linspace(1, 0, H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v, idx = SortTopk.apply(self.mlp(x))
        return x + v * self.pos + 0.01 * idx.float()


class Cube(torch.autograd.Function):
    """setup_context style, with a vmap rule; saves an intermediate (x*x) it created."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sq = x * x
        return sq * x, sq

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        (x,) = inputs
        _, sq = output
        ctx.mark_non_differentiable(sq)
        ctx.save_for_backward(x, sq)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, _g2: Any) -> torch.Tensor:
        _x, sq = ctx.saved_tensors
        return 3 * sq * g


class SavesIntermediate(torch.autograd.Function):
    """Old style: saves an intermediate it made (exp(x)) and the input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(-x.abs())
        ctx.save_for_backward(x, e)
        return x * e

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        x, e = ctx.saved_tensors
        return g * e * (1 - x.abs())


class FnStyleBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, _ = Cube.apply(torch.tanh(self.fc(x)))
        return self.mlp(x + 0.3 * SavesIntermediate.apply(c))


# --- sparse gradients -----------------------------------------------------------------


class EmbBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, H, sparse=True)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(x + self.emb(ids))


class BagBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(20, H, mode="sum", sparse=bool(i % 2))
        self.mlp = MLP()

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        b, t = x.shape[:2]
        w = torch.sigmoid(x.mean(-1)).reshape(-1, 1).expand(-1, ids.shape[-1]).reshape(-1)
        bag = self.bag(ids.reshape(-1), torch.arange(0, b * t * ids.shape[-1], ids.shape[-1]), per_sample_weights=w)
        return self.mlp(x + bag.view(b, t, H))


def emb_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    return torch.randn(2, 6, H, generator=g), torch.randint(0, 20, (2, 6), generator=g)


def bag_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    return torch.randn(2, 6, H, generator=g), torch.randint(0, 20, (2, 6, 3), generator=g)


# --- RNNs -----------------------------------------------------------------------------


class PackedLSTMBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(8, 8, num_layers=2, batch_first=True, proj_size=4)
        self.fc = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        p = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (_h, c) = self.rnn(p)
        y, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return x + self.fc(y) + c[-1][:, None, :].repeat(1, 1, 1).mean(-1, keepdim=True)


def packed_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(3, 7, 8, generator=_gen(s)), torch.tensor([5, 7, 3])


class BiGRUBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.rnn = nn.GRU(H, H // 2, num_layers=2, batch_first=True, bidirectional=True, dropout=0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, h = self.rnn(x)
        return x + y + h.sum(0).repeat(1, 2)[:, None, :]


class ReluRNNBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.rnn = nn.RNN(H, H, nonlinearity="relu", batch_first=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(self.ln(x).transpose(0, 1))
        return x + 0.5 * y.transpose(0, 1)


# --- attention ------------------------------------------------------------------------


class MHABlock(nn.Module):
    def __init__(self, i: int, need_weights: bool) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.attn = nn.MultiheadAttention(H, 4, dropout=0.1, batch_first=True)
        self.need = need_weights
        self.mlp = MLP()

    def forward(self, x: torch.Tensor, kpm: torch.Tensor) -> torch.Tensor:
        y = self.ln(x)
        a, w = self.attn(y, y, y, key_padding_mask=kpm, need_weights=self.need, average_attn_weights=False)
        if w is not None:
            a = a + w.mean(1).sum(-1, keepdim=True)
        return self.mlp(x + a)


def kpm_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    kpm = torch.zeros(3, 8, dtype=torch.bool)
    kpm[1, 6:] = True
    kpm[2, 3:] = True
    return torch.randn(3, 8, H, generator=_gen(s)), kpm


class EncLayer(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(H, 4, 2 * H, dropout=0.1, activation="gelu", batch_first=True, norm_first=True)

    def forward(self, x: torch.Tensor, kpm: torch.Tensor) -> torch.Tensor:
        return self.layer(x, src_key_padding_mask=kpm)


class DecLayer(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(H, 4, 2 * H, dropout=0.1, batch_first=True)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.layer(x, memory, tgt_mask=mask, tgt_is_causal=True)


class DecModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(H, H)
        self.blocks = nn.ModuleList(DecLayer(i) for i in range(3))

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, src = batch
        memory = torch.tanh(self.enc(src))  # memory requires grad: gradients flow back from every layer
        for b in self.blocks:
            x = b(x, memory)
        return _loss(x)


def dec_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    return torch.randn(2, 6, H, generator=g), torch.randn(2, 9, H, generator=g)


# --- convolutions and norms -----------------------------------------------------------


class CLConvBlock(nn.Module):
    """channels_last conv, transposed conv (stride 2 down, then up), GroupNorm."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1).to(memory_format=torch.channels_last)
        self.gn = nn.GroupNorm(4, 16)
        self.up = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1).to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        return x + self.up(F.silu(self.gn(self.down(x))))


class InstNormBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.inorm = nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
        self.ct = nn.ConvTranspose2d(8, 8, 3, padding=1, groups=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ct(F.relu(self.inorm(self.conv(x))))


def syncbn() -> nn.Module:
    return nn.SyncBatchNorm.convert_sync_batchnorm(stack(lambda i: ConvBlock(), 3)())


class ResampleBlock(nn.Module):
    """Upsample (bilinear, align_corners), bicubic interpolate back down, pixel shuffle and
    unshuffle, unfold/fold (overlapping patches summed)."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.conv = nn.Conv2d(8, 32, 3, padding=1)
        self.mix = nn.Linear(8 * 9, 8 * 9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _n, c, hh, ww = x.shape
        y = self.up(x)
        y = F.interpolate(y, size=(hh, ww), mode="bicubic", align_corners=True)
        y = F.pixel_shuffle(self.conv(y), 2)  # 8 x 2h x 2w
        y = F.pixel_unshuffle(y, 2)[:, :c]
        p = F.unfold(y, 3, padding=1)  # n, c*9, L
        p = self.mix(p.transpose(1, 2)).transpose(1, 2)
        z = F.fold(p, (hh, ww), 3, padding=1) / 9
        return x + torch.tanh(z)


# --- dtypes ---------------------------------------------------------------------------


class DetourBlock(nn.Module):
    """float64 for the norm and first matmul, float16 or bfloat16 for the second, float32
    out."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(H, 2 * H).double()
        self.fc2 = nn.Linear(2 * H, H).to(torch.float16 if i % 2 else torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(F.layer_norm(x.double(), (H,))))
        y = self.fc2(h.to(self.fc2.weight.dtype))
        return x + y.float()


class AutocastSome(nn.Module):
    """Blocks 1 and 2 of 4 under ``torch.autocast('cpu', bfloat16)`` (entered in the
    model's loop), block 3 with its own autocast inside its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(AcBlock(i) for i in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, b in enumerate(self.blocks):
            if i in (1, 2):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    x = b(x).float()
            else:
                x = b(x)
        return _loss(x)


class AcBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.inner = i == 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inner:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = self.mlp.fc1(self.mlp.ln(x))
            return x + self.mlp.fc2(F.gelu(h.float()))
        return self.mlp(x)


# --- in place -------------------------------------------------------------------------


class InplaceTrickBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.w = nn.Parameter(torch.randn(H // 2))
        self.src = nn.Parameter(torch.randn(H) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        v = h[..., : H // 2]  # a view of h, saved by the mul
        s = v * self.w
        acc = torch.zeros_like(x)  # fresh
        acc.add_(torch.tanh(h))  # in place on the fresh tensor
        acc[..., : H // 2].add_(s)  # and on a view of it
        # torch.where with out= on a no-grad buffer, used as a mask
        m = torch.empty_like(x)
        torch.where(x.detach() > 0, torch.ones_like(m), torch.full_like(m, 0.5), out=m)
        acc = acc * m
        # index_put_ with accumulate: rows gathered with repeats
        flat = acc.reshape(-1, H)
        idx = torch.arange(flat.shape[0]) % 5
        pooled = torch.zeros(5, H).index_put_((idx,), flat, accumulate=True)
        # scatter_reduce: amax without self, mean with self
        mx = torch.zeros(5, H).scatter_reduce(0, idx[:, None].expand(-1, H), flat, "amax", include_self=False)
        mean = self.src.expand(5, H).scatter_reduce(0, idx[:, None].expand(-1, H), flat, "mean")
        out = flat + (pooled + mx + mean)[idx] * 0.1
        return x + out.view_as(x)


# --- torch.func -----------------------------------------------------------------------


class VmapBlock(nn.Module):
    """A per-sample MLP through torch.func.vmap over the batch (functional_call of its
    own submodule with its parameters)."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc = nn.Linear(H, H)
        self.gain = nn.Parameter(torch.ones(H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def per(xi: torch.Tensor, gi: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.fc(xi)) * gi

        y = torch.func.vmap(per, in_dims=(0, None))(self.ln(x), self.gain)
        return x + y


class JacBlock(nn.Module):
    """The Jacobian of a small function of the block's own parameters (jacrev), used as a
    mixing matrix."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.a = nn.Parameter(torch.randn(H) * 0.3)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        J = torch.func.jacrev(lambda a: torch.tanh(self.fc(a)))(self.a)  # H x H
        return self.mlp(x + 0.1 * x @ J)


# --- second batch: edges of the features above ---------------------------------------


class MaxNormEmbBlock(nn.Module):
    """``nn.Embedding(max_norm=...)`` renormalises the rows it looks up in place (under
    no_grad) in its forward: the region writes its own parameter."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, H, max_norm=1.0, sparse=bool(i % 2))
        self.mlp = MLP()

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(x + self.emb(ids))


class OldSpectralBlock(nn.Module):
    """The old hook-based ``torch.nn.utils.spectral_norm``: a forward pre-hook runs a power
    iteration updating the ``weight_u``/``weight_v`` buffers in place, then sets ``weight``."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc1 = _leaf_attrs(torch.nn.utils.spectral_norm(nn.Linear(H, 2 * H), n_power_iterations=2))
        self.fc2 = nn.Linear(2 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class SharedParamStack(nn.Module):
    """One orthogonal-parametrized Linear shared by every block; the model's forward runs
    all blocks under ``parametrize.cached()`` (the weight computed once, in block 0)."""

    def __init__(self, outer_cache: bool) -> None:
        super().__init__()
        shared = P.orthogonal(nn.Linear(H, H, bias=False), orthogonal_map="cayley")
        self.blocks = nn.ModuleList(SharedUser(shared) for _ in range(3))
        self.outer_cache = outer_cache

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.outer_cache:
            with parametrize.cached():
                for b in self.blocks:
                    x = b(x)
        else:
            for b in self.blocks:
                x = b(x)
        return _loss(x)


class SharedUser(nn.Module):
    def __init__(self, shared: nn.Module) -> None:
        super().__init__()
        self.shared = shared
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x + torch.tanh(self.shared(x)))


class Identity(torch.autograd.Function):
    """Returns its input unchanged (autograd makes the output a view of it) and a second
    output it made; ``set_materialize_grads(False)``: absent gradients come as None."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        y = x * w
        ctx.save_for_backward(x, w)
        return x, y

    @staticmethod
    def backward(ctx: Any, gx: torch.Tensor | None, gy: torch.Tensor | None) -> tuple:
        x, w = ctx.saved_tensors
        dx = gx if gx is not None else None
        dw = None
        if gy is not None:
            dx = gy * w if dx is None else dx + gy * w
            dw = (gy * x).sum(0).sum(0)
        return dx, dw


class IdentityFnBlock(nn.Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.w = nn.Parameter(torch.randn(H))
        self.use_y = i != 1  # block 1 drops the second output: its gradient comes as None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, y = Identity.apply(self.mlp(x), self.w)
        return x2 + 0.1 * torch.tanh(y) if self.use_y else x2 * 1.0


class FeatureTap(nn.Module):
    """A forward hook on a submodule inside each block appends its output to a list the
    model's loss reads (a feature extractor / perceptual-loss tap: an activation leaves
    the region through a hook, not its return value); a counter hook guarded by
    ``offrecomp.in_replay()`` (off under plain training) scales block outputs by the call
    count."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MLP() for _ in range(3))
        self.taps: list[torch.Tensor] = []
        self.calls = 0
        for b in self.blocks:
            b.fc1.register_forward_hook(self._tap)  # bound methods: deepcopy rebinds them
            b.register_forward_hook(self._count)

    def _tap(self, m: nn.Module, a: Any, out: torch.Tensor) -> None:
        self.taps.append(out)

    def _count(self, m: nn.Module, a: Any, out: torch.Tensor) -> torch.Tensor:
        import offrecomp

        if not offrecomp.in_replay():
            self.calls += 1
        return out * (1.0 + 0.01 * (self.calls % 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.taps = []
        for b in self.blocks:
            x = b(x)
        taps = self.taps[:3]  # a replay appends more after the forward; the loss read these
        self.taps = []  # the model holds no graph between steps (and can be deep-copied)
        return _loss(x) + sum(t.square().mean() for t in taps) * 0.1


class HiddenCarryBlock(nn.Module):
    """GRU blocks handing their final hidden state to the next block as its h0 (a tuple
    in, a tuple out); an LSTMCell loop with h0/c0 from parameters."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.gru = nn.GRU(H, H, batch_first=False)
        self.cell = nn.LSTMCell(H, H)
        self.h0 = nn.Parameter(torch.zeros(H))
        self.c0 = nn.Parameter(torch.zeros(H))

    def forward(self, xh: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, h = xh
        y, hn = self.gru(x, h)
        hc, cc = self.h0.expand(x.shape[1], H), self.c0.expand(x.shape[1], H)
        outs = []
        for t in range(x.shape[0]):
            hc, cc = self.cell(y[t], (hc, cc))
            outs.append(hc)
        return x + torch.stack(outs), hn


class HiddenCarry(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(HiddenCarryBlock(i) for i in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xh = (x, torch.zeros(1, x.shape[1], H))
        for b in self.blocks:
            xh = b(xh)
        return _loss(xh[0]) + _loss(xh[1])


class BagMaxBlock(nn.Module):
    """EmbeddingBag mode max (saves the argmax indices) with padding_idx and
    ``include_last_offset``; an Embedding shared by the blocks with ``scale_grad_by_freq``
    (dense: torch has no sparse gradient with it)."""

    def __init__(self, i: int, tied: nn.Embedding) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(20, H, mode="max", padding_idx=0, include_last_offset=True)
        self.tied = [tied]  # not a submodule: the stack owns it
        self.mlp = MLP()

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        b, t = x.shape[:2]
        n = ids.shape[-1]
        offsets = torch.arange(0, b * t * n + 1, n)
        bag = self.bag(ids.reshape(-1), offsets).view(b, t, H)
        return self.mlp(x + bag + self.tied[0](ids[..., 0]))


class BagMaxStack(Stack):
    def __init__(self) -> None:
        tied = nn.Embedding(20, H, scale_grad_by_freq=True, padding_idx=1)
        super().__init__([BagMaxBlock(i, tied) for i in range(3)])
        self.tied = tied


class BNCumulativeBlock(nn.Module):
    """BatchNorm with momentum=None (a cumulative average whose factor reads
    ``num_batches_tracked``), BatchNorm1d over (N, C, L), QAT-style observer toggled by the
    step: a FakeQuantize whose observer is disabled after 2 calls from inside the forward."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm1d(8, momentum=None)
        self.fq = torch.ao.quantization.FakeQuantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if int(self.bn.num_batches_tracked) >= 2:
            self.fq.disable_observer()
        return x + self.fq(F.relu(self.bn(self.conv(x))))


class GradModeBlock(nn.Module):
    """Grad-mode changes inside the block: a no_grad statistic, an enable_grad island inside
    a no_grad one, an inference_mode side computation turned into a constant, and
    ``torch.set_default_dtype(float64)`` set and reset around a factory call."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            scale = x.abs().mean() + 1
            with torch.enable_grad():
                g = torch.tanh(self.fc(x))
        with torch.inference_mode():
            c = torch.linspace(0, 1, H) * 2
        c = c.clone()
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            r = torch.arange(H) / H
        finally:
            torch.set_default_dtype(old)
        return self.mlp(x / scale) + g * c + r.float()


class InputDirtyBlock(nn.Module):
    """A custom Function with ``mark_dirty`` applied to the block's own input (the previous
    block's output, not a leaf): the region writes its input in place."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad:
            x = InplaceSquare.apply(x)
        return self.mlp(x * 0.5)


# --- third batch: forward-mode AD and saved-tensor hooks inside a block --------------


class JacfwdBlock(nn.Module):
    """``torch.func.jacfwd`` (forward-mode AD through the transform) of a small function of
    the block's parameters, used as a mixing matrix."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.a = nn.Parameter(torch.randn(H) * 0.3)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        J = torch.func.jacfwd(lambda a: torch.tanh(self.fc(a)))(self.a)
        return self.mlp(x + 0.1 * x @ J)


class DualBlock(nn.Module):
    """A Jacobian-vector product through ``torch.autograd.forward_ad`` inside the forward
    (a JVP regulariser): the dual level opens and closes inside the block."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.autograd.forward_ad as fwAD

        v = torch.ones_like(x) / H
        with fwAD.dual_level():
            d = fwAD.make_dual(x, v)
            y = torch.tanh(self.fc(d))
            out, jvp = fwAD.unpack_dual(y)
        return self.mlp(x + out) + 0.1 * jvp


class SaveOnCpuBlock(nn.Module):
    """``torch.autograd.graph.save_on_cpu`` around the block's MLP (another saved-tensor
    hook pair inside the region; offrecomp warns that it owns those saves)."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.save_on_cpu():
            y = self.mlp(x)
        return y + torch.tanh(self.fc(y))


def _pack_half(t: torch.Tensor) -> tuple[torch.dtype, torch.Tensor]:
    return t.dtype, t.clone()


def _unpack_half(p: tuple[torch.dtype, torch.Tensor]) -> torch.Tensor:
    return p[1].to(p[0])


class PackHookBlock(nn.Module):
    """A user's own ``saved_tensors_hooks`` pair (pack clones) around part of the block."""

    def __init__(self, i: int) -> None:
        super().__init__()
        self.mlp = MLP()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.fc(x))
        with torch.autograd.graph.saved_tensors_hooks(_pack_half, _unpack_half):
            y = self.mlp(y)
        return x + y


class EnsembleBlock(nn.Module):
    """Model ensembling inside a block: ``torch.func.stack_module_state`` of 3 small MLPs
    (stacked parameters are registered as this block's parameters) and ``vmap`` over
    ``functional_call`` of a meta-device copy."""

    def __init__(self, i: int) -> None:
        super().__init__()
        members = [nn.Sequential(nn.Linear(H, H), nn.Tanh(), nn.Linear(H, H)) for _ in range(3)]
        params, _ = torch.func.stack_module_state(members)
        self.names = list(params)
        self.stacked = nn.ParameterList(nn.Parameter(params[n].detach().clone()) for n in self.names)
        self.base = [members[0].to("meta")]  # not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def one(p: tuple, xx: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(self.base[0], dict(zip(self.names, p)), (xx,))

        ys = torch.func.vmap(one, in_dims=(0, None))(tuple(self.stacked), x)
        return x + ys.mean(0)


# ------------------------------------------------------------------------------ models

MODELS: dict[str, Callable[[], nn.Module]] = {
    "orthogonal": stack(OrthoBlock, 3),
    "weight_norm_conv": stack(WeightNormConvBlock, 3),
    "param_cached": stack(CachedBlock, 3),
    "right_inverse": stack(RightInverseBlock, 3),
    "prune_l1": stack(pruned_mlp, 3),
    "prune_ln_conv": stack(pruned_conv, 3),
    "qat_linear": qat_linear,
    "qat_convbnrelu": qat_conv,
    "fake_quant_ops": stack(FakeQuantBlock, 3),
    "fwd_hooks_kwargs": KwStack,
    "bwd_hooks": bwd_hooks,
    "tensor_hooks": stack(TensorHookBlock, 3),
    "fn_ctx_attrs": stack(CtxAttrBlock, 3),
    "fn_mark_dirty": stack(DirtyBlock, 3),
    "fn_nondiff_once": stack(SortBlock, 3),
    "fn_setup_ctx": stack(FnStyleBlock, 3),
    "emb_sparse": stack(EmbBlock, 3),
    "embbag_psw": stack(BagBlock, 3),
    "lstm_packed": stack(PackedLSTMBlock, 3),
    "bigru_dropout": stack(BiGRUBlock, 3),
    "rnn_relu": stack(ReluRNNBlock, 3),
    "mha_weights": stack(lambda i: MHABlock(i, True), 3),
    "mha_noweights": stack(lambda i: MHABlock(i, False), 3),
    "enc_normfirst": stack(EncLayer, 3),
    "dec_memory": DecModel,
    "conv_cl_transpose": stack(CLConvBlock, 3),
    "instnorm_stats": stack(InstNormBlock, 3),
    "syncbn": syncbn,
    "resample_fold": stack(ResampleBlock, 3),
    "dtype_detour": stack(DetourBlock, 4),
    "autocast_some": AutocastSome,
    "inplace_tricks": stack(InplaceTrickBlock, 3),
    "vmap_block": stack(VmapBlock, 3),
    "jacrev_block": stack(JacBlock, 3),
    # second batch
    "emb_max_norm": stack(MaxNormEmbBlock, 3),
    "old_spectral_norm": stack(OldSpectralBlock, 3),
    "shared_param": lambda: SharedParamStack(False),
    "shared_param_cached": lambda: SharedParamStack(True),
    "fn_identity_out": stack(IdentityFnBlock, 3),
    "feature_tap_hooks": FeatureTap,
    "hidden_carry": HiddenCarry,
    "bag_max_tied": BagMaxStack,
    "bn_cumulative_fq": stack(BNCumulativeBlock, 3),
    "grad_modes": stack(GradModeBlock, 3),
    "fn_dirty_input": stack(InputDirtyBlock, 3),
    # third batch
    "jacfwd_block": stack(JacfwdBlock, 3),
    "fwd_ad_jvp": stack(DualBlock, 3),
    "save_on_cpu": stack(SaveOnCpuBlock, 3),
    "own_pack_hooks": stack(PackHookBlock, 3),
    "vmap_ensemble": stack(EnsembleBlock, 3),
}

BATCHES: dict[str, Callable[[int], Any]] = {
    "weight_norm_conv": randn(3, 8, 12),
    "prune_ln_conv": randn(3, 8, 6, 6),
    "qat_convbnrelu": randn(3, 8, 6, 6),
    "emb_sparse": emb_batch,
    "embbag_psw": bag_batch,
    "lstm_packed": packed_batch,
    "mha_weights": kpm_batch,
    "mha_noweights": kpm_batch,
    "enc_normfirst": kpm_batch,
    "dec_memory": dec_batch,
    "conv_cl_transpose": randn(2, 8, 8, 8),
    "instnorm_stats": randn(3, 8, 6, 6),
    "syncbn": randn(3, 8, 6, 6),
    "resample_fold": randn(2, 8, 6, 6),
    "emb_max_norm": emb_batch,
    "hidden_carry": randn(5, 2, H),
    "bag_max_tied": bag_batch,
    "bn_cumulative_fq": randn(3, 8, 10),
}

NO_DROP: set[str] = {"emb_max_norm"}
"""Models whose regions offrecomp keeps by design (warned): ``Embedding(max_norm=...)``
renormalises its weight in place in the forward, so the region "writes its parameters in
place" and keeps from its first call on; recompute and tight runs are bitwise but drop
nothing, which check_variant_report counts as a failure."""


def batch(name: str, model: nn.Module) -> Callable[[int], Any]:
    return BATCHES.get(name, randn(3, 6, H))


def skip(name: str, variant: str) -> bool:
    return name in NO_DROP and variant in ("recompute", "auto_tight", "auto_serve")


if __name__ == "__main__":
    sys.exit(run(MODELS, batch, skip))
