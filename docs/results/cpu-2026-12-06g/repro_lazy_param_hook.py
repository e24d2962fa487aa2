"""A block registers a gradient hook on its own parameter once, on first use, guarded by
a plain flag attribute. offrecomp's replay restores the flag to its entry value (NOTE
[Module attributes]), so the replay of the first call registers the hook a second time:
the parameter's gradient is scaled twice from step 0 on, silently. torch.utils.checkpoint
(which does not restore the flag) gives the plain gradients."""
import sys, copy, warnings
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
import torch, torch.nn as nn, torch.nn.functional as F
import torch.utils.checkpoint as ckpt
import offrecomp

class Block(nn.Module):
    def __init__(self, h=32, use_ckpt=False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)
        self._hooked = False
        self.use_ckpt = use_ckpt
    def body(self, x):
        if not self._hooked:                     # one-time lazy setup
            self.fc1.weight.register_hook(lambda g: g * 0.5)
            self._hooked = True
        return x + self.fc2(F.gelu(self.fc1(x)))
    def forward(self, x):
        if self.use_ckpt:
            return ckpt.checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)

class Model(nn.Module):
    def __init__(self, use_ckpt=False):
        super().__init__()
        self.blocks = nn.ModuleList([Block(use_ckpt=use_ckpt) for _ in range(2)])
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.pow(2).mean()

def grads(model, mode=None, steps=3):
    out = []
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0))
    ctx = offrecomp.runtime(model, mode=mode, min_bytes=0) if mode else None
    if ctx: ctx.__enter__()
    try:
        for _ in range(steps):
            model(x).backward()
            out.append(model.blocks[0].fc1.weight.grad.clone())
            model.zero_grad(set_to_none=True)
    finally:
        if ctx: ctx.__exit__(None, None, None)
    n_hooks = len(model.blocks[0].fc1.weight._backward_hooks or {})
    return out, n_hooks

torch.manual_seed(0)
base = Model()
ref, ref_hooks = grads(copy.deepcopy(base))
ck_model = Model(use_ckpt=True); ck_model.load_state_dict(base.state_dict())
ck, ck_hooks = grads(ck_model)
print("torch.utils.checkpoint bitwise:", all(torch.equal(a, b) for a, b in zip(ref, ck)), "hooks on fc1.weight:", ck_hooks)
bad = False
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    for mode in ("keep", "offload", "recompute", "auto"):
        got, hooks = grads(copy.deepcopy(base), mode)
        same = [torch.equal(a, b) for a, b in zip(ref, got)]
        ratio = (got[0].norm() / ref[0].norm()).item()
        print(f"{mode:9s} bitwise per step: {same}  |g|/|g_plain| step0 = {ratio:.3f}  hooks on fc1.weight: {hooks} (plain: {ref_hooks})")
        bad |= not all(same)
print("warnings:", [str(x.message)[:120] for x in w])

# Pattern 2: a per-step hook whose handle is kept on the module, removed and re-registered
# at each forward (a per-batch gradient scale). The replay sees the entry (previous
# step's, already removed) handle, so the forward's hook is never removed: one more hook
# per step, gradients scaled again and again.
class Block2(nn.Module):
    def __init__(self, h=32, use_ckpt=False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 2 * h), nn.Linear(2 * h, h)
        self._handle = None
        self.use_ckpt = use_ckpt
    def body(self, x):
        if self._handle is not None:
            self._handle.remove()
        s = float(x.detach().abs().mean())
        self._handle = self.fc1.weight.register_hook(lambda g: g / (1 + s))
        return x + self.fc2(F.gelu(self.fc1(x)))
    def forward(self, x):
        return ckpt.checkpoint(self.body, x, use_reentrant=False) if self.use_ckpt else self.body(x)

class Model2(Model):
    def __init__(self, use_ckpt=False):
        nn.Module.__init__(self)
        self.blocks = nn.ModuleList([Block2(use_ckpt=use_ckpt) for _ in range(2)])

torch.manual_seed(0)
base2 = Model2()
ref2, h2 = grads(copy.deepcopy(base2), steps=4)
ck2m = Model2(use_ckpt=True); ck2m.load_state_dict(base2.state_dict())
ck2, hck2 = grads(ck2m, steps=4)
print("pattern 2: checkpoint bitwise:", all(torch.equal(a, b) for a, b in zip(ref2, ck2)), "hooks:", hck2, "(plain:", h2, ")")
for mode in ("recompute", "auto"):
    got, hooks = grads(copy.deepcopy(base2), mode, steps=4)
    same = [torch.equal(a, b) for a, b in zip(ref2, got)]
    print(f"pattern 2: {mode:9s} bitwise per step: {same}  hooks on fc1.weight after 4 steps: {hooks} (plain: {h2})")
    bad |= not all(same)
print("DEFECT PRESENT" if bad else "ok")
sys.exit(1 if bad else 0)
