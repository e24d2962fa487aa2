"""retain_graph=True with two backwards under mode="offload": the second backward's
reloads are booked into the NEXT step's record (h2d_bytes, groups_reloaded, stall), and
the last step's are lost. NOTE [Several backwards] (lifecycle.py) says the second backward
"counts in no step"; under recompute it indeed counts nowhere, under offload it shifts.
Exit 1 while the defect is present."""
import sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
torch.set_num_threads(1)
import offrecomp

class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__(); self.l1 = nn.Linear(d, 4 * d); self.l2 = nn.Linear(4 * d, d)
    def forward(self, x):
        return x + self.l2(torch.nn.functional.gelu(self.l1(x)))

class Net(nn.Module):
    def __init__(self):
        super().__init__(); self.blocks = nn.ModuleList([Block() for _ in range(4)]); self.head = nn.Linear(64, 1)
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).sum()

torch.manual_seed(0)
m = Net()
opt = torch.optim.SGD(m.parameters(), lr=0.0)
with offrecomp.runtime(m, mode="offload", min_bytes=0) as rt:
    for T in [16, 32, 8]:           # three steps, different sizes
        l = m(torch.randn(4, T, 64))
        l.backward(retain_graph=True)
        l.backward()
        opt.step(); opt.zero_grad()
bad = False
for s in rt.report().steps:
    print(f"step {s.step}: d2h_bytes={s.d2h_bytes} h2d_bytes={s.h2d_bytes}")
    # each step reloads what it offloaded (once per backward): h2d must be d2h or 2*d2h,
    # never bytes of another step
    if s.h2d_bytes not in (s.d2h_bytes, 2 * s.d2h_bytes):
        print(f"  -> step {s.step}: h2d_bytes {s.h2d_bytes} is neither 1x nor 2x its own d2h "
              f"{s.d2h_bytes}: it holds the previous step's second backward")
        bad = True
sys.exit(1 if bad else 0)
