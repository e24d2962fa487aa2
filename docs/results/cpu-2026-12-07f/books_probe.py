"""Books under keep against what a plain forward saves, on three structures whose calls
share storages (NOTE [Whole calls counted once] in offrecomp/shared.py).

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-07f/books_probe.py

For each model: the bytes of the distinct storages a plain forward saves for backward
(parameters aside), and the peak activation bytes offrecomp's books hold under
``mode="keep"`` (native keep on, the default, and off), at the third step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import offrecomp


class Basic(nn.Module):
    """A post-activation residual block: the ReLU after the addition saves its output,
    which the next block's first convolution saves as its input."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + x)


class ConvRelu(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.c(x))


class Stack(nn.Module):
    def __init__(self, block: type[nn.Module], n: int = 8, c: int = 32) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.ModuleList(block(c) for _ in range(n))
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean((2, 3))).sum()


class CrossAttention(nn.Module):
    """A decoder block attending to an encoder output every block takes and saves."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.q, self.kv, self.o = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
        k, v = self.kv(enc).chunk(2, -1)
        return x + self.o(torch.softmax(self.q(x) @ k.transpose(-1, -2), -1) @ v)


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CrossAttention() for _ in range(8))

    def forward(self, x: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, enc)
        return x.sum()


def saved_bytes(model: nn.Module, *args: torch.Tensor) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*args)
    return sum(seen.values())


def main() -> None:
    cases = [
        ("conv+ReLU stack (8 blocks)", lambda: Stack(ConvRelu), (torch.randn(4, 3, 64, 64),)),
        ("post-activation ResNet (8 blocks)", lambda: Stack(Basic), (torch.randn(4, 3, 64, 64),)),
        ("8 cross-attention blocks", Decoder, (torch.randn(4, 256, 64), torch.randn(4, 1024, 64, requires_grad=True))),
    ]
    print(f"torch {torch.__version__}")
    for name, make, args in cases:
        torch.manual_seed(0)
        held = saved_bytes(make(), *args)
        row = [f"{name}: plain saves {held / 2**20:.2f} MiB"]
        for native in (True, False):
            torch.manual_seed(0)
            model = make()
            with offrecomp.runtime(model, mode="keep", native_keep=native) as rt:
                for _ in range(3):
                    model(*args).backward()
            peak = rt.report().steps[-1].peak_activation_bytes
            row.append(f"keep{'' if native else ' (native keep off)'} books {peak / 2**20:.2f} MiB ({peak / held:.3f}x)")
        print("; ".join(row))


if __name__ == "__main__":
    main()
