"""Between the runtime and the planner: profiles in, placements out, plans cached.

The first pass of every input-shape signature in ``auto`` mode is the *measuring* pass:
every region activation is dropped (as full checkpointing would) while the forward of
each region runs under the op recorder. At its end the runtime builds a
``scheduler.Profile`` from what it saw, resolves the budget, asks the solver for a plan
and caches it for the signature (bounded LRU). Later passes of the signature follow the
plan; a pass whose structure differs from the profile (more region calls, other
storage sizes) falls back to dropping for the unknown parts and triggers a new
measuring pass; measured step time drifting from the prediction beyond
``Config.drift`` triggers a re-plan with the measured times.

One module a mechanism:

- ``host``: ``PlannerHost``, what the planner needs from its runtime.
- ``planner``: ``Planner``, the coordinator the runtime calls at each pass, region call
  and step, and the placement of each saved storage.
- ``entries``: ``PlanEntry`` per signature, the plan cache, borrowed plans.
- ``profiling``: a measuring pass into a ``scheduler.Profile``.
- ``solving``: budgets, the solver's call, the most frugal plan, pinning ahead.
- ``learning``: calibration and planned passes into the cost model.
- ``replay_cost``: the dispatch-mode replay's cost per op, learnt.
- ``drift``: the live prediction and the drift window, which trigger re-plans.
- ``trial``: the offload trial.
- ``records``: step records and their lazily read times.
"""

from offrecomp.planning.drift import DRIFT_HISTORY, DRIFT_MAX_BACKOFF, DRIFT_REPLANS, DRIFT_WINDOW
from offrecomp.planning.entries import GROWTH, PlanCache, PlanEntry
from offrecomp.planning.host import PlannerHost
from offrecomp.planning.learning import MAX_CALIBRATION_TRIES, OUTLIER_RATIO, _gaps
from offrecomp.planning.planner import CATCH_UP_SECONDS, Planner
from offrecomp.planning.records import OVER_BUDGET
from offrecomp.planning.replay_cost import SERVING_OVERHEAD_SECONDS, ReplayCost
from offrecomp.planning.solving import SLOW_FIRST_SOLVE_SECONDS, Solver
from offrecomp.planning.trial import TRIAL_EXCESS, TRIAL_PASSES, OffloadTrial

__all__ = [
    "CATCH_UP_SECONDS",
    "DRIFT_HISTORY",
    "DRIFT_MAX_BACKOFF",
    "DRIFT_REPLANS",
    "DRIFT_WINDOW",
    "GROWTH",
    "MAX_CALIBRATION_TRIES",
    "OUTLIER_RATIO",
    "OVER_BUDGET",
    "SERVING_OVERHEAD_SECONDS",
    "SLOW_FIRST_SOLVE_SECONDS",
    "TRIAL_EXCESS",
    "TRIAL_PASSES",
    "OffloadTrial",
    "PlanCache",
    "PlanEntry",
    "Planner",
    "PlannerHost",
    "ReplayCost",
    "Solver",
    "_gaps",
]
