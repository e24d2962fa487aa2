"""A tiny host_limit: the pool-full warning says the pool 'cannot take N more bytes
(0 of LIMIT reserved, 0 in use)' with N far below LIMIT, which reads as a contradiction:
the bytes of the storages already in the call's open group (the engine's _open_reserved,
the real reason) are not in the message. Exit 1 while the message is self-contradictory."""
import sys, re, logging, io
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
torch.set_num_threads(1)
import offrecomp

buf = io.StringIO()
h = logging.StreamHandler(buf); logging.getLogger("offrecomp").addHandler(h)

class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__(); self.l1 = nn.Linear(d, 4 * d); self.l2 = nn.Linear(4 * d, d)
    def forward(self, x):
        return x + self.l2(torch.nn.functional.gelu(self.l1(x)))
class Net(nn.Module):
    def __init__(self):
        super().__init__(); self.blocks = nn.ModuleList([Block() for _ in range(2)])
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.sum()

torch.manual_seed(0)
m = Net()
with offrecomp.runtime(m, mode="offload", min_bytes=0, host_limit="64KiB") as rt:
    m(torch.randn(2, 16, 64)).backward()
msg = buf.getvalue()
print(msg.strip())
mo = re.search(r"cannot take (\d+) more bytes \((\d+) of (\d+) reserved, (\d+) in use\)", msg)
if not mo:
    print("no pool-full warning"); sys.exit(0)
n, reserved, limit, in_use = map(int, mo.groups())
if in_use + n <= limit:
    print(f"-> contradictory: {n} + {in_use} in use <= limit {limit}, yet refused (open-group bytes not shown)")
    sys.exit(1)
sys.exit(0)
