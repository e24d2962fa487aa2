"""Checks of profile values for flattening.

A column of values is checked as one array; only when that check fails is the profile
walked value by value, to name the first bad one in the error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from scheduler.profile import Profile, RegionRecord

__all__ = [
    "INT64_LIMIT",
    "bad_storage",
    "check_bytes",
    "check_number",
    "int_array",
    "int_column",
    "is_count",
    "is_time",
    "region_label",
    "times_ok",
]


#: Counts and sizes are held as int64: a value from this one on is refused.
INT64_LIMIT = 2**63


def check_number(value: float, what: str) -> float:
    """``value`` as a float; ValueError naming ``what`` unless finite and >= 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):  # a string or null in a profile's JSON
        v = math.nan
    if isinstance(value, (bool, str)) or not math.isfinite(v) or v < 0.0:
        raise ValueError(f"{what} = {value!r} is invalid; accepted: a finite number >= 0")
    return v


def check_bytes(value: Any, what: str, note: str = "") -> int:
    """``value`` as an int; ValueError naming ``what`` unless a whole number of bytes from
    0 to 2**63 - 1 (``note``: what a value means, added to the accepted ones)."""
    if not (is_count(value) and value < INT64_LIMIT):
        raise ValueError(
            f"{what} = {value!r} is invalid; accepted: a whole number of bytes from 0 to 2**63 - 1 {note}".rstrip()
        )
    return int(value)


def region_label(r: RegionRecord) -> str:
    return f"{r.name}#{r.call_index}"


def bad_storage(profile: Profile, what: str, accepted: str, check: Any) -> None:
    """Raise ValueError for the first storage failing ``check`` (slow path)."""
    for r in profile.regions:
        for i, s in enumerate(r.storages):
            if not check(s):
                raise ValueError(
                    f"storage {i} of region {region_label(r)} {what} = {getattr(s, what)!r} is "
                    f"invalid; accepted: {accepted}"
                )
    for i, s in enumerate(profile.root):
        if not check(s):
            raise ValueError(
                f"root storage {i} {what} = {getattr(s, what)!r} is invalid; accepted: {accepted}"
            )


def is_count(v: Any) -> bool:
    """An int >= 0 (any size: the caller bounds it)."""
    return bool(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0)


def is_time(v: Any) -> bool:
    return bool(
        isinstance(v, (int, float, np.number))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and v >= 0
    )


def int_array(values: list[Any], limit: int = INT64_LIMIT) -> np.ndarray | None:
    """``values`` as int64 when all are ints >= 0 and below ``limit``, else None."""
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError):
        return None
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or int(arr.min()) < 0 or int(arr.max()) >= limit:
        return None
    return arr.astype(np.int64)


def int_column(raw: list[Any]) -> tuple[np.ndarray, bool]:
    """``raw`` as an array, and whether it is a 1-D array of ints (bounds are the caller's)."""
    arr = np.asarray(raw) if raw else np.zeros(0, dtype=np.int64)
    return arr, bool(arr.ndim == 1 and (arr.size == 0 or arr.dtype.kind in "iu"))


def times_ok(values: list[Any]) -> bool:
    """All of ``values`` are finite numbers >= 0."""
    if not values:
        return True
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError):
        return False
    if arr.ndim != 1 or arr.dtype.kind not in "iuf":
        return False
    return bool(np.all(np.isfinite(arr)) and np.all(arr >= 0))
