"""Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05x/cases_state.py all [CASES [VARIANTS]] \
    | grep -v '^USDT' > docs/results/cpu-2026-12-05x/out_state.txt

Sweep x, part C: global torch state changed inside a block's forward and restored
(default dtype, grad mode, no_grad/enable_grad/inference_mode islands, nested autocast,
deterministic algorithms, float32 matmul precision, mkldnn, thread count), including
sections restored by hand that hold the block's last save (a replay's early stop ends
the forward there); and state changed by the loop between the forward and its backward
(autocast exited: the AMP pattern, fp16 with GradScaler, default dtype, grad mode,
inference mode, deterministic flag, matmul precision, threads, mkldnn, flush-denormal)."""

from __future__ import annotations

import contextlib

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py

from harness import Block, Case, H, Stack, main, nn, torch, F, _gen


W = 256


def stack(blocks=None, n=3, **kw) -> Stack:
    return Stack(blocks if blocks is not None else [Block() for _ in range(n)], **kw)


def _tail_forward(self, x, enter, leave, *, guarded=False):
    """The block with its fc2 (the last saving op) inside enter()/leave()."""
    h = self.act(self.fc1(self.ln(x)))
    enter()
    if guarded:
        try:
            y = self.fc2(self.drop(h))
        finally:
            leave()
    else:
        y = self.fc2(self.drop(h))
        leave()
    return x + y


# --- default dtype ----------------------------------------------------------------------

class DtypeConst(Block):
    def inner(self, h):
        torch.set_default_dtype(torch.float64)
        w = torch.linspace(0.5, 1.5, h.shape[-1]).float()
        torch.set_default_dtype(torch.float32)
        return h * w


def dtype_in_safe() -> Case:
    return Case(stack([DtypeConst() for _ in range(3)]))


class DtypeTail(Block):
    """The last save (the float64 constant of the final mul) inside the float64 section."""

    GUARD = False

    def forward(self, x):
        h = self.act(self.fc1(self.ln(x)))
        y = self.fc2(self.drop(h))
        torch.set_default_dtype(torch.float64)
        try:
            w = torch.linspace(0.5, 1.5, y.shape[-1])
            y = (y.double() * w).float()
            if not self.GUARD:
                torch.set_default_dtype(torch.float32)
        finally:
            if self.GUARD:
                torch.set_default_dtype(torch.float32)
        return x + y


class DtypeTailGuarded(DtypeTail):
    GUARD = True


def dtype_in_tail() -> Case:
    return Case(stack([DtypeTail() for _ in range(3)]))


def dtype_in_tail_try() -> Case:
    return Case(stack([DtypeTailGuarded() for _ in range(3)]))


# --- grad mode islands ----------------------------------------------------------------------

class GradOffConst(Block):
    def inner(self, h):
        torch.set_grad_enabled(False)
        scale = h.abs().mean(-1, keepdim=True) + 1.0
        torch.set_grad_enabled(True)
        return h / scale


def grad_off_manual() -> Case:
    return Case(stack([GradOffConst() for _ in range(3)]))


class NoGradConst(Block):
    def inner(self, h):
        with torch.no_grad():
            scale = h.abs().amax(-1, keepdim=True) + 1.0
            with torch.enable_grad():
                h = h * 1.5  # grad back on inside the island
        return h / scale


def no_grad_enable_grad() -> Case:
    return Case(stack([NoGradConst() for _ in range(3)]))


class InferenceConst(Block):
    def inner(self, h):
        with torch.inference_mode():
            c = torch.softmax(h.detach().sum(1, keepdim=True), -1)
        return h * c.clone()


def inference_const() -> Case:
    return Case(stack([InferenceConst() for _ in range(3)]))


# --- autocast nested inside a block under an outer bf16 autocast -----------------------------

def _bf16(step):
    return torch.autocast("cpu", dtype=torch.bfloat16)


class AcOffInside(Block):
    def forward(self, x):
        h = self.act(self.fc1(self.ln(x)))
        with torch.autocast("cpu", enabled=False):
            y = self.fc2(self.drop(h.float()))
        return x + y


def ac_off_inside() -> Case:
    c = Case(stack([AcOffInside() for _ in range(3)]))
    c.fwd_ctx = _bf16
    return c


class AcFp16Inside(Block):
    def forward(self, x):
        h = self.act(self.fc1(self.ln(x)))
        with torch.autocast("cpu", dtype=torch.float16):
            y = self.fc2(self.drop(h))
        return x + y.float()


def ac_fp16_inside() -> Case:
    c = Case(stack([AcFp16Inside() for _ in range(3)]))
    c.fwd_ctx = _bf16
    return c


class AcOnInside(Block):
    """No outer autocast: the block turns bf16 on for its MLP."""

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.act(self.fc1(self.ln(x)))
            y = self.fc2(self.drop(h))
        return x + y.float()


def ac_on_inside() -> Case:
    return Case(stack([AcOnInside() for _ in range(3)]))


class AcManualTail(Block):
    """torch.set_autocast_enabled by hand around the tail."""

    def forward(self, x):
        h = self.act(self.fc1(self.ln(x)))
        torch.set_autocast_enabled("cpu", False)
        y = self.fc2(self.drop(h.float()))
        torch.set_autocast_enabled("cpu", True)
        return x + y


def ac_manual_tail() -> Case:
    c = Case(stack([AcManualTail() for _ in range(3)]))
    c.fwd_ctx = _bf16
    return c


# --- deterministic algorithms, matmul precision, mkldnn, threads toggled inside --------------

class DetInside(Block):
    def inner(self, h):
        torch.use_deterministic_algorithms(True)
        idx = torch.arange(h.shape[1]) % 3
        agg = torch.zeros(h.shape[0], 3, h.shape[2]).index_add(1, idx, h)
        torch.use_deterministic_algorithms(False)
        return h + agg.mean(1, keepdim=True)


def det_in_safe() -> Case:
    return Case(stack([DetInside() for _ in range(3)]))


class DetTail(Block):
    def forward(self, x):
        return _tail_forward(self, x, lambda: torch.use_deterministic_algorithms(True),
                             lambda: torch.use_deterministic_algorithms(False))


def det_in_tail() -> Case:
    return Case(stack([DetTail() for _ in range(3)]))


class PrecBlock(nn.Module):
    """Wide enough (256 -> 512 -> 256) for 'medium' to use bf16 matmuls on this CPU."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(W)
        self.fc1 = nn.Linear(W, 2 * W)
        self.fc2 = nn.Linear(2 * W, W)
        self.drop = nn.Dropout(0.1)
        self.where = where

    def forward(self, x):
        if self.where == "mid":
            torch.set_float32_matmul_precision("medium")
        h = F.gelu(self.fc1(self.ln(x)))
        if self.where == "mid":
            torch.set_float32_matmul_precision("highest")
        if self.where == "tail":
            torch.set_float32_matmul_precision("medium")
            y = self.fc2(self.drop(h))
            torch.set_float32_matmul_precision("highest")
        elif self.where == "tail_try":
            torch.set_float32_matmul_precision("medium")
            try:
                y = self.fc2(self.drop(h))
            finally:
                torch.set_float32_matmul_precision("highest")
        else:
            y = self.fc2(self.drop(h))
        return x + y


def _prec(where: str) -> Case:
    c = Case(Stack([PrecBlock(where) for _ in range(3)], stem=nn.Linear(W, W)))
    c.batch = lambda s: torch.randn(4, 16, W, generator=_gen(s))
    return c


def prec_in_safe() -> Case:
    return _prec("mid")


def prec_in_tail() -> Case:
    return _prec("tail")


def prec_in_tail_try() -> Case:
    return _prec("tail_try")


class ConvBlock(nn.Module):
    def __init__(self, mkldnn_off: str = "") -> None:
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.conv = nn.Conv1d(H, 2 * H, 3, padding=1)
        self.conv2 = nn.Conv1d(2 * H, H, 3, padding=1)
        self.drop = nn.Dropout(0.1)
        self.off = mkldnn_off

    def forward(self, x):
        h = self.ln(x).transpose(1, 2)
        if self.off == "ctx":
            with torch.backends.mkldnn.flags(enabled=False):
                h = F.gelu(self.conv(h))
        else:
            h = F.gelu(self.conv(h))
        if self.off == "tail":
            torch.backends.mkldnn.enabled = False
            y = self.conv2(self.drop(h))
            torch.backends.mkldnn.enabled = True
        else:
            y = self.conv2(self.drop(h))
        return x + y.transpose(1, 2)


def _conv_batch(s):
    return torch.randn(4, 32, H, generator=_gen(s))


def mkldnn_in_ctx() -> Case:
    c = Case(stack([ConvBlock("ctx") for _ in range(3)]))
    c.batch = _conv_batch
    return c


def mkldnn_in_tail() -> Case:
    c = Case(stack([ConvBlock("tail") for _ in range(3)]))
    c.batch = _conv_batch
    return c


class ThreadsTail(Block):
    def forward(self, x):
        return _tail_forward(self, x, lambda: torch.set_num_threads(2), lambda: torch.set_num_threads(1))


def threads_in_tail() -> Case:
    return Case(stack([ThreadsTail() for _ in range(3)]))


# --- state changed by the loop between forward and backward --------------------------------

def amp_std() -> Case:
    c = Case(stack())
    c.fwd_ctx = _bf16
    return c


def amp_fp16_scaler() -> Case:
    c = Case(stack())
    c.fwd_ctx = lambda s: torch.autocast("cpu", dtype=torch.float16)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    c.backward = lambda loss: scaler.scale(loss).backward()
    return c


def amp_step() -> Case:
    c = Case(stack())
    c.step_ctx = _bf16
    return c


def amp_bwd_only() -> Case:
    c = Case(stack())
    c.bwd_ctx = _bf16
    return c


class FactoryBlock(Block):
    def inner(self, h):
        return h * torch.linspace(0.5, 1.5, h.shape[-1]) + torch.ones(h.shape[-1]) * 0.1


def dtype_between() -> Case:
    c = Case(stack([FactoryBlock() for _ in range(3)]))
    c.mid = lambda s, m: torch.set_default_dtype(torch.float64)
    c.after = lambda s, m: torch.set_default_dtype(torch.float32)
    return c


def grad_between() -> Case:
    c = Case(stack())
    c.bwd_ctx = lambda s: torch.no_grad()
    return c


def inference_between() -> Case:
    c = Case(stack())
    c.bwd_ctx = lambda s: torch.inference_mode()
    return c


class PutBlock(Block):
    def inner(self, h):
        flat = torch.zeros(h.numel())
        idx = torch.arange(h.numel()).flip(0)
        return flat.put_(idx, h.reshape(-1)).view_as(h)


def det_between() -> Case:
    c = Case(stack([PutBlock() for _ in range(3)]))
    c.mid = lambda s, m: torch.use_deterministic_algorithms(True)
    c.after = lambda s, m: torch.use_deterministic_algorithms(False)
    return c


def det_between_warn() -> Case:
    c = Case(stack([PutBlock() for _ in range(3)]))
    c.mid = lambda s, m: torch.use_deterministic_algorithms(True, warn_only=True)
    c.after = lambda s, m: torch.use_deterministic_algorithms(False)
    return c


def prec_between() -> Case:
    c = _prec("")
    c.mid = lambda s, m: torch.set_float32_matmul_precision("medium")
    c.after = lambda s, m: torch.set_float32_matmul_precision("highest")
    return c


def prec_fwd_only() -> Case:
    """Medium precision for the forward only (the loop sets it back before backward)."""
    c = _prec("")
    c.before = lambda s, m: torch.set_float32_matmul_precision("medium")
    c.mid = lambda s, m: torch.set_float32_matmul_precision("highest")
    return c


class WideBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(W)
        self.fc1 = nn.Linear(W, 4 * W)
        self.fc2 = nn.Linear(4 * W, W)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h = F.gelu(self.fc1(self.ln(x)))
        return x + self.fc2(self.drop(h)).softmax(-1) * h[..., :W].sum(-1, keepdim=True)


def threads_between() -> Case:
    c = Case(Stack([WideBlock() for _ in range(3)], stem=nn.Linear(W, W)))
    c.batch = lambda s: torch.randn(8, 64, W, generator=_gen(s))
    c.mid = lambda s, m: torch.set_num_threads(2)
    c.after = lambda s, m: torch.set_num_threads(1)
    return c


def mkldnn_between() -> Case:
    c = Case(stack([ConvBlock() for _ in range(3)]))
    c.batch = _conv_batch
    c.mid = lambda s, m: setattr(torch.backends.mkldnn, "enabled", False)
    c.after = lambda s, m: setattr(torch.backends.mkldnn, "enabled", True)
    return c


class TinyBlock(Block):
    """Makes denormal intermediates that are saved (x * 1e-39 times a weight)."""

    def inner(self, h):
        t = h * 1e-39
        return h + (t * self.fc1.bias[: h.shape[-1]] if self.fc1.bias.shape[0] == h.shape[-1] else t * h) * 1e38


def denorm_between() -> Case:
    c = Case(stack([TinyBlock() for _ in range(3)]))
    c.mid = lambda s, m: torch.set_flush_denormal(True)
    c.after = lambda s, m: torch.set_flush_denormal(False)
    return c


CASES = {f.__name__: f for f in [
    dtype_in_safe, dtype_in_tail, dtype_in_tail_try,
    grad_off_manual, no_grad_enable_grad, inference_const,
    ac_off_inside, ac_fp16_inside, ac_on_inside, ac_manual_tail,
    det_in_safe, det_in_tail, prec_in_safe, prec_in_tail, prec_in_tail_try,
    mkldnn_in_ctx, mkldnn_in_tail, threads_in_tail,
    amp_std, amp_fp16_scaler, amp_step, amp_bwd_only,
    dtype_between, grad_between, inference_between, det_between, det_between_warn,
    prec_between, prec_fwd_only, threads_between, mkldnn_between, denorm_between,
]}

if __name__ == "__main__":
    main(CASES)
