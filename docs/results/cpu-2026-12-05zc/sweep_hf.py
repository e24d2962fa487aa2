"""Sweep: Hugging Face Trainer + offrecomp.integrations.transformers.OffrecompCallback.

Every case runs plain twice (determinism), then with the callback under mode keep,
recompute, offload and auto (budget = half of keep's highest peak), all min_bytes=0.
Compared bitwise against plain: per-optimizer-step gradients (captured in
on_pre_optimizer_step, i.e. after clipping), final parameters and buffers, the Trainer's
logged loss / grad_norm / learning_rate / eval_loss. Also: the same error as plain (if
any), no saved-tensor hook / instance `forward` / module hook left on the model relative
to plain, one report record per optimizer step with passes = micro-batches.

Cases (tiny models: 2 layers, hidden 32, vocab 100, seq 16; use_cpu=True, report_to none):
  accum2          GPT-2 (tied embeddings, dropout 0.1), gradient_accumulation_steps=2, 4 steps
  accum3_uneven   GPT-2, gradient_accumulation_steps=3, dataset of 13 (7 batches of 2, last of 1),
                  2 epochs: steps of 3,3,1 micro-batches per epoch
  max_grad_norm   GPT-2, max_grad_norm=0.01 (clipping active every step), accum 2
  bf16_cpu        GPT-2, bf16=True, use_cpu=True (CPU autocast bf16), accum 2
  grad_ckpt       GPT-2, gradient_checkpointing=True together with the callback (the callback
                  turns it off); plain = the same Trainer with checkpointing on. Extra: whether
                  checkpointing is on after training, and whether plain-with-ckpt equals
                  plain-without bitwise (printed)
  compile_false   GPT-2, torch_compile=False explicitly
  eval_steps      GPT-2, eval_strategy="steps", eval_steps=2, 6 steps (evaluation loop inside the run)
  eval_on_start   GPT-2, eval_on_start=True + eval_steps=2 + accum 2 (an evaluation before the first step)
  resume          GPT-2, save_steps=2 run of 4 steps, then a NEW Trainer (new model, new callback)
                  resume_from_checkpoint=checkpoint-2 to 4 steps; compared with the plain resume
  compute_loss    Trainer subclass with a custom compute_loss (CE by hand + 1e-3 * logits^2 aux)
  label_smooth    GPT-2, label_smoothing_factor=0.1
  group_by_length GPT-2, variable-length examples (5..16 tokens), train_sampling_strategy="group_by_length"
                  (transformers 5's name for group_by_length=True), DataCollatorWithPadding-style padding (labels -100), 6 steps
  llama_tied      Llama (tie_word_embeddings=True, GQA 4/2 heads), accum 2
  t5              T5ForConditionalGeneration (encoder-decoder), accum 2
  seqcls          BertForSequenceClassification (3 labels, dropout), accum 2
  cb_raises       GPT-2, another callback raises RuntimeError in on_step_end at global_step 2;
                  same error as plain, state at the error equal, no hooks left
  train_twice     GPT-2, trainer.train() twice on the same Trainer (3 steps each)
  two_trainers    GPT-2, Trainer A (callback A) then Trainer B (callback B) on the same model
  two_trainers_same_cb  as two_trainers but the same callback instance in both Trainers
  add_callback    GPT-2, trainer.add_callback(cb) after construction, accum 2, eval_steps=2
  cb_raises_then_train  as cb_raises, then the Raiser is removed and trainer.train() runs again
                  (a notebook re-run): state and leftovers after the second run
  neftune         GPT-2, neftune_noise_alpha=5 (the Trainer hooks the input embeddings during training)
  model_init      Trainer(model_init=...) (the Trainer builds the model in train()), train() twice
  ckpt_reentrant  gradient_checkpointing=True with gradient_checkpointing_kwargs={"use_reentrant": True}
  realistic       GPT-2, accum 2 + eval every 2 + max_grad_norm 0.5 + label smoothing +
                  cosine schedule with warmup + weight decay, 8 steps
  auto_long       GPT-2 accum 1, 10 steps (auto reaches planned steps)

Run (one case list at a time, each under ~3 min):
  cd REPO && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python -u docs/results/cpu-2026-12-05zc/sweep_hf.py CASE [CASE...] > docs/results/cpu-2026-12-05zc/out_hf_X.txt 2>&1
  (no CASE: all, too long for one run; see run_all.sh: cd REPO && bash docs/results/cpu-2026-12-05zc/run_all.sh)
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: its offrecomp
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py beside this file
import common  # noqa: E402
import torch  # noqa: E402
import transformers as tf  # noqa: E402

from offrecomp.integrations.transformers import OffrecompCallback  # noqa: E402

logging.getLogger("transformers").setLevel(logging.ERROR)
logging.basicConfig(level=logging.WARNING, format="LOG %(name)s: %(message)s")
import warnings  # noqa: E402

warnings.filterwarnings("ignore")
tf.utils.logging.disable_progress_bar()
tf.trainer_callback.PrinterCallback.on_log = lambda *a, **k: None  # keep the output readable

CKPT_ARG = ("activation_checkpointing" if "activation_checkpointing" in tf.TrainingArguments.__dataclass_fields__
            else "gradient_checkpointing")
LOG_KEYS = ("loss", "grad_norm", "learning_rate", "eval_loss", "epoch", "step")


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, seq: int = 16, vary: bool = False, cls: bool = False, seq2seq: bool = False):
        self.n, self.seq, self.vary, self.cls, self.seq2seq = n, seq, vary, cls, seq2seq

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.n:
            raise IndexError(i)  # iteration (LengthGroupedSampler's `for f in dataset`) ends here
        g = torch.Generator().manual_seed(1000 + i)
        length = int(torch.randint(5, self.seq + 1, (1,), generator=g)) if self.vary else self.seq
        x = torch.randint(1, 100, (length,), generator=g)
        if self.cls:
            return {"input_ids": x, "labels": torch.tensor(i % 3)}
        if self.seq2seq:
            return {"input_ids": x, "labels": torch.randint(1, 100, (8,), generator=g)}
        if self.vary:
            return {"input_ids": x.tolist()}
        return {"input_ids": x, "labels": x.clone()}


def pad_collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    n = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), n, dtype=torch.long)
    mask = torch.zeros(len(features), n, dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, : len(f["input_ids"])] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def make_model(kind: str = "gpt2") -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32,
                            bos_token_id=0, eos_token_id=0, pad_token_id=0)
        return tf.GPT2LMHeadModel(cfg)
    if kind == "llama":
        cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=100, max_position_embeddings=64,
                             tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return tf.LlamaForCausalLM(cfg)
    if kind == "t5":
        cfg = tf.T5Config(vocab_size=100, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2,
                          num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        return tf.T5ForConditionalGeneration(cfg)
    if kind == "bert":
        cfg = tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=64, num_labels=3)
        return tf.BertForSequenceClassification(cfg)
    raise ValueError(kind)


class Capture(tf.TrainerCallback):
    """Grads at each optimizer step, micro-batches per step."""

    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []
        self.passes: list[int] = []
        self._sub = 0

    def on_substep_end(self, args, state, control, **kw):  # noqa: ANN001
        self._sub += 1

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):  # noqa: ANN001
        self.grads.append(common.grads_of(model))
        self.passes.append(self._sub + 1)
        self._sub = 0


class Raiser(tf.TrainerCallback):
    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
        if state.global_step == 2:
            raise RuntimeError("boom in on_step_end")


class CustomLossTrainer(tf.Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001
        labels = inputs.pop("labels")
        out = model(**inputs)
        logits = out.logits[:, :-1].float()
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        loss = ce + 1e-3 * logits.pow(2).mean()
        return (loss, out) if return_outputs else loss


def targs(tmp: str, **kw: Any) -> tf.TrainingArguments:
    base = dict(output_dir=tmp, max_steps=4, per_device_train_batch_size=2, per_device_eval_batch_size=4,
                learning_rate=1e-3, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                seed=0, data_seed=0, disable_tqdm=True, dataloader_num_workers=0)
    base.update(kw)
    return tf.TrainingArguments(**base)


def logs_of(trainer: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The comparable logged values, and notes about offrecomp/ keys."""
    out, notes = [], []
    for h in trainer.state.log_history:
        out.append({k: h[k] for k in LOG_KEYS if k in h})
    return out, notes


def finish(model: torch.nn.Module, trainers: list[Any], caps: list[Capture], cbs: list[Any], **extra: Any) -> dict[str, Any]:
    params, buffers = common.state_of(model)
    losses = []
    for t in trainers:
        losses += logs_of(t)[0]
    grads = [g for c in caps for g in c.grads]
    passes = [p for c in caps for p in c.passes]
    r: dict[str, Any] = {"grads": grads, "params": params, "buffers": buffers, "losses": losses,
                         "leftover": common.leftover_signature(model), "extra": extra}
    if cbs:
        seen: list[Any] = []
        steps: list[Any] = []
        for cb in cbs:
            if any(cb is s for s in seen):
                continue
            seen.append(cb)
            steps += list(cb.report().steps)
            if cb.runtime is not None and cb.runtime.active:
                r.setdefault("notes", []).append("runtime still active after training")
        r["report"] = steps
        r["expect_steps"] = len(grads)
        r["expect_passes"] = passes
        # offrecomp scalars in the training logs
        n_off = sum(1 for t in trainers for h in t.state.log_history if "offrecomp/peak_activation_bytes" in h)
        n_train = sum(1 for t in trainers for h in t.state.log_history if "loss" in h and "eval_loss" not in h)
        if n_off != n_train:
            r.setdefault("notes", []).append(f"offrecomp/ scalars in {n_off} of {n_train} training logs")
    return r


def simple(kw: dict[str, Any] | None, *, model_kind: str = "gpt2", ds: Any = None, eval_ds: Any = None,
           trainer_cls: Any = tf.Trainer, collator: Any = None, extra_cbs: tuple = (), add_late: bool = False,
           **args_kw: Any) -> dict[str, Any]:
    model = make_model(model_kind)
    cap = Capture()
    cbs = [] if kw is None else [OffrecompCallback(**kw)]
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_cls(model=model, args=targs(tmp, **args_kw), train_dataset=ds or Tokens(),
                              eval_dataset=eval_ds, data_collator=collator,
                              callbacks=[cap, *extra_cbs, *([] if add_late else cbs)])
        if add_late:
            for cb in cbs:
                trainer.add_callback(cb)
        err = None
        try:
            trainer.train()
        except RuntimeError as exc:
            err = f"{type(exc).__name__}: {exc}"
        r = finish(model, [trainer], [cap], cbs)
        r["info"] = {"checkpointing_on_after_train": bool(getattr(model, "is_gradient_checkpointing", False))}
        if err:
            r["error"] = err
        return r


CASES: dict[str, Any] = {}


def case(fn: Any) -> Any:
    CASES[fn.__name__] = fn
    return fn


@case
def accum2(kw):  # noqa: ANN001
    return simple(kw, gradient_accumulation_steps=2)


@case
def accum3_uneven(kw):  # noqa: ANN001
    return simple(kw, ds=Tokens(13), gradient_accumulation_steps=3, max_steps=-1, num_train_epochs=2)


@case
def max_grad_norm(kw):  # noqa: ANN001
    return simple(kw, gradient_accumulation_steps=2, max_grad_norm=0.01)


@case
def bf16_cpu(kw):  # noqa: ANN001
    return simple(kw, gradient_accumulation_steps=2, bf16=True)


@case
def grad_ckpt(kw):  # noqa: ANN001
    return simple(kw, gradient_accumulation_steps=2, **{CKPT_ARG: True})


@case
def compile_false(kw):  # noqa: ANN001
    return simple(kw, torch_compile=False)


@case
def eval_steps(kw):  # noqa: ANN001
    return simple(kw, eval_ds=Tokens(8), eval_strategy="steps", eval_steps=2, max_steps=6)


@case
def eval_on_start(kw):  # noqa: ANN001
    return simple(kw, eval_ds=Tokens(8), eval_strategy="steps", eval_steps=2, eval_on_start=True,
                  gradient_accumulation_steps=2)


@case
def resume(kw):  # noqa: ANN001
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model()
        cap = Capture()
        cb1 = [] if kw is None else [OffrecompCallback(**kw)]
        t1 = tf.Trainer(model=model, args=targs(tmp, save_strategy="steps", save_steps=2, max_steps=4),
                        train_dataset=Tokens(), callbacks=[cap, *cb1])
        t1.train()
        first = common.state_of(model)[0]
        lo1 = common.leftover_signature(model)
        model2 = make_model()
        cap2 = Capture()
        cb2 = [] if kw is None else [OffrecompCallback(**kw)]
        t2 = tf.Trainer(model=model2, args=targs(tmp, save_strategy="steps", save_steps=2, max_steps=4),
                        train_dataset=Tokens(), callbacks=[cap2, *cb2])
        t2.train(resume_from_checkpoint=os.path.join(tmp, "checkpoint-2"))
        r = finish(model2, [t1, t2], [cap, cap2], cb1 + cb2, first_run_params=first)
        if lo1 != common.leftover_signature(model):
            r.setdefault("notes", []).append("first model's leftovers changed")
        return r


@case
def compute_loss(kw):  # noqa: ANN001
    return simple(kw, trainer_cls=CustomLossTrainer, gradient_accumulation_steps=2)


@case
def label_smooth(kw):  # noqa: ANN001
    return simple(kw, label_smoothing_factor=0.1, gradient_accumulation_steps=2)


@case
def group_by_length(kw):  # noqa: ANN001
    return simple(kw, ds=Tokens(24, vary=True), collator=pad_collate, train_sampling_strategy="group_by_length", max_steps=6,
                  remove_unused_columns=False)


@case
def llama_tied(kw):  # noqa: ANN001
    return simple(kw, model_kind="llama", gradient_accumulation_steps=2)


@case
def t5(kw):  # noqa: ANN001
    return simple(kw, model_kind="t5", ds=Tokens(seq2seq=True), gradient_accumulation_steps=2)


@case
def seqcls(kw):  # noqa: ANN001
    return simple(kw, model_kind="bert", ds=Tokens(cls=True), gradient_accumulation_steps=2)


@case
def cb_raises(kw):  # noqa: ANN001
    return simple(kw, extra_cbs=(Raiser(),), max_steps=4)


@case
def train_twice(kw):  # noqa: ANN001
    model = make_model()
    cap = Capture()
    cbs = [] if kw is None else [OffrecompCallback(**kw)]
    with tempfile.TemporaryDirectory() as tmp:
        trainer = tf.Trainer(model=model, args=targs(tmp, max_steps=3), train_dataset=Tokens(), callbacks=[cap, *cbs])
        trainer.train()
        logs1 = logs_of(trainer)[0]
        trainer.train()
        r = finish(model, [trainer], [cap], cbs, logs1=logs1)
        return r


def _two(kw: dict[str, Any] | None, same: bool) -> dict[str, Any]:
    model = make_model()
    cap1, cap2 = Capture(), Capture()
    cb1 = [] if kw is None else [OffrecompCallback(**kw)]
    cb2 = [] if kw is None else (cb1 if same else [OffrecompCallback(**kw)])
    with tempfile.TemporaryDirectory() as tmp:
        t1 = tf.Trainer(model=model, args=targs(tmp, max_steps=3), train_dataset=Tokens(), callbacks=[cap1, *cb1])
        t1.train()
        t2 = tf.Trainer(model=model, args=targs(tmp, max_steps=3, learning_rate=5e-4), train_dataset=Tokens(),
                        callbacks=[cap2, *cb2])
        t2.train()
        return finish(model, [t1, t2], [cap1, cap2], cb1 + cb2)


@case
def two_trainers(kw):  # noqa: ANN001
    return _two(kw, same=False)


@case
def two_trainers_same_cb(kw):  # noqa: ANN001
    return _two(kw, same=True)


@case
def add_callback(kw):  # noqa: ANN001
    return simple(kw, add_late=True, gradient_accumulation_steps=2, eval_ds=Tokens(8), eval_strategy="steps", eval_steps=2)


@case
def cb_raises_then_train(kw):  # noqa: ANN001
    model = make_model()
    cap = Capture()
    cbs = [] if kw is None else [OffrecompCallback(**kw)]
    with tempfile.TemporaryDirectory() as tmp:
        trainer = tf.Trainer(model=model, args=targs(tmp, max_steps=4), train_dataset=Tokens(),
                             callbacks=[cap, Raiser(), *cbs])
        err = None
        try:
            trainer.train()
        except RuntimeError as exc:
            err = str(exc)
        trainer.remove_callback(Raiser)
        trainer.train()
        return finish(model, [trainer], [cap], cbs, first_error=err)


@case
def neftune(kw):  # noqa: ANN001
    return simple(kw, neftune_noise_alpha=5.0, gradient_accumulation_steps=2)


@case
def model_init(kw):  # noqa: ANN001
    cap = Capture()
    cbs = [] if kw is None else [OffrecompCallback(**kw)]
    with tempfile.TemporaryDirectory() as tmp:
        trainer = tf.Trainer(model_init=lambda *a: make_model(), args=targs(tmp, max_steps=3), train_dataset=Tokens(),
                             callbacks=[cap, *cbs])
        trainer.train()
        m1 = trainer.model
        p1 = common.state_of(m1)[0]
        lo1 = common.leftover_signature(m1)
        trainer.train()
        r = finish(trainer.model, [trainer], [cap], cbs, first_params=p1, same_model=trainer.model is m1)
        r["info"] = {"first_model_leftover_changed": lo1 != common.leftover_signature(m1)}
        return r


@case
def ckpt_reentrant(kw):  # noqa: ANN001
    return simple(kw, gradient_accumulation_steps=2, gradient_checkpointing_kwargs={"use_reentrant": True},
                  **{CKPT_ARG: True})


@case
def realistic(kw):  # noqa: ANN001
    return simple(kw, gradient_accumulation_steps=2, eval_ds=Tokens(8), eval_strategy="steps", eval_steps=2,
                  max_grad_norm=0.5, label_smoothing_factor=0.1, lr_scheduler_type="cosine", warmup_steps=2,
                  weight_decay=0.1, max_steps=8, ds=Tokens(40))


@case
def auto_long(kw):  # noqa: ANN001
    return simple(kw, max_steps=10, ds=Tokens(24))


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    print(f"torch {torch.__version__} transformers {tf.__version__} ckpt arg {CKPT_ARG}")
    allv = {}
    for n in names:
        allv[n] = common.run_case(f"hf.{n}", CASES[n], expect_error=(n == "cb_raises"))
        if n == "grad_ckpt":
            # is plain-with-checkpointing bitwise plain-without?
            a = CASES["grad_ckpt"](None)
            b = CASES["accum2"](None)
            print(f"  plain ckpt vs plain no-ckpt: {common.compare(a, b) or 'bitwise equal'}; ckpt on after plain run: {a['extra']}")
    print("\nSUMMARY")
    for n, v in allv.items():
        print(f"hf.{n}: " + ", ".join(f"{m}={'PASS' if s == 'PASS' else 'FAIL'}" if not (s.startswith('NON') or s.startswith('INV')) else f"{m}={s}" for m, s in v.items()))


if __name__ == "__main__":
    main()
