"""Hand-written loops: snntorch tutorial net (nn.Sequential, init_hidden=True, utils.reset(net)
before each batch, ce_rate_loss) and ncps LTC with apply_weight_constraints() after each step.
Models built twice from one seed (no deepcopy: snntorch's reset walks its class-level
instances list). 4 steps, bitwise vs plain.
    cd REPO && PYTHONPATH=DIR OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05s/loops_s.py [VARIANT,...]"""
import sys, time, traceback
from pathlib import Path
sys.argv += [] ; sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_s as S  # logging handler, packages
import torch, snntorch as snn
from torch import nn
from snntorch import surrogate, utils as snn_utils
import snntorch.functional as SF
from ncps.torch import LTC
from ncps.wirings import AutoNCP
from tests.helpers import ZOO_VARIANTS, assert_bitwise, check_variant_report, variant_runtime

def tutorial():
    g = surrogate.fast_sigmoid(25)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(2), snn.Leaky(beta=0.5, spike_grad=g, init_hidden=True),
                         nn.Conv2d(4, 8, 3), nn.MaxPool2d(2), snn.Leaky(beta=0.5, spike_grad=g, init_hidden=True),
                         nn.Flatten(), nn.Linear(8 * 2 * 2, 5), snn.Leaky(beta=0.5, spike_grad=g, init_hidden=True, output=True))

def tut_step(net, s):
    g = S._gen(s); x = torch.rand(6, 2, 1, 14, 14, generator=g) * 3; y = torch.randint(0, 5, (2,), generator=g)
    snn_utils.reset(net)
    spk_rec = []
    for t in range(6):
        spk, mem = net(x[t]); spk_rec.append(spk)
    return SF.ce_rate_loss()(torch.stack(spk_rec), y)

class LTCNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([LTC(16, AutoNCP(20, 16), batch_first=True) for _ in range(3)])
    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)[0]
        return S._loss(x)

def ltc_step(net, s):
    return net(torch.randn(2, 5, 16, generator=S._gen(s)))

def ltc_after(net):
    for b in net.blocks:
        b.rnn_cell.apply_weight_constraints()

CASES = {"snn_tutorial_reset": (tutorial, tut_step, None), "ltc_constraints": (LTCNet, ltc_step, ltc_after)}

def train(net, step, after, ctx=None, steps=4):
    import contextlib, random, numpy as np
    opt = torch.optim.SGD(net.parameters(), lr=0.1); out = []
    with ctx or contextlib.nullcontext():
        for i in range(steps):
            torch.manual_seed(i); random.seed(i); np.random.seed(i)
            loss = step(net, i); loss.backward()
            snap = {f"grad.{n}": p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
            snap.update({f"buf.{n}": b.detach().clone() for n, b in net.named_buffers()})
            snap["loss"] = loss.detach().clone(); out.append(snap)
            opt.step(); opt.zero_grad(set_to_none=True)
            if after: after(net)
    return out

def build(f):
    torch.manual_seed(0); return f().train()

variants = sys.argv[1].split(",") if len(sys.argv) > 1 else ZOO_VARIANTS
for name, (f, step, after) in CASES.items():
    for v in variants:
        t0 = time.time()
        try:
            ref = train(build(f), step, after)
            budget = None
            if v in ("auto_tight", "auto_serve"):
                p = build(f); k = variant_runtime(p, "keep"); train(p, step, after, k, steps=1)
                budget = k.report().steps[0].peak_activation_bytes // 2
            m = build(f); rt = variant_runtime(m, v, budget)
            assert_bitwise(ref, train(m, step, after, rt))
            check_variant_report(rt.report().steps, v, n_steps=4)
            print(f"PASS {name:20s} {v:12s} {time.time()-t0:5.1f}s regions={rt.regions if v == 'keep' else ''}", flush=True)
        except Exception as e:
            print(f"FAIL {name:20s} {v:12s} {type(e).__name__}: {str(e)[:300]}", flush=True)
