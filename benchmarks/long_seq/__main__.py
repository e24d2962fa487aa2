"""``python -m benchmarks.long_seq``: compare activation-memory strategies on long sequences.

Run with ``--help`` for the options, ``--list`` for the strategies and presets.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .._args import count, number
from .._args import device as parse_device

__all__ = ["build_parser", "main"]

_CPU_MAX_SECONDS = 540.0
_H100_CLASS_PEAK_TFLOPS = 989.0  # dense bf16, H100/H200 SXM datasheet


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is invalid; accepted: comma-separated integers (4096,8192)"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; give positive integers")
    return values


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _out_folder(text: str) -> str:
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; accepted: a folder (made if missing)")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.long_seq",
        description=(
            "Train a GPT-style model with each activation-memory strategy, interleaved in one "
            "process, and report step time (median, ratio to plain), tokens/s, allocator "
            "peak memory, MFU and the longest sequence each strategy fits under a budget."
        ),
    )
    p.add_argument(
        "--preset", default="auto", help="preset name (see --list); auto picks by device"
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument(
        "--model", choices=("gpt", "hf-llama", "hf-gpt2"), help="override the preset's model kind"
    )
    p.add_argument("--seq", type=_int_list, help="sequence lengths to compare, e.g. 4096,8192")
    p.add_argument("--batch", type=count(1), help="sequences per step")
    p.add_argument("--layers", type=count(1), help="override the preset's block count")
    p.add_argument("--hidden", type=count(1), help="override the preset's width")
    p.add_argument(
        "--heads", type=count(1), help="override the preset's head count (it must divide the width)"
    )
    p.add_argument(
        "--dropout", type=number(at_least=0, below=1), help="dropout probability in [0, 1) (default 0)"
    )
    p.add_argument(
        "--max-seq",
        type=count(1),
        help="length of the position table, at least the preset's and the longest sequence "
        "run or searched (the default); one figure across runs keeps the parameters, and so "
        "compiled graphs, the same",
    )
    p.add_argument(
        "--strategies", type=_name_list, help="comma-separated subset (none is always run)"
    )
    p.add_argument(
        "--warmup", type=count(0), default=1, help="untimed steps per strategy (default 1)"
    )
    p.add_argument(
        "--repeats", type=count(1), default=3, help="timed interleaved rounds (default 3)"
    )
    compile_group = p.add_mutually_exclusive_group()
    compile_group.add_argument(
        "--with-compile",
        dest="with_compile",
        action="store_true",
        default=None,
        help="run compile_budget (default on GPU only)",
    )
    compile_group.add_argument(
        "--no-compile", dest="with_compile", action="store_false", help="skip compile_budget"
    )
    p.add_argument(
        "--compile-dynamic",
        action="store_true",
        help="compile_budget compiles with dynamic=True: one graph for every sequence length",
    )
    p.add_argument(
        "--compile-budget",
        type=number(at_least=0, at_most=1),
        default=0.5,
        help="activation_memory_budget for compile_budget, in [0, 1]: 0 saves what checkpointing "
        "everything would, 1 what torch.compile saves by default (default 0.5)",
    )
    p.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend for compile_budget (default inductor)",
    )
    p.add_argument(
        "--mem-budget",
        help="budget of the longest-sequence search, e.g. 24MiB or 32GiB (step peak above the "
        "weights and optimizer state); default from the preset",
    )
    p.add_argument("--no-search", action="store_true", help="skip the longest-sequence search")
    p.add_argument(
        "--no-compare",
        action="store_true",
        help="skip the step-time comparison (run the longest-sequence search only)",
    )
    p.add_argument(
        "--search-start",
        type=count(1),
        help="first sequence length the search tries, at most --search-max",
    )
    p.add_argument(
        "--search-max", type=count(1), help="longest sequence length the search tries"
    )
    p.add_argument(
        "--search-quantum",
        type=count(1),
        default=64,
        help="the search's resolution in tokens: it reports a multiple of this (default 64)",
    )
    p.add_argument(
        "--peak-tflops",
        type=number(above=0),
        help=f"device peak for MFU (default {_H100_CLASS_PEAK_TFLOPS:g} on H100/H200, else no MFU)",
    )
    p.add_argument(
        "--out", type=_out_folder, default="bench_out", help="output folder (default bench_out/)"
    )
    p.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    p.add_argument(
        "--max-seconds",
        type=number(above=0),
        help=f"stop starting new work after this long (default {_CPU_MAX_SECONDS:g} on CPU, none on GPU)",
    )
    p.add_argument(
        "--threads",
        type=count(1),
        help="torch CPU threads (default 1 on CPU, as torch.utils.benchmark does: with more, "
        "any other busy program can stall a step through OpenMP; torch's choice on GPU)",
    )
    p.add_argument("--seed", type=int, default=0, help="weight and data seed")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--list", action="store_true", help="list strategies and presets, then exit")
    return p


def _hardware(device: Any) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        info["cpu"] = platform.processor()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_bytes"] = props.total_memory
        info["cuda"] = torch.version.cuda
    for pkg in ("transformers", "torchtune", "offrecomp"):
        try:
            from importlib.metadata import version

            info[pkg] = version(pkg)
        except Exception:
            pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        if commit:
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            info["git_commit"] = commit + ("+dirty" if dirty else "")
    except Exception:
        pass
    return info


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _list() -> None:
    from .presets import PRESETS
    from .strategies import ALL_STRATEGIES, ON_REQUEST, get_strategies

    print("strategies (* runs only when named in --strategies):")
    for s in get_strategies(list(ALL_STRATEGIES)):
        mark = "*" if s.name in ON_REQUEST else " "
        print(f" {mark}{s.name:<30} {s.summary}")
    print("presets:")
    for p in PRESETS.values():
        seqs = ",".join(map(str, p.seqs))
        print(
            f"  {p.name:<10} {p.description}; seq {seqs}; batch {p.batch}; search <= {p.mem_budget}"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; a bad argument exits with status 2 (``parser.error``) before any
    work starts."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        _list()
        return 0
    if args.no_compare and args.no_search:
        parser.error("--no-compare with --no-search leaves nothing to run; give one of them at most")
    if (
        args.search_start is not None
        and args.search_max is not None
        and args.search_start > args.search_max
    ):
        parser.error(
            f"--search-start {args.search_start} is above --search-max {args.search_max}; "
            "accepted: a first length at most the longest"
        )

    import torch

    wall0 = time.perf_counter()
    device = parse_device(parser, args.device, auto=True)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else None)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(parser, args, argv, device, wall0)
    finally:
        torch.set_num_threads(previous_threads)  # main() may be called from a longer program


def _checked_strategies(parser: argparse.ArgumentParser, names: tuple[str, ...] | None) -> None:
    """``parser.error`` for an empty ``--strategies`` or one naming no strategy."""
    from .strategies import ALL_STRATEGIES

    if names is None:
        return
    unknown = [n for n in names if n not in ALL_STRATEGIES]
    if unknown or not names:
        what = f"unknown {', '.join(unknown)}" if unknown else "names no strategy"
        parser.error(f"--strategies: {what}; accepted: a comma-separated list of {', '.join(ALL_STRATEGIES)}")


def _checked_spec(parser: argparse.ArgumentParser, args: argparse.Namespace, spec: Any, preset: str) -> None:
    """``parser.error`` where the width (``--hidden`` or the preset's) is no multiple of
    the head count (``--heads`` or the preset's): the model could not be built."""
    if spec.hidden % spec.n_heads == 0:
        return
    hidden = f"--hidden {spec.hidden}" + ("" if args.hidden is not None else f" (preset {preset}'s)")
    heads = f"--heads {spec.n_heads}" + ("" if args.heads is not None else f" (preset {preset}'s)")
    small = [d for d in range(1, math.isqrt(spec.hidden) + 1) if spec.hidden % d == 0]
    divisors = sorted({*small, *(spec.hidden // d for d in small)})
    parser.error(
        f"{hidden} is not a multiple of {heads}; accepted: a head count that divides the width "
        f"({', '.join(map(str, divisors))})"
    )


def _run(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: list[str] | None,
    device: Any,
    wall0: float,
) -> int:
    import dataclasses

    import torch

    from .measure import BenchConfig, run_benchmark
    from .models import hf_available
    from .output import Progress, format_bytes, render_search, render_table, write_all
    from .presets import PRESETS, auto_preset_name, parse_size
    from .strategies import Options, get_strategies

    total_mem = (
        torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    )
    preset_name = auto_preset_name(device.type, total_mem) if args.preset == "auto" else args.preset
    if preset_name not in PRESETS:
        parser.error(f"--preset {preset_name!r} is invalid; accepted: auto, {', '.join(PRESETS)}")
    preset = PRESETS[preset_name]
    notes: list[str] = []

    overrides: dict[str, Any] = {}
    for arg, fieldname in (
        ("model", "kind"),
        ("layers", "n_layers"),
        ("hidden", "hidden"),
        ("heads", "n_heads"),
        ("dropout", "dropout"),
    ):
        if getattr(args, arg) is not None:
            overrides[fieldname] = getattr(args, arg)
    spec = dataclasses.replace(preset.spec, seed=args.seed, **overrides)
    _checked_spec(parser, args, spec, preset_name)
    if spec.kind != "gpt":
        ok, why = hf_available()
        if not ok:
            notes.append(f"--model {spec.kind} skipped: {why}; ran the built-in GPT instead")
            spec = dataclasses.replace(spec, kind="gpt")
    seqs = args.seq or preset.seqs
    spec = spec.with_max_seq(max(seqs))
    if args.max_seq is not None:
        spec = spec.with_max_seq(args.max_seq)

    _checked_strategies(parser, args.strategies)
    search_start = args.search_start or preset.search_start
    search_max = args.search_max or preset.search_max
    if search_start > search_max:  # one of them the preset's (both given: checked in main)
        start = f"--search-start {search_start}" + ("" if args.search_start else f" (preset {preset_name}'s)")
        most = f"--search-max {search_max}" + ("" if args.search_max else f" (preset {preset_name}'s)")
        parser.error(f"{start} is above {most}; accepted: a first length at most the longest")
    # The budget is parsed even without the search: offrecomp_auto@budget uses it.
    budget_text = args.mem_budget or preset.mem_budget
    step_budget: int | None = None
    if budget_text.lower() != "none":
        try:
            step_budget = parse_size(budget_text, name="--mem-budget")
        except ValueError as exc:
            parser.error(str(exc))
        if step_budget < 1:
            parser.error(
                f"--mem-budget={budget_text!r} is invalid; accepted: a size of 1 byte or more "
                "(e.g. 24MiB), or none"
            )
    elif args.no_compare:
        parser.error(
            f"--no-compare with --mem-budget {budget_text} leaves nothing to run: the search needs "
            "a budget; accepted: a size (e.g. 24MiB)"
        )
    with_compile = args.with_compile if args.with_compile is not None else device.type == "cuda"
    options = Options(
        with_compile=with_compile,
        compile_budget=args.compile_budget,
        compile_backend=args.compile_backend,
        compile_dynamic=args.compile_dynamic,
        step_budget_bytes=step_budget,
    )

    peak_tflops = args.peak_tflops
    if peak_tflops is None and device.type == "cuda":
        name = torch.cuda.get_device_properties(device).name
        if "H100" in name or "H200" in name:
            peak_tflops = _H100_CLASS_PEAK_TFLOPS
        else:
            notes.append(f"MFU not reported: pass --peak-tflops for {name}")

    mem_budget = None if args.no_search else step_budget
    max_seconds = args.max_seconds
    if max_seconds is None and device.type == "cpu":
        max_seconds = _CPU_MAX_SECONDS

    cfg = BenchConfig(
        spec=spec,
        seqs=() if args.no_compare else tuple(seqs),
        batch=args.batch or preset.batch,
        device=device,
        amp_dtype=torch.bfloat16 if (preset.bf16 and device.type == "cuda") else None,
        strategies=tuple(args.strategies) if args.strategies else None,
        options=options,
        warmup=args.warmup,
        repeats=args.repeats,
        mem_budget_bytes=mem_budget,
        search_start=search_start,
        search_max=search_max,
        search_quantum=args.search_quantum,
        peak_tflops=peak_tflops,
        max_seconds=max_seconds,
        seed=args.seed,
    )
    if preset.bf16 and device.type != "cuda":
        notes.append("bf16 autocast is used on GPU only; this CPU run is fp32")

    strategies = get_strategies(list(cfg.strategies) if cfg.strategies else None, options)
    n_avail = sum(1 for s in strategies if s.available(device)[0])
    total = len(cfg.seqs) * n_avail * (1 + cfg.repeats + (device.type == "cpu"))
    print(
        f"long_seq: preset {preset_name}, {spec.kind} {spec.n_layers}x{spec.hidden}, "
        f"batch {cfg.batch}, seq {','.join(map(str, cfg.seqs)) or '-'}, device {device} "
        f"({_plural(torch.get_num_threads(), 'thread')}), "
        f"{len(strategies)} strategies ({n_avail} runnable here)",
        file=sys.stderr,
        flush=True,
    )
    bar = Progress(total, "compare", enabled=not args.quiet)
    search_bar: Progress | None = None

    def search_tick(note: str) -> None:
        nonlocal search_bar
        if search_bar is None:
            bar.close()
            search_bar = Progress(None, "search", enabled=not args.quiet)
        search_bar(note)

    load_start = _load_average()
    try:
        result = run_benchmark(cfg, progress=bar, search_progress=search_tick)
    finally:
        bar.close()
        if search_bar is not None:
            search_bar.close()

    hardware = _hardware(device)
    hardware["load_average_start"] = load_start
    hardware["load_average_end"] = _load_average()
    cores = os.cpu_count() or 1
    if device.type == "cpu" and (load_start or 0.0) > 0.5 * cores:
        # Read before the benchmark's own work, so this is other programs' load.
        notes.append(
            f"the machine was busy before the run (1-minute load average {load_start:.1f} on "
            f"{cores} cores): timings are noisy; read the medians and ratios"
        )
    meta = {
        "command": " ".join(
            ["python -m benchmarks.long_seq", shlex.join(sys.argv[1:] if argv is None else argv)]
        ).strip(),
        "preset": preset_name,
        "device": str(device),
        "hardware": hardware,
        "max_seconds": max_seconds,
    }
    result.notes[:0] = notes
    out_dir = Path(args.out)
    written = write_all(result, out_dir, meta=meta, plots=not args.no_plots)

    where = hardware.get("gpu") or f"{hardware.get('cpu')} ({hardware.get('cpu_count')} cores)"
    print()
    print(
        f"{spec.kind} {spec.n_layers}x{spec.hidden} ({result.meta['params'] / 1e6:.1f}M params), "
        f"batch {cfg.batch}, {result.meta['dtype']}, on {where}, "
        f"{_plural(hardware['torch_threads'], 'torch thread')}; "
        f"torch {hardware['torch']}, python {hardware['python']}"
    )
    if result.rows:
        print(
            f"median of {cfg.repeats} interleaved steps after "
            f"{_warmups(result.meta.get('warmups', {}), cfg.warmup)}; memory: allocator bytes "
            "above the pre-step level (peak: whole step, act: end of forward)"
        )
        print()
        print(render_table(result.rows))
    if result.search:
        print()
        print(render_search(result.search, cfg.mem_budget_bytes))
    if result.plain_saved_bytes:
        saved = ", ".join(
            f"{s}: {format_bytes(b)}" for s, b in sorted(result.plain_saved_bytes.items())
        )
        print(f"\nplain saved activation bytes (budget base for offrecomp_auto@X%): {saved}")
    for note in result.notes:
        print(f"note: {note}")
    print(f"\nwrote {', '.join(str(p) for p in written)} in {time.perf_counter() - wall0:.0f} s")
    return 0


def _warmups(per_strategy: dict[str, int], asked: int) -> str:
    """The untimed steps each strategy got: --warmup, or more where a strategy needs them
    (auto measures, calibrates and plans first; a compiled one compiles)."""
    more = {n: w for n, w in per_strategy.items() if w != asked}
    text = f"{asked} warm-up step{'s' if asked != 1 else ''} each"
    if more:
        text += " (" + ", ".join(f"{n}: {w}" for n, w in sorted(more.items())) + ")"
    return text


if __name__ == "__main__":
    sys.exit(main())
