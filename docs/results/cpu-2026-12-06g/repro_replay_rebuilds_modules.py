"""A block that builds a submodule on first use in its forward (``if self.proj is None:
self.proj = nn.Linear(...)``, or ``self.mlp.insert(...)`` guarded by a flag) has it built
AGAIN by its replay, which sees the guard at its entry value (NOTE [Module attributes]);
the replay's new module replaces (or is inserted beside) the one the forward used and is
never taken out (only hooks are, NOTE [Hooks a replay registers]).
 * lazy proj: the model's proj after step 0 is the replay's orphan, with no gradient;
   the gradient went to the module the forward built, which the model no longer holds.
 * guarded insert: the Sequential holds the inserted EMA module twice after the replay,
   its buffer updated by both from then on."""
import sys, copy
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(1)
import offrecomp

class Lazy(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.proj = None
    def forward(self, x):
        if self.proj is None:
            self.proj = nn.Linear(x.shape[-1], x.shape[-1])
        return x + torch.tanh(self.fc(F.gelu(self.proj(x))))

class EMA(nn.Module):
    def __init__(self, d=16):
        super().__init__(); self.register_buffer("avg", torch.zeros(d))
    def forward(self, x):
        self.avg.mul_(0.9).add_(x.detach().mean(0), alpha=0.1); return x

class Inserts(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.GELU()); self.built = False
    def forward(self, x):
        if not self.built:
            self.mlp.insert(0, EMA()); self.built = True
        return x + torch.tanh(self.mlp(x))

fail = False
for cls in (Lazy, Inserts):
    torch.manual_seed(0)
    model = nn.Sequential(cls(), cls())
    ref = copy.deepcopy(model)
    x = torch.randn(4, 16)
    ref(x).square().mean().backward()
    with offrecomp.runtime(model, mode="recompute", min_bytes=0):
        model(x).square().mean().backward()
    names_r = {n: p.grad for n, p in ref.named_parameters()}
    names_g = {n: p.grad for n, p in model.named_parameters()}
    missing = [n for n in names_r if names_g.get(n) is None and names_r[n] is not None]
    nmods = (len(list(model.modules())), len(list(ref.modules())))
    bufs = (sorted(n for n, _ in model.named_buffers()), sorted(n for n, _ in ref.named_buffers()))
    print(cls.__name__, "params without grad under recompute:", missing, "| modules runtime/plain:", nmods, "| buffers:", bufs)
    fail |= bool(missing) or nmods[0] != nmods[1]
sys.exit(1 if fail else 0)
