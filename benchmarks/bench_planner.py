"""Planner benchmark: auto at a memory budget against keep and full recompute.

Runs a GPT-style model in one process with the strategies interleaved (one step of
each per round, the order rotated by one each round, after warm-up), and prints per strategy the median step time, its ratio
to the plain run and to full recompute, the peak activation bytes by the runtime's books,
the allocator's peak over a step (an independent measure: CUDA's max_memory_allocated,
or on CPU the profiler's memory events), and for auto the predicted step time next to
the measured one.

    python benchmarks/bench_planner.py                     # CPU default, ~1-2 minutes
    python benchmarks/bench_planner.py --device cuda --layers 24 --hidden 2048 --seq 4096
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offrecomp
from benchmarks._args import count, number, out_file
from benchmarks._args import device as parse_device
from benchmarks.long_seq.models import ModelSpec, build_model, make_batch
from offrecomp.config import format_bytes
from scheduler.units import SIZE_FORMS, parse_bytes


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocator_peak(fn: Callable[[], None], device: torch.device) -> int:
    """Peak bytes allocated during ``fn`` above what was allocated before it."""
    if device.type == "cuda":
        _sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        _sync(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    acts = [torch.profiler.ProfilerActivity.CPU]
    gc.collect()  # earlier garbage freed inside the window would count against fn
    with torch.profiler.profile(activities=acts, profile_memory=True) as prof:
        fn()
    cur = peak = 0
    for e in sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns()):
        if e.name() == "[memory]":
            cur += e.nbytes()
            peak = max(peak, cur)
    return peak


def _size(text: str) -> str:
    """An argparse type: a byte count (``64KiB``), given back as written."""
    try:
        parse_bytes(text, name="--min-bytes")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; accepted: {SIZE_FORMS}") from None
    return text


class Strategy:
    def __init__(self, name: str, model: torch.nn.Module, rt: offrecomp.Runtime | None) -> None:
        self.name = name
        self.model = model
        self.rt = rt
        self.times: list[float] = []

    def ctx(self) -> Any:
        return self.rt if self.rt is not None else contextlib.nullcontext()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    ap.add_argument("--layers", type=count(1), default=6)
    ap.add_argument("--hidden", type=count(1), default=256)
    ap.add_argument("--heads", type=count(1), default=4, help="attention heads; they must divide --hidden")
    ap.add_argument("--seq", type=count(1), default=512)
    ap.add_argument("--batch", type=count(1), default=2)
    ap.add_argument("--dropout", type=number(at_least=0, below=1), default=0.1, help="in [0, 1) (default 0.1)")
    ap.add_argument(
        "--budget-fraction",
        type=number(above=0, at_most=1),
        default=0.5,
        help="auto budget as a fraction of keep's activation bytes, in (0, 1] (default 0.5)",
    )
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU presets)")
    ap.add_argument(
        "--warmup",
        type=count(0),
        default=3,
        help="untimed steps per strategy; auto plans after its first",
    )
    ap.add_argument("--repeats", type=count(1), default=7, help="timed interleaved rounds, 1 or more")
    ap.add_argument("--min-bytes", type=_size, default="64KiB")
    ap.add_argument("--out", type=out_file(), help="write the results as JSON here")
    ap.add_argument(
        "--profile", help="save auto's profile here (OFFRECOMP_PROFILE): the one its plan was solved with"
    )
    args = ap.parse_args(argv)
    if args.hidden % args.heads:
        ap.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}; accepted: a head count that divides the width")
    device = parse_device(ap, args.device)
    logging.basicConfig(format="%(message)s")  # offrecomp's lines, at OFFRECOMP_LOG's level
    spec = ModelSpec(
        kind="gpt",
        n_layers=args.layers,
        hidden=args.hidden,
        n_heads=args.heads,
        vocab=2048,
        max_seq=args.seq,
        dropout=args.dropout,
    )
    idx, tgt = make_batch(spec, args.batch, args.seq, device)
    amp = (
        torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    )

    def step(m: torch.nn.Module) -> None:
        with amp:
            loss = m(idx, tgt)
        loss.backward()
        for p in m.parameters():
            if p.grad is not None:
                p.grad.zero_()  # keep grads allocated: their memory is not activation memory

    # keep's activation bytes set the budget
    probe = build_model(spec, device)
    with offrecomp.runtime(probe, mode="keep", min_bytes=args.min_bytes) as rt:
        step(probe)
    keep_bytes = rt.report().steps[0].peak_activation_bytes
    del probe
    budget = int(keep_bytes * args.budget_fraction)

    strategies = []
    for name in ("plain", "keep", "recompute", "auto"):
        m = build_model(spec, device)
        rt_s = None
        if name != "plain":
            kw: dict[str, Any] = {"mode": name, "min_bytes": args.min_bytes}
            if name == "auto":
                kw["budget"] = budget
                if args.profile:
                    kw["profile_path"] = args.profile
            rt_s = offrecomp.runtime(m, **kw)
        strategies.append(Strategy(name, m, rt_s))

    for s in strategies:  # warm-up; auto measures in its first step and plans from the second
        with s.ctx():
            for _ in range(args.warmup):
                step(s.model)
    _sync(device)
    for r in range(args.repeats):
        shift = r % len(strategies)  # rotate the order: no strategy always runs after another
        for s in strategies[shift:] + strategies[:shift]:
            with s.ctx():
                _sync(device)
                t0 = time.perf_counter()
                step(s.model)
                _sync(device)
                s.times.append(time.perf_counter() - t0)
    peaks = {}
    for s in strategies:
        with s.ctx():
            peaks[s.name] = allocator_peak(lambda s=s: step(s.model), device)

    med = {s.name: statistics.median(s.times) for s in strategies}
    rows = []
    for s in strategies:
        rec = s.rt.report().steps[-1] if s.rt is not None else None
        rows.append(
            {
                "strategy": s.name,
                "median_step_s": med[s.name],
                "vs_plain": med[s.name] / med["plain"],
                "vs_recompute": med[s.name] / med["recompute"],
                "peak_activation_bytes": rec.peak_activation_bytes if rec else None,
                "allocator_peak_bytes": peaks[s.name],
                "predicted_step_s": rec.predicted_step_seconds if rec else None,
                "phase": rec.phase if rec else "",
            }
        )
    auto = next(r for r in rows if r["strategy"] == "auto")
    keep = next(r for r in rows if r["strategy"] == "keep")
    checks = {
        "auto_peak_within_budget_x1.05": (auto["peak_activation_bytes"] or 0) <= budget * 1.05,
        "auto_allocator_peak_within_budget_x1.05": allocator_within_budget(
            auto["allocator_peak_bytes"], keep["allocator_peak_bytes"], keep["peak_activation_bytes"] or 0, budget
        ),
        "auto_step_le_0.9x_recompute": auto["vs_recompute"] <= 0.9,
    }
    print(
        f"GPT {args.layers}x{args.hidden}, seq {args.seq}, batch {args.batch}, dropout {args.dropout}, "
        f"device {device}, torch {torch.__version__}, {args.repeats} interleaved rounds"
    )
    print(
        f"keep's activation bytes {format_bytes(keep_bytes)}; auto budget {format_bytes(budget)} "
        f"({args.budget_fraction:.0%})"
    )
    hdr = f"{'strategy':<10} {'step ms':>9} {'/plain':>7} {'/recomp':>8} {'peak act':>11} {'alloc peak':>11} {'pred ms':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        pa = "-" if r["peak_activation_bytes"] is None else format_bytes(r["peak_activation_bytes"])
        pr = "-" if r["predicted_step_s"] is None else f"{r['predicted_step_s'] * 1e3:.1f}"
        print(
            f"{r['strategy']:<10} {r['median_step_s'] * 1e3:>9.1f} {r['vs_plain']:>7.3f} "
            f"{r['vs_recompute']:>8.3f} {pa:>11} {format_bytes(r['allocator_peak_bytes']):>11} {pr:>8}"
        )
    if auto["predicted_step_s"]:
        err = auto["median_step_s"] / auto["predicted_step_s"] - 1.0
        print(f"auto: measured/predicted step time {1 + err:.3f} ({err:+.1%})")
    print(rt_explain := strategies[-1].rt.explain() if strategies[-1].rt else "")
    auto_rt = strategies[-1].rt
    auto_steps = [r.to_dict() for r in auto_rt.report().steps] if auto_rt is not None else []
    print_breakdown(auto_steps)
    for k, v in checks.items():
        print(f"check {k}: {'PASS' if v else 'FAIL'}")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "torch": torch.__version__,
                    "keep_bytes": keep_bytes,
                    "budget": budget,
                    "rows": rows,
                    "checks": checks,
                    "explain": rt_explain,
                    "auto_steps": auto_steps,
                },
                indent=1,
            )
        )
    return 0 if all(checks.values()) else 1


def allocator_within_budget(auto_peak: int, base_peak: int, base_activations: int, budget: int) -> bool:
    """The allocator's peak of an auto step against its budget, independently of the
    runtime's books: a baseline strategy's allocator peak less its activations is the rest
    of a step's memory (weights, gradients, the loss's temporaries); auto may add its budget
    to that, plus 5% of the budget. The baseline should peak where auto does: keep and
    auto peak at the end of the forward, with the loss's temporaries alive, while full
    recompute peaks inside a replay in the backward with less of the rest alive (here
    7 MiB less), a baseline only for plans that drop most of what they save."""
    return auto_peak - (base_peak - base_activations) <= budget * 1.05


def print_breakdown(steps: list[dict[str, Any]]) -> None:
    """auto's steps as the runtime timed them (pass start to end of backward), each
    measured part next to the plan's prediction: where a misprediction comes from."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.1f}"

    print(
        "auto steps, measured/predicted ms (step: forward + backward incl. replay and stall; "
        "fwd host: host ms of the forward; gc: host ms in garbage collection; planner: host ms "
        "offrecomp's planner spent outside the step)"
    )
    hdr = (
        f"{'step':>4} {'phase':<10} {'step':>15} {'forward':>15} {'replay':>15} {'stall':>15} "
        f"{'fwd host':>8} {'replay us/op':>12} {'gc':>6} {'planner':>7}"
    )
    print(hdr)
    for r in steps:
        cells = [
            f"{ms(r['step_seconds'])}/{ms(r['predicted_step_seconds'])}",
            f"{ms(r['forward_seconds'])}/{ms(r['predicted_forward_seconds'])}",
            f"{ms(r['recompute_seconds'])}/{ms(r['predicted_recompute_seconds'])}",
            f"{ms(r['stall_seconds'])}/{ms(r['predicted_stall_seconds'])}",
        ]
        print(
            f"{r['step']:>4} {r['phase']:<10} " + " ".join(f"{c:>15}" for c in cells)
            + f" {r.get('forward_host_seconds', 0.0) * 1e3:>8.1f}"
            + f" {r['replay_op_us']:>12.1f} {r.get('pause_seconds', 0.0) * 1e3:>6.1f}"
            + f" {r.get('planner_seconds', 0.0) * 1e3:>7.1f}"
        )


if __name__ == "__main__":
    sys.exit(main())
