"""Hugging Face architectures (and diffusers models, where installed) under every zoo
variant, gradients compared bitwise with plain training (tests/helpers.check_variant).

    python docs/results/cpu-2026-12-05/hf_zoo_sweep.py [NAME,NAME ...] [VARIANT,VARIANT ...]

Tiny configurations, 4 steps each, on the CPU; prints PASS/FAIL per model and variant.
The test suite runs a few of these (tests/offrecomp/test_hf_models.py); this sweep runs
the rest, the architectures a user may bring.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
import transformers as tf
from torch import nn

from sweep import run

logging.getLogger("transformers").setLevel(logging.ERROR)
V = 100
small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=V, max_position_embeddings=64)


class LM(nn.Module):
    """A model and the loss it is trained on, by ``kind``."""

    def __init__(self, m: nn.Module, kind: str = "causal") -> None:
        super().__init__()
        self.m = m
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kind
        if k in ("causal", "mlm"):
            return self.m(input_ids=x, labels=x).loss
        if k == "s2s":
            return self.m(input_ids=x, decoder_input_ids=x[:, :6], labels=x[:, 1:7].contiguous()).loss
        if k == "cls":
            return self.m(input_ids=x, labels=x[:, 0] % 3).loss
        if k == "img":
            return self.m(pixel_values=x, labels=torch.zeros(x.shape[0], dtype=torch.long)).loss
        if k == "hid":
            return self.m(pixel_values=x).last_hidden_state.float().pow(2).mean()
        if k == "seg":
            return self.m(pixel_values=x).logits.float().pow(2).mean()
        if k == "audio":
            return self.m(x).last_hidden_state.float().pow(2).mean()
        if k == "perceiver":
            return self.m(inputs=x, labels=x).loss
        if k == "whisper":
            ids = torch.arange(6).unsqueeze(0).expand(x.shape[0], 6)
            return self.m(input_features=x, decoder_input_ids=ids, labels=ids).loss
        if k == "clip":
            ids = torch.arange(8).unsqueeze(0).expand(x.shape[0], 8) % V
            return self.m(input_ids=ids, pixel_values=x, return_loss=True).loss
        o = self.m(x)
        return (o.last_hidden_state if hasattr(o, "last_hidden_state") else o[0]).float().pow(2).mean()


def Audio(m: nn.Module) -> LM:
    return LM(m, "audio")


def Whisper(m: nn.Module) -> LM:
    return LM(m, "whisper")


def Clip(m: nn.Module) -> LM:
    return LM(m, "clip")


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


BATCHES = {
    "img": lambda s: torch.randn(2, 3, 32, 32, generator=_gen(s)),
    "hid": lambda s: torch.randn(2, 3, 32, 32, generator=_gen(s)),
    "seg": lambda s: torch.randn(2, 3, 32, 32, generator=_gen(s)),
    "clip": lambda s: torch.randn(2, 3, 32, 32, generator=_gen(s)),
    "audio": lambda s: torch.randn(2, 1600, generator=_gen(s)),
    "whisper": lambda s: torch.randn(2, 16, 64, generator=_gen(s)),
}


def _ids(s: int) -> torch.Tensor:
    return torch.randint(0, V, (2, 12), generator=_gen(s))


def _ids16(s: int) -> torch.Tensor:  # the Reformer's axial positions take 16
    return torch.randint(0, V, (2, 16), generator=_gen(s))


ZOO = {
 "bert": lambda: LM(tf.BertForMaskedLM(tf.BertConfig(**small)), "mlm"),
 "roberta_cls": lambda: LM(tf.RobertaForSequenceClassification(tf.RobertaConfig(**{**small, "max_position_embeddings": 80, "num_labels": 3})), "cls"),
 "mistral": lambda: LM(tf.MistralForCausalLM(tf.MistralConfig(**small, num_key_value_heads=2, sliding_window=8))),
 "qwen2": lambda: LM(tf.Qwen2ForCausalLM(tf.Qwen2Config(**small, num_key_value_heads=2))),
 "phi": lambda: LM(tf.PhiForCausalLM(tf.PhiConfig(**small))),
 "gpt_neox": lambda: LM(tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**small))),
 "falcon": lambda: LM(tf.FalconForCausalLM(tf.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=V))),
 "opt": lambda: LM(tf.OPTForCausalLM(tf.OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, vocab_size=V, max_position_embeddings=64, word_embed_proj_dim=32))),
 "bart": lambda: LM(tf.BartForConditionalGeneration(tf.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, max_position_embeddings=64)), "s2s"),
 "gemma2": lambda: LM(tf.Gemma2ForCausalLM(tf.Gemma2Config(**small, num_key_value_heads=2, head_dim=8, sliding_window=8))),
 "deberta_v2": lambda: LM(tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(**small)), "mlm"),
 "vit": lambda: LM(tf.ViTForImageClassification(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8, num_labels=3)), "img"),
 "convnext": lambda: LM(tf.ConvNextForImageClassification(tf.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32, num_labels=3)), "img"),
 "swin": lambda: LM(tf.SwinForImageClassification(tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=3)), "img"),
 "mamba": lambda: LM(tf.MambaForCausalLM(tf.MambaConfig(hidden_size=32, num_hidden_layers=2, vocab_size=V, state_size=4))),
 "reformer": lambda: LM(tf.ReformerModelWithLMHead(tf.ReformerConfig(hidden_size=32, attention_head_size=8, num_attention_heads=4, feed_forward_size=64, vocab_size=V, axial_pos_shape=[4, 4], axial_pos_embds_dim=[16, 16], attn_layers=["local", "local"], is_decoder=True, max_position_embeddings=16, local_attn_chunk_length=4, num_hashes=1, hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0))),
 "xlnet": lambda: LM(tf.XLNetLMHeadModel(tf.XLNetConfig(d_model=32, n_layer=2, n_head=4, d_inner=64, vocab_size=V))),
 "rwkv": lambda: LM(tf.RwkvForCausalLM(tf.RwkvConfig(hidden_size=32, num_hidden_layers=2, vocab_size=V, attention_hidden_size=32, intermediate_size=64, context_length=64))),
 "albert": lambda: LM(tf.AlbertForMaskedLM(tf.AlbertConfig(**small, embedding_size=16)), "mlm"),
 "distilbert": lambda: LM(tf.DistilBertForMaskedLM(tf.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=V, max_position_embeddings=64)), "mlm"),
 "electra": lambda: LM(tf.ElectraForMaskedLM(tf.ElectraConfig(**small, embedding_size=16)), "mlm"),
 "longformer": lambda: LM(tf.LongformerForMaskedLM(tf.LongformerConfig(**{**small, "max_position_embeddings": 80}, attention_window=4)), "mlm"),
 "bigbird": lambda: LM(tf.BigBirdForMaskedLM(tf.BigBirdConfig(**small, attention_type="original_full")), "mlm"),
 "gptj": lambda: LM(tf.GPTJForCausalLM(tf.GPTJConfig(n_embd=32, n_layer=2, n_head=4, vocab_size=V, n_positions=64, rotary_dim=4))),
 "codegen": lambda: LM(tf.CodeGenForCausalLM(tf.CodeGenConfig(n_embd=32, n_layer=2, n_head=4, vocab_size=V, n_positions=64, rotary_dim=4))),
 "stablelm": lambda: LM(tf.StableLmForCausalLM(tf.StableLmConfig(**small, num_key_value_heads=2))),
 "starcoder2": lambda: LM(tf.Starcoder2ForCausalLM(tf.Starcoder2Config(**small, num_key_value_heads=2))),
 "olmo": lambda: LM(tf.OlmoForCausalLM(tf.OlmoConfig(**small))),
 "phi3": lambda: LM(tf.Phi3ForCausalLM(tf.Phi3Config(**small, pad_token_id=0))),
 "cohere": lambda: LM(tf.CohereForCausalLM(tf.CohereConfig(**small, num_key_value_heads=2))),
 "granite": lambda: LM(tf.GraniteForCausalLM(tf.GraniteConfig(**small))),
 "jamba": lambda: LM(tf.JambaForCausalLM(tf.JambaConfig(**small, num_key_value_heads=2, num_experts=2, expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=4, mamba_dt_rank=4, use_mamba_kernels=False))),
 "recurrent_gemma": lambda: LM(tf.RecurrentGemmaForCausalLM(tf.RecurrentGemmaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, intermediate_size=64, vocab_size=V, lru_width=32, attention_window_size=8, block_types=["recurrent", "attention"]))),
 "mpt": lambda: LM(tf.MptForCausalLM(tf.MptConfig(d_model=32, n_layers=2, n_heads=4, vocab_size=V, max_seq_len=64))),
 "wav2vec2": lambda: Audio(tf.Wav2Vec2Model(tf.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, layerdrop=0.0, mask_time_prob=0.0))),
 "whisper": lambda: Whisper(tf.WhisperForConditionalGeneration(tf.WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=32, max_target_positions=16, vocab_size=V, decoder_start_token_id=0, pad_token_id=0))),
 "clip": lambda: Clip(tf.CLIPModel(tf.CLIPConfig(text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=V, max_position_embeddings=16), vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8), projection_dim=16))),
"qwen3": lambda: LM(tf.Qwen3ForCausalLM(tf.Qwen3Config(**small, num_key_value_heads=2, head_dim=8))),
 "qwen3_moe": lambda: LM(tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**small, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16))),
 "deepseek_v3": lambda: LM(tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(**small, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=8, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, n_group=1, topk_group=1))),
 "gemma3": lambda: LM(tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**small, num_key_value_heads=2, head_dim=8, sliding_window=8))),
 "olmo2": lambda: LM(tf.Olmo2ForCausalLM(tf.Olmo2Config(**small))),
 "mamba2": lambda: LM(tf.Mamba2ForCausalLM(tf.Mamba2Config(hidden_size=32, num_hidden_layers=2, vocab_size=V, state_size=4, num_heads=4, head_dim=16, n_groups=1, expand=2, chunk_size=4))),
 "falcon_mamba": lambda: LM(tf.FalconMambaForCausalLM(tf.FalconMambaConfig(hidden_size=32, num_hidden_layers=2, vocab_size=V, state_size=4))),
 "modernbert": lambda: LM(tf.ModernBertForMaskedLM(tf.ModernBertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=V, max_position_embeddings=64, global_attn_every_n_layers=2, local_attention=8, reference_compile=False, pad_token_id=0)), "mlm"),
 "fnet": lambda: LM(tf.FNetForMaskedLM(tf.FNetConfig(hidden_size=32, num_hidden_layers=2, intermediate_size=64, vocab_size=V, max_position_embeddings=64, use_tpu_fourier_optimizations=False)), "mlm"),
 "funnel": lambda: LM(tf.FunnelForMaskedLM(tf.FunnelConfig(d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1], vocab_size=V)), "mlm"),
 "dinov2": lambda: LM(tf.Dinov2Model(tf.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8, mlp_ratio=2)), "hid"),
 "segformer": lambda: LM(tf.SegformerForSemanticSegmentation(tf.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2], decoder_hidden_size=32, strides=[4, 2], patch_sizes=[7, 3], mlp_ratios=[2, 2], num_labels=3)), "seg"),
 "resnet_hf": lambda: LM(tf.ResNetForImageClassification(tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=3)), "img"),
 "beit": lambda: LM(tf.BeitForImageClassification(tf.BeitConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8, num_labels=3, use_relative_position_bias=True)), "img"),
 "hubert": lambda: LM(tf.HubertModel(tf.HubertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, layerdrop=0.0, mask_time_prob=0.0)), "audio"),
 "perceiver": lambda: LM(tf.PerceiverForMaskedLM(tf.PerceiverConfig(num_latents=8, d_latents=32, d_model=32, num_blocks=1, num_self_attends_per_block=2, num_self_attention_heads=4, num_cross_attention_heads=4, vocab_size=V, max_position_embeddings=12, qk_channels=32, v_channels=32)), "perceiver"),
 "granitemoe": lambda: LM(tf.GraniteMoeForCausalLM(tf.GraniteMoeConfig(**small, num_local_experts=4, num_experts_per_tok=2))),
 "phimoe": lambda: LM(tf.PhimoeForCausalLM(tf.PhimoeConfig(**small, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2))),
 "zamba2": lambda: LM(tf.Zamba2ForCausalLM(tf.Zamba2Config(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, vocab_size=V, mamba_d_state=4, mamba_headdim=8, n_mamba_heads=8, layers_block_type=["mamba", "hybrid", "mamba"], num_mem_blocks=1, use_mem_rope=False, intermediate_size=64, attention_head_dim=8, max_position_embeddings=64, chunk_size=4))),}


def _diffusers() -> dict[str, tuple[object, object]]:
    try:
        import diffusers
    except ImportError:
        return {}
    logging.getLogger("diffusers").setLevel(logging.ERROR)

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = diffusers.UNet2DConditionModel(
                sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            ctx = x.flatten(1)[:, :256].reshape(2, 8, 32)
            return self.m(x, torch.tensor([10, 500]), encoder_hidden_states=ctx).sample.pow(2).mean()

    class VAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = diffusers.AutoencoderKL(
                in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), latent_channels=4,
                norm_num_groups=8, sample_size=16,
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.m(x, sample_posterior=False).sample.pow(2).mean()

    latents = lambda s: torch.randn(2, 4, 16, 16, generator=_gen(s))  # noqa: E731
    return {"diffusers_unet": (UNet, latents), "diffusers_vae": (VAE, lambda s: torch.randn(2, 3, 16, 16, generator=_gen(s)))}


def main() -> int:
    models = {name: (f, None) for name, f in ZOO.items()}
    models.update(_diffusers())

    def batch(name: str, model: nn.Module) -> object:
        given = models[name][1]
        return given or BATCHES.get(getattr(model, "kind", ""), _ids16 if name == "reformer" else _ids)

    # the Reformer's reversible layers save nothing to drop (NOTE [Regions with gradients off])
    return run(
        {name: f for name, (f, _) in models.items()}, batch,  # type: ignore[misc]
        skip=lambda name, v: name == "reformer" and v not in ("keep", "offload", "auto"),
    )


if __name__ == "__main__":
    raise SystemExit(main())
