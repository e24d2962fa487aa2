"""Model-based and recurrent RL loops under every zoo variant, bitwise against plain.

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05t/sweep_t.py [NAME,..|all] [VARIANT,..] [-v]
"""
from __future__ import annotations

import copy
import logging
import random
import sys
from pathlib import Path
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Independent, Normal, kl_divergence

from tests.helpers import ZOO_VARIANTS, assert_bitwise, variant_runtime

torch.set_num_threads(1)

# ---------------------------------------------------------------- logging capture
class Cap(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.msgs: list[str] = []

    def emit(self, rec: logging.LogRecord) -> None:
        self.msgs.append(f"{rec.name}: {rec.getMessage()}")


CAP = Cap()
logging.getLogger("offrecomp").addHandler(CAP)

H, OBS, NA, ACT = 16, 6, 3, 2
T, B = 6, 4
STOCH, DETER, EMB, G, C = 4, 12, 12, 4, 3


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _seed(s: int) -> None:
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)


class Res(nn.Module):
    def __init__(self, d: int = H, p: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.fc2(self.drop(F.silu(self.fc1(self.norm(x)))))


class MLP(nn.Module):
    def __init__(self, din, dout, d=H, n=2, p=0.1):
        super().__init__()
        self.inp = nn.Linear(din, d)
        self.blocks = nn.ModuleList([Res(d, p) for _ in range(n)])
        self.out = nn.Linear(d, dout)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


Snap = dict[str, torch.Tensor]


def grads(m: nn.Module, tag: str) -> Snap:
    return {f"{tag}.{n}": p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


def polyak(tgt: nn.Module, src: nn.Module, tau: float = 0.1) -> None:
    with torch.no_grad():
        for a, b in zip(tgt.parameters(), src.parameters()):
            a.lerp_(b, tau)


_ENV = torch.Generator().manual_seed(7)
EA = torch.randn(OBS, OBS, generator=_ENV) * 0.5
EB = torch.randn(max(NA, ACT), OBS, generator=_ENV)


def env_step(obs, a, g):
    """a: one-hot (NA) or continuous (ACT)."""
    nxt = torch.tanh(obs @ EA + a @ EB[: a.shape[-1]]) + 0.1 * torch.randn(obs.shape, generator=g)
    r = nxt[:, 0] - 0.1 * a[:, 0]
    done = (torch.rand(obs.shape[0], generator=g) < 0.15).float()
    return nxt, r, done


# ================================================================ RSSM / Dreamer
def latent(stats, kind):
    if kind == "gauss":
        mean, std = stats.chunk(2, -1)
        d = Normal(mean, F.softplus(std) + 0.1)
        return d.rsample()
    logits = stats.view(*stats.shape[:-1], G, C)
    probs = 0.99 * logits.softmax(-1) + 0.01 / C
    idx = torch.multinomial(probs.reshape(-1, C), 1).view(*probs.shape[:-1])
    onehot = F.one_hot(idx, C).to(probs.dtype)
    return (onehot + probs - probs.detach()).flatten(-2)


def kl(p_stats, q_stats, kind):
    if kind == "gauss":
        def dist(s):
            m, sd = s.chunk(2, -1)
            return Independent(Normal(m, F.softplus(sd) + 0.1), 1)
        return kl_divergence(dist(p_stats), dist(q_stats))
    def probs(s):
        return 0.99 * s.view(*s.shape[:-1], G, C).softmax(-1) + 0.01 / C
    p, q = probs(p_stats), probs(q_stats)
    return (p * (p.log() - q.log())).sum((-1, -2))


def zdim(kind):
    return STOCH if kind == "gauss" else G * C


class RSSMStep(nn.Module):
    def __init__(self, kind, adim):
        super().__init__()
        self.kind = kind
        sdim = 2 * STOCH if kind == "gauss" else G * C
        self.inp = nn.Linear(zdim(kind) + adim, DETER)
        self.gru = nn.GRUCell(DETER, DETER)
        self.prior = nn.Sequential(nn.Linear(DETER, H), nn.ELU(), nn.Linear(H, sdim))
        self.post = nn.Sequential(nn.Linear(DETER + EMB, H), nn.ELU(), nn.Linear(H, sdim))

    def forward(self, z, a, h, emb=None):
        h = self.gru(F.elu(self.inp(torch.cat([z, a], -1))), h)
        prior = self.prior(h)
        if emb is None:
            return latent(prior, self.kind), h, prior
        post = self.post(torch.cat([h, emb], -1))
        return latent(post, self.kind), h, prior, post


class WorldModel(nn.Module):
    def __init__(self, kind, adim, free=0.01):
        super().__init__()
        self.kind, self.free = kind, free
        self.enc = MLP(OBS, EMB)
        self.cell = RSSMStep(kind, adim)
        fd = DETER + zdim(kind)
        self.dec = MLP(fd, OBS)
        self.rew = MLP(fd, 1, n=1)
        self.cont = nn.Linear(fd, 1)

    def forward(self, obs, act, rew, cont):
        emb = self.enc(obs)
        Tn, Bn = obs.shape[:2]
        h = obs.new_zeros(Bn, DETER)
        z = obs.new_zeros(Bn, zdim(self.kind))
        hs, zs, prs, pos = [], [], [], []
        for t in range(Tn):
            z, h, pr, po = self.cell(z, act[t], h, emb[t])
            hs.append(h), zs.append(z), prs.append(pr), pos.append(po)
        hs, zs, prs, pos = map(torch.stack, (hs, zs, prs, pos))
        feat = torch.cat([hs, zs], -1)
        l_rec = (self.dec(feat) - obs).pow(2).sum(-1).mean()
        l_rew = (self.rew(feat).squeeze(-1) - rew).pow(2).mean()
        l_cont = F.binary_cross_entropy_with_logits(self.cont(feat).squeeze(-1), cont)
        dyn = kl(pos.detach(), prs, self.kind)  # KL balancing
        rep = kl(pos, prs.detach(), self.kind)
        loss = l_rec + l_rew + l_cont + 0.5 * dyn.clamp(min=self.free).mean() + 0.1 * rep.clamp(min=self.free).mean()
        return loss, hs, zs


def wm_data(s, disc, Tn=T):
    g = _gen(s)
    obs = [torch.randn(B, OBS, generator=g)]
    acts, rews, conts = [torch.zeros(B, NA if disc else ACT)], [], []
    for t in range(Tn):
        if disc:
            a = F.one_hot(torch.randint(0, NA, (B,), generator=g), NA).float()
        else:
            a = torch.rand(B, ACT, generator=g) * 2 - 1
        o, r, d = env_step(obs[-1], a, g)
        rews.append(r), conts.append(1 - d)
        if t < Tn - 1:
            obs.append(o), acts.append(a)
    return torch.stack(obs), torch.stack(acts), torch.stack(rews), torch.stack(conts)


def act_sample(out, disc):
    if disc:
        probs = out.softmax(-1)
        idx = torch.multinomial(probs, 1).squeeze(-1)
        onehot = F.one_hot(idx, NA).float()
        a = onehot + probs - probs.detach()
        logp = probs.gather(-1, idx[:, None]).squeeze(-1).log()
        ent = -(probs * probs.log()).sum(-1)
        return a, logp, ent
    mean, std = out.chunk(2, -1)
    d = Normal(torch.tanh(mean), F.softplus(std) + 0.1)
    u = d.rsample()
    a = torch.tanh(u)
    logp = (d.log_prob(u) - torch.log(1 - a.pow(2) + 1e-6)).sum(-1)
    return a, logp, d.entropy().sum(-1)


def dreamer_make(kind, disc):
    def make():
        fd = DETER + zdim(kind)
        wm = WorldModel(kind, NA if disc else ACT)
        critic = MLP(fd, 1)
        target = copy.deepcopy(critic).requires_grad_(False)
        return nn.ModuleDict(dict(wm=wm, actor=MLP(fd, NA if disc else 2 * ACT), critic=critic, target=target))
    return make


def dreamer_setup(m):
    return dict(opt_wm=torch.optim.Adam(m["wm"].parameters(), 1e-3),
                opt_actor=torch.optim.Adam(m["actor"].parameters(), 1e-3),
                opt_critic=torch.optim.Adam(m["critic"].parameters(), 1e-3))


def dreamer_step(disc, dyn_backprop, target_mode, HOR=4, lam=0.95):
    def step(m, st, s):
        wm = m["wm"]
        obs, act, rew, cont = wm_data(s, disc)
        loss_wm, hs, zs = wm(obs, act, rew, cont)
        st["opt_wm"].zero_grad(set_to_none=True)
        loss_wm.backward()
        nn.utils.clip_grad_norm_(wm.parameters(), 100.0)
        out = grads(m, "wm") | {"loss_wm": loss_wm.detach().clone()}
        st["opt_wm"].step()
        h, z = hs.detach().flatten(0, 1), zs.detach().flatten(0, 1)
        feats, logps, ents = [torch.cat([h, z], -1)], [], []
        for k in range(HOR):
            a, logp, ent = act_sample(m["actor"](feats[-1].detach()), disc)
            z, h, _ = wm.cell(z, a, h)
            feats.append(torch.cat([h, z], -1)), logps.append(logp), ents.append(ent)
        Fs = torch.stack(feats)
        src = Fs if dyn_backprop else Fs.detach()
        r = wm.rew(src[1:]).squeeze(-1)
        c = torch.sigmoid(wm.cont(src[1:])).squeeze(-1) * 0.99
        v = m["target"](src).squeeze(-1)
        R = v[-1]
        rets = []
        for t in reversed(range(HOR)):
            R = r[t] + c[t] * ((1 - lam) * v[t + 1] + lam * R)
            rets.append(R)
        ret = torch.stack(rets[::-1])
        ent = torch.stack(ents)
        if dyn_backprop:
            loss_a = -ret.mean() - 1e-3 * ent.mean()
        else:
            adv = (ret - v[:-1]).detach()
            loss_a = -(torch.stack(logps) * adv).mean() - 3e-3 * ent.mean()
        st["opt_actor"].zero_grad(set_to_none=True)
        loss_a.backward()
        out |= grads(m, "actor") | {"loss_a": loss_a.detach().clone()}
        st["opt_actor"].step()
        loss_c = 0.5 * (m["critic"](Fs[:-1].detach()).squeeze(-1) - ret.detach()).pow(2).mean()
        st["opt_critic"].zero_grad(set_to_none=True)
        loss_c.backward()
        out |= grads(m, "critic") | {"loss_c": loss_c.detach().clone()}
        st["opt_critic"].step()
        if target_mode == "copy" and s % 2 == 0:
            m["target"].load_state_dict(m["critic"].state_dict())
        elif target_mode == "polyak":
            polyak(m["target"], m["critic"], 0.02)
        return out
    return step


def wm_only_make(kind, disc):
    return lambda: WorldModel(kind, NA if disc else ACT)


def wm_only_step(disc, Tn=T):
    def step(m, st, s):
        obs, act, rew, cont = wm_data(s, disc, Tn)
        loss, _, _ = m(obs, act, rew, cont)
        st["opt"].zero_grad(set_to_none=True)
        loss.backward()
        out = grads(m, "g") | {"loss": loss.detach().clone()}
        st["opt"].step()
        return out
    return step


def adam(lr=1e-3):
    return lambda m: {"opt": torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr)}


def cell_root_step(m, st, s, Tn=70):
    """Root = the RSSM cell itself, unrolled by the loop: >64 root forwards per pass."""
    g = _gen(s)
    h = torch.zeros(B, DETER)
    z = torch.zeros(B, STOCH)
    loss = torch.zeros(())
    for t in range(Tn):
        emb = torch.randn(B, EMB, generator=g)
        a = torch.rand(B, ACT, generator=g)
        z, h, pr, po = m(z, a, h, emb)
        loss = loss + kl(po.detach(), pr, "gauss").mean() + 0.1 * kl(po, pr.detach(), "gauss").mean() + z.pow(2).mean() * 0.01
    st["opt"].zero_grad(set_to_none=True)
    loss.backward()
    out = grads(m, "g") | {"loss": loss.detach().clone()}
    st["opt"].step()
    return out


# ================================================================ recurrent PPO / R2D2
class LSTMCore(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(H, H)

    def forward(self, x, h, c):
        o, (h, c) = self.lstm(x, (h, c))
        return o, h, c


class CellCore(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(H, H)
        self.ln = nn.LayerNorm(H)

    def forward(self, x, h, c):
        h, c = self.cell(self.ln(x[0]), (h[0], c[0]))
        return h[None], h[None], c[None]


class RecPolicy(nn.Module):
    def __init__(self, core_cls):
        super().__init__()
        self.enc = MLP(OBS, H, p=0.0)
        self.core = core_cls()
        self.pi, self.v = nn.Linear(H, NA), nn.Linear(H, 1)

    def forward(self, obs, h, c, done):
        x = torch.tanh(self.enc(obs))
        outs = []
        for t in range(obs.shape[0]):
            keep = (1 - done[t])[None, :, None]
            o, h, c = self.core(x[t:t + 1], h * keep, c * keep)
            outs.append(o[0])
        o = torch.stack(outs)
        return self.pi(o), self.v(o).squeeze(-1), h, c


ROLL, L, NE = 8, 4, 4


def rppo_setup(m):
    g = torch.Generator().manual_seed(5)
    return {"opt": torch.optim.Adam(m.parameters(), 3e-3, eps=1e-5), "obs": torch.randn(NE, OBS, generator=g),
            "h": torch.zeros(1, NE, H), "c": torch.zeros(1, NE, H), "done": torch.zeros(NE)}


def rppo_step(m, st, s):
    g = _gen(s)
    obs_l, done_l, act_l, logp_l, v_l, r_l, init = [], [], [], [], [], [], []
    h, c, obs, done = st["h"], st["c"], st["obs"], st["done"]
    with torch.no_grad():
        for t in range(ROLL):
            if t % L == 0:
                init.append((h.clone(), c.clone()))
            logits, v, h, c = m(obs[None], h, c, done[None])
            d = torch.distributions.Categorical(logits=logits[0])
            a = d.sample()
            obs_l.append(obs), done_l.append(done), act_l.append(a), logp_l.append(d.log_prob(a)), v_l.append(v[0])
            nxt, r, dn = env_step(obs, F.one_hot(a, NA).float(), g)
            obs = torch.where(dn[:, None] > 0, torch.randn(NE, OBS, generator=g), nxt)
            r_l.append(r)
            done = dn
        _, v_last, _, _ = m(obs[None], h, c, done[None])
    st.update(h=h, c=c, obs=obs, done=done)
    obs_t, done_t, act_t, logp_t, v_t, r_t = map(torch.stack, (obs_l, done_l, act_l, logp_l, v_l, r_l))
    adv = torch.zeros_like(r_t)
    last, nv = torch.zeros(NE), v_last[0]
    for t in reversed(range(ROLL)):
        nd = done_t[t + 1] if t + 1 < ROLL else done
        delta = r_t[t] + 0.99 * nv * (1 - nd) - v_t[t]
        last = delta + 0.99 * 0.95 * (1 - nd) * last
        adv[t] = last
        nv = v_t[t]
    ret = adv + v_t
    out: Snap = {}
    seqs = [(k, e) for k in range(ROLL // L) for e in range(NE)]  # (chunk, env)
    for epoch in range(2):
        perm = torch.randperm(len(seqs))
        for mb in range(2):
            idx = [seqs[i] for i in perm[mb * 4:(mb + 1) * 4].tolist()]
            ks = torch.tensor([k for k, _ in idx])
            es = torch.tensor([e for _, e in idx])
            tt = ks[None, :] * L + torch.arange(L)[:, None]  # (L, n)
            o, dn, a = obs_t[tt, es], done_t[tt, es], act_t[tt, es]
            h0 = torch.cat([init[k][0][:, e:e + 1] for k, e in idx], 1)
            c0 = torch.cat([init[k][1][:, e:e + 1] for k, e in idx], 1)
            dn0 = dn.clone()
            dn0[0] = 0  # the stored state already reflects the reset
            logits, v, _, _ = m(o, h0, c0, dn0)
            d = torch.distributions.Categorical(logits=logits)
            ratio = (d.log_prob(a) - logp_t[tt, es]).exp()
            A = adv[tt, es]
            A = (A - A.mean()) / (A.std() + 1e-8)
            pg = -torch.min(ratio * A, ratio.clamp(0.8, 1.2) * A).mean()
            loss = pg + 0.5 * (v - ret[tt, es]).pow(2).mean() - 0.01 * d.entropy().mean()
            st["opt"].zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            out |= grads(m, f"e{epoch}{mb}") | {f"loss{epoch}{mb}": loss.detach().clone()}
            st["opt"].step()
    return out


class RQ(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = MLP(OBS, H, p=0.0)
        self.core = LSTMCore()
        self.head = nn.Linear(H, NA)

    def forward(self, obs, h, c):
        o, h, c = self.core(torch.tanh(self.enc(obs)), h, c)
        return self.head(o), h, c


def r2d2_make():
    q = RQ()
    return nn.ModuleDict(dict(q=q, tgt=copy.deepcopy(q)))


def r2d2_step(m, st, s, Ls=8, burn=3):
    g = _gen(s)
    obs = torch.randn(Ls, NE, OBS, generator=g)
    a = torch.randint(0, NA, (Ls, NE), generator=g)
    r = torch.randn(Ls, NE, generator=g)
    h0, c0 = 0.1 * torch.randn(1, NE, H, generator=g), 0.1 * torch.randn(1, NE, H, generator=g)
    q, tgt = m["q"], m["tgt"]
    with torch.no_grad():
        _, h, c = q(obs[:burn], h0, c0)
        _, ht, ct = tgt(obs[:burn], h0, c0)
    qs, _, _ = q(obs[burn:], h, c)
    with torch.no_grad():
        qn, _, _ = q(obs[burn:], h, c)
        qt, _, _ = tgt(obs[burn:], ht, ct)
        a2 = qn[1:].argmax(-1, keepdim=True)
        y = r[burn:-1] + 0.99 * qt[1:].gather(-1, a2).squeeze(-1)
    loss = F.smooth_l1_loss(qs[:-1].gather(-1, a[burn:-1, :, None]).squeeze(-1), y)
    st["opt"].zero_grad(set_to_none=True)
    loss.backward()
    out = grads(m, "g") | {"loss": loss.detach().clone()}
    st["opt"].step()
    polyak(tgt, q, 0.05)
    return out


# ================================================================ DQN
def dqn_make():
    q = MLP(OBS, NA, n=3, p=0.0)
    return nn.ModuleDict(dict(q=q, target=copy.deepcopy(q)))


def dqn_batch(s, n=16):
    g = _gen(s)
    return (torch.randn(n, OBS, generator=g), torch.randint(0, NA, (n,), generator=g), torch.randn(n, generator=g),
            torch.randn(n, OBS, generator=g), (torch.rand(n, generator=g) < 0.1).float())


def dqn_step(mode):
    def step(m, st, s):
        o, a, r, o2, d = dqn_batch(s)
        q = m["q"]
        if mode in ("copy", "copygrad"):  # a deep copy made inside the runtime, held outside the root
            if s % 2 == 0:
                st["tgt"] = copy.deepcopy(q)
            tgt = st["tgt"]
        elif mode == "replace":  # a deep copy replacing a root child (the old target's regions)
            if s % 2 == 0:
                m["target"] = copy.deepcopy(q)
            tgt = m["target"]
        else:
            tgt = m["target"]
        if mode in ("gradtarget", "copygrad"):  # target computed with grad on, detached after
            a2 = q(o2).argmax(-1, keepdim=True)
            y = (r + 0.99 * (1 - d) * tgt(o2).gather(-1, a2).squeeze(-1)).detach()
        else:
            with torch.no_grad():
                a2 = q(o2).argmax(-1, keepdim=True)
                y = r + 0.99 * (1 - d) * tgt(o2).gather(-1, a2).squeeze(-1)
        loss = F.smooth_l1_loss(q(o).gather(-1, a[:, None]).squeeze(-1), y)
        st["opt"].zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(q.parameters(), 10.0)
        out = grads(m, "g") | {"loss": loss.detach().clone(), "y": y.clone()}
        st["opt"].step()
        if mode == "sd" and s % 2 == 1:
            m["target"].load_state_dict(q.state_dict())
        elif mode in ("polyak", "gradtarget"):
            polyak(m["target"], q, 0.1)
        return out
    return step


def dqn_setup(m):
    return {"opt": torch.optim.Adam(m["q"].parameters(), 1e-3)}


# ================================================================ SAC / TD3
class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = MLP(OBS, 2 * ACT, p=0.0)

    def forward(self, o):
        mean, log_std = self.net(o).chunk(2, -1)
        return mean, log_std.clamp(-5, 2)

    def sample(self, o):
        mean, log_std = self(o)
        return tanh_sample(mean, log_std)


def tanh_sample(mean, log_std):
    d = Normal(mean, log_std.exp())
    u = d.rsample()
    a = torch.tanh(u)
    logp = (d.log_prob(u) - 2 * (np.log(2) - u - F.softplus(-2 * u))).sum(-1)
    return a, logp


class ActorHead(nn.Module):
    """Sampling inside a region (reparameterised draw replayed)."""
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc = nn.Linear(H, 2 * ACT)

    def forward(self, x):
        mean, log_std = self.fc(self.ln(x)).chunk(2, -1)
        return tanh_sample(mean, log_std.clamp(-5, 2))


class HeadActor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = MLP(OBS, H, p=0.0)
        self.head = ActorHead()

    def sample(self, o):
        return self.head(F.relu(self.net(o)))


class Qf(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = MLP(OBS + ACT, 1, p=0.0)

    def forward(self, o, a):
        return self.net(torch.cat([o, a], -1)).squeeze(-1)


class Temp(nn.Module):
    def __init__(self):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.zeros(()))


def sac_make(head=False):
    def make():
        q1, q2 = Qf(), Qf()
        return nn.ModuleDict(dict(actor=HeadActor() if head else Actor(), q1=q1, q2=q2, q1_t=copy.deepcopy(q1).requires_grad_(False),
                                  q2_t=copy.deepcopy(q2).requires_grad_(False), temp=Temp()))
    return make


def sac_setup(m):
    return dict(opt_q=torch.optim.Adam(list(m["q1"].parameters()) + list(m["q2"].parameters()), 1e-3),
                opt_pi=torch.optim.Adam(m["actor"].parameters(), 1e-3), opt_a=torch.optim.Adam(m["temp"].parameters(), 1e-2))


def sac_batch(s, n=16):
    g = _gen(s)
    return (torch.randn(n, OBS, generator=g), torch.rand(n, ACT, generator=g) * 2 - 1, torch.randn(n, generator=g),
            torch.randn(n, OBS, generator=g), (torch.rand(n, generator=g) < 0.1).float())


def sac_step(freeze):
    def step(m, st, s):
        o, a, r, o2, d = sac_batch(s)
        alpha = m["temp"].log_alpha.exp()
        with torch.no_grad():
            a2, logp2 = m["actor"].sample(o2)
            qt = torch.min(m["q1_t"](o2, a2), m["q2_t"](o2, a2)) - alpha * logp2
            y = r + 0.99 * (1 - d) * qt
        lq = F.mse_loss(m["q1"](o, a), y) + F.mse_loss(m["q2"](o, a), y)
        st["opt_q"].zero_grad(set_to_none=True)
        lq.backward()
        out = grads(m, "q") | {"lq": lq.detach().clone()}
        st["opt_q"].step()
        qparams = list(m["q1"].parameters()) + list(m["q2"].parameters())
        if freeze:
            for p in qparams:
                p.requires_grad_(False)
        pa, logp = m["actor"].sample(o)
        lpi = (alpha.detach() * logp - torch.min(m["q1"](o, pa), m["q2"](o, pa))).mean()
        st["opt_pi"].zero_grad(set_to_none=True)
        lpi.backward()
        out |= grads(m, "pi") | {"lpi": lpi.detach().clone()}
        st["opt_pi"].step()
        if freeze:
            for p in qparams:
                p.requires_grad_(True)
        la = -(m["temp"].log_alpha * (logp.detach() - ACT)).mean()
        st["opt_a"].zero_grad(set_to_none=True)
        la.backward()
        out |= grads(m, "a") | {"la": la.detach().clone()}
        st["opt_a"].step()
        polyak(m["q1_t"], m["q1"], 0.05)
        polyak(m["q2_t"], m["q2"], 0.05)
        return out
    return step


class DetActor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = MLP(OBS, ACT, p=0.0)

    def forward(self, o):
        return torch.tanh(self.net(o))


def td3_make():
    pi, q1, q2 = DetActor(), Qf(), Qf()
    return nn.ModuleDict(dict(pi=pi, q1=q1, q2=q2, pi_t=copy.deepcopy(pi), q1_t=copy.deepcopy(q1), q2_t=copy.deepcopy(q2)))


def td3_setup(m):
    return dict(opt_q=torch.optim.Adam(list(m["q1"].parameters()) + list(m["q2"].parameters()), 1e-3),
                opt_pi=torch.optim.Adam(m["pi"].parameters(), 1e-3))


def td3_step(m, st, s):
    o, a, r, o2, d = sac_batch(s)
    with torch.no_grad():
        noise = (torch.randn_like(a) * 0.2).clamp(-0.5, 0.5)
        a2 = (m["pi_t"](o2) + noise).clamp(-1, 1)
        y = r + 0.99 * (1 - d) * torch.min(m["q1_t"](o2, a2), m["q2_t"](o2, a2))
    lq = F.mse_loss(m["q1"](o, a), y) + F.mse_loss(m["q2"](o, a), y)
    st["opt_q"].zero_grad(set_to_none=True)
    lq.backward()
    out = grads(m, "q") | {"lq": lq.detach().clone()}
    st["opt_q"].step()
    if s % 2 == 1:  # delayed policy update
        lpi = -m["q1"](o, m["pi"](o)).mean()
        st["opt_pi"].zero_grad(set_to_none=True)
        lpi.backward()
        out |= grads(m, "pi") | {"lpi": lpi.detach().clone()}
        st["opt_pi"].step()
        for t, src in (("pi_t", "pi"), ("q1_t", "q1"), ("q2_t", "q2")):
            polyak(m[t], m[src], 0.05)
    return out


# ================================================================ transformer world model
VOC, K, D = 10, 3, 16


class Block(nn.Module):
    def __init__(self, mode, p=0.1):
        super().__init__()
        self.mode = mode
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.drop = nn.Dropout(p)
        self.p = p
        self._masks: dict[int, torch.Tensor] = {}

    def forward(self, x, mask=None):
        Bn, Ln, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(Bn, Ln, 3, 2, D // 2).permute(2, 0, 3, 1, 4)
        if self.mode == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        else:
            if self.mode == "cache":
                if Ln not in self._masks:
                    self._masks[Ln] = torch.ones(Ln, Ln, dtype=torch.bool).tril()
                mask = self._masks[Ln]
            att = (q @ k.transpose(-1, -2)) / (D // 2) ** 0.5
            att = self.drop(att.masked_fill(~mask, float("-inf")).softmax(-1))
            y = att @ v
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(Bn, Ln, D)))
        return x + self.drop(self.mlp(self.ln2(x)))


class TWM(nn.Module):
    def __init__(self, mode, n=3):
        super().__init__()
        self.tok = nn.Embedding(VOC + NA, D)
        self.pos = nn.Embedding(64, D)
        self.blocks = nn.ModuleList([Block(mode) for _ in range(n)])
        self.ln = nn.LayerNorm(D)
        self.head_tok, self.head_rew, self.head_done = nn.Linear(D, VOC), nn.Linear(D, 1), nn.Linear(D, 1)
        self.register_buffer("causal", torch.ones(64, 64, dtype=torch.bool).tril(), persistent=False)

    def trunk(self, seq):
        Ln = seq.shape[1]
        x = self.tok(seq) + self.pos(torch.arange(Ln))
        mask = self.causal[:Ln, :Ln]
        for b in self.blocks:
            x = b(x, mask)
        return self.ln(x)

    def forward(self, obs_tok, act, rew, done):
        Bn, Tn, _ = obs_tok.shape
        seq = torch.cat([obs_tok, VOC + act[..., None]], -1).view(Bn, Tn * (K + 1))
        x = self.trunk(seq)
        tgt = seq[:, 1:]
        logits = self.head_tok(x[:, :-1])
        is_obs = tgt < VOC
        l_tok = F.cross_entropy(logits[is_obs], tgt[is_obs])
        xa = x[:, K::K + 1]  # action-token positions
        l_rew = F.mse_loss(self.head_rew(xa).squeeze(-1), rew)
        l_done = F.binary_cross_entropy_with_logits(self.head_done(xa).squeeze(-1), done)
        return l_tok + l_rew + l_done


def twm_data(s, Tn=4, Bn=B):
    g = _gen(s)
    return (torch.randint(0, VOC, (Bn, Tn, K), generator=g), torch.randint(0, NA, (Bn, Tn), generator=g),
            torch.randn(Bn, Tn, generator=g), (torch.rand(Bn, Tn, generator=g) < 0.1).float())


def twm_step(lens=None):
    def step(m, st, s):
        batch = twm_data(s, lens[s % len(lens)] if lens else 4)
        loss = m(*batch)
        st["opt"].zero_grad(set_to_none=True)
        loss.backward()
        out = grads(m, "g") | {"loss": loss.detach().clone()}
        st["opt"].step()
        return out
    return step


class AC(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOC, 4)
        self.net = MLP(K * 4, NA + 1, p=0.0)

    def forward(self, tok):
        o = self.net(self.emb(tok).flatten(-2))
        return o[..., :NA], o[..., NA]


def iris_make():
    return nn.ModuleDict(dict(wm=TWM("arg"), ac=AC()))


def iris_setup(m):
    return dict(opt_wm=torch.optim.Adam(m["wm"].parameters(), 1e-3), opt_ac=torch.optim.Adam(m["ac"].parameters(), 1e-3))


def iris_step(m, st, s, HOR=3, lam=0.95):
    wm, ac = m["wm"], m["ac"]
    batch = twm_data(s, 3)
    loss = wm(*batch)
    st["opt_wm"].zero_grad(set_to_none=True)
    loss.backward()
    out = grads(m, "wm") | {"loss_wm": loss.detach().clone()}
    st["opt_wm"].step()
    # imagination: the world model under no_grad, sampling tokens; the actor-critic with grad
    obs_tok, act = batch[0], batch[1]
    seq = torch.cat([obs_tok, VOC + act[..., None]], -1).flatten(1)[:, :-1]  # ends after last obs tokens
    cur = obs_tok[:, -1]
    logps, ents, vals, rews, dones = [], [], [], [], []
    for hstep in range(HOR):
        logits, v = ac(cur)
        d = torch.distributions.Categorical(logits=logits)
        a = d.sample()
        logps.append(d.log_prob(a)), ents.append(d.entropy()), vals.append(v)
        with torch.no_grad():
            seq = torch.cat([seq, VOC + a[:, None]], 1)
            x = wm.trunk(seq)
            rews.append(wm.head_rew(x[:, -1]).squeeze(-1))
            dones.append(torch.sigmoid(wm.head_done(x[:, -1]).squeeze(-1)))
            new = []
            for j in range(K):
                tokp = wm.head_tok(wm.trunk(seq)[:, -1]).softmax(-1)
                t_ = torch.multinomial(tokp, 1)
                seq = torch.cat([seq, t_], 1)
                new.append(t_)
            cur = torch.cat(new, 1)
    _, v_last = ac(cur)
    vals.append(v_last)
    V = torch.stack(vals)
    R = V[-1].detach()
    rets = []
    for t in reversed(range(HOR)):
        R = rews[t] + 0.99 * (1 - dones[t]) * ((1 - lam) * V[t + 1].detach() + lam * R)
        rets.append(R)
    ret = torch.stack(rets[::-1])
    adv = (ret - V[:-1]).detach()
    l_ac = -(torch.stack(logps) * adv).mean() - 1e-3 * torch.stack(ents).mean() + (V[:-1] - ret).pow(2).mean()
    st["opt_ac"].zero_grad(set_to_none=True)
    l_ac.backward()
    out |= grads(m, "ac") | {"loss_ac": l_ac.detach().clone()}
    st["opt_ac"].step()
    return out


# ================================================================ harness
@dataclass
class Case:
    make: Callable[[], nn.Module]
    setup: Callable[[nn.Module], dict]
    step: Callable[[nn.Module, dict, int], Snap]
    regions: Any = None
    varying: bool = False
    no_drop: bool = False
    steps: int = 4


def wmk(disc):
    return lambda m: {"opt": torch.optim.Adam(m.parameters(), 1e-3)}


CASES: dict[str, Case] = {
    "rssm_gauss": Case(wm_only_make("gauss", False), adam(), wm_only_step(False)),
    "rssm_gauss_r": Case(wm_only_make("gauss", False), adam(), wm_only_step(False), regions=[Res, RSSMStep]),
    "rssm_cat_r": Case(wm_only_make("cat", True), adam(), wm_only_step(True), regions=[Res, RSSMStep]),
    "rssm_cell_root": Case(lambda: RSSMStep("gauss", ACT), adam(), cell_root_step, regions=[RSSMStep]),
    "dreamer_v1": Case(dreamer_make("gauss", False), dreamer_setup, dreamer_step(False, True, "copy")),
    "dreamer_v1_r": Case(dreamer_make("gauss", False), dreamer_setup, dreamer_step(False, True, "copy"), regions=[Res, RSSMStep]),
    "dreamer_v3_r": Case(dreamer_make("cat", True), dreamer_setup, dreamer_step(True, False, "polyak"), regions=[Res, RSSMStep]),
    "dreamer_st_r": Case(dreamer_make("cat", True), dreamer_setup, dreamer_step(True, True, "copy"), regions=[Res, RSSMStep]),
    "rppo_lstm": Case(lambda: RecPolicy(LSTMCore), rppo_setup, rppo_step, regions=[Res, LSTMCore]),
    "rppo_cell": Case(lambda: RecPolicy(CellCore), rppo_setup, rppo_step, regions=[Res, CellCore]),
    "rppo_auto": Case(lambda: RecPolicy(CellCore), rppo_setup, rppo_step),
    "r2d2": Case(r2d2_make, adam(), r2d2_step, regions=[Res, LSTMCore]),
    "dqn_sd": Case(dqn_make, dqn_setup, dqn_step("sd")),
    "dqn_copy": Case(dqn_make, dqn_setup, dqn_step("copy")),
    "dqn_replace": Case(dqn_make, dqn_setup, dqn_step("replace")),
    "dqn_polyak": Case(dqn_make, dqn_setup, dqn_step("polyak")),
    "dqn_gradtarget": Case(dqn_make, dqn_setup, dqn_step("gradtarget")),
    "sac": Case(sac_make(), sac_setup, sac_step(False)),
    "sac_freeze": Case(sac_make(), sac_setup, sac_step(True)),
    "sac_head": Case(sac_make(True), sac_setup, sac_step(False), regions=[Res, ActorHead]),
    "td3": Case(td3_make, td3_setup, td3_step),
    "twm_buffer": Case(lambda: TWM("arg"), adam(), twm_step()),
    "twm_cache_var": Case(lambda: TWM("cache"), adam(), twm_step([3, 4, 3, 5]), varying=True),
    "twm_sdpa": Case(lambda: TWM("sdpa"), adam(), twm_step()),
    "iris": Case(iris_make, iris_setup, iris_step),
    # extra
    "rssm_long_r": Case(wm_only_make("gauss", False), adam(), wm_only_step(False, 40), regions=[Res, RSSMStep]),
    "rssm_cat_long_r": Case(wm_only_make("cat", True), adam(), wm_only_step(True, 40), regions=[Res, RSSMStep]),
    "dqn_copygrad": Case(dqn_make, dqn_setup, dqn_step("copygrad")),
}


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return None


def run_loop(case, model, steps, rt=None):
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


def check_report(recs, variant, stable, drops):
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


def main():
    argv = [a for a in sys.argv[1:] if not a.startswith("-")]
    only = argv[0].split(",") if argv and argv[0] != "all" else None
    variants = argv[1].split(",") if len(argv) > 1 else ZOO_VARIANTS
    verbose = "-v" in sys.argv
    failed, counts = 0, {v: [0, 0] for v in variants}
    for name, case in CASES.items():
        if only and name not in only:
            continue
        torch.manual_seed(0)
        model = case.make().train()
        kw = {"regions": case.regions} if case.regions else {}
        t0 = time.time()
        ref = run_loop(case, copy.deepcopy(model), case.steps)
        ref2 = run_loop(case, copy.deepcopy(model), case.steps)
        try:
            assert_bitwise(ref, ref2)
            det = "det"
        except AssertionError as e:
            det = f"NONDET({str(e)[:100]})"
        print(f"---- {name} plain {det} {time.time() - t0:.1f}s", flush=True)
        for v in variants:
            t0 = time.time()
            CAP.msgs.clear()
            try:
                budget = None
                if v in ("auto_tight", "auto_serve"):
                    probe = copy.deepcopy(model)
                    keep = variant_runtime(probe, "keep", **kw)
                    run_loop(case, probe, 1, keep)
                    budget = max(r.peak_activation_bytes for r in keep.report().steps) // 2
                    assert budget > 0
                m = copy.deepcopy(model)
                rt = variant_runtime(m, v, budget, **kw)
                got = run_loop(case, m, case.steps, rt)
                assert_bitwise(ref, got)
                recs = rt.report().steps
                if v == "keep" and verbose:
                    print(f"    regions: {rt.regions}")
                check_report(recs, v, not case.varying, not case.no_drop)
                info = f"recs={len(recs)} replays={sum(r.replays for r in recs)} phases={''.join(r.phase[0] for r in recs)}"
                print(f"PASS {name:16s} {v:11s} {time.time() - t0:5.1f}s {info} warn={len(CAP.msgs)}", flush=True)
                counts[v][0] += 1
            except Exception as e:
                failed += 1
                counts[v][1] += 1
                print(f"FAIL {name:16s} {v:11s} {type(e).__name__}: {str(e)[:400]}", flush=True)
                if verbose:
                    traceback.print_exc()
            seen = {}
            for msg in CAP.msgs:
                seen[msg[:300]] = seen.get(msg[:300], 0) + 1
            for msg, n in seen.items():
                print(f"    WARN x{n}: {msg}", flush=True)
    print("counts (pass, fail):", counts)
    print(f"{failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
