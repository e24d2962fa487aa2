"""The harness: interleaved timing, allocator memory, and the longest-sequence search."""

# NOTE [Interleaving]
# Strategies run round-robin in one process: after each strategy's warm-up, every repeat
# visits every strategy once (the visiting order rotates by one each round), so a slow
# spell of the machine lands on all of them alike. Each visit enters the strategy's
# runner, runs one timed step, and exits; the runner itself lives for all visits at one
# sequence length, so what a strategy learned stays. Ratios are medians over those timed
# steps divided by the median of ``none`` at the same sequence length.
#
# NOTE [Memory]
# Memory is read from the allocator, never from RSS. On CUDA: ``memory_allocated`` before
# the step, after forward, and ``max_memory_allocated`` after a peak reset. On CPU the
# allocator's ``[memory]`` events of one profiled step are summed in start-time order.
# Both report bytes above the memory held before the step (weights, optimizer state):
# ``peak`` is the highest point of the whole step (forward, backward, optimizer), ``act``
# what is still allocated when forward returns (what the strategy keeps for backward).

from __future__ import annotations

import contextlib
import gc
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .models import ModelSpec, blocks_of, build_model, make_batch
from .strategies import NotApplicable, Options, PrepareContext, Runner, Strategy, get_strategies

__all__ = [
    "BenchConfig",
    "BenchResult",
    "Probe",
    "Row",
    "SearchRow",
    "count_saved_bytes",
    "longest_fitting",
    "run_benchmark",
    "step_flops",
]

Batch = tuple[torch.Tensor, torch.Tensor]
ProgressFn = Callable[[str], None]


@dataclass(kw_only=True)
class BenchConfig:
    """One benchmark run. Sizes in tokens or bytes as named."""

    spec: ModelSpec
    seqs: tuple[int, ...]
    batch: int
    device: torch.device
    amp_dtype: torch.dtype | None = None
    """Autocast dtype for forward (``torch.bfloat16`` on GPU); ``None`` runs fp32."""
    strategies: tuple[str, ...] | None = None
    """Strategy names; ``None`` runs all of them."""
    options: Options = field(default_factory=Options)
    warmup: int = 1
    """Untimed steps per strategy before the timed rounds (raised to a runner's floor)."""
    repeats: int = 3
    """Timed rounds; every round times one step of every strategy."""
    mem_budget_bytes: int | None = None
    """Budget of the longest-sequence search (step peak above resting memory); None: no search."""
    search_start: int = 256
    search_max: int = 4096
    search_quantum: int = 64
    peak_tflops: float | None = None
    """Device peak for MFU; None leaves MFU empty."""
    max_seconds: float | None = None
    """Stop starting new work after this long; what was skipped is noted."""
    lr: float = 1e-5
    seed: int = 0


@dataclass(kw_only=True)
class Row:
    """One (strategy, sequence length) cell of the comparison."""

    strategy: str
    seq: int
    status: str = "ok"
    step_seconds: list[float] = field(default_factory=list)
    median_ms: float | None = None
    ratio_vs_none: float | None = None
    tokens_per_s: float | None = None
    peak_bytes: int | None = None
    act_bytes: int | None = None
    mfu: float | None = None
    d2h_gbps: float | None = None
    h2d_gbps: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class Probe:
    seq: int
    fits: bool
    peak_bytes: int | None
    note: str = ""


@dataclass(kw_only=True)
class SearchRow:
    strategy: str
    status: str = "ok"
    longest_seq: int | None = None
    capped: bool = False
    """True when the search stopped at ``search_max`` without finding the limit."""
    probes: list[Probe] = field(default_factory=list)


@dataclass(kw_only=True)
class BenchResult:
    rows: list[Row]
    search: list[SearchRow]
    notes: list[str]
    meta: dict[str, Any]
    plain_saved_bytes: dict[int, int]
    elapsed_s: float


@dataclass
class _Sample:
    seconds: float
    peak_bytes: int | None = None
    act_bytes: int | None = None
    phase: str | None = None


_MEMORY_TRIES = 3


class _OutOfTime(Exception):
    pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:300]


@contextlib.contextmanager
def _without_profiler_chatter() -> Iterator[None]:
    """Drop the lines kineto writes to fd 2 on every profiler start/stop; keep the rest.

    Kineto logs from C++ straight to file descriptor 2 (whatever ``sys.stderr`` is), so
    the descriptor is pointed at a temporary file for the duration, and the lines that
    are not kineto's (warnings) are written to ``sys.stderr`` afterwards.
    """
    fd = 2
    try:
        saved = os.dup(fd)
    except OSError:
        yield
        return
    for stream in (sys.stderr, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()  # type: ignore[union-attr]
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            for stream in (sys.stderr, sys.__stderr__):
                with contextlib.suppress(Exception):
                    stream.flush()  # type: ignore[union-attr]
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            kept = [
                line
                for line in tmp.read().decode(errors="replace").splitlines(keepends=True)
                if not line.startswith(("USDT:", "INFO:", "STAGE:"))
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def count_saved_bytes(model: nn.Module, batch: Batch, amp: Callable[[], Any]) -> int:
    """Bytes of distinct non-parameter storages autograd saves in one plain forward.

    The forward runs under a counting ``saved_tensors_hooks`` pair and is never followed
    by backward. Saved tensors are held until the forward ends so that a freed address
    reused by a later allocation is not mistaken for a storage already counted.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    held: list[torch.Tensor] = []
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> None:
        nonlocal total
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in params or ptr in seen:
            return None
        seen.add(ptr)
        held.append(t)
        total += storage.nbytes()
        return None

    def unpack(_: None) -> torch.Tensor:
        raise RuntimeError("count_saved_bytes runs forward only")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack), amp():
        loss = model(*batch)
    del loss
    held.clear()
    return total


def step_flops(spec: ModelSpec, matmul_params: int, batch: int, seq: int) -> float:
    """Model FLOPs of one training step: ``6*N*tokens`` plus causal attention.

    Attention scores and the weighted sum cost ``4*b*s^2*h`` per layer in forward; a
    causal mask halves that and backward doubles forward, so ``6*L*b*s^2*h`` in all.
    Recomputation is not counted (MFU counts model FLOPs only).
    """
    tokens = batch * seq
    return 6.0 * matmul_params * tokens + 6.0 * spec.n_layers * batch * seq * seq * spec.hidden


def matmul_params(model: nn.Module) -> int:
    """Weights used in a matrix product per token: 2-D weights outside embeddings."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            continue
        weight = getattr(module, "weight", None)
        if isinstance(weight, nn.Parameter) and weight.dim() == 2 and id(weight) not in seen:
            seen.add(id(weight))
            total += weight.numel()
    return total


def longest_fitting(
    fits: Callable[[int], bool], *, start: int, cap: int, quantum: int = 64
) -> tuple[int, bool]:
    """Longest multiple of ``quantum`` up to ``cap`` for which ``fits`` holds.

    Doubles from ``start`` until a length does not fit (or ``cap`` is passed), then
    binary-searches between the last fit and the first failure. Assumes ``fits`` is
    monotone. Returns ``(longest, capped)``: ``longest`` is 0 when not even ``quantum``
    fits; ``capped`` is True when ``cap`` itself fits.
    """
    start = max(quantum, start // quantum * quantum)
    cap = max(quantum, cap // quantum * quantum)
    lo, hi = 0, None  # lo fits (0 trivially), hi does not
    s = min(start, cap)
    while True:
        if fits(s):
            lo = s
            if s >= cap:
                return cap, True
            s = min(2 * s, cap)
        else:
            hi = s
            break
    while hi - lo > quantum:
        mid = (lo + hi) // 2 // quantum * quantum
        if mid <= lo:
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, False


class _Harness:
    def __init__(self, cfg: BenchConfig, progress: ProgressFn) -> None:
        self.cfg = cfg
        self.device = cfg.device
        self.progress = progress
        self.start = time.perf_counter()
        self.notes: list[str] = []
        self.warmups: dict[str, int] = {}  # untimed steps each strategy got (its floor, or --warmup)
        max_seq = max([*cfg.seqs, cfg.search_max if cfg.mem_budget_bytes else 0])
        self.spec = cfg.spec.with_max_seq(max_seq)
        self.model = build_model(self.spec, self.device)
        self.matmul_params = matmul_params(self.model)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, fused=True if self.device.type == "cuda" else None
        )
        self.strategies = get_strategies(
            list(cfg.strategies) if cfg.strategies else None, cfg.options
        )
        self.plain_saved: dict[int, int] = {}

    # -- plumbing ------------------------------------------------------------------------

    def amp(self) -> Any:
        if self.cfg.amp_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.cfg.amp_dtype)

    def check_time(self) -> None:
        limit = self.cfg.max_seconds
        if limit is not None and time.perf_counter() - self.start > limit:
            raise _OutOfTime

    def cleanup(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def batch(self, seq: int) -> Batch:
        return make_batch(self.spec, self.cfg.batch, seq, self.device, seed=self.cfg.seed + 1)

    def saved_bytes(self, seq: int) -> int:
        if seq not in self.plain_saved:
            self.plain_saved[seq] = count_saved_bytes(self.model, self.batch(seq), self.amp)
            self.cleanup()
        return self.plain_saved[seq]

    def saved_bytes_estimate(self, seq: int) -> tuple[int, str]:
        """Counted where the plain forward fits, else scaled linearly from the longest counted."""
        try:
            return self.saved_bytes(seq), ""
        except Exception as exc:
            if not _is_oom(exc) or not self.plain_saved:
                raise
        # NOTE [Cleanup after OOM]: outside the except block, so that the exception and
        # the frames (and tensors) its traceback holds are gone before memory is released.
        self.cleanup()
        ref = max(self.plain_saved)
        return self.plain_saved[ref] * seq // ref, f"plain saved bytes scaled from seq {ref}"

    # -- one step ------------------------------------------------------------------------

    def step(self, runner: Runner, batch: Batch, *, measure_memory: bool) -> _Sample:
        """One training step. CUDA memory is read on every step, CPU memory when asked."""
        if self.device.type == "cpu" and measure_memory:
            return self._profiled_cpu_step(runner, batch)
        cuda = self.device.type == "cuda"
        before = 0
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
        _sync(self.device)
        t0 = time.perf_counter()
        with self.amp():
            loss = runner.forward(*batch)
        act = torch.cuda.memory_allocated(self.device) - before if cuda else None
        runner.backward(loss)
        del loss
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        _sync(self.device)
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated(self.device) - before if cuda else None
        return _Sample(seconds, peak, act)

    def _profiled_cpu_step(self, runner: Runner, batch: Batch) -> _Sample:
        from torch.autograd.profiler import record_function
        from torch.profiler import ProfilerActivity, profile

        gc.collect()  # earlier garbage freed inside the window would count against the step
        t0 = time.perf_counter()
        with (
            _without_profiler_chatter(),
            profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
        ):
            with record_function("long_seq::forward"), self.amp():
                loss = runner.forward(*batch)
            runner.backward(loss)
            del loss
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - t0  # profiled: reported for information only
        events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
        fwd_end = max((e.end_ns() for e in events if e.name() == "long_seq::forward"), default=None)
        mem = sorted(
            (e.start_ns(), e.nbytes())
            for e in events
            if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
        )
        level = peak = 0
        at_fwd_end = 0
        for start_ns, nbytes in mem:
            level += nbytes
            peak = max(peak, level)
            if fwd_end is not None and start_ns <= fwd_end:
                at_fwd_end = level
        return _Sample(seconds, peak, at_fwd_end)

    # -- the comparison ------------------------------------------------------------------

    def compare(self, seq: int, rows: dict[tuple[str, int], Row]) -> None:
        cfg = self.cfg
        batch = self.batch(seq)
        runners: dict[str, Runner] = {}
        for strat in self.strategies:
            row = rows[(strat.name, seq)]
            ok, why = strat.available(self.device)
            if not ok:
                row.status = why
                continue
            failed = False
            try:
                self.check_time()
                plain = self.saved_bytes(seq) if strat.needs_plain_bytes else None
                runners[strat.name] = strat.prepare(
                    self.model, PrepareContext(device=self.device, seq=seq, plain_saved_bytes=plain)
                )
            except _OutOfTime:
                row.status = "skipped: --max-seconds reached"
            except NotApplicable as exc:
                row.status = str(exc)
            except Exception as exc:
                row.status = "oom" if _is_oom(exc) else f"failed: {_short(exc)}"
                failed = True
            if failed:
                self.cleanup()  # NOTE [Cleanup after OOM]
        samples: dict[str, list[_Sample]] = {name: [] for name in runners}

        def visit(name: str, steps: int, timed: bool) -> None:
            runner = runners[name]
            row = rows[(name, seq)]
            failed = False
            try:
                self.check_time()
                gc.collect()
                runner.enter()
                try:
                    for _ in range(steps):
                        self.step(runner, batch, measure_memory=False)
                    if timed:
                        sample = self.step(runner, batch, measure_memory=False)
                        sample.phase = runner.last_step_phase()
                        samples[name].append(sample)
                finally:
                    runner.exit()
            except _OutOfTime:
                row.status = "skipped: --max-seconds reached"
                runners.pop(name).close()
            except Exception as exc:
                row.status = "oom" if _is_oom(exc) else f"failed: {_short(exc)}"
                failed = True
            if failed:
                runners.pop(name).close()
                self.cleanup()  # NOTE [Cleanup after OOM]
            self.progress(f"{name} @ {seq}")

        for name in list(runners):
            self.warmups[name] = max(cfg.warmup, runners[name].warmup_floor)
            visit(name, self.warmups[name], timed=False)
        order = list(runners)
        for r in range(cfg.repeats):
            shift = r % len(order) if order else 0
            for name in order[shift:] + order[:shift]:
                if name in runners:
                    visit(name, 0, timed=True)

        for name, runner in list(runners.items()):
            row = rows[(name, seq)]
            if self.device.type == "cpu":
                failed = False
                try:
                    self.check_time()
                    runner.enter()
                    try:
                        # A step in which offrecomp went back to measuring (full recompute)
                        # does not show its plan's memory: take the next one instead.
                        for _ in range(_MEMORY_TRIES):
                            mem = self.step(runner, batch, measure_memory=True)
                            if runner.last_step_phase() != "measure":
                                break
                    finally:
                        runner.exit()
                    row.peak_bytes, row.act_bytes = mem.peak_bytes, mem.act_bytes
                except _OutOfTime:
                    self.notes.append(f"{name} @ {seq}: memory not measured (--max-seconds)")
                except Exception as exc:
                    row.status = f"failed: {_short(exc)}"
                    failed = True
                if failed:
                    self.cleanup()  # NOTE [Cleanup after OOM]
                self.progress(f"{name} @ {seq} memory")
            else:
                got = [s for s in samples[name] if s.phase != "measure"] or samples[name]
                if got:
                    row.peak_bytes = max(s.peak_bytes or 0 for s in got)
                    row.act_bytes = max(s.act_bytes or 0 for s in got)
            try:
                row.extras = runner.extras()
            except Exception as exc:
                row.extras = {"extras_error": _short(exc)}
            runner.close()
            row.step_seconds = [s.seconds for s in samples[name]]
            phases = [s.phase for s in samples[name]]
            if any(phases):
                row.extras["timed_phases"] = phases
                measured = sum(1 for p in phases if p == "measure")
                if measured and row.status == "ok":
                    row.status = f"ok; {measured} of {len(phases)} timed steps re-measured"
        self._fill(seq, rows)
        self.cleanup()

    def _fill(self, seq: int, rows: dict[tuple[str, int], Row]) -> None:
        tokens = self.cfg.batch * seq
        flops = step_flops(self.spec, self.matmul_params, self.cfg.batch, seq)
        base = rows.get(("none", seq))
        base_ms = base.median_ms if base is not None else None
        for strat in self.strategies:
            row = rows[(strat.name, seq)]
            if row.step_seconds:
                med = statistics.median(row.step_seconds)
                row.median_ms = med * 1e3
                row.tokens_per_s = tokens / med
                if self.cfg.peak_tflops:
                    row.mfu = flops / med / (self.cfg.peak_tflops * 1e12)
            if row.status == "ok" and not row.step_seconds:
                row.status = "failed: no timed step"
            if strat.name == "none":
                base_ms = row.median_ms
            if row.median_ms is not None and base_ms:
                row.ratio_vs_none = row.median_ms / base_ms
            for key in ("d2h_gbps", "h2d_gbps"):
                value = row.extras.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    setattr(row, key, float(value))

    # -- longest sequence ----------------------------------------------------------------

    def search(self, strat: Strategy, progress: ProgressFn) -> SearchRow:
        cfg = self.cfg
        budget = cfg.mem_budget_bytes
        if budget is None:
            raise ValueError("the longest-sequence search needs mem_budget_bytes")
        out = SearchRow(strategy=strat.name)
        ok, why = strat.available(self.device)
        if not ok:
            out.status = why
            return out

        def fits(seq: int) -> bool:
            self.check_time()
            note = ""
            plain = None
            if strat.needs_plain_bytes:
                plain, note = self.saved_bytes_estimate(seq)
            batch = self.batch(seq)
            peak = 0
            result = False
            oom = False
            try:
                runner = strat.prepare(
                    self.model, PrepareContext(device=self.device, seq=seq, plain_saved_bytes=plain)
                )
                floor = runner.warmup_floor if runner.search_floor is None else runner.search_floor
                try:
                    runner.enter()
                    try:
                        for _ in range(floor + 1):
                            sample = self.step(runner, batch, measure_memory=True)
                            peak = max(peak, sample.peak_bytes or 0)
                    finally:
                        runner.exit()
                finally:
                    runner.close()
                result = peak <= budget
                out.probes.append(Probe(seq=seq, fits=result, peak_bytes=peak, note=note))
            except Exception as exc:
                if not _is_oom(exc):
                    raise
                oom = True
            del batch
            if oom:
                self.cleanup()  # NOTE [Cleanup after OOM]
                out.probes.append(Probe(seq=seq, fits=False, peak_bytes=None, note="oom"))
            progress(f"{strat.name}: seq {seq} {'fits' if result else 'does not fit'}")
            return result

        try:
            out.longest_seq, out.capped = longest_fitting(
                fits, start=cfg.search_start, cap=cfg.search_max, quantum=cfg.search_quantum
            )
        except _OutOfTime:
            out.status = "skipped: --max-seconds reached"
        except NotApplicable as exc:
            out.status = str(exc)
        except Exception as exc:
            out.status = f"failed: {_short(exc)}"
        self.cleanup()  # NOTE [Cleanup after OOM]
        return out


def run_benchmark(
    cfg: BenchConfig,
    progress: ProgressFn | None = None,
    search_progress: ProgressFn | None = None,
) -> BenchResult:
    """Run the interleaved comparison at every ``cfg.seqs`` and, with a budget, the search.

    ``progress`` is called once per strategy visit; ``search_progress`` once per probe.
    """
    tick = progress or (lambda _msg: None)
    harness = _Harness(cfg, tick)
    rows: dict[tuple[str, int], Row] = {
        (s.name, seq): Row(strategy=s.name, seq=seq) for seq in cfg.seqs for s in harness.strategies
    }
    for seq in cfg.seqs:
        harness.compare(seq, rows)
    if cfg.device.type == "cpu" and any(
        r.status.startswith("ok") and r.extras.get("median_offloaded_bytes") for r in rows.values()
    ):
        harness.notes.append(
            "on CPU the 'host' copies of offloaded activations live in the same memory the "
            "allocator figures count, so offload cannot lower them here (run on a GPU)"
        )
    search: list[SearchRow] = []
    if cfg.mem_budget_bytes is not None:
        for strat in harness.strategies:
            search.append(harness.search(strat, search_progress or (lambda _msg: None)))
    if any(r.status.startswith("skipped: --max") for r in rows.values()) or any(
        s.status.startswith("skipped: --max") for s in search
    ):
        harness.notes.append(f"--max-seconds={cfg.max_seconds:g} reached; some work was skipped")
    meta = {
        "model": {**vars(harness.spec)},
        "params": harness.n_params,
        "matmul_params": harness.matmul_params,
        "blocks": len(blocks_of(harness.model)),
        "batch": cfg.batch,
        "seqs": list(cfg.seqs),
        "dtype": "fp32" if cfg.amp_dtype is None else f"{cfg.amp_dtype} autocast",
        "warmup": cfg.warmup,
        "warmups": dict(harness.warmups),
        "repeats": cfg.repeats,
        "mem_budget_bytes": cfg.mem_budget_bytes,
        "peak_tflops": cfg.peak_tflops,
        "strategies": {s.name: s.summary for s in harness.strategies},
    }
    return BenchResult(
        rows=list(rows.values()),
        search=search,
        notes=harness.notes,
        meta=meta,
        plain_saved_bytes=dict(harness.plain_saved),
        elapsed_s=time.perf_counter() - harness.start,
    )
