"""Byte counts as people write them, in one torch-free place.

The runtime's configuration (``OFFRECOMP_BUDGET=24GiB``), the planner's command line
(``offrecomp plan --budget 24G``) and the benchmarks parse and print bytes through these
two functions, so a size one of them accepts the others accept too, and a figure prints
the same everywhere.
"""

from __future__ import annotations

import math
import re

__all__ = ["INFEASIBLE_POLICIES", "SIZE_FORMS", "UNITS", "format_bytes", "parse_bytes"]

#: What to do when a memory budget cannot be met: ``warn`` (plan the most frugal
#: placement and say so) or ``error`` (raise). The runtime's OFFRECOMP_INFEASIBLE, the
#: planner's ``--infeasible`` and the solver accept exactly these.
INFEASIBLE_POLICIES: tuple[str, ...] = ("warn", "error")

#: Unit suffixes (case-insensitive): IEC binary (KiB...), SI decimal (KB...), and the
#: bare letters as binary (``24G`` is 24 GiB, as in most tools' flags).
UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
SIZE_FORMS = "an integer byte count or a number with a unit (512MiB, 24GiB, 24G, 1.5GB)"


def parse_bytes(value: object, *, name: str = "byte size") -> int:
    """Parse a byte count: an int, or a string like ``"512MiB"``, ``"24G"``, ``"1.5GB"``.

    ``name`` is the variable or argument being parsed; a bad value raises ``ValueError``
    naming it, the value and the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is invalid; accepted: {SIZE_FORMS}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name}={value!r} is invalid; it must be >= 0 ({SIZE_FORMS})")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m is not None:
            unit = m.group(2).lower()
            if unit in UNITS:
                number = float(m.group(1)) * UNITS[unit]
                if math.isfinite(number) and (unit or number.is_integer()):
                    return round(number)  # a bare number is a whole count of bytes
    raise ValueError(f"{name}={value!r} is invalid; accepted: {SIZE_FORMS}")


def format_bytes(n: float) -> str:
    """``1536 -> '1.50 KiB'``, ``512 -> '512 B'``; whole bytes below 1 KiB."""
    v = float(n)
    sign = "-" if v < 0 else ""
    v = abs(v)
    if round(v) < 1024:
        return f"{sign}{round(v)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        v /= 1024
        if v < 1024 or unit == "TiB":
            return f"{sign}{v:.2f} {unit}"
    raise AssertionError("unreachable")
