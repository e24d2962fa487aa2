"""RNN models (LSTM/GRU/RNN, bidirectional, multi-layer, proj_size, packed sequences) under
every zoo variant, in fp32 and under CPU bf16 autocast, bitwise against plain training
(tests/helpers.check_variant through sweep.py).

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05n/rnn_sweep.py [NAME,...|all] [VARIANT,...] [-v]

Each model: 3 blocks in an nn.ModuleList (the regions), each an RNN + Linear + residual.
Names end in _fp32 or _bf16 (the whole forward and loss under torch.autocast('cpu', bf16)).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))

import torch
from sweep import BF16Autocast, run
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class _Print(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        print(f"LOG  {record.name}: {record.getMessage()[:300]}", flush=True)


logging.getLogger("offrecomp").addHandler(_Print(logging.WARNING))

H = 16
T = 7
B = 3
LENGTHS = torch.tensor([7, 4, 5])  # unsorted: enforce_sorted=False


class Block(nn.Module):
    def __init__(self, kind: str, packed: bool, **kw: Any) -> None:
        super().__init__()
        cls = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind]
        self.rnn = cls(H, H, batch_first=True, **kw)
        bi = 2 if kw.get("bidirectional") else 1
        out = (kw.get("proj_size") or H) * bi
        self.proj = nn.Linear(out, H)
        self.packed = packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            p = pack_padded_sequence(x, LENGTHS, batch_first=True, enforce_sorted=False)
            y, _ = self.rnn(p)
            y, _ = pad_packed_sequence(y, batch_first=True, total_length=T)
        else:
            y, _ = self.rnn(x)
        return x + self.proj(y)


class Net(nn.Module):
    def __init__(self, kind: str, packed: bool = False, n: int = 3, **kw: Any) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(kind, packed, **kw) for _ in range(n)])
        self.head = nn.Linear(H, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x).float().pow(2).mean()


BASE = {
    "lstm": lambda: Net("lstm"),
    "lstm_2l_bi": lambda: Net("lstm", num_layers=2, bidirectional=True),
    "lstm_2l_drop": lambda: Net("lstm", num_layers=2, dropout=0.2),
    "lstm_proj": lambda: Net("lstm", proj_size=8),
    "lstm_packed": lambda: Net("lstm", packed=True),
    "lstm_packed_bi": lambda: Net("lstm", packed=True, num_layers=2, bidirectional=True),
    "gru": lambda: Net("gru"),
    "gru_2l_bi_drop": lambda: Net("gru", num_layers=2, bidirectional=True, dropout=0.2),
    "gru_packed": lambda: Net("gru", packed=True, bidirectional=True),
    "rnn_relu": lambda: Net("rnn", nonlinearity="relu", num_layers=2),
    "rnn_packed": lambda: Net("rnn", packed=True),
}
MODELS = {}
for _n, _f in BASE.items():
    MODELS[_n + "_fp32"] = _f
    MODELS[_n + "_bf16"] = (lambda f=_f: BF16Autocast(f()))


def batch(s: int) -> torch.Tensor:
    return torch.randn(B, T, H, generator=torch.Generator().manual_seed(1000 + s))


if __name__ == "__main__":
    raise SystemExit(run(MODELS, lambda name, model: batch))
