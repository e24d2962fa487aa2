"""Random models for the general case: block programs of common ops in random module
structures, so the runtime meets layouts no hand-written test names.

``random_model(seed)`` builds one: a stem, then blocks of one to three kinds (each kind
a class of its own, so discovery finds them repeated) held in one of several
structures (a ModuleList looped over, a Sequential, a ModuleDict, attributes, stages of
lists, stages of a class of the model's own holding a list (the stages are the
regions), one block called twice, blocks taking keyword tensors or returning tuples or
dicts, U-Net skips from the first half's outputs to the second half's inputs, a
context every block attends to, blocks of a kind sharing their first layer), then a
head and a scalar loss. A block runs a random program of ops on a (batch, tokens,
width) tensor: linear layers, MLPs, norms (LayerNorm, a hand-written RMS norm,
BatchNorm over the width, which writes its running statistics), residual branches,
dropout, attention (hand-written softmax or scaled_dot_product_attention, causal),
in-place activations on fresh tensors and on a slice, views and transposes, chunk and
cat, gates, convolutions over the tokens, masked fills, read-only buffers, noise drawn
with torch's RNG, a scale computed without grad, einsum, cumsum, where, a float64
detour, index_select, non-contiguous outputs, layer dropout drawn per call (other ops
from call to call), detached parts, and draws from Python's and numpy's RNGs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["describe", "random_batch", "random_model", "varies"]

WIDTH = 16
TOKENS = 6
HEADS = 2

_OPS = (
    "linear", "mlp", "layernorm", "rmsnorm", "batchnorm", "residual", "dropout", "attention", "sdpa",
    "inplace", "heads_view", "chunk_gate", "conv", "masked", "buffer_scale", "exp_sin", "rand_noise",
    "no_grad_scale", "slice_inplace", "einsum", "cumsum", "where", "float64", "index", "noncontiguous",
    "layerdrop", "detach_part", "py_random", "numpy_noise",
)


def _program(rng: random.Random, depth: int = 0) -> list[Any]:
    """A random op program; a residual holds a program of its own. A block's program ends
    in a linear layer and an activation, so it saves something a replay can drop."""
    prog = _ops(rng, depth)
    return [*prog, ("linear", rng.choice(("gelu", "tanh", "relu", "silu")))] if depth == 0 else prog


def _ops(rng: random.Random, depth: int) -> list[Any]:
    prog: list[Any] = []
    for _ in range(rng.randint(2, 5)):
        op = rng.choice(_OPS)
        if op == "residual":
            if depth >= 1:
                continue
            prog.append(("residual", _program(rng, depth + 1)))
        else:
            prog.append((op, rng.choice(("gelu", "tanh", "relu", "silu"))))
    return prog or [("linear", "tanh")]


def varies(model: nn.Module) -> bool:
    """Does a block of ``model`` run other ops from call to call (layer dropout)? auto
    measures such a model again while it does (tests/helpers.check_variant's ``stable``)."""
    return any(isinstance(m, RandomBlock) and "layerdrop" in repr(m.program) for m in model.modules())


class RandomBlock(nn.Module):
    """Runs ``program`` (see ``_program``) on x of shape (batch, tokens, WIDTH)."""

    def __init__(self, program: list[Any], kwarg: bool, tuple_out: bool | str) -> None:
        super().__init__()
        self.program = program
        self.kwarg = kwarg
        self.tuple_out = tuple_out
        self.layers = nn.ModuleDict()
        self._build(program, "p")

    def _build(self, program: list[Any], prefix: str) -> None:
        for i, (op, arg) in enumerate(program):
            key = f"{prefix}{i}"
            if op == "residual":
                self._build(arg, key + "_")
            elif op == "linear":
                self.layers[key] = nn.Linear(WIDTH, WIDTH)
            elif op == "mlp":
                self.layers[key] = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), _act(arg), nn.Linear(2 * WIDTH, WIDTH))
            elif op == "layernorm":
                self.layers[key] = nn.LayerNorm(WIDTH)
            elif op == "rmsnorm":
                self.register_parameter(key, nn.Parameter(torch.ones(WIDTH)))
            elif op == "batchnorm":
                self.layers[key] = nn.BatchNorm1d(WIDTH)
            elif op == "dropout":
                self.layers[key] = nn.Dropout(0.2)
            elif op in ("attention", "sdpa"):
                self.layers[key] = nn.Linear(WIDTH, 3 * WIDTH)
            elif op == "chunk_gate":
                self.layers[key] = nn.Linear(WIDTH, 2 * WIDTH)
            elif op == "conv":
                self.layers[key] = nn.Conv1d(WIDTH, WIDTH, 3, padding=1)
            elif op == "buffer_scale":
                self.register_buffer(key, torch.linspace(0.5, 1.5, WIDTH))
            elif op == "einsum":
                self.register_parameter(key, nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH**0.5))
            elif op == "index":
                self.register_buffer(key, torch.arange(TOKENS - 1, -1, -1), persistent=False)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None, ctx: torch.Tensor | None = None) -> Any:
        if self.kwarg and scale is not None:
            x = x * scale
        if ctx is not None:  # cross-attention to a context another part of the model made
            x = x + torch.softmax(x @ ctx.transpose(1, 2) / WIDTH**0.5, dim=-1) @ ctx
        x = self._run(self.program, "p", x)
        if self.tuple_out == "dict":
            return {"x": x, "aux": x.abs().mean()}
        if self.tuple_out:
            return x, x.square().mean()
        return x

    def _run(self, program: list[Any], prefix: str, x: torch.Tensor) -> torch.Tensor:
        for i, (op, arg) in enumerate(program):
            key = f"{prefix}{i}"
            if op == "residual":
                x = x + 0.5 * self._run(arg, key + "_", x)
            elif op in ("linear", "mlp", "layernorm", "dropout"):
                x = self.layers[key](x)
                if op == "linear":
                    x = _act(arg)(x)
            elif op == "rmsnorm":
                x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * getattr(self, key)
            elif op == "batchnorm":
                x = self.layers[key](x.transpose(1, 2)).transpose(1, 2)
            elif op in ("attention", "sdpa"):
                x = x + _attention(self.layers[key](x), op == "sdpa")
            elif op == "inplace":
                y = x * 1.5
                x = _act(arg)(y) if arg == "gelu" else F.silu(y, inplace=True) if arg == "silu" else getattr(y, f"{arg}_")()
            elif op == "heads_view":
                b, t, d = x.shape
                h = x.view(b, t, HEADS, d // HEADS).transpose(1, 2).contiguous()
                x = torch.tanh(h).transpose(1, 2).reshape(b, t, d)
            elif op == "chunk_gate":
                a, g = self.layers[key](x).chunk(2, dim=-1)
                x = torch.cat([a * torch.sigmoid(g)], dim=-1)
            elif op == "conv":
                x = self.layers[key](x.transpose(1, 2)).transpose(1, 2)
            elif op == "masked":
                mask = torch.ones(x.shape[1], x.shape[2], dtype=torch.bool).triu(1)
                x = x.masked_fill(mask, 0.0) + x.mean()
            elif op == "buffer_scale":
                x = x * getattr(self, key)
            elif op == "exp_sin":
                x = torch.sin(x) * torch.exp(-x.abs())
            elif op == "rand_noise":
                x = x + 0.01 * torch.rand_like(x)
            elif op == "no_grad_scale":
                with torch.no_grad():
                    s = x.abs().mean() + 1.0
                x = x / s
            elif op == "slice_inplace":
                y = x.clone()
                y[:, 0].mul_(2.0)
                x = torch.tanh(y)
            elif op == "einsum":
                x = torch.einsum("btd,de->bte", x, getattr(self, key))
            elif op == "cumsum":
                x = torch.tanh(x.cumsum(1) / x.shape[1])
            elif op == "where":
                x = torch.where(x > 0, x, 0.1 * x)
            elif op == "float64":
                x = torch.tanh(x.to(torch.float64)).to(torch.float32)
            elif op == "index":
                x = x.index_select(1, getattr(self, key)[: x.shape[1]]) * 0.5 + x * 0.5
            elif op == "noncontiguous":
                x = torch.tanh(x.transpose(1, 2).contiguous()).transpose(1, 2)
            elif op == "layerdrop":
                if self.training and bool(torch.rand(()) < 0.3):
                    return x
            elif op == "detach_part":
                x = x + 0.1 * torch.tanh(x).detach()
            elif op == "py_random":
                x = torch.tanh(x * (0.5 + random.random()))
            elif op == "numpy_noise":
                x = torch.tanh(x + torch.from_numpy(np.random.rand(*x.shape).astype(np.float32)))
        return x


def _act(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return {"gelu": nn.GELU(), "tanh": nn.Tanh(), "relu": nn.ReLU(), "silu": nn.SiLU()}[name]


def _attention(qkv: torch.Tensor, sdpa: bool) -> torch.Tensor:
    b, t, _ = qkv.shape
    q, k, v = (z.view(b, t, HEADS, WIDTH // HEADS).transpose(1, 2) for z in qkv.chunk(3, dim=-1))
    if sdpa:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        w = (q @ k.transpose(-2, -1)) / math.sqrt(WIDTH // HEADS)
        w = w.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        y = torch.softmax(w, dim=-1) @ v
    return y.transpose(1, 2).reshape(b, t, WIDTH)


_LAYOUTS = (
    "list", "sequential", "dict", "attributes", "stages", "shared_twice", "kwargs", "tuples", "skips", "cross",
    "tied", "dict_out", "nested",
)


class Stage(nn.Module):
    """Blocks of the model's own class in a list, called in turn: a stage of a nested
    model, the outermost repeated module (the region)."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


class RandomModel(nn.Module):
    """A stem, blocks in ``layout`` (one of ``_LAYOUTS``), a head and a scalar loss."""

    def __init__(self, blocks: list[nn.Module], layout: str) -> None:
        super().__init__()
        self.layout = layout
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 3)
        if layout == "sequential":
            self.blocks: Any = nn.Sequential(*blocks)
        elif layout == "dict":
            self.blocks = nn.ModuleDict({f"layer_{i}": b for i, b in enumerate(blocks)})
        elif layout == "attributes":
            self.names = [f"block{i}" for i in range(len(blocks))]
            for n, b in zip(self.names, blocks):
                setattr(self, n, b)
        elif layout == "stages":
            half = len(blocks) // 2
            self.stages = nn.ModuleList([nn.ModuleList(blocks[:half]), nn.ModuleList(blocks[half:])])
        elif layout == "nested":
            half = len(blocks) // 2
            self.stages = nn.ModuleList([Stage(blocks[:half]), Stage(blocks[half:])])
        else:
            self.blocks = nn.ModuleList(blocks)
        if layout == "cross":
            self.context = nn.Linear(WIDTH, WIDTH)
        if layout == "tied":  # blocks of a kind share their first layer (tied weights)
            first: dict[type, nn.Module] = {}
            for b in blocks:
                layers = b.layers  # type: ignore[union-attr]
                if len(layers):
                    key = next(iter(layers.keys()))
                    layers[key] = first.setdefault(type(b), layers[key])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.stem(x))
        aux = x.new_zeros(())
        if self.layout == "sequential":
            x = self.blocks(x)
        elif self.layout == "dict":
            for b in self.blocks.values():
                x = b(x)
        elif self.layout == "attributes":
            for n in self.names:
                x = getattr(self, n)(x)
        elif self.layout == "stages":
            for stage in self.stages:
                for b in stage:
                    x = b(x)
        elif self.layout == "nested":
            for stage in self.stages:
                x = stage(x)
        elif self.layout == "shared_twice":
            for b in self.blocks:
                x = b(x)
            x = self.blocks[0](x)  # one block called again
        elif self.layout == "kwargs":
            scale = torch.full((WIDTH,), 0.9)
            for b in self.blocks:
                x = b(x, scale=scale)
        elif self.layout == "skips":  # U-Net: the first half's outputs join the second half's inputs
            half = len(self.blocks) // 2
            kept = []
            for i, b in enumerate(self.blocks):
                if i >= len(self.blocks) - half and kept:
                    x = x + kept.pop()
                x = b(x)
                if i < half:
                    kept.append(x)
        elif self.layout == "cross":
            ctx = torch.tanh(self.context(x.detach().flip(1)))
            for b in self.blocks:
                x = b(x, ctx=ctx)
        elif self.layout == "dict_out":
            for b in self.blocks:
                out = b(x)
                x, aux = out["x"], aux + out["aux"]
        else:  # list, tuples
            for b in self.blocks:
                out = b(x)
                if isinstance(out, tuple):
                    x, extra = out
                    aux = aux + extra
                else:
                    x = out
        return self.head(x).square().mean() + 0.1 * aux


def random_model(seed: int) -> RandomModel:
    """Model number ``seed`` (the same for the same seed)."""
    rng = random.Random(seed)
    layout = rng.choice(_LAYOUTS)
    kinds = []
    for k in range(rng.choice((1, 1, 2, 3))):
        cls = type(f"Block{seed}_{k}", (RandomBlock,), {})
        kinds.append((cls, _program(rng)))
    n = len(kinds) * (2 if len(kinds) > 1 else rng.randint(2, 4))  # each kind at least twice
    if layout == "nested":
        n += n % 2  # two stages of as many blocks
    order = [kinds[i % len(kinds)] for i in range(n)]
    if rng.random() < 0.5:
        rng.shuffle(order)
    torch.manual_seed(seed)
    out: bool | str = "dict" if layout == "dict_out" else layout == "tuples"
    blocks = [cls(prog, kwarg=layout == "kwargs", tuple_out=out) for cls, prog in order]
    return RandomModel(blocks, layout)


def random_batch(s: int) -> torch.Tensor:
    return torch.randn(3, TOKENS, WIDTH, generator=torch.Generator().manual_seed(1000 + s))


def describe(model: RandomModel) -> str:
    """The layout and each block kind's program, for a failure's message."""
    kinds: dict[str, Any] = {}
    for m in model.modules():
        if isinstance(m, RandomBlock):
            kinds.setdefault(type(m).__name__, m.program)
    return f"layout={model.layout} " + "; ".join(f"{k}: {v}" for k, v in kinds.items())
