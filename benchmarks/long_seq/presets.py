"""Named benchmark sizes: a CPU default that runs in a couple of minutes, GPU sizes 125M-1.5B.

GPU presets are named after the usual tied-embedding shapes; the benchmark's GPT has an
untied LM head and a learned position table, so each has somewhat more parameters (the
descriptions give the counts at the preset's longest sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import ModelSpec

__all__ = ["PRESETS", "Preset", "auto_preset_name", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


def parse_size(text: str, *, name: str = "size") -> int:
    """``"24MiB" -> 25165824``; bytes as an integer or a number with a unit."""
    raw = text.strip()
    i = len(raw)
    while i and not (raw[i - 1].isdigit() or raw[i - 1] == "."):
        i -= 1
    unit = raw[i:].strip().lower()
    try:
        number = float(raw[:i])
    except ValueError:
        number = -1.0
    if unit not in _UNITS or number < 0:
        raise ValueError(
            f"{name}={text!r} is invalid; accepted: bytes or a number with a unit "
            f"({', '.join(u for u in ('KiB', 'MiB', 'GiB', 'KB', 'MB', 'GB'))}), e.g. 24MiB"
        )
    return int(number * _UNITS[unit])


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A model, the sequence lengths to compare, and the longest-sequence search."""

    name: str
    description: str
    spec: ModelSpec
    seqs: tuple[int, ...]
    batch: int
    bf16: bool
    """Run forward under bf16 autocast (weights and optimizer stay fp32)."""
    mem_budget: str
    """Budget of the longest-sequence search: step peak above resting memory."""
    search_start: int
    search_max: int


_GPT2_VOCAB = 50304  # GPT-2's 50257 rounded up to a multiple of 64

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="cpu-tiny",
            description="4 blocks, h=128, fp32; the whole comparison in ~2 minutes on 2 cores",
            spec=ModelSpec(n_layers=4, hidden=128, n_heads=4, vocab=2048, max_seq=2048),
            seqs=(256, 512),
            batch=2,
            bf16=False,
            mem_budget="24MiB",
            search_start=256,
            search_max=2048,
        ),
        Preset(
            name="gpu-125m",
            description="12 x 768 (GPT-2 small shape), 0.17B parameters with an untied head, bf16",
            spec=ModelSpec(n_layers=12, hidden=768, n_heads=12, vocab=_GPT2_VOCAB, max_seq=8192),
            seqs=(4096, 8192),
            batch=1,
            bf16=True,
            mem_budget="8GiB",
            search_start=8192,
            search_max=131072,
        ),
        Preset(
            name="gpu-350m",
            description="24 x 1024 (GPT-2 medium shape), 0.42B parameters with an untied head, bf16",
            spec=ModelSpec(n_layers=24, hidden=1024, n_heads=16, vocab=_GPT2_VOCAB, max_seq=16384),
            seqs=(8192, 16384),
            batch=1,
            bf16=True,
            mem_budget="16GiB",
            search_start=8192,
            search_max=65536,
        ),
        Preset(
            name="gpu-1.3b",
            description="24 x 2048 (GPT-3 XL shape), 1.45B parameters with an untied head, bf16",
            spec=ModelSpec(n_layers=24, hidden=2048, n_heads=16, vocab=_GPT2_VOCAB, max_seq=16384),
            seqs=(8192, 16384),
            batch=1,
            bf16=True,
            mem_budget="32GiB",
            search_start=8192,
            search_max=65536,
        ),
        Preset(
            name="gpu-1.5b",
            description="48 x 1600 (GPT-2 XL shape), 1.69B parameters with an untied head, bf16",
            spec=ModelSpec(n_layers=48, hidden=1600, n_heads=25, vocab=_GPT2_VOCAB, max_seq=32768),
            seqs=(16384, 32768),
            batch=1,
            bf16=True,
            mem_budget="48GiB",
            search_start=16384,
            search_max=131072,
        ),
    )
}


def auto_preset_name(device_type: str, total_memory_bytes: int | None = None) -> str:
    """The preset for a device: ``cpu-tiny`` on CPU, else by the GPU's memory."""
    if device_type != "cuda" or total_memory_bytes is None:
        return "cpu-tiny"
    gib = total_memory_bytes / 2**30
    if gib >= 70:
        return "gpu-1.3b"
    if gib >= 30:
        return "gpu-350m"
    return "gpu-125m"
