"""Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/cases_modes.py all [CASES [VARIANTS]] \
    | grep -v '^USDT' > docs/results/cpu-2026-12-05x/out_modes.txt

Sweep x, part A: user modes around the step, the forward, the backward or inside the
blocks: FlopCounterMode, counting and result-rounding TorchDispatchModes, TorchFunctionModes,
torch.overrides, anomaly detection, the profilers and record_function ranges."""

from __future__ import annotations

import collections
import contextlib
from typing import Any

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py

from harness import Block, Case, H, Stack, main, nn, torch, F, _gen

from torch.overrides import TorchFunctionMode, handle_torch_function, has_torch_function
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten
MM = {aten.mm.default, aten.addmm.default, aten.bmm.default}


class CountMode(TorchDispatchMode):
    def __init__(self, counts: collections.Counter, key: str) -> None:
        super().__init__()
        self.counts, self.key = counts, key

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[self.key] += 1
        if func in MM:
            self.counts[self.key + ".mm"] += 1
        return func(*args, **(kwargs or {}))


class RoundMode(TorchDispatchMode):
    """Rounds every matmul output to bf16 precision (values stay fp32)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in MM:
            out = out.to(torch.bfloat16).to(torch.float32)
        return out


class ScaleGelu(TorchFunctionMode):
    """Multiplies F.gelu's result by 1.25 (a function mode that changes values)."""

    def __init__(self, counts: collections.Counter | None = None) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.counts is not None:
            self.counts["tf"] += 1
        out = func(*args, **kwargs)
        if func is F.gelu:
            out = out * 1.25
        return out


class CountFn(TorchFunctionMode):
    def __init__(self, counts: collections.Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.counts["tf"] += 1
        return func(*args, **(kwargs or {}))


def stack(blocks=None, n=3, **kw) -> Stack:
    return Stack(blocks if blocks is not None else [Block() for _ in range(n)], **kw)


# --- FlopCounterMode -------------------------------------------------------------

def _flop_case(where: str) -> Case:
    c = Case(stack())
    holder: list[FlopCounterMode] = []

    def ctx(step: int) -> Any:
        fc = FlopCounterMode(display=False)
        holder[:] = [fc]
        return fc

    def after(step: int, m: nn.Module) -> None:
        c.counts["flops"] = holder[0].get_total_flops()

    setattr(c, {"fwd": "fwd_ctx", "step": "step_ctx", "bwd": "bwd_ctx"}[where], ctx)
    c.after = after
    return c


def flop_fwd() -> Case:
    return _flop_case("fwd")


def flop_step() -> Case:
    return _flop_case("step")


def flop_bwd() -> Case:
    return _flop_case("bwd")


# --- counting dispatch mode -------------------------------------------------------

def _count_case(where: str) -> Case:
    c = Case(stack())
    setattr(c, {"fwd": "fwd_ctx", "step": "step_ctx", "bwd": "bwd_ctx"}[where], lambda s: CountMode(c.counts, "ops"))
    return c


def dcount_fwd() -> Case:
    return _count_case("fwd")


def dcount_step() -> Case:
    return _count_case("step")


def dcount_bwd() -> Case:
    return _count_case("bwd")


# --- rounding dispatch mode -------------------------------------------------------

def dround_fwd() -> Case:
    c = Case(stack())
    c.fwd_ctx = lambda s: RoundMode()
    return c


def dround_step() -> Case:
    c = Case(stack())
    c.step_ctx = lambda s: RoundMode()
    return c


def dround_bwd() -> Case:
    c = Case(stack())
    c.bwd_ctx = lambda s: RoundMode()
    return c


class RoundInside(Block):
    def forward(self, x):
        with RoundMode():
            return super().forward(x)


def dround_inside() -> Case:
    return Case(stack([RoundInside() for _ in range(3)]))


class RoundHalf(Block):
    """Only fc2 under the mode."""

    def forward(self, x):
        h = self.act(self.fc1(self.ln(x)))
        with RoundMode():
            y = self.fc2(self.drop(h))
        return x + y


def dround_half() -> Case:
    return Case(stack([RoundHalf() for _ in range(3)]))


# --- torch function modes ---------------------------------------------------------

def tfmode_fwd() -> Case:
    c = Case(stack())
    c.fwd_ctx = lambda s: ScaleGelu()
    return c


def tfmode_step() -> Case:
    c = Case(stack())
    c.step_ctx = lambda s: ScaleGelu()
    return c


def tfmode_bwd() -> Case:
    c = Case(stack())
    c.bwd_ctx = lambda s: ScaleGelu()
    return c


class GeluModeInside(Block):
    def forward(self, x):
        with ScaleGelu():
            return super().forward(x)


def tfmode_inside() -> Case:
    return Case(stack([GeluModeInside() for _ in range(3)]))


def tfcount_step() -> Case:
    c = Case(stack())
    c.step_ctx = lambda s: CountFn(c.counts)
    return c


# --- torch.overrides: a user function that dispatches through handle_torch_function

def soft_clip(x: torch.Tensor, limit: float = 2.0) -> torch.Tensor:
    if has_torch_function((x,)):
        return handle_torch_function(soft_clip, (x,), x, limit=limit)
    return limit * torch.tanh(x / limit)


class ClipTensor(torch.Tensor):
    """A __torch_function__ subclass that reroutes soft_clip to a sharper clip."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is soft_clip:
            x = args[0]
            with torch._C.DisableTorchFunctionSubclass():
                y = 0.5 * kwargs.get("limit", 2.0) * torch.tanh(2 * x / kwargs.get("limit", 2.0))
            return y.as_subclass(ClipTensor)
        return super().__torch_function__(func, types, args, kwargs)


class ClipBlock(Block):
    def inner(self, h):
        return soft_clip(h, limit=1.5)


class ToClip(nn.Linear):
    def forward(self, x):
        return super().forward(x).as_subclass(ClipTensor)


def overrides_handle() -> Case:
    c = Case(stack([ClipBlock() for _ in range(3)], stem=ToClip(H, H)))
    return c


class ClipMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is soft_clip:
            return torch.clamp(args[0], -1.0, 1.0)
        return func(*args, **kwargs)


def overrides_mode_fwd() -> Case:
    c = Case(stack([ClipBlock() for _ in range(3)]))
    c.fwd_ctx = lambda s: ClipMode()
    return c


# --- anomaly mode ------------------------------------------------------------------

def anomaly_step() -> Case:
    c = Case(stack())
    c.step_ctx = lambda s: torch.autograd.detect_anomaly(check_nan=True)
    return c


def anomaly_fwd() -> Case:
    c = Case(stack())
    c.fwd_ctx = lambda s: torch.autograd.detect_anomaly(check_nan=True)
    return c


def anomaly_global() -> Case:
    c = Case(stack())
    c.before = lambda s, m: torch.autograd.set_detect_anomaly(True, check_nan=True)
    c.cleanup = lambda: torch.autograd.set_detect_anomaly(False)
    return c


# --- profilers and record_function ---------------------------------------------------

class RFBlock(Block):
    def forward(self, x):
        with torch.autograd.profiler.record_function("blk.attn"):
            h = self.act(self.fc1(self.ln(x)))
        with torch.profiler.record_function("blk.out"):
            return x + self.fc2(self.drop(h))


class RFManual(Block):
    """record_function entered and exited by hand around the block's last saving op."""

    def forward(self, x):
        h = self.act(self.fc1(self.ln(x)))
        rf = torch.ops.profiler._record_function_enter_new("blk.manual", None)
        y = self.fc2(self.drop(h))
        torch.ops.profiler._record_function_exit._RecordFunction(rf)
        return x + y


def _count_events(c: Case, events) -> None:
    n = collections.Counter(e.name for e in events if e.name.startswith("blk."))
    for k, v in n.items():
        c.counts[k] = v


def profiler_step() -> Case:
    c = Case(stack([RFBlock() for _ in range(3)]))
    holder: list[Any] = []

    def ctx(step):
        p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        holder[:] = [p]
        return p

    c.step_ctx = ctx
    c.after = lambda s, m: _count_events(c, holder[0].events())
    return c


def autograd_profiler_step() -> Case:
    c = Case(stack([RFBlock() for _ in range(3)]))
    holder: list[Any] = []

    def ctx(step):
        p = torch.autograd.profiler.profile(record_shapes=True)
        holder[:] = [p]
        return p

    c.step_ctx = ctx
    c.after = lambda s, m: _count_events(c, holder[0].function_events)
    return c


def profiler_fwd() -> Case:
    c = Case(stack([RFBlock() for _ in range(3)]))
    holder: list[Any] = []

    def ctx(step):
        p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        holder[:] = [p]
        return p

    c.fwd_ctx = ctx
    c.after = lambda s, m: _count_events(c, holder[0].events())
    return c


def profiler_schedule() -> Case:
    """One profiler over the loop with a schedule, prof.step() after each step."""
    c = Case(stack([RFBlock() for _ in range(3)]))
    st: dict[str, Any] = {}

    def on_ready(p):
        st["ready"] = st.get("ready", 0) + 1
        _count_events(c, p.events())

    def before(step, m):
        if step == 0:
            st["p"] = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU],
                schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
                on_trace_ready=on_ready,
            )
            st["p"].__enter__()

    def after(step, m):
        st["p"].step()
        if step == 3:
            st["p"].__exit__(None, None, None)
            c.counts["ready"] = st.get("ready", 0)

    def cleanup():
        p = st.get("p")
        if p is not None and p.profiler is not None and getattr(p.profiler, "enabled", False):
            with contextlib.suppress(Exception):
                p.__exit__(None, None, None)

    c.before, c.after, c.cleanup = before, after, cleanup
    return c


def rf_manual_step() -> Case:
    c = Case(stack([RFManual() for _ in range(3)]))
    holder: list[Any] = []

    def ctx(step):
        p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        holder[:] = [p]
        return p

    c.step_ctx = ctx
    c.after = lambda s, m: _count_events(c, holder[0].events())
    return c


def rf_noprofiler() -> Case:
    return Case(stack([RFBlock() for _ in range(3)]))


# --- default device (a function mode on the stack) -----------------------------------

def default_device_loop() -> Case:
    c = Case(stack())
    c.before = lambda s, m: torch.set_default_device("cpu") if s == 0 else None
    c.cleanup = lambda: torch.set_default_device(None)
    return c


class DevCtxBlock(Block):
    def inner(self, h):
        with torch.device("cpu"):
            w = torch.linspace(0.5, 1.5, h.shape[-1])
        return h * w


def device_ctx_inside() -> Case:
    return Case(stack([DevCtxBlock() for _ in range(3)]))


CASES = {f.__name__: f for f in [
    flop_fwd, flop_step, flop_bwd,
    dcount_fwd, dcount_step, dcount_bwd,
    dround_fwd, dround_step, dround_bwd, dround_inside, dround_half,
    tfmode_fwd, tfmode_step, tfmode_bwd, tfmode_inside, tfcount_step,
    overrides_handle, overrides_mode_fwd,
    anomaly_step, anomaly_fwd, anomaly_global,
    profiler_step, autograd_profiler_step, profiler_fwd, profiler_schedule, rf_manual_step, rf_noprofiler,
    default_device_loop, device_ctx_inside,
]}

if __name__ == "__main__":
    main(CASES)
