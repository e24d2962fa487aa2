"""Small models that cover the module shapes users write (CPU, fast)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-LN GPT block: fused attention, GELU MLP, optional dropout."""

    def __init__(self, h: int, heads: int, p: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)
        self.heads = heads
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.p if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(b, t, h)), p, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), p, self.training)


class GPT(nn.Module):
    def __init__(self, layers: int = 3, h: int = 32, heads: int = 4, vocab: int = 64, p: float = 0.1) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(Block(h, heads, p) for _ in range(layers))
        self.ln = nn.LayerNorm(h)
        self.head = nn.Linear(h, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), idx.flatten())


def conv_bn(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class CNN(nn.Module):
    """Blocks of conv/BatchNorm/ReLU inside an nn.Sequential."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(conv_bn(3, 8), conv_bn(8, 8), conv_bn(8, 8), conv_bn(8, 8))
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x).mean(dim=(2, 3))
        return F.cross_entropy(self.head(y), torch.arange(x.shape[0], device=x.device) % 10)


class KwBlock(nn.Module):
    """Takes keyword tensors and non-tensor args, returns a tuple."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.lin = nn.Linear(h, h)
        self.gate = nn.Linear(h, h)

    def forward(
        self, x: torch.Tensor, *, mask: torch.Tensor, scale: torch.Tensor, mode: str = "tanh"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        act = torch.tanh if mode == "tanh" else torch.sigmoid
        y = act(self.lin(x)) * mask * scale
        aux = torch.sigmoid(self.gate(y)).mean()
        return x + y, aux


class KwModel(nn.Module):
    def __init__(self, h: int = 48, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(KwBlock(h) for _ in range(n))
        self.scale = nn.Parameter(torch.ones(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x.abs() > 0.1).to(x.dtype)
        total = x.new_zeros(())
        for i, layer in enumerate(self.layers):
            x, aux = layer(x, mask=mask, scale=self.scale * (i + 1), mode="tanh" if i % 2 else "sigmoid")
            total = total + aux
        return x.pow(2).mean() + total


class InplaceBlock(nn.Module):
    """Views and in-place ops inside the region."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.a = nn.Linear(h, 2 * h)
        self.b = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        left, right = y.chunk(2, dim=-1)  # views
        z = left * torch.sigmoid(right)
        z = z.relu_()  # in place on an intermediate
        w = z.clone()
        w[..., :2] = 0.0  # index assignment
        w.mul_(1.5)
        t = w.transpose(0, 1).contiguous().transpose(0, 1)
        return x + self.b(t)


class InplaceModel(nn.Module):
    def __init__(self, h: int = 40, n: int = 3) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(InplaceBlock(h) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x).square().mean()


class SharedModel(nn.Module):
    """One block module called twice per forward."""

    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(h, 4, 0.1), Block(h, 4, 0.1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](x)
        x = self.blocks[1](x)
        x = self.blocks[0](x)  # same module again
        return x.square().mean()


class MLPBlock(nn.Module):
    """Pre-LN residual MLP."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 2 * h)
        self.fc2 = nn.Linear(2 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Stack(nn.Module):
    """Blocks applied in turn (a ModuleList: the regions), then a scalar loss."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


def stack(block: Callable[[], nn.Module], n: int = 3) -> Callable[[], nn.Module]:
    """A factory of ``Stack`` models of ``n`` fresh blocks."""
    return lambda: Stack([block() for _ in range(n)])


class ScaledMLPBlock(nn.Module):
    """Pre-LN residual MLP (4x wide) with a parameter of the block's own: a layer scale."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)
        self.scale = nn.Parameter(torch.full((h,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.fc2(F.gelu(self.fc1(self.ln(x))))


class HeadedStack(nn.Module):
    """``depth`` ScaledMLPBlocks (a ModuleList: the regions), a Linear head, a scalar loss."""

    def __init__(self, h: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ScaledMLPBlock(h) for _ in range(depth))
        self.head = nn.Linear(h, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x).square().mean()
