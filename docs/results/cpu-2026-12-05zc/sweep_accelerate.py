"""Sweep: Accelerate loops with `with offrecomp.runtime(model, ...)` entered around the loop,
after `accelerator.prepare` (as docs/integrations.md#accelerate shows).

Every case runs plain (runtime not entered) twice, then under mode keep, recompute,
offload and auto (budget = half of keep's highest peak), min_bytes=0. Compared bitwise:
per-optimizer-step gradients (when accelerator.sync_gradients, before the step and after
any clipping), final parameters and buffers of the unwrapped model, per-micro-batch
losses. Also: no saved-tensor hook / instance `forward` (beyond accelerate's own, as in
plain) / module hook left, one record per real optimizer step with passes = micro-batches.

Model: GPT-2 (HF, tiny, tied embeddings, dropout) unless said; batch 2 x 16 tokens; AdamW.
Cases:
  accum2           Accelerator(gradient_accumulation_steps=2), accumulate(model), backward, 8 batches
  accum3_uneven    gradient_accumulation_steps=3 over 10 batches (the last step has 1 micro-batch:
                   accelerate syncs at the loader's end)
  clip             accum 2 + accelerator.clip_grad_norm_(params, 0.01) when sync_gradients
  bf16             Accelerator(mixed_precision="bf16") on CPU (prepare wraps model.forward in autocast)
  autocast         mixed_precision="bf16" + explicit `with accelerator.autocast():` around forward+loss
  unwrap           after the loop: unwrap_model(model) is the model; eval with the unwrapped model under
                   no_grad inside the loop every 2 steps
  unwrap_nofp32_inside  bf16; inside the runtime, after the loop, accelerator.unwrap_model(model,
                   keep_fp32_wrapper=False) (what save_model-style code does), then the `with` exits;
                   then one more forward/backward outside
  save_model_inside  bf16; accelerator.save_model(model, dir) inside the loop at step 2, training goes on
  llama            Llama (tie_word_embeddings, GQA) accum 2 + clip 1.0
  t5               T5 encoder-decoder accum 2
  scheduler        accum 2 + get_linear_schedule_with_warmup prepared by accelerator (scheduler.step each batch)

Run:
  cd REPO && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python -u docs/results/cpu-2026-12-05zc/sweep_accelerate.py CASE [CASE...] > docs/results/cpu-2026-12-05zc/out_accelerate.txt 2>&1
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: its offrecomp
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py beside this file
import common  # noqa: E402
import torch  # noqa: E402
import transformers as tf  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402

import offrecomp  # noqa: E402

warnings.filterwarnings("ignore")
logging.basicConfig(level=logging.WARNING, format="LOG %(name)s: %(message)s")
logging.getLogger("transformers").setLevel(logging.ERROR)
logging.getLogger("accelerate").setLevel(logging.ERROR)
tf.utils.logging.disable_progress_bar()


def make_model(kind: str = "gpt2") -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32,
                                                bos_token_id=0, eos_token_id=0, use_cache=False))
    if kind == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=100, max_position_embeddings=64, tie_word_embeddings=True, use_cache=False))
    if kind == "t5":
        return tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=100, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, use_cache=False))
    raise ValueError(kind)


def data(n: int, seq2seq: bool = False) -> list[dict[str, torch.Tensor]]:
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(100 + i)
        x = torch.randint(1, 100, (16,), generator=g)
        out.append({"input_ids": x, "labels": torch.randint(1, 100, (8,), generator=g) if seq2seq else x})
    return out


def run(kw: dict[str, Any] | None, *, kind: str = "gpt2", accum: int = 2, n: int = 16, mp: str = "no",
        clip: float | None = None, explicit_autocast: bool = False, eval_every: int = 0,
        unwrap_inside: bool = False, save_at: int | None = None, sched: bool = False) -> dict[str, Any]:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    acc = Accelerator(gradient_accumulation_steps=accum, mixed_precision=mp, cpu=True)
    model = make_model(kind)
    raw = model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(data(n, seq2seq=(kind == "t5")), batch_size=2, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    things = [model, opt, loader]
    if sched:
        things.append(tf.get_linear_schedule_with_warmup(opt, 2, 20))
    prepared = acc.prepare(*things)
    model, opt, loader = prepared[:3]
    scheduler = prepared[3] if sched else None
    torch.manual_seed(1)  # dropout stream, same in every run
    grads, passes, losses, evals = [], [], [], []
    count = 0
    notes = []
    rt = offrecomp.runtime(model, **kw) if kw is not None else None
    tmp = tempfile.TemporaryDirectory()
    try:
        if rt is not None:
            rt.__enter__()
        try:
            for i, batch in enumerate(loader):
                with acc.accumulate(model):
                    if explicit_autocast:
                        with acc.autocast():
                            loss = model(**batch).loss
                    else:
                        loss = model(**batch).loss
                    acc.backward(loss)
                    losses.append(loss.detach().clone())
                    count += 1
                    if acc.sync_gradients:
                        if clip is not None:
                            acc.clip_grad_norm_(model.parameters(), clip)
                        grads.append(common.grads_of(acc.unwrap_model(model)))
                        passes.append(count)
                        count = 0
                    opt.step()
                    if scheduler is not None:
                        scheduler.step()
                    opt.zero_grad()
                if eval_every and acc.sync_gradients and len(grads) % eval_every == 0:
                    with torch.no_grad():
                        evals.append(acc.unwrap_model(model)(**batch).loss.clone())
                if save_at is not None and acc.sync_gradients and len(grads) == save_at:
                    acc.save_model(model, tmp.name)
            if unwrap_inside:
                un = acc.unwrap_model(model, keep_fp32_wrapper=False)
                if un is not raw:
                    notes.append("unwrap_model returned another object")
        finally:
            if rt is not None:
                rt.__exit__(*sys.exc_info())
        leftover = common.leftover_signature(raw)
        if unwrap_inside:
            # one more step outside the runtime, on the unwrapped model
            out = raw(**next(iter(loader))).loss
            out.backward()
            grads.append(common.grads_of(raw))
    finally:
        tmp.cleanup()
    params, buffers = common.state_of(raw)
    r: dict[str, Any] = {"grads": grads, "params": params, "buffers": buffers, "losses": losses,
                         "extra": {"evals": evals, "unwrap_is_model": acc.unwrap_model(model) is raw},
                         "leftover": leftover, "notes": notes}
    if rt is not None:
        r["report"] = list(rt.report().steps)
        r["expect_steps"] = len(passes)
        r["expect_passes"] = passes
    return r


CASES = {
    "accum2": lambda kw: run(kw),
    "accum3_uneven": lambda kw: run(kw, accum=3, n=20),
    "clip": lambda kw: run(kw, clip=0.01),
    "bf16": lambda kw: run(kw, mp="bf16"),
    "autocast": lambda kw: run(kw, mp="bf16", explicit_autocast=True),
    "unwrap": lambda kw: run(kw, eval_every=2),
    "unwrap_nofp32_inside": lambda kw: run(kw, mp="bf16", unwrap_inside=True, n=8),
    "save_model_inside": lambda kw: run(kw, mp="bf16", save_at=2),
    "llama": lambda kw: run(kw, kind="llama", clip=1.0),
    "t5": lambda kw: run(kw, kind="t5"),
    "scheduler": lambda kw: run(kw, sched=True),
}


def main() -> None:
    import accelerate

    names = sys.argv[1:] or list(CASES)
    print(f"torch {torch.__version__} accelerate {accelerate.__version__} transformers {tf.__version__}")
    allv = {}
    for n in names:
        allv[n] = common.run_case(f"accelerate.{n}", CASES[n])
    print("\nSUMMARY")
    for n, v in allv.items():
        print(f"accelerate.{n}: " + ", ".join(f"{m}={s.split(':')[0]}" for m, s in v.items()))


if __name__ == "__main__":
    main()
