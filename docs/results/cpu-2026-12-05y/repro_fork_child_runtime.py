"""Repro: a process forked (torch.multiprocessing / multiprocessing, start method "fork",
the Linux default) while the parent is inside `with rt:` inherits the parent's runtime as
the process's active runtime and its saved-tensor hook pair on the child's thread:

  * the child cannot use offrecomp for its own model: `with offrecomp.runtime(C):`
    raises "another offrecomp runtime is already active ... exit the first one", though
    the child entered none (the parent's `with rt:` block is not running in the child);
  * the child's plain autograd (no runtime of its own) goes through the parent runtime's
    pack/unpack hooks (its gradients were still bitwise in the sweep).

The parent trains model A under offrecomp; between step 1's forward and backward it
starts a fork child that (1) reports what it inherited and (2) trains model C under its
own offrecomp runtime.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05y/repro_fork_child_runtime.py
"""

import sys
from pathlib import Path
import time

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import torch
import torch.multiprocessing as mp
from torch import nn

import offrecomp
from offrecomp import _torch_compat as tc
from offrecomp import context as octx

torch.set_num_threads(1)


def net():
    return nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(3)])


def child(q):
    info = {"hook pair on the child's thread": tc.top_saved_tensors_hooks() is not None,
            "runtime marked active in the child": octx._active is not None}
    try:
        torch.manual_seed(7)
        c = net()
        with offrecomp.runtime(c, mode="recompute", min_bytes=0):
            c(torch.randn(4, 32)).pow(2).mean().backward()
        info["child's own runtime"] = "ok"
    except RuntimeError as e:
        info["child's own runtime"] = f"RuntimeError: {str(e)[:160]}..."
    q.put(info)


if __name__ == "__main__":
    ctx = mp.get_context("fork")
    q = ctx.SimpleQueue()
    torch.manual_seed(0)
    a = net()
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    with offrecomp.runtime(a, mode="recompute", min_bytes=0):
        for s in range(3):
            loss = a(torch.randn(4, 32)).pow(2).mean()
            if s == 1:
                p = ctx.Process(target=child, args=(q,))
                p.start()
            loss.backward()
            opt.step()
            opt.zero_grad()
    t0 = time.time()
    while q.empty() and time.time() - t0 < 60:
        time.sleep(0.05)
    info = q.get() if not q.empty() else {"child": "no answer"}
    p.join(30)
    for k, v in info.items():
        print(f"{k}: {v}")
    bad = info.get("child's own runtime") != "ok"
    if bad:
        print("WRONG: a fork child cannot enter a runtime of its own; it inherited the parent's as active")
    sys.exit(1 if bad else 0)
