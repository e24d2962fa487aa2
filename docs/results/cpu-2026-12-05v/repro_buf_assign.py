"""A block whose registered buffer is reassigned inside its forward (None at the first chunk, a
non-detached tensor after): auto re-measures every other step, then warns that call inputs vary
'from step to step' although every step runs the same structure. Gradients stay bitwise.
Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05v/repro_buf_assign.py [attr|buffer|buffer_detach]"""
import copy, logging, sys
import torch
from torch import nn
import offrecomp

KIND = sys.argv[1] if len(sys.argv) > 1 else "buffer"
logging.getLogger("offrecomp").addHandler(logging.StreamHandler(sys.stdout))


class Blk(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)
        if KIND.startswith("buffer"):
            self.register_buffer("c", None)
        else:
            self.c = None

    def forward(self, x):
        y = torch.tanh(self.l(x if self.c is None else x + self.c))
        self.c = y.detach() if KIND == "buffer_detach" else y   # carried to the next chunk
        return y


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Blk() for _ in range(2)])

    def forward(self, x):
        for b in self.blocks:
            b.c = None
        outs = []
        for ch in x.split(4, 1):          # 3 chunks, cache carried between them
            for b in self.blocks:
                ch = b(ch)
            outs.append(ch)
        for b in self.blocks:
            b.c = None
        return torch.cat(outs, 1).square().mean()


torch.manual_seed(0)
m = Net()
ref, got = copy.deepcopy(m), copy.deepcopy(m)
xs = [torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(i)) for i in range(10)]
with offrecomp.runtime(got, mode="auto", min_bytes=0) as rt:
    for x in xs:
        got(x).backward()
for x in xs:
    ref(x).backward()
print("grads equal:", all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), got.parameters())))
print(KIND, "phases:", "".join(r.phase[0] for r in rt.report().steps))
