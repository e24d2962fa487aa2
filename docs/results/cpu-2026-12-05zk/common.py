"""Shared harness of the torch.compile sweeps (not run by itself).

A tiny causal LM (embedding, ModuleList of pre-LN transformer blocks with an attention
function attribute, head); the loss is computed outside the model so that it can be
compiled.  `run_one(base, cfg, variant)` trains a deep copy of `base` configured by `cfg`
(compile setup before the runtime / inside `with rt:` / at a step, compiled loss or
optimizer step, ...) for a few steps, plainly (variant None) or under one offrecomp variant,
and returns per-step snapshots (grads, params after the step, buffers, loss), the runtime,
and dynamo counters (graphs made, graph breaks, recompiles, backend compiles/runs).
`compare_case` runs plain twice (determinism), then every variant, and prints one
PASS/FAIL line per variant.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/sweep_compile/inductor_cache")
sys.path.insert(0, "/work/main")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import offrecomp  # noqa: E402
import offrecomp.diagnostics  # noqa: E402
from tests.helpers import assert_bitwise, variant_runtime  # noqa: E402

torch.set_num_threads(1)
VOCAB = 64


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def manual_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    t = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


class Attn(nn.Module):
    def __init__(self, h: int, heads: int, p: float) -> None:
        super().__init__()
        self.heads, self.p = heads, p
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.attn_fn: Callable[..., torch.Tensor] = manual_attn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        y = self.attn_fn(q, k, v)
        y = y.transpose(1, 2).reshape(b, t, h)
        return F.dropout(self.proj(y), self.p, self.training)


class Block(nn.Module):
    def __init__(self, h: int = 32, heads: int = 4, p: float = 0.1) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(h)
        self.attn = Attn(h, heads, p)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 2 * h)
        self.fc2 = nn.Linear(2 * h, h)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.p, self.training)


class LM(nn.Module):
    def __init__(self, layers: int = 2, h: int = 32, heads: int = 4, p: float = 0.1, bn: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, h)
        self.pos = nn.Embedding(64, h)
        self.blocks = nn.ModuleList(Block(h, heads, p) for _ in range(layers))
        self.ln = nn.LayerNorm(h)
        self.head = nn.Linear(h, VOCAB)
        # a running-statistics buffer, so buffers are compared too
        self.register_buffer("ema", torch.zeros(h))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.emb(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        if self.training:
            with torch.no_grad():
                self.ema.mul_(0.9).add_(x.detach().mean((0, 1)), alpha=0.1)
        return self.head(self.ln(x))


def base_model(**kw: Any) -> LM:
    torch.manual_seed(0)
    return LM(**kw)


def lm_loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())


def batch(step: int, lengths: list[int] | None = None) -> torch.Tensor:
    t = lengths[step % len(lengths)] if lengths else 16
    return torch.randint(0, VOCAB, (2, t), generator=torch.Generator().manual_seed(100 + step))


class Counting:
    """A torch.compile backend wrapping a named one: counts graphs made and runs."""

    def __init__(self, inner: str = "aot_eager") -> None:
        self.inner = inner
        self.made = self.runs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.made += 1
        compiled = torch._dynamo.lookup_backend(self.inner)(gm, example_inputs)

        def run(*args: Any) -> Any:
            self.runs += 1
            return compiled(*args)

        return run


@dataclass
class Cfg:
    """How one case sets the model up. Each callable gets the fresh deep copy ``m``."""

    name: str
    pre: Callable[[nn.Module], nn.Module] | None = None
    """Compile before the runtime is made; returns what the loop calls."""
    rt_on: str = "call"
    """The runtime gets 'call' (what the loop calls) or 'orig' (the uncompiled module)."""
    inside: Callable[[nn.Module, nn.Module], nn.Module] | None = None
    """Compile inside ``with rt:`` before step 0 (m, call) -> call."""
    at_step: tuple[int, Callable[[nn.Module, nn.Module], nn.Module]] | None = None
    """Compile inside ``with rt:`` right before step k."""
    after: Callable[[nn.Module, nn.Module], nn.Module] | None = None
    """Exit the runtime after `split` steps, apply this, and run the rest plainly (case 6)."""
    split: int = 2
    reenter: bool = False
    """With ``after``: enter the same runtime again after applying it."""
    loss: Callable[..., torch.Tensor] | None = None
    compile_opt: Any = None
    """None, or kwargs for torch.compile(opt.step, **kw)."""
    optimizer: str = "sgd"
    lengths: list[int] | None = None
    steps: int = 3
    model_kw: dict[str, Any] = field(default_factory=dict)
    rt_kw: dict[str, Any] = field(default_factory=dict)
    functorch_cfg: dict[str, Any] = field(default_factory=dict)


def _counts() -> dict[str, int]:
    c = torch._dynamo.utils.counters
    return {
        "graphs": c["stats"]["unique_graphs"],
        "breaks": sum(c["graph_break"].values()),
        "frames_ok": c["frames"]["ok"],
        "recompiles": sum(len(v) for v in torch._dynamo.utils.guard_failures.values()),
    }


def graph_break_reasons() -> list[str]:
    return sorted(torch._dynamo.utils.counters["graph_break"].keys())


def run_one(base: nn.Module, cfg: Cfg, variant: str | None, budget: int | None = None) -> tuple[list[dict[str, torch.Tensor]], Any, dict[str, int]]:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    m = copy.deepcopy(base).train()
    call: nn.Module = cfg.pre(m) if cfg.pre else m
    target = call if cfg.rt_on == "call" else m
    rt = variant_runtime(target, variant, budget, **cfg.rt_kw) if variant else None
    params = list(m.parameters())
    opt: torch.optim.Optimizer = (
        torch.optim.SGD(params, lr=0.1) if cfg.optimizer == "sgd" else torch.optim.Adam(params, lr=1e-2)
    )
    step_fn = torch.compile(opt.step, **cfg.compile_opt) if cfg.compile_opt is not None else opt.step
    loss_fn = cfg.loss or lm_loss
    out = []
    steps = cfg.steps
    with contextlib.ExitStack() as stack:
        fc = torch._functorch.config.patch(**cfg.functorch_cfg) if cfg.functorch_cfg else contextlib.nullcontext()
        stack.enter_context(fc)
        ctx = rt if rt is not None else contextlib.nullcontext()
        entered = contextlib.ExitStack()
        entered.enter_context(ctx)
        try:
            if cfg.inside:
                call = cfg.inside(m, call)
            for step in range(steps):
                if cfg.after is not None and step == cfg.split:
                    entered.close()  # exit the runtime
                    call = cfg.after(m, call)
                    if cfg.reenter:
                        entered = contextlib.ExitStack()
                        entered.enter_context(ctx)
                if cfg.at_step and step == cfg.at_step[0]:
                    call = cfg.at_step[1](m, call)
                torch.manual_seed(step)
                idx = batch(step, cfg.lengths)
                loss = loss_fn(call(idx), idx)
                loss.backward()
                snap = {f"grad.{n}": p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
                snap.update({f"buf.{n}": b.detach().clone() for n, b in m.named_buffers()})
                snap["loss"] = loss.detach().clone()
                step_fn()
                opt.zero_grad(set_to_none=True)
                snap.update({f"param.{n}": p.detach().clone() for n, p in m.named_parameters()})
                out.append(snap)
        finally:
            entered.close()
    return out, rt, _counts()


def step_summary(rt: Any) -> str:
    if rt is None:
        return ""
    steps = rt.report().steps
    return " ".join(
        f"[{s.phase[:4]} rep={s.replays} rec={s.recomputed_bytes} off={s.offloaded_bytes} pk={s.peak_activation_bytes}]"
        for s in steps
    )


class WarnCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.msgs: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.msgs.append(record.getMessage())


def compare_case(
    base: nn.Module,
    cfg: Cfg,
    variants: list[str],
    results: list[tuple[str, str, str]],
    check: Callable[[str, Any, dict[str, int], dict[str, int]], str | None] | None = None,
) -> None:
    """Plain twice, then each variant; PASS/FAIL per variant appended to ``results``."""
    t0 = time.time()
    try:
        ref, _, plain_counts = run_one(base, cfg, None)
        again, _, _ = run_one(base, cfg, None)
        assert_bitwise(ref, again)
    except Exception as e:
        print(f"PLAINFAIL {cfg.name}: {type(e).__name__}: {str(e)[:400]}", flush=True)
        traceback.print_exc()
        results.append((cfg.name, "plain", "PLAINFAIL"))
        return
    print(f"  plain {cfg.name}: counts {plain_counts} ({time.time() - t0:.1f}s)", flush=True)
    for v in variants:
        t1 = time.time()
        catcher = WarnCatcher()
        lg = logging.getLogger("offrecomp")
        lg.addHandler(catcher)
        offrecomp.diagnostics.clear_warnings()
        try:
            budget = None
            if v in ("auto_tight", "auto_serve"):
                _, krt, _ = run_one(base, cfg, "keep")
                budget = krt.report().steps[0].peak_activation_bytes // 2
            got, rt, counts = run_one(base, cfg, v, budget)
            assert_bitwise(ref, got)
            note = check(v, rt, counts, plain_counts) if check else None
            status = "PASS" if not note else "FLAG"
            msg = f"{status} {cfg.name:42s} {v:10s} {time.time() - t1:5.1f}s counts={counts}"
            if note:
                msg += f" NOTE: {note}"
            print(msg, flush=True)
            print(f"      {step_summary(rt)}", flush=True)
            results.append((cfg.name, v, status))
        except Exception as e:
            print(f"FAIL {cfg.name:42s} {v:10s} {type(e).__name__}: {str(e)[:600]}", flush=True)
            traceback.print_exc(limit=-6)
            results.append((cfg.name, v, "FAIL"))
        finally:
            lg.removeHandler(catcher)
            for w in dict.fromkeys(catcher.msgs):
                print(f"      warn: {w[:220]}", flush=True)


def default_check(v: str, rt: Any, counts: dict[str, int], plain: dict[str, int]) -> str | None:
    """Same graphs and breaks as plain (recompiles too)."""
    bad = []
    for k in ("graphs", "breaks", "recompiles"):
        if counts[k] != plain[k]:
            bad.append(f"{k} {counts[k]} vs plain {plain[k]}")
    return "; ".join(bad) or None


def summary(results: list[tuple[str, str, str]]) -> None:
    from collections import Counter

    print("\nSUMMARY")
    per: dict[str, Counter[str]] = {}
    for _, v, s in results:
        per.setdefault(v, Counter())[s] += 1
    for v, c in per.items():
        print(f"  {v:10s} " + " ".join(f"{k}={n}" for k, n in sorted(c.items())))
