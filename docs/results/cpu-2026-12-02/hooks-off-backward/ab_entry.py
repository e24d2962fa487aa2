"""Host time per saved tensor over plain with the backward entry wrapped (the runtime's
hook pair off while a backward runs, NOTE [Hooks off in backward]) and not, in one
process, interleaved round by round, thread clock, heap frozen after the warm-up.

    python ab_entry.py [--rounds 15] [--reps 20]

The model is benchmarks/bench_host_overhead.py's: 200 tanh ops on 16 elements, each
output saved; offload and auto in regions of 16 saves.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import offrecomp  # noqa: E402
from benchmarks.bench_host_overhead import _Model  # noqa: E402
from offrecomp import _torch_compat as tc  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=15)
ap.add_argument("--reps", type=int, default=20)
args = ap.parse_args()
torch.manual_seed(0)
x = torch.randn(16)
plain_model = _Model(200, blocks=200 // 16)
variants: dict[str, tuple[Any, Any]] = {}
for name, mode, kw in (
    ("keep", "keep", {}),
    ("keep, hooks on", "keep", {"native_keep": False}),
    ("offload", "offload", {}),
    ("auto (ample budget)", "auto", {}),
):
    m = _Model(200, blocks=200 // 16)
    variants[name] = (m, offrecomp.runtime(m, mode=mode, min_bytes=0, **kw))


def steps(m: Any) -> float:
    t0 = time.thread_time()
    for _ in range(args.reps):
        m(x).backward()
    return (time.thread_time() - t0) / args.reps


for m, rt in variants.values():  # warm-up: measuring passes, plans, pools
    with rt:
        for _ in range(40):
            m(x).backward()
gc.collect()
gc.freeze()
times: dict[str, list[float]] = {"plain": []}
for r in range(args.rounds):
    times["plain"].append(steps(plain_model))
    for name, (m, rt) in variants.items():
        for wrapped in (True, False) if r % 2 else (False, True):
            with rt:
                entry = tc.backward_entry()
                if not wrapped:  # the entry torch.autograd had before the runtime wrapped it
                    from offrecomp import backward_entry

                    tc.set_backward_entry(backward_entry._inner)  # type: ignore[arg-type]
                try:
                    times.setdefault(f"{name}|{wrapped}", []).append(steps(m))
                finally:
                    tc.set_backward_entry(entry)
plain = statistics.median(times["plain"])
print(f"torch {torch.__version__}, {args.rounds} rounds of {args.reps} steps, thread clock, heap frozen")
print(f"plain: {plain * 1e3:.3f} ms per step (201 saves)")
print(f"{'variant':24s} {'pair on':>10s} {'pair off':>10s}   us per saved tensor over plain (median)")
for name in variants:
    on, off = (statistics.median(times[f"{name}|{w}"]) for w in (False, True))
    print(f"{name:24s} {(on - plain) / 201 * 1e6:10.2f} {(off - plain) / 201 * 1e6:10.2f}")
