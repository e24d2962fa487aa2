"""Training-loop styles and model families not swept before, under every zoo variant,
bitwise against plain training.

    PYTHONPATH=DIR OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-05d/sweep_d.py [NAME,NAME ...|all] [VARIANT,...] [-v]

Two kinds of case:

* loops (``L``): a training loop other than "loss = model(batch); loss.backward(); SGD
  step", written out in full (``LoopCase``): run on a deep copy of one model plainly and
  on another inside ``variant_runtime(model, variant, budget)``, 4 steps, the losses,
  the gradients at each point the loop reads them, and every parameter and buffer after
  each step compared bitwise (``assert_bitwise``). Seeds (torch, Python, numpy) are set
  at every step. The root under the runtime holds every model the loop trains (a
  ``ModuleDict``: generator and critic, student and teacher). Tight budgets are half the
  largest ``peak_activation_bytes`` a keep run of one step records.
* families (``F``): a model of a library not swept before, wrapped to return a loss, run
  by ``tests.helpers.check_variant`` (SGD, 4 steps) as ../cpu-2026-12-05/sweep.py does.

Loops: WGAN-GP (two optimizers, a gradient penalty through the critic: double backward),
a DCGAN alternating discriminator and generator steps (BatchNorm in both), MAML
(second order, ``functional_call`` fast weights), ``torch.func.functional_call``
training with parameters and buffers passed, bf16 autocast with
``torch.amp.GradScaler('cpu')``, gradient clipping with AdamW, accumulation over
micro-batches of uneven sizes, SimCLR (two augmented views, two forwards), BYOL (EMA
target under no_grad, predictor), DINO (multi-crop at two resolutions, a centre buffer,
EMA teacher), knowledge distillation (an eval-mode frozen teacher run with grad on), a
frozen backbone in train mode under a trained head, LBFGS with a strong-Wolfe line
search (several forward/backward per step), ``backward(retain_graph=True)`` twice per
step, a gradient-norm penalty on the parameters (double backward w.r.t. weights), SAM
(two forward/backward per step, weights perturbed between), a PPO actor-critic (no_grad
rollout with sampled actions, 2 epochs x 2 minibatches, entropy bonus, Adam), fp16
autocast with a GradScaler whose first 3 steps overflow and are skipped, a Hessian-vector
product penalty (``torch.autograd.functional.hvp``), SWA (``AveragedModel`` made inside
the runtime, ``update_bn``), pseudo-labels from the model itself in eval mode, a mean
teacher deep-copied inside the runtime every step and run with grad on, and
``torch.autograd.backward`` over two losses with gradient weights.

Families: kornia (augmentations drawing random parameters inside every block, a block
reusing the parameters its first augmentation drew through ``aug._params``, and an
``AugmentationSequential`` at the input), MoCo v2 (momentum key encoder updated in place
and a key queue enqueued in place inside the forward), tab-transformer-pytorch (TabTransformer and
FT-Transformer with hyper-connection residual streams), pytorch-tabnet (ghost batch norm,
sparsemax and entmax autograd Functions), gpytorch (exact GP and variational SVGP on a
deep kernel learning feature net), pyro (Trace_ELBO and TraceMeanField_ELBO
``differentiable_loss`` of a VAE), a tiny HF BERT with sentence-transformers mean pooling
and a multiple-negatives ranking loss (two forwards), demucs (HTDemucs with its
cross-domain transformer, HDemucs, Demucs v2 with BiLSTM), asteroid-filterbanks
(free and parametrised sinc filterbanks around a small TCN).

DIR holds, installed with ``pip install --no-deps --target DIR``: kornia 0.9.0,
kornia-rs 0.2.0, gpytorch 1.15.2, linear-operator 0.6.1, jaxtyping 0.3.11, pyro-ppl
1.9.2, pyro-api 0.1.2, tab-transformer-pytorch 0.6.1, x-mlps-pytorch 0.6.9, einx 0.4.3,
frozendict 2.5.1, discrete-continuous-embed-readout 0.2.12, torch-einops-utils 0.2.0,
pytorch-tabnet 4.1.0, demucs 4.1.0, julius 0.2.8, asteroid-filterbanks 0.4.0; plus
einops 0.8.2, hyper-connections 0.4.11, beartype 0.23.1, scipy 1.17.1 of
../cpu-2026-12-05c. transformers 5.25.0 is the venv's. Tiny configurations, on the CPU.
"""

from __future__ import annotations

import copy
import random
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05b"))

import tv_stubs  # noqa: F401  (before torchvision, which kornia and transformers import)

# isort: split

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import ZOO_VARIANTS, assert_bitwise, check_variant, variant_runtime

H = 16


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _seed(s: int) -> None:
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)


# --- blocks the loops train -----------------------------------------------------------


class Res(nn.Module):
    """A pre-norm residual MLP block with dropout."""

    def __init__(self, d: int = H, p: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.drop(F.gelu(self.fc1(self.norm(x)))))


class MLP(nn.Module):
    def __init__(self, din: int, dout: int, d: int = H, n: int = 3, p: float = 0.1) -> None:
        super().__init__()
        self.inp = nn.Linear(din, d)
        self.blocks = nn.ModuleList([Res(d, p) for _ in range(n)])
        self.out = nn.Linear(d, dout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


class ConvRes(nn.Module):
    """conv-BN-ReLU-dropout-conv-BN plus the input, ReLU."""

    def __init__(self, c: int = 8, p: float = 0.1) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1, self.b2 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)
        self.drop = nn.Dropout2d(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.b2(self.c2(self.drop(F.relu(self.b1(self.c1(x)))))))


class CNN(nn.Module):
    def __init__(self, cin: int = 3, dout: int = 10, c: int = 8, n: int = 3, p: float = 0.1) -> None:
        super().__init__()
        self.stem = nn.Conv2d(cin, c, 3, padding=1)
        self.blocks = nn.ModuleList([ConvRes(c, p) for _ in range(n)])
        self.fc = nn.Linear(c, dout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return self.fc(h.mean((2, 3)))


class ConvG(nn.Module):
    """A generator: latent -> 8x8 map -> residual conv blocks (BatchNorm) -> image."""

    def __init__(self, z: int = 8, c: int = 8) -> None:
        super().__init__()
        self.c = c
        self.fc = nn.Linear(z, c * 64)
        self.blocks = nn.ModuleList([ConvRes(c, 0.0) for _ in range(3)])
        self.to_img = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.fc(z).view(-1, self.c, 8, 8)
        for b in self.blocks:
            h = b(h)
        return torch.tanh(self.to_img(h))


def img(s: int, b: int = 4, n: int = 8) -> torch.Tensor:
    return torch.randn(b, 3, n, n, generator=_gen(s))


def vec(s: int, b: int = 6, d: int = 8) -> torch.Tensor:
    return torch.randn(b, d, generator=_gen(s))


# --- loops ----------------------------------------------------------------------------

Snap = dict[str, torch.Tensor]


def grads(m: nn.Module, tag: str) -> Snap:
    return {f"{tag}.{n}": p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


@dataclass
class LoopCase:
    make: Callable[[], nn.Module]
    setup: Callable[[nn.Module], dict[str, Any]]
    step: Callable[[nn.Module, dict[str, Any], int], Snap]
    no_drop: bool = False  # nothing a replay can drop (every save outside the regions)
    steps: int = 4


def sgd(lr: float = 0.05) -> Callable[[nn.Module], dict[str, Any]]:
    return lambda m: {"opt": torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=lr)}


def std_step(m: nn.Module, st: dict[str, Any], s: int, loss: torch.Tensor, tag: str = "g") -> Snap:
    loss.backward()
    out = grads(m, tag) | {"loss": loss.detach().clone()}
    st["opt"].step()
    st["opt"].zero_grad(set_to_none=True)
    return out


# WGAN-GP ---------------------------------------------------------------------------------


def gan_setup(lr_d: float = 1e-3, lr_g: float = 1e-3) -> Callable[[nn.Module], dict[str, Any]]:
    return lambda m: {"opt_d": torch.optim.Adam(m["d"].parameters(), lr=lr_d, betas=(0.5, 0.9)),
                      "opt_g": torch.optim.Adam(m["g"].parameters(), lr=lr_g, betas=(0.5, 0.9))}


def wgan_gp_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    g, d = m["g"], m["d"]
    out: Snap = {}
    for k in range(2):  # critic iterations
        real = vec(10 * s + k)
        fake = g(torch.randn(6, 4)).detach()
        eps = torch.rand(6, 1)
        mid = (eps * real + (1 - eps) * fake).requires_grad_(True)
        gx, = torch.autograd.grad(d(mid).sum(), mid, create_graph=True)
        gp = ((gx.norm(2, dim=1) - 1) ** 2).mean()
        loss_d = d(fake).mean() - d(real).mean() + 10 * gp
        st["opt_d"].zero_grad(set_to_none=True)
        loss_d.backward()
        out |= grads(d, f"d{k}") | {f"loss_d{k}": loss_d.detach().clone(), f"gp{k}": gp.detach().clone()}
        st["opt_d"].step()
    loss_g = -d(g(torch.randn(6, 4))).mean()
    st["opt_g"].zero_grad(set_to_none=True)
    loss_g.backward()
    out |= grads(g, "g") | {"loss_g": loss_g.detach().clone()}
    st["opt_g"].step()
    return out


def dcgan_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    g, d = m["g"], m["d"]
    real = img(s)
    fake = g(torch.randn(4, 8))
    ones, zeros = torch.ones(4, 1), torch.zeros(4, 1)
    st["opt_d"].zero_grad(set_to_none=True)
    loss_d = F.binary_cross_entropy_with_logits(d(real), ones) + F.binary_cross_entropy_with_logits(d(fake.detach()), zeros)
    loss_d.backward()
    out = grads(d, "d") | {"loss_d": loss_d.detach().clone()}
    st["opt_d"].step()
    st["opt_g"].zero_grad(set_to_none=True)
    loss_g = F.binary_cross_entropy_with_logits(d(fake), ones)
    loss_g.backward()
    out |= grads(g, "g") | {"loss_g": loss_g.detach().clone()}
    st["opt_g"].step()
    return out


# MAML, functional_call ----------------------------------------------------------------


def maml_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    st["opt"].zero_grad(set_to_none=True)
    total = torch.zeros(())
    for task in range(2):
        g = _gen(10 * s + task)
        a, ph = torch.rand(1, generator=g) + 0.5, torch.rand(1, generator=g) * 3
        xs, xq = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
        ys, yq = a * torch.sin(xs.sum(1, keepdim=True) + ph), a * torch.sin(xq.sum(1, keepdim=True) + ph)
        fast = dict(m.named_parameters())
        for _ in range(2):
            inner = F.mse_loss(torch.func.functional_call(m, fast, (xs,)), ys)
            gs = torch.autograd.grad(inner, list(fast.values()), create_graph=True)
            fast = {n: p - 0.1 * gi for (n, p), gi in zip(fast.items(), gs)}
        q = F.mse_loss(torch.func.functional_call(m, fast, (xq,)), yq)
        q.backward()
        total = total + q.detach()
    out = grads(m, "g") | {"loss": total}
    st["opt"].step()
    return out


def funcall_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    params = dict(m.named_parameters())
    bufs = dict(m.named_buffers())
    logits = torch.func.functional_call(m, (params, bufs), (img(s),), strict=True)
    loss = F.cross_entropy(logits, torch.arange(4) % 10)
    return std_step(m, st, s, loss)


# autocast + GradScaler, clipping, accumulation ------------------------------------------


def scaler_setup(m: nn.Module) -> dict[str, Any]:
    return {"opt": torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
            "scaler": torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)}


def scaler_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    opt, scaler = st["opt"], st["scaler"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(m(img(s)).float(), torch.arange(4) % 10)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    out = grads(m, "g") | {"loss": loss.detach().clone(), "scale": scaler.get_scale() * torch.ones(())}
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return out


def clip_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    loss = F.mse_loss(m(vec(s)), vec(s + 100, d=4))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
    torch.nn.utils.clip_grad_value_(m.parameters(), 0.01)
    out = grads(m, "g") | {"loss": loss.detach().clone(), "norm": norm.detach().clone()}
    st["opt"].step()
    st["opt"].zero_grad(set_to_none=True)
    return out


def accum_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    sizes = (3, 5, 2) if s % 2 == 0 else (4, 1, 6)
    out: Snap = {}
    for i, b in enumerate(sizes):
        x = vec(10 * s + i, b=b)
        loss = F.mse_loss(m(x), x[:, :4]) * b / sum(sizes)
        loss.backward()
        out[f"loss{i}"] = loss.detach().clone()
    out |= grads(m, "g")
    st["opt"].step()
    st["opt"].zero_grad(set_to_none=True)
    return out


# two views, EMA teachers, distillation, frozen backbone ----------------------------------


def augment(x: torch.Tensor) -> torch.Tensor:
    """A random flip, roll and noise, drawn from torch's global generator in the loop."""
    flip = torch.rand(x.shape[0], 1, 1, 1) < 0.5
    x = torch.where(flip, x.flip(-1), x)
    x = torch.roll(x, shifts=int(torch.randint(-2, 3, ()).item()), dims=-2)
    return x + 0.1 * torch.randn_like(x)


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, t: float = 0.5) -> torch.Tensor:
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.t() / t
    n = z1.shape[0]
    sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return F.cross_entropy(sim, target)


def simclr_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    x = img(s)
    loss = nt_xent(m(augment(x)), m(augment(x)))
    return std_step(m, st, s, loss)


def byol_make() -> nn.Module:
    online = CNN(dout=16)
    target = copy.deepcopy(online).requires_grad_(False)
    return nn.ModuleDict({"online": online, "pred": MLP(16, 16, n=2, p=0.0), "target": target})


def byol_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    x = img(s)
    v1, v2 = augment(x), augment(x)
    p1, p2 = m["pred"](m["online"](v1)), m["pred"](m["online"](v2))
    with torch.no_grad():
        t1, t2 = m["target"](v1), m["target"](v2)
    loss = (2 - 2 * F.cosine_similarity(p1, t2).mean()) + (2 - 2 * F.cosine_similarity(p2, t1).mean())
    out = std_step(m, st, s, loss)
    with torch.no_grad():
        for pt, po in zip(m["target"].parameters(), m["online"].parameters()):
            pt.lerp_(po, 0.1)
    return out


class Dino(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.student = CNN(dout=12)
        self.teacher = copy.deepcopy(self.student).requires_grad_(False)
        self.register_buffer("center", torch.zeros(12))


def dino_setup(m: nn.Module) -> dict[str, Any]:
    return {"opt": torch.optim.AdamW(m.student.parameters(), lr=1e-3, weight_decay=0.04)}


def dino_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    x = img(s, n=16)
    glob = [augment(x), augment(x)]
    i, j = int(torch.randint(0, 8, ()).item()), int(torch.randint(0, 8, ()).item())
    local = [augment(x[:, :, i:i + 8, j:j + 8]), augment(x[:, :, j:j + 8, i:i + 8])]
    with torch.no_grad():
        t_out = [F.softmax((m.teacher(v) - m.center) / 0.04, dim=-1) for v in glob]
    s_out = [F.log_softmax(m.student(v) / 0.1, dim=-1) for v in glob + local]
    loss = torch.zeros(())
    for ti, t in enumerate(t_out):
        for si, sl in enumerate(s_out):
            if si != ti:
                loss = loss - (t * sl).sum(-1).mean()
    loss = loss / 6
    out = std_step(m.student, st, s, loss)
    with torch.no_grad():
        m.center.mul_(0.9).add_(0.1 * torch.cat([m.teacher(v) for v in glob]).mean(0))
        for pt, ps in zip(m.teacher.parameters(), m.student.parameters()):
            pt.lerp_(ps, 0.05)
    return out


def distill_make() -> nn.Module:
    teacher = CNN(c=12, n=3).eval().requires_grad_(False)
    return nn.ModuleDict({"teacher": teacher, "student": CNN(c=8, n=2)})


def distill_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    x, y = img(s), torch.arange(4) % 10
    t_logits = m["teacher"](x)  # grad mode on, frozen and in eval mode
    s_logits = m["student"](x)
    kd = F.kl_div(F.log_softmax(s_logits / 2, -1), F.log_softmax(t_logits / 2, -1), log_target=True, reduction="batchmean")
    loss = 0.5 * F.cross_entropy(s_logits, y) + 0.5 * 4 * kd
    return std_step(m, st, s, loss)


class Frozen(nn.Module):
    """A frozen convolutional backbone (BatchNorm still in train mode) under a trained MLP head."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = CNN(dout=H).requires_grad_(False)
        self.head = MLP(H, 10, n=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def frozen_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    return std_step(m, st, s, F.cross_entropy(m(img(s)), torch.arange(4) % 10))


# LBFGS, retain_graph, gradient-norm penalty, SAM --------------------------------------------


def lbfgs_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    x, y = vec(s), vec(s + 100, d=4)
    opt = st["opt"]
    losses = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(m(x), y)
        loss.backward()
        losses.append(loss.detach().clone())
        return loss

    opt.step(closure)
    return grads(m, "g") | {f"loss{i}": v for i, v in enumerate(losses)}


def retain_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    out = m(vec(s))
    l1, l2 = out.pow(2).mean(), out.abs().mean()
    l1.backward(retain_graph=True)
    snap = grads(m, "first")
    l2.backward()
    snap |= grads(m, "g") | {"l1": l1.detach().clone(), "l2": l2.detach().clone()}
    st["opt"].step()
    st["opt"].zero_grad(set_to_none=True)
    return snap


def gnorm_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    loss = F.mse_loss(m(vec(s)), vec(s + 100, d=4))
    params = [p for p in m.parameters() if p.requires_grad]
    gs = torch.autograd.grad(loss, params, create_graph=True)
    reg = sum(g.pow(2).sum() for g in gs)
    return std_step(m, st, s, loss + 0.1 * reg)


def sam_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    x, y = img(s), torch.arange(4) % 10
    loss = F.cross_entropy(m(x), y)
    loss.backward()
    params = [p for p in m.parameters() if p.grad is not None]
    norm = torch.norm(torch.stack([p.grad.norm(2) for p in params]), 2)
    eps = [0.05 * p.grad / (norm + 1e-12) for p in params]
    out = grads(m, "first") | {"loss": loss.detach().clone()}
    with torch.no_grad():
        for p, e in zip(params, eps):
            p.add_(e)
    st["opt"].zero_grad(set_to_none=True)
    loss2 = F.cross_entropy(m(x), y)
    loss2.backward()
    with torch.no_grad():
        for p, e in zip(params, eps):
            p.sub_(e)
    out |= grads(m, "g") | {"loss2": loss2.detach().clone()}
    st["opt"].step()
    st["opt"].zero_grad(set_to_none=True)
    return out


# PPO actor-critic ---------------------------------------------------------------------------


class ActorCritic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = MLP(8, H, n=3, p=0.0)
        self.pi, self.v = nn.Linear(H, 4), nn.Linear(H, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.trunk(obs))
        return self.pi(h), self.v(h).squeeze(-1)


def ppo_setup(m: nn.Module) -> dict[str, Any]:
    return {"opt": torch.optim.Adam(m.parameters(), lr=3e-3, eps=1e-5)}


def ppo_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    obs = vec(s, b=16)
    with torch.no_grad():
        logits, v_old = m(obs)
        dist = torch.distributions.Categorical(logits=logits)
        act = dist.sample()
        logp_old = dist.log_prob(act)
    ret = obs[:, 0] + (act == 1).float()
    adv = ret - v_old
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    out: Snap = {}
    for epoch in range(2):
        perm = torch.randperm(16)
        for k, idx in enumerate(perm.view(2, 8)):
            logits, v = m(obs[idx])
            dist = torch.distributions.Categorical(logits=logits)
            ratio = (dist.log_prob(act[idx]) - logp_old[idx]).exp()
            pg = -torch.min(ratio * adv[idx], ratio.clamp(0.8, 1.2) * adv[idx]).mean()
            loss = pg + 0.5 * F.mse_loss(v, ret[idx]) - 0.01 * dist.entropy().mean()
            st["opt"].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            out |= grads(m, f"e{epoch}{k}") | {f"loss{epoch}{k}": loss.detach().clone()}
            st["opt"].step()
    return out


# overflowing GradScaler, Hessian-vector products, SWA, pseudo-labels ---------------------


def overflow_setup(m: nn.Module) -> dict[str, Any]:
    return {"opt": torch.optim.SGD(m.parameters(), lr=0.05),
            "scaler": torch.amp.GradScaler("cpu", init_scale=2.0**126, backoff_factor=2.0**-40)}


def overflow_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    """fp16 autocast; the first steps' scaled gradients overflow (inf/NaN), so the scaler
    skips them and backs off."""
    opt, scaler = st["opt"], st["scaler"]
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(m(img(s)).float(), torch.arange(4) % 10)
    scaler.scale(loss).backward()
    out = grads(m, "g") | {"loss": loss.detach().clone(), "scale": scaler.get_scale() * torch.ones(())}
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return out


def hvp_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    """A curvature penalty: torch.autograd.functional.hvp of the loss in the parameters
    (double backward through functional_call), added to the loss."""
    x, y = vec(s), vec(s + 100, d=4)
    names = [n for n, _ in m.named_parameters()]
    ps = tuple(p for _, p in m.named_parameters())
    v = tuple(torch.randn_like(p) * 0.1 for p in ps)

    def f(*qs: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(torch.func.functional_call(m, dict(zip(names, qs)), (x,)), y)

    val, hv = torch.autograd.functional.hvp(f, ps, v, create_graph=True)
    loss = val + 0.01 * sum((h * vi).sum() for h, vi in zip(hv, v))
    return std_step(m, st, s, loss)


def swa_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    """Stochastic weight averaging: the averaged copy made inside the runtime at step 1,
    updated after each step, its BatchNorm statistics recomputed by forwards under no_grad."""
    out = std_step(m, st, s, F.cross_entropy(m(img(s)), torch.arange(4) % 10))
    if s >= 1:
        if "swa" not in st:
            st["swa"] = torch.optim.swa_utils.AveragedModel(m)
        st["swa"].update_parameters(m)
        torch.optim.swa_utils.update_bn([img(100 + s), img(200 + s)], st["swa"])
        with torch.no_grad():
            out["swa_out"] = st["swa"](img(300 + s))
        out |= {f"swa.{n}": b.detach().clone() for n, b in st["swa"].named_buffers()}
    return out


def pseudo_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    """Pseudo-labels from the model itself in eval mode under no_grad, then a training
    forward on an augmented view of the same batch and one on labelled data."""
    xu, xl = img(s), img(s + 100)
    m.eval()
    with torch.no_grad():
        pl = m(xu).argmax(-1)
    m.train()
    loss = F.cross_entropy(m(augment(xu)), pl) + F.cross_entropy(m(xl), torch.arange(4) % 10)
    return std_step(m, st, s, loss)


def mean_teacher_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    """A teacher deep-copied from the student inside the runtime every step, run with grad
    on (its graph dropped), its detached output a consistency target."""
    x = img(s)
    teacher = copy.deepcopy(m)
    target = F.softmax(teacher(augment(x)), -1).detach()
    out = m(augment(x))
    loss = F.cross_entropy(out, torch.arange(4) % 10) + F.mse_loss(F.softmax(out, -1), target)
    return std_step(m, st, s, loss)


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = MLP(8, H, n=3)
        self.a, self.b = nn.Linear(H, 3), nn.Linear(H, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.a(h), self.b(h)


def multi_root_step(m: nn.Module, st: dict[str, Any], s: int) -> Snap:
    """torch.autograd.backward over two losses with their own gradient weights."""
    a, b = m(vec(s))
    la, lb = F.cross_entropy(a, torch.arange(6) % 3), b.pow(2).mean()
    torch.autograd.backward([la, lb], [torch.tensor(1.0), torch.tensor(0.3)])
    out = grads(m, "g") | {"la": la.detach().clone(), "lb": lb.detach().clone()}
    st["opt"].step()
    st["opt"].zero_grad(set_to_none=True)
    return out


def model_step(loss_of: Callable[[nn.Module, int], torch.Tensor]) -> Callable[[nn.Module, dict[str, Any], int], Snap]:
    return lambda m, st, s: std_step(m, st, s, loss_of(m, s))


L: dict[str, LoopCase] = {
    "wgan_gp": LoopCase(lambda: nn.ModuleDict({"g": MLP(4, 8, n=3, p=0.0), "d": MLP(8, 1, n=3, p=0.1)}),
                        gan_setup(), wgan_gp_step),
    "dcgan": LoopCase(lambda: nn.ModuleDict({"g": ConvG(), "d": CNN(dout=1, p=0.0)}), gan_setup(2e-3, 2e-3), dcgan_step),
    "maml": LoopCase(lambda: MLP(4, 1, n=3, p=0.0), lambda m: {"opt": torch.optim.Adam(m.parameters(), lr=1e-2)},
                     maml_step),
    "functional_call": LoopCase(lambda: CNN(), sgd(), funcall_step),
    "amp_scaler": LoopCase(lambda: CNN(), scaler_setup, scaler_step),
    "clip_adamw": LoopCase(lambda: MLP(8, 4), lambda m: {"opt": torch.optim.AdamW(m.parameters(), lr=1e-2)}, clip_step),
    "accum_uneven": LoopCase(lambda: MLP(8, 4), sgd(), accum_step),
    "simclr": LoopCase(lambda: CNN(dout=16), sgd(), simclr_step),
    "byol": LoopCase(byol_make, sgd(), byol_step),
    "dino": LoopCase(Dino, dino_setup, dino_step),
    "distill": LoopCase(distill_make, lambda m: {"opt": torch.optim.SGD(m["student"].parameters(), lr=0.05)},
                        distill_step),
    "frozen_backbone": LoopCase(Frozen, sgd(), frozen_step),
    "lbfgs": LoopCase(lambda: MLP(8, 4, p=0.1),
                      lambda m: {"opt": torch.optim.LBFGS(m.parameters(), lr=0.5, max_iter=4, history_size=4,
                                                          line_search_fn="strong_wolfe")}, lbfgs_step),
    "retain_twice": LoopCase(lambda: MLP(8, 4), sgd(), retain_step),
    "grad_norm_penalty": LoopCase(lambda: MLP(8, 4), sgd(), gnorm_step),
    "sam": LoopCase(lambda: CNN(), sgd(), sam_step),
    "ppo": LoopCase(ActorCritic, ppo_setup, ppo_step),
    # the first 3 steps overflow and skip the optimizer step: those passes are merged
    # into the first optimizer step's record (NOTE [Passes and steps]), so 6 steps
    "amp_overflow": LoopCase(lambda: CNN(), overflow_setup, overflow_step, steps=6),
    "hvp_penalty": LoopCase(lambda: MLP(8, 4, p=0.0), sgd(), hvp_step),
    "swa": LoopCase(lambda: CNN(), sgd(), swa_step),
    "pseudo_label": LoopCase(lambda: CNN(), sgd(), pseudo_step),
    "mean_teacher_copy": LoopCase(lambda: CNN(), sgd(), mean_teacher_step),
    "multi_root": LoopCase(TwoHeads, sgd(), multi_root_step),
}
#: Loops whose shapes change from step to step (auto may still be measuring at the last step).
L_VARYING = frozenset({"accum_uneven", "dino"})


def run_loop(case: LoopCase, model: nn.Module, steps: int, rt: Any = None) -> list[Snap]:
    st = case.setup(model)
    out = []
    with rt if rt is not None else _null():
        for s in range(steps):
            _seed(s)
            snap = case.step(model, st, s)
            snap |= {f"p.{n}": p.detach().clone() for n, p in model.named_parameters()}
            snap |= {f"b.{n}": b.detach().clone() for n, b in model.named_buffers()}
            out.append(snap)
    return out


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def check_loop(name: str, case: LoopCase, variant: str) -> str:
    steps = case.steps
    torch.manual_seed(0)
    model = case.make().train()
    if name == "distill":
        model["teacher"].eval()
    ref = run_loop(case, copy.deepcopy(model), steps)
    budget = None
    if variant in ("auto_tight", "auto_serve"):
        probe = copy.deepcopy(model)
        keep = variant_runtime(probe, "keep")
        run_loop(case, probe, 1, keep)
        budget = max(r.peak_activation_bytes for r in keep.report().steps) // 2
        assert budget > 0
    m = copy.deepcopy(model)
    rt = variant_runtime(m, variant, budget)
    assert_bitwise(ref, run_loop(case, m, steps, rt))
    recs = rt.report().steps
    _check_report(recs, variant, stable=name not in L_VARYING, drops=not case.no_drop)
    return _summary(recs)


def _check_report(recs: list[Any], variant: str, *, stable: bool, drops: bool) -> None:
    """check_variant_report's checks, over any number of records per loop step."""
    assert recs, "no step records"
    if variant == "recompute" and drops:
        assert any(r.replays > 0 for r in recs), "recompute replayed nothing"
    if variant == "offload":
        assert any(r.offloaded_bytes > 0 for r in recs), "offload offloaded nothing"
    if variant.startswith("auto"):
        phases = [r.phase for r in recs]
        assert phases[0] == "measure", phases
        if stable:
            assert phases[-1] in ("planned", "borrowed", "calibrate"), phases
    if variant in ("auto_tight", "auto_serve") and drops:
        assert any(r.recomputed_bytes > 0 for r in recs[len(recs) // 2:]), "a tight budget dropped nothing"


def _summary(recs: list[Any]) -> str:
    return f"recs={len(recs)} replays={sum(r.replays for r in recs)} last={recs[-1].phase}"


# --- families ----------------------------------------------------------------------------


def _loss(o: Any) -> torch.Tensor:
    if isinstance(o, torch.Tensor):
        if not o.is_floating_point():
            return torch.zeros(())
        x = o.float().flatten()
        w = torch.arange(x.numel(), dtype=x.dtype).sin()
        return (x.pow(2).sum() + (x * w).sum()) / max(1, x.numel())
    if isinstance(o, dict):
        return sum((_loss(v) for v in o.values()), torch.zeros(()))
    if isinstance(o, (tuple, list)):
        return sum((_loss(v) for v in o), torch.zeros(()))
    return torch.zeros(())


class Loss(nn.Module):
    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, batch: Any) -> torch.Tensor:
        return _loss(self.m(*batch) if isinstance(batch, tuple) else self.m(batch))


def kornia_blocks() -> nn.Module:
    import kornia.augmentation as K
    import kornia.filters as KF

    class AugBlock(nn.Module):
        """A conv block that augments its input with random draws (kornia) every call."""

        def __init__(self) -> None:
            super().__init__()
            self.aug = K.RandomGaussianNoise(std=0.05, p=0.5)
            self.jit = K.RandomAffine(degrees=10.0, translate=(0.1, 0.1), p=0.7)
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.bn = nn.BatchNorm2d(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.jit(self.aug(x))
            return x + self.bn(self.conv(KF.gaussian_blur2d(h, (3, 3), (1.0, 1.0)) + KF.sobel(h)))

    return Loss(nn.Sequential(*[AugBlock() for _ in range(3)]))


def kornia_input() -> nn.Module:
    import kornia.augmentation as K

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.aug = K.AugmentationSequential(
                K.RandomHorizontalFlip(), K.ColorJitter(0.2, 0.2, 0.2, 0.05, p=0.8), K.RandomResizedCrop((8, 8)),
                K.RandomErasing(p=0.3))
            self.cnn = CNN()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(self.cnn(self.aug(x)), torch.arange(x.shape[0]) % 10)

    return Net()


def kornia_params() -> nn.Module:
    import kornia.augmentation as K

    class Paired(nn.Module):
        """Two branches augmented alike: the second call reuses the parameters the first
        drew (``aug._params``, a module attribute the forward sets)."""

        def __init__(self) -> None:
            super().__init__()
            self.aug = K.RandomAffine(degrees=15.0, scale=(0.8, 1.2), p=1.0)
            self.c1, self.c2 = nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = self.aug(x)
            b = self.aug(torch.tanh(self.c1(x)), params=self.aug._params)
            return x + self.c2(a * b)

    return Loss(nn.Sequential(*[Paired() for _ in range(3)]))


def tab_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    return torch.stack([torch.randint(0, n, (8,), generator=g) for n in (4, 5, 3)], 1), torch.randn(8, 4, generator=g)


def tabtransformer() -> nn.Module:
    from tab_transformer_pytorch import TabTransformer

    return Loss(TabTransformer(categories=(4, 5, 3), num_continuous=4, dim=16, depth=3, heads=2, dim_head=8,
                               dim_out=2, attn_dropout=0.1, ff_dropout=0.1, num_residual_streams=2, mlp_act=nn.ReLU()))


def fttransformer() -> nn.Module:
    from tab_transformer_pytorch import FTTransformer

    return Loss(FTTransformer(categories=(4, 5, 3), num_continuous=4, dim=16, depth=3, heads=2, dim_head=8,
                              dim_out=2, attn_dropout=0.1, ff_dropout=0.1, num_residual_streams=2))


class TabNetLoss(nn.Module):
    def __init__(self, mask_type: str) -> None:
        super().__init__()
        from pytorch_tabnet.tab_network import TabNet

        self.m = TabNet(10, 3, n_d=8, n_a=8, n_steps=3, virtual_batch_size=4, mask_type=mask_type,
                        cat_idxs=[0], cat_dims=[5], cat_emb_dim=[2],
                        group_attention_matrix=torch.eye(10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x[:, :1].abs().mul(2).floor().clamp(max=4), x[:, 1:]], 1)
        out, m_loss = self.m(x)
        return F.cross_entropy(out, torch.arange(x.shape[0]) % 3) + 1e-3 * m_loss


class DKL(nn.Module):
    """A deep kernel learning feature net: residual MLP blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.net = MLP(6, 2, n=3, p=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def gp_exact() -> nn.Module:
    import gpytorch

    class GP(gpytorch.models.ExactGP):
        def __init__(self, x: torch.Tensor, y: torch.Tensor, lik: Any) -> None:
            super().__init__(x, y, lik)
            self.feat = DKL()
            self.mean = gpytorch.means.ConstantMean()
            self.cov = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

        def forward(self, x: torch.Tensor) -> Any:
            z = self.feat(x)
            return gpytorch.distributions.MultivariateNormal(self.mean(z), self.cov(z))

    class Wrap(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            lik = gpytorch.likelihoods.GaussianLikelihood()
            self.gp = GP(torch.zeros(12, 6), torch.zeros(12), lik)
            self.mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, self.gp)

        def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = batch
            self.gp.set_train_data(x, y, strict=False)
            return -self.mll(self.gp(x), y)

    return Wrap()


def gp_svgp() -> nn.Module:
    import gpytorch

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self) -> None:
            ind = torch.randn(6, 2)
            vd = gpytorch.variational.CholeskyVariationalDistribution(6)
            vs = gpytorch.variational.VariationalStrategy(self, ind, vd, learn_inducing_locations=True)
            super().__init__(vs)
            self.mean = gpytorch.means.ConstantMean()
            self.cov = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5))

        def forward(self, z: torch.Tensor) -> Any:
            return gpytorch.distributions.MultivariateNormal(self.mean(z), self.cov(z))

    class Wrap(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.feat = DKL()
            self.gp = SVGP()
            self.lik = gpytorch.likelihoods.GaussianLikelihood()
            self.elbo = gpytorch.mlls.VariationalELBO(self.lik, self.gp, num_data=100)

        def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = batch
            return -self.elbo(self.gp(self.feat(x)), y)

    return Wrap()


def gp_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    x = torch.randn(12, 6, generator=g)
    return x, torch.sin(x.sum(1)) + 0.1 * torch.randn(12, generator=g)


class PyroVAE(nn.Module):
    """A VAE whose encoder and decoder are residual MLP stacks; the loss is pyro's ELBO
    (a sample drawn inside the guide through the reparametrisation)."""

    def __init__(self, mean_field: bool = False) -> None:
        super().__init__()
        self.enc = MLP(12, 8, n=3, p=0.0)
        self.dec = MLP(4, 12, n=3, p=0.0)
        self.mean_field = mean_field

    def model(self, x: torch.Tensor) -> None:
        import pyro
        import pyro.distributions as dist

        with pyro.plate("data", x.shape[0]):
            z = pyro.sample("z", dist.Normal(torch.zeros(x.shape[0], 4), 1.0).to_event(1))
            pyro.sample("x", dist.Normal(self.dec(z), 0.5).to_event(1), obs=x)

    def guide(self, x: torch.Tensor) -> None:
        import pyro
        import pyro.distributions as dist

        h = self.enc(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("z", dist.Normal(h[:, :4], F.softplus(h[:, 4:]) + 1e-3).to_event(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import pyro.infer as pi

        elbo = pi.TraceMeanField_ELBO() if self.mean_field else pi.Trace_ELBO(num_particles=2)
        return elbo.differentiable_loss(self.model, self.guide, x) / x.numel()


class SBert(nn.Module):
    """A tiny BERT with sentence-transformers' mean pooling and the multiple-negatives
    ranking loss: anchors and positives through two forwards."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.1,
                         attention_probs_dropout_prob=0.1)
        self.bert = BertModel(cfg, add_pooling_layer=False)

    def embed(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).float()
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)

    def forward(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        a, am, p, pm = batch
        ea, ep = F.normalize(self.embed(a, am), dim=-1), F.normalize(self.embed(p, pm), dim=-1)
        return F.cross_entropy(ea @ ep.t() * 20.0, torch.arange(a.shape[0]))


def sbert_batch(s: int) -> tuple[torch.Tensor, ...]:
    g = _gen(s)
    a, p = torch.randint(1, 50, (4, 10), generator=g), torch.randint(1, 50, (4, 12), generator=g)
    am, pm = torch.ones_like(a), torch.ones_like(p)
    am[0, 7:] = 0
    pm[1, 5:] = 0
    return a, am, p, pm


class Separation(nn.Module):
    """A source-separation model on a mix of its sources: L1 on the estimates."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, srcs: torch.Tensor) -> torch.Tensor:
        est = self.m(srcs.sum(1))
        return F.l1_loss(est, srcs)


def htdemucs() -> nn.Module:
    from demucs.htdemucs import HTDemucs

    return Separation(HTDemucs(["a", "b"], audio_channels=1, channels=8, nfft=256, depth=2, t_layers=2, t_heads=2,
                               t_hidden_scale=2.0, samplerate=8000, segment=1, dconv_comp=4, t_dropout=0.1,
                               t_sin_random_shift=2, bottom_channels=0))


def hdemucs() -> nn.Module:
    from demucs.hdemucs import HDemucs

    return Separation(HDemucs(["a", "b"], audio_channels=1, channels=8, nfft=256, depth=3, samplerate=8000,
                              segment=1, dconv_comp=2, dconv_attn=2, dconv_lstm=2))


def demucs_v2() -> nn.Module:
    from demucs.demucs import Demucs

    return Separation(Demucs(["a", "b"], audio_channels=1, channels=8, depth=3, lstm_layers=1, dconv_comp=2,
                             dconv_attn=1, dconv_lstm=1, samplerate=8000, segment=1))


def audio(n: int) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randn(2, 2, 1, n, generator=_gen(s)) * 0.3


class TasNet(nn.Module):
    """asteroid-filterbanks encoder/decoder around a small TCN of dilated residual blocks
    (masking network), two sources."""

    def __init__(self, fb: str) -> None:
        super().__init__()
        from asteroid_filterbanks import make_enc_dec

        kw = {"sample_rate": 8000, "min_low_hz": 50, "min_band_hz": 50} if fb == "param_sinc" else {}
        self.enc, self.dec = make_enc_dec(fb, n_filters=16, kernel_size=16, stride=8, **kw)
        c = self.enc.n_feats_out
        self.tcn = nn.ModuleList([TCNBlock(c, 2**i) for i in range(3)])
        self.mask = nn.Conv1d(c, 2 * c, 1)

    def forward(self, srcs: torch.Tensor) -> torch.Tensor:
        mix = srcs.sum(1)
        w = self.enc(mix)
        h = w
        for b in self.tcn:
            h = b(h)
        masks = torch.sigmoid(self.mask(h)).view(w.shape[0], 2, w.shape[1], -1)
        est = self.dec(masks * w.unsqueeze(1))
        n = min(est.shape[-1], srcs.shape[-1])
        return F.l1_loss(est[..., :n], srcs[:, :, 0, :n])


class TCNBlock(nn.Module):
    def __init__(self, c: int, dil: int) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(c, 2 * c, 1)
        self.dw = nn.Conv1d(2 * c, 2 * c, 3, padding=dil, dilation=dil, groups=2 * c)
        self.norm = nn.GroupNorm(1, 2 * c)
        self.c2 = nn.Conv1d(2 * c, c, 1)
        self.act = nn.PReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.c2(self.act(self.norm(self.dw(self.act(self.c1(x))))))


class MoCo(nn.Module):
    """MoCo v2: a query encoder, a key encoder updated by momentum inside the forward under
    no_grad, and a queue of keys (a buffer) dequeued and enqueued in place by the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.q = CNN(dout=16)
        self.k = copy.deepcopy(self.q).requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(16, 12), dim=0))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = F.normalize(self.q(augment(x)), dim=1)
        with torch.no_grad():
            for pk, pq in zip(self.k.parameters(), self.q.parameters()):
                pk.mul_(0.9).add_(pq.detach(), alpha=0.1)
            k = F.normalize(self.k(augment(x)), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone().detach()], 1) / 0.2
        loss = F.cross_entropy(logits, torch.zeros(x.shape[0], dtype=torch.long))
        with torch.no_grad():
            i = int(self.ptr)
            self.queue[:, i:i + x.shape[0]] = k.t()
            self.ptr.fill_((i + x.shape[0]) % 12)
        return loss


Z: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any]]] = {
    "kornia_blocks": (kornia_blocks, lambda s: img(s, n=12)),
    "kornia_input": (kornia_input, lambda s: img(s, n=12)),
    "kornia_params": (kornia_params, lambda s: img(s, n=12)),
    "tabtransformer": (tabtransformer, tab_batch),
    "fttransformer": (fttransformer, tab_batch),
    "tabnet_sparsemax": (lambda: TabNetLoss("sparsemax"), lambda s: vec(s, b=8, d=10)),
    "tabnet_entmax": (lambda: TabNetLoss("entmax"), lambda s: vec(s, b=8, d=10)),
    "gp_exact_dkl": (gp_exact, gp_batch),
    "gp_svgp_dkl": (gp_svgp, gp_batch),
    "pyro_vae": (lambda: PyroVAE(), lambda s: vec(s, b=8, d=12)),
    "pyro_vae_meanfield": (lambda: PyroVAE(mean_field=True), lambda s: vec(s, b=8, d=12)),
    "sbert_mnrl": (SBert, sbert_batch),
    "htdemucs": (htdemucs, audio(2048)),
    "hdemucs": (hdemucs, audio(2048)),
    "demucs_v2": (demucs_v2, audio(2048)),
    "tasnet_free": (lambda: TasNet("free"), audio(400)),
    "tasnet_sinc": (lambda: TasNet("param_sinc"), audio(400)),
    "moco": (MoCo, lambda s: img(s)),
}
Z_VARYING: frozenset[str] = frozenset()


# --- main ----------------------------------------------------------------------------------


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "-v"]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ZOO_VARIANTS
    failed = 0
    names = [("L", n) for n in L] + [("F", n) for n in Z]
    for kind, name in names:
        if only and name not in only:
            continue
        for v in variants:
            t0 = time.time()
            with warnings.catch_warnings(record=True) as ws:
                warnings.simplefilter("always")
                try:
                    if kind == "L":
                        info = check_loop(name, L[name], v)
                    else:
                        factory, batch = Z[name]
                        torch.manual_seed(0)
                        model = factory().train()
                        rt, _ = check_variant(model, batch, v, steps=4, stable=name not in Z_VARYING)
                        info = _summary(rt.report().steps)
                    ours = _ours(ws)
                    print(f"PASS {kind} {name:18s} {v:10s} {time.time() - t0:5.1f}s {info}"
                          + (f" warned={len(ours)}" if ours else ""), flush=True)
                except Exception as e:
                    failed += 1
                    ours = _ours(ws)
                    print(f"FAIL {kind} {name:18s} {v:10s} {type(e).__name__}: {str(e)[:300]}", flush=True)
                    if "-v" in sys.argv:
                        traceback.print_exc()
                if "-v" in sys.argv:
                    for w in ours:
                        print(f"    warning: {str(w.message)[:400]}", flush=True)
    print(f"{failed} failed", flush=True)
    return 1 if failed else 0


def _ours(ws: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    """offrecomp's warnings (deduplicated)."""
    seen, out = set(), []
    for w in ws:
        if "offrecomp" in w.filename or "offrecomp" in str(w.message)[:40]:
            key = str(w.message)
            if key not in seen:
                seen.add(key)
                out.append(w)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
