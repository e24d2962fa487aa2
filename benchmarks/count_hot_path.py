"""Bytecodes per saved tensor: the save path counted, not timed.

    python benchmarks/count_hot_path.py [--ops 200] [--region-saves 16] [--steps 3]
        [--top 25] [--detail offload] [--out counts.json]

On a shared machine the timed figures of bench_host_overhead.py move by 10-20% between
runs, so a change of a few percent to the save path cannot be ranked by timing. The
Python bytecodes a step executes are the same on every run: this script counts them with
an opcode tracer (``sys.settrace`` with ``f_trace_opcodes``) over a few steps of each
variant of bench_host_overhead.py, subtracts the plain step's count, and divides by the
saves. For one variant (``--detail``: a word its name holds, the offload variant's by
default) it also lists the functions those bytecodes run in, with their bytecodes and
calls per saved tensor.

It also counts the emulated backend's device calls per offload group in one more window
of the offload variant: event records (timed ones apart), stream waits, event queries,
copies (one per tensor), reload buffers and elapsed-time reads, each a CUDA runtime call
of the CUDA backend (an event record also creates its event, and later destroys it). With the copies held back (below) every fetch finds its reload still
in flight and times the wait, which a GPU whose prefetch landed skips.

A bytecode count is not a time: a bytecode that calls into torch costs more than one that
adds two integers, and C work (torch ops, the copies, allocation, the collector) is not
counted. Rank changes of the Python path by it; quote the timed benchmark for the figure.

Collections are off while counting (a collection runs Python callbacks at points that
depend on the allocator's history). The emulated offload backend's workers start a copy
``START_DELAY_S`` after it was queued, and a thread that waits for it first runs it
itself (NOTE [Emulated waits] in offrecomp/backends.py); which thread runs it depends on
timing, so this script sets the delay beyond any step: the counted thread runs every copy
it waits for, on every run alike. With copies held back, each group's sources are still
held at its backward, so the offload variant reloads every group
(``OffloadEngine.serve_held = False``) rather than serve it (NOTE [Served groups] in
offrecomp/transfer.py), as a GPU's long forward whose copies landed does. Two windows
are counted per variant and the second is reported; periodic work (one hook call in 16
timed, one copy in N timed, the planner's cadence) can make them differ, and the script
says by how much.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offrecomp
from benchmarks._args import out_file
from benchmarks.bench_host_overhead import REGION_SAVES, _GroupedFloor, _Model, reload_path
from offrecomp import backends

ROOT = Path(__file__).resolve().parents[1]
WARMUP_STEPS = 20  # auto's measuring and calibration passes, then its plan


class _Counter:
    """Bytecodes and calls per code object while installed as the trace function."""

    def __init__(self) -> None:
        self.ops: collections.Counter[CodeType] = collections.Counter()
        self.calls: collections.Counter[CodeType] = collections.Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            self.calls[frame.f_code] += 1
            return self._local
        return None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.ops[frame.f_code] += 1
        return self._local

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def _count(fn: Callable[[], None]) -> _Counter:
    counter = _Counter()
    enabled = gc.isenabled()
    gc.disable()
    sys.settrace(counter)
    try:
        fn()
    finally:
        sys.settrace(None)
        if enabled:
            gc.enable()
    return counter


#: The emulated backend's calls that stand for CUDA runtime calls of the CUDA backend
#: (an event record, a stream wait, an event query, one copy per tensor, an allocation
#: on a stream, an elapsed time).
BACKEND_CALLS = ("record_event", "wait_event", "query", "copy_many", "alloc_device", "elapsed_seconds")


class _BackendCalls:
    """Counts the emulated backend's device calls and the groups the engine issues while
    entered: a CPU stand-in for the CUDA runtime calls per offload group."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self._undo: list[tuple[type, str, Any]] = []

    def __enter__(self) -> _BackendCalls:
        from offrecomp.offload import OffloadEngine

        for cls, names in ((backends.EmulatedBackend, BACKEND_CALLS), (OffloadEngine, ("issue",))):
            for name in names:
                fn = getattr(cls, name)
                self._undo.append((cls, name, fn))

                def counted(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
                    if _name == "copy_many":  # one copy per tensor on a CUDA stream
                        self.calls["copy (per tensor)"] += len(a[1])
                    elif _name == "record_event" and (a[2] if len(a) > 2 else k.get("timing", False)):
                        self.calls["record_event (timed)"] += 1
                    else:
                        self.calls[_name] += 1
                    return _fn(*a, **k)

                setattr(cls, name, counted)
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, name, fn in reversed(self._undo):
            setattr(cls, name, fn)


def _where(code: CodeType) -> str:
    path = Path(code.co_filename)
    try:
        name = str(path.resolve().relative_to(ROOT))
    except ValueError:
        name = path.name
    qualname = getattr(code, "co_qualname", code.co_name)  # Python 3.11+; the bare name on 3.10
    return f"{name}:{code.co_firstlineno}:{qualname}"


def main(argv: list[str] | None = None) -> int:
    """The counts, on the reload path (``reload_path``; see the module's docstring)."""
    with reload_path():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=200, help="ops (and saves) per step (default 200)")
    ap.add_argument("--region-saves", type=int, default=REGION_SAVES,
                    help=f"saves per region call in the offload and auto variants (default {REGION_SAVES})")
    ap.add_argument("--steps", type=int, default=3, help="steps counted per window (default 3)")
    ap.add_argument("--top", type=int, default=25, help="functions listed for the --detail variant (default 25)")
    ap.add_argument("--detail", default="offload",
                    help="list the functions of the variant whose name holds this (default offload; "
                         "'hooks on' for keep with the hooks on, 'auto' for auto)")
    ap.add_argument("--out", type=out_file(), default=None, help="write the counts as JSON here")
    args = ap.parse_args(argv)
    if args.ops < 2 or args.region_saves < 1 or args.steps < 1 or args.top < 0:
        ap.error(
            f"--ops {args.ops}, --region-saves {args.region_saves}, --steps {args.steps}, --top {args.top}: "
            "need ops >= 2, region saves and steps >= 1, top >= 0"
        )
    delay = backends.START_DELAY_S
    backends.START_DELAY_S = 3600.0  # before any runtime makes its engine (see the docstring)
    try:
        return _run(args, ap)
    finally:  # a caller in the same process (a test) gets emulated workers that run again
        backends.START_DELAY_S = delay


def _run(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """``main`` with the emulated copies held back (``ap``: its parser, for errors)."""
    torch.manual_seed(0)
    n, steps = args.ops, args.steps
    x = torch.randn(16)
    blocks = max(1, n // args.region_saves)
    plain_model, grouped = _Model(n), _Model(n, blocks=blocks)

    def plain(m: torch.nn.Module) -> Callable[[], None]:
        def run() -> None:
            for _ in range(steps):
                m(x).backward()

        return run

    def identity_hooks() -> None:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            plain(plain_model)()

    def in_runtime(m: torch.nn.Module, **kw: Any) -> Callable[[], None]:
        rt = offrecomp.runtime(m, min_bytes=0, **kw)
        with rt:  # warm up: first passes, engine, auto's plan
            for _ in range(WARMUP_STEPS):
                m(x).backward()

        def run() -> None:
            with rt:
                plain(m)()

        return run

    floor_model = _Model(n, blocks=blocks)
    floor_pair = _GroupedFloor(floor_model)

    def grouped_floor() -> None:
        with torch.autograd.graph.saved_tensors_hooks(floor_pair.pack, floor_pair.unpack):
            plain(floor_model)()

    saves = [0]

    def count_save(t: torch.Tensor) -> torch.Tensor:
        saves[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(count_save, lambda t: t):
        plain_model(x).backward()
    variants: dict[str, tuple[Callable[[], None], str]] = {  # name: (run, its baseline)
        "identity hook pair (floor)": (identity_hooks, "plain"),
        "grouped hook pair, no copies (floor)": (grouped_floor, "grouped"),
        "offrecomp keep": (in_runtime(plain_model, mode="keep"), "plain"),
        "offrecomp keep, hooks on": (in_runtime(_Model(n), mode="keep", native_keep=False), "plain"),
        f"offrecomp offload, {args.region_saves} saves per region": (in_runtime(grouped, mode="offload"), "grouped"),
        f"offrecomp recompute, {args.region_saves} per region, replays": (
            in_runtime(_Model(n, blocks=blocks), mode="recompute"), "grouped"),
        # the tracer makes every counted step far slower than its prediction: drift
        # would re-plan inside the counted windows, which no traced-free run does
        f"offrecomp auto, {args.region_saves} per region, kept": (
            in_runtime(_Model(n, blocks=blocks), mode="auto", drift=100.0), "grouped"),
    }
    detailed = next((name for name in variants if args.detail in name), None)
    if detailed is None:
        ap.error(f"--detail {args.detail!r} names no variant; accepted: a word of one of {', '.join(variants)}")
    base = {"plain": _count(plain(plain_model)).total, "grouped": _count(plain(grouped)).total}
    per_save: dict[str, float] = {}
    unsteady: dict[str, float] = {}  # variant: relative difference of its two windows
    detail: _Counter | None = None
    for name, (run, baseline) in variants.items():
        first, second = _count(run), _count(run)
        if first.total != second.total:  # periodic work: sampled hook timing, timed copies, learning
            unsteady[name] = abs(second.total - first.total) / max(first.total, second.total)
        per_save[name] = (second.total - base[baseline]) / (steps * saves[0])
        if name == detailed:
            detail = second
    print(f"{saves[0]} saves and {n} ops per step, {steps} steps per window, torch {torch.__version__}, "
          f"Python {sys.version.split()[0]}")
    print(f"plain: {base['plain'] / steps:.0f} bytecodes per step")
    print(f"{'variant':48s}{'bytecodes per save over plain':>32s}")
    for name, v in per_save.items():
        print(f"{name:48s}{v:32.1f}")
    for name, diff in unsteady.items():
        print(f"note: {name}: the two windows differ by {100 * diff:.1f}%")
    offload_run = next(run for name, (run, _) in variants.items() if name.startswith("offrecomp offload"))
    with _BackendCalls() as device_calls:
        offload_run()
    groups = device_calls.calls.pop("issue", 0)
    per_group = {k: v / groups for k, v in sorted(device_calls.calls.items())} if groups else {}
    if per_group:
        print(f"\noffload variant, emulated device calls per group ({groups / steps:.0f} groups per step; "
              f"each a CUDA runtime call on a GPU): {sum(per_group.values()):.1f}")
        print("  " + ", ".join(f"{k} {v:.2f}" for k, v in per_group.items()))
    top: list[dict[str, Any]] = []
    if detail is not None and args.top:
        unit = steps * saves[0]
        print(f"\n{detailed}, by function (bytecodes and calls per saved tensor):")
        for code, ops in detail.ops.most_common(args.top):
            top.append({"function": _where(code), "bytecodes": ops / unit, "calls": detail.calls[code] / unit})
            print(f"{ops / unit:9.1f} {detail.calls[code] / unit:7.2f}  {_where(code)}")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "ops": n, "saves": saves[0], "steps": steps, "region_saves": args.region_saves,
            "torch": torch.__version__, "python": sys.version.split()[0],
            "plain_bytecodes_per_step": base["plain"] / steps,
            "bytecodes_per_save_over_plain": per_save, "unsteady": unsteady, "functions_of": detailed, "functions": top,
            "offload_device_calls_per_group": per_group,
        }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
