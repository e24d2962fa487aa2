"""How the storages a GPT offloads join their groups: typed (an alias of the saved
tensor, or of its base, NOTE [Typed sources] in offrecomp/offload.py) or flat (the
storage, for which issue() makes a uint8 tensor: two dispatcher calls). The long-sequence
benchmark's GPT, 4 blocks of width 64 at 64 tokens, mode="offload", three steps, fp32 and
under CPU bf16 autocast (as the GPU benchmarks run). Counts over the three steps.

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-06b/flat_sources.py
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import offrecomp  # noqa: E402
from benchmarks.long_seq.models import ModelSpec, build_model  # noqa: E402
from offrecomp import offload  # noqa: E402


def count(bf16: bool) -> collections.Counter[str]:
    spec = ModelSpec(n_layers=4, hidden=64, n_heads=2, vocab=256, max_seq=64)
    model = build_model(spec)
    idx, tgt = torch.randint(0, 256, (1, 64)), torch.randint(0, 256, (1, 64))
    seen: collections.Counter[str] = collections.Counter()
    original = offload.OffloadEngine.issue

    def issue(self: offload.OffloadEngine, group: offload.Group, *args: object, **kwargs: object) -> bool:
        for source, shape in zip(group.sources, group.shapes):
            seen["flat" if shape is None else f"typed {source.dtype}"] += 1
        return original(self, group, *args, **kwargs)  # type: ignore[arg-type]

    offload.OffloadEngine.issue = issue  # type: ignore[method-assign]
    try:
        with offrecomp.runtime(model, mode="offload", min_bytes=0):
            for _ in range(3):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = model(idx, tgt)
                loss.backward()
    finally:
        offload.OffloadEngine.issue = original  # type: ignore[method-assign]
    return seen


if __name__ == "__main__":
    for bf16 in (False, True):
        print("bf16 autocast" if bf16 else "fp32         ", dict(sorted(count(bf16).items())))
