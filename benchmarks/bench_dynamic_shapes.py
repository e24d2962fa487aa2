"""Dynamic padding: a new input shape at almost every step.

Fine-tuning pads each batch to its own longest sequence, so the input shape, and with it
offrecomp's plan signature, changes from step to step. This benchmark trains a GPT-style
model on one fixed sequence of batches of random lengths (and a smaller batch now and
then) under each strategy, and prints per strategy the total and median step time, the
ratio to full recompute, the largest activation peak by the runtime's books against
auto's budget, the allocator's peak of one more step on the longest batch under full
recompute and auto (checked against the budget independently of the runtime's books), and auto's phases (``borrowed``: the pass ran the plan of a larger
signature of its family, NOTE [Borrowed plans] in ``offrecomp/planning/entries.py``).

Each strategy trains its own copy of the model from the same weights. An untimed plain
pass over every batch shape comes first (``--no-warmup`` skips it), so that no
strategy pays alone for meeting a shape first. The strategies run in rounds, in
alternating order; a round of auto starts from a fresh runtime, so its measuring and
calibration passes are in every round, as in a real run of this length.

    python benchmarks/bench_dynamic_shapes.py                   # CPU, about a minute
    python benchmarks/bench_dynamic_shapes.py --order growing    # a sequence-length warmup
    python benchmarks/bench_dynamic_shapes.py --device cuda --hidden 1024 --layers 16 \\
        --min-seq 1024 --max-seq 8192 --steps 60 --bf16
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offrecomp
from benchmarks._args import count, number, out_file
from benchmarks._args import device as parse_device
from benchmarks.bench_planner import allocator_peak, allocator_within_budget
from benchmarks.long_seq.models import GPT, ModelSpec, build_model
from offrecomp.config import format_bytes

Batch = tuple[torch.Tensor, torch.Tensor]


def batches(spec: ModelSpec, args: argparse.Namespace, device: torch.device) -> list[Batch]:
    """The fixed sequence of (idx, targets): random lengths, a smaller batch every 7th step."""
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    out = []
    for i in range(args.steps):
        if args.order == "growing":  # sequence-length warmup: min to max, step by step
            seq = args.min_seq + (args.max_seq - args.min_seq) * i // max(1, args.steps - 1)
        else:
            seq = rng.randint(args.min_seq, args.max_seq)
        b = max(1, args.batch - 1) if i % 7 == 6 else args.batch
        tokens = torch.randint(0, spec.vocab, (b, seq + 1), generator=gen).to(device)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def block_checkpoint(model: GPT) -> Iterator[None]:
    """torch.utils.checkpoint around every block (non-reentrant), the usual way."""
    def run(blocks: Any, x: torch.Tensor) -> torch.Tensor:
        for blk in blocks:
            x = checkpoint(blk, x, use_reentrant=False)
        return x

    model.run_blocks = run
    try:
        yield
    finally:
        model.run_blocks = None


def train(
    model: GPT, data: list[Batch], ctx: Any, device: torch.device, bf16: bool
) -> list[float]:
    """One pass over ``data`` inside ``ctx``; the step times."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    times = []
    with ctx:
        for idx, tgt in data:
            _sync(device)
            t0 = time.perf_counter()
            with amp:
                loss = model(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(device)
            times.append(time.perf_counter() - t0)
    return times


def one_step(model: GPT, ctx: Any, batch: Batch, bf16: bool) -> None:
    """One more forward and backward of ``model`` inside ``ctx`` (a runtime re-enters)."""
    idx, tgt = batch
    amp = torch.autocast(idx.device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with ctx:
        with amp:
            loss = model(idx, tgt)
        loss.backward()
    model.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    ap.add_argument("--layers", type=count(1), default=6)
    ap.add_argument("--hidden", type=count(1), default=64)
    ap.add_argument("--heads", type=count(1), default=4, help="attention heads; they must divide --hidden")
    ap.add_argument("--batch", type=count(1), default=4)
    ap.add_argument("--min-seq", type=int, default=16)
    ap.add_argument("--max-seq", type=int, default=128)
    ap.add_argument("--steps", type=count(1), default=80)
    ap.add_argument("--order", choices=["random", "growing"], default="random",
                    help="random lengths (dynamic padding) or growing ones (sequence-length warmup)")
    ap.add_argument("--rounds", type=count(1), default=3)
    ap.add_argument("--budget-fraction", type=number(above=0, at_most=1), default=0.5,
                    help="auto's budget as a fraction of keep's activation peak at the longest batch, in (0, 1]")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the untimed plain pass over every batch shape before the rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=out_file(), help="write the results as JSON here")
    args = ap.parse_args(argv)
    if not 1 <= args.min_seq <= args.max_seq:
        ap.error(f"--min-seq {args.min_seq} / --max-seq {args.max_seq}: need 1 <= min <= max")
    if args.hidden % args.heads:
        ap.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}; accepted: a head count that divides the width")
    device = parse_device(ap, args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny ops: intra-op threads only add barrier waits
    spec = ModelSpec(n_layers=args.layers, hidden=args.hidden, n_heads=args.heads,
                     max_seq=args.max_seq, dropout=0.0)
    torch.manual_seed(args.seed)
    base = build_model(spec, device)
    data = batches(spec, args, device)

    # auto's budget: a share of keep's activation peak on the longest, fullest batch
    longest = max(range(len(data)), key=lambda i: data[i][0].numel())
    probe = copy.deepcopy(base)
    keep_rt = offrecomp.runtime(probe, mode="keep")
    train(probe, [data[longest]], keep_rt, device, args.bf16)
    keep_peak = keep_rt.report().steps[0].peak_activation_bytes
    budget = int(keep_peak * args.budget_fraction)
    del probe, keep_rt

    def strategy(name: str, m: GPT) -> tuple[Any, offrecomp.Runtime | None]:
        """The context a strategy trains in, and its runtime (None for the peers)."""
        if name == "plain":
            return contextlib.nullcontext(), None
        if name == "ckpt_block":
            return block_checkpoint(m), None
        rt = offrecomp.runtime(m, mode=name, budget=budget if name == "auto" else None)
        return rt, rt

    if not args.no_warmup:
        # Untimed, plain: the first strategy to meet a shape would otherwise pay for it
        # alone (allocator growth, kernel selection; on the H200, plain training came out
        # 2.6x full recompute in one round without this pass).
        shapes: dict[tuple[int, ...], Batch] = {}
        for b in data:
            shapes.setdefault(tuple(b[0].shape), b)
        warm = copy.deepcopy(base)
        train(warm, list(shapes.values()), contextlib.nullcontext(), device, args.bf16)
        del warm

    totals: dict[str, list[float]] = collections.defaultdict(list)
    medians: dict[str, list[float]] = collections.defaultdict(list)
    peaks: dict[str, int] = {}
    phases: dict[str, int] = {}
    names = ["plain", "ckpt_block", "recompute", "auto"]
    last: dict[str, tuple[GPT, Any]] = {}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            model = copy.deepcopy(base)
            ctx, rt = strategy(name, model)
            last[name] = (model, ctx)
            times = train(model, data, ctx, device, args.bf16)
            totals[name].append(sum(times))
            medians[name].append(statistics.median(times))
            if rt is not None:
                steps = rt.report().steps
                peaks[name] = max(s.peak_activation_bytes for s in steps)
                if name == "auto":
                    phases = dict(collections.Counter(s.phase for s in steps))
            print(f"round {r + 1}/{args.rounds}: {name} {sum(times):.2f}s", file=sys.stderr)

    ref = statistics.median(totals["recompute"])
    lens = [int(x.shape[1]) for x, _ in data]
    print(f"GPT {args.layers}x{args.hidden}, {args.steps} batches of {args.min_seq}-{args.max_seq} "
          f"tokens ({args.order}, {len(set(lens))} lengths; batch {args.batch}, every 7th "
          f"{max(1, args.batch - 1)}), "
          f"device {device.type}, torch {torch.__version__}, {args.rounds} rounds")
    print(f"keep's activation peak on the longest batch {format_bytes(keep_peak)}; "
          f"auto budget {format_bytes(budget)} ({args.budget_fraction:.0%})")
    print(f"{'strategy':<12}{'total s':>9}{'step ms':>9}{'/recomp':>9}{'peak act':>12}")
    print("-" * 51)
    rows = {}
    for name in names:
        tot = statistics.median(totals[name])
        med = statistics.median(medians[name])
        peak = peaks.get(name)
        rows[name] = {"total_seconds": tot, "median_step_seconds": med, "vs_recompute": tot / ref,
                      "peak_activation_bytes": peak}
        print(f"{name:<12}{tot:>9.2f}{1e3 * med:>9.1f}{tot / ref:>9.3f}"
              f"{format_bytes(peak) if peak is not None else '-':>12}")
    print("auto phases: " + ", ".join(f"{k} {v}" for k, v in sorted(phases.items())))
    # the allocator's peak of one more step on the longest batch, against the budget
    alloc = {
        name: allocator_peak(lambda name=name: one_step(*last[name], data[longest], args.bf16), device)
        for name in ("recompute", "auto")
    }
    checks = {
        "auto_peak_within_budget_x1.05": peaks["auto"] <= budget * 1.05,
        "auto_allocator_peak_within_budget_x1.05": allocator_within_budget(
            alloc["auto"], alloc["recompute"], peaks["recompute"], budget
        ),
    }
    print(f"allocator peak of a step on the longest batch: recompute {format_bytes(alloc['recompute'])}, "
          f"auto {format_bytes(alloc['auto'])}")
    for k, v in checks.items():
        print(f"check {k}: {'PASS' if v else 'FAIL'}")
    within = all(checks.values())
    if args.out:
        Path(args.out).write_text(json.dumps({
            "args": vars(args), "budget_bytes": budget, "keep_peak_bytes": keep_peak,
            "strategies": rows, "auto_phases": phases, "torch": torch.__version__,
            "allocator_peak_bytes": alloc, "checks": checks,
        }, indent=2))
    return 0 if within else 1


if __name__ == "__main__":
    raise SystemExit(main())
