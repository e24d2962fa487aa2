"""Unit times of a profile: forward start and duration and backward duration per unit,
then the host time of each unit (NOTE [Host time] in scheduler.timeline)."""

from __future__ import annotations

import numpy as np

from scheduler.checks import check_number, region_label, times_ok
from scheduler.profile import Profile

__all__ = ["host_times", "issue_ahead", "unit_times"]


def unit_times(profile: Profile) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Forward start/duration and backward duration per unit, and the forward end.

    Region times are checked as arrays; only when that check fails are they walked one
    by one, to name the bad value (or accept what ``check_number`` accepts).
    """
    regions = profile.regions
    n = len(regions)
    fw_raw = [r.forward_seconds for r in regions]
    bw_raw = [r.backward_seconds for r in regions]
    if not times_ok(fw_raw):
        fw_raw = [
            check_number(r.forward_seconds, f"region {region_label(r)} forward_seconds")
            for r in regions
        ]
    if not times_ok(bw_raw):
        bw_raw = [
            check_number(r.backward_seconds, f"region {region_label(r)} backward_seconds")
            for r in regions
        ]
    fw = np.asarray(fw_raw, dtype=np.float64)
    bw = np.asarray(bw_raw, dtype=np.float64)
    fwd_total = check_number(profile.forward_seconds, "profile forward_seconds")
    bwd_total = check_number(profile.backward_seconds, "profile backward_seconds")
    # sums in Python (sequential) and elementwise numpy below: the same floats as a loop
    fw_sum = sum(fw.tolist())
    scale = max(1e-300, fwd_total, float(fw.max()) if n else 0.0)
    tol = 1e-9 * scale
    starts = np.asarray([float(r.start_seconds) for r in regions], dtype=np.float64)
    consistent = n > 0 and bool(np.all(np.isfinite(starts) & (starts >= 0.0)))
    if consistent:
        consistent = not bool(np.any(starts[1:] < starts[:-1] + fw[:-1] - tol))
    gaps = np.empty(n + 1)
    if consistent:
        end_last = float(starts[-1] + fw[-1])
        fwd_total = max(fwd_total, end_last)
        gaps[0] = starts[0]
        gaps[1:n] = np.maximum(0.0, starts[1:] - (starts[:-1] + fw[:-1]))
        gaps[n] = max(0.0, fwd_total - end_last)
    else:
        fwd_total = max(fwd_total, fw_sum)
        gaps[:] = max(0.0, fwd_total - fw_sum) / (n + 1)
    bw_sum = sum(bw.tolist())
    bwd_total = max(bwd_total, bw_sum)
    root_b = max(0.0, bwd_total - bw_sum)
    gap_sum = sum(gaps.tolist())
    gaps_b = root_b * gaps / gap_sum if gap_sum > 0 else np.full(n + 1, root_b / (n + 1))
    # units: gap 0, region 0, gap 1, ..., gap n
    dur = np.empty(2 * n + 1)
    dur[0::2] = gaps
    dur[1::2] = fw
    bdur = np.empty(2 * n + 1)
    bdur[0::2] = gaps_b
    bdur[1::2] = bw
    ends = np.cumsum(dur)
    start = np.concatenate(([0.0], ends[:-1]))
    return start, dur, bdur, max(float(ends[-1]), fwd_total)


def host_times(
    profile: Profile,
    start: np.ndarray,
    dur: np.ndarray,
    bdur: np.ndarray,
    t0: float,
    unit_saves: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, np.ndarray, np.ndarray]:
    """Host time per unit (NOTE [Host time]): forward starts and end of forward when no
    group offloads, forward host time, backward host time, backward device time, and
    the host time a region unit adds on top when a plan does not keep it whole: its
    replay checkpoint (``Profile.capture_host_seconds``) and, under
    ``Profile.native_keep`` (where the first two leave them out), its hooks.

    Where no host time was measured, and the hooks cost nothing, every unit's host time
    equals its device time and the layout is ``unit_times``'s, bit for bit.
    """
    pack = check_number(profile.pack_host_seconds, "profile pack_host_seconds")
    unpack = check_number(profile.unpack_host_seconds, "profile unpack_host_seconds")
    fwd_host = dur.copy()
    bwd_host = bdur.copy()
    for k, r in enumerate(profile.regions):
        if r.host_seconds is not None:
            fwd_host[2 * k + 1] = check_number(
                r.host_seconds, f"region {region_label(r)} host_seconds"
            )
        if r.backward_host_seconds is not None:
            bwd_host[2 * k + 1] = check_number(
                r.backward_host_seconds, f"region {region_label(r)} backward_host_seconds"
            )
    capture = check_number(profile.capture_host_seconds, "profile capture_host_seconds")
    fwd_hook = np.zeros_like(dur)
    bwd_hook = np.zeros_like(bdur)
    fwd_hook[1::2] = capture  # a region call not kept whole takes a replay checkpoint
    # gaps (the root's saves) always run the hooks; region units too without native keep
    hooked_saves = unit_saves.copy()
    if profile.native_keep:
        hooked_saves[1::2] = 0.0
        fwd_hook[1::2] += pack * unit_saves[1::2]
        bwd_hook[1::2] = unpack * unit_saves[1::2]
    if pack > 0:
        fwd_host = fwd_host + pack * hooked_saves
    if unpack > 0:
        bwd_host = bwd_host + unpack * hooked_saves
    if not np.any(fwd_host > dur):  # the host never holds the device up
        return start, fwd_host, bwd_host, bdur, t0, fwd_hook, bwd_hook
    host_start, end = issue_ahead(dur, fwd_host)
    t_end = t0 + (end - float(np.cumsum(dur)[-1]))
    return host_start, fwd_host, bwd_host, bdur, t_end, fwd_hook, bwd_hook


def issue_ahead(dur: np.ndarray, host: np.ndarray) -> tuple[np.ndarray, float]:
    """The forward's units on the device when the host issues them one after another
    (NOTE [Host time] in scheduler.timeline): each unit's device start, and the end of
    the last. A unit starts once the device ended the one before and the host began
    issuing it, and ends no earlier than its device time after its start nor than the
    host's end of issuing it. ``timeline._forward`` runs the same recurrence."""
    starts = np.empty_like(dur)
    d = h = 0.0
    for u in range(dur.shape[0]):
        s = d if d >= h else h
        starts[u] = s
        h = h + float(host[u])
        e = s + float(dur[u])
        d = e if e >= h else h
    return starts, d
