"""Repro: global torch state that a block's forward changes by hand and sets back after
its last saving op stays changed after a replay of that block, because the replay stops
early (right after its last needed save) and never runs the line that sets it back.
The state then holds for the rest of backward and for the next steps:

  * torch.set_default_dtype(float64) ... set_default_dtype(float32): the next step's
    batch is made in float64 and the model raises (dtype mismatch);
  * torch.set_float32_matmul_precision('medium') ... ('highest'): every later matmul
    runs in bf16 on a CPU with avx512_bf16, gradients differ (~1e-9);
  * torch.backends.mkldnn.enabled = False ... True: gradients differ (7e-10 here, 1e-8 with conv blocks in the sweep);
  * torch.set_num_threads(2) ... (1): gradients differ (5e-10 to 4e-9);
  * torch.use_deterministic_algorithms(True) ... (False): the flag stays on.

torch.utils.checkpoint(use_reentrant=False) does exactly the same (its early stop is on
by default), so by the sweep's rule this is "as checkpoint", not counted as an offrecomp
defect; offrecomp documents neither (docs/reliability.md names only always_call hooks
under "A replay's early stop"). With try/finally in the block everything is bitwise.
offrecomp already puts the default dtype back, but only when the forward's entry dtype
differs from the one at backward (offrecomp/replay.py: _replay_forward,
_default_dtype_as_forward), which is not the case here.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/repro_early_stop_global_state.py
Exits 1 while offrecomp leaves the state changed (also printed for checkpoint).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint as cp  # noqa: E402
from torch import nn  # noqa: E402

import offrecomp  # noqa: E402

W = 256


def _dtype_on():
    torch.set_default_dtype(torch.float64)


def _dtype_off():
    torch.set_default_dtype(torch.float32)


TOGGLES = {
    "default dtype": (_dtype_on, _dtype_off, lambda: str(torch.get_default_dtype())),
    "matmul precision": (lambda: torch.set_float32_matmul_precision("medium"),
                         lambda: torch.set_float32_matmul_precision("highest"),
                         torch.get_float32_matmul_precision),
    "mkldnn": (lambda: setattr(torch.backends.mkldnn, "enabled", False),
               lambda: setattr(torch.backends.mkldnn, "enabled", True),
               lambda: torch.backends.mkldnn.enabled),
    "threads": (lambda: torch.set_num_threads(2), lambda: torch.set_num_threads(1), torch.get_num_threads),
    "deterministic": (lambda: torch.use_deterministic_algorithms(True),
                      lambda: torch.use_deterministic_algorithms(False),
                      torch.are_deterministic_algorithms_enabled),
}


class Block(nn.Module):
    def __init__(self, on, off):
        super().__init__()
        self.ln = nn.LayerNorm(W)
        self.fc1 = nn.Linear(W, 2 * W)
        self.fc2 = nn.Linear(2 * W, W)
        self.on, self.off = on, off

    def forward(self, x):
        h = F.gelu(self.fc1(self.ln(x)))
        self.on()
        if self.on is _dtype_on:  # the last save: a float64 constant of the final mul
            y = (self.fc2(h).double() * torch.linspace(0.5, 1.5, W)).float()
        else:  # the last save: fc2's input
            y = self.fc2(h)
        self.off()  # not reached by an early-stopped replay
        return x + y


class Model(nn.Module):
    def __init__(self, on, off):
        super().__init__()
        self.blocks = nn.ModuleList([Block(on, off) for _ in range(3)])
        self.ckpt = False

    def forward(self, x):
        for b in self.blocks:
            x = cp.checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        return x.square().mean()


def reset():
    torch.set_default_dtype(torch.float32)
    torch.set_float32_matmul_precision("highest")
    torch.backends.mkldnn.enabled = True
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(False)


def run(model, read, ctx=None, steps=2):
    reset()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads, states = [], []
    try:
        with ctx if ctx is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            for s in range(steps):
                x = torch.randn(4, 16, W, generator=torch.Generator().manual_seed(s))
                model(x).backward()
                states.append(read())
                grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
                opt.step()
                opt.zero_grad()
    except Exception as e:  # noqa: BLE001
        return grads, states, f"{type(e).__name__}: {str(e)[:80]}"
    finally:
        reset()
    return grads, states, None


def compare(ref, got):
    d = 0.0
    for a, b in zip(ref, got):
        for k in a:
            d = max(d, (a[k].double() - b[k].double()).abs().max().item())
    return d


def main() -> int:
    bad = False
    for name, (on, off, read) in TOGGLES.items():
        torch.manual_seed(0)
        base = Model(on, off)
        ref, ref_states, err = run(copy.deepcopy(base), read)
        assert err is None, err
        ck = copy.deepcopy(base)
        ck.ckpt = True
        rows = {"checkpoint": run(ck, read)}
        m = copy.deepcopy(base)
        rt = offrecomp.runtime(m, mode="recompute", min_bytes=0)
        rows["offrecomp recompute"] = run(m, read, rt)
        rt.close()
        print(f"{name}: plain state after each backward {ref_states}")
        for label, (g, st, e) in rows.items():
            d = compare(ref, g)
            print(f"    {label:20s} state {st}  grads {'bitwise' if d == 0 and len(g) == len(ref) else f'max |diff| {d:.3g}'}"
                  + (f"  ERROR {e}" if e else ""))
        if rows["offrecomp recompute"][1] != ref_states[: len(rows["offrecomp recompute"][1])] or rows["offrecomp recompute"][2]:
            bad = True
    print("LEAK: offrecomp's early-stopped replays leave global state changed (as checkpoint's)" if bad else "OK")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
