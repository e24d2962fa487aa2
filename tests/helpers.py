"""Training-loop helpers shared by the tests."""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

import offrecomp
from scheduler.plan import Placement
from tests import models

Batch = Callable[[int], Any]

CASES: dict[str, tuple[Callable[[], nn.Module], Batch]] = {
    "gpt_dropout": (lambda: models.GPT(), lambda s: torch.randint(0, 64, (2, 24), generator=_gen(s))),
    "cnn_batchnorm": (models.CNN, lambda s: torch.randn(4, 3, 8, 8, generator=_gen(s))),
    "kwargs_tuple": (models.KwModel, lambda s: torch.randn(4, 6, 48, generator=_gen(s))),
    "views_inplace": (models.InplaceModel, lambda s: torch.randn(4, 5, 40, generator=_gen(s))),
    "shared_block": (models.SharedModel, lambda s: torch.randn(2, 16, 32, generator=_gen(s))),
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + seed)


def make(case: str, seed: int = 0) -> tuple[nn.Module, Batch]:
    factory, batch = CASES[case]
    torch.manual_seed(seed)
    return factory(), batch


def train(
    model: nn.Module,
    batch: Batch,
    ctx: Any = None,
    *,
    steps: int = 3,
    accumulate: int = 1,
    autograd_grad: bool = False,
    lr: float = 0.1,
) -> list[dict[str, torch.Tensor]]:
    """Run ``steps`` SGD steps inside ``ctx``; return grads and buffers after each step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    params = [p for p in model.parameters() if p.requires_grad]
    with ctx if ctx is not None else contextlib.nullcontext():
        for step in range(steps):
            for micro in range(accumulate):
                torch.manual_seed(10 * step + micro)  # dropout draws
                random.seed(10 * step + micro)  # and a forward's draws from Python's and numpy's
                np.random.seed(10 * step + micro)
                loss = model(batch(10 * step + micro))
                if autograd_grad:
                    grads = torch.autograd.grad(loss, params)
                    for p, g in zip(params, grads):
                        p.grad = g if p.grad is None else p.grad + g
                else:
                    loss.backward()
            snap = {
                f"grad.{n}": p.grad.detach().clone()
                for n, p in model.named_parameters()
                if p.grad is not None  # frozen parameters have none
            }
            snap.update({f"buf.{n}": b.detach().clone() for n, b in model.named_buffers()})
            snap["loss"] = loss.detach().clone()
            out.append(snap)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return out


def assert_bitwise(ref: list[dict[str, torch.Tensor]], got: list[dict[str, torch.Tensor]]) -> None:
    """Every entry of every step equal in dtype, shape and bits (sparse compared dense);
    a failure names every entry that differs, with its largest difference."""
    assert len(ref) == len(got), (len(ref), len(got))
    for step, (a, b) in enumerate(zip(ref, got)):
        assert a.keys() == b.keys(), f"step {step}: {sorted(a.keys() ^ b.keys())}"
        bad = []
        for k in a:
            x, y = _dense(a[k]), _dense(b[k])
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(_bits(x), _bits(y)):
                diff = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else float("nan")
                bad.append(f"{k} (max abs diff {diff:.3g})")
        assert not bad, f"step {step}: " + ", ".join(bad)


ZOO_VARIANTS = ["keep", "recompute", "offload", "auto", "auto_tight", "auto_serve"]
"""Every mode, auto under a tight budget, and auto under a tight budget with every replay
under the dispatch mode (``replay_op_us=0``: on CPU the ops are shorter than the default
per-op cost, so otherwise that path would not run)."""


def variant_runtime(model: nn.Module, variant: str, budget: int | None = None, **kw: Any) -> offrecomp.Runtime:
    """The runtime of one of ``ZOO_VARIANTS`` (``budget`` for the tight ones)."""
    mode = variant
    if variant in ("auto_tight", "auto_serve"):
        mode = "auto"
        kw["budget"] = budget
        if variant == "auto_serve":
            kw["replay_op_us"] = 0
    return offrecomp.runtime(model, mode=mode, min_bytes=0, **kw)


def tight_budget(model: nn.Module, batch: Callable[[int], Any], **kw: Any) -> int:
    """Half the peak activation bytes a keep run of a copy of ``model`` books in one step."""
    probe = copy.deepcopy(model)
    keep = variant_runtime(probe, "keep", **kw)
    train(probe, batch, keep, steps=1)
    budget = keep.report().steps[0].peak_activation_bytes // 2
    assert budget > 0
    return budget


def twin(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def check_variant_report(
    records: list[Any],
    variant: str,
    *,
    n_steps: int,
    stable: bool = True,
    tight_drops: bool = True,
    serves: bool | None = None,
    plans: bool | None = None,
) -> None:
    """What each zoo variant must have done, by its step records: recompute replayed,
    offload offloaded (emulated on CPU), in every step (on a stable structure; else in
    some), auto measured first and (on a stable structure) ended planned, and a tight budget
    ran a plan (planned or borrowed) that dropped something (``tight_drops``: unless the
    most frugal plan keeps everything, the smallest peak being no smaller within
    scheduler.solver.api.FRUGAL_SLACK). For ``auto_serve``, ``serves`` True: some planned
    replay served an op under the dispatch mode; False: the caller says why its regions
    cannot be served; None (not said): not judged, a half-keep budget often dropping whole
    calls, which leaves a replay nothing held to serve from (test_model_zoo's
    test_zoo_replays_under_the_dispatch_mode_serve_held_outputs pins a plan that serves).
    Measuring and calibrating passes recompute everything, so neither the drop nor the
    serving counts from them. ``plans`` (default ``stable``): a tight budget must run a plan;
    a structure that varies may measure again in every step of a short run, and then, with
    ``plans`` False, neither the drop nor the serving is judged."""
    assert len(records) == n_steps
    # a step whose region calls layer dropout skipped (``stable`` False) may have saved
    # nothing to place: then some step, else every one
    each: Callable[[list[bool]], bool] = all if stable else any
    if variant == "recompute":
        assert each([s.recomputed_bytes > 0 and s.replays > 0 for s in records]), [
            (s.recomputed_bytes, s.replays) for s in records
        ]
    if variant == "offload":
        assert each([s.offloaded_bytes > 0 for s in records])
        assert all(s.backend == "emulated" for s in records if s.offloaded_bytes > 0)
    # NOTE [Host pauses]: a calibration pass that a garbage collection distorted runs
    # again (at most twice), which on a loaded host can outlast a short run
    paused = recalibrated(records)
    phases = [s.phase for s in records]
    if variant.startswith("auto"):
        assert phases[0] == "measure", phases
        if stable:  # its own plan, or a larger signature's (NOTE [Borrowed plans])
            assert phases[-1] in ("planned", "borrowed") or (paused and phases[-1] == "calibrate"), phases
    if variant in ("auto_tight", "auto_serve"):
        run = [s for s in records if s.phase in ("planned", "borrowed")]
        redone = recalibrated(records)
        if not run and redone and phases[-1] == "calibrate":
            return  # the host's pauses kept it calibrating: nothing planned to judge
        if not run and not (stable if plans is None else plans):
            return  # a varying structure that never settled into a plan: nothing to judge
        assert run, f"a tight budget never ran a plan: {phases}"
        if tight_drops:  # on a stable structure the last plan run; else some
            assert (run[-1].recomputed_bytes > 0 if stable else any(s.recomputed_bytes > 0 for s in run)), (
                "a budget of half keep's peak forced no dropping in a planned step",
                [(s.phase, s.recomputed_bytes) for s in records],
            )
        if variant == "auto_serve" and serves:
            assert any(s.served_ops > 0 for s in run), (
                "no planned replay served an op",
                [(s.phase, s.replays, s.served_ops, s.rerun_ops) for s in records],
            )


def recalibrated(records: list[Any]) -> bool:
    """Did a calibration pass run again because a host pause distorted it (NOTE [Host
    pauses])? Its step record's note says so; it shifts the later phases by a step."""
    return any("calibrating again" in note for s in records for note in s.notes)


def assert_ends_planned(records: list[Any], n: int = 1) -> None:
    """The last ``n`` steps ran a plan (their own or a borrowed one), unless a host pause
    made a calibration run again (``recalibrated``): then the last may still calibrate."""
    phases = [s.phase for s in records]
    ran = all(p in ("planned", "borrowed") for p in phases[-n:])
    assert ran or (recalibrated(records) and phases[-1] in ("planned", "borrowed", "calibrate")), phases


def check_variant(
    model: nn.Module,
    batch: Callable[[int], Any],
    variant: str,
    *,
    steps: int = 4,
    stable: bool = True,
    serves: bool | None = None,
    plans: bool | None = None,
    **kw: Any,
) -> tuple[offrecomp.Runtime, nn.Module]:
    """Train a copy of ``model`` plainly and one under ``variant`` (of ``ZOO_VARIANTS``;
    ``kw`` to the runtime); assert them bitwise equal and the variant's report as
    ``check_variant_report`` does (``stable`` False: shapes vary from step to step;
    ``serves``, ``plans``: as there).
    Returns the runtime and its model."""
    ref = train(copy.deepcopy(model), batch, steps=steps)
    budget = tight_budget(model, batch, **kw) if variant in ("auto_tight", "auto_serve") else None
    m = copy.deepcopy(model)
    rt = train_bitwise(m, batch, variant, budget, ref, steps=steps, **kw)
    records = rt.report().steps
    check_variant_report(
        records, variant, n_steps=steps, stable=stable, serves=serves, plans=plans,
        tight_drops=not frugal_keeps_all(rt, records),
    )
    return rt, m


def frugal_keeps_all(rt: offrecomp.Runtime, records: list[Any]) -> bool:
    """Did the last step run a plan that meets no budget (the most memory-frugal one) and
    drops nothing: no drop lowers the model's peak (a peak all of whose storages a replay
    makes again, or a cast autocast's cache holds to the forward's end)?"""
    entry = rt.planner.entries.get(records[-1].signature) if records else None
    plan = entry.plan if entry is not None else None
    return (
        plan is not None and not plan.feasible and plan.plan_id == records[-1].plan_id
        and plan.default is not Placement.RECOMPUTE
        and all(pl is not Placement.RECOMPUTE for pl in plan.placements.values())
    )


def train_bitwise(
    model: nn.Module,
    batch: Callable[[int], Any],
    variant: str,
    budget: int | None,
    ref: list[dict[str, torch.Tensor]],
    *,
    steps: int = 4,
    **kw: Any,
) -> offrecomp.Runtime:
    """Train ``model`` itself (not a copy: compiled and scripted models cannot be copied)
    under ``variant``; assert it bitwise equal to ``ref``. Returns the runtime."""
    rt = variant_runtime(model, variant, budget, **kw)
    assert_bitwise(ref, train(model, batch, rt, steps=steps))
    return rt


def settled_phases(steps: Any) -> list[str]:
    """The phases of ``steps`` (``rt.report().steps``) less the calibration passes a host
    pause sent back: a collection of over a millisecond inside a region no repeated peer
    can stand in for distorts its times, and the next pass calibrates again (NOTE [Host
    pauses]). What a quiet host reports, with as many planned steps fewer at the end."""
    return [s.phase for s in steps if not (s.phase == "calibrate" and "calibrating again" in " ".join(s.notes))]


def batch_on(device: torch.device, batch: Callable[[int], Any]) -> Callable[[int], Any]:
    """``batch`` with every tensor it returns moved to ``device``."""

    def moved(seed: int) -> Any:
        return torch.utils._pytree.tree_map(
            lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, batch(seed)
        )

    return moved


def deterministic_plain(
    model: nn.Module, batch: Callable[[int], Any], steps: int
) -> list[dict[str, torch.Tensor]] | None:
    """A plain run of a copy of ``model``, or None when a second one differs from it
    bitwise (nondeterministic kernels: atomics in a CUDA backward)."""
    a = train(copy.deepcopy(model), batch, steps=steps)
    b = train(copy.deepcopy(model), batch, steps=steps)
    same = all(torch.equal(_dense(x[k]), _dense(y[k])) for x, y in zip(a, b) for k in x)
    return a if same else None


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.layout != torch.strided else t


_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers for a float dtype: equal where the floats are bit for bit
    (a NaN equals the same NaN; -0.0 differs from 0.0)."""
    ints = _BITS.get(t.dtype)
    return t.contiguous().view(ints) if ints is not None else t


def offload_group(engine: Any, sources: list[torch.Tensor], ordinal: int = 0, release_at: int | None = None) -> Any:
    """What the runtime does for one region call's offloads: add each storage to a new
    group if the pool has room, issue the group at the call's exit (``release_at``: the
    unit at whose end a plan lets go of it). None when the pool refuses."""
    group = engine.open_group(ordinal, sources[0].device)
    for src in sources:
        if engine.add(group, src.untyped_storage(), src.untyped_storage().nbytes()) < 0:
            engine.discard(group)
            return None
    issued = engine.issue(group) if release_at is None else engine.issue(group, release_at)
    return group if issued else None


def one_intra_op_thread() -> Iterator[None]:
    """A fixture body: torch on one intra-op thread (tiny ops on a busy host otherwise
    wait at an OpenMP barrier each), the count restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def cuda_sync_warnings(fn: Callable[[], Any]) -> tuple[Any, list[Any]]:
    """``fn()`` under ``torch.cuda.set_sync_debug_mode("warn")``: its result, and the
    warnings of each host synchronisation it made (their ``filename`` is the caller's)."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return out, [w for w in seen if "synchroniz" in str(w.message)]
