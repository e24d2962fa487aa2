"""Shared helpers for the probes: counting made-state / clone activity and measuring real
CPU allocator peaks with torch.profiler memory events."""
import contextlib
import time

import torch

import offrecomp
import offrecomp.replay as _replay
import offrecomp.replay_state as _rs
import offrecomp.calls as _calls
import offrecomp.call_state as _cs
from offrecomp.trace import recorder as _rec

COUNT = {
    "state_as_found_calls": 0,       # replays that entered state_as_found
    "state_as_found_clones": 0,      # tensors cloned there
    "state_as_found_bytes": 0,       # bytes cloned there
    "state_as_found_uncopied": 0,    # > 64 MiB, not copied
    "state_as_found_seconds": 0.0,   # time spent cloning (entry) + restoring
    "entry_snapshot_clones": 0,      # note_external_reads clones (<=64KiB) of made_state
    "entry_snapshot_bytes": 0,
    "entry_snapshot_all_clones": 0,
    "entry_snapshot_seconds": 0.0,  # all note_external_reads clones (made + read)
    "made_state": [],                # (region, shapes, bytes) at each watched exit
}
MADE_PTRS = set()


def reset():
    for k in COUNT:
        COUNT[k] = [] if isinstance(COUNT[k], list) else type(COUNT[k])()
    MADE_PTRS.clear()


_orig_saf = _rs.state_as_found


@contextlib.contextmanager
def _counting_saf(call):
    COUNT["state_as_found_calls"] += 1
    t0 = time.perf_counter()
    for ref in call.made_state:
        t = ref()
        if t is None:
            continue
        nb = t.untyped_storage().nbytes()
        if nb <= _rec.EXTERNAL_COPY_MAX_BYTES:
            COUNT["state_as_found_clones"] += 1
            COUNT["state_as_found_bytes"] += nb
        else:
            COUNT["state_as_found_uncopied"] += 1
    with _orig_saf(call):
        COUNT["state_as_found_seconds"] += time.perf_counter() - t0
        yield
        t1 = time.perf_counter()
    COUNT["state_as_found_seconds"] += time.perf_counter() - t1


_replay.state_as_found = _counting_saf

_orig_ner = _cs.note_external_reads


def _counting_ner(refs):
    t0 = time.perf_counter()
    out = _orig_ner(refs)
    COUNT["entry_snapshot_seconds"] += time.perf_counter() - t0
    for t, v, copy in out or ():
        if copy is not None:
            COUNT["entry_snapshot_all_clones"] += 1
            if int(t.untyped_storage().data_ptr()) in MADE_PTRS:
                COUNT["entry_snapshot_clones"] += 1
                COUNT["entry_snapshot_bytes"] += t.untyped_storage().nbytes()
    return out


_cs.note_external_reads = _counting_ner
_calls.note_external_reads = _counting_ner

_orig_made = _rec.FirstCallWatch.made_state


def _counting_made(self, skip):
    out = _orig_made(self, skip)
    COUNT["made_state"].append(
        [(tuple(t.shape), str(t.dtype), t.untyped_storage().nbytes()) for t in out]
    )
    for t in out:
        MADE_PTRS.add(int(t.untyped_storage().data_ptr()))
    return out


_rec.FirstCallWatch.made_state = _counting_made


def peak_of(fn):
    """Run fn() under the profiler with memory events; return (peak_bytes_above_start,
    net_bytes, result). Peak is the max over time of cumulative allocations-frees."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        r = fn()
    evs = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
           if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    evs.sort(key=lambda x: x[0])
    LAST_EVENTS[:] = evs
    cur = peak = 0
    for _, d in evs:
        cur += d
        peak = max(peak, cur)
    return peak, cur, r

WINDOWS = []  # (start_ns, end_ns) of each _replay_forward
_orig_rf = _replay._replay_forward


def _timed_rf(*a, **k):
    t0 = time.time_ns()
    try:
        return _orig_rf(*a, **k)
    finally:
        WINDOWS.append((t0, time.time_ns()))


_replay._replay_forward = _timed_rf
LAST_EVENTS = []


def peak_in_windows(evs, windows):
    """max cumulative level (relative to profile start) reached inside the windows."""
    cur = 0
    best = None
    wi = sorted(windows)
    for t, d in evs:
        cur += d
        if any(a <= t <= b for a, b in wi):
            best = cur if best is None else max(best, cur)
    return best
