"""What a saved-tensor hook pair on the thread's stack costs a backward that never calls
it: a chain of 200 tanh ops saved without hooks, then its backward timed (thread clock,
median of 200) with 0, 1, 2 and 4 identity pairs entered around ``backward()`` only.

    python tls_cost.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.autograd.graph import saved_tensors_hooks

w = torch.ones(16, requires_grad=True)
x = torch.randn(16)


def forward() -> torch.Tensor:
    y = x * w
    for _ in range(200):
        y = torch.tanh(y)
    return y.sum()


def backward_us(pairs: int) -> float:
    times = []
    for _ in range(200):
        loss = forward()
        ctxs = [saved_tensors_hooks(lambda t: t, lambda t: t) for _ in range(pairs)]
        for c in ctxs:
            c.__enter__()
        t0 = time.thread_time()
        loss.backward()
        times.append(time.thread_time() - t0)
        for c in reversed(ctxs):
            c.__exit__(None, None, None)
    return statistics.median(times) * 1e6


print(f"torch {torch.__version__}; backward of 202 nodes, us (median of 200), by hook pairs on the stack")
for _ in range(3):
    print({pairs: round(backward_us(pairs)) for pairs in (0, 1, 2, 4)})
