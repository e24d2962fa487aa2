"""Training loops users write, each under every mode, bitwise against plain.

    python docs/results/cpu-2026-12-05/loops_sweep.py [LOOP,LOOP ...|all] [MODEL,MODEL ...|all]

Prints PASS/FAIL per model, loop and mode (SKIP where plain training itself fails), then
the number of failures."""
import copy, sys, traceback
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from torch import nn
import offrecomp
from tests import models
from tests.helpers import assert_bitwise

H = 16
def stack(n=4, block=lambda: models.MLPBlock(H)):
    return models.Stack([block() for _ in range(n)])

def xb(s): return torch.randn(4, H, generator=torch.Generator().manual_seed(s))

def snap(m):
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros(0)) for n, p in m.named_parameters()} | {"b." + n: b.clone() for n, b in m.named_buffers()}

def run(loop, make, rt=None, steps=4):
    m = make()
    if rt is not None:
        rt = rt(m)
    out = []
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.05)
    ctx = rt if rt is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    with ctx:
        for s in range(steps):
            torch.manual_seed(s)
            opt.zero_grad(set_to_none=True)
            loop(m, s)
            out.append(snap(m))
            opt.step()
    return out, rt

# ----- loops
def functional(m, s):
    fast = {n: p * 0.99 for n, p in m.named_parameters()}
    torch.func.functional_call(m, fast, (xb(s),)).backward()

def bwd_hooks(m, s):
    if not getattr(m, "_hooked", False):
        m._hooked = True
        for b in m.blocks:
            b.register_full_backward_pre_hook(lambda mod, go: tuple(g * 0.5 if g is not None else g for g in go))
            b.register_full_backward_hook(lambda mod, gi, go: None)
    m(xb(s)).backward()

def tensor_hooks(m, s):
    if not getattr(m, "_hooked", False):
        m._hooked = True
        for b in m.blocks:
            b.register_forward_hook(lambda mod, a, out: out.register_hook(lambda g: g * 2.0) and None)
    m(xb(s)).backward()

def fwd_hooks(m, s):
    if not getattr(m, "_hooked", False):
        m._hooked = True
        for b in m.blocks:
            b.register_forward_pre_hook(lambda mod, a: (a[0] * 1.5,))
            b.register_forward_hook(lambda mod, a, out: out.tanh())
    m(xb(s)).backward()

def fgsm(m, s):
    x = xb(s).requires_grad_()
    gx, = torch.autograd.grad(m(x), x)
    m(x.detach() + 0.1 * gx.sign()).backward()

def inputs_subset(m, s):
    ps = list(m.blocks[-1].parameters()) + list(m.blocks[0].parameters())
    m(xb(s)).backward(inputs=ps)

def frozen_half(m, s):
    for b in list(m.blocks)[:2]:
        b.requires_grad_(False)
    m(xb(s)).backward()

def nograd_first(m, s):
    x = xb(s)
    with torch.no_grad():
        x = m.blocks[0](x)
    for b in list(m.blocks)[1:]:
        x = b(x)
    x.square().mean().backward()

def tbptt(m, s):
    h = torch.zeros(4, H)
    for c in range(3):
        x = xb(10 * s + c)
        for b in m.blocks:
            h = b(h + x)
        h.square().mean().backward()
        h = h.detach()

def nonscalar(m, s):
    x = xb(s)
    for b in m.blocks:
        x = b(x)
    x.backward(gradient=torch.ones_like(x) / x.numel())

def grad_norm_clip(m, s):
    m(xb(s)).backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 0.01)

LOOPS = dict(functional=functional, bwd_hooks=bwd_hooks, tensor_hooks=tensor_hooks, fwd_hooks=fwd_hooks, fgsm=fgsm,
             inputs_subset=inputs_subset, frozen_half=frozen_half, nograd_first=nograd_first, tbptt=tbptt,
             nonscalar=nonscalar, clip=grad_norm_clip)

# ----- models
class SNBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.utils.parametrizations.spectral_norm(nn.Linear(H, H))
        self.fc2 = nn.utils.parametrizations.weight_norm(nn.Linear(H, H))
    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc(x)))

class OldSNBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.utils.spectral_norm(nn.Linear(H, H))
    def forward(self, x):
        return x + torch.tanh(self.fc(x))

class MHABlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(H, 2, batch_first=True, dropout=0.1)
        self.ln = nn.LayerNorm(H)
    def forward(self, x):
        y = self.ln(x).unsqueeze(1).expand(-1, 3, -1)
        a, w = self.att(y, y, y, need_weights=True)
        return x + a.mean(1) + w.mean()

class TiedBlock(nn.Module):
    shared = None
    def __init__(self):
        super().__init__()
        if TiedBlock.shared is None:
            TiedBlock.shared = nn.Linear(H, H)
        self.fc = TiedBlock.shared
        self.own = nn.Linear(H, H)
    def forward(self, x):
        return x + torch.tanh(self.own(self.fc(x)))

def tied():
    TiedBlock.shared = None
    return stack(block=TiedBlock)

MODELS = dict(mlp=lambda: stack(), sn=lambda: stack(block=SNBlock), oldsn=lambda: stack(block=OldSNBlock),
              mha=lambda: stack(block=MHABlock), tied=tied,
              tel=lambda: models.Stack([nn.TransformerEncoderLayer(H, 2, 32, dropout=0.1, batch_first=True) for _ in range(3)]))

MODES = {"keep": dict(mode="keep"), "recompute": dict(mode="recompute"), "offload": dict(mode="offload"),
         "auto": dict(mode="auto"), "tight": dict(mode="auto", budget=1)}

def main():
    ls = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] != "all" else list(LOOPS)
    ms = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] != "all" else list(MODELS)
    bad = 0
    for mn in ms:
        for ln in ls:
            torch.manual_seed(0)
            base = MODELS[mn]()
            make = lambda: copy.deepcopy(base)
            loop = LOOPS[ln]
            if mn == "tel":
                loop = _seq(loop)
            try:
                ref, _ = run(loop, make)
            except Exception as e:
                print(f"SKIP {mn} {ln}: plain raised {type(e).__name__}: {e}"[:200]); continue
            for mo, kw in MODES.items():
                try:
                    got, rt = run(loop, make, lambda m: offrecomp.runtime(m, min_bytes=0, **kw))
                    assert_bitwise(ref, got)
                    st = rt.report().steps
                    print(f"PASS {mn:6s} {ln:14s} {mo:9s} rec={st[-1].recomputed_bytes} off={st[-1].offloaded_bytes} phase={st[-1].phase}", flush=True)
                except Exception as e:
                    bad += 1
                    print(f"FAIL {mn:6s} {ln:14s} {mo:9s} {type(e).__name__}: {str(e)[:250]}", flush=True)
                    if "-v" in sys.argv: traceback.print_exc()
    print("bad", bad)

def _seq(loop):
    # TransformerEncoderLayer wants (B, T, H)
    def f(m, s):
        global xb
        old = xb
        xb = lambda k: old(k).view(2, 2, H)
        try:
            loop(m, s)
        finally:
            xb = old
    return f

if __name__ == "__main__":
    main()
