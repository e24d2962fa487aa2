"""diffusers models and training steps, and PEFT adapters on tiny Hugging Face models, under
every zoo variant, gradients compared bitwise with plain training
(tests/helpers.check_variant, through ../cpu-2026-12-05/sweep.py).

    OMP_NUM_THREADS=1 PYTHONPATH=DIR python docs/results/cpu-2026-12-05h/sweep_h.py [NAME,NAME ...|all] [VARIANT,...] [-v]

DIR holds, installed with ``pip install --no-deps --target DIR``: diffusers 0.42.1,
peft 0.21.2 and what diffusers imports beyond the venv: requests 2.34.2, urllib3 2.8.0,
charset-normalizer 3.5.2, certifi 2026.10.19.post1, importlib-metadata 10.2.0, zipp
4.1.2. From the venv: torch 2.13.0+cpu, transformers 5.25.0, accelerate 1.16.0,
huggingface_hub 2.4.0, safetensors 0.8.0. Tiny configurations built from config classes
(nothing downloaded), 4 steps each, on the CPU.

What the code brings (beyond ../cpu-2026-12-05's diffusers UNet and VAE): UNet2DModel
with attention blocks and resnet dropout, UNet2DConditionModel with cross attention on
separate text states, class embeddings and dropout, and with diffusers' own gradient
checkpointing; Transformer2DModel (continuous, cross attention, dropout; discrete
VQ-diffusion tokens with ada-norm), DiTTransformer2DModel (ada-norm-zero, class labels),
SD3 and Flux joint-attention transformers (Flux's rotary ids); AutoencoderKL encoded,
sampled from its latent distribution (``torch.randn`` inside the model) and decoded with
a KL term; DDPM steps whose wrapper draws timesteps and noise with torch inside its
forward and noises with ``DDPMScheduler.add_noise``; a latent-diffusion step through a
frozen VAE's sampled latents. PEFT: LoRA with dropout on BERT and GPT-2, DoRA with
dropout, LoKr, LoHa, IA3, VeRA, OFT, prefix tuning with a projection, prompt tuning,
P-tuning with an LSTM and an MLP prompt encoder, on Llama, GPT-2 and BERT (masked LM and
sequence classification with ``modules_to_save``). Left out: prefix tuning on BERT (peft
0.21.2 says "Model does not support past key values" with transformers 5.25), LoHa on
GPT-2's ``Conv1D`` (peft: "not supported").
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))

import diffusers
import peft
import torch
import transformers as tf
from torch import nn
from torch.nn import functional as F

from sweep import run

logging.getLogger("transformers").setLevel(logging.ERROR)
logging.getLogger("diffusers").setLevel(logging.ERROR)
logging.getLogger("peft").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", module="peft")
warnings.filterwarnings("ignore", module="diffusers")


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


# --- diffusers --------------------------------------------------------------------------


def unet2d(dropout: float = 0.0) -> diffusers.UNet2DModel:
    return diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8, attention_head_dim=8, dropout=dropout,
    )


def unet_cond(**kw: Any) -> diffusers.UNet2DConditionModel:
    return diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=24, attention_head_dim=8, norm_num_groups=8, **kw,
    )


def vae() -> diffusers.AutoencoderKL:
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
        norm_num_groups=4, sample_size=16,
    )


class UNetLoss(nn.Module):
    """x -> unet(x, t) regressed on a fixed target; batch: (sample, timesteps, [text])."""

    def __init__(self, m: nn.Module, **kw: Any) -> None:
        super().__init__()
        self.m, self.kw = m, kw

    def forward(self, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, t = b[0], b[1]
        kw = dict(self.kw)
        if len(b) > 2:
            kw["encoder_hidden_states"] = b[2]
        out = self.m(x, t, **kw).sample
        return F.mse_loss(out, x.flip(-1))


class DDPM(nn.Module):
    """One DDPM training step: timesteps and noise drawn with torch inside the forward,
    ``scheduler.add_noise``, MSE against the noise (``pred`` 'epsilon') or the velocity."""

    def __init__(self, m: nn.Module, pred: str = "epsilon", cond: bool = False, vae: nn.Module | None = None) -> None:
        super().__init__()
        self.m, self.cond = m, cond
        self.sched = diffusers.DDPMScheduler(num_train_timesteps=1000, prediction_type=pred, beta_schedule="squaredcos_cap_v2")
        self.vae = vae
        if vae is not None:
            vae.requires_grad_(False)

    def forward(self, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x = b[0]
        if self.vae is not None:  # latent diffusion: a frozen VAE's sampled latents
            with torch.no_grad():
                x = self.vae.encode(x).latent_dist.sample() * 0.18215
        t = torch.randint(0, self.sched.config.num_train_timesteps, (x.shape[0],))
        noise = torch.randn_like(x)
        noisy = self.sched.add_noise(x, noise, t)
        kw = {"encoder_hidden_states": b[1]} if self.cond else {}
        pred = self.m(noisy, t, **kw).sample
        target = noise if self.sched.config.prediction_type == "epsilon" else self.sched.get_velocity(x, noise, t)
        return F.mse_loss(pred, target)


class VAELoss(nn.Module):
    """Encode, sample the posterior (torch.randn inside diffusers), decode; L2 + KL."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        post = self.m.encode(x).latent_dist
        z = post.sample()
        rec = self.m.decode(z).sample
        return F.mse_loss(rec, x) + 1e-3 * post.kl().mean()


class T2D(nn.Module):
    """Transformer2DModel / DiT / SD3 / Flux called on a batch dict; loss on the sample."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        out = self.m(**b).sample
        if out.dtype.is_floating_point:
            return out.float().pow(2).mean() + (out.float() * torch.linspace(-1, 1, out.shape[-1])).mean()
        raise TypeError(out.dtype)


def _t2d_cont() -> nn.Module:
    return T2D(diffusers.Transformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=16, num_layers=2,
                                            dropout=0.1, cross_attention_dim=24, norm_num_groups=8))


def _t2d_discrete() -> nn.Module:
    return T2D(diffusers.Transformer2DModel(num_attention_heads=2, attention_head_dim=8, num_layers=2, sample_size=4,
                                            num_vector_embeds=9, num_embeds_ada_norm=100, norm_type="ada_norm",
                                            cross_attention_dim=24, dropout=0.1))


def _dit() -> nn.Module:
    return T2D(diffusers.DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=3,
                                               norm_num_groups=4, sample_size=8, patch_size=2, num_embeds_ada_norm=10))


def _sd3() -> nn.Module:
    return T2D(diffusers.SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
                                               num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=16,
                                               pooled_projection_dim=16, out_channels=4, pos_embed_max_size=8))


def _flux() -> nn.Module:
    return T2D(diffusers.FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=2, num_single_layers=2,
                                                attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                                pooled_projection_dim=16, axes_dims_rope=(4, 6, 6)))


def _gc(m: nn.Module) -> nn.Module:
    m.enable_gradient_checkpointing()
    return m


def _img(c: int, n: int, b: int = 2) -> Callable[[int], torch.Tensor]:
    return lambda s: torch.randn(b, c, n, n, generator=_gen(s))


def _unet_batch(c: int, n: int, text: bool) -> Callable[[int], tuple[torch.Tensor, ...]]:
    def f(s: int) -> tuple[torch.Tensor, ...]:
        g = _gen(s)
        x = torch.randn(2, c, n, n, generator=g)
        t = torch.randint(0, 1000, (2,), generator=g)
        return (x, t, torch.randn(2, 7, 24, generator=g)) if text else (x, t)
    return f


def _text(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    return torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 7, 24, generator=g)


def _ldm_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(s)
    return torch.randn(2, 3, 16, 16, generator=g), torch.randn(2, 7, 24, generator=g)


def _t2d_batch(kind: str) -> Callable[[int], dict[str, torch.Tensor]]:
    def f(s: int) -> dict[str, torch.Tensor]:
        g = _gen(s)
        if kind == "cont":
            return {"hidden_states": torch.randn(2, 16, 4, 4, generator=g), "encoder_hidden_states": torch.randn(2, 5, 24, generator=g)}
        if kind == "discrete":
            return {"hidden_states": torch.randint(0, 9, (2, 16), generator=g), "encoder_hidden_states": torch.randn(2, 5, 24, generator=g),
                    "timestep": torch.randint(0, 100, (), generator=g)}  # one step per batch, as VQ-diffusion's pipeline
        if kind == "dit":
            return {"hidden_states": torch.randn(2, 4, 8, 8, generator=g), "timestep": torch.randint(0, 1000, (2,), generator=g),
                    "class_labels": torch.randint(0, 10, (2,), generator=g)}
        if kind == "sd3":
            return {"hidden_states": torch.randn(2, 4, 8, 8, generator=g), "encoder_hidden_states": torch.randn(2, 5, 24, generator=g),
                    "pooled_projections": torch.randn(2, 16, generator=g), "timestep": torch.randint(0, 1000, (2,), generator=g)}
        if kind == "flux":
            ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij"), -1).reshape(16, 3)
            return {"hidden_states": torch.randn(2, 16, 8, generator=g), "encoder_hidden_states": torch.randn(2, 5, 24, generator=g),
                    "pooled_projections": torch.randn(2, 16, generator=g), "timestep": torch.rand(2, generator=g),
                    "img_ids": ids, "txt_ids": torch.zeros(5, 3)}
        raise KeyError(kind)
    return f


DIFFUSERS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any]]] = {
    "d_unet2d": (lambda: UNetLoss(unet2d()), _unet_batch(3, 16, False)),
    "d_unet2d_drop": (lambda: UNetLoss(unet2d(0.1)), _unet_batch(3, 16, False)),
    "d_unet_xattn": (lambda: UNetLoss(unet_cond(dropout=0.1)), _unet_batch(4, 8, True)),
    "d_unet_class": (lambda: UNetLoss(unet_cond(class_embed_type="timestep"), class_labels=torch.tensor([3, 700])), _unet_batch(4, 8, True)),
    "d_unet_gc": (lambda: UNetLoss(_gc(unet_cond())), _unet_batch(4, 8, True)),
    "d_t2d": (_t2d_cont, _t2d_batch("cont")),
    "d_t2d_vq": (_t2d_discrete, _t2d_batch("discrete")),
    "d_dit": (_dit, _t2d_batch("dit")),
    "d_sd3": (_sd3, _t2d_batch("sd3")),
    "d_flux": (_flux, _t2d_batch("flux")),
    "d_vae_kl": (lambda: VAELoss(vae()), _img(3, 16)),
    "d_ddpm": (lambda: DDPM(unet2d(0.1)), lambda s: (torch.randn(2, 3, 16, 16, generator=_gen(s)),)),
    "d_ddpm_v_cond": (lambda: DDPM(unet_cond(), pred="v_prediction", cond=True), _text),
    "d_ldm": (lambda: DDPM(unet_cond(), cond=True, vae=vae()), _ldm_batch),
}


# --- PEFT -------------------------------------------------------------------------------

V = 100
small = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, vocab_size=V, max_position_embeddings=64)


def llama() -> nn.Module:
    return tf.LlamaForCausalLM(tf.LlamaConfig(**small, num_key_value_heads=2))


def gpt2() -> nn.Module:
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=3, n_head=4, vocab_size=V, n_positions=64))


def bert_mlm() -> nn.Module:
    return tf.BertForMaskedLM(tf.BertConfig(**small))


def bert_cls() -> nn.Module:
    return tf.BertForSequenceClassification(tf.BertConfig(**small, num_labels=3))


class PLM(nn.Module):
    """A PEFT model and its loss: causal or masked LM on the ids, or 3-way classification."""

    def __init__(self, m: nn.Module, kind: str = "causal") -> None:
        super().__init__()
        self.m, self.kind = m, kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "cls":
            return self.m(input_ids=x, attention_mask=torch.ones_like(x), labels=x[:, 0] % 3).loss
        if self.kind == "mlm":
            labels = torch.where(x % 5 == 0, x, torch.full_like(x, -100))
            return self.m(input_ids=x, attention_mask=torch.ones_like(x), labels=labels).loss
        return self.m(input_ids=x, attention_mask=torch.ones_like(x), labels=x).loss


def _peft(base: nn.Module, cfg: Any) -> nn.Module:
    return peft.get_peft_model(base, cfg)


LL = ["q_proj", "v_proj"]
PEFT: dict[str, Callable[[], nn.Module]] = {
    "p_bert_lora_drop": lambda: PLM(_peft(bert_mlm(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.2)), "mlm"),
    "p_bert_cls_lora": lambda: PLM(_peft(bert_cls(), peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "key", "value", "dense"], lora_dropout=0.1)), "cls"),
    "p_gpt2_lora_drop": lambda: PLM(_peft(gpt2(), peft.LoraConfig(r=4, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True, lora_dropout=0.2))),
    "p_gpt2_dora": lambda: PLM(_peft(gpt2(), peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True, use_dora=True, lora_dropout=0.1))),
    "p_llama_dora_drop": lambda: PLM(_peft(llama(), peft.LoraConfig(r=4, target_modules="all-linear", use_dora=True, lora_dropout=0.1))),
    "p_llama_lokr": lambda: PLM(_peft(llama(), peft.LoKrConfig(r=4, target_modules=LL + ["down_proj"], rank_dropout=0.1, module_dropout=0.0))),
    "p_bert_loha": lambda: PLM(_peft(bert_mlm(), peft.LoHaConfig(r=4, target_modules=["intermediate.dense"], rank_dropout=0.1)), "mlm"),
    "p_bert_ia3": lambda: PLM(_peft(bert_mlm(), peft.IA3Config(target_modules=["key", "value", "output.dense"], feedforward_modules=["output.dense"])), "mlm"),
    "p_llama_vera": lambda: PLM(_peft(llama(), peft.VeraConfig(r=8, target_modules=LL, vera_dropout=0.1))),
    "p_llama_oft": lambda: PLM(_peft(llama(), peft.OFTConfig(r=0, oft_block_size=8, target_modules=LL, module_dropout=0.0))),
    "p_gpt2_prefix_proj": lambda: PLM(_peft(gpt2(), peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4, prefix_projection=True, encoder_hidden_size=16))),
    "p_llama_prompt": lambda: PLM(_peft(llama(), peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=5))),
    "p_gpt2_prompt": lambda: PLM(_peft(gpt2(), peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=5))),
    "p_bert_prompt": lambda: PLM(_peft(bert_cls(), peft.PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=5)), "cls"),
    "p_llama_ptune_lstm": lambda: PLM(_peft(llama(), peft.PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=4, encoder_hidden_size=16, encoder_reparameterization_type="LSTM", encoder_dropout=0.1))),
    "p_gpt2_ptune_mlp": lambda: PLM(_peft(gpt2(), peft.PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=4, encoder_hidden_size=16, encoder_dropout=0.1))),
}


def ids(s: int) -> torch.Tensor:
    return torch.randint(1, V, (2, 12), generator=_gen(s))


MODELS: dict[str, Callable[[], nn.Module]] = {k: f for k, (f, _) in DIFFUSERS.items()} | PEFT


def batch(name: str, model: nn.Module) -> Callable[[int], Any]:
    return DIFFUSERS[name][1] if name in DIFFUSERS else ids


def main() -> int:
    return run(MODELS, batch)


if __name__ == "__main__":
    sys.exit(main())
