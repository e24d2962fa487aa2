"""Sweep: PyTorch Lightning + offrecomp.integrations.lightning.OffrecompCallback.

Every case runs plain twice (determinism), then with the callback under mode keep,
recompute, offload and auto (budget = half of keep's highest peak), all min_bytes=0.
Compared bitwise against plain: per-optimizer-step gradients (captured in
on_before_optimizer_step, i.e. before clipping), final parameters and buffers, each
training_step's output loss, logged callback_metrics (val/test), predict outputs. Also:
no saved-tensor hook / instance `forward` / module hook left on the LightningModule
relative to plain, one report record per optimizer step, passes = micro-batches.

Module: tiny residual MLP-transformer-ish net, nn.ModuleList of 3 blocks (Linear 32->64,
GELU, Dropout 0.1, Linear 64->32, LayerNorm), batch 4 x 8 tokens x 32, SGD/AdamW.

Cases:
  accum2            accumulate_grad_batches=2, 4 steps
  clip_norm         gradient_clip_val=0.01 (norm), accumulate 2
  clip_value        gradient_clip_val=0.001, gradient_clip_algorithm="value"
  bf16_mixed        precision="bf16-mixed" on CPU
  gan_manual        manual optimization, generator + discriminator (2 optimizers),
                    self.manual_backward, toggle_optimizer, 4 batches
  val_every2        val_check_interval=2, limit_val_batches=2, num_sanity_val_steps=2, 6 steps
  lr_sched          AdamW + StepLR(step_size=2, interval "step") in configure_optimizers
  resume_new_cb     fit 3 steps, save_checkpoint; new module + new Trainer + NEW callback:
                    fit(ckpt_path=...) to 6 steps
  resume_same_cb    as resume_new_cb with the SAME callback instance in both Trainers
  refit_same_trainer  trainer.fit() then trainer.fit() again on the same Trainer with
                    max_steps raised (Lightning continues from global_step)
  eval_after_fit    fit 4 steps, then trainer.validate / test / predict with the callback
                    attached; metrics and predictions compared
  dict_output       training_step returns {"loss": ..., "aux": detached tensor}
  limit_train       limit_train_batches=3, max_epochs=2
  early_stop        EarlyStopping(val_loss, patience=0, min_delta=10) checked at
                    val_check_interval=2 within an epoch of 8 batches: stops mid-epoch
  overfit           overfit_batches=2, max_steps=4
  hf_gpt2           GPT-2 (HF, use_cache=False config) inside a LightningModule, accumulate 2
  cb_raises         another Callback raises in on_train_batch_end at batch 2
  swa               StochasticWeightAveraging(swa_lrs=1e-2, swa_epoch_start=1) (deep-copies the
                    module inside fit), limit_train_batches=2, max_epochs=3
  ckpt_callback     ModelCheckpoint(every_n_train_steps=2, save_top_k=-1) writing inside fit
  lr_find           Tuner(trainer).lr_find(num_training=6) with the callback attached (a fit-like run
                    that restores the module), then fit 4 steps on the same Trainer
  validate_first    trainer.validate() before fit with the callback attached, then fit, accumulate 2
  realistic         AdamW + cosine OneCycle per step + accumulate 2 + clip 0.5 + val every 2, 8 steps

Run:
  cd REPO && OMP_NUM_THREADS=1 timeout 300 .venv/bin/python -u docs/results/cpu-2026-12-05zc/sweep_lightning.py CASE [CASE...] > docs/results/cpu-2026-12-05zc/out_lightning_X.txt 2>&1
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
import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from offrecomp.integrations.lightning import OffrecompCallback  # noqa: E402

warnings.filterwarnings("ignore")
logging.basicConfig(level=logging.WARNING, format="LOG %(name)s: %(message)s")
for name in ("lightning", "lightning.pytorch", "lightning.fabric", "transformers"):
    logging.getLogger(name).setLevel(logging.ERROR)

W = 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(W, 2 * W), nn.Linear(2 * W, W)
        self.drop, self.norm = nn.Dropout(0.1), nn.LayerNorm(W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.drop(self.fc2(nn.functional.gelu(self.fc1(x)))))


class Net(pl.LightningModule):
    def __init__(self, opt: str = "sgd", sched: str | None = None, dict_out: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(16, W)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(W, 1)
        self.opt, self.sched, self.dict_out = opt, sched, dict_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = nn.functional.mse_loss(self(x).float(), y)
        self.log("train_loss", loss)
        if self.dict_out:
            return {"loss": loss, "aux": loss.detach() * 2}
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x).float(), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x).float(), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        if self.opt == "adamw":
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.1)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        if self.sched == "step":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 2, 0.5),
                                                         "interval": "step"}}
        if self.sched == "onecycle":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.OneCycleLR(
                opt, max_lr=1e-2, total_steps=20), "interval": "step"}}
        return opt


class GAN(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.gen = nn.Sequential(nn.Linear(8, W), *[Block() for _ in range(2)], nn.Linear(W, 16))
        self.disc = nn.Sequential(nn.Linear(16, W), *[Block() for _ in range(2)], nn.Linear(W, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.gen(z)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(x.shape[0], x.shape[1], 8, device=x.device)
        bce = nn.functional.binary_cross_entropy_with_logits
        # generator
        self.toggle_optimizer(opt_g)
        fake = self(z)
        g_loss = bce(self.disc(fake), torch.ones(x.shape[0], x.shape[1], 1))
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)
        # discriminator
        self.toggle_optimizer(opt_d)
        real = bce(self.disc(x), torch.ones(x.shape[0], x.shape[1], 1))
        fake_l = bce(self.disc(self(z).detach()), torch.zeros(x.shape[0], x.shape[1], 1))
        d_loss = (real + fake_l) / 2
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss})

    def configure_optimizers(self) -> Any:
        return [torch.optim.Adam(self.gen.parameters(), lr=1e-3), torch.optim.Adam(self.disc.parameters(), lr=1e-3)]


class HFNet(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        import transformers as tf

        torch.manual_seed(0)
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0,
                            eos_token_id=0, use_cache=False)
        self.model = tf.GPT2LMHeadModel(cfg)

    def forward(self, ids: torch.Tensor) -> Any:
        return self.model(input_ids=ids, labels=ids).loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Capture(pl.Callback):
    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []
        self.passes: list[int] = []
        self.outputs: list[Any] = []
        self._batches = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # noqa: ANN001
        self._batches += 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):  # noqa: ANN001
        self.grads.append(common.grads_of(pl_module))
        self.passes.append(self._batches)
        self._batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
        if isinstance(outputs, dict):
            self.outputs.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in outputs.items()})
        else:
            self.outputs.append(outputs.detach().clone() if torch.is_tensor(outputs) else outputs)


class Raiser(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
        if batch_idx == 2:
            raise RuntimeError("boom in on_train_batch_end")


def loader(n: int = 32, shuffle: bool = True, seed: int = 0, ids: bool = False) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    if ids:
        data = torch.utils.data.TensorDataset(torch.randint(0, 100, (n, 16), generator=g))
    else:
        data = torch.utils.data.TensorDataset(torch.randn(n, 8, 16, generator=g), torch.randn(n, 8, 1, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=4, shuffle=shuffle, generator=torch.Generator().manual_seed(seed))


def trainer(callbacks: list[Any], **kw: Any) -> pl.Trainer:
    base = dict(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                num_sanity_val_steps=0)
    base.update(kw)
    return pl.Trainer(callbacks=callbacks, **base)


def metrics(tr: pl.Trainer) -> dict[str, Any]:
    return {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in tr.callback_metrics.items()
            if not k.startswith("offrecomp/")}


def finish(module: nn.Module, caps: list[Capture], cbs: list[Any], **extra: Any) -> dict[str, Any]:
    params, buffers = common.state_of(module)
    r: dict[str, Any] = {"grads": [g for c in caps for g in c.grads], "params": params, "buffers": buffers,
                         "losses": [o for c in caps for o in c.outputs], "extra": extra,
                         "leftover": common.leftover_signature(module)}
    if cbs:
        seen: list[Any] = []
        steps: list[Any] = []
        for cb in cbs:
            if any(cb is s for s in seen):
                continue
            seen.append(cb)
            steps += list(cb.report().steps)
            if cb.runtime is not None and cb.runtime.active:
                r.setdefault("notes", []).append("runtime still active after fit")
        r["report"] = steps
        r["expect_steps"] = len(r["grads"])
        r["expect_passes"] = [p for c in caps for p in c.passes]
    return r


def simple(kw: dict[str, Any] | None, *, module: Any = None, tl: Any = None, vl: Any = None,
           extra_cbs: tuple = (), **tkw: Any) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    m = module() if callable(module) else Net()
    cap = Capture()
    cbs = [] if kw is None else [OffrecompCallback(**kw)]
    tr = trainer([cap, *extra_cbs, *cbs], **tkw)
    err = None
    try:
        tr.fit(m, tl or loader(), vl)
    except RuntimeError as exc:
        err = f"{type(exc).__name__}: {exc}"
    r = finish(m, [cap], cbs, metrics=metrics(tr), global_step=tr.global_step)
    if not m.automatic_optimization:
        r["expect_passes"] = [1] * len(r["grads"])  # manual optimization: each optimizer step after one backward
    if err:
        r["error"] = err
    return r


CASES: dict[str, Any] = {}


def case(fn: Any) -> Any:
    CASES[fn.__name__] = fn
    return fn


@case
def accum2(kw):  # noqa: ANN001
    return simple(kw, accumulate_grad_batches=2)


@case
def clip_norm(kw):  # noqa: ANN001
    return simple(kw, accumulate_grad_batches=2, gradient_clip_val=0.01)


@case
def clip_value(kw):  # noqa: ANN001
    return simple(kw, gradient_clip_val=0.001, gradient_clip_algorithm="value")


@case
def bf16_mixed(kw):  # noqa: ANN001
    return simple(kw, precision="bf16-mixed")


@case
def gan_manual(kw):  # noqa: ANN001
    return simple(kw, module=GAN, max_steps=8)  # 2 optimizer steps per batch: 4 batches


@case
def val_every2(kw):  # noqa: ANN001
    return simple(kw, vl=loader(8, shuffle=False, seed=1), val_check_interval=2, limit_val_batches=2,
                  num_sanity_val_steps=2, max_steps=6)


@case
def lr_sched(kw):  # noqa: ANN001
    return simple(kw, module=lambda: Net(opt="adamw", sched="step"), max_steps=6)


def _resume(kw: dict[str, Any] | None, same: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        pl.seed_everything(0, verbose=False)
        m1 = Net(opt="adamw")
        cap1 = Capture()
        cb1 = [] if kw is None else [OffrecompCallback(**kw)]
        t1 = trainer([cap1, *cb1], max_steps=3)
        t1.fit(m1, loader())
        path = os.path.join(tmp, "a.ckpt")
        t1.save_checkpoint(path)
        lo1 = common.leftover_signature(m1)
        pl.seed_everything(1, verbose=False)
        m2 = Net(opt="adamw")
        cap2 = Capture()
        cb2 = [] if kw is None else (cb1 if same else [OffrecompCallback(**kw)])
        t2 = trainer([cap2, *cb2], max_steps=6)
        t2.fit(m2, loader(), ckpt_path=path)
        r = finish(m2, [cap1, cap2], cb1 + cb2, m1_left=str(lo1 == common.leftover_signature(Net())))
        return r


@case
def resume_new_cb(kw):  # noqa: ANN001
    return _resume(kw, same=False)


@case
def resume_same_cb(kw):  # noqa: ANN001
    return _resume(kw, same=True)


@case
def refit_same_trainer(kw):  # noqa: ANN001
    pl.seed_everything(0, verbose=False)
    m = Net()
    cap = Capture()
    cbs = [] if kw is None else [OffrecompCallback(**kw)]
    tr = trainer([cap, *cbs], max_steps=3)
    tr.fit(m, loader())
    tr.fit_loop.epoch_loop.max_steps = 6
    tr.fit(m, loader())
    return finish(m, [cap], cbs, global_step=tr.global_step)


@case
def eval_after_fit(kw):  # noqa: ANN001
    pl.seed_everything(0, verbose=False)
    m = Net()
    cap = Capture()
    cbs = [] if kw is None else [OffrecompCallback(**kw)]
    tr = trainer([cap, *cbs], max_steps=4)
    tr.fit(m, loader())
    val = tr.validate(m, loader(8, shuffle=False, seed=1), verbose=False)
    test = tr.test(m, loader(8, shuffle=False, seed=2), verbose=False)
    pred = tr.predict(m, loader(8, shuffle=False, seed=3))
    n_steps = len(cbs[0].report().steps) if cbs else None
    # and a forward/backward with grad outside fit: the runtime must not be in the way
    out = m(torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(5))).sum()
    out.backward()
    r = finish(m, [cap], cbs, val=val, test=test, pred=pred)
    if cbs and len(cbs[0].report().steps) != n_steps:
        r.setdefault("notes", []).append("a backward outside fit added a record")
    return r


@case
def dict_output(kw):  # noqa: ANN001
    return simple(kw, module=lambda: Net(dict_out=True), accumulate_grad_batches=2)


@case
def limit_train(kw):  # noqa: ANN001
    return simple(kw, limit_train_batches=3, max_epochs=2, max_steps=-1)


@case
def early_stop(kw):  # noqa: ANN001
    es = pl.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0, check_on_train_epoch_end=False)
    return simple(kw, vl=loader(8, shuffle=False, seed=1), extra_cbs=(es,), val_check_interval=2,
                  limit_val_batches=2, max_steps=-1, max_epochs=1)


@case
def overfit(kw):  # noqa: ANN001
    return simple(kw, overfit_batches=2, max_steps=4)


@case
def hf_gpt2(kw):  # noqa: ANN001
    return simple(kw, module=HFNet, tl=loader(16, ids=True), accumulate_grad_batches=2)


@case
def cb_raises(kw):  # noqa: ANN001
    return simple(kw, extra_cbs=(Raiser(),), max_steps=6)


@case
def swa(kw):  # noqa: ANN001
    return simple(kw, extra_cbs=(pl.callbacks.StochasticWeightAveraging(swa_lrs=1e-2, swa_epoch_start=1),),
                  limit_train_batches=2, max_epochs=3, max_steps=-1)


@case
def ckpt_callback(kw):  # noqa: ANN001
    with tempfile.TemporaryDirectory() as tmp:
        mc = pl.callbacks.ModelCheckpoint(dirpath=tmp, every_n_train_steps=2, save_top_k=-1)
        r = simple(kw, extra_cbs=(mc,), enable_checkpointing=True, max_steps=4)
        r["extra"]["files"] = sorted(os.listdir(tmp))
        return r


@case
def lr_find(kw):  # noqa: ANN001
    from lightning.pytorch.tuner import Tuner

    pl.seed_everything(0, verbose=False)
    m = Net(opt="adamw")
    cap = Capture()
    cbs = [] if kw is None else [OffrecompCallback(**kw)]
    with tempfile.TemporaryDirectory() as tmp:
        tr = trainer([cap, *cbs], max_steps=4, default_root_dir=tmp)
        res = Tuner(tr).lr_find(m, loader(), num_training=6, update_attr=False)
        sugg = res.suggestion() if res is not None else None
        tr.fit(m, loader())
    r = finish(m, [cap], cbs, lrs=list(res.results["lr"]) if res else None, losses_lr=list(res.results["loss"]) if res else None)
    r["info"] = {"suggestion": sugg}
    return r


@case
def validate_first(kw):  # noqa: ANN001
    pl.seed_everything(0, verbose=False)
    m = Net()
    cap = Capture()
    cbs = [] if kw is None else [OffrecompCallback(**kw)]
    tr = trainer([cap, *cbs], max_steps=4, accumulate_grad_batches=2)
    val = tr.validate(m, loader(8, shuffle=False, seed=1), verbose=False)
    tr.fit(m, loader())
    return finish(m, [cap], cbs, val=val, metrics=metrics(tr))


@case
def realistic(kw):  # noqa: ANN001
    return simple(kw, module=lambda: Net(opt="adamw", sched="onecycle"), vl=loader(8, shuffle=False, seed=1),
                  accumulate_grad_batches=2, gradient_clip_val=0.5, val_check_interval=2, limit_val_batches=2,
                  max_steps=8, tl=loader(64))


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    import lightning

    print(f"torch {torch.__version__} lightning {lightning.__version__}")
    allv = {}
    for n in names:
        allv[n] = common.run_case(f"lightning.{n}", CASES[n], expect_error=(n == "cb_raises"))
    print("\nSUMMARY")
    for n, v in allv.items():
        print(f"lightning.{n}: " + ", ".join(f"{m}={s.split(':')[0]}" for m, s in v.items()))


if __name__ == "__main__":
    main()
