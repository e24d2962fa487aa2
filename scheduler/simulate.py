"""The simulator's names in one place.

* ``scheduler.flat``: a profile as flat arrays (``flatten``, ``FlatProfile``) and a plan
  as one placement per flat storage.
* ``scheduler.timeline``: the timeline of a plan (``simulate``); its docstring is the
  model, with NOTE [Offload groups] and NOTE [Host time].
* ``scheduler.bound``: the lower bound on the step time within a budget.
* ``scheduler.kernels``: the numba helpers, and the legend of the kernels' array names.

The ``name as name`` imports are internal names that the solver's tests and benchmarks
take from here.
"""

from __future__ import annotations

from scheduler.bound import lower_bound
from scheduler.bound import lower_bound_flat as lower_bound_flat
from scheduler.flat import KEEP_BIT as KEEP_BIT
from scheduler.flat import OFFLOAD_BIT as OFFLOAD_BIT
from scheduler.flat import RECOMPUTE_BIT as RECOMPUTE_BIT
from scheduler.flat import FlatProfile as FlatProfile
from scheduler.flat import check_legal as check_legal
from scheduler.flat import flatten as flatten
from scheduler.flat import placement_array as placement_array
from scheduler.timeline import Interval, Timeline, simulate
from scheduler.timeline import SimResult as SimResult
from scheduler.timeline import Workspace as Workspace
from scheduler.timeline import check_prefetch as check_prefetch

__all__ = [
    "Interval",
    "Timeline",
    "lower_bound",
    "simulate",
]
