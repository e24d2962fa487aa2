"""Sweep x harness: torch modes, tensor subclasses and global torch state around and
inside the training step. Each case is built fresh per run (seed 0), trained plainly
(twice: determinism), under torch.utils.checkpoint(use_reentrant=False) per block
(reference) and under the six zoo variants; gradients/buffers/params/loss/extras are
compared bitwise with plain, user counts compared with plain, the global torch state
after each step (default dtype, grad mode, deterministic flag, threads, matmul
precision, mkldnn, autocast, mode stacks, anomaly mode, the CPU RNG state) compared
with plain's, report peaks checked flat."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import os
import random
import signal
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[3]  # the repository root
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint as cp  # noqa: E402
from torch import nn  # noqa: E402

import offrecomp  # noqa: E402,F401
from tests.helpers import ZOO_VARIANTS, _bits, check_variant_report, variant_runtime  # noqa: E402

H = 16
LOGS: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        LOGS.append(f"{record.levelname} {record.name}: {record.getMessage()[:300]}")


logging.getLogger("offrecomp").addHandler(_Collect(logging.WARNING))
logging.getLogger("offrecomp").propagate = False
logging.captureWarnings(True)
logging.getLogger("py.warnings").addHandler(_Collect(logging.WARNING))
logging.getLogger("py.warnings").propagate = False
warnings.simplefilter("always")
warnings.filterwarnings("ignore", message="The PyTorch API of MaskedTensors")


def _gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + s)


def _loss(x: torch.Tensor) -> torch.Tensor:
    w = torch.arange(x.numel(), dtype=x.dtype).sin().view_as(x)
    return x.square().mean() + (x * w).mean()


class Block(nn.Module):
    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.fc1 = nn.Linear(H, 2 * H)
        self.act = nn.GELU()
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(2 * H, H)

    def inner(self, h: torch.Tensor) -> torch.Tensor:  # cases override
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(self.ln(x)))
        h = self.inner(h)
        return x + self.fc2(self.drop(h))


class Stack(nn.Module):
    """stem, blocks, loss. ``kw``: per-block keyword arguments (index -> dict);
    ``head``: turns the last activation into something ``_loss`` takes."""

    def __init__(self, blocks: list[nn.Module], kw: Callable[[int], dict] | None = None,
                 head: Callable[[Any], torch.Tensor] | None = None, stem: nn.Module | None = None) -> None:
        super().__init__()
        self.stem = stem if stem is not None else nn.Linear(H, H)
        self.blocks = nn.ModuleList(blocks)
        self.ckpt = False
        self.kw = kw
        self.head = head

    def forward(self, x: Any) -> torch.Tensor:
        x = self.stem(x)
        for i, b in enumerate(self.blocks):
            kw = self.kw(i) if self.kw else {}
            x = cp.checkpoint(b, x, use_reentrant=False, **kw) if self.ckpt else b(x, **kw)
        if self.head is not None:
            x = self.head(x)
        return _loss(x)


@dataclass
class Case:
    model: nn.Module
    counts: collections.Counter = field(default_factory=collections.Counter)
    before: Callable[[int, nn.Module], None] | None = None  # before each step's forward
    mid: Callable[[int, nn.Module], None] | None = None  # after forward, before backward
    after: Callable[[int, nn.Module], None] | None = None  # after backward (before snapshot)
    after_backward: Callable[[int, nn.Module], dict[str, torch.Tensor]] | None = None  # extras
    step_ctx: Callable[[int], Any] | None = None  # around forward and backward
    fwd_ctx: Callable[[int], Any] | None = None  # around the forward only
    bwd_ctx: Callable[[int], Any] | None = None  # around the backward only
    batch: Callable[[int], Any] = lambda s: torch.randn(4, 6, H, generator=_gen(s))
    to_plain: Callable[[Any], torch.Tensor] | None = None  # subclass grads/params to plain
    cleanup: Callable[[], None] | None = None
    opt: Callable[[nn.Module], Any] | None = None
    backward: Callable[[torch.Tensor], None] | None = None


def seed(s: int) -> None:
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)


BASE_THREADS = 1


def reset_globals() -> None:
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(BASE_THREADS)
    torch.set_float32_matmul_precision("highest")
    torch.backends.mkldnn.enabled = True
    torch.set_anomaly_enabled(False)
    torch.set_flush_denormal(False)


def gstate() -> dict[str, Any]:
    return {
        "dtype": str(torch.get_default_dtype()),
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
        "det": torch.are_deterministic_algorithms_enabled(),
        "threads": torch.get_num_threads(),
        "prec": torch.get_float32_matmul_precision(),
        "mkldnn": torch.backends.mkldnn.enabled,
        "autocast": (torch.is_autocast_enabled("cpu"), str(torch.get_autocast_dtype("cpu"))),
        "tf_stack": torch._C._len_torch_function_stack(),
        "disp_stack": torch._C._len_torch_dispatch_stack(),
        "anomaly": torch.is_anomaly_enabled(),
        "rng": hashlib.md5(torch.get_rng_state().numpy().tobytes()).hexdigest()[:8],
    }


def _plain(t: Any) -> Any:
    if t is None or not isinstance(t, torch.Tensor):
        return t
    if hasattr(t, "elem") and type(t) is not torch.Tensor:
        return _plain(t.elem)
    if t.is_nested:
        return t.values().detach().clone()
    if type(t) not in (torch.Tensor, nn.Parameter):
        with torch._C.DisableTorchFunctionSubclass():
            return t.detach().as_subclass(torch.Tensor).clone()
    return t.detach().clone()


def train(case: Case, ctx: Any = None, steps: int = 4) -> tuple[list[dict], list[dict], list[dict]]:
    model = case.model
    opt = case.opt(model) if case.opt else torch.optim.SGD(model.parameters(), lr=0.1)
    snaps: list[dict] = []
    counts: list[dict] = []
    states: list[dict] = []
    conv = case.to_plain or _plain
    try:
        with ctx if ctx is not None else contextlib.nullcontext():
            for step in range(steps):
                seed(10 * step)
                if case.before:
                    case.before(step, model)
                with case.step_ctx(step) if case.step_ctx else contextlib.nullcontext():
                    with case.fwd_ctx(step) if case.fwd_ctx else contextlib.nullcontext():
                        loss = model(case.batch(10 * step))
                    if case.mid:
                        case.mid(step, model)
                    with case.bwd_ctx(step) if case.bwd_ctx else contextlib.nullcontext():
                        if case.backward:
                            case.backward(loss)
                        else:
                            loss.backward()
                if case.after:
                    case.after(step, model)
                states.append(gstate())
                snap = {f"grad.{n}": conv(p.grad) for n, p in model.named_parameters() if p.grad is not None}
                snap.update({f"buf.{n}": conv(b) for n, b in model.named_buffers()})
                snap["loss"] = conv(loss)
                if case.after_backward:
                    snap.update(case.after_backward(step, model))
                counts.append(dict(case.counts))
                opt.step()
                opt.zero_grad(set_to_none=True)
                snap.update({f"param.{n}": conv(p) for n, p in model.named_parameters()})
                snaps.append(snap)
    finally:
        if case.cleanup:
            case.cleanup()
    return snaps, counts, states


def compare(ref: list[dict], got: list[dict]) -> list[str]:
    bad = []
    for step, (a, b) in enumerate(zip(ref, got)):
        if a.keys() != b.keys():
            bad.append(f"step {step}: keys differ {sorted(a.keys() ^ b.keys())[:6]}")
            continue
        for k in a:
            x, y = a[k], b[k]
            if x is None or y is None:
                if (x is None) != (y is None):
                    bad.append(f"step {step}: {k} None vs {type(y).__name__}")
                continue
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(_bits(x), _bits(y)):
                d = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else float("nan")
                bad.append(f"step {step}: {k} ({d:.3g})" + (f" dtype {x.dtype}->{y.dtype}" if x.dtype != y.dtype else ""))
    if len(ref) != len(got):
        bad.append(f"steps {len(ref)} vs {len(got)}")
    return bad


class Timeout(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise Timeout("hang: > 180 s")


signal.signal(signal.SIGALRM, _alarm)


def run_one(name: str, factory: Callable[[], Case], variant: str, ref, ref_counts, ref_states, budget) -> tuple[str, str]:
    reset_globals()
    seed(0)
    case = factory()
    LOGS.clear()
    signal.alarm(180)
    rt = None
    try:
        if variant == "ckpt":
            case.model.ckpt = True
            got, counts, states = train(case)
        else:
            rt = variant_runtime(case.model, variant, budget)
            got, counts, states = train(case, rt)
    except Exception as e:
        signal.alarm(0)
        tb = traceback.format_exc()
        after = gstate()
        reset_globals()
        return "ERROR", f"{type(e).__name__}: {str(e)[:400]}\n" + "\n".join(tb.splitlines()[-8:]) + f"\n    STATE after: {after}"
    finally:
        signal.alarm(0)
    notes = []
    bad = compare(ref, got)
    if bad:
        notes.append("NOT BITWISE: " + "; ".join(bad[:5]) + (f" (+{len(bad) - 5})" if len(bad) > 5 else ""))
    cdiff = []
    for step, (a, b) in enumerate(zip(ref_counts, counts)):
        for k in sorted(set(a) | set(b)):
            if a.get(k, 0) != b.get(k, 0):
                cdiff.append(f"s{step}:{k} {a.get(k, 0)}->{b.get(k, 0)}")
    if cdiff:
        notes.append("COUNTS: " + ", ".join(cdiff[-6:]))
    sdiff = []
    for step, (a, b) in enumerate(zip(ref_states, states)):
        for k in a:
            if a[k] != b[k]:
                sdiff.append(f"s{step}:{k} {a[k]}->{b[k]}")
    if sdiff:
        notes.append("STATE: " + ", ".join(sdiff[:6]))
    if rt is not None:
        recs = rt.report().steps
        try:
            check_variant_report(recs, variant, n_steps=len(ref))
        except AssertionError as e:
            notes.append(f"REPORT: {str(e)[:200]} phases={[s.phase for s in recs]}")
        if variant in ("keep", "recompute", "offload"):
            peaks = [(s.peak_activation_bytes, s.kept_bytes) for s in recs[1:]]
        else:
            peaks = [(s.peak_activation_bytes, s.kept_bytes) for s in recs[-2:]]
        if len(set(peaks)) > 1:
            notes.append(f"PEAKS VARY: {[(s.peak_activation_bytes, s.kept_bytes) for s in recs]}")
        with contextlib.suppress(Exception):
            rt.close()
    reset_globals()
    logs = sorted(set(LOGS))
    detail = "; ".join(notes)
    if logs:
        detail += ("\n" if detail else "") + "\n".join("    LOG " + line for line in logs)
    return ("FAIL" if notes else "PASS"), detail


def main(cases: dict[str, Callable[[], Case]]) -> None:
    argv = list(sys.argv[1:])
    only = argv[0].split(",") if argv and argv[0] not in ("", "all") else None
    variants = argv[1].split(",") if len(argv) > 1 else ["ckpt", *ZOO_VARIANTS]
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, factory in cases.items():
        if only and name not in only:
            continue
        reset_globals()
        seed(0)
        LOGS.clear()
        try:
            c = factory()
            ref, ref_counts, ref_states = train(c)
            reset_globals()
            seed(0)
            c2 = factory()
            ref2, _, ref_states2 = train(c2)
            det = "" if not compare(ref, ref2) and ref_states == ref_states2 else " (PLAIN NONDETERMINISTIC)"
        except Exception as e:
            reset_globals()
            print(f"PLAINERR {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            print("\n".join(traceback.format_exc().splitlines()[-6:]), flush=True)
            continue
        plain_logs = sorted(set(LOGS))
        reset_globals()
        # tight budget: half keep's step-0 peak, on a fresh build
        seed(0)
        probe = factory()
        try:
            krt = variant_runtime(probe.model, "keep")
            train(probe, krt, steps=1)
            budget = max(1, krt.report().steps[0].peak_activation_bytes // 2)
        except Exception as e:
            budget = None
            print(f"PROBEERR {name}: {type(e).__name__}: {e}")
        reset_globals()
        print(f"== {name}{det} plain counts(last step)={ref_counts[-1]} state(last)={ref_states[-1]}", flush=True)
        for line in plain_logs:
            print(f"    PLAINLOG {line}")
        for v in variants:
            t0 = time.time()
            status, detail = run_one(name, factory, v, ref, ref_counts, ref_states, budget)
            tally[v][status] += 1
            print(f"{status:5s} {name:24s} {v:10s} {time.time() - t0:5.1f}s {detail}", flush=True)
    print("TALLY " + "  ".join(f"{v}: {dict(c)}" for v, c in tally.items()))
