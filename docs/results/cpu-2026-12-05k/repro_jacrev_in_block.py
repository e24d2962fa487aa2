"""``torch.func.jacrev`` (also ``grad``, ``vjp``, ``hessian``) called inside a region's
forward raises torch's own error under offrecomp, in every mode including ``keep``; the
same model trains plainly. Those transforms enter
``torch.autograd.graph.disable_saved_tensors_hooks``, which refuses while any saved-tensor
hook pair (offrecomp's) is registered. Documented (docs/reliability.md, "torch.func
transforms refuse saved-tensor hooks: call them outside `with rt:`"), but a transform
inside a block cannot be moved outside, and the error does not mention offrecomp.
``torch.func.jacfwd``, ``vmap`` and ``torch.autograd.forward_ad`` inside a block work
and replay bitwise (sweep_k: jacfwd_block, vmap_block, vmap_ensemble, fwd_ad_jvp).

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05k/repro_jacrev_in_block.py
"""

import torch
from torch import nn

import offrecomp

H = 8


class JacBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.a = nn.Parameter(torch.randn(H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        J = torch.func.jacrev(lambda a: torch.tanh(self.fc(a)))(self.a)
        return x + x @ J


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(JacBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.square().mean()


torch.manual_seed(0)
m = Stack()
x = torch.randn(4, H)
m(x).backward()
print("plain: ok")
for mode in ("keep", "recompute", "auto"):
    try:
        with offrecomp.runtime(m, mode=mode, min_bytes=0):
            m(x).backward()
        print(f"{mode}: ok")
    except RuntimeError as e:
        print(f"{mode}: RuntimeError: {e}")
