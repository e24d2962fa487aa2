"""offrecomp: keep, offload or recompute every activation autograd saves.

Public API (everything else is private)::

    with offrecomp.runtime(model, budget="24GiB") as rt:
        ...training loop...
    print(rt.report())
"""

from offrecomp.config import ENV_VARS, MODES, Config
from offrecomp.context import Runtime, runtime
from offrecomp.replay import ReplayDivergedError, in_replay
from offrecomp.report import Report, StepRecord
from offrecomp.verify import ReplayMismatchError
from scheduler.plan import ROOT, Placement, Plan

__version__ = "0.1.0"

__all__ = [
    # entry points
    "runtime",
    "Runtime",
    # configuration
    "Config",
    "ENV_VARS",
    "MODES",
    # plans
    "Placement",
    "Plan",
    "ROOT",
    # reports
    "Report",
    "StepRecord",
    # replay
    "in_replay",
    "ReplayDivergedError",
    "ReplayMismatchError",
    "__version__",
]
