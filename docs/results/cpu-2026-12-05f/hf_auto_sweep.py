"""Hugging Face architectures built generically from transformers' auto mappings (those
not in ../cpu-2026-12-05/hf_zoo_sweep.py) under every zoo variant, gradients compared
bitwise with plain training (tests/helpers.check_variant).

    cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05f/hf_auto_sweep.py [NAME,NAME ...|all] [VARIANT,VARIANT ...] [-v] [--rescreen]

transformers 5.25.0, torch 2.13.0+cpu, Python 3.11, 4 steps each on the CPU.

Each model type of the causal-LM, masked-LM, seq2seq-LM, image-classification,
audio-classification, sequence-classification and image-backbone (hidden states) mappings (that order: a type's first
task) gets a tiny configuration: its config class instantiated with the small values of
``SMALL`` for the attributes its defaults have (sub-configurations likewise), the model
built from it, trained on ``labels=`` where its task takes them (else on the mean square
of the first output tensor). A screen trains each
plainly twice (4 steps) and leaves out those that fail, differ bitwise between the two
runs, have a non-finite loss, or take over a second (a variant then takes over ~3 s);
the screen is cached in /tmp/sweep5f/screen.json (``--rescreen`` redoes it) and its
reasons written to skipped.txt. Prints PASS/FAIL per model and variant. ``--bf16`` runs
every model's forward and loss under CPU bf16 autocast (screen and skip list
``*_bf16``; ../cpu-2026-12-05n).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-2026-12-05"))

import torch
import transformers as tf
from sweep import BF16Autocast, run
from torch import nn
from transformers.models.auto import modeling_auto as ma

from tests.helpers import _bits, train

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")
HERE = Path(__file__).resolve().parent
BF16 = "--bf16" in sys.argv  # every model's forward and loss under CPU bf16 autocast
sys.argv = [a for a in sys.argv if a != "--bf16"]
CACHE = Path("/tmp/sweep5f/screen_bf16.json" if BF16 else "/tmp/sweep5f/screen.json")
V = 100

# model types hf_zoo_sweep.py's ZOO already covers
ZOO_TYPES = {
    "bert", "roberta", "mistral", "qwen2", "phi", "gpt_neox", "falcon", "opt", "bart", "gemma2",
    "deberta-v2", "vit", "convnext", "swin", "mamba", "reformer", "xlnet", "rwkv", "albert",
    "distilbert", "electra", "longformer", "big_bird", "gptj", "codegen", "stablelm", "starcoder2",
    "olmo", "phi3", "cohere", "granite", "jamba", "recurrent_gemma", "mpt", "wav2vec2", "whisper",
    "clip", "qwen3", "qwen3_moe", "deepseek_v3", "gemma3", "gemma3_text", "olmo2", "mamba2",
    "falcon_mamba", "modernbert", "fnet", "funnel", "dinov2", "segformer", "resnet", "beit",
    "hubert", "perceiver", "granitemoe", "phimoe", "zamba2",
}

TASKS = [
    ("causal", ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
    ("mlm", ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
    ("s2s", ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES),
    ("img", ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES),
    ("audio", ma.MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES),
    ("cls", ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES),
    ("hid", ma.MODEL_FOR_IMAGE_MAPPING_NAMES),
]

SMALL: dict[str, Any] = dict(
    hidden_size=32, d_model=32, n_embd=32, dim=32, embed_dim=32, embedding_size=32, word_embed_proj_dim=32,
    num_hidden_layers=2, n_layer=2, num_layers=2, n_layers=2, encoder_layers=2, decoder_layers=2,
    num_decoder_layers=2, num_encoder_layers=2,
    num_attention_heads=4, n_head=4, n_heads=4, num_heads=4, encoder_attention_heads=4,
    decoder_attention_heads=4, num_key_value_heads=2, head_dim=8, d_kv=8, d_head=8,
    intermediate_size=64, ffn_dim=64, encoder_ffn_dim=64, decoder_ffn_dim=64, d_ff=64, d_inner=64,
    n_inner=64, hidden_dim=64, moe_intermediate_size=16, shared_expert_intermediate_size=16,
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    vocab_size=V, max_position_embeddings=64, n_positions=64, max_seq_len=64,
    image_size=32, patch_size=8, num_channels=3,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=0,
    layerdrop=0.0, mask_time_prob=0.0, mask_feature_prob=0.0, use_cache=False,
    conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=8,
    num_conv_pos_embedding_groups=4, tdnn_dim=(16, 16), tdnn_kernel=(3, 3), tdnn_dilation=(1, 2),
    xvector_output_dim=16, classifier_proj_size=16,
)


def _stages(default: Any) -> dict[str, Any]:
    """Hierarchical vision configs: one block per stage, stages as many as the defaults
    have, widths 8 per head of each stage's head count (16 per stage where none)."""
    depths = getattr(default, "depths", None)
    if not isinstance(depths, list) or not all(isinstance(d, int) for d in depths):
        return {}
    n = len(depths)
    kw: dict[str, Any] = {"depths": [1] * n}
    heads = getattr(default, "num_heads", getattr(default, "num_attention_heads", None))
    if isinstance(heads, list) and len(heads) == n:
        widths = [8 * h for h in heads]
    else:
        widths = [16 * (i + 1) for i in range(n)]
    for k in ("hidden_sizes", "embed_dims"):
        cur = getattr(default, k, None)
        if isinstance(cur, list) and len(cur) == n:
            kw[k] = widths
    if isinstance(getattr(default, "embed_dim", None), int):
        kw["embed_dim"] = widths[0]
    return kw


def tiny(cls: type, default: Any = None) -> Any:
    """``cls`` with ``SMALL``'s value for each attribute its defaults have."""
    default = default if default is not None else cls()
    stages = _stages(default)
    kw: dict[str, Any] = {}
    for k, v in SMALL.items():
        if not hasattr(default, k) or (stages and k in ("embed_dim", "num_heads", "num_attention_heads", "hidden_size")):
            continue
        if isinstance(v, tuple) or not isinstance(getattr(default, k), (list, tuple, dict)):
            kw[k] = v
    kw.update(stages)
    for attr in getattr(cls, "sub_configs", {}) or {}:
        sub = getattr(default, attr, None)
        if sub is not None and hasattr(sub, "to_dict"):
            kw[attr] = tiny(type(sub), sub)
    return cls(**kw)


class LM(nn.Module):
    """A model and the loss it is trained on, by ``kind``."""

    def __init__(self, m: nn.Module, kind: str) -> None:
        super().__init__()
        self.m = m
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kind
        if k in ("causal", "mlm"):
            o = self.m(input_ids=x, labels=x)
        elif k == "s2s":
            o = self.m(input_ids=x, decoder_input_ids=x[:, :6], labels=x[:, 1:7].contiguous())
        elif k == "cls":
            o = self.m(input_ids=x, labels=x[:, 0] % 2)
        elif k == "img":
            o = self.m(pixel_values=x, labels=torch.zeros(x.shape[0], dtype=torch.long))
        elif k == "hid":
            o = self.m(pixel_values=x)
        else:
            o = self.m(input_values=x, labels=torch.zeros(x.shape[0], dtype=torch.long))
        loss = getattr(o, "loss", None)
        if loss is None:  # the first output tensor's mean square (a sum diverges to NaN in 4 SGD steps)
            first = next(t for t in o.values() if isinstance(t, torch.Tensor)) if hasattr(o, "values") else o[0]
            loss = first.float().pow(2).mean()
        return loss


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


BATCHES = {
    "img": lambda s: torch.randn(2, 3, 32, 32, generator=_gen(s)),
    "hid": lambda s: torch.randn(2, 3, 32, 32, generator=_gen(s)),
    "audio": lambda s: torch.randn(2, 1600, generator=_gen(s)),
}


def _ids(s: int) -> torch.Tensor:
    return torch.randint(3, V, (2, 12), generator=_gen(s))


def candidates() -> dict[str, tuple[str, str]]:
    """model type -> (task, model class name): each type not in the zoo, its first task."""
    out: dict[str, tuple[str, str]] = {}
    for kind, mapping in TASKS:
        for mtype, cname in mapping.items():
            if mtype in ZOO_TYPES or mtype in out or not isinstance(cname, str):
                continue
            out[mtype] = (kind, cname)
    return out


def build(mtype: str, kind: str, cname: str) -> LM:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg = tiny(CONFIG_MAPPING[mtype])
    if kind in ("cls", "img", "audio"):
        cfg.num_labels = 2
    for c in [cfg, *(getattr(cfg, a) for a in (getattr(type(cfg), "sub_configs", {}) or {}))]:
        if hasattr(c, "use_cache"):
            c.use_cache = False
    lm = LM(getattr(tf, cname)(cfg), kind)
    return BF16Autocast(lm) if BF16 else lm



class _Timeout(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise _Timeout("over 20 s")


def screen(cands: dict[str, tuple[str, str]]) -> dict[str, str]:
    """model type -> '' where it trains plainly, deterministically and fast; else why not."""
    signal.signal(signal.SIGALRM, _alarm)
    out: dict[str, str] = {}
    for mtype, (kind, cname) in cands.items():
        signal.alarm(20)
        try:
            torch.manual_seed(0)
            model = build(mtype, kind, cname).train()
            n = sum(p.numel() for p in model.parameters())
            if n > 20_000_000:
                raise RuntimeError(f"tiny config still has {n / 1e6:.1f}M parameters")
            b = BATCHES.get(kind, _ids)
            t0 = time.time()
            a = train(copy.deepcopy(model), b, steps=4)
            dt = time.time() - t0
            c = train(copy.deepcopy(model), b, steps=4)
            if not all(math.isfinite(s["loss"].item()) for s in a):
                why = "non-finite loss plainly"
            elif not all(torch.equal(_bits(x[k]), _bits(y[k])) for x, y in zip(a, c) for k in x):
                why = "nondeterministic plainly (two plain runs differ bitwise)"
            elif not any(k.startswith("grad.") for k in a[0]):
                why = "no parameter gets a gradient"
            elif dt > 1.0:
                why = f"slow: 4 plain steps take {dt:.1f} s"
            else:
                why = ""
        except BaseException as e:  # any failure of a tiny config is a skip
            if isinstance(e, KeyboardInterrupt):
                raise
            why = f"fails plainly: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        finally:
            signal.alarm(0)
        out[mtype] = why
        print(f"screen {mtype:28s} {kind:6s} {cname:44s} {why or 'ok'}", file=sys.stderr, flush=True)
    return out


def main() -> int:
    cands = candidates()
    version = tf.__version__
    if "--rescreen" in sys.argv or not CACHE.exists() or json.loads(CACHE.read_text()).get("version") != version:
        result = screen(cands)
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_text(json.dumps({"version": version, "result": result}, indent=1))
        lines = [f"{m:28s} {cands[m][1]:44s} {why}" for m, why in sorted(result.items()) if why]
        (HERE / ("skipped_bf16.txt" if BF16 else "skipped.txt")).write_text(
            f"# transformers {version}: {len(lines)} of {len(result)} candidate model types skipped\n"
            + "\n".join(lines) + "\n"
        )
    result = json.loads(CACHE.read_text())["result"]
    sys.argv = [a for a in sys.argv if a != "--rescreen"]
    ok = {m: cands[m] for m in cands if result.get(m) == ""}
    models = {m: (lambda m=m, k=k, c=c: build(m, k, c)) for m, (k, c) in ok.items()}

    def batch(name: str, model: nn.Module) -> Any:
        return BATCHES.get(ok[name][0], _ids)

    return run(models, batch)


if __name__ == "__main__":
    raise SystemExit(main())
