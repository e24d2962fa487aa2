"""What issuing one offload group costs the host, by the calls it is made of, and what the
same copies cost issued other ways.

    python benchmarks/bench_issue_primitives.py [--device cuda] [--storages 13] [--mib 16]
        [--reps 200] [--out f.json]

An offloading region call's exit makes a few stream, event and allocation calls and one
``copy_`` per storage of its group (``CudaBackend.copy_many``). Where a forward is
host-bound, each of those is step time. This times, on the host's clock, each such
call alone (median of ``--reps``, the device idle between repetitions so no queue runs
full), and a whole group of ``--storages`` storages of ``--mib`` MiB each (bf16 on a
GPU, fp32 on a CPU) copied to one pinned block:

* ``per-storage copy_``: the engine's way, one ``copy_`` per storage on a side stream;
* ``_foreach_copy_``: the same copies in one call (torch runs them one by one, in C++);
* ``gathered``: the storages copied into one device buffer on the side stream with one
  ``_foreach_copy_`` (one kernel for tensors of one dtype), then that buffer to the
  host with one ``copy_``; its device views made per group and, apart, the calls
  without them (as if they were made once per layout).

On a GPU it also times entering and leaving ``torch.cuda.stream(side)`` (what the
backend does around a group's copies) against ``torch.cuda.set_stream`` to the side
stream and back.

On a CPU the backend is the emulated one (its side streams are worker threads) and
the figures only check that the script runs; the GPU's are the ones to read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._args import count, out_file
from benchmarks._args import device as parse_device
from offrecomp.backends import Backend, get_backend


def _median_us(fn: Callable[[], Any], reps: int, settle: Callable[[], None]) -> float:
    """The median host time of ``fn`` over ``reps`` calls, ``settle`` run between calls
    (untimed)."""
    times = []
    for _ in range(reps):
        settle()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    settle()
    return 1e6 * statistics.median(times)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    backend: Backend = get_backend(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    numel = args.mib * 2**20 // dtype.itemsize
    sources = [torch.randn(numel, device=device).to(dtype) for _ in range(args.storages)]
    nbytes = numel * dtype.itemsize
    host = backend.alloc_host(nbytes * args.storages)
    dsts = [host[i * nbytes : (i + 1) * nbytes].view(dtype) for i in range(args.storages)]
    side = backend.new_stream(device)
    compute = backend.current_stream(device)
    cuda = device.type == "cuda"

    def settle() -> None:
        backend.synchronize()
        if cuda:
            torch.cuda.synchronize(device)

    ordering = backend.record_ordering_event(compute)

    def on_side() -> contextlib.AbstractContextManager[Any]:
        """The side stream made current (a GPU's; the emulated backend has none to make)."""
        return torch.cuda.stream(side) if cuda else contextlib.nullcontext()  # type: ignore[arg-type]

    def stream_context() -> None:
        with on_side():
            pass

    def foreach() -> None:
        with on_side():
            torch._foreach_copy_(dsts, sources, non_blocking=True)

    def staging() -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A device buffer for the group and its views, one per storage."""
        flat = backend.alloc_device(nbytes * args.storages, device, side)
        return flat, list(flat.view(dtype).split(numel))

    def gathered(made: tuple[torch.Tensor, list[torch.Tensor]] | None) -> Callable[[], None]:
        def go() -> None:
            with on_side():
                flat, views = made if made is not None else staging()
                torch._foreach_copy_(views, sources)
                host.copy_(flat, non_blocking=True)

        return go

    rows: dict[str, float] = {
        "current_stream": _median_us(lambda: backend.current_stream(device), args.reps, settle),
        "record_ordering_event": _median_us(lambda: backend.record_ordering_event(compute), args.reps, settle),
        "record_event": _median_us(lambda: backend.record_event(side), args.reps, settle),
        "record_event (timing)": _median_us(lambda: backend.record_event(side, timing=True), args.reps, settle),
        "wait_event": _median_us(lambda: backend.wait_event(side, ordering), args.reps, settle),
        "query": _median_us(lambda: backend.query(ordering), args.reps, settle),
        "alloc_device (one group)": _median_us(
            lambda: backend.alloc_device(nbytes * args.storages, device, side), args.reps, settle
        ),
        "detach": _median_us(sources[0].detach, args.reps, settle),
        "untyped_storage": _median_us(sources[0].untyped_storage, args.reps, settle),
        "group: per-storage copy_": _median_us(lambda: backend.copy_many(dsts, sources, side), args.reps, settle),
        "group: _foreach_copy_": _median_us(foreach, args.reps, settle),
        "group: gathered, views per group": _median_us(gathered(None), args.reps, settle),
        "group: gathered, views made once": _median_us(gathered(staging()), args.reps, settle),
    }
    if cuda:
        rows["stream context enter+exit"] = _median_us(stream_context, args.reps, settle)

        def there_and_back() -> None:  # the side stream made current and the compute one again
            torch.cuda.set_stream(side)  # type: ignore[arg-type]
            torch.cuda.set_stream(compute)  # type: ignore[arg-type]

        rows["set_stream there and back"] = _median_us(there_and_back, args.reps, settle)
    return {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu (emulated backend)",
        "torch": torch.__version__,
        "storages": args.storages,
        "mib": args.mib,
        "dtype": str(dtype),
        "reps": args.reps,
        "host_us": rows,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{result['device']}, torch {result['torch']}: host µs, median of {result['reps']}; "
        f"a group is {result['storages']} x {result['mib']} MiB {result['dtype']}"
    ]
    lines += [f"  {name:<36}{us:>10.1f}" for name, us in result["host_us"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    ap.add_argument("--storages", type=count(1), default=13, help="storages per group (a GPT block offloads 13)")
    ap.add_argument("--mib", type=count(1), default=16, help="MiB per storage (4K tokens x 2048 hidden in bf16: 16)")
    ap.add_argument("--reps", type=count(1), default=200)
    ap.add_argument("--out", type=out_file(), help="write the results as JSON here")
    args = ap.parse_args(argv)
    parse_device(ap, args.device, index=False)
    result = run(args)
    print(render(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
