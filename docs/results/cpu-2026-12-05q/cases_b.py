"""Tensor hooks, autograd graph hooks, hooks added/removed between steps, state_dict hooks,
load_state_dict, parametrize after runtime creation."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Block, Case, Stack, H, main, offrecomp, torch, nn, F, cp, _loss  # noqa: F401
from torch.nn.utils import parametrize
from torch.autograd.graph import register_multi_grad_hook


def base(cls=Block, n: int = 3) -> Stack:
    return Stack([cls() for _ in range(n)])


def with_inner(fn):
    """A Stack of Blocks whose ``inner(h)`` is ``fn(block, h, counts)``."""
    def factory() -> Case:
        c = Case(None)  # type: ignore[arg-type]
        class B(Block):
            def inner(self, h):
                return fn(self, h, c)
        c.model = base(B)
        return c
    factory.__name__ = fn.__name__
    return factory


# 1 tensor hook scaling the gradient of an intermediate
def tensor_hook_scale(self, h, c):
    def hk(g):
        c.counts["thook"] += 1
        return g * 0.5
    h.register_hook(hk)
    return h


# 2 tensor hook clipping the gradient of an intermediate (non-linear in grad)
def tensor_hook_clip(self, h, c):
    def hk(g):
        c.counts["thook_clip"] += 1
        return g.clamp(-2e-3, 2e-3)
    h = h * 1.0
    h.register_hook(hk)
    return h


# 3 hook on the region's own input registered inside the forward
class InputHookBlock(Block):
    def forward(self, x):
        if x.requires_grad:
            def hk(g):
                self._c["thook_in"] += 1
                return g.clamp(-1e-2, 1e-2)
            x.register_hook(hk)
        return super().forward(x)


def tensor_hook_input() -> Case:
    c = Case(base(InputHookBlock))
    for b in c.model.blocks:
        b._c = c.counts
    return c


# 4 post-accumulate-grad hooks on parameters, registered at build (scale .grad in place)
def post_acc_hook() -> Case:
    c = Case(base())
    def hk(p):
        c.counts["postacc"] += 1
        p.grad.mul_(0.5)
    for b in c.model.blocks:
        for p in b.parameters():
            p.register_post_accumulate_grad_hook(hk)
    return c


# 5 one-shot post-accumulate hook registered inside the forward (removes itself)
def post_acc_in_forward(self, h, c):
    p = self.fc2.weight
    handle = []
    def hk(param):
        c.counts["postacc_fwd"] += 1
        param.grad.mul_(0.5)
        handle[0].remove()
    handle.append(p.register_post_accumulate_grad_hook(hk))
    return h


# 6 one-shot tensor hook on a parameter registered inside the forward
def param_hook_in_forward(self, h, c):
    handle = []
    def hk(g):
        c.counts["phook_fwd"] += 1
        handle[0].remove()
        return g * 0.5
    handle.append(self.fc1.weight.register_hook(hk))
    return h


# 6b same, guarded by offrecomp.in_replay()
def param_hook_in_forward_guard(self, h, c):
    if offrecomp.in_replay():
        return h
    return param_hook_in_forward(self, h, c)


# 7 retain_grad on an intermediate kept on the module, read after backward
def retain_grad_attr(self, h, c):
    h.retain_grad()
    self.last_h = h
    return h


def retain_grad_attr_case() -> Case:
    c = with_inner(retain_grad_attr)()
    def after(step, model):
        out = {}
        for i, b in enumerate(model.blocks):
            g = b.last_h.grad
            out[f"hgrad{i}"] = g.clone() if g is not None else None
        return out
    c.after_backward = after
    return c


# 8 retain_grad on intermediates appended to a list the loop reads and clears
def retain_grad_list_case() -> Case:
    store = []
    def fn(self, h, c):
        h.retain_grad()
        store.append(h)
        return h
    c = with_inner(fn)()
    def after(step, model):
        out = {f"lgrad{i}": (t.grad.clone() if t.grad is not None else None) for i, t in enumerate(store[:3])}
        return out
    def between(step, model, opt):
        store.clear()
    c.after_backward = after
    c.between = between
    c.lists = lambda: {"store": len(store)}
    return c


# 9 grad_fn.register_hook and register_prehook inside forward
def grad_fn_hooks(self, h, c):
    h = h * 1.0
    def pre(grad_outputs):
        c.counts["gfn_pre"] += 1
        return (grad_outputs[0] * 0.5,)
    def post(grad_inputs, grad_outputs):
        c.counts["gfn_post"] += 1
        return (grad_inputs[0].clamp(-1e-2, 1e-2), *grad_inputs[1:])
    h.grad_fn.register_prehook(pre)
    h.grad_fn.register_hook(post)
    return h


# 10 register_multi_grad_hook over two intermediates (all and any)
def multi_grad_hook(self, h, c):
    a, b = h[..., : H], h[..., H:]
    def fn_all(grads):
        c.counts["mgh_all"] += 1
        c.counts["mgh_all_none"] += sum(g is None for g in grads)
    def fn_any(g):
        c.counts["mgh_any"] += 1
    register_multi_grad_hook((a, b), fn_all)
    register_multi_grad_hook((a, b), fn_any, mode="any")
    return torch.cat([a * 1.1, b], -1)


# 11 Node hooks on the block outputs (via a forward hook) and on the loss in the loop
def node_hooks_outputs() -> Case:
    c = Case(base())
    def fwd(mod, args, out):
        def post(gi, go):
            c.counts["out_node_post"] += 1
        def pre(go):
            c.counts["out_node_pre"] += 1
            return (go[0] * 0.9,)
        out.grad_fn.register_hook(post)
        out.grad_fn.register_prehook(pre)
    for b in c.model.blocks:
        b.register_forward_hook(fwd)
    # the root's output node too, through a root forward hook
    def root(mod, args, out):
        out.grad_fn.register_prehook(lambda go: (c.counts.update(["loss_pre"]), (go[0] * 3.0,))[1])
    c.model.register_forward_hook(root)
    return c


# 12 hooks added between steps (forward hook modifying a submodule's output, full backward hook on a block)
def hooks_added_between() -> Case:
    c = Case(base())
    def between(step, model, opt):
        if step == 1:
            model.blocks[1].fc1.register_forward_hook(lambda m, a, o: (c.counts.update(["added_fwd"]), o * 1.3)[1])
            model.blocks[2].register_full_backward_hook(
                lambda m, gi, go: (c.counts.update(["added_bwd"]), (gi[0] * 0.5,))[1])
            model.blocks[0].register_forward_pre_hook(lambda m, a: (c.counts.update(["added_pre"]), (a[0] * 0.8,))[1])
    c.between = between
    return c


# 13 hooks present from the start, removed mid-training
def hooks_removed_mid() -> Case:
    c = Case(base())
    hs = []
    for b in c.model.blocks:
        hs.append(b.fc1.register_forward_hook(lambda m, a, o: (c.counts.update(["rm_fwd"]), o * 1.3)[1]))
        hs.append(b.register_full_backward_hook(lambda m, gi, go: (c.counts.update(["rm_bwd"]), (gi[0] * 0.5,))[1]))
        hs.append(b.ln.register_forward_pre_hook(lambda m, a: (c.counts.update(["rm_pre"]), (a[0] * 2.0,))[1]))
    def between(step, model, opt):
        if step == 1:
            for h in hs:
                h.remove()
    c.between = between
    return c


# 14 added at step 1, removed at step 2 (region-level pre-hook and submodule forward hook)
def hooks_add_remove() -> Case:
    c = Case(base())
    hs = []
    def between(step, model, opt):
        if step == 0:
            for b in model.blocks:
                hs.append(b.register_forward_pre_hook(lambda m, a: (a[0] * 0.7,)))
                hs.append(b.fc2.register_forward_hook(lambda m, a, o: o + 0.1))
        if step == 1:
            for h in hs:
                h.remove()
    c.between = between
    return c


# 15 state_dict / load_state_dict hooks, state_dict taken inside the runtime each step
def state_dict_hooks() -> Case:
    c = Case(base())
    m = c.model
    def sd_pre(mod, prefix, keep_vars):
        c.counts["sd_pre"] += 1
    def sd_post(mod, sd, prefix, local_metadata):
        c.counts["sd_post"] += 1
    def ld_pre(mod, sd, prefix, *a):
        c.counts["ld_pre"] += 1
    def ld_post(mod, keys):
        c.counts["ld_post"] += 1
    for b in m.blocks:
        b.register_state_dict_pre_hook(sd_pre)
        b.register_state_dict_post_hook(sd_post) if hasattr(b, "register_state_dict_post_hook") else b._register_state_dict_hook(sd_post)
        b.register_load_state_dict_pre_hook(ld_pre)
        b.register_load_state_dict_post_hook(ld_post)
    def after(step, model):
        sd = model.state_dict()
        c.counts["sd_keys"] = len(sd)
        c.counts["sd_keys_hash"] = hash(tuple(sd.keys())) % 1000
        return {}
    def between(step, model, opt):
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(sd)  # a round trip inside the runtime
    c.after_backward = after
    c.between = between
    return c


class BNBlock(Block):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x):
        return self.bn(super().forward(x))


# 16 load_state_dict of step-0 weights between steps (in place, BN buffers too)
def load_state_between() -> Case:
    c = Case(base(BNBlock))
    saved = {}
    def between(step, model, opt):
        if step == 0:
            saved.update({k: v.clone() for k, v in model.state_dict().items()})
        if step == 1:
            model.load_state_dict(saved)
    c.between = between
    return c


# 17 load_state_dict(assign=True) between steps: new Parameter objects, new optimizer
def load_state_assign() -> Case:
    c = Case(base(BNBlock))
    saved = {}
    def between(step, model, opt):
        if step == 0:
            saved.update({k: v.clone() for k, v in model.state_dict().items()})
        if step == 1:
            model.load_state_dict({k: v.clone() for k, v in saved.items()}, assign=True)
            return torch.optim.SGD(model.parameters(), lr=0.1)
    c.between = between
    return c


# 18 load_state_dict with a load pre-hook that rewrites the incoming weights
def load_state_prehook() -> Case:
    c = Case(base())
    def ld_pre(mod, sd, prefix, *a):
        k = prefix + "fc1.weight"
        if k in sd:
            sd[k] = sd[k] * 0.5
    for b in c.model.blocks:
        b._register_load_state_dict_pre_hook(ld_pre, with_module=True)
    def between(step, model, opt):
        if step in (0, 2):
            model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
    c.between = between
    return c


class Softplus(nn.Module):
    def forward(self, X):
        return F.softplus(X)

    def right_inverse(self, W):
        return W.expm1().log()


class MagDir(nn.Module):
    def forward(self, m, V):
        return m * V / V.norm(dim=1, keepdim=True)

    def right_inverse(self, W):
        return W.norm(dim=1, keepdim=True), W


class Sym(nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).transpose(-1, -2)


def _pos_fc2(model):
    with torch.no_grad():
        for b in model.blocks:
            b.fc2.weight.abs_().add_(1e-3)


# 19 parametrization (with right_inverse) registered after the runtime was made, before entering
def param_after_create() -> Case:
    c = Case(base())
    _pos_fc2(c.model)
    def reg(model):
        for b in model.blocks:
            parametrize.register_parametrization(b.fc2, "weight", Softplus())
    c.after_create = reg
    # plain: same registration before training
    c._plain_reg = reg
    c.before = lambda step, model: (reg(model) if step == 0 and not parametrize.is_parametrized(model.blocks[0].fc2) else None)
    return c


# 20 parametrization registered inside the runtime between steps (step 1)
def param_between() -> Case:
    c = Case(base())
    _pos_fc2(c.model)
    def between(step, model, opt):
        if step == 1:
            for b in model.blocks:
                parametrize.register_parametrization(b.fc2, "weight", Softplus())
                parametrize.register_parametrization(b.ln, "weight", Softplus()) if False else None
    c.between = between
    return c


# 21 two originals (MagDir): new Parameters, optimizer rebuilt
def param_two_originals_between() -> Case:
    c = Case(base())
    def between(step, model, opt):
        if step == 1:
            for b in model.blocks:
                parametrize.register_parametrization(b.fc1, "weight", MagDir())
            return torch.optim.SGD(model.parameters(), lr=0.1)
    c.between = between
    return c


class OwnWeightBlock(Block):
    """A block holding a parameter of its own (parametrized on the block itself: its class changes)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(H, H) * 0.1)

    def forward(self, x):
        return super().forward(x) @ self.w.T + x


# 22 parametrization on the region module itself, registered inside the runtime (class swap)
def param_on_region_between() -> Case:
    c = Case(base(OwnWeightBlock))
    def between(step, model, opt):
        if step == 1:
            for b in model.blocks:
                parametrize.register_parametrization(b, "w", Sym())
    c.between = between
    return c


# 23 parametrization removed between steps (leave_parametrized=True)
def param_removed_between() -> Case:
    c = Case(base())
    _pos_fc2(c.model)
    for b in c.model.blocks:
        parametrize.register_parametrization(b.fc2, "weight", Softplus())
    def between(step, model, opt):
        if step == 1:
            for b in model.blocks:
                parametrize.remove_parametrizations(b.fc2, "weight", leave_parametrized=True)
            return torch.optim.SGD(model.parameters(), lr=0.1)
    c.between = between
    return c


# 24 weight assigned through parametrization's right_inverse between steps (module.weight = W)
def param_assign_right_inverse() -> Case:
    c = Case(base())
    _pos_fc2(c.model)
    for b in c.model.blocks:
        parametrize.register_parametrization(b.fc2, "weight", Softplus())
    def between(step, model, opt):
        if step in (0, 2):
            with torch.no_grad():
                for b in model.blocks:
                    b.fc2.weight = b.fc2.weight * 0.9 + 1e-3  # goes through right_inverse, in place on original
    c.between = between
    return c


CASES = {f.__name__: f for f in [
    with_inner(tensor_hook_scale), with_inner(tensor_hook_clip), tensor_hook_input, post_acc_hook,
    with_inner(post_acc_in_forward), with_inner(param_hook_in_forward), with_inner(param_hook_in_forward_guard),
    retain_grad_attr_case, retain_grad_list_case, with_inner(grad_fn_hooks), with_inner(multi_grad_hook),
    node_hooks_outputs, hooks_added_between, hooks_removed_mid, hooks_add_remove, state_dict_hooks,
    load_state_between, load_state_assign, load_state_prehook, param_after_create, param_between,
    param_two_originals_between, param_on_region_between, param_removed_between, param_assign_right_inverse,
]}

if __name__ == "__main__":
    main(CASES)
