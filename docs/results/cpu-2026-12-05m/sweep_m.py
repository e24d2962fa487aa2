"""Model families not swept before, under every zoo variant, gradients compared bitwise with
plain training (tests/helpers.check_variant, through ../cpu-2026-12-05/sweep.py):
click-through-rate / recommender models of deepctr-torch (DeepFM, xDeepFM, DCN, DCN-Mix,
AutoInt, NFM, AFM, PNN, FiBiNET, WDL, CCPM, ONN, AFN, IFM, DIFM, DIN and DIEN with
behaviour-sequence attention), a hand-written DLRM (EmbeddingBag per sparse feature, dense
and sparse gradients), and stable-baselines3 policies trained through their nn.Module
methods with losses written here (PPO's clipped loss from evaluate_actions on MLP, CNN,
Dict-observation and MultiDiscrete policies, SAC actor + twin critics + entropy
coefficient, with and without gSDE, TD3, DQN with a target network under no_grad).

    PYTHONPATH=/tmp/sweep_m/pkgs OMP_NUM_THREADS=1 /work/main/.venv/bin/python \
        docs/results/cpu-2026-12-05m/sweep_m.py [NAME,NAME ...|all] [VARIANT,...] [-v] \
        > docs/results/cpu-2026-12-05m/sweep_m.txt 2>&1

DIR (/tmp/sweep_m/pkgs) holds, installed with ``pip install --no-deps --target DIR``:
deepctr-torch 0.3.0, stable-baselines3 2.9.2 and what they import: gymnasium 1.4.0,
farama-notifications 0.0.6, cloudpickle 3.1.3, scikit-learn 1.9.1, scipy 1.17.1,
joblib 1.6.0, threadpoolctl 3.8.0, narwhals 2.29.0, requests 2.34.2, urllib3 2.8.0,
idna 3.21, certifi 2026.10.19.post1, charset-normalizer 3.5.3. (torch 2.13.0+cpu,
numpy 2.4.6, tqdm 4.70.1 from the venv.) Tiny configurations, 4 steps each, on the CPU.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))

logging.getLogger("deepctr_torch").setLevel(logging.ERROR)

import deepctr_torch.models as dm  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from deepctr_torch.inputs import DenseFeat, SparseFeat, VarLenSparseFeat, build_input_features  # noqa: E402
from stable_baselines3.common.policies import (  # noqa: E402
    ActorCriticCnnPolicy,
    ActorCriticPolicy,
    MultiInputActorCriticPolicy,
)
from stable_baselines3.dqn.policies import CnnPolicy as DQNCnnPolicy  # noqa: E402
from stable_baselines3.dqn.policies import DQNPolicy  # noqa: E402
from stable_baselines3.sac.policies import SACPolicy  # noqa: E402
from stable_baselines3.td3.policies import TD3Policy  # noqa: E402
import sweep  # noqa: E402
from sweep import run  # noqa: E402
from torch import nn  # noqa: E402

B = 8


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + seed)


# ---------------------------------------------------------------------------------------
# deepctr-torch


VOCAB = 12
SPARSE = [SparseFeat(f"C{i}", VOCAB, embedding_dim=4) for i in range(4)]
DENSE = [DenseFeat(f"I{i}", 1) for i in range(2)]
COLS = SPARSE + DENSE


def seq_cols(neg: bool = False) -> list:
    cols = [
        SparseFeat("user", VOCAB, embedding_dim=4),
        SparseFeat("item_id", VOCAB, embedding_dim=4),
        SparseFeat("cate_id", 6, embedding_dim=4),
        DenseFeat("pay_score", 1),
        VarLenSparseFeat(SparseFeat("hist_item_id", VOCAB, embedding_dim=4, embedding_name="item_id"), maxlen=5, length_name="seq_length"),
        VarLenSparseFeat(SparseFeat("hist_cate_id", 6, embedding_dim=4, embedding_name="cate_id"), maxlen=5, length_name="seq_length"),
    ]
    if neg:
        cols += [
            VarLenSparseFeat(SparseFeat("neg_hist_item_id", VOCAB, embedding_dim=4, embedding_name="item_id"), maxlen=5, length_name="seq_length"),
            VarLenSparseFeat(SparseFeat("neg_hist_cate_id", 6, embedding_dim=4, embedding_name="cate_id"), maxlen=5, length_name="seq_length"),
        ]
    return cols


class CTR(nn.Module):
    """BCE on a deepctr model's output, plus its L2 terms and auxiliary loss (as .fit)."""

    def __init__(self, model: nn.Module, cols: list) -> None:
        super().__init__()
        self.model = model
        self.cols = cols

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        p = self.model(x).squeeze(-1)
        loss = F.binary_cross_entropy(p, y)
        return loss + self.model.get_regularization_loss().sum() + self.model.aux_loss.sum()


def ctr_batch(cols: list):
    index = build_input_features(cols)
    by_name = {c.name: c for c in cols}

    def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _gen(seed)
        n = max(e for _, e in index.values())
        x = torch.zeros(B, n)
        lengths = torch.randint(1, 6, (B,), generator=g)
        for name, (s, e) in index.items():
            c = by_name.get(name)
            if isinstance(c, SparseFeat):
                x[:, s] = torch.randint(0, c.vocabulary_size, (B,), generator=g).float()
            elif isinstance(c, DenseFeat):
                x[:, s:e] = torch.rand(B, e - s, generator=g)
            elif isinstance(c, VarLenSparseFeat):
                ids = torch.randint(1, c.vocabulary_size, (B, c.maxlen), generator=g)
                ids[torch.arange(c.maxlen)[None, :] >= lengths[:, None]] = 0
                x[:, s:e] = ids.float()
            else:  # the length column
                x[:, s] = lengths.float()
        y = (torch.rand(B, generator=g) > 0.5).float()
        return x, y

    return batch


def ctr(factory, cols=COLS, linear=True, **kw):
    def make() -> nn.Module:
        args = (cols, cols) if linear else (cols,)
        return CTR(factory(*args, device="cpu", **kw), cols)

    return make


def din(**kw):
    def make() -> nn.Module:
        cols = seq_cols()
        return CTR(dm.DIN(cols, ["item_id", "cate_id"], dnn_hidden_units=(16, 8), att_hidden_size=(8, 4), device="cpu", **kw), cols)

    return make


def dien(gru_type: str, neg: bool, **kw):
    def make() -> nn.Module:
        cols = seq_cols(neg)
        m = dm.DIEN(cols, ["item_id", "cate_id"], gru_type=gru_type, use_negsampling=neg, dnn_hidden_units=(16, 8),
                    att_hidden_units=(8, 4), device="cpu", **kw)
        return CTR(m, cols)

    return make


# ---------------------------------------------------------------------------------------
# DLRM, by hand


class DLRM(nn.Module):
    def __init__(self, n_dense: int = 4, vocab: tuple[int, ...] = (20, 15, 30, 10), dim: int = 8, sparse: bool = False) -> None:
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(v, dim, mode="sum", sparse=sparse) for v in vocab)
        self.bot = nn.Sequential(nn.Linear(n_dense, 16), nn.ReLU(), nn.Linear(16, dim), nn.ReLU())
        f = len(vocab) + 1
        li, lj = torch.tril_indices(f, f, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = nn.Sequential(nn.Linear(dim + len(li), 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, batch) -> torch.Tensor:
        dense, idx, offs, y = batch
        x = self.bot(dense)
        ly = [e(i, o) for e, i, o in zip(self.emb, idx, offs)]
        t = torch.stack([x] + ly, dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        zflat = z[:, self.li, self.lj]
        p = self.top(torch.cat([x, zflat], dim=1)).squeeze(-1)
        return F.binary_cross_entropy_with_logits(p, y)


def dlrm_batch(seed: int):
    g = _gen(seed)
    dense = torch.rand(B, 4, generator=g)
    idx, offs = [], []
    for v in (20, 15, 30, 10):
        lens = torch.randint(1, 4, (B,), generator=g)
        offs.append(torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]]))
        idx.append(torch.randint(0, v, (int(lens.sum()),), generator=g))
    y = (torch.rand(B, generator=g) > 0.5).float()
    return dense, idx, offs, y


# ---------------------------------------------------------------------------------------
# stable-baselines3


def lr(_):
    return 3e-4


VEC = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
IMG = gym.spaces.Box(0, 255, (3, 36, 36), np.uint8)
DICT = gym.spaces.Dict({"img": IMG, "vec": VEC})


class PPOLoss(nn.Module):
    """PPO's clipped surrogate, clipped value loss and entropy bonus from evaluate_actions."""

    def __init__(self, policy: ActorCriticPolicy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, batch) -> torch.Tensor:
        obs, actions, old_logp, adv, returns, old_values = batch
        values, logp, entropy = self.policy.evaluate_actions(obs, actions)
        values = values.flatten()
        ratio = torch.exp(logp - old_logp)
        pg = -torch.min(adv * ratio, adv * torch.clamp(ratio, 0.8, 1.2)).mean()
        v = old_values + torch.clamp(values - old_values, -0.2, 0.2)
        vf = F.mse_loss(returns, v)
        ent = -torch.mean(-logp) if entropy is None else -torch.mean(entropy)
        return pg + 0.5 * vf + 0.01 * ent


def sample_obs(space, g):
    if isinstance(space, gym.spaces.Dict):
        return {k: sample_obs(s, g) for k, s in space.spaces.items()}
    if space.dtype == np.uint8:
        return torch.randint(0, 256, (B, *space.shape), generator=g, dtype=torch.uint8)
    return torch.rand(B, *space.shape, generator=g) * 2 - 1


def sample_actions(space, g):
    if isinstance(space, gym.spaces.Discrete):
        return torch.randint(0, int(space.n), (B,), generator=g)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return torch.stack([torch.randint(0, int(n), (B,), generator=g) for n in space.nvec], 1)
    return torch.rand(B, *space.shape, generator=g) * 2 - 1


def no_sde_graph(dist) -> None:
    """gSDE samples its exploration matrices from ``log_std`` at construction: tensors with
    a graph, which ``copy.deepcopy`` refuses (plainly). Drop them; SAC draws them again in
    its forward, as SAC.train does at each gradient step (PPO's loss does not use them)."""
    dist.weights_dist = dist.exploration_mat = dist.exploration_matrices = None


def ppo(cls, obs_space, act_space, **kw):
    def make() -> nn.Module:
        pol = cls(obs_space, act_space, lr, **kw)
        if kw.get("use_sde"):
            no_sde_graph(pol.action_dist)
        return PPOLoss(pol)

    def batch(seed: int):
        g = _gen(seed)
        return (sample_obs(obs_space, g), sample_actions(act_space, g), torch.randn(B, generator=g) * 0.1 - 1,
                torch.randn(B, generator=g), torch.randn(B, generator=g), torch.randn(B, generator=g))

    return make, batch


ACT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


class SACLoss(nn.Module):
    """SAC's entropy-coefficient, critic and actor losses summed (one backward)."""

    def __init__(self, policy: SACPolicy, tau: float = 0.05) -> None:
        super().__init__()
        self.policy = policy
        self.log_ent_coef = nn.Parameter(torch.zeros(1))
        self.tau = tau
        self.target_entropy = -2.0

    def forward(self, batch) -> torch.Tensor:
        obs, actions, next_obs, rewards, dones = batch
        pol = self.policy
        with torch.no_grad():  # the target network's Polyak update of the previous step
            for p, t in zip(pol.critic.parameters(), pol.critic_target.parameters()):
                t.mul_(1 - self.tau).add_(p, alpha=self.tau)
        if pol.actor.use_sde:
            pol.actor.reset_noise(B)
        actions_pi, log_prob = pol.actor.action_log_prob(obs)
        log_prob = log_prob.reshape(-1, 1)
        ent_coef = torch.exp(self.log_ent_coef.detach())
        ent_coef_loss = -(self.log_ent_coef * (log_prob + self.target_entropy).detach()).mean()
        with torch.no_grad():
            next_actions, next_log_prob = pol.actor.action_log_prob(next_obs)
            next_q = torch.cat(pol.critic_target(next_obs, next_actions), dim=1)
            next_q, _ = torch.min(next_q, dim=1, keepdim=True)
            next_q = next_q - ent_coef * next_log_prob.reshape(-1, 1)
            target_q = rewards + (1 - dones) * 0.99 * next_q
        current_q = pol.critic(obs, actions)
        critic_loss = 0.5 * sum(F.mse_loss(q, target_q) for q in current_q)
        q_pi = torch.cat(pol.critic(obs, actions_pi), dim=1)
        min_q, _ = torch.min(q_pi, dim=1, keepdim=True)
        actor_loss = (ent_coef * log_prob - min_q).mean()
        return ent_coef_loss + critic_loss + actor_loss


class TD3Loss(nn.Module):
    def __init__(self, policy: TD3Policy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, batch) -> torch.Tensor:
        obs, actions, next_obs, rewards, dones = batch
        pol = self.policy
        with torch.no_grad():
            noise = (torch.randn_like(actions) * 0.2).clamp(-0.5, 0.5)
            next_actions = (pol.actor_target(next_obs) + noise).clamp(-1, 1)
            next_q = torch.cat(pol.critic_target(next_obs, next_actions), dim=1)
            next_q, _ = torch.min(next_q, dim=1, keepdim=True)
            target_q = rewards + (1 - dones) * 0.99 * next_q
        critic_loss = sum(F.mse_loss(q, target_q) for q in pol.critic(obs, actions))
        actor_loss = -pol.critic.q1_forward(obs, pol.actor(obs)).mean()
        return critic_loss + actor_loss


def offpolicy_batch(obs_space, act_space):
    def batch(seed: int):
        g = _gen(seed)
        return (sample_obs(obs_space, g), sample_actions(act_space, g), sample_obs(obs_space, g),
                torch.randn(B, 1, generator=g), (torch.rand(B, 1, generator=g) > 0.8).float())

    return batch


class DQNLoss(nn.Module):
    def __init__(self, policy: DQNPolicy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, batch) -> torch.Tensor:
        obs, actions, next_obs, rewards, dones = batch
        pol = self.policy
        with torch.no_grad():
            next_q, _ = pol.q_net_target(next_obs).max(dim=1)
            target_q = rewards.flatten() + (1 - dones.flatten()) * 0.99 * next_q
        q = torch.gather(pol.q_net(obs), dim=1, index=actions.long().reshape(-1, 1)).flatten()
        return F.smooth_l1_loss(q, target_q)


def sac_sde() -> nn.Module:
    pol = SACPolicy(VEC, ACT, lr, net_arch=[16, 16], use_sde=True)
    no_sde_graph(pol.actor.action_dist)
    return SACLoss(pol)


DISC = gym.spaces.Discrete(4)
SMALL = dict(net_arch=[16, 16])
CNN_KW = dict(features_extractor_kwargs=dict(features_dim=16), net_arch=[16])

MODELS: dict = {
    # deepctr-torch
    "deepfm": ctr(dm.DeepFM, dnn_hidden_units=(16, 8), dnn_dropout=0.1),
    "xdeepfm_bn": ctr(dm.xDeepFM, dnn_hidden_units=(16, 8), cin_layer_size=(8, 8), dnn_use_bn=True, dnn_dropout=0.1),
    "dcn_vector": ctr(dm.DCN, dnn_hidden_units=(16, 8)),
    "dcn_matrix": ctr(dm.DCN, dnn_hidden_units=(16, 8), cross_parameterization="matrix"),
    "dcnmix": ctr(dm.DCNMix, dnn_hidden_units=(16, 8), low_rank=4, num_experts=3),
    "autoint": ctr(dm.AutoInt, att_layer_num=2, att_head_num=2, dnn_hidden_units=(16, 8)),
    "nfm": ctr(dm.NFM, dnn_hidden_units=(16, 8), bi_dropout=0.2),
    "afm": ctr(dm.AFM, cols=SPARSE, attention_factor=4, afm_dropout=0.2),
    "pnn_in_out": ctr(dm.PNN, linear=False, dnn_hidden_units=(16, 8), use_inner=True, use_outter=True),
    "fibinet": ctr(dm.FiBiNET, dnn_hidden_units=(16, 8), reduction_ratio=2),
    "wdl": ctr(dm.WDL, dnn_hidden_units=(16, 8), dnn_dropout=0.1),
    "ccpm": ctr(dm.CCPM, cols=SPARSE, conv_kernel_width=(3, 2), conv_filters=(4, 4), dnn_hidden_units=(16,)),
    "onn": ctr(dm.ONN, dnn_hidden_units=(16, 8)),
    "afn": ctr(dm.AFN, ltl_hidden_size=8, afn_dnn_hidden_units=(16, 8)),
    "ifm": ctr(dm.IFM, dnn_hidden_units=(16, 8)),
    "difm": ctr(dm.DIFM, att_head_num=2, dnn_hidden_units=(16, 8)),
    "din_dice": din(),
    "din_norm": din(att_weight_normalization=True, att_activation="sigmoid", dnn_dropout=0.1),
    "dien_gru": dien("GRU", False),
    "dien_augru_neg": dien("AUGRU", True),
    "dien_agru": dien("AGRU", False),
    "dien_aigru": dien("AIGRU", False),
    # DLRM
    "dlrm": lambda: DLRM(),
    "dlrm_sparse": lambda: DLRM(sparse=True),
    # stable-baselines3
    "ppo_mlp_disc": ppo(ActorCriticPolicy, VEC, DISC, net_arch=dict(pi=[16], vf=[16]))[0],
    "ppo_mlp_box": ppo(ActorCriticPolicy, VEC, ACT, net_arch=[16, 16], share_features_extractor=False)[0],
    "ppo_mlp_sde": ppo(ActorCriticPolicy, VEC, ACT, net_arch=[16], use_sde=True)[0],
    "ppo_mlp_multi": ppo(ActorCriticPolicy, VEC, gym.spaces.MultiDiscrete([3, 2, 4]), net_arch=[16])[0],
    "ppo_cnn": ppo(ActorCriticCnnPolicy, IMG, DISC, **CNN_KW)[0],
    "ppo_dict": ppo(MultiInputActorCriticPolicy, DICT, ACT, features_extractor_kwargs=dict(cnn_output_dim=16), net_arch=[16])[0],
    "sac": lambda: SACLoss(SACPolicy(VEC, ACT, lr, net_arch=[16, 16])),
    "sac_sde": lambda: sac_sde(),
    "td3": lambda: TD3Loss(TD3Policy(VEC, ACT, lr, net_arch=[16, 16])),
    "dqn": lambda: DQNLoss(DQNPolicy(VEC, DISC, lr, net_arch=[16, 16])),
    "dqn_cnn": lambda: DQNLoss(DQNCnnPolicy(IMG, DISC, lr, **CNN_KW)),
}

PPO_SPACES = {
    "ppo_mlp_disc": (VEC, DISC),
    "ppo_mlp_box": (VEC, ACT),
    "ppo_mlp_sde": (VEC, ACT),
    "ppo_mlp_multi": (VEC, gym.spaces.MultiDiscrete([3, 2, 4])),
    "ppo_cnn": (IMG, DISC),
    "ppo_dict": (DICT, ACT),
}
OFFPOLICY_SPACES = {"sac": (VEC, ACT), "sac_sde": (VEC, ACT), "td3": (VEC, ACT), "dqn": (VEC, DISC), "dqn_cnn": (IMG, DISC)}


def batch(name: str, model: nn.Module):
    if isinstance(model, CTR):
        return ctr_batch(model.cols)
    if isinstance(model, DLRM):
        return dlrm_batch
    if name in PPO_SPACES:
        return ppo(ActorCriticPolicy, *PPO_SPACES[name])[1]
    return offpolicy_batch(*OFFPOLICY_SPACES[name])


# DIEN packs sequences of the batch's lengths, and DLRM's bags hold a random number of
# indices: the shapes change from step to step (auto runs each new, slightly larger
# signature as a plain full recompute: NOTE [Borrowed plans])
VARYING = frozenset({"dien_gru", "dien_augru_neg", "dien_agru", "dien_aigru", "dlrm", "dlrm_sparse"})


def regions(model: nn.Module):
    """deepctr's models and DLRM have no repeated blocks (offrecomp warns that nothing can
    be recomputed: sweep_m_no_regions.txt): choose every child of the deepctr model, and
    DLRM's MLPs and embedding bags. sb3's policies are discovered as they are."""
    if isinstance(model, CTR):
        return lambda m, n: n.startswith("model.") and n.count(".") == 1
    if isinstance(model, DLRM):
        return lambda m, n: n in ("bot", "top") or (n.startswith("emb.") and n.count(".") == 1)
    return None


def check_variant(model: nn.Module, batch, variant: str, **kw):
    r = regions(model)
    return _check_variant(model, batch, variant, **kw, **({"regions": r} if r else {}))


_check_variant = sweep.check_variant
sweep.check_variant = check_variant

if __name__ == "__main__":
    sys.exit(run(MODELS, batch, varying=VARYING))
