"""Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/cases_rng.py all [CASES [VARIANTS]] \
    | grep -v '^USDT' > docs/results/cpu-2026-12-05x/out_rng.txt

Sweep x, part D: random number sources inside blocks: torch.Generator objects held as
module attributes, passed as forward arguments (one per block, one shared, one made per
step), made inside the forward from a seed counter (a module attribute, a Python global,
the step's data), torch.random.fork_rng with a seed, torch.manual_seed inside a forward
(constant, from a counter attribute), get_rng_state/set_rng_state to draw one mask twice,
a module-held RNG state restored in the forward, dropout rates set per step (module p,
an F.dropout rate attribute), randperm/multinomial with generators."""

from __future__ import annotations

import itertools

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py

from harness import Block, Case, H, Stack, main, nn, torch, F, _gen


def stack(blocks=None, n=3, **kw) -> Stack:
    return Stack(blocks if blocks is not None else [Block() for _ in range(n)], **kw)


def _noise_mask(h, g):
    return (torch.rand(h.shape, generator=g) > 0.2).to(h.dtype) * 1.25


class GenAttr(Block):
    def __init__(self, i):
        super().__init__()
        self.g = torch.Generator().manual_seed(100 + i)

    def inner(self, h):
        return h * _noise_mask(h, self.g) + 0.01 * torch.randn(h.shape, generator=self.g)


def gen_attr() -> Case:
    return Case(stack([GenAttr(i) for i in range(3)]))


class GenArg(Block):
    def forward(self, x, generator=None):
        h = self.act(self.fc1(self.ln(x)))
        h = h * _noise_mask(h, generator)
        return x + self.fc2(self.drop(h))


def gen_arg_each() -> Case:
    gens = [torch.Generator().manual_seed(200 + i) for i in range(3)]
    return Case(stack([GenArg() for _ in range(3)], kw=lambda i: {"generator": gens[i]}))


def gen_arg_shared() -> Case:
    g = torch.Generator().manual_seed(300)
    return Case(stack([GenArg() for _ in range(3)], kw=lambda i: {"generator": g}))


def gen_arg_per_step() -> Case:
    holder = {}
    c = Case(stack([GenArg() for _ in range(3)], kw=lambda i: {"generator": holder["g"]}))

    def before(step, m):
        holder["g"] = torch.Generator().manual_seed(400 + step)

    c.before = before
    return c


class GenCounterAttr(Block):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def inner(self, h):
        self.calls += 1
        g = torch.Generator().manual_seed(500 + self.calls)
        return h * _noise_mask(h, g)


def gen_counter_attr() -> Case:
    return Case(stack([GenCounterAttr() for _ in range(3)]))


_GLOBAL = itertools.count()


class GenCounterGlobal(Block):
    def inner(self, h):
        g = torch.Generator().manual_seed(600 + next(_GLOBAL))
        return h * _noise_mask(h, g)


def gen_counter_global() -> Case:
    global _GLOBAL
    _GLOBAL = itertools.count()
    return Case(stack([GenCounterGlobal() for _ in range(3)]))


class GenFromData(Block):
    def inner(self, h):
        seed = int(h.detach().abs().sum().mul(1000).item()) % (2**31)
        g = torch.Generator().manual_seed(seed)
        return h * _noise_mask(h, g)


def gen_from_data() -> Case:
    return Case(stack([GenFromData() for _ in range(3)]))


class ForkRng(Block):
    def __init__(self, i):
        super().__init__()
        self.i = i

    def inner(self, h):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(700 + self.i)
            m = (torch.rand(h.shape) > 0.3).to(h.dtype)
        return F.dropout(h, 0.2, self.training) * m


def fork_rng_inside() -> Case:
    return Case(stack([ForkRng(i) for i in range(3)]))


class ManualSeedConst(Block):
    def inner(self, h):
        torch.manual_seed(7)
        return h * (torch.rand(h.shape) > 0.25).to(h.dtype)


def manual_seed_const() -> Case:
    return Case(stack([ManualSeedConst() for _ in range(3)]))


class ManualSeedCounter(Block):
    def __init__(self, i):
        super().__init__()
        self.i, self.calls = i, 0

    def inner(self, h):
        self.calls += 1
        torch.manual_seed(800 + 10 * self.calls + self.i)
        return h * (torch.rand(h.shape) > 0.25).to(h.dtype)


def manual_seed_counter() -> Case:
    return Case(stack([ManualSeedCounter(i) for i in range(3)]))


class SameMaskTwice(Block):
    def forward(self, x):
        h = self.act(self.fc1(self.ln(x)))
        st = torch.get_rng_state()
        a = self.drop(h)
        torch.set_rng_state(st)
        b = self.drop(h * 2)
        return x + self.fc2(a + b)


def get_set_rng_inside() -> Case:
    return Case(stack([SameMaskTwice() for _ in range(3)]))


class HeldState(Block):
    """Keeps an RNG state from its first call and restores it at every call: the same
    dropout mask each step (a 'frozen noise' trick)."""

    def __init__(self):
        super().__init__()
        self.state = None

    def forward(self, x):
        h = self.act(self.fc1(self.ln(x)))
        if self.state is None:
            self.state = torch.get_rng_state()
        outer = torch.get_rng_state()
        torch.set_rng_state(self.state)
        h = self.drop(h)
        torch.set_rng_state(outer)
        return x + self.fc2(h)


def held_rng_state() -> Case:
    return Case(stack([HeldState() for _ in range(3)]))


def drop_p_per_step() -> Case:
    c = Case(stack())

    def before(step, m):
        for b in m.blocks:
            b.drop.p = 0.05 + 0.1 * step

    c.before = before
    return c


class FDrop(Block):
    def __init__(self):
        super().__init__()
        self.rate = 0.1

    def inner(self, h):
        return F.dropout(h, self.rate, self.training)


def fdrop_rate_per_step() -> Case:
    c = Case(stack([FDrop() for _ in range(3)]))

    def before(step, m):
        for b in m.blocks:
            b.rate = [0.0, 0.3, 0.1, 0.5][step]

    c.before = before
    return c


class Shuffle(Block):
    def __init__(self, i):
        super().__init__()
        self.g = torch.Generator().manual_seed(900 + i)

    def inner(self, h):
        perm = torch.randperm(h.shape[1], generator=self.g)
        probs = torch.softmax(h.detach().mean(-1), -1)
        pick = torch.multinomial(probs, h.shape[1], replacement=True, generator=self.g)
        return h[:, perm] + 0.5 * torch.gather(h, 1, pick[..., None].expand_as(h))


def randperm_multinomial_gen() -> Case:
    return Case(stack([Shuffle(i) for i in range(3)]))


class BernoulliGen(Block):
    def __init__(self, i):
        super().__init__()
        self.g = torch.Generator().manual_seed(950 + i)

    def inner(self, h):
        p = torch.sigmoid(h.detach())
        return h * torch.bernoulli(p, generator=self.g) + torch.empty_like(h).normal_(generator=self.g) * 0.01


def bernoulli_normal_gen() -> Case:
    return Case(stack([BernoulliGen(i) for i in range(3)]))


CASES = {f.__name__: f for f in [
    gen_attr, gen_arg_each, gen_arg_shared, gen_arg_per_step, gen_counter_attr, gen_counter_global,
    gen_from_data, fork_rng_inside, manual_seed_const, manual_seed_counter, get_set_rng_inside,
    held_rng_state, drop_p_per_step, fdrop_rate_per_step, randperm_multinomial_gen, bernoulli_normal_gen,
]}

if __name__ == "__main__":
    main(CASES)
