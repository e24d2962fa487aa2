"""What the planner needs from its runtime: ``PlannerHost``.

The runtime owns the planner and hands it this narrow view of itself rather than the
whole ``Runtime``: the configuration, the clock that times passes, the regions, the
device, the offload engine (to pin a plan's host memory ahead), the plan a user set and
the one warning the planner raises through the runtime. Everything else the planner
reads comes with each call (the pass, the region call).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from offrecomp.config import Config
    from offrecomp.measure import Clock
    from offrecomp.offload import OffloadEngine
    from offrecomp.regions import Region
    from scheduler.plan import Plan


class PlannerHost(Protocol):
    """The runtime as the planner sees it. Read live at every use: the clock and the
    device change when the runtime first sees the model's device, the user plan when
    ``rt.set_plan`` is called."""

    @property
    def config(self) -> Config:
        """The runtime's configuration (mode, budget, min_bytes, drift, ...)."""
        ...

    @property
    def clock(self) -> Clock:
        """The clock whose marks time passes, region calls and replays."""
        ...

    @property
    def regions(self) -> Sequence[Region]:
        """The regions the runtime replays (for ``explain()``'s reasons)."""
        ...

    @property
    def distributed(self) -> bool:
        """More than one rank trains (collectives make a region unreplayable by one rank
        alone: NOTE [Collective regions])."""
        ...

    @property
    def user_plan(self) -> Plan | None:
        """The plan given to ``rt.set_plan`` (None: the configured mode decides)."""
        ...

    def device(self) -> torch.device:
        """The device the model runs on; CPU until the runtime has seen one."""
        ...

    def engine(self) -> OffloadEngine:
        """The offload engine (created on first use), whose pinned pool a plan prepares."""
        ...

    def host_limit_bytes(self) -> int:
        """The pinned host bytes the offload pool may hold (NOTE [Host limit in plans])."""
        ...

    def warn_collective(self, region: Region) -> None:
        """Say, once per kind of block, that ``region`` runs collectives and is never
        recomputed (NOTE [Collective regions])."""
        ...
