"""A UNet (GroupNorm, encoder outputs kept in a list and concatenated into decoder blocks
later) under auto at budget=618688 B, with infeasible='warn' and infeasible='error':
each run's step peaks and the plan's budget line. Run from the repository root:
OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-03/frees-before-replay/unet.py"""
import sys; sys.path.insert(0, ".")
import torch, offrecomp
torch.set_num_threads(1)
import torch.nn as nn, torch.nn.functional as F

class EncBlock(nn.Module):
    def __init__(s, cin, cout):
        super().__init__()
        s.c1 = nn.Conv2d(cin, cout, 3, padding=1); s.n1 = nn.GroupNorm(4, cout)
        s.c2 = nn.Conv2d(cout, cout, 3, padding=1); s.n2 = nn.GroupNorm(4, cout)
        s.drop = nn.Dropout2d(0.1)
    def forward(s, x):
        x = F.silu(s.n1(s.c1(x)))
        return s.drop(F.silu(s.n2(s.c2(x))))

class DecBlock(nn.Module):
    def __init__(s, cin, cskip, cout):
        super().__init__()
        s.up = nn.Upsample(scale_factor=2, mode="nearest")
        s.c1 = nn.Conv2d(cin + cskip, cout, 3, padding=1); s.n1 = nn.GroupNorm(4, cout)
        s.drop = nn.Dropout(0.1)
    def forward(s, x, skip):
        x = s.up(x)
        x = torch.cat([x, skip], dim=1)
        return s.drop(F.silu(s.n1(s.c1(x))))

class UNet(nn.Module):
    def __init__(s):
        super().__init__()
        ch = [8, 8, 16, 16]
        s.stem = nn.Conv2d(3, 8, 3, padding=1)
        s.enc = nn.ModuleList([EncBlock(8, ch[0]), EncBlock(ch[0], ch[1]), EncBlock(ch[1], ch[2]), EncBlock(ch[2], ch[3])])
        s.mid = EncBlock(ch[3], ch[3])
        s.dec = nn.ModuleList([DecBlock(ch[3], ch[3], 16), DecBlock(16, ch[2], 16), DecBlock(16, ch[1], 8), DecBlock(8, ch[0], 8)])
        s.head = nn.Conv2d(8, 3, 1)
    def forward(s, x):
        h = s.stem(x)
        skips = []
        for b in s.enc:
            h = b(h); skips.append(h); h = F.avg_pool2d(h, 2)
        h = s.mid(h)
        for b in s.dec:
            h = b(h, skips.pop())
        return (s.head(h) - x).square().mean()


def batch(s): return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(s))
def go(infeasible):
    torch.manual_seed(0); m = UNet(); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    rt = offrecomp.runtime(m, mode="auto", budget=618688, min_bytes=0, infeasible=infeasible)
    try:
        with rt:
            for s in range(5):
                torch.manual_seed(s); m(batch(s)).backward(); opt.step(); opt.zero_grad()
    except Exception as e:
        print(infeasible, "RAISED", type(e).__name__, e)
    print(infeasible, "peaks", [r.peak_activation_bytes for r in rt.report().steps], "budget 618688")
    print(rt.explain().splitlines()[1:3])
go("warn"); go("error")
