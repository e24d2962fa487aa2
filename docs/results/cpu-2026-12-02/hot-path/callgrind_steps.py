"""Instructions of 20 steps of the host-overhead model, counted by callgrind.

    valgrind --tool=callgrind --toggle-collect=functools_reduce \
        --callgrind-out-file=cg.out python callgrind_steps.py          # MODE=offload (default)
    MODE=plain ... ; MODE=keep HOOKED=1 ... ; RS=100 ...                # the other rows

Only the 20 steps run inside ``functools.reduce``, so ``--toggle-collect`` counts them and
nothing of the imports or the warm-up. The emulated backend's workers are kept out of
the steps (a start delay beyond them): the counted thread runs every copy it waits for.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("ROOT", Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import offrecomp  # noqa: E402
from benchmarks.bench_host_overhead import _Model  # noqa: E402
from offrecomp import backends  # noqa: E402

backends.EmulatedBackend.__init__.__defaults__ = (0.0, 3600.0)  # also for trees that bind the default
backends.START_DELAY_S = 3600.0
torch.manual_seed(0)
n, region_saves = 200, int(os.environ.get("RS", "16"))
m, x = _Model(n, blocks=n // region_saves), torch.randn(16)
mode = os.environ.get("MODE", "offload")
kw: dict[str, Any] = {"native_keep": False} if os.environ.get("HOOKED") else {}
rt = offrecomp.runtime(m, mode=mode, min_bytes=0, **kw) if mode != "plain" else None


def step(acc: int, _: int) -> int:
    m(x).backward()
    return acc


with rt if rt is not None else contextlib.nullcontext():
    for _ in range(30):
        m(x).backward()
    gc.collect()
    gc.freeze()
    functools.reduce(step, range(20), 0)
