"""Where the host time of one planned offrecomp step goes: a ``torch.profiler`` summary.

    python benchmarks/profile_step.py [--preset cpu-tiny|gpu-1.3b] [--seq N] [--out f.json]

Trains the long-sequence benchmark's GPT (``benchmarks/long_seq``) under
``offrecomp.runtime(mode="auto")`` until two steps in a row ran the same plan that
offloads with the same pinned pool (step records: ``phase`` ``planned``, offloaded bytes,
one ``plan_id``; on a CPU, the first planned step), then profiles one more step
(CPU activities, and CUDA ones on a GPU) and summarises it:

* host time per region (the runtime's ``rt.regions``) in forward and in backward. The
  forward share is a ``record_function`` range opened and closed by module hooks around
  each region call (the replay calls the region's code directly, so it never opens one);
  an autograd node's backward is charged to the region whose forward op created it (the
  node's ``sequence_nr``), a replay to the node whose unpack started it;
* CUDA runtime calls (``cuda*``/``cu*`` API events) per offloaded storage and per group,
  the storages and groups coming from the offload engine's stats of the profiled step;
* gaps on the compute stream (the stream that ran the most kernels);
* any synchronising call inside forward (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a blocking ``cudaMemcpy``);
* the three largest host costs: ops by self time, and the host time between ops in
  forward and in backward (the Python around them: hooks, the runtime's bookkeeping);
* the runtime's own Python, function by function (``runtime_python``): one more step,
  profiled with ``with_stack=True`` apart from the first (its tracer slows every Python
  call, so only its shares are read), each offrecomp and scheduler function's calls and
  self time in the forward and in the rest of the step (backward on any thread), and
  their sums against the step's host time; beside them, the library Python the runtime
  calls (``torch.cuda``'s stream, event and device wrappers, pytree), which no function
  of its own shows.

To make offloads likely the runtime gets a tight budget (``--budget-fraction`` of the
plain run's saved bytes) and link bandwidths to plan with (``--gbps``). When no planned
step offloads within ``--max-steps``, the profiled step runs ``mode="offload"`` instead
and the summary's ``selection`` says so. On a CPU the CUDA figures are ``n/a`` and the
offloads run on the emulated backend (host copies, no link).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offrecomp
from benchmarks._args import count, number, out_file
from benchmarks._args import device as parse_device
from benchmarks.long_seq.measure import _without_profiler_chatter, count_saved_bytes
from benchmarks.long_seq.models import build_model, make_batch
from benchmarks.long_seq.presets import PRESETS
from offrecomp.offload import OffloadEngine
from offrecomp.transfer import OffloadStats

__all__ = [
    "SYNC_CALLS", "RunSetup", "add_run_arguments", "check_run_arguments", "main", "setup_run", "start_run",
    "summarize", "train_step",
]

#: CUDA runtime calls that block the host until the device catches up.
SYNC_CALLS = frozenset(
    {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}
)
FORWARD = "profile_step::forward"
BACKWARD = "profile_step::backward"
OPTIMIZER = "profile_step::optimizer"
REGION_PREFIX = "region::"
_OUTSIDE = "(outside regions)"
_EVALUATE = "autograd::engine::evaluate_function:"
_PROFILE_TRIES = 3
_RUNTIME_PACKAGES = ("offrecomp", "scheduler")


def add_run_arguments(p: argparse.ArgumentParser, *, budget_fraction: float, max_steps: str) -> None:
    """The options ``start_run`` reads: the model, the batch, auto's budget as a share of
    the plain run's saved bytes (``budget_fraction`` by default), the steps to wait
    (``max_steps``: for what) and the CPU threads."""
    p.add_argument("--preset", default="cpu-tiny", help=f"one of {', '.join(PRESETS)}")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    p.add_argument("--seq", type=count(1), help="tokens per sequence (default: the preset's first)")
    p.add_argument("--batch", type=count(1), help="sequences per step (default: the preset's)")
    p.add_argument("--layers", type=count(1), help="override the preset's block count")
    p.add_argument("--hidden", type=count(1), help="override the preset's width")
    p.add_argument("--heads", type=count(1), help="override the preset's head count (it must divide the width)")
    p.add_argument(
        "--budget-fraction",
        type=number(above=0, at_most=1),
        default=budget_fraction,
        help=f"auto's budget as a share of the plain run's saved bytes, in (0, 1] (default {budget_fraction:g})",
    )
    p.add_argument(
        "--max-steps", type=count(1), default=16, help=f"steps to wait for {max_steps}, 1 or more (default 16)"
    )
    p.add_argument("--threads", type=count(1), help="torch CPU threads (default 1 on CPU)")


def check_run_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``p.error`` (exit status 2) for what ``add_run_arguments``' types cannot check
    alone: the preset, the device, and a width (``--hidden`` or the preset's) that the
    head count (``--heads`` or the preset's) does not divide."""
    if args.preset not in PRESETS:
        p.error(f"--preset {args.preset!r} is invalid; accepted: {', '.join(PRESETS)}")
    spec = PRESETS[args.preset].spec
    hidden = args.hidden if args.hidden is not None else spec.hidden
    heads = args.heads if args.heads is not None else spec.n_heads
    if hidden % heads:
        mine = f" (preset {args.preset}'s)"
        p.error(
            f"--hidden {hidden}{'' if args.hidden is not None else mine} is not a multiple of --heads "
            f"{heads}{'' if args.heads is not None else mine}; accepted: a head count that divides the width"
        )
    parse_device(p, args.device, auto=True, index=False)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/profile_step.py", description=__doc__)
    add_run_arguments(p, budget_fraction=0.25, max_steps="a planned step that offloads")
    p.add_argument(
        "--gbps",
        type=number(above=0),
        default=1000.0,
        help="d2h_gbps and h2d_gbps the runtime plans with until it measures, > 0 (default 1000)",
    )
    p.add_argument(
        "--force-offload",
        action="store_true",
        help="profile mode='offload' directly (no planning)",
    )
    p.add_argument("--out", type=out_file(make_folder=True), default="profile_step.json", help="summary JSON path")
    p.add_argument("--trace", type=out_file(), help="also write the Chrome trace here (.json or .json.gz)")
    return p


# ---------------------------------------------------------------------------------------
# the run


@dataclasses.dataclass
class RunSetup:
    model: nn.Module
    opt: torch.optim.Optimizer
    batch: tuple[torch.Tensor, torch.Tensor]
    device: torch.device
    amp: Callable[[], Any]


def setup_run(args: argparse.Namespace, device: torch.device) -> tuple[RunSetup, dict[str, Any]]:
    if args.preset not in PRESETS:
        raise ValueError(f"--preset {args.preset!r} is invalid; accepted: {', '.join(PRESETS)}")
    preset = PRESETS[args.preset]
    overrides = {
        field: value
        for field, value in (
            ("n_layers", args.layers),
            ("hidden", args.hidden),
            ("n_heads", args.heads),
        )
        if value is not None
    }
    seq = args.seq or preset.seqs[0]
    spec = dataclasses.replace(preset.spec, **overrides).with_max_seq(seq)
    batch_size = args.batch or preset.batch
    model = build_model(spec, device)
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-5, fused=True if device.type == "cuda" else None
    )
    bf16 = preset.bf16 and device.type == "cuda"

    def amp() -> Any:
        if bf16:
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return torch.autocast(device.type, enabled=False)

    meta = {
        "preset": args.preset,
        "model": {**vars(spec)},
        "params": sum(p.numel() for p in model.parameters()),
        "seq": seq,
        "batch": batch_size,
        "dtype": "bf16 autocast" if bf16 else "fp32",
        "device": str(device),
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    batch = make_batch(spec, batch_size, seq, device, seed=1)
    return RunSetup(model, opt, batch, device, amp), meta


def train_step(s: RunSetup, *, marks: bool = False) -> None:
    mark: Callable[[str], Any] = (
        torch.profiler.record_function if marks else (lambda _name: contextlib.nullcontext())
    )
    with mark(FORWARD), s.amp():
        loss = s.model(*s.batch)
    with mark(BACKWARD):
        loss.backward()
    del loss
    with mark(OPTIMIZER):
        s.opt.step()
        s.opt.zero_grad(set_to_none=True)
    if s.device.type == "cuda":
        torch.cuda.synchronize(s.device)


def _last_record(rt: Any) -> Any:
    steps = rt.report().steps
    return steps[-1] if steps else None


@contextlib.contextmanager
def _region_ranges(model: nn.Module, names: Sequence[str]) -> Iterator[None]:
    """A ``record_function`` range around every call of each region module."""
    handles = []
    for name in names:
        module = model.get_submodule(name)
        stack: list[Any] = []

        def pre(_m: nn.Module, _args: Any, *, _stack: list[Any] = stack, _name: str = name) -> None:
            rf = torch.profiler.record_function(REGION_PREFIX + _name)
            rf.__enter__()
            _stack.append(rf)

        def post(_m: nn.Module, _args: Any, _out: Any, *, _stack: list[Any] = stack) -> None:
            if _stack:
                _stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _engine_stats(into: list[OffloadStats]) -> Iterator[None]:
    """Collect the offload engine's per-pass stats (``end_step`` resets them)."""
    original = OffloadEngine.end_step

    def end_step(self: OffloadEngine) -> OffloadStats:
        stats = original(self)
        into.append(stats)
        return stats

    OffloadEngine.end_step = end_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        OffloadEngine.end_step = original  # type: ignore[method-assign]


def _reach_plan(s: RunSetup, rt: Any, max_steps: int) -> tuple[bool, list[str]]:
    """Train until two steps in a row ran the same plan, offloading, with the same
    pinned pool; returns (reached, phases seen). The step profiled next then neither
    solves a plan nor pins host memory (a re-plan does both at its first step's start,
    inside the model's forward), which would stand for the step's own host time.

    Off a GPU the planner never offloads (there is no link), so the wait ends at the
    first planned step there.
    """
    phases: list[str] = []
    last: tuple[str, int] | None = None
    for _ in range(max_steps):
        train_step(s)
        rec = _last_record(rt)
        phase = getattr(rec, "phase", "")
        offloaded = getattr(rec, "offloaded_bytes", 0)
        phases.append(f"{phase}:{offloaded}")
        if phase == "planned" and s.device.type != "cuda":
            return offloaded > 0, phases
        if phase != "planned" or offloaded <= 0:
            last = None
            continue
        key = (str(getattr(rec, "plan_id", "")), int(getattr(rec, "pool_reserved_bytes", 0) or 0))
        if key == last:
            return True, phases
        last = key
    return False, phases


def runtime_python(events: Sequence[Any], top: int = 25) -> dict[str, Any]:
    """The Python functions of ``offrecomp/`` and ``scheduler/`` among ``events`` (a step
    profiled ``with_stack=True``): calls and self time of the ``top`` ones by self time,
    in the forward (the training thread inside its range) and in the rest of the step
    (backward, on autograd's device threads too, and the optimizer; not the emulated
    backend's copy workers), with their sums against the step's host time. Beside them
    (``library``), the other Python functions that run inside a call of the runtime's:
    torch's wrappers it calls (``torch.cuda``'s streams, events and device contexts, the
    random-state getters), whose self time is the runtime's cost but no function of its
    own."""
    forward = _range(events, FORWARD)
    thread = forward.thread if forward is not None else None
    lo, hi = (forward.time_range.start, forward.time_range.end) if forward is not None else (0.0, 0.0)
    workers = {e.thread for e in events if "offrecomp/backends.py(" in e.name and e.name.endswith(": _drain")}
    parts: dict[str, dict[str, list[float]]] = {"forward": {}, "rest": {}}
    library: dict[str, dict[str, list[float]]] = {"forward": {}, "rest": {}}
    step_us = 0.0
    for e in events:
        if e.name in (FORWARD, BACKWARD, OPTIMIZER):
            step_us += e.cpu_time_total if e.thread == thread else 0.0
            continue
        if e.thread in workers or ".py(" not in e.name:
            continue
        at = _runtime_at(e.name)
        inside = e.thread == thread and lo <= e.time_range.start and e.time_range.end <= hi
        if at >= 0:
            f = parts["forward" if inside else "rest"].setdefault(e.name[at:], [0, 0.0])
        elif _under_runtime(e):
            lib = e.name.rfind("site-packages/")
            f = library["forward" if inside else "rest"].setdefault(e.name[lib + 14 :] if lib >= 0 else e.name, [0, 0.0])
        else:
            continue
        f[0] += 1
        f[1] += e.self_cpu_time_total
    out: dict[str, Any] = {"step_host_ms": step_us / 1e3}
    for part, funcs in parts.items():
        out[part] = {
            "self_ms": sum(v[1] for v in funcs.values()) / 1e3,
            "functions": _ranked(funcs, top),
            "library_ms": sum(v[1] for v in library[part].values()) / 1e3,
            "library": _ranked(library[part], top),
        }
    return out


def _ranked(funcs: dict[str, list[float]], top: int) -> list[dict[str, Any]]:
    """The ``top`` functions of ``funcs`` (name: [calls, self µs]) by self time."""
    ranked = sorted(funcs.items(), key=lambda kv: -kv[1][1])
    return [{"function": n, "calls": int(c), "self_us": round(u, 1)} for n, (c, u) in ranked[:top]]


def _runtime_at(name: str) -> int:
    """Where the runtime's package path starts in a Python event's ``name``, or -1."""
    return next((name.index(f"{pkg}/") for pkg in _RUNTIME_PACKAGES if f"{pkg}/" in name), -1)


#: Python frames that run the model, not the runtime: a module's call (the runtime's own
#: wrapper around a region's forward included, and a replay's calls of the region).
_MODEL_FRAMES = ("torch/nn/modules/module.py(", "offrecomp/install.py(")


def _under_runtime(e: Any) -> bool:
    """Does Python event ``e`` (not the runtime's) run inside a call of the runtime's: is
    its nearest ancestor that is the runtime's or runs the model a function of
    ``offrecomp/`` or ``scheduler/`` that does not run the model?"""
    node = e
    while node is not None:
        name = node.name
        if ".py(" in name:
            if any(frame in name for frame in _MODEL_FRAMES):
                return False
            if node is not e and _runtime_at(name) >= 0:
                return True
        node = node.cpu_parent
    return False


def _python_step(s: RunSetup) -> dict[str, Any]:
    """One step under the profiler's Python tracer: ``runtime_python`` of it."""
    from torch.profiler import ProfilerActivity, profile

    with _without_profiler_chatter(), profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        train_step(s, marks=True)
    return runtime_python(prof.events())


def _profiled_step(s: RunSetup, rt: Any) -> tuple[Any, list[OffloadStats]]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if s.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    stats: list[OffloadStats] = []
    with (
        _region_ranges(s.model, rt.regions),
        _engine_stats(stats),
        _without_profiler_chatter(),
        profile(activities=activities) as prof,
    ):
        train_step(s, marks=True)
    return prof, stats


# ---------------------------------------------------------------------------------------
# the summary


def _span_us(e: Any) -> tuple[float, float]:
    return float(e.time_range.start), float(e.time_range.end)


def _ancestor(e: Any, pred: Callable[[Any], bool]) -> Any:
    p = e.cpu_parent
    while p is not None:
        if pred(p):
            return p
        p = p.cpu_parent
    return None


def _is_runtime_call(name: str) -> bool:
    return name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper())


def _regions_summary(events: Sequence[Any]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    forward: dict[str, float] = {}
    calls: dict[str, int] = {}
    backward: dict[str, float] = {}
    owner: dict[int, str] = {}  # sequence_nr of a forward op -> its region
    for e in events:
        if e.name.startswith(REGION_PREFIX):
            name = e.name[len(REGION_PREFIX) :]
            forward[name] = forward.get(name, 0.0) + e.cpu_time_total
            calls[name] = calls.get(name, 0) + 1
        elif e.sequence_nr >= 0 and not e.name.startswith("autograd::"):
            region = _ancestor(e, lambda p: p.name.startswith(REGION_PREFIX))
            if region is not None:
                owner.setdefault(e.sequence_nr, region.name[len(REGION_PREFIX) :])
    top_nodes = [
        e
        for e in events
        if e.name.startswith(_EVALUATE)
        and _ancestor(e, lambda p: p.name.startswith(_EVALUATE)) is None
    ]
    for e in top_nodes:
        name = owner.get(e.sequence_nr, _OUTSIDE)
        backward[name] = backward.get(name, 0.0) + e.cpu_time_total
    names = [*forward, *(n for n in backward if n not in forward)]
    rows = [
        {
            "region": n,
            "calls": calls.get(n, 0),
            "forward_ms": forward.get(n, 0.0) / 1e3,
            "backward_ms": backward.get(n, 0.0) / 1e3,
        }
        for n in names
    ]
    totals = {"backward_nodes_ms": sum(e.cpu_time_total for e in top_nodes) / 1e3}
    return rows, totals


def _range(events: Sequence[Any], name: str) -> Any:
    return next((e for e in events if e.name == name), None)


def _between_ops_ms(events: Sequence[Any], outer: Any, children: Callable[[Any], bool]) -> float:
    """Host time of ``outer`` not spent inside the events ``children`` selects."""
    if outer is None:
        return 0.0
    inside = sum(e.cpu_time_total for e in events if children(e))
    return max(0.0, outer.cpu_time_total - inside) / 1e3


def _host_costs(events: Sequence[Any], averages: Any) -> list[dict[str, Any]]:
    fwd = _range(events, FORWARD)
    bwd = _range(events, BACKWARD)

    def top_level_in_forward(e: Any) -> bool:
        parent = e.cpu_parent
        return (
            parent is not None
            and not e.name.startswith(REGION_PREFIX)
            and (parent.name == FORWARD or parent.name.startswith(REGION_PREFIX))
        )

    def top_level_node(e: Any) -> bool:
        return (
            e.name.startswith(_EVALUATE)
            and _ancestor(e, lambda p: p.name.startswith(_EVALUATE)) is None
        )

    costs: list[dict[str, Any]] = [
        {
            "what": "host time between ops in forward (Python: hooks, runtime bookkeeping)",
            "ms": _between_ops_ms(events, fwd, top_level_in_forward),
            "count": None,
        },
        {
            "what": "host time outside autograd nodes in backward (engine, hooks)",
            "ms": _between_ops_ms(events, bwd, top_level_node),
            "count": None,
        },
    ]
    for a in averages:
        if a.key.startswith((REGION_PREFIX, "profile_step::", _EVALUATE)) or a.key.startswith(
            "ProfilerStep"
        ):
            continue
        costs.append({"what": a.key, "ms": a.self_cpu_time_total / 1e3, "count": a.count})
    costs.sort(key=lambda c: -c["ms"])
    return costs[:3]


def _cuda_summary(
    events: Sequence[Any], kineto: Sequence[Any] | None, stats: dict[str, int]
) -> dict[str, Any]:
    calls: dict[str, int] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and _is_runtime_call(e.name):
            calls[e.name] = calls.get(e.name, 0) + 1
    total = sum(calls.values())
    storages, groups = stats["storages_offloaded"], stats["groups_offloaded"]
    fwd = _range(events, FORWARD)
    syncs: dict[str, int] = {}
    if fwd is not None:
        lo, hi = _span_us(fwd)
        for e in events:
            if e.name in SYNC_CALLS and lo <= e.time_range.start <= hi:
                syncs[e.name] = syncs.get(e.name, 0) + 1
    return {
        "runtime_calls": total,
        "by_name": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
        "per_offloaded_storage": total / storages if storages else None,
        "per_offloaded_group": total / groups if groups else None,
        "syncs_in_forward": syncs,
        "compute_stream_gaps": _stream_gaps(kineto or []),
    }


def _stream_gaps(kineto: Sequence[Any]) -> dict[str, Any] | None:
    """Idle time between the device events of the stream that ran the most kernels."""
    per_stream: dict[int, list[tuple[int, int, str]]] = {}
    for e in kineto:
        # record_function ranges are mirrored on the device timeline as user annotations
        # spanning many kernels; they are not device work.
        if e.device_type() != torch.autograd.DeviceType.CUDA or e.is_user_annotation():
            continue
        start = e.start_ns()
        per_stream.setdefault(e.device_resource_id(), []).append(
            (start, start + e.duration_ns(), e.name())
        )
    if not per_stream:
        return None
    stream, spans = max(per_stream.items(), key=lambda kv: len(kv[1]))
    spans.sort()
    gaps: list[tuple[float, str]] = []
    end = spans[0][1]
    for start, stop, name in spans[1:]:
        if start > end:
            gaps.append(((start - end) / 1e3, name))
        end = max(end, stop)
    span_us = (end - spans[0][0]) / 1e3
    idle = sum(g for g, _ in gaps)
    return {
        "stream": stream,
        "device_events": len(spans),
        "span_ms": span_us / 1e3,
        "idle_ms": idle / 1e3,
        "idle_share": idle / span_us if span_us else None,
        "gaps_over_10us": sum(1 for g, _ in gaps if g > 10),
        "median_gap_us": statistics.median(g for g, _ in gaps) if gaps else None,
        "largest_gaps_us": [
            {"us": round(g, 1), "before": n} for g, n in sorted(gaps, key=lambda x: -x[0])[:5]
        ],
    }


def _offload_totals(stats: Sequence[OffloadStats]) -> dict[str, Any]:
    keys = (
        "groups_offloaded",
        "storages_offloaded",
        "groups_reloaded",
        "prefetches",
        "bytes_d2h",
        "bytes_h2d",
        "window_waits",
        "release_waits",
        "offload_host_seconds",
        "reload_host_seconds",
        "stall_seconds",
    )
    out: dict[str, Any] = {k: sum(getattr(s, k) for s in stats) for k in keys}
    out["backend"] = stats[0].backend if stats else None
    out["passes"] = len(stats)
    return out


def summarize(
    events: Sequence[Any],
    averages: Any,
    stats: Sequence[OffloadStats],
    *,
    cuda: bool,
    kineto: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """The summary of one profiled step (``events``: ``prof.events()``)."""
    regions, totals = _regions_summary(events)
    offload = _offload_totals(stats)
    ranges = {n: _range(events, n) for n in (FORWARD, BACKWARD, OPTIMIZER)}
    return {
        "host_ms": {
            n.split("::")[1]: (e.cpu_time_total / 1e3 if e is not None else None)
            for n, e in ranges.items()
        },
        "regions": regions,
        "backward_nodes_ms": totals["backward_nodes_ms"],
        "offload": offload,
        "cuda": _cuda_summary(events, kineto, offload) if cuda else None,
        "top_host_costs": _host_costs(events, averages),
    }


# ---------------------------------------------------------------------------------------
# output


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def render(summary: dict[str, Any]) -> str:
    sel = summary["selection"]
    lines = [
        f"profiled step: mode {sel['mode']}, phase {sel['phase']!r}, offloaded "
        f"{sel['offloaded_bytes']} B ({sel['why']})",
        "host ms: " + ", ".join(f"{k} {_fmt(v)}" for k, v in summary["host_ms"].items()),
        "",
        f"{'region':<28} {'calls':>5} {'fwd host ms':>11} {'bwd host ms':>11}",
    ]
    for r in summary["regions"]:
        lines.append(
            f"{r['region']:<28} {r['calls']:>5} {r['forward_ms']:>11.3f} {r['backward_ms']:>11.3f}"
        )
    o = summary["offload"]
    c = summary["cuda"] or {}
    gaps = c.get("compute_stream_gaps") or {}
    lines += [
        "",
        f"offloaded: {o['storages_offloaded']} storages in {o['groups_offloaded']} groups "
        f"({o['backend'] or 'no engine'}), {o['groups_reloaded']} reloads",
        f"CUDA runtime calls: {c.get('runtime_calls', 'n/a')}; per offloaded storage "
        f"{_fmt(c.get('per_offloaded_storage'))}; per group {_fmt(c.get('per_offloaded_group'))}",
        f"compute stream: idle {_fmt(gaps.get('idle_ms'), '.3f')} ms of "
        f"{_fmt(gaps.get('span_ms'), '.3f')} ms, {gaps.get('gaps_over_10us', 'n/a')} gaps over 10 us",
        "synchronising calls in forward: "
        + (
            "n/a"
            if summary["cuda"] is None
            else (", ".join(f"{k} x{v}" for k, v in c["syncs_in_forward"].items()) or "none")
        ),
        "",
        "largest host costs:",
    ]
    for i, cost in enumerate(summary["top_host_costs"], 1):
        count = "" if cost["count"] is None else f" ({cost['count']} calls)"
        lines.append(f"  {i}. {cost['ms']:.3f} ms  {cost['what']}{count}")
    py = summary.get("runtime_python")
    if py:
        lines += ["", f"the runtime's Python (a step under the Python tracer, {py['step_host_ms']:.3f} ms host):"]
        for part in ("forward", "rest"):
            lines.append(f"  {part}: {py[part]['self_ms']:.3f} ms self; by self time:")
            for f in py[part]["functions"][:8]:
                lines.append(f"    {f['self_us']:10.1f} us  {f['calls']:6d} calls  {f['function']}")
            lines.append(f"    and {py[part]['library_ms']:.3f} ms in library Python it calls; by self time:")
            for f in py[part]["library"][:5]:
                lines.append(f"    {f['self_us']:10.1f} us  {f['calls']:6d} calls  {f['function']}")
    return "\n".join(lines)


def _write_trace(prof: Any, path: Path) -> None:
    if path.suffix == ".gz":
        tmp = path.with_suffix("")
        prof.export_chrome_trace(str(tmp))
        with tmp.open("rb") as src, gzip.open(path, "wb") as dst:
            dst.write(src.read())
        tmp.unlink()
    else:
        prof.export_chrome_trace(str(path))


def start_run(args: argparse.Namespace) -> tuple[RunSetup, dict[str, Any], int, int] | None:
    """The options of ``add_run_arguments`` (parsed, and checked by ``check_run_arguments``)
    put to work: the device and threads set, the model built: (its setup, its meta, the
    plain run's saved bytes, auto's budget); None, having said why on stderr, for a bad
    value the checks let through."""
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)  # checked: cpu, cuda or auto
    threads = args.threads or (1 if device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    try:
        s, meta = setup_run(args, device)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return None
    plain = count_saved_bytes(s.model, s.batch, s.amp)
    return s, meta, plain, max(1, int(args.budget_fraction * plain))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_run_arguments(parser, args)
    t0 = time.perf_counter()
    started = start_run(args)
    if started is None:
        return 2
    s, meta, plain, budget = started
    device = s.device
    gbps = {"d2h_gbps": args.gbps, "h2d_gbps": args.gbps}
    phases: list[str] = []
    reached = False
    if not args.force_offload:
        rt = offrecomp.runtime(s.model, mode="auto", budget=budget, **gbps)
        with rt:
            reached, phases = _reach_plan(s, rt, args.max_steps)
            if reached:
                # The step after one that offloaded may run the offload trial's plan,
                # which does not (NOTE [Offload trial]): profile again, a few times.
                for _ in range(_PROFILE_TRIES):
                    prof, stats = _profiled_step(s, rt)
                    rec = _last_record(rt)
                    if getattr(rec, "offloaded_bytes", 0) > 0:
                        break
                python = _python_step(s)
                mode, why = (
                    "auto",
                    f"budget {budget} B = {args.budget_fraction:g} x plain saved bytes",
                )
    if not reached:
        rt = offrecomp.runtime(s.model, mode="offload")
        with rt:
            train_step(s)  # the engine's pool and the first groups
            prof, stats = _profiled_step(s, rt)
            rec = _last_record(rt)
            python = _python_step(s)
        mode = "offload"
        if args.force_offload:
            why = "--force-offload"
        elif device.type != "cuda":
            why = "fallback: the planner offloads on a GPU only (a CPU has no link)"
        else:
            why = f"fallback: no planned step offloaded within {args.max_steps} steps"
    kineto = prof.profiler.kineto_results.events() if device.type == "cuda" else None  # type: ignore[union-attr]
    summary: dict[str, Any] = {
        "meta": {**meta, "plain_saved_bytes": plain, "gbps_to_plan_with": args.gbps},
        "command": "python benchmarks/profile_step.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "selection": {
            "mode": mode,
            "why": why,
            "phase": getattr(rec, "phase", None),
            "offloaded_bytes": getattr(rec, "offloaded_bytes", 0),
            "phases_before": phases,
            "regions": list(rt.regions),
        },
        **summarize(
            prof.events(), prof.key_averages(), stats, cuda=device.type == "cuda", kineto=kineto
        ),
        "runtime_python": python,
        "elapsed_s": time.perf_counter() - t0,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if args.trace:
        _write_trace(prof, Path(args.trace))
    print(render(summary))
    print(f"\nwrote {out}" + (f" and {args.trace}" if args.trace else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
