"""Hooks drawing random numbers, shared modules, registration hooks, lazy hooks, prepend,
in_replay-guarded attribute."""
from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Block, Case, Stack, H, main, offrecomp, torch, nn, F, cp  # noqa: F401
from torch.nn.modules import module as M


def base(cls=Block, n: int = 3) -> Stack:
    return Stack([cls() for _ in range(n)])


# 1 submodule forward hook injecting torch noise
def hook_torch_noise() -> Case:
    c = Case(base())
    def hk(m, a, o):
        c.counts["noise"] += 1
        return o + 0.01 * torch.randn_like(o)
    for b in c.model.blocks:
        b.fc1.register_forward_hook(hk)
    return c


# 2 submodule forward hook drawing from Python's random
def hook_py_random() -> Case:
    c = Case(base())
    def hk(m, a, o):
        c.counts["pyrand"] += 1
        return o * (1.0 + 0.1 * random.random())
    for b in c.model.blocks:
        b.fc2.register_forward_hook(hk)
    return c


# 3 region-level pre-hook and post-hook drawing torch noise
def region_hook_noise() -> Case:
    c = Case(base())
    def pre(m, a):
        return (a[0] + 0.01 * torch.randn_like(a[0]),)
    def post(m, a, o):
        return o + 0.01 * torch.rand_like(o)
    for b in c.model.blocks:
        b.register_forward_pre_hook(pre)
        b.register_forward_hook(post)
    return c


# 4 one Linear shared by all blocks, with a forward hook and a full backward hook on it
class SharedBlock(Block):
    pass


def shared_module_hooks() -> Case:
    c = Case(base(SharedBlock))
    shared = nn.Linear(2 * H, H)
    for b in c.model.blocks:
        b.fc2 = shared
    def fwd(m, a, o):
        c.counts["sh_fwd"] += 1
        return o * 0.9
    def bwd(m, gi, go):
        c.counts["sh_bwd"] += 1
        return (gi[0] * 0.5,)
    shared.register_forward_hook(fwd)
    shared.register_full_backward_hook(bwd)
    return c


# 5 global registration hooks (buffer / parameter / module): does the runtime register anything?
def registration_hooks() -> Case:
    c = Case(base())
    hs = []
    def before(step, model):
        if step == 0:
            hs.append(M.register_module_buffer_registration_hook(lambda m, n, b: c.counts.update(["reg_buf." + n])))
            hs.append(M.register_module_parameter_registration_hook(lambda m, n, p: c.counts.update(["reg_param." + n])))
            hs.append(M.register_module_module_registration_hook(lambda m, n, s: c.counts.update(["reg_mod." + n])))
    def cleanup():
        for h in hs:
            h.remove()
        hs.clear()
    c.before = before
    c.cleanup = cleanup
    return c


# 6 lazy init in a forward pre-hook: registers a buffer (and a parameter) on the first call
def lazy_hook_register() -> Case:
    c = Case(base())
    def pre(m, a):
        if not hasattr(m, "scale_buf"):
            c.counts["lazy_init"] += 1
            m.register_buffer("scale_buf", torch.full((a[0].shape[-1],), 0.9))
            m.extra = nn.Parameter(torch.zeros(a[0].shape[-1]))
        return (a[0] * m.scale_buf + m.extra,)
    for b in c.model.blocks:
        b.fc1.register_forward_pre_hook(pre)
    # the optimizer built before the first forward misses m.extra in both runs alike
    return c


# 7 prepend=True hooks on blocks and submodules mixed with normal ones (order matters)
def prepend_hooks() -> Case:
    c = Case(base())
    for b in c.model.blocks:
        b.fc1.register_forward_hook(lambda m, a, o: o * 2.0)
        b.fc1.register_forward_hook(lambda m, a, o: o + 1.0, prepend=True)
        b.register_forward_pre_hook(lambda m, a: (a[0] * 0.5,))
        b.register_forward_pre_hook(lambda m, a: (a[0] - 0.1,), prepend=True)
        b.register_full_backward_hook(lambda m, gi, go: (gi[0] * 0.5,))
        b.register_full_backward_hook(lambda m, gi, go: (gi[0] + 1e-3,), prepend=True)
    return c


# 8 in_replay-guarded attribute set in a submodule forward hook (attribute present from build)
def guard_attr_init() -> Case:
    c = Case(base())
    def hook(mod, args, out):
        if not offrecomp.in_replay():
            c.counts["fhook_fc1"] += 1
            mod._scale = 1.0 + 0.01 * c.counts["fhook_fc1"]
        return out * mod._scale
    for b in c.model.blocks:
        b.fc1._scale = 1.0
        b.fc1.register_forward_hook(hook)
    return c


# 9 in_replay-guarded attribute set in the block's own forward (no hook)
class GuardBlock(Block):
    calls = 0

    def __init__(self):
        super().__init__()
        self.temp = 1.0

    def forward(self, x):
        if not offrecomp.in_replay():
            GuardBlock.calls += 1
            self.temp = 1.0 + 0.01 * GuardBlock.calls  # an annealed temperature, set once per call
        return super().forward(x) * self.temp


def guard_attr_forward() -> Case:
    GuardBlock.calls = 0
    return Case(base(GuardBlock))


# 10 the same state set by the loop between steps (no guard): the documented-safe form
class TempBlock(Block):
    def __init__(self):
        super().__init__()
        self.temp = 1.0

    def forward(self, x):
        return super().forward(x) * self.temp


def attr_set_between_steps() -> Case:
    c = Case(base(TempBlock))
    def before(step, model):
        for b in model.blocks:
            b.temp = 1.0 + 0.01 * step
    c.before = before
    return c


# 11 forward hook on a region that registers a tensor hook on the region's output,
# and a backward hook on a submodule that reads an attribute the region's forward hook set
def cross_hook_state() -> Case:
    c = Case(base())
    def fwd(m, a, o):
        m.fc2._gate = o.detach().abs().mean()
        o.register_hook(lambda g: g * 0.5)
        return o
    def bwd(m, gi, go):
        c.counts["cross_bwd"] += 1
        return (gi[0] * (1 + m._gate),)
    for b in c.model.blocks:
        b.register_forward_hook(fwd)
        b.fc2.register_full_backward_hook(bwd)
    return c


CASES = {f.__name__: f for f in [
    hook_torch_noise, hook_py_random, region_hook_noise, shared_module_hooks, registration_hooks,
    lazy_hook_register, prepend_hooks, guard_attr_init, guard_attr_forward, attr_set_between_steps,
    cross_hook_state,
]}

if __name__ == "__main__":
    main(CASES)
