"""HF model sweep: mixed OFFLOAD/RECOMPUTE plans, serving from reloads, bitwise grads.

    python docs/results/cpu-2026-12-04/hf_serving_sweep.py MODEL [ATTNS] [PATTERNS]
        (MODEL a key of MODELS; results appended to res_MODEL.jsonl in $SWEEP_OUT, default .)
"""
from __future__ import annotations
import os, sys, json, copy, logging, traceback, warnings, time
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["OFFRECOMP_REPLAY_OP_US"] = "0"
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch
from torch import nn
torch.set_num_threads(1)
import transformers as tf
import offrecomp
from offrecomp import Plan, Placement, regenerate
from tests.helpers import train, twin, assert_bitwise

logging.getLogger("transformers").setLevel(logging.ERROR)
V = 100

class Cap(logging.Handler):
    def __init__(self): super().__init__(logging.WARNING); self.msgs = []
    def emit(self, r): self.msgs.append(f"{r.levelname}: {r.getMessage()}")
CAP = Cap(); logging.getLogger("offrecomp").addHandler(CAP)

def ids(seed, n=12):
    return torch.randint(0, V, (2, n), generator=torch.Generator().manual_seed(1000 + seed))

class CausalLM(nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, x): return s.m(input_ids=x, labels=x).loss
class MLM(nn.Module):  # encoder-only: masked-LM loss on all tokens
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, x): return s.m(input_ids=x, labels=x).loss
class Seq2Seq(nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, x): return s.m(input_ids=x, decoder_input_ids=x[:, :6], labels=x[:, 1:7].contiguous()).loss
class Vision(nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, x):
        px, lab = x
        return s.m(pixel_values=px, labels=lab).loss
class CLIPText(nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, x): return s.m(input_ids=x).last_hidden_state.pow(2).mean()
class Whisper(nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, x):
        feats, lab = x
        return s.m(input_features=feats, labels=lab).loss

def vis_batch(seed):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 3, (2,), generator=g)
def whisper_batch(seed):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(2, 16, 32, generator=g), torch.randint(0, V, (2, 6), generator=g)

NOD = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
def dec(cls_cfg, cls_model, **kw):
    return lambda attn: CausalLM(cls_model(cls_cfg(vocab_size=V, **kw, **({"attn_implementation": attn} if attn else {}))))

MODELS = {
 "gpt2": (lambda a: CausalLM(tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=V, n_positions=64, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, **_a(a)))), ids),
 "llama": (lambda a: CausalLM(tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=V, max_position_embeddings=64, **_a(a)))), ids),
 "mistral": (lambda a: CausalLM(tf.MistralForCausalLM(tf.MistralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=V, max_position_embeddings=64, **_a(a)))), ids),
 "qwen2": (lambda a: CausalLM(tf.Qwen2ForCausalLM(tf.Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=V, max_position_embeddings=64, **_a(a)))), ids),
 "gemma": (lambda a: CausalLM(tf.GemmaForCausalLM(tf.GemmaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64, vocab_size=V, max_position_embeddings=64, **_a(a)))), ids),
 "phi": (lambda a: CausalLM(tf.PhiForCausalLM(tf.PhiConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=V, max_position_embeddings=64, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, **_a(a)))), ids),
 "gpt_neox": (lambda a: CausalLM(tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=V, max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0, **_a(a)))), ids),
 "opt": (lambda a: CausalLM(tf.OPTForCausalLM(tf.OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32, vocab_size=V, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, **_a(a)))), ids),
 "bloom": (lambda a: CausalLM(tf.BloomForCausalLM(tf.BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=V, hidden_dropout=0.0, attention_dropout=0.0, **_a(a)))), ids),
 "bert": (lambda a: MLM(tf.BertForMaskedLM(tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=V, max_position_embeddings=64, **NOD, **_a(a)))), ids),
 "roberta": (lambda a: MLM(tf.RobertaForMaskedLM(tf.RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=V, max_position_embeddings=64, **NOD, **_a(a)))), ids),
 "t5": (lambda a: Seq2Seq(tf.T5ForConditionalGeneration(tf.T5Config(d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=8, vocab_size=V, dropout_rate=0.0, **_a(a)))), ids),
 "bart": (lambda a: Seq2Seq(tf.BartForConditionalGeneration(tf.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, **_a(a)))), ids),
 "vit": (lambda a: Vision(tf.ViTForImageClassification(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=4, num_labels=3, **NOD, **_a(a)))), vis_batch),
 "clip_text": (lambda a: CLIPText(tf.CLIPTextModel(tf.CLIPTextConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=V, max_position_embeddings=64, **_a(a)))), ids),
 "whisper": (lambda a: Whisper(tf.WhisperForConditionalGeneration(tf.WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, num_mel_bins=16, max_source_positions=16, max_target_positions=32, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, decoder_start_token_id=1, pad_token_id=0, **_a(a)))), whisper_batch),
}
VARIANTS = {"default": {}, "eager": {"attn_implementation": "eager"}, "nocache": {"use_cache": False}}
def _a(a): return dict(VARIANTS[a or "default"])

def acts_by_region(rt):
    """{(region, call): [storage indices of kind activation]} over all signatures."""
    out = {}
    for entry in rt.planner.entries.values():
        for key, st in entry.structures.items():
            idx = [i for i, s in enumerate(st.storage_records) if s.kind == "activation"]
            out.setdefault(key, set()).update(idx)
    return {k: sorted(v) for k, v in out.items()}

HEAVY = ("mm", "addmm", "bmm", "baddbmm", "scaled_dot_product", "convolution", "linear", "matmul")
def _cheap(rt):
    out = {}
    for entry in rt.planner.entries.values():
        for key, st in entry.structures.items():
            for i, s in enumerate(st.storage_records):
                if s.kind == "activation" and s.producer_op >= 0:
                    op = st.op_names[s.producer_op].split(".")[1]
                    if not any(h == op or op.startswith("_" + h) or op.startswith(h) for h in HEAVY):
                        out.setdefault(key, set()).add(i)
    return out

PATTERNS = {
    "alt-odd": lambda a: a[1::2],
    "alt-even": lambda a: a[0::2],
    "last2": lambda a: a[-2:],
}

def make_plan(rt, pattern):
    pl = {}
    if pattern == "cheap":
        for (region, ci), idx in _cheap(rt).items():
            for i in idx: pl[(region, ci, i)] = Placement.RECOMPUTE
        return Plan(placements=pl, default=Placement.OFFLOAD, plan_id="mix-cheap"), pl
    for (region, ci), acts in acts_by_region(rt).items():
        for i in PATTERNS[pattern](acts):
            pl[(region, ci, i)] = Placement.RECOMPUTE
    return Plan(placements=pl, default=Placement.OFFLOAD, plan_id="mix-" + pattern), pl

def st_op(rt, k):
    for entry in rt.planner.entries.values():
        st = entry.structures.get((k[0], k[1]))
        if st is not None and k[2] < len(st.storage_records):
            p = st.storage_records[k[2]].producer_op
            return st.op_names[p] if p >= 0 else "?"
    return "?"

def run_one(name, attn, pattern, no_reload_serving=False):
    factory, batch = MODELS[name]
    torch.manual_seed(0)
    model = factory(attn).train()
    r = twin(model)
    ref = train(r, batch, steps=1) + train(r, batch, steps=3)
    m = twin(model)
    CAP.msgs.clear()
    import offrecomp.diagnostics; offrecomp.diagnostics.clear_warnings()
    orig = regenerate._reload_due
    if no_reload_serving:
        regenerate._reload_due = lambda g: False
    try:
        with warnings.catch_warnings(record=True) as pyw:
            warnings.simplefilter("always")
            rt = offrecomp.runtime(m, mode="auto", min_bytes=0, d2h_gbps=5, h2d_gbps=5)
            got = train(m, batch, rt, steps=1)
            plan, pl = make_plan(rt, pattern)
            with rt:
                rt.set_plan(plan)
            got += train(m, batch, rt, steps=3)
    finally:
        regenerate._reload_due = orig
    res = dict(model=name, attn=attn or "default", dropped_ops=sorted({st_op(rt, k) for k in pl}), pattern=pattern + ("[no-reload-serving]" if no_reload_serving else ""),
               regions=sorted({f"{k[0]}" for k in acts_by_region(rt)}), dropped=len(pl),
               n_acts=sum(len(v) for v in acts_by_region(rt).values()))
    try:
        assert_bitwise(ref, got); res["bitwise"] = True
    except AssertionError as e:
        res["bitwise"] = False; res["diff"] = str(e)[:2000]
    res["steps"] = [dict(phase=s.phase, plan_id=s.plan_id, offloaded=s.offloaded_bytes, recomputed=s.recomputed_bytes,
                         kept=s.kept_bytes, replays=s.replays, served=s.served_ops, rerun=s.rerun_ops, backend=s.backend)
                    for s in rt.report().steps]
    res["warnings"] = list(dict.fromkeys(CAP.msgs)) + [f"py: {w.category.__name__}: {w.message}" for w in pyw if "offrecomp" in str(w.filename) or "offrecomp" in str(w.message)]
    return res

if __name__ == "__main__":
    name = sys.argv[1]; attns = sys.argv[2].split(",") if len(sys.argv) > 2 else ["default", "eager", "nocache"]
    pats = sys.argv[3].split(",") if len(sys.argv) > 3 else list(PATTERNS) + ["cheap"]
    outp = os.path.join(os.environ.get("SWEEP_OUT", "."), f"res_{name}.jsonl")
    with open(outp, "a") as f:
        for attn in attns:
            attn = "" if attn in ("", "default") else attn
            for i, pat in enumerate(pats + ["cheap!"]):
                ctl = pat.endswith("!")
                pat = pat.rstrip("!")
                t0 = time.time()
                try:
                    res = run_one(name, attn, pat, no_reload_serving=ctl)
                except Exception as e:
                    res = dict(model=name, attn=attn or "default", pattern=pat + ("[no-reload-serving]" if ctl else ""), error=traceback.format_exc())
                res["secs"] = round(time.time() - t0, 1)
                f.write(json.dumps(res) + "\n"); f.flush()
                up = [s for s in res.get("steps", []) if s["phase"] == "user-plan"]
                print(name, res["attn"], res["pattern"], "bitwise=", res.get("bitwise"), "ERR" if "error" in res else "",
                      [(s["offloaded"], s["replays"], s["served"], s["rerun"]) for s in up], res["secs"], "s", flush=True)
                if "error" in res: print(res["error"][-3000:], flush=True)
                if res.get("warnings"): print("  warnings:", res["warnings"][:5], flush=True)
