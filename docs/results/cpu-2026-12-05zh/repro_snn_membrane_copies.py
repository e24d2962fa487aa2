"""A spiking net whose neurons keep their membrane in a buffer they rebind at every call
(snntorch's ``init_hidden=True``; loops_s.py's snn_tutorial_reset, written out with torch
only): each region call (a neuron) holds a copy of the membrane's entry value for its
replay (NOTE [Replay and module state]), though the entry tensor itself is held
(``BufferState.objects``) and unchanged, and the replay falls back to it when no copy was
taken (``replay._swap_buffers``). Since the copies are booked, recompute books more than
keep, and auto at half keep's books plans to drop nothing; the allocator shows what the
copies cost, and the books miss most of what recompute holds: each region call also
keeps the CPU generator state (torch.get_rng_state(), 5,056 bytes) for its replay,
unbooked (probe/p_rng_state_bytes.py).

Prints, for keep / recompute / auto at half keep's books (4 steps each): books per step,
allocator peak per step, bytes recomputed; and plain's allocator peak. Exits 1 while
recompute's allocator peak exceeds its books by more than keep's does, by over 10% of
keep's books (memory the books do not count).

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zh/repro_snn_membrane_copies.py
"""
import copy, gc, os, sys
sys.path.insert(0, os.getcwd())
import torch
from torch import nn
import offrecomp


def allocator_peak(fn):
    gc.collect()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = peak = 0
    for e in sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns()):
        if e.name() == "[memory]":
            cur += e.nbytes(); peak = max(peak, cur)
    return peak


class Spike(torch.autograd.Function):  # heaviside, fast-sigmoid surrogate (snntorch's)
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x > 0).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / (25 * x.abs() + 1) ** 2


class Leaky(nn.Module):
    def __init__(self, beta=0.5):
        super().__init__()
        self.register_buffer("beta", torch.tensor(beta))
        self.register_buffer("mem", torch.zeros(0))

    def reset(self):
        self.mem = torch.zeros(0)

    def forward(self, x):
        if self.mem.shape != x.shape:
            self.mem = torch.zeros_like(x)
        self.mem = self.beta * self.mem + x  # rebound at every call
        return Spike.apply(self.mem - 1.0)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(2), Leaky(), nn.Conv2d(4, 8, 3), nn.MaxPool2d(2), Leaky(),
                         nn.Flatten(), nn.Linear(32, 5), Leaky())


def step(m, s):
    g = torch.Generator().manual_seed(s)
    x = torch.rand(6, 2, 1, 14, 14, generator=g) * 3
    y = torch.randint(0, 5, (2,), generator=g)
    for mod in m.modules():
        if isinstance(mod, Leaky):
            mod.reset()
    out = torch.stack([m(x[t]) for t in range(6)])
    return nn.functional.cross_entropy(out.sum(0), y)


def run(m, rt=None, steps=4):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    peaks, grads = [], []
    for s in range(steps):
        def one():
            step(m, s).backward()
        if rt is None:
            peaks.append(allocator_peak(one))
        else:
            with rt:
                peaks.append(allocator_peak(one))
        grads.append([p.grad.clone() for p in m.parameters()])
        opt.step(); opt.zero_grad(set_to_none=True)
    return peaks, grads


plain_peaks, ref = run(net())
print(f"plain      allocator {plain_peaks}")
res = {}
for mode in ("keep", "recompute", "auto"):
    kw = {}
    if mode == "auto":
        kw["budget"] = res["keep"][0][0] // 2
    m = net()
    rt = offrecomp.runtime(m, mode=mode, min_bytes=0, regions=Leaky, **kw)
    peaks, grads = run(m, rt)
    bitwise = all(torch.equal(a, b) for g1, g2 in zip(ref, grads) for a, b in zip(g1, g2))
    st = rt.report().steps
    books = [s.peak_activation_bytes for s in st]
    res[mode] = (books, peaks, [s.recomputed_bytes for s in st])
    print(f"{mode:10s} books {books} allocator {peaks} recomputed {res[mode][2]} phases {[str(s.phase) for s in st]} "
          f"bitwise {bitwise}" + (f" budget {kw['budget']}" if kw else ""))
keep_alloc, rec_alloc = max(res["keep"][1][1:]), max(res["recompute"][1][1:])
print(f"allocator peak (steps 1-3): keep {keep_alloc}, recompute {rec_alloc} ({rec_alloc / keep_alloc:.3f}x); "
      f"books: keep {max(res['keep'][0])}, recompute {max(res['recompute'][0])}")
gap = (rec_alloc - max(res["recompute"][0])) - (keep_alloc - max(res["keep"][0]))
print(f"recompute holds {gap} B above its books more than keep does ({gap / max(res['keep'][0]):.2f}x keep's books)")
bad = gap > 0.1 * max(res["keep"][0])
sys.exit(1 if bad else 0)
