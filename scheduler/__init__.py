"""offrecomp's planner: measured numbers in, placements out. Never imports torch.

Importing it loads numba but compiles nothing: kernels compile (or load from numba's
cache) on first use.
"""

from typing import TYPE_CHECKING, Any

from scheduler.cost_model import CostModel, Prediction, predict, replay_seconds
from scheduler.plan import ROOT, Placement, Plan, StorageKey
from scheduler.profile import OpRecord, Profile, RegionRecord, StorageRecord
from scheduler.simulate import Interval, Timeline, lower_bound, simulate
from scheduler.solver import InfeasibleBudgetError, exhaustive_solve, format_bytes, solve
from scheduler.whatif import gpt_profile

if TYPE_CHECKING:
    from scheduler.cli import parse_bytes

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


def __getattr__(name: str) -> Any:
    # the command line module loads on demand, so ``python -m scheduler.cli`` runs it fresh
    if name == "parse_bytes":
        from scheduler.cli import parse_bytes

        return parse_bytes
    raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
