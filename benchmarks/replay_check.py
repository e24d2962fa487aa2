"""Each replay of a planned step against the planner's prediction of it, op by op.

    python benchmarks/replay_check.py [--preset cpu-tiny|gpu-1.3b] [--seq N]
        [--budget-fraction 0.5] [--out replay_check.json]

Trains the long-sequence benchmark's GPT under ``offrecomp.runtime(mode="auto")`` at a
budget of ``--budget-fraction`` of the plain run's saved bytes, with no link to offload
over (the plans keep and recompute only), until two planned steps in a row ran one plan,
then profiles one more step (``torch.profiler``, CPU and CUDA activities) with a
``record_function`` range around each replay. For each region call the plan drops from,
it sets the replay's predicted seconds (``scheduler.cost_model.replay_seconds`` on the
plan's profile: the ops the replay runs, as the runtime picks them) beside what the
profiled replay took (its kernels' device time on a GPU, its host time on a CPU), and
whether it ran under the serving dispatch mode (skipping ops whose outputs are held) or
plainly. For the call furthest off its prediction it lists the profile's ops with their
predicted seconds and the ops the replay ran with their measured ones: where the two
disagree is where a plan's predicted step goes astray.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offrecomp
import offrecomp.regenerate
from benchmarks._args import out_file
from benchmarks.long_seq.measure import _without_profiler_chatter
from benchmarks.profile_step import (
    RunSetup,
    add_run_arguments,
    check_run_arguments,
    start_run,
    train_step,
)
from offrecomp.trace.structure import PLACEHOLDER, RUN, SERVE
from scheduler.cost_model import replay_seconds

__all__ = ["main"]

REPLAY_PREFIX = "replay::"
NO_LINK_GBPS = 1e-6


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/replay_check.py", description=__doc__)
    add_run_arguments(p, budget_fraction=0.5, max_steps="a settled plan")
    p.add_argument("--out", type=out_file(make_folder=True), default="replay_check.json", help="summary JSON path")
    return p


#: What a serving replay does with each op of the recording (offrecomp/trace/structure.py).
ACTIONS = {RUN: "run", SERVE: "serve", PLACEHOLDER: "stub"}


Modes = dict[str, tuple[str, list[int] | None]]


@contextlib.contextmanager
def _replay_ranges(modes: Modes) -> Iterator[None]:
    """A ``record_function`` range around each replay the runtime runs, named by its
    region call; ``modes`` gets, by that name, ``serving`` or ``plain`` and the serving
    program of its first replay."""
    original = offrecomp.regenerate.replay_call

    def replay_call(call: Any, needed: Any, **kw: Any) -> Any:
        program = kw.get("program")
        name = f"{call.name}#{call.call_index}"
        modes.setdefault(name, ("serving" if program is not None else "plain", list(program) if program else None))
        with torch.profiler.record_function(REPLAY_PREFIX + name):
            return original(call, needed, **kw)

    offrecomp.regenerate.replay_call = replay_call  # type: ignore[assignment]
    try:
        yield
    finally:
        offrecomp.regenerate.replay_call = original  # type: ignore[assignment]


def _settle(s: RunSetup, rt: offrecomp.Runtime, max_steps: int) -> list[str]:
    """Train until two planned steps in a row ran one plan; the phases seen."""
    phases: list[str] = []
    last = None
    for _ in range(max_steps):
        train_step(s)
        rec = rt.report().steps[-1]
        phases.append(str(rec.phase))
        key = rec.plan_id if rec.phase == "planned" else None
        if key is not None and key == last:
            break
        last = key
    return phases


def _measured_ms(e: Any, cuda: bool) -> float:
    return (e.device_time_total if cuda else e.cpu_time_total) / 1e3


def _ops_in(events: list[Any], rng: Any, cuda: bool) -> list[dict[str, Any]]:
    """The aten ops run directly inside the replay range ``rng`` (not inside another
    aten op), in order, with their measured milliseconds."""
    ops: list[tuple[float, dict[str, Any]]] = []
    for e in events:
        if not e.name.startswith("aten::") or e.time_range.start < rng.time_range.start:
            continue
        if e.time_range.end > rng.time_range.end:
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith(("aten::", REPLAY_PREFIX)):
            parent = parent.cpu_parent
        if parent is rng:
            ops.append((e.time_range.start, {"op": e.name, "ms": _measured_ms(e, cuda)}))
    return [o for _, o in sorted(ops, key=lambda x: x[0])]


def summarize(rt: offrecomp.Runtime, prof: Any, modes: Modes, cuda: bool) -> dict[str, Any]:
    entry = rt.planner.last_entry
    if entry is None or entry.plan is None or entry.profile is None:
        return {"calls": [], "note": "no plan"}
    plan, profile = entry.plan, entry.profile
    events = list(prof.events())
    ranges = [e for e in events if e.name.startswith(REPLAY_PREFIX)]
    by_call: dict[str, Any] = {}
    for e in ranges:
        by_call.setdefault(e.name[len(REPLAY_PREFIX) :], e)
    calls = []
    for r in profile.regions:
        placed = [plan.placement((r.name, r.call_index, i)) for i in range(len(r.storages))]
        predicted = replay_seconds(r, placed, op_overhead_seconds=profile.replay_op_seconds)
        if predicted <= 0:
            continue
        key = f"{r.name}#{r.call_index}"
        rng = by_call.get(key)
        mode, program = modes.get(key, (None, None))
        k = len(program) if program is not None else len(r.ops)
        calls.append({
            "call": key,
            "predicted_ms": 1e3 * predicted,
            "measured_ms": _measured_ms(rng, cuda) if rng is not None else None,
            "mode": mode,
            "profile_ops": [
                {
                    "op": op.name, "ms": 1e3 * op.seconds,
                    "action": ACTIONS[program[j]] if program is not None and j < k else ("run" if j < k else "-"),
                }
                for j, op in enumerate(r.ops)
            ],
            "ran_ops": _ops_in(events, rng, cuda) if rng is not None else [],
        })
    return {"replay_op_us": 1e6 * profile.replay_op_seconds, "calls": calls}


def render(summary: dict[str, Any]) -> str:
    calls = summary.get("calls", [])
    if not calls:
        return "no replay in the profiled step (" + str(summary.get("note", "the plan drops nothing")) + ")"
    lines = [f"replay dispatch cost planned with: {summary['replay_op_us']:.1f} us per op",
             f"{'region call':24s} {'mode':8s} {'predicted ms':>12s} {'measured ms':>12s} {'ratio':>6s}"]
    for c in calls:
        m = c["measured_ms"]
        ratio = f"{m / c['predicted_ms']:.2f}" if m is not None and c["predicted_ms"] > 0 else "-"
        lines.append(f"{c['call']:24s} {c['mode'] or '-':8s} {c['predicted_ms']:12.3f} "
                     f"{m if m is not None else float('nan'):12.3f} {ratio:>6s}")
    timed = [c for c in calls if c["measured_ms"] is not None]
    if timed:
        worst = max(timed, key=lambda c: abs(c["measured_ms"] - c["predicted_ms"]))
        lines.append(f"\nfurthest off: {worst['call']} ({worst['mode']}); the profile's ops (predicted):")
        lines += [f"  {i:3d} {o['op']:52s} {o['ms']:9.3f}  {o['action']}" for i, o in enumerate(worst["profile_ops"])]
        lines.append("the ops its replay ran (measured):")
        lines += [f"  {i:3d} {o['op']:52s} {o['ms']:9.3f}" for i, o in enumerate(worst["ran_ops"])]
    return "\n".join(lines)


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
    rt = offrecomp.runtime(s.model, mode="auto", budget=budget, d2h_gbps=NO_LINK_GBPS, h2d_gbps=NO_LINK_GBPS)
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    modes: Modes = {}
    with rt:
        phases = _settle(s, rt, args.max_steps)
        with _replay_ranges(modes), _without_profiler_chatter(), profile(activities=activities) as prof:
            train_step(s)
        rec = rt.report().steps[-1]
        summary = {
            "meta": {**meta, "plain_saved_bytes": plain, "budget_bytes": budget},
            "command": "python benchmarks/replay_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "phases_before": phases,
            "step": {"phase": str(rec.phase), "plan_id": rec.plan_id, "served_ops": rec.served_ops,
                     "rerun_ops": rec.rerun_ops, "recompute_ms": 1e3 * rec.recompute_seconds,
                     "predicted_recompute_ms": 1e3 * (rec.predicted_recompute_seconds or 0.0)},
            **summarize(rt, prof, modes, cuda),
            "explain": rt.explain(),
            "elapsed_s": time.perf_counter() - t0,
        }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(render(summary))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
