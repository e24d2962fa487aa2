"""Host time of a region call's entry and exit, part by part, on transformer blocks.

    python benchmarks/bench_region_calls.py [--layers 24] [--hidden 32] [--seq 64] [--steps 50]
        [--modes keep,recompute,offload] [--device cpu|cuda] [--out f.json]

A GPU step whose forward is host-bound pays every microsecond a region call's entry and
exit take. ``bench_host_overhead.py`` measures per saved tensor on blocks of elementwise
ops; this measures per region call on the long-sequence benchmark's GPT blocks (layer
norms, attention, an MLP: parameters, views, a dozen saves), where a call that may
replay keeps what its replay needs (its inputs, generator states, autocast and
torch-function state, parameters and buffers: ``RegionCalls._capture``).

For each mode, after ``--warmup`` steps inside one runtime, ``--steps`` steps run with
the entry, the exit and the parts below wrapped in timers; each row is the mean wall
time per call, the wrapped callees included (a wrapper adds about 0.3 µs, and a part is
slower here than alone: the model's ops between two calls evict it from the caches).
The plain step is timed apart, unwrapped, for scale.

An offloading call's exit is split further into the offload engine's parts (its poll, the
pinned block, the host views, the stream lookups, events and waits, the copies, holding
the sources; the events, waits and copies of the reloads in backward count in the same
rows); its backward into the group's fetch (``bench_host_overhead.py`` times the saves).
On a CPU the engine runs the emulated backend, on a GPU the CUDA one: ``--device cuda``
runs the model under bf16 autocast, as the long-sequence benchmark does, and waits for
the device after each step (outside the timed parts), so the figures are the host's
time to issue the work, not waits on a queue that ran full.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offrecomp
import offrecomp.calls as calls
import offrecomp.offload as offload
from benchmarks._args import count, out_file
from benchmarks._args import device as parse_device
from benchmarks.long_seq.models import ModelSpec, build_model
from offrecomp.backends import CudaBackend, EmulatedBackend
from offrecomp.groups import OffloadGroups
from offrecomp.input_records import InputRecords
from offrecomp.offload import OffloadEngine
from offrecomp.pool import PinnedPool

MODES = ("keep", "recompute", "offload")
#: (owner, attribute, row label): what is timed, entry and exit first.
PARTS: tuple[tuple[Any, str, str], ...] = (
    (calls.RegionCalls, "enter", "entry"),
    (calls.RegionCalls, "exit", "exit"),
    (calls.RegionCalls, "_capture", "entry: keep what a replay needs"),
    (calls, "capture_inputs", "  inputs"),
    (calls, "capture_rng", "  generator states"),
    (calls, "capture_autocast", "  autocast state"),
    (calls.tc, "torch_function_state", "  torch-function state"),
    (calls, "capture_params", "  parameters"),
    (calls, "capture_buffers", "  buffers"),
    (InputRecords, "add", "  input storages"),
    (OffloadGroups, "issue", "exit: issue the offload group"),
    (OffloadEngine, "issue", "  the engine's issue"),
    (OffloadEngine, "_enter", "    poll for landed copies"),
    (PinnedPool, "alloc", "    pinned block"),
    (offload, "slot_views", "    host views of the slots"),
    (CudaBackend, "current_stream", "    compute stream lookup"),
    (EmulatedBackend, "current_stream", "    compute stream lookup"),
    (CudaBackend, "record_ordering_event", "    ordering event"),
    (EmulatedBackend, "record_ordering_event", "    ordering event"),
    (CudaBackend, "wait_event", "    stream waits (both ways)"),
    (EmulatedBackend, "wait_event", "    stream waits (both ways)"),
    (CudaBackend, "record_event", "    events (both ways)"),
    (EmulatedBackend, "record_event", "    events (both ways)"),
    (CudaBackend, "copy_many", "    copies (a group each way)"),
    (EmulatedBackend, "copy_many", "    copies (a group each way)"),
    (OffloadEngine, "_keep_sources", "    hold the sources"),
    (OffloadEngine, "_bound_stash", "    in-flight window"),
    (OffloadGroups, "fetch", "backward: fetch a group"),
)
#: Row labels in order, each once (a part of either backend has one row).
LABELS = tuple(dict.fromkeys(label for _, _, label in PARTS))


@contextmanager
def _timed(table: dict[str, list[float]]) -> Iterator[None]:
    """Every part of ``PARTS`` wrapped in a timer adding into ``table`` (calls, seconds)."""
    saved = []
    for owner, name, label in PARTS:
        fn = getattr(owner, name)

        def timed(*args: Any, _fn: Callable[..., Any] = fn, _label: str = label, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                row = table.setdefault(_label, [0, 0.0])
                row[0] += 1
                row[1] += time.perf_counter() - t0

        saved.append((owner, name, fn, name in vars(owner)))
        setattr(owner, name, timed)
    try:
        yield
    finally:
        for owner, name, fn, own in reversed(saved):
            if own:
                setattr(owner, name, fn)
            else:  # inherited (the emulated backend's ordering event): the base's again
                delattr(owner, name)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    spec = ModelSpec(n_layers=args.layers, hidden=args.hidden, n_heads=args.heads, vocab=256, max_seq=args.seq)
    torch.manual_seed(0)
    model = build_model(spec, device)
    idx = torch.randint(0, 256, (1, args.seq), device=device)
    tgt = torch.randint(0, 256, (1, args.seq), device=device)
    cuda = device.type == "cuda"

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = model(idx, tgt)
        loss.backward()
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    out: dict[str, Any] = {"plain_step_ms": 1e3 * (time.perf_counter() - t0) / args.steps, "modes": {}}
    for mode in args.modes:
        table: dict[str, list[float]] = {}
        with offrecomp.runtime(model, mode=mode, min_bytes=0):
            for _ in range(args.warmup):
                step()
            with _timed(table):
                for _ in range(args.steps):
                    step()
        out["modes"][mode] = {
            label: {"calls_per_step": n / args.steps, "us_per_call": 1e6 * s / n}
            for label, (n, s) in table.items()
        }
    return out


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"gpt {args.layers} x {args.hidden} at {args.seq} tokens, {args.device}"
        f"{' (bf16 autocast)' if args.device == 'cuda' else ''}, torch {torch.__version__}; "
        f"plain step {result['plain_step_ms']:.2f} ms; mean wall µs per call over {args.steps} steps, x calls "
        "per step",
        f"{'part':<34}" + "".join(f"{m:>15}" for m in args.modes),
    ]
    for label in LABELS:
        if not any(label in result["modes"][m] for m in args.modes):
            continue  # a part nothing called (the other backend's)
        cells = []
        for m in args.modes:
            row = result["modes"][m].get(label)
            cells.append(f"{row['us_per_call']:>9.1f} x{row['calls_per_step']:<4.0f}" if row else f"{'-':>15}")
        lines.append(f"{label:<34}" + "".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=count(1), default=24)
    ap.add_argument("--hidden", type=count(1), default=32)
    ap.add_argument("--seq", type=count(1), default=64)
    ap.add_argument("--heads", type=count(1), default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--steps", type=count(1), default=50)
    ap.add_argument("--warmup", type=count(1), default=10, help="steps before timing (auto-free modes need 1)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--out", type=out_file(), help="write the results as JSON here")
    args = ap.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        ap.error(f"--modes {','.join(bad) or '(none)'} is invalid; accepted: {', '.join(MODES)}")
    if args.hidden % args.heads:
        ap.error(f"--hidden {args.hidden} is invalid; it must be a multiple of --heads {args.heads}")
    parse_device(ap, args.device, index=False)
    result = run(args)
    print(render(result, args))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
