"""What a pass does about its activations: the phase each pass and step record carries.

``Phase`` is a ``str`` enum: its values are the strings the step records, the report's
table and its JSON lines show, so a member compares equal to its string and reads back
from a report as one. Importing this module imports nothing else of the package (nor
torch).
"""

from __future__ import annotations

import enum

__all__ = ["Phase"]


class Phase(str, enum.Enum):
    """The phase of a pass (``PassState.phase``) and of a step (``StepRecord.phase``)."""

    MEASURE = "measure"
    """auto, a signature's first pass: every region activation dropped while the op
    recorder times the forward."""
    CALIBRATE = "calibrate"
    """auto, the second pass: every region activation dropped, no recorder, to fit the
    recorded times."""
    PLANNED = "planned"
    """auto: the signature's own plan."""
    BORROWED = "borrowed"
    """auto: the plan of a larger signature of the same family (NOTE [Borrowed plans])."""
    USER_PLAN = "user-plan"
    """The plan given to ``rt.set_plan``."""
    RECOMPUTE = "recompute"
    """``mode='recompute'``, or auto's plain full recompute of a new signature a little
    larger than a profiled one (NOTE [Borrowed plans])."""
    KEEP = "keep"
    """``mode='keep'``."""
    OFFLOAD = "offload"
    """``mode='offload'``."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
