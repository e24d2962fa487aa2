"""nn.Sequential.insert (and nn.ModuleList.insert) write `_modules` directly, so torch's
global module-registration hook never fires and offrecomp's Region refresh does not see
a module inserted into a region while the runtime is entered. A buffer-updating module
inserted that way (an EMA / running statistic) is then updated again by every replay:
silently wrong parameters under mode="recompute" (and auto), a ReplayDivergedError under
auto with serving replays. `.append()` of the same module (add_module -> hook) is fine.
Exit 1 while the defect is present."""
import sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn
import offrecomp
torch.set_num_threads(1)
H = 16

class EMA(nn.Module):
    def __init__(self):
        super().__init__(); self.register_buffer("avg", torch.zeros(()))
    def forward(self, x):
        if self.training:
            self.avg.mul_(0.9).add_(x.detach().mean() * 0.1)
        return x - self.avg

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H))
    def forward(self, x): return x + self.mlp(x)

class Net(nn.Module):
    def __init__(self):
        super().__init__(); self.blocks = nn.ModuleList(Block() for _ in range(3))
    def forward(self, x):
        for b in self.blocks: x = b(x)
        return x.square().mean()

def train(m, how):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for s in range(5):
        if s == 2:
            for b in m.blocks:
                if how == "insert": b.mlp.insert(1, EMA())
                else: b.mlp.append(EMA())
        x = torch.randn(4, 8, H, generator=torch.Generator().manual_seed(s))
        m(x).backward(); opt.step(); opt.zero_grad()

failed = False
for how in ["append", "insert"]:
    for mode, extra in [("recompute", {}), ("auto", {"budget": 1, "replay_op_us": 0})]:
        torch.manual_seed(0); ref = Net(); train(ref, how)
        torch.manual_seed(0); m = Net()
        try:
            with offrecomp.runtime(m, mode=mode, min_bytes=0, **extra):
                train(m, how)
            bad = [k for k, v in ref.state_dict().items() if not torch.equal(v, m.state_dict()[k])]
            res = f"{len(bad)} tensors differ from plain run {bad[:3]}" if bad else "bitwise equal"
        except Exception as e:
            bad = True; res = f"{type(e).__name__}: {str(e)[:160]}"
        print(f"{how:7s} {mode:9s} {res}")
        failed |= bool(bad)
print("DEFECT present" if failed else "ok")
sys.exit(1 if failed else 0)
