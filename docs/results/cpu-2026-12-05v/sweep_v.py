"""Speech/streaming sweep: OMP_NUM_THREADS=1 python sweep_v.py [NAMES|all] [VARIANTS] [-v]"""
from __future__ import annotations

import copy
from pathlib import Path
import logging
import random
import sys
import time
import traceback
import warnings

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import ZOO_VARIANTS, assert_bitwise, check_variant, variant_runtime
import models_v as M
import models_v2 as M2


class Grab(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.msgs: list[str] = []

    def emit(self, r: logging.LogRecord) -> None:
        self.msgs.append(f"{r.levelname} {r.name}: {r.getMessage()}")


GRAB = Grab()
logging.getLogger("offrecomp").addHandler(GRAB)

# ---------------------------------------------------------------- families (check_variant)
F_CASES = {
    "conformer_ctc_t": (lambda: M.ConformerCTC(), M.ctc_batch(), {}),
    "conformer_ctc_list": (lambda: M.ConformerCTC(lists=True), M.ctc_batch(), {}),
    "conformer_sinus": (lambda: M.ConformerCTC(sinus=True), M.ctc_batch(), {}),
    "conformer_varT": (lambda: M.ConformerCTC(), M.ctc_batch(varT=True), {}),
    "specaug_torch": (lambda: M.ConformerCTC(specaug="torch"), M.ctc_batch(), {}),
    "specaug_pyrand": (lambda: M.ConformerCTC(specaug="python"), M.ctc_batch(), {}),
    "specaug_input": (lambda: M.ConformerCTC(input_specaug=True), M.ctc_batch(), {}),
    "stream_attr": (lambda: M.Streamer("attr"), M.stream_batch, {}),
    "stream_attr_det": (lambda: M.Streamer("attr_detach"), M.stream_batch, {}),
    "stream_buffer": (lambda: M.Streamer("buffer"), M.stream_batch, {}),
    "stream_buf_persist": (lambda: M.Streamer("buffer_persist"), M.stream_batch, {}),
    "hubert_numpy": (M.Hubert, M.hubert_batch, {}),
    "tacotron": (M.Tacotron, M.taco_batch, {}),
    "tacotron_steps": (M.Tacotron, M.taco_batch, {"regions": [M.EncConv, M.DecoderStep]}),
    "xvector": (M.XVector, M.xvec_batch(), {}),
    "xvector_varT": (M.XVector, M.xvec_batch(varT=True), {}),
    "rnnt": (M.RNNT, M.rnnt_batch, {}),
    "rnnt_joint": (M.RNNT, M.rnnt_batch, {"regions": [M.EncBlock, M.Joint]}),
    "stream_buf_assign": (lambda: M2.Streamer2("buf_assign"), M.stream_batch, {}),
    "stream_argdict": (lambda: M2.Streamer2("argdict"), M.stream_batch, {}),
    "stream_partial": (lambda: M.Streamer("attr"), M2.stream_partial_batch, {}),
    "taco_attr": (M2.TacotronAttr, M.taco_batch, {"regions": [M.EncConv, M2.DecoderStepAttr]}),
    "ctc_head_t": (lambda: M2.CTCRegion(False), M2.ctc_varlen_batch, {"regions": [M.ConformerBlock, M2.CTCHead]}),
    "ctc_head_list": (lambda: M2.CTCRegion(True), M2.ctc_varlen_batch, {"regions": [M.ConformerBlock, M2.CTCHead]}),
    "rnnt_loss_region": (M2.RNNT2, M2.rnnt_varlen_batch, {"regions": [M.EncBlock, M2.RNNTLoss]}),
}
VARYING = {"conformer_varT", "xvector_varT"}


# ---------------------------------------------------------------- loops
def _seed(s: int) -> None:
    torch.manual_seed(s); random.seed(s); np.random.seed(s)


def grads(m: nn.Module) -> dict:
    return {f"g.{n}": p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


def w2v_step(m, opt, s):
    m.head.tau = max(2.0 * 0.7 ** s, 0.5)  # annealed between steps
    wav = torch.randn(3, 64, generator=M._gen(s))
    loss = m(wav)
    loss.backward()
    out = grads(m) | {"loss": loss.detach().clone()}
    opt.step(); opt.zero_grad(set_to_none=True)
    return out


def w2v_step_noanneal(m, opt, s):
    wav = torch.randn(3, 64, generator=M._gen(s))
    loss = m(wav)
    loss.backward()
    out = grads(m) | {"loss": loss.detach().clone(), "tau": torch.tensor(m.head.tau)}
    opt.step(); opt.zero_grad(set_to_none=True)
    return out


def specaug_loop_step(m, opt, s):
    b = M.ctc_batch()(s)
    x = b["x"].clone()
    for i in range(x.shape[0]):  # masks drawn in the loop: torch and Python RNG
        t0 = int(torch.randint(0, 20, ()).item()); x[i, t0:t0 + 3] = 0
        f0 = random.randint(0, 5); x[i, :, f0:f0 + 2] = 0
    b["x"] = x
    loss = m(b)
    loss.backward()
    out = grads(m) | {"loss": loss.detach().clone()}
    opt.step(); opt.zero_grad(set_to_none=True)
    return out


L_CASES = {
    "w2v_gumbel": (M.Wav2Vec2, w2v_step, {}),
    "w2v_gumbel_head": (M.Wav2Vec2, w2v_step, {"regions": [M.ConvFeat, M.TfBlock, M.W2VHead]}),
    "specaug_loop": (M.ConformerCTC, specaug_loop_step, {}),
    "w2v_tau_fwd": (M2.Wav2Vec2Anneal, w2v_step_noanneal, {"regions": [M.ConvFeat, M.TfBlock, M2.W2VHeadAnneal]}),
}


def run_loop(model, step, steps, rt=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    ctx = rt if rt is not None else torch.enable_grad()
    with ctx:
        for s in range(steps):
            _seed(s)
            snap = step(model, opt, s)
            snap |= {f"p.{n}": p.detach().clone() for n, p in model.named_parameters()}
            snap |= {f"b.{n}": b.detach().clone() for n, b in model.named_buffers()}
            out.append(snap)
    return out


def check_loop(factory, step, v, kw, steps=4):
    torch.manual_seed(0)
    model = factory().train()
    ref = run_loop(copy.deepcopy(model), step, steps)
    ref2 = run_loop(copy.deepcopy(model), step, steps)
    assert_bitwise(ref, ref2)  # plain determinism
    budget = None
    if v in ("auto_tight", "auto_serve"):
        probe = copy.deepcopy(model)
        keep = variant_runtime(probe, "keep", **kw)
        run_loop(probe, step, 1, keep)
        budget = max(r.peak_activation_bytes for r in keep.report().steps) // 2
    m = copy.deepcopy(model)
    rt = variant_runtime(m, v, budget, **kw)
    assert_bitwise(ref, run_loop(m, step, steps, rt))
    recs = rt.report().steps
    if v == "recompute":
        assert any(r.replays > 0 for r in recs), "recompute replayed nothing"
    if v.startswith("auto"):
        ph = [r.phase for r in recs]
        assert ph[0] == "measure" and ph[-1] in ("planned", "borrowed", "calibrate"), ph
    if v in ("auto_tight", "auto_serve"):
        assert any(r.recomputed_bytes > 0 for r in recs[len(recs) // 2:]), "tight budget dropped nothing"
    return rt


def summary(rt) -> str:
    recs = rt.report().steps
    return f"recs={len(recs)} replays={sum(r.replays for r in recs)} phases={''.join(r.phase[0] for r in recs)} regions={len(rt.regions)}"


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "-v"]
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ZOO_VARIANTS
    failed = 0
    names = [("F", n) for n in F_CASES] + [("L", n) for n in L_CASES]
    for kind, name in names:
        if only and name not in only:
            continue
        for v in variants:
            GRAB.msgs.clear()
            t0 = time.time()
            with warnings.catch_warnings(record=True) as ws:
                warnings.simplefilter("always")
                try:
                    if kind == "F":
                        fac, batch, kw = F_CASES[name]
                        torch.manual_seed(0)
                        rt, _ = check_variant(fac().train(), batch, v, steps=4, stable=name not in VARYING, **kw)
                    else:
                        fac, step, kw = L_CASES[name]
                        rt = check_loop(fac, step, v, kw)
                    print(f"PASS {kind} {name:18s} {v:10s} {time.time() - t0:5.1f}s {summary(rt)}", flush=True)
                except Exception as e:
                    failed += 1
                    print(f"FAIL {kind} {name:18s} {v:10s} {type(e).__name__}: {str(e)[:400]}", flush=True)
                    if "-v" in sys.argv:
                        traceback.print_exc(file=sys.stdout)
            seen = set()
            for msg in GRAB.msgs + [f"warnings.warn: {w.message}" for w in ws if "offrecomp" in w.filename]:
                if msg not in seen:
                    seen.add(msg)
                    print(f"    LOG {msg[:500]}", flush=True)
    print(f"{failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
