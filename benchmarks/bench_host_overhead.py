"""Host overhead: what offrecomp's Python adds per saved tensor and per op.

    python benchmarks/bench_host_overhead.py [--ops 200] [--rounds 7] [--device cpu|cuda]
        [--clock wall|thread] [--region-saves 16] [--gc-freeze]

A GPU step whose kernels are short waits on the host, so the host time a runtime adds
per saved tensor and per op matters on its own. This benchmark measures it against the
floors every saved-tensor hook pair and every Python dispatch mode pay, in one process,
with the variants interleaved (one timing of each per round) and medians over rounds:

* per saved tensor: a region of ``--ops`` elementwise ops on a 16-element tensor, each
  output saved for backward; forward + backward plainly, under an identity hook pair
  (the floor; entered around the step, it stays on the stack through the backward,
  where the runtime's pair comes off: NOTE [Hooks off in backward] in
  offrecomp/backward_entry.py, so keep may read under it), and under offrecomp with every save kept (``mode="keep"``: after each
  signature's first pass the regions save natively, NOTE [Native keep] in
  offrecomp/native.py), also with a dozen buffers in each region (NOTE [Buffer saves]
  in offrecomp/regions.py), and with the hooks kept on (``native_keep=False``: pack,
  handle, unpack, release for every save, as a kept save of a region that also offloads
  or drops pays);
* per offloaded storage: the same ops in regions of ``--region-saves`` saves each, under
  the least any grouped hook pair does in Python (the floor of a grouped offload without
  its copies: pack detaches each save into its region call's list, unpack indexes it),
  the least such a pair does with its copies (the lean bound: each block's storages
  copied with one call into a host block kept from step to step, reloaded as one
  buffer, one view per unpack; no check, event or record), and every save offloaded
  (``mode="offload"``; on a CPU the emulated backend: real worker threads and copies, a
  group per region call, NOTE [Offload groups] in offrecomp/groups.py);
* every save dropped (``mode="recompute"``), in the same regions: the figure holds the
  replays, which run the region's ops again (the op's own time, about one plain op per
  save here, is part of it) under the replay's save hook;
* auto under an ample budget, in the same regions: after its measuring and calibration
  passes the plan keeps every call whole (NOTE [Kept planned calls] in
  offrecomp/placement.py), and such calls save natively but one pass in eight (NOTE
  [Native keep]); the figure holds those passes' hooks, the region calls and the
  planner's own work per step (NOTE [Learning cadence] in offrecomp/planning/learning.py);
* per op: the same ops under a bare ``TorchDispatchMode`` (the floor), the replay's
  serving mode running every op (the cost each op pays in a replay under the dispatch
  mode; NOTE [Serving overhead] in offrecomp/regenerate.py), and the op recorder (the
  measuring pass).

Each figure is the time over plain divided by the number of saves or ops: the median over
rounds, and beside it the figure of the fastest rounds (on a shared machine the least
disturbed one, the steadier figure to compare runs by), and the median in plain ops: over
the time one plain op of the chain takes, which moves with the host's speed as the
runtime's Python does, so hosts (or one host at other speeds) compare by it better than
by microseconds. ``--clock thread`` reads the main
thread's CPU time instead of wall time: the host's own work, blind to other processes.
The runtime keeps a few Python objects alive per saved tensor through the forward, so
collections run where plain runs none, and a full one walks the whole heap (torch,
numba: about 0.1 s here); ``--gc-freeze`` freezes the heap after the warm-up, as a
training loop may.

On a CPU the offload variant's copies run on the emulated backend, whose device work
(the copies, their events and waits, and the poisoned device buffers of reloads) partly
runs on the timed thread: a host that waits on a copy runs it itself (NOTE [Emulated
waits] in offrecomp/backends.py). A GPU does that work on its copy engines.
``--emulated-split`` adds a column with the part of each figure that is such work, timed
on the main thread's CPU clock around the backend's jobs and device allocations (the
timing adds two clock reads per job to the figure). Every group is reloaded
(``OffloadEngine.serve_held = False``): the emulated copies start 5 ms after they are
queued, so a short step would find each group's sources still held at its backward and
serve them (NOTE [Served groups] in offrecomp/transfer.py), where a long forward on a GPU
has its copies landed and reloads them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offrecomp
from benchmarks._args import device as parse_device
from benchmarks._args import out_file
from offrecomp.offload import OffloadEngine
from offrecomp.trace import RUN, OpRecorder, ServingMode, build_structure

#: Saves per region call in the offload variant by default (the amortisation the target
#: names); a run at 4 and one at 64 split the figure into per-storage and per-group costs.
REGION_SAVES = 16


class _Chain(nn.Module):
    def __init__(self, ops: int, buffers: int = 0) -> None:
        super().__init__()
        self.ops = ops
        for i in range(buffers):  # as BatchNorm layers hold (three each)
            self.register_buffer(f"b{i}", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.ops):
            x = torch.tanh(x)
        return x


class _Model(nn.Module):
    """Chains (regions, two by default) behind a scale with a parameter, so that backward
    runs."""

    def __init__(self, ops: int, buffers: int = 0, blocks: int = 2) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(16))
        sizes = [ops // blocks + (i < ops % blocks) for i in range(blocks)]
        self.blocks = nn.ModuleList([_Chain(k, buffers) for k in sizes])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.w
        for b in self.blocks:
            x = b(x)
        return x.sum()


class _GroupedFloor:
    """The least a grouped offload hook pair does per save in Python, its copies left
    out: pack detaches the save into its region call's list (a new list at each block's
    forward) and returns the list and an index; unpack indexes it. No check, record or
    accounting: the floor the runtime's offload figure is read against."""

    def __init__(self, model: _Model) -> None:
        self._group: list[torch.Tensor] | None = None
        for block in model.blocks:
            block.register_forward_pre_hook(self._enter)
            block.register_forward_hook(self._exit)

    def _enter(self, module: nn.Module, args: Any) -> None:
        self._group = []

    def _exit(self, module: nn.Module, args: Any, out: Any) -> None:
        self._group = None

    def pack(self, t: torch.Tensor) -> tuple[Any, int]:
        group = self._group
        if group is None:  # saved outside the blocks
            return t.detach(), -1
        group.append(t.detach())
        return group, len(group) - 1

    def unpack(self, h: tuple[Any, int]) -> torch.Tensor:
        group, i = h
        return group if i < 0 else group[i]


class _GroupedCopies(_GroupedFloor):
    """The least a grouped offload hook pair does with its copies: at each block's exit
    the saves' storages (each once) are copied with one call into a host block of the
    block's own, kept from step to step with its slot views; in backward the first
    unpack of a group copies the block back into one buffer, and each unpack hands out
    one view of it. No check, record, ordering event, side stream or accounting, so a
    lower bound for any Python pair that moves the bytes (the runtime's figure minus
    this one is what its checks, ordering and books cost)."""

    def __init__(self, model: _Model) -> None:
        super().__init__(model)
        self._blocks: dict[tuple[Any, ...], tuple[torch.Tensor, list[int], list[torch.Tensor]]] = {}

    def _exit(self, module: nn.Module, args: Any, out: Any) -> None:
        saved, self._group = self._group, None
        if not saved:
            return
        slots: dict[int, int] = {}
        sources: list[torch.Tensor] = []
        index = []
        for t in saved:
            ptr = t.untyped_storage().data_ptr()
            slot = slots.get(ptr)
            if slot is None:
                slot = slots[ptr] = len(sources)
                sources.append(t)
            index.append(slot)
        key = (id(module), *((s.shape, s.dtype) for s in sources))
        block = self._blocks.get(key)
        if block is None:
            offsets, end = [], 0
            for s in sources:
                offsets.append(end)
                end += -(-s.untyped_storage().nbytes() // 512) * 512
            host = torch.empty(end, dtype=torch.uint8, pin_memory=sources[0].is_cuda)
            views = [host[o : o + s.nbytes].view(s.dtype).view(s.shape) for o, s in zip(offsets, sources)]
            block = self._blocks[key] = (host, offsets, views)
        torch._foreach_copy_(block[2], sources, non_blocking=True)
        device = sources[0].device
        # the list the handles hold becomes the group: its host block, slots and layout
        saved[:] = [block, index, [(s.dtype, s.stride()) for s in sources], device, None, 0]

    def unpack(self, h: tuple[Any, int]) -> torch.Tensor:
        group, i = h
        if i < 0:
            return group  # type: ignore[no-any-return]
        (host, offsets, views), index, layouts, device, buffer, uses = group
        if buffer is None:
            buffer = group[4] = host.to(device, non_blocking=True)
        slot = index[i]
        dtype, stride = layouts[slot]
        t = buffer.view(dtype).as_strided(views[slot].shape, stride, offsets[slot] // dtype.itemsize)
        group[5] = uses = uses + 1
        if uses == len(index):
            group[4] = None
        return t


class _Bare(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


#: The clocks a figure can be read on: wall time, or the calling thread's CPU time (what
#: the host spends, blind to other processes on a shared machine and to device waits).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "thread": time.thread_time}


def _seconds(fn: Callable[[], Any], device: torch.device, clock: Callable[[], float]) -> float:
    """Time of ``fn`` on ``clock``, from an idle device to an idle device."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = clock()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return clock() - t0


class _GcTime:
    """A ``gc.callbacks`` entry: the time collections take, by the variant running."""

    def __init__(self) -> None:
        self.variant = ""
        self.seconds: dict[str, float] = {}
        self.full: dict[str, int] = {}  # full (generation 2) collections, by variant
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds[self.variant] = self.seconds.get(self.variant, 0.0) + time.perf_counter() - self._start
            if info["generation"] == 2:
                self.full[self.variant] = self.full.get(self.variant, 0) + 1


class _EmulatedWork:
    """The main thread's CPU time in the emulated backend's device work, by the variant
    running: the side-stream jobs it runs itself while it waits on them, and the device
    buffers it allocates (filled with poison bytes)."""

    def __init__(self) -> None:
        self.variant = ""
        self.seconds: dict[str, float] = {}
        self._main = threading.main_thread()

    def install(self) -> Callable[[], None]:
        """Wrap the backend's job runner and device allocation; returns the undo."""
        from offrecomp.backends import EmulatedBackend

        run, alloc = EmulatedBackend._run, EmulatedBackend.alloc_device

        def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if threading.current_thread() is not self._main:
                    return fn(*args, **kwargs)
                start = time.thread_time()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.seconds[self.variant] = self.seconds.get(self.variant, 0.0) + time.thread_time() - start
            return wrapper

        EmulatedBackend._run = timed(run)  # type: ignore[method-assign]
        EmulatedBackend.alloc_device = timed(alloc)  # type: ignore[method-assign]

        def undo() -> None:
            EmulatedBackend._run = run  # type: ignore[method-assign]
            EmulatedBackend.alloc_device = alloc  # type: ignore[method-assign]

        return undo


@contextlib.contextmanager
def reload_path() -> Iterator[None]:
    """Offload reloads every group inside (``OffloadEngine.serve_held`` off, put back
    after): see the module's docstring."""
    serving = OffloadEngine.serve_held
    OffloadEngine.serve_held = False
    try:
        yield
    finally:
        OffloadEngine.serve_held = serving


def main(argv: list[str] | None = None) -> int:
    """The benchmark, on the reload path (``reload_path``)."""
    with reload_path():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=200, help="ops (and saves) per step (default 200)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=20, help="timings per variant per round (median)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    ap.add_argument("--region-saves", type=int, default=REGION_SAVES,
                    help=f"saves per region in the offload variant (default {REGION_SAVES})")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.freeze() after the warm-up, as a training loop may (docs/tuning.md)")
    ap.add_argument("--clock", default="wall", help="wall (default) or thread: the main thread's CPU time")
    ap.add_argument("--emulated-split", action="store_true",
                    help="add the part of each figure that is the emulated backend's device work")
    ap.add_argument("--out", type=out_file(), help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.ops < 2 or args.rounds < 1 or args.reps < 1 or args.region_saves < 1:
        ap.error(
            f"--ops {args.ops}, --rounds {args.rounds}, --reps {args.reps}, --region-saves "
            f"{args.region_saves}: need ops >= 2 and rounds, reps, region saves >= 1"
        )
    if args.clock not in CLOCKS:
        ap.error(f"--clock {args.clock!r} is invalid; accepted: {', '.join(CLOCKS)}")
    clock = CLOCKS[args.clock]
    device = parse_device(ap, args.device)
    n = args.ops
    torch.manual_seed(0)
    model = _Model(n).to(device)
    x = torch.randn(16, device=device)

    def step() -> None:
        model(x).backward()

    def identity_hooks() -> None:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            step()

    def keep_loop(m: nn.Module, mode: str = "keep", **kw: Any) -> Callable[[], None]:
        """``--reps`` steps of ``m`` inside its runtime, entered once, as around a loop."""
        rt = offrecomp.runtime(m, mode=mode, min_bytes=0, **kw)

        def run() -> None:
            with rt:
                for _ in range(args.reps):
                    m(x).backward()

        return run

    def small_regions() -> _Model:
        """A model of regions of ``--region-saves`` saves, on the device."""
        return _Model(n, blocks=max(1, n // args.region_saves)).to(device)

    keep = keep_loop(model)
    keep_buffered = keep_loop(_Model(n, buffers=12).to(device))
    keep_hooked = keep_loop(model, native_keep=False)
    grouped = small_regions()
    offload = keep_loop(grouped, mode="offload")
    recompute = keep_loop(small_regions(), mode="recompute")
    auto_model = small_regions()
    auto_rt = offrecomp.runtime(auto_model, mode="auto", min_bytes=0)  # an ample budget

    def auto() -> None:
        with auto_rt:
            for _ in range(args.reps):
                auto_model(x).backward()

    def grouped_plain() -> None:
        grouped(x).backward()

    floor_model = small_regions()
    floor_pair = _GroupedFloor(floor_model)

    def grouped_floor() -> None:
        with torch.autograd.graph.saved_tensors_hooks(floor_pair.pack, floor_pair.unpack):
            floor_model(x).backward()

    copies_model = small_regions()
    copies_pair = _GroupedCopies(copies_model)

    def grouped_copies() -> None:
        with torch.autograd.graph.saved_tensors_hooks(copies_pair.pack, copies_pair.unpack):
            copies_model(x).backward()

    grouped_floor()  # the floors compute what plain does
    grouped_copies()
    grouped_plain()
    for name, m in (("grouped floor", floor_model), ("grouped pair with copies", copies_model)):
        if not torch.equal(m.w.grad, grouped.w.grad):
            raise RuntimeError(f"the {name}'s gradient differs from plain's")

    saves = [0]

    def count(t: torch.Tensor) -> torch.Tensor:
        saves[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        step()

    chain = _Chain(n)

    def ops_plain() -> None:
        chain(x)

    def ops_bare() -> None:
        with _Bare():
            chain(x)

    def ops_recorder() -> OpRecorder:
        rec = OpRecorder(use_cuda_events=False, cuda_devices=())
        rec.start()
        try:
            chain(x)
        finally:
            rec.stop()
        return rec

    rec = ops_recorder()
    structure = build_structure(rec, [], [], [], [], rec.op_seconds(), 0.0)
    program = [RUN] * len(structure.op_names)

    def ops_serving() -> None:
        with ServingMode(region_name="chain", structure=structure, program=program, storage_tensors={}):
            chain(x)

    per_step: dict[str, Callable[[], Any]] = {
        "plain step": step,
        "plain step, small regions": grouped_plain,
        "identity hooks": identity_hooks,
        "grouped floor": grouped_floor,
        "grouped copies": grouped_copies,
        "ops plain": ops_plain,
        "bare dispatch mode": ops_bare,
        "replay dispatch mode": ops_serving,
        "op recorder": ops_recorder,
    }
    for fn in per_step.values():  # warm up
        fn()
    keep()
    keep_buffered()
    keep_hooked()
    offload()
    recompute()
    auto()  # measure, calibrate, solve: later steps run the plan
    # A full collection runs once the objects promoted since the last one reach a quarter
    # of the heap: collected here, the import's and warm-up's promotions do not set one
    # off inside whichever variant happens to allocate next.
    gc.collect()
    if args.gc_freeze:
        gc.freeze()  # full collections then walk only what the steps allocate
    loops = {
        "offrecomp keep": keep,
        "offrecomp keep, buffers": keep_buffered,
        "offrecomp keep, hooks on": keep_hooked,
        "offrecomp offload": offload,
        "offrecomp recompute": recompute,
        "offrecomp auto": auto,
    }
    samples: dict[str, list[float]] = {k: [] for k in [*per_step, *loops]}
    collecting = _GcTime()
    emulated = _EmulatedWork()
    undo = emulated.install() if args.emulated_split else None
    gc.callbacks.append(collecting)
    try:
        for r in range(args.rounds):
            for name, fn in per_step.items():
                collecting.variant = emulated.variant = name
                samples[name].append(statistics.median(_seconds(fn, device, clock) for _ in range(args.reps)))
            # the runtime entered once around the round's steps, as around a loop
            for name, fn in loops.items():
                collecting.variant = emulated.variant = name
                samples[name].append(_seconds(fn, device, clock) / args.reps)
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    finally:
        gc.callbacks.remove(collecting)
        if undo is not None:
            undo()
        if args.gc_freeze:
            gc.unfreeze()
    steps = args.rounds * args.reps
    gc_us = {k: collecting.seconds.get(k, 0.0) / steps * 1e6 for k in samples}
    med = {k: statistics.median(v) for k, v in samples.items()}
    low = {k: min(v) for k, v in samples.items()}  # the round least disturbed by other work
    us = 1e6
    small = f"offrecomp offload, {args.region_saves} saves per region"
    spec = [  # (kind, row, variant, its baseline, count)
        ("per saved tensor", "identity hook pair (floor)", "identity hooks", "plain step", saves[0]),
        ("per saved tensor", "offrecomp keep", "offrecomp keep", "plain step", saves[0]),
        ("per saved tensor", "offrecomp keep, 12 buffers per region", "offrecomp keep, buffers", "plain step", saves[0]),
        ("per saved tensor", "offrecomp keep, hooks on", "offrecomp keep, hooks on", "plain step", saves[0]),
        ("per saved tensor", "grouped hook pair, no copies (floor)", "grouped floor", "plain step, small regions",
         saves[0]),
        ("per saved tensor", "grouped hook pair, copies (lean bound)", "grouped copies",
         "plain step, small regions", saves[0]),
        ("per saved tensor", small, "offrecomp offload", "plain step, small regions", saves[0]),
        ("per saved tensor", f"offrecomp recompute, {args.region_saves} per region, replays", "offrecomp recompute",
         "plain step, small regions", saves[0]),
        ("per saved tensor", f"offrecomp auto, {args.region_saves} per region, kept", "offrecomp auto",
         "plain step, small regions", saves[0]),
        ("per op", "bare dispatch mode (floor)", "bare dispatch mode", "ops plain", n),
        ("per op", "replay dispatch mode, every op run", "replay dispatch mode", "ops plain", n),
        ("per op", "op recorder (measuring pass)", "op recorder", "ops plain", n),
    ]
    rows = [(kind, name, (med[v] - med[b]) / k * us, (low[v] - low[b]) / k * us) for kind, name, v, b, k in spec]
    # every variant runs rounds x reps steps
    emu_us = {
        name: emulated.seconds.get(v, 0.0) / (args.rounds * args.reps) / k * us for _, name, v, _, k in spec
    }
    print(
        f"{saves[0]} saves and {n} ops per step, device {device}, torch {torch.__version__}, "
        f"{args.rounds} interleaved rounds of {args.reps} timings, {args.clock} clock"
        + (", gc frozen" if args.gc_freeze else "")
    )
    op_us = med["ops plain"] / n * us
    print(f"plain: {med['plain step'] * 1e3:.3f} ms per step, {op_us:.2f} us per op")
    split = f"{'emulated':>10s}" if args.emulated_split else ""
    print(f"{'':18s}{'variant':42s}{'us over plain':>14s}{'(fastest round)':>17s}{'plain ops':>10s}"
          f"{'gc us/step':>12s}{'full gc':>8s}{split}")
    for (kind, name, v, lo), (_, _, variant, _, _) in zip(rows, spec):
        part = f"{emu_us[name]:10.2f}" if args.emulated_split else ""
        print(f"{kind:18s}{name:42s}{v:14.2f}{lo:17.2f}{v / op_us:10.1f}{gc_us[variant]:12.0f}"
              f"{collecting.full.get(variant, 0):8d}{part}")
    print("plain ops: the figure over one plain op's time (a forward op of the chain, 'us per op' "
          "above): hosts of other speeds compare by it better than by microseconds")
    print(f"gc us/step: time in Python's collections per step of the variant (plain steps: "
          f"{gc_us['plain step']:.0f}); full gc: how many of them walked the whole heap, in all "
          f"{steps} steps (one takes about 0.1 s here; it lands in one round, so medians skip it)")
    if args.emulated_split:
        print("emulated: of the figure, the main thread's time in the emulated backend's device work "
              "(jobs it ran while waiting, device buffers): a mean over every round, not a median")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "device": str(device),
                    "torch": torch.__version__,
                    "saves": saves[0],
                    "ops": n,
                    "rounds": args.rounds,
                    "clock": args.clock,
                    "region_saves": args.region_saves,
                    "gc_freeze": args.gc_freeze,
                    "median_seconds": med,
                    "min_seconds": low,
                    "us_over_plain": {f"{k}: {name}": v for k, name, v, _ in rows},
                    "plain_op_us": op_us,
                    "us_over_plain_fastest_round": {f"{k}: {name}": lo for k, name, _, lo in rows},
                    "gc_us_per_step": gc_us,
                    "full_collections": collecting.full,
                    "emulated_device_work_us": {f"{k}: {name}": emu_us[name] for k, name, _, _ in rows}
                    if args.emulated_split else None,
                    "auto_phases": sorted({s.phase for s in auto_rt.report().steps}),
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
