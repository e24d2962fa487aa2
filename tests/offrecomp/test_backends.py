"""Backends: selection, import hygiene, and the emulated backend's stream semantics."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from offrecomp.backends import CudaBackend, EmulatedBackend, get_backend


def test_get_backend_picks_by_device_type() -> None:
    assert isinstance(get_backend("cpu"), EmulatedBackend)
    assert isinstance(get_backend(torch.device("cuda", 0)), CudaBackend)
    assert get_backend("cuda").name == "cuda"
    with pytest.raises(ValueError, match="accepted: cuda, cpu"):
        get_backend("meta")


def test_import_and_construction_do_not_touch_cuda() -> None:
    # Every torch.cuda entry point that would initialise CUDA, create a stream or pin
    # memory raises; importing the modules, building a CUDA backend and an engine on it
    # must not reach any of them.
    script = textwrap.dedent(
        """
        import torch

        def boom(*args, **kwargs):
            raise AssertionError("CUDA touched")

        for name in ("init", "_lazy_init", "current_stream", "synchronize", "Stream",
                     "Event", "set_device", "device_count", "is_available"):
            setattr(torch.cuda, name, boom)
        real_empty = torch.empty

        def empty(*args, **kwargs):
            assert not kwargs.get("pin_memory"), "memory pinned"
            return real_empty(*args, **kwargs)

        torch.empty = empty

        import offrecomp.backends, offrecomp.pool, offrecomp.offload
        from offrecomp.config import Prefetch

        backend = offrecomp.backends.get_backend("cuda")
        engine = offrecomp.offload.OffloadEngine(
            backend=backend, host_limit_bytes=1 << 30, prefetch=Prefetch(regions=1)
        )
        assert not torch.cuda.is_initialized()
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_cuda_host_alloc_size_matches_the_caching_host_allocator() -> None:
    backend = CudaBackend()
    assert backend.host_alloc_size(64 << 20) == 64 << 20
    assert backend.host_alloc_size((64 << 20) + 1) == 128 << 20
    assert backend.host_alloc_size(3 << 20) == 4 << 20
    assert backend.host_alloc_size(1) == 1


def test_cuda_ordering_events_are_one_per_stream_recorded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [Ordering events]: one event per (device, stream handle), recorded at each
    call; torch.cuda.current_stream() hands out a new Stream object for the same stream."""

    class FakeEvent:
        made = 0

        def __init__(self, enable_timing: bool = False) -> None:
            FakeEvent.made += 1
            self.records: list[object] = []

        def record(self, stream: object) -> None:
            self.records.append(stream)

    class FakeStream:
        def __init__(self, device_index: int, handle: int) -> None:
            self.device_index, self.cuda_stream = device_index, handle

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    backend = CudaBackend()
    a1, a2, b, other_device = FakeStream(0, 7), FakeStream(0, 7), FakeStream(0, 9), FakeStream(1, 7)
    first = backend.record_ordering_event(a1)
    assert backend.record_ordering_event(a2) is first and first.records == [a1, a2]
    assert backend.record_ordering_event(b) is not first
    assert backend.record_ordering_event(other_device) is not first
    assert FakeEvent.made == 3
    # events the engine holds stay one per record
    assert backend.record_event(a1) is not backend.record_event(a1) and FakeEvent.made == 5


@pytest.fixture()
def emu() -> Iterator[EmulatedBackend]:
    backend = EmulatedBackend()
    yield backend
    backend.close()


def test_compute_stream_is_the_host(emu: EmulatedBackend) -> None:
    compute = emu.current_stream(torch.device("cpu"))
    event = emu.record_event(compute)
    assert emu.query(event)
    dst, src = torch.zeros(8, dtype=torch.uint8), torch.arange(8, dtype=torch.uint8)
    emu.copy_many([dst], [src], compute)
    assert torch.equal(dst, src)


def test_side_stream_runs_in_order_and_waits_on_events(emu: EmulatedBackend) -> None:
    cpu = torch.device("cpu")
    a, b = emu.new_stream(cpu), emu.new_stream(cpu)
    gate_open = emu.record_event(a)  # a is idle: fires almost at once
    emu.synchronize()
    assert emu.query(gate_open)

    # b waits on an event that a reaches only after a slow copy.
    emu.copy_delay_s = 0.2
    src = torch.arange(64, dtype=torch.uint8)
    mid = torch.zeros(64, dtype=torch.uint8)
    emu.copy_many([mid], [src], a)
    landed = emu.record_event(a)
    emu.copy_delay_s = 0.0
    out = torch.zeros(64, dtype=torch.uint8)
    emu.wait_event(b, landed)
    emu.copy_many([out], [mid], b)
    done = emu.record_event(b)
    assert not emu.query(landed) and not emu.query(done)
    emu.wait_event(emu.current_stream(cpu), done)  # the host blocks
    assert torch.equal(out, src)
    assert emu.elapsed_seconds(gate_open, landed) >= 0.15


def test_dead_copy_source_is_recorded_and_raised(emu: EmulatedBackend) -> None:
    side = emu.new_stream(torch.device("cpu"))
    emu.copy_delay_s = 0.1
    src = torch.ones(16, dtype=torch.uint8)
    dst = torch.zeros(16, dtype=torch.uint8)
    emu.copy_many([dst], [src], side)
    del src  # the only reference: like device memory freed under an in-flight copy
    emu.synchronize()
    with pytest.raises(RuntimeError, match="freed before its copy ran"):
        emu.check()
    emu.check()  # the error is reported once


def test_fresh_buffers_are_garbage(emu: EmulatedBackend) -> None:
    cpu = torch.device("cpu")
    buf = emu.alloc_device(32, cpu, emu.new_stream(cpu))
    assert torch.isnan(buf.view(torch.float32)).all()
    assert bool((emu.alloc_host(32) == 0xFF).all())


def test_copy_many_runs_as_one_job_in_order(emu: EmulatedBackend) -> None:
    side = emu.new_stream(torch.device("cpu"))
    srcs = [torch.full((n,), i, dtype=torch.uint8) for i, n in enumerate((3, 512, 7))]
    dsts = [torch.zeros(len(s), dtype=torch.uint8) for s in srcs]
    emu.copy_many(dsts, srcs, side)
    emu.synchronize()
    emu.check()
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs))


def test_close_stops_workers_and_backend_is_reusable() -> None:
    emu = EmulatedBackend()
    side = emu.new_stream(torch.device("cpu"))
    assert side.worker is not None and side.worker.daemon
    emu.close()
    assert not side.worker.is_alive()
    assert emu.query(emu.record_event(side))  # a closed stream runs it on the caller
    emu.close()  # idempotent
    again = emu.new_stream(torch.device("cpu"))
    src = torch.arange(64, dtype=torch.uint8)
    dst = torch.zeros(64, dtype=torch.uint8)
    emu.copy_many([dst], [src], again)  # the reused backend's new stream runs its jobs
    done = emu.record_event(again)
    emu.synchronize()
    emu.check()
    assert torch.equal(dst, src) and emu.query(done)
    assert again.worker is not None and again.worker.is_alive()
    emu.close()
    assert again.worker is not None and not again.worker.is_alive()
    assert again.worker not in threading.enumerate()


def test_backends_name_their_device_type() -> None:
    assert EmulatedBackend().device_type == "cpu" and CudaBackend().device_type == "cuda"


def test_host_wait_is_measurable(emu: EmulatedBackend) -> None:
    cpu = torch.device("cpu")
    side = emu.new_stream(cpu)
    compute = emu.current_stream(cpu)
    emu.copy_delay_s = 0.1
    src = torch.ones(4, dtype=torch.uint8)
    emu.copy_many([torch.zeros(4, dtype=torch.uint8)], [src], side)
    landed = emu.record_event(side)
    before = emu.record_event(compute, timing=True)
    t0 = time.perf_counter()
    emu.wait_event(compute, landed)
    after = emu.record_event(compute, timing=True)
    waited = time.perf_counter() - t0
    # the events bracket the wait: their span holds it (and, on a loaded machine, what
    # else the host ran between them)
    assert waited - 1e-3 <= emu.elapsed_seconds(before, after) <= waited + 0.5
    assert waited >= 0.08


def test_worker_starts_a_job_after_its_delay_and_a_waiter_runs_it_first() -> None:
    # NOTE [Emulated waits]: the worker leaves a job alone for start_delay_s; a host wait
    # runs it at once, in order.
    emu = EmulatedBackend(start_delay_s=0.5)
    side = emu.new_stream(torch.device("cpu"))
    src, dst = torch.arange(8.0), torch.full((8,), float("nan"))
    try:
        emu.copy_many([dst], [src], side)
        landed = emu.record_event(side)
        time.sleep(0.1)
        assert not emu.query(landed) and dst.isnan().all()  # the worker has not started it
        start = time.perf_counter()
        emu.wait_event(emu.current_stream(torch.device("cpu")), landed)
        assert time.perf_counter() - start < 0.4 and torch.equal(dst, src)

        emu.start_delay_s = 0.0
        src = src + 1  # held: a queued copy holds its source weakly
        emu.copy_many([dst], [src], side)
        landed = emu.record_event(side)
        deadline = time.monotonic() + 10
        while not emu.query(landed) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert emu.query(landed) and torch.equal(dst, src)  # the worker ran it unasked
    finally:
        emu.close()


def test_a_wait_on_a_fired_event_queues_nothing() -> None:
    emu = EmulatedBackend()
    side = emu.new_stream(torch.device("cpu"))
    try:
        fired = emu.record_event(emu.current_stream(torch.device("cpu")))
        assert emu.query(fired)
        emu.wait_event(side, fired)
        assert not side.jobs
        pending = emu.record_event(side)
        assert len(side.jobs) == 1
        emu.synchronize()
        assert emu.query(pending) and not side.jobs
    finally:
        emu.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_process_with_queued_emulated_copies_exits_cleanly() -> None:
    """NOTE [Workers at exit]: forward-only offload passes leave copies queued on a worker
    of an engine that outlives the runtime; the process must still exit with status 0.
    Twice, as two processes forked from one that imported torch and offrecomp (and made
    no engine): each ends with an ordinary interpreter exit."""
    script = textwrap.dedent(
        """
        import os, sys
        import torch
        from torch import nn
        import offrecomp

        class Chain(nn.Module):
            def forward(self, x):
                for _ in range(16):
                    x = torch.tanh(x)
                return x

        statuses = []
        for _ in range(2):  # the crash depended on where the worker was at exit
            pid = os.fork()
            if pid == 0:
                model = nn.Sequential(*[Chain() for _ in range(4)])
                x = torch.randn(16, requires_grad=True)
                rt = offrecomp.runtime(model, mode="offload", min_bytes=0)  # alive at exit
                with rt:
                    for _ in range(5):
                        model(x)  # no backward: the graph is dropped
                print("ok", flush=True)
                sys.exit(0)  # the interpreter's exit, rt and its engine's queued copies alive
            statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        print("exit statuses", *statuses)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.split() == ["ok", "ok", "exit", "statuses", "0", "0"], (out.stdout, out.stderr[-2000:])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_copies_on_the_emulated_streams(emu: EmulatedBackend) -> None:
    """NOTE [Emulated streams across fork]: a fork while a copy runs on a worker. The
    parent drains first, so the child sees the copy landed, and the child's streams have
    workers of their own: its own copies land. A job running at the fork would
    otherwise hold its stream's lock forever in the child, and a wait on it would spin
    until its timeout."""
    cpu = torch.device("cpu")
    side = emu.new_stream(cpu)
    emu.copy_delay_s = 0.3
    src = torch.ones(64, dtype=torch.uint8)
    dst = torch.zeros(64, dtype=torch.uint8)
    emu.copy_many([dst], [src], side)
    emu.record_event(side)
    time.sleep(0.05)  # the worker is inside the copy now
    pid = os.fork()
    if pid == 0:  # the child: exit status only, never back into pytest
        code = 3
        try:
            emu.copy_delay_s = 0.0
            out = torch.zeros(8, dtype=torch.uint8)
            sevens = torch.full((8,), 7, dtype=torch.uint8)
            emu.copy_many([out], [sevens], side)
            emu.wait_event(emu.current_stream(cpu), emu.record_event(side))
            code = 0 if torch.equal(dst, src) and bool((out == 7).all()) else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on an emulated stream")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_a_closed_emulated_stream_runs_its_jobs_on_the_caller(emu: EmulatedBackend) -> None:
    """NOTE [Workers at exit]: the exit-time close stops the workers, but a user's atexit
    handler may still backprop a graph that offloaded: jobs of a closed stream run on the
    calling thread."""
    cpu = torch.device("cpu")
    side = emu.new_stream(cpu)
    emu.close()
    src = torch.arange(16, dtype=torch.uint8)
    dst = torch.zeros(16, dtype=torch.uint8)
    emu.copy_many([dst], [src], side)
    landed = emu.record_event(side)
    emu.wait_event(emu.current_stream(cpu), landed)
    assert emu.query(landed) and torch.equal(dst, src)


class _Watchdog(Exception):
    """What a watchdog's signal handler raises: an ``Exception``, not an interrupt."""


def _watchdog(signum: int, frame: object, what: str = "function") -> None:
    raise _Watchdog(f"step took too long ({what})")


class _WatchdogObject:
    def __call__(self, signum: int, frame: object) -> None:
        raise _Watchdog("step took too long (object)")


_HANDLERS = {
    "function": _watchdog,
    "partial": functools.partial(_watchdog, what="partial"),
    "object": _WatchdogObject(),
}


@pytest.mark.parametrize(
    ("error", "handler"), [(KeyboardInterrupt, "function"), *((_Watchdog, h) for h in _HANDLERS)]
)
def test_a_job_interrupted_on_the_waiting_thread_runs_again(error: type[BaseException], handler: str) -> None:
    """A Ctrl-C or a signal handler's exception inside a job the waiting thread runs (NOTE
    [Emulated waits]) reaches that thread, the job back in its place: the event after it
    still fires, a later wait returns, and no copy error is recorded (a watchdog's
    exception was taken for a broken job, and its event never fired)."""
    emu = EmulatedBackend(start_delay_s=60.0)  # the worker never starts it first
    side = emu.new_stream(torch.device("cpu"))
    compute = emu.current_stream(torch.device("cpu"))
    runs = []

    def job() -> None:
        runs.append(1)
        if len(runs) == 1:
            if error is KeyboardInterrupt:
                raise KeyboardInterrupt
            signal.raise_signal(signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, _HANDLERS[handler])
    try:
        emu._enqueue(side, job)
        landed = emu.record_event(side)
        with pytest.raises(error):
            emu.wait_event(compute, landed)
        emu.wait_event(compute, landed)
        assert emu.query(landed) and len(runs) == 2
        emu.check()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        emu.close()
