"""Repro: `OffrecompCallback.report()` is documented as "every step of every train()"
(docs/integrations.md, HF section) / "every step of every run so far" (ScopedCallback.report
docstring), but when the same callback serves a run on ANOTHER model object, the earlier
runs' records vanish: RunScope.enter (offrecomp/integrations/_common.py) replaces
self.runtime with a new runtime whenever `self.runtime.model is not model`, and report()
reads only the current runtime.

Three realistic ways to get there:
  (1) HF Trainer(model_init=...) and train() twice (what hyperparameter_search does): each
      train() builds a new model; 3 + 3 optimizer steps, report() holds 3;
  (2) the same HF callback instance given to two Trainers on two models;
  (3) Lightning: the same callback instance, fit of module A then fit(ckpt_path=...) of a
      new module B (resume).
Gradients and parameters are not affected (the sweeps check them bitwise); only the books.

Run: cd REPO && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python docs/results/cpu-2026-12-05zc/repro_report_drops_runs.py
Exits 1 while report() has fewer records than optimizer steps taken.
"""
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: its offrecomp
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch

torch.set_num_threads(1)
import lightning.pytorch as pl
import transformers as tf
from torch import nn

from offrecomp.integrations.lightning import OffrecompCallback as LCallback
from offrecomp.integrations.transformers import OffrecompCallback

warnings.filterwarnings("ignore")
for n in ("transformers", "lightning", "lightning.pytorch", "offrecomp"):
    logging.getLogger(n).setLevel(logging.ERROR)
tf.trainer_callback.PrinterCallback.on_log = lambda *a, **k: None


class DS(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        x = torch.randint(1, 100, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x}


def gpt2():
    torch.manual_seed(0)
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32,
                                            bos_token_id=0, eos_token_id=0, use_cache=False))


def args(tmp):
    return tf.TrainingArguments(output_dir=tmp, max_steps=3, per_device_train_batch_size=4, report_to="none",
                                save_strategy="no", use_cpu=True, disable_tqdm=True, logging_steps=100)


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x

    def training_step(self, batch, i):
        return self(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    bad = False
    with tempfile.TemporaryDirectory() as tmp:
        # (1) model_init, train twice
        cb = OffrecompCallback(mode="recompute", min_bytes=0)
        tr = tf.Trainer(model_init=lambda *a: gpt2(), args=args(tmp), train_dataset=DS(), callbacks=[cb])
        tr.train()
        after_first = len(cb.report().steps)
        tr.train()
        n = len(cb.report().steps)
        print(f"(1) HF model_init, train() twice (3+3 steps): report() records after 1st train {after_first}, "
              f"after 2nd {n} (docs: every step of every train(): expected 6)")
        bad |= n != 6
        # (2) one callback, two Trainers, two models
        cb = OffrecompCallback(mode="recompute", min_bytes=0)
        for _ in range(2):
            tf.Trainer(model=gpt2(), args=args(tmp), train_dataset=DS(), callbacks=[cb]).train()
        n = len(cb.report().steps)
        print(f"(2) HF one callback, two Trainers on two models (3+3 steps): report() records {n} (expected 6)")
        bad |= n != 6
        # (3) Lightning resume into a new module with the same callback
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4, 16)), batch_size=4)
        cb = LCallback(mode="recompute", min_bytes=0)
        pl.seed_everything(0, verbose=False)
        kw = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False)
        t1 = pl.Trainer(max_steps=3, callbacks=[cb], **kw)
        t1.fit(Net(), data)
        path = os.path.join(tmp, "a.ckpt")
        t1.save_checkpoint(path)
        pl.Trainer(max_steps=6, callbacks=[cb], **kw).fit(Net(), data, ckpt_path=path)
        n = len(cb.report().steps)
        print(f"(3) Lightning one callback, fit A (3 steps) then resume B to step 6 (3 steps): report() records {n} "
              f"(expected 6)")
        bad |= n != 6
    print("DEFECT PRESENT" if bad else "ok")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
