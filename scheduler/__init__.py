"""offrecomp's planner: measured numbers in, placements out. Never imports torch."""

from scheduler.plan import ROOT, Placement, Plan, StorageKey
from scheduler.profile import OpRecord, Profile, RegionRecord, StorageRecord

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
]
