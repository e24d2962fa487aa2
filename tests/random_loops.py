"""Random training loops for the general case: the loop zoo's features drawn together,
so the runtime meets combinations no hand-written test names.

``random_loop(seed, n_steps)`` draws a loop: its optimizer (SGD with momentum or AdamW),
how gradients are cleared (to None or to zero), gradient clipping, how the runtime is
entered (once around the loop, around each step, or with ``rt.step()`` inside it), and
per step a train or eval mode, a parameter frozen or thawed, and one to three
micro-batches. A micro-batch has its own batch size, may run under bf16 autocast, may
follow a forward without grad (``no_grad``, ``inference_mode``, or in eval mode), and
ends in one of: ``loss.backward()``; ``torch.autograd.grad`` summed into ``.grad``; a
backward with ``retain_graph`` and a second through the same graph; two forwards and
one backward of their sum; a forward whose loss is dropped; a gradient penalty (the
input's gradient taken with ``create_graph``, its square added to the loss). A step may
also first give a parameter a new storage (``p.data = ...``) or load the state saved
after the first step, and from a step on a deep copy of the model (made inside the
runtime) may follow it as an EMA teacher, run without grad each step. LBFGS runs one
micro-batch per step through its closure. It may raise in the middle
of its forward (a forward hook) or of its backward (a parameter's gradient hook); the
loop then clears the gradients and goes on.

``run_loop(model, batch, loop, rt)`` runs it, plainly (``rt`` None) or under a runtime,
and returns what ``tests.helpers.assert_bitwise`` compares: per step every micro-batch's
loss, the gradients before the optimizer steps, and the buffers.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

import offrecomp

__all__ = ["Boom", "Loop", "Micro", "Step", "describe_loop", "random_loop", "run_loop"]

Batch = Callable[[int, int], Any]  # (seed, rows) -> the model's input


class Boom(Exception):
    """The error a loop raises on purpose, inside a forward or a backward."""


ENDS = ("backward", "grad", "retain_twice", "pair", "dropped", "penalty")
BEFORE = (None, "no_grad", "inference", "eval_no_grad")


@dataclasses.dataclass
class Micro:
    rows: int
    end: str  # one of ENDS
    autocast: bool = False
    before: str | None = None  # a forward without grad first: one of BEFORE
    boom: str | None = None  # "forward" or "backward": raise there


@dataclasses.dataclass
class Step:
    micros: list[Micro]
    eval_mode: bool = False  # the training forwards run in eval mode
    flip: int | None = None  # flip requires_grad of the parameter of this index first
    rebind: int | None = None  # give the parameter of this index a new storage first (``.data =``)
    restore: bool = False  # load the state saved at the first step's end first
    ema: bool = False  # from this step on, a deep copy of the model follows it (an EMA teacher)


@dataclasses.dataclass
class Loop:
    steps: list[Step]
    optimizer: str  # "sgd", "adamw" or "lbfgs" (one micro-batch per step, its closure run up to 3 times)
    to_none: bool  # zero_grad(set_to_none=...)
    clip: bool
    enter: str  # "once", "per_step" or "step_ctx"
    boom_module: int  # index into the model's modules with parameters
    boom_param: int  # index into its parameters


def random_loop(seed: int, n_steps: int = 5, rows: int = 3) -> Loop:
    """A loop of ``n_steps`` steps, mostly of ``rows`` rows per micro-batch (a plan
    repeats) with a few other sizes."""
    rng = random.Random(seed)
    steps = []
    for _ in range(n_steps):
        micros = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            micros.append(Micro(
                rows=rng.choice((rows,) * 4 + (rows - 1, rows + 1)),
                end=rng.choices(ENDS, weights=(8, 2, 1, 1, 1, 1))[0],
                autocast=rng.random() < 0.2,
                before=rng.choices(BEFORE, weights=(10, 1, 1, 1))[0],
                boom=rng.choices((None, "forward", "backward"), weights=(16, 1, 1))[0],
            ))
        steps.append(Step(
            micros=micros,
            eval_mode=rng.random() < 0.1,
            flip=rng.randrange(1 << 16) if rng.random() < 0.15 else None,
            rebind=rng.randrange(1 << 16) if rng.random() < 0.1 else None,
            restore=rng.random() < 0.1,
            ema=rng.random() < 0.1,
        ))
    return Loop(
        steps=steps,
        optimizer=rng.choices(("sgd", "adamw", "lbfgs"), weights=(4, 4, 1))[0],
        to_none=rng.random() < 0.7,
        clip=rng.random() < 0.3,
        enter=rng.choices(("once", "per_step", "step_ctx"), weights=(3, 1, 1))[0],
        boom_module=rng.randrange(1 << 16),
        boom_param=rng.randrange(1 << 16),
    )


def describe_loop(loop: Loop) -> str:
    """The loop in one line, for a failure's message."""
    def micro(m: Micro) -> str:
        parts = [m.end, f"rows={m.rows}"]
        parts += ["autocast"] * m.autocast + ([f"before={m.before}"] if m.before else [])
        parts += [f"boom={m.boom}"] if m.boom else []
        return "/".join(parts)

    steps = "; ".join(
        ("eval " if s.eval_mode else "") + (f"flip{s.flip} " if s.flip is not None else "")
        + (f"rebind{s.rebind} " if s.rebind is not None else "") + ("restore " if s.restore else "")
        + ("ema " if s.ema else "") + ", ".join(micro(m) for m in s.micros)
        for s in loop.steps
    )
    return (
        f"{loop.optimizer} to_none={loop.to_none} clip={loop.clip} enter={loop.enter} "
        f"boom@{loop.boom_module}/{loop.boom_param}: {steps}"
    )


def _seed(n: int) -> None:
    torch.manual_seed(n)  # dropout draws
    random.seed(n)  # and a forward's draws from Python's and numpy's RNGs
    np.random.seed(n)


@contextlib.contextmanager
def _autocast(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yield


def run_loop(
    model: nn.Module, batch: Batch, loop: Loop, rt: offrecomp.Runtime | None = None
) -> list[dict[str, torch.Tensor]]:
    """Run ``loop`` on ``model`` (plainly, or under ``rt``); per step, every micro-batch's
    loss (``loss.S.M``: float32, whatever autocast made), the gradients before the
    optimizer step and the buffers after it."""
    params = list(model.parameters())
    named = dict(model.named_parameters())
    opt = _optimizer(loop.optimizer, params)
    armed: list[str | None] = [None]
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    owner = owners[loop.boom_module % len(owners)]

    def forward_boom(*_: Any) -> None:
        if armed[0] == "forward":
            raise Boom("forward")

    def backward_boom(g: torch.Tensor) -> torch.Tensor:
        if armed[0] == "backward":
            raise Boom("backward")
        return g

    handles = [owner.register_forward_hook(forward_boom)]
    hooked = list(owner.parameters(recurse=False))
    target = hooked[loop.boom_param % len(hooked)]
    if target.requires_grad:
        handles.append(target.register_hook(backward_boom))
    out: list[dict[str, torch.Tensor]] = []
    saved: dict[str, Any] | None = None
    ema: nn.Module | None = None
    outer = rt if rt is not None and loop.enter in ("once", "step_ctx") else contextlib.nullcontext()
    try:
        with outer:
            for s, step in enumerate(loop.steps):
                _before_step(params, step, saved, model, opt)
                inner: Any = contextlib.nullcontext()
                if rt is not None and loop.enter == "per_step":
                    inner = rt
                elif rt is not None and loop.enter == "step_ctx":
                    inner = rt.step()
                snap: dict[str, torch.Tensor] = {}
                with inner:
                    if loop.optimizer == "lbfgs":
                        _lbfgs_step(model, batch, step.micros[0], 100 * s, opt, snap, f"{s}")
                    else:
                        for m, micro in enumerate(step.micros):
                            _micro(model, batch, micro, 100 * s + 10 * m, step.eval_mode, armed, opt, loop, snap, f"{s}.{m}")
                    if step.ema and ema is None:
                        ema = copy.deepcopy(model)
                    if ema is not None:
                        _seed(100 * s + 9)
                        with torch.no_grad():
                            snap[f"ema.{s}"] = ema(batch(100 * s + 9, step.micros[0].rows)).float().clone()
                if loop.optimizer != "lbfgs":
                    snap.update({f"grad.{n}": p.grad.detach().clone() for n, p in named.items() if p.grad is not None})
                    if loop.clip:
                        torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], 1.0)
                    opt.step()
                opt.zero_grad(set_to_none=loop.to_none)
                if ema is not None:
                    with torch.no_grad():
                        for e, p in zip(ema.parameters(), model.parameters()):
                            e.mul_(0.9).add_(p, alpha=0.1)
                snap.update({f"buf.{n}": b.detach().clone() for n, b in model.named_buffers()})
                snap.update({f"param.{n}": p.detach().clone() for n, p in named.items()})
                if saved is None:
                    saved = copy.deepcopy(model.state_dict())
                out.append(snap)
    finally:
        for h in handles:
            h.remove()
    return out


def _optimizer(kind: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-2)
    return torch.optim.LBFGS(params, lr=0.1, max_iter=3, history_size=4)


def _before_step(
    params: list[nn.Parameter], step: Step, saved: dict[str, Any] | None, model: nn.Module,
    opt: torch.optim.Optimizer,
) -> None:
    """A step's changes to the parameters before its forwards."""
    if step.flip is not None:
        p = params[step.flip % len(params)]
        p.requires_grad_(not p.requires_grad)
    if step.rebind is not None:
        p = params[step.rebind % len(params)]
        p.data = p.data.clone()
    if step.restore and saved is not None:
        model.load_state_dict(saved)


def _lbfgs_step(
    model: nn.Module, batch: Batch, micro: Micro, n: int, opt: torch.optim.Optimizer,
    snap: dict[str, torch.Tensor], key: str,
) -> None:
    """One LBFGS step on ``micro``'s batch: its closure runs a forward and a backward up
    to ``max_iter`` times; each closure's loss and gradients are kept."""
    calls = [0]

    def closure() -> torch.Tensor:
        opt.zero_grad()
        _seed(n)
        with _autocast(micro.autocast):
            loss = model(batch(n, micro.rows)).float()
        if loss.requires_grad:
            loss.backward()
        c = calls[0] = calls[0] + 1
        snap[f"loss.{key}.{c}"] = loss.detach().clone()
        for name, p in model.named_parameters():
            if p.grad is not None:
                snap[f"grad.{key}.{c}.{name}"] = p.grad.detach().clone()
        return loss

    opt.step(closure)  # type: ignore[arg-type]


def _micro(
    model: nn.Module, batch: Batch, micro: Micro, n: int, eval_mode: bool, armed: list[str | None],
    opt: torch.optim.Optimizer, loop: Loop, snap: dict[str, torch.Tensor], key: str,
) -> None:
    """One micro-batch of a step (``n``: its seed)."""
    if micro.before is not None:
        _seed(n + 5)
        was = model.training
        if micro.before == "eval_no_grad":
            model.eval()
        ctx = torch.inference_mode() if micro.before == "inference" else torch.no_grad()
        with ctx:
            snap[f"before.{key}"] = model(batch(n + 5, micro.rows)).float().clone()
        model.train(was)
    was = model.training
    model.train(not eval_mode)
    try:
        _seed(n)
        armed[0] = micro.boom
        try:
            _forward_backward(model, batch, micro, n, snap, key)
        except Boom as e:
            snap[f"boom.{key}"] = torch.tensor(1 if str(e) == "forward" else 2)
            opt.zero_grad(set_to_none=loop.to_none)
        finally:
            armed[0] = None
    finally:
        model.train(was)


def _forward_backward(
    model: nn.Module, batch: Batch, micro: Micro, n: int, snap: dict[str, torch.Tensor], key: str
) -> None:
    x = batch(n, micro.rows)
    end = micro.end
    if end == "penalty" and not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        end = "backward"  # no input to take a gradient by
    if end == "penalty":
        x.requires_grad_(True)
    with _autocast(micro.autocast):
        loss = model(x).float()
        if end == "pair":
            _seed(n + 1)
            loss = loss + model(batch(n + 1, micro.rows)).float()
    snap[f"loss.{key}"] = loss.detach().clone()
    if end == "dropped" or not loss.requires_grad:
        return
    if end == "grad":
        live = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, live, allow_unused=True)
        for p, g in zip(live, grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
    elif end == "retain_twice":
        loss.backward(retain_graph=True)
        (0.5 * loss).backward()
    elif end == "penalty":
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        snap[f"penalty.{key}"] = g.detach().clone()
        (loss + 0.1 * g.float().pow(2).sum()).backward()
    else:
        loss.backward()
