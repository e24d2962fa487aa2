"""Probe: under mode="offload", does the pinned pool's idle-block table (PinnedPool._idle,
NOTE [Idle blocks] in offrecomp/pool.py) grow without bound when every step has a new
sequence length (a new group size each step)? Tracks, every 25 steps: idle block count,
idle bytes, tensor objects held by the idle blocks (the engine's slot views), live
torch.Tensor objects, RSS, pool reserved bytes; and whether the pool ever flushes.

Model: tests/models.GPT(layers=3, h=32, heads=4, p=0.1); batch (2, T) with T = 8 + step
(never seen before) for STEPS steps; AdamW. Also runs a plain copy and compares losses
bitwise at every step.

cd /work/main && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python /tmp/sweep_soak/probe_idle_blocks.py [STEPS]
"""

import copy
import gc
import sys

sys.path.insert(0, "/work/main")
import psutil
import torch

import offrecomp
from tests import models

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 400
torch.set_num_threads(1)


def batch(step):
    return torch.randint(0, 64, (2, 8 + step), generator=torch.Generator().manual_seed(step))


def count_tensors_in(obj, seen=None, depth=0):
    n = 0
    stack = [(obj, 0)]
    seen = set()
    while stack:
        o, d = stack.pop()
        if id(o) in seen or d > 6:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            n += 1
            continue
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend((v, d + 1) for v in o)
        elif hasattr(o, "__dict__") and not isinstance(o, type):
            stack.extend((v, d + 1) for v in vars(o).values())
        elif hasattr(type(o), "__slots__"):
            for cls in type(o).__mro__:
                for s in getattr(cls, "__slots__", ()):
                    if hasattr(o, s):
                        stack.append((getattr(o, s), d + 1))
    return n


torch.manual_seed(0)
base = models.GPT(layers=3, h=32, heads=4, p=0.1)
plain = copy.deepcopy(base)
m = copy.deepcopy(base)
opt_p = torch.optim.AdamW(plain.parameters(), lr=1e-3)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
plain_losses = []
for step in range(STEPS):
    torch.manual_seed(step)
    loss = plain(batch(step))
    loss.backward()
    opt_p.step()
    opt_p.zero_grad(set_to_none=True)
    plain_losses.append(loss.item())

proc = psutil.Process()
rt = offrecomp.runtime(m, mode="offload", min_bytes=0)
flushes = 0
orig_flush = None
mismatch = []
rows = []
with rt:
    for step in range(STEPS):
        torch.manual_seed(step)
        loss = m(batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if loss.item() != plain_losses[step]:
            mismatch.append(step)
        if orig_flush is None and rt.offload_engine is not None:
            pool = rt.offload_engine.pool
            orig_flush = pool.flush_idle

            def counting_flush(_f=orig_flush):
                global flushes
                flushes += 1
                _f()

            pool.flush_idle = counting_flush
        if (step + 1) % 25 == 0:
            gc.collect()
            pool = rt.offload_engine.pool
            idle_blocks = sum(len(v) for v in pool._idle.values())
            idle_tensors = count_tensors_in(pool._idle)
            live = sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))
            st = pool.stats()
            rows.append((step + 1, idle_blocks, pool.idle_bytes, idle_tensors, live, proc.memory_info().rss // 1024,
                         st.reserved_bytes, st.slabs, flushes))
print("step idle_blocks idle_bytes idle_block_tensors live_tensors rss_KiB reserved slabs flushes")
for r in rows:
    print(*r)
print("loss mismatches vs plain:", mismatch[:5], len(mismatch))
first, last = rows[1], rows[-1]
print(f"slope of idle-block tensors per step (step {first[0]}..{last[0]}): {(last[3]-first[3])/(last[0]-first[0]):.1f}")
