"""offrecomp's planner: measured numbers in, placements out. Never imports torch.

Importing it loads numba but compiles nothing: kernels compile (or load from numba's
cache) on first use.
"""

# ``scheduler.simulate`` names the function: it is imported from the module of that name
# (loading the module before the name is bound), so a later ``import scheduler.simulate``
# does not replace it with the module
from scheduler.cost_model import CostModel, Prediction, predict, replay_seconds
from scheduler.plan import ROOT, Placement, Plan, StorageKey
from scheduler.profile import OpRecord, Profile, RegionRecord, StorageRecord
from scheduler.simulate import Interval, Timeline, lower_bound, simulate
from scheduler.solver import InfeasibleBudgetError, exhaustive_solve, solve
from scheduler.units import format_bytes, parse_bytes
from scheduler.whatif import gpt_profile

__all__ = [
    # plans
    "ROOT",
    "Placement",
    "Plan",
    "StorageKey",
    # profiles
    "OpRecord",
    "Profile",
    "RegionRecord",
    "StorageRecord",
    # cost model
    "CostModel",
    "Prediction",
    "predict",
    "replay_seconds",
    # simulator
    "Interval",
    "Timeline",
    "lower_bound",
    "simulate",
    # solver
    "InfeasibleBudgetError",
    "exhaustive_solve",
    "solve",
    # what-if and command line helpers
    "format_bytes",
    "gpt_profile",
    "parse_bytes",
]

