"""Byte counts as people write them, and the knobs the runtime and the planner's
command line share, in one torch-free place.

The runtime's configuration (``OFFRECOMP_BUDGET=24GiB``), the planner's command line
(``offrecomp plan --budget 24G``) and the benchmarks parse and print bytes through these
two functions, so a size one of them accepts the others accept too, and a figure prints
the same everywhere. The same holds for the ranges of the numbers both take
(``OFFRECOMP_MAX_OVERHEAD`` and ``--max-overhead``, ...): :class:`NumberRange`.
"""

from __future__ import annotations

import math
import numbers
import operator
import re
from dataclasses import dataclass

__all__ = [
    "GBPS",
    "INFEASIBLE_POLICIES",
    "MAX_OVERHEAD",
    "MIN_PREFETCH_REGIONS",
    "REPLAY_OP_US",
    "SIZE_FORMS",
    "UNITS",
    "NumberRange",
    "format_bytes",
    "parse_bytes",
]

#: What to do when a memory budget cannot be met: ``warn`` (plan the most frugal
#: placement and say so) or ``error`` (raise). The runtime's OFFRECOMP_INFEASIBLE, the
#: planner's ``--infeasible`` and the solver accept exactly these.
INFEASIBLE_POLICIES: tuple[str, ...] = ("warn", "error")


@dataclass(frozen=True)
class NumberRange:
    """The numbers a knob accepts, ``lo`` to ``hi`` inclusive, and how an error says so."""

    lo: float
    hi: float
    forms: str

    def parse(self, value: object, *, name: str) -> float:
        """``value`` (a number or its text) as a float; a ValueError naming ``name``, the
        value and ``forms`` unless it lies in the range (a bool is no number)."""
        try:
            x = math.nan if isinstance(value, bool) else float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            x = math.nan
        if not (self.lo <= x <= self.hi):
            raise ValueError(f"{name}={value!r} is invalid; accepted: {self.forms}")
        return x


#: Step-time overhead a user accepts: ``OFFRECOMP_MAX_OVERHEAD``, ``--max-overhead``.
MAX_OVERHEAD = NumberRange(0.0, 10.0, "a fraction of step time from 0 to 10 (0.05 = 5%)")
#: Host link bandwidths to plan with: ``OFFRECOMP_D2H_GBPS``/``--d2h-gbps`` and the H2D pair.
GBPS = NumberRange(1e-6, 1e6, "a number of GB/s from 1e-6 to 1e6 (50)")
#: Cost per op of a replay under the dispatch mode: ``OFFRECOMP_REPLAY_OP_US``, ``--replay-op-us``.
REPLAY_OP_US = NumberRange(0.0, 1e6, "microseconds per op, a number from 0 to 1e6 (25)")
#: Fewest regions backward reloads run ahead: ``OFFRECOMP_PREFETCH``, ``--prefetch-regions``.
MIN_PREFETCH_REGIONS = 1

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
    """Parse a byte count: an int (``numpy.int64`` too), or a string like ``"512MiB"``,
    ``"24G"``, ``"1.5GB"``.

    ``name`` is the variable or argument being parsed; a bad value raises ``ValueError``
    naming it, the value and the accepted forms (a bool is no count).
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is invalid; accepted: {SIZE_FORMS}")
    if isinstance(value, numbers.Integral):
        count = operator.index(value)
        if count < 0:
            raise ValueError(f"{name}={value!r} is invalid; it must be >= 0 ({SIZE_FORMS})")
        return count
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m is not None:
            unit = m.group(2).lower()
            if unit in UNITS:
                number = float(m.group(1)) * UNITS[unit]
                if math.isfinite(number) and (UNITS[unit] > 1 or number.is_integer()):
                    if number > 0 and round(number) == 0:  # a size under one byte: not 0
                        raise ValueError(f"{name}={value!r} is invalid (under one byte); accepted: {SIZE_FORMS}")
                    return round(number)  # a count of bytes (bare, or in B) is whole
    raise ValueError(f"{name}={value!r} is invalid; accepted: {SIZE_FORMS}")


def format_bytes(n: float) -> str:
    """``1536 -> '1.50 KiB'``, ``512 -> '512 B'``; whole bytes below 1 KiB."""
    v = float(n)
    if not math.isfinite(v):
        return f"{v} B"  # nan or inf: said as it is, not raised from inside a message
    sign = "-" if v < 0 else ""
    v = abs(v)
    if round(v) < 1024:
        return f"{sign}{round(v)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        v /= 1024
        if v < 1024 or unit == "TiB":
            return f"{sign}{v:.2f} {unit}"
    raise AssertionError("unreachable")
