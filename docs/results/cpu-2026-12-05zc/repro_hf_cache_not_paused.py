"""Repro: under transformers 5's Trainer the HF OffrecompCallback does not pause the
key/value cache (NOTE [Cache paused in training]) because it assumes the Trainer set
`model.config.use_cache = args.use_cache` (False). The Trainer only sets the TOP-LEVEL
config of the model it was BUILT with, so with TrainingArguments.use_cache=False (the
default, "no cache in training"):

  (a) T5 (T5ForConditionalGeneration): the decoder stack has its own deep-copied config with
      use_cache=True; every decoder layer is handed a cache in every training step;
  (b) Trainer(model_init=...): train() builds a fresh model whose config says use_cache=True;
      every GPT-2 layer is handed a cache in every training step.

offrecomp then warns "region ... is handed a Hugging Face key/value cache in training ...
set model.config.use_cache = False" although the user's config (a) already says False or
(b) was meant to be set by the Trainer. The Lightning callback (and the callback under an
older Trainer) pauses every module's config, so there the cache is not built. Gradients are
not affected (a plain Trainer builds the same cache); the cost is host time per layer call
growing with depth (the timing below), and a warning whose advice does not apply.

Run: cd REPO && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python docs/results/cpu-2026-12-05zc/repro_hf_cache_not_paused.py
Exits 1 while a layer is handed a cache in training under the callback with use_cache=False.
"""
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: its offrecomp
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch

torch.set_num_threads(1)
import transformers as tf

from offrecomp.integrations.transformers import OffrecompCallback

warnings.filterwarnings("ignore")
logging.getLogger("transformers").setLevel(logging.ERROR)
tf.utils.logging.disable_progress_bar()
tf.trainer_callback.PrinterCallback.on_log = lambda *a, **k: None
captured = []


class _H(logging.Handler):
    def emit(self, record):
        captured.append(record.getMessage())


logging.getLogger("offrecomp").addHandler(_H())


class DS(torch.utils.data.Dataset):
    def __init__(self, seq2seq):
        self.seq2seq = seq2seq

    def __len__(self):
        return 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(1, 100, (16,), generator=g)
        return {"input_ids": x, "labels": torch.randint(1, 100, (8,), generator=g) if self.seq2seq else x}


def t5(layers=2):
    torch.manual_seed(0)
    return tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=100, d_model=32, d_ff=64, d_kv=8, num_layers=layers,
                                                     num_decoder_layers=layers, num_heads=4, decoder_start_token_id=0,
                                                     pad_token_id=0, eos_token_id=1))


def gpt2():
    torch.manual_seed(0)
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32,
                                            bos_token_id=0, eos_token_id=0))


def count_cache_calls(layers):
    n = [0]

    def pre(mod, args, kwargs):
        if any(isinstance(v, tf.Cache) for v in list(args) + list(kwargs.values()) if v is not None):
            if mod.training and torch.is_grad_enabled():
                n[0] += 1

    hs = [layer.register_forward_pre_hook(pre, with_kwargs=True) for layer in layers]
    return n, hs


def run_t5(callback, layers=2, steps=4):
    model = t5(layers)
    n, hs = count_cache_calls(model.decoder.block)
    with tempfile.TemporaryDirectory() as tmp:
        args = tf.TrainingArguments(output_dir=tmp, max_steps=steps, per_device_train_batch_size=4, report_to="none",
                                    save_strategy="no", use_cpu=True, disable_tqdm=True, logging_steps=100)
        tr = tf.Trainer(model=model, args=args, train_dataset=DS(True), callbacks=[callback] if callback else [])
        t0 = time.perf_counter()
        tr.train()
        dt = time.perf_counter() - t0
    for h in hs:
        h.remove()
    return n[0], model, args, dt


def run_model_init(callback):
    holder = []

    def init(*a):
        m = gpt2()
        holder.append(m)
        return m

    with tempfile.TemporaryDirectory() as tmp:
        args = tf.TrainingArguments(output_dir=tmp, max_steps=3, per_device_train_batch_size=4, report_to="none",
                                    save_strategy="no", use_cpu=True, disable_tqdm=True, logging_steps=100)
        tr = tf.Trainer(model_init=init, args=args, train_dataset=DS(False), callbacks=[callback] if callback else [])
        n, hs = None, []

        class Hook(tf.TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kw):
                nonlocal n, hs
                n, hs = count_cache_calls(model.transformer.h)

        tr.add_callback(Hook())
        tr.train()
        for h in hs:
            h.remove()
        return n[0], tr.model


def main():
    print(f"transformers {tf.__version__}, torch {torch.__version__}")
    bad = False
    # (a) T5
    calls, model, args, _ = run_t5(OffrecompCallback(mode="recompute", min_bytes=0))
    print(f"(a) T5 + callback: TrainingArguments.use_cache={args.use_cache}, model.config.use_cache="
          f"{model.config.use_cache}, model.decoder.config.use_cache={model.decoder.config.use_cache}; "
          f"decoder layer calls handed a cache in training: {calls} (expected 0)")
    bad |= calls > 0
    # (b) model_init
    calls_b, model_b = run_model_init(OffrecompCallback(mode="recompute", min_bytes=0))
    print(f"(b) GPT-2 via model_init + callback: model.config.use_cache={model_b.config.use_cache}; "
          f"layer calls handed a cache in training: {calls_b} (expected 0)")
    bad |= calls_b > 0
    # (c) contrast: the same T5 under the Lightning callback (pauses every module's config)
    import lightning.pytorch as pl
    from offrecomp.integrations.lightning import OffrecompCallback as LCallback

    class LitT5(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = t5()

        def forward(self, ids, labels):
            return self.model(input_ids=ids, labels=labels).loss

        def training_step(self, batch, i):
            return self(*batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    for n_ in ("lightning", "lightning.pytorch"):
        logging.getLogger(n_).setLevel(logging.ERROR)
    lit = LitT5()
    n, hs = count_cache_calls(lit.model.decoder.block)
    g = torch.Generator().manual_seed(0)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randint(1, 100, (16, 16), generator=g),
                                                                    torch.randint(1, 100, (16, 8), generator=g)), batch_size=4)
    pl.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, callbacks=[LCallback(mode="recompute", min_bytes=0)]).fit(lit, dl)
    for h in hs:
        h.remove()
    print(f"(c) contrast, same T5 under the Lightning callback: decoder layer calls handed a cache in training: {n[0]}; "
          f"decoder.config.use_cache after fit: {lit.model.decoder.config.use_cache}")
    warned = [m for m in captured if "key/value cache in training" in m]
    print(f"offrecomp warning about a cache in training given: {bool(warned)}")
    if warned:
        print("   " + warned[0][:300])
    # cost: a deeper T5 under recompute, the cache built vs not built
    for flag in (True, False):
        model = t5(12)
        model.decoder.config.use_cache = flag
        n, hs = count_cache_calls(model.decoder.block)
        with tempfile.TemporaryDirectory() as tmp:
            args = tf.TrainingArguments(output_dir=tmp, max_steps=6, per_device_train_batch_size=4, report_to="none",
                                        save_strategy="no", use_cpu=True, disable_tqdm=True, logging_steps=100)
            cb = OffrecompCallback(mode="recompute", min_bytes=0)
            tr = tf.Trainer(model=model, args=args, train_dataset=DS(True), callbacks=[cb])
            tr.train()
        steps = cb.report().steps[2:]
        print(f"T5 12+12 layers, recompute, decoder.config.use_cache={flag}: cache calls {n[0]}, mean step "
              f"{sum(s.step_seconds for s in steps) / len(steps) * 1e3:.1f} ms (steps 2-5)")
        for h in hs:
            h.remove()
    print("DEFECT PRESENT" if bad else "ok")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
