"""Device bytes the offload engine still holds after graphs that end without a normal
backward, on the emulated backend (copies start 5 ms after they are queued).

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-07d/held_after.py

Six blocks of Linear(256, 256) + GELU on 512 x 256 inputs (two 512 KiB saves a block,
one 1 MiB group each), forced ``mode="offload"``, two ordinary steps first. Each case
prints the engine's ``device_bytes`` (stash, reloads, open groups) right after the
graph ends and 50 ms later (every copy landed by then), and whether the gradients it
computed equal a plain run's bitwise. Run from a checkout: it imports offrecomp from
the working tree.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from torch import nn

import offrecomp

MiB = 1 << 20


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(256, 256)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x))


def forward_keeping_inner(m: nn.Sequential) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss, and each block's Linear output (what the hooks saw)."""
    inner: list[torch.Tensor] = []
    hooks = [b.lin.register_forward_hook(lambda mod, args, out: inner.append(out)) for b in m]
    try:
        return m(batch(9)).pow(2).mean(), inner
    finally:
        for h in hooks:
            h.remove()


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(6)])


def batch(step: int) -> torch.Tensor:
    return torch.randn(512, 256, generator=torch.Generator().manual_seed(step))


def held(rt: offrecomp.Runtime) -> str:
    engine = rt.offload_engine
    return f"{(engine.device_bytes if engine is not None else 0) / MiB:.1f} MiB"


def dropped(m: nn.Sequential, rt: offrecomp.Runtime) -> list[torch.Tensor]:
    loss = m(batch(9)).pow(2).mean()
    del loss  # an evaluation forward with grad on, a loop's last forward
    return []


def raised_in_backward(m: nn.Sequential, rt: offrecomp.Runtime) -> list[torch.Tensor]:
    loss, inner = forward_keeping_inner(m)

    def stop(grad: torch.Tensor) -> torch.Tensor:
        raise KeyboardInterrupt

    inner[-1].register_hook(stop)  # inside the last block
    try:
        loss.backward()
    except KeyboardInterrupt:
        pass
    del loss, inner
    return []


def partial_grads(m: nn.Sequential, rt: offrecomp.Runtime | None) -> list[torch.Tensor]:
    loss, inner = forward_keeping_inner(m)
    loss.backward(retain_graph=True)
    grads = [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]
    for t in inner:  # later backwards that stop inside the blocks
        grads += torch.autograd.grad(loss, t, retain_graph=True)
    if rt is not None:
        print(f"    after the {len(inner)} later backwards, graph alive: {held(rt)}")
    del loss, inner
    return grads


def main() -> None:
    for case in (dropped, raised_in_backward, partial_grads):
        m = model()
        ref = copy.deepcopy(m)
        with offrecomp.runtime(m, mode="offload", min_bytes=0) as rt:
            for s in range(2):
                m(batch(s)).pow(2).mean().backward()
            got = case(m, rt)
            now = held(rt)
            time.sleep(0.05)
            print(f"{case.__name__:20s} right after: {now}, 50 ms later: {held(rt)}")
        for s in range(2):
            ref(batch(s)).pow(2).mean().backward()
        want = partial_grads(ref, None) if case is partial_grads else []
        same = all(torch.equal(a, b) for a, b in zip(got, want))
        same = same and all(torch.equal(a.grad, b.grad) for a, b in zip(m.parameters(), ref.parameters()))  # type: ignore[arg-type]
        print(f"{'':20s} bitwise: {same}")


if __name__ == "__main__":
    main()
