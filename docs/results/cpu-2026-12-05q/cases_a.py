"""Module hooks (block and inside blocks), global module hooks."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import *  # noqa: F403
from harness import cp, Block, Case, Stack, H, main, offrecomp, torch, nn, F
from torch.nn.modules import module as M


def base(n: int = 3, cls=Block) -> Stack:
    return Stack([cls() for _ in range(n)])


# 1 forward pre-hook on blocks with kwargs modifying inputs
def fpre_kwargs_block() -> Case:
    m = base(); c = Case(m)
    def hook(mod, args, kw):
        c.counts["fpre"] += 1
        return (args[0] * 0.9,), kw
    for b in m.blocks:
        b.register_forward_pre_hook(hook, with_kwargs=True)
    return c


# 2 forward hook on blocks modifying output, always_call
def fhook_block_always() -> Case:
    m = base(); c = Case(m)
    def hook(mod, args, out):
        c.counts["fhook"] += 1
        return out * 0.95 + 0.01 * args[0]
    for b in m.blocks:
        b.register_forward_hook(hook, always_call=True)
    return c


# 3 forward pre-hook on a submodule modifying input (counter)
def fpre_sub() -> Case:
    m = base(); c = Case(m)
    def hook(mod, args):
        c.counts["fpre_fc1"] += 1
        return (F.layer_norm(args[0], args[0].shape[-1:]),)
    for b in m.blocks:
        b.fc1.register_forward_pre_hook(hook)
    return c


# 4 forward hook on submodule modifying output, with kwargs and always_call
def fhook_sub() -> Case:
    m = base(); c = Case(m)
    def hook(mod, args, kw, out):
        c.counts["fhook_fc2"] += 1
        return torch.tanh(out)
    for b in m.blocks:
        b.fc2.register_forward_hook(hook, with_kwargs=True, always_call=True)
    return c


# 5 forward hook on submodule whose scale depends on a call counter (state changing)
def fhook_sub_stateful() -> Case:
    m = base(); c = Case(m)
    def hook(mod, args, out):
        c.counts["fhook_fc1"] += 1
        return out * (1.0 + 0.01 * c.counts["fhook_fc1"])
    for b in m.blocks:
        b.fc1.register_forward_hook(hook)
    return c


# 5b same, guarded by in_replay
def fhook_sub_stateful_guard() -> Case:
    m = base(); c = Case(m)
    def hook(mod, args, out):
        if not offrecomp.in_replay():
            c.counts["fhook_fc1"] += 1
            mod._scale = 1.0 + 0.01 * c.counts["fhook_fc1"]
        return out * mod._scale
    for b in m.blocks:
        b.fc1.register_forward_hook(hook)
    return c


# 6 full backward hook on blocks scaling grad_input
def bwd_full_block() -> Case:
    m = base(); c = Case(m)
    def hook(mod, gin, gout):
        c.counts["bfull_block"] += 1
        return tuple(None if g is None else g * 0.5 for g in gin)
    for b in m.blocks:
        b.register_full_backward_hook(hook)
    return c


# 7 full backward hook on a submodule clipping grad_input
def bwd_full_sub() -> Case:
    m = base(); c = Case(m)
    def hook(mod, gin, gout):
        c.counts["bfull_fc1"] += 1
        return tuple(None if g is None else g.clamp(-1e-3, 1e-3) for g in gin)
    for b in m.blocks:
        b.fc1.register_full_backward_hook(hook)
    return c


# 8 full backward pre-hook on blocks
def bwd_pre_block() -> Case:
    m = base(); c = Case(m)
    def hook(mod, gout):
        c.counts["bpre_block"] += 1
        return (gout[0] * 2.0,)
    for b in m.blocks:
        b.register_full_backward_pre_hook(hook)
    return c


# 9 full backward pre-hook on a submodule
def bwd_pre_sub() -> Case:
    m = base(); c = Case(m)
    def hook(mod, gout):
        c.counts["bpre_ln"] += 1
        return (gout[0] * 1.5,)
    for b in m.blocks:
        b.ln.register_full_backward_pre_hook(hook)
    return c


# 10 legacy backward hook on a Linear inside the block
def bwd_legacy_sub() -> Case:
    m = base(); c = Case(m)
    def hook(mod, gin, gout):
        c.counts["blegacy_fc2"] += 1
        return tuple(None if g is None else g * 0.5 for g in gin)
    for b in m.blocks:
        b.fc2.register_backward_hook(hook)
    return c


# 11 legacy backward hook on the block
def bwd_legacy_block() -> Case:
    m = base(); c = Case(m)
    def hook(mod, gin, gout):
        c.counts["blegacy_block"] += 1
        return tuple(None if g is None else g * 0.7 for g in gin)
    for b in m.blocks:
        b.register_backward_hook(hook)
    return c


# 12 Opacus-like: forward hook appends activations, backward hook pops them into grad_sample
def opacus_like() -> Case:
    m = base(); c = Case(m)
    lins = [mod for b in m.blocks for mod in (b.fc1, b.fc2)]
    for l in lins:
        l.acts = []
    def fwd(mod, args, out):
        c.counts["opacus_fwd"] += 1
        mod.acts.append(args[0].detach())
    def bwd(mod, gin, gout):
        c.counts["opacus_bwd"] += 1
        a = mod.acts.pop()
        gs = torch.einsum("n...i,n...j->nij", gout[0], a)
        mod.weight.grad_sample = gs
    for l in lins:
        l.register_forward_hook(fwd)
        l.register_full_backward_hook(bwd)
    def after(step, model):
        return {f"gs{i}": l.weight.grad_sample.clone() for i, l in enumerate(lins)}
    c.after_backward = after
    c.lists = lambda: {"acts": sum(len(l.acts) for l in lins)}
    return c


# 13 a forward hook storing the input, a backward hook reading it (one slot, no list)
def store_input_for_bwd() -> Case:
    m = base(); c = Case(m)
    def fwd(mod, args, out):
        mod._stored = args[0]
    def bwd(mod, gin, gout):
        c.counts["store_bwd"] += 1
        # per-sample grad norm from the stored input and the output gradient
        mod._gn = torch.einsum("n...i,n...j->nij", gout[0], mod._stored).flatten(1).norm(dim=1)
        # scale the input gradient by something depending on the stored input
        return (gin[0] * (1 + 0.1 * torch.tanh(mod._stored.mean())),)
    for b in m.blocks:
        b.fc2.register_forward_hook(fwd)
        b.fc2.register_full_backward_hook(bwd)
    c.after_backward = lambda s, model: {f"gn{i}": b.fc2._gn.clone() for i, b in enumerate(model.blocks)}
    return c


def _global(c: Case, reg, hook):
    handles = []
    def before(step, model):
        if step == 0:
            handles.append(reg(hook))
    c.before = before
    def cleanup():
        for h in handles:
            h.remove()
        handles.clear()
    c.cleanup = cleanup
    return c


# 14 global forward pre-hook: counts per class, modifies LayerNorm inputs
def global_fwd_pre() -> Case:
    m = base(); c = Case(m)
    def hook(mod, args):
        c.counts["gpre." + type(mod).__name__] += 1
        if isinstance(mod, nn.LayerNorm):
            return (args[0] * 1.1,)
    return _global(c, M.register_module_forward_pre_hook, hook)


# 15 global forward hook: counts per class, modifies GELU outputs
def global_fwd() -> Case:
    m = base(); c = Case(m)
    def hook(mod, args, out):
        c.counts["gfwd." + type(mod).__name__] += 1
        if isinstance(mod, nn.GELU):
            return out * 0.9
    return _global(c, M.register_module_forward_hook, hook)


# 16 global full backward hook: counts per class, scales Linear grad_input
def global_bwd() -> Case:
    m = base(); c = Case(m)
    def hook(mod, gin, gout):
        c.counts["gbwd." + type(mod).__name__] += 1
        if isinstance(mod, nn.Linear):
            return tuple(None if g is None else g * 0.9 for g in gin)
    return _global(c, M.register_module_full_backward_hook, hook)


# 16b global forward hook with always_call
def global_fwd_always() -> Case:
    m = base(); c = Case(m)
    def hook(mod, args, out):
        c.counts["gfwd_always." + type(mod).__name__] += 1
    return _global(c, lambda h: M.register_module_forward_hook(h, always_call=True), hook)


# 17 hooks on the root model (forward pre/forward/full backward)
def root_hooks() -> Case:
    m = base(); c = Case(m)
    def pre(mod, args):
        c.counts["root_pre"] += 1
        return (args[0] * 0.5,)
    def fwd(mod, args, out):
        c.counts["root_fwd"] += 1
        return out * 2.0
    def bwd(mod, gin, gout):
        c.counts["root_bwd"] += 1
    m.register_forward_pre_hook(pre)
    m.register_forward_hook(fwd)
    m.register_full_backward_hook(bwd)
    # the input must require grad for the root's full backward hook to see grad_input
    c.batch = lambda s: torch.randn(4, 6, H, generator=torch.Generator().manual_seed(1000 + s)).requires_grad_()
    return c


# 18 full backward hook on a block whose forward returns a tuple
class TupleBlock(Block):
    def forward(self, x):
        h = self.act(self.fc1(self.ln(x)))
        return x + self.fc2(self.drop(h)), h.mean()


class TupleStack(Stack):
    def forward(self, x):
        x = self.stem(x)
        aux = 0
        for b in self.blocks:
            x, a = cp.checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
            aux = aux + a
        from harness import _loss
        return _loss(x) + 0.1 * aux


def bwd_full_tuple() -> Case:
    m = TupleStack([TupleBlock() for _ in range(3)]); c = Case(m)
    def hook(mod, gin, gout):
        c.counts["bfull_tuple"] += 1
        return (gin[0] * 0.5,)
    def prehook(mod, gout):
        c.counts["bpre_tuple"] += 1
        return (gout[0], None if gout[1] is None else gout[1] * 3)
    for b in m.blocks:
        b.register_full_backward_hook(hook)
        b.register_full_backward_pre_hook(prehook)
    return c


CASES = {f.__name__: f for f in [
    fpre_kwargs_block, fhook_block_always, fpre_sub, fhook_sub, fhook_sub_stateful, fhook_sub_stateful_guard,
    bwd_full_block, bwd_full_sub, bwd_pre_block, bwd_pre_sub, bwd_legacy_sub, bwd_legacy_block,
    opacus_like, store_input_for_bwd, global_fwd_pre, global_fwd, global_bwd, global_fwd_always, root_hooks,
    bwd_full_tuple,
]}

if __name__ == "__main__":
    main(CASES)
