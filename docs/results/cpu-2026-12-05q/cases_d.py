"""Hooks whose presence differs between a forward and its backward."""
from __future__ import annotations
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Block, Case, Stack, H, main, offrecomp, torch, nn, F  # noqa: F401
from torch.nn.modules import module as M


def base(n: int = 3) -> Stack:
    return Stack([Block() for _ in range(n)])


# 1 modifying forward hook on a submodule, registered before each forward, removed before backward
def sub_hook_removed_before_bwd() -> Case:
    c = Case(base()); hs = []
    def before(step, model):
        for b in model.blocks:
            hs.append(b.fc1.register_forward_hook(lambda m, a, o: o * 1.3))
    def mid(step, model):
        for h in hs:
            h.remove()
        hs.clear()
    c.before, c.mid = before, mid
    return c


# 2 modifying forward hook on a submodule added after the forward, removed after backward
def sub_hook_added_after_fwd() -> Case:
    c = Case(base()); hs = []
    def mid(step, model):
        for b in model.blocks:
            hs.append(b.fc1.register_forward_hook(lambda m, a, o: o * 1.3))
    def after(step, model):
        for h in hs:
            h.remove()
        hs.clear()
        return {}
    c.mid, c.after_backward = mid, after
    return c


# 3 region-level modifying pre-hook removed before backward
def region_hook_removed_before_bwd() -> Case:
    c = Case(base()); hs = []
    def before(step, model):
        for b in model.blocks:
            hs.append(b.register_forward_pre_hook(lambda m, a: (a[0] * 1.3,)))
    def mid(step, model):
        for h in hs:
            h.remove()
        hs.clear()
    c.before, c.mid = before, mid
    return c


# 4 global modifying forward hook only around the forward (FGM-style perturbation of LayerNorm outputs)
def global_hook_around_fwd() -> Case:
    c = Case(base()); hs = []
    def before(step, model):
        hs.append(M.register_module_forward_hook(lambda m, a, o: o + 0.05 if isinstance(m, nn.LayerNorm) else None))
    def mid(step, model):
        for h in hs:
            h.remove()
        hs.clear()
    c.before, c.mid, c.cleanup = before, mid, mid.__get__ if False else (lambda: mid(0, None))
    return c


# 5 full backward hook registered between forward and backward (on a block and a submodule)
def bwd_hook_added_after_fwd() -> Case:
    c = Case(base()); hs = []
    def mid(step, model):
        for b in model.blocks:
            hs.append(b.fc2.register_full_backward_hook(lambda m, gi, go: (c.counts.update(["late_bwd"]), (gi[0] * 0.5,))[1]))
    def after(step, model):
        for h in hs:
            h.remove()
        hs.clear()
        return {}
    c.mid, c.after_backward = mid, after
    return c


CASES = {f.__name__: f for f in [sub_hook_removed_before_bwd, sub_hook_added_after_fwd, region_hook_removed_before_bwd,
                                  global_hook_around_fwd, bwd_hook_added_after_fwd]}

if __name__ == "__main__":
    main(CASES)
