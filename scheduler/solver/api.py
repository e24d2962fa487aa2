"""``solve`` and ``exhaustive_solve``: check the arguments, build the family of plans
(scheduler.solver.family) and pick from it, and hand the pick back as a ``Plan``."""

from __future__ import annotations

import hashlib
import itertools
import logging
import math

import numpy as np

from scheduler.bound import lower_bound_flat
from scheduler.flat import OFFLOAD_BIT, FlatProfile, flatten
from scheduler.plan import Placement, Plan
from scheduler.profile import Profile
from scheduler.solver.family import _build_family
from scheduler.timeline import SimResult, Workspace, check_prefetch
from scheduler.units import INFEASIBLE_POLICIES, format_bytes

__all__ = ["InfeasibleBudgetError", "exhaustive_solve", "solve"]

# named for the package: the logger users configure the solver's warnings on
logger = logging.getLogger("scheduler.solver")


class InfeasibleBudgetError(ValueError):
    """No plan keeps the predicted activation peak within the budget."""

    def __init__(self, budget_bytes: int, min_feasible_bytes: int) -> None:
        super().__init__(
            f"activation budget {format_bytes(budget_bytes)} ({budget_bytes} bytes) cannot be met; "
            f"the smallest feasible budget is {format_bytes(min_feasible_bytes)} "
            f"({min_feasible_bytes} bytes). Raise the budget, or pass infeasible='warn' to get "
            "the most memory-frugal plan"
        )
        self.budget_bytes = budget_bytes
        self.min_feasible_bytes = min_feasible_bytes

    def __reduce__(self) -> tuple[type[InfeasibleBudgetError], tuple[int, int]]:
        # pickle rebuilds an exception from self.args (the message), which does not match
        # __init__; rebuild from the two numbers so it crosses a process pool intact
        return (type(self), (self.budget_bytes, self.min_feasible_bytes))


def _check_budget(budget_bytes: object) -> int | None:
    if budget_bytes is None:
        return None
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)):
        raise TypeError(
            f"budget_bytes must be an int (bytes) or None, got {type(budget_bytes).__name__}; "
            "parse unit strings such as '20GiB' with scheduler.parse_bytes"
        )
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes = {budget_bytes} is invalid; accepted: an int >= 0 or None")
    return int(budget_bytes)


def _check_overhead(max_overhead: object) -> float | None:
    if max_overhead is None:
        return None
    if isinstance(max_overhead, bool) or not isinstance(max_overhead, (int, float)):
        raise TypeError(f"max_overhead must be a number or None, got {type(max_overhead).__name__}")
    v = float(max_overhead)
    if not math.isfinite(v) or v < 0:
        raise ValueError(
            f"max_overhead = {max_overhead!r} is invalid; accepted: a number >= 0 (0.05 = 5%) or None"
        )
    return v


def _plan_id(flat: FlatProfile, place: np.ndarray) -> str:
    """Short stable id: a hash of each unit's name and its storages' placements."""
    data = place.astype(np.int8).tobytes()
    ptr = flat.st_ptr.tolist()
    parts: list[bytes] = []
    for name, lo, hi in zip(flat.unit_names, ptr, ptr[1:]):
        if hi > lo:
            parts += (name.encode(), data[lo:hi])
    return hashlib.sha1(b"".join(parts)).hexdigest()[:12]


_PLACEMENTS = tuple(Placement)


def _make_plan(
    flat: FlatProfile,
    place: np.ndarray,
    res: SimResult,
    *,
    budget: int | None,
    feasible: bool = True,
    min_feasible: int | None = None,
    notes: list[str] | None = None,
) -> Plan:
    lb_budget = budget if (budget is not None and feasible) else res.peak
    lb = lower_bound_flat(flat, lb_budget)
    releases: tuple[int, ...] = ()
    if (place == int(Placement.OFFLOAD)).any():
        ws = Workspace(flat)
        ws.run(place, 0)  # the releases are forward's: no prefetch depth changes them
        releases = tuple(ws.rel_u.tolist())
    return Plan(
        placements=dict(zip(flat.keys, map(_PLACEMENTS.__getitem__, place.tolist()))),
        budget_bytes=budget,
        predicted_step_seconds=res.step,
        predicted_peak_bytes=res.peak,
        predicted_forward_seconds=res.forward,
        predicted_recompute_seconds=res.recompute,
        predicted_stall_seconds=res.stall,
        lower_bound_seconds=lb,
        feasible=feasible,
        min_feasible_budget_bytes=min_feasible,
        plan_id=_plan_id(flat, place),
        notes=list(notes or []),
        releases=releases,
    )


def _within_host(results: list[SimResult], host_limit: int) -> np.ndarray:
    if host_limit <= 0:
        return np.ones(len(results), dtype=bool)
    return np.asarray([r.d2h_bytes <= host_limit for r in results], dtype=bool)


def _pick(
    times: np.ndarray,
    peaks: np.ndarray,
    mask: np.ndarray,
    primary: np.ndarray,
    secondary: np.ndarray,
) -> int:
    """Index among ``mask`` minimising (primary, secondary, index)."""
    idx = np.flatnonzero(mask)
    order = np.lexsort((idx, secondary[idx], primary[idx]))
    return int(idx[order[0]])


#: Plans whose predicted peaks are this close (relative) count as equally frugal: the
#: simulated peak moves by about 1e-4 of itself when times move by an ulp (events at
#: equal times reorder), so a pick by peak alone flips between plans several times
#: apart in step time.
FRUGAL_SLACK = 1e-4


def _frugal(times: np.ndarray, peaks: np.ndarray, mask: np.ndarray) -> tuple[int, int]:
    """The most memory-frugal plan among ``mask`` (the fastest of those within
    FRUGAL_SLACK of the smallest peak, then the smallest peak, then the first), and the
    smallest peak."""
    smallest = int(peaks[mask].min())
    near = mask & (peaks <= smallest + smallest * FRUGAL_SLACK)
    return _pick(times, peaks, near, times, peaks.astype(np.float64)), smallest


#: The reload depths ``solve(prefetch_regions=None)`` plans with, the first the default
#: (NOTE [Chosen prefetch]).
PREFETCH_CHOICES = (2, 1)
#: How much faster a later depth's plan must be predicted to replace the first's.
PREFETCH_GAIN = 0.01

# NOTE [Chosen prefetch]
# How far ahead backward reloads offloaded groups trades memory for stalls: each group
# reloaded ahead is resident before its region's backward needs it. Where a region's
# activations are a small share of the budget, two groups ahead hide the link at little
# cost; where they are a large share (80 layers at 128K tokens: 33 GiB a layer against a
# 60 GiB budget), the second group reloaded ahead leaves no room to offload at all and
# the plan drops everything (+33.3% step time), where reloading one ahead lets it offload
# most (+6.3%). ``solve(prefetch_regions=None)`` solves at each of ``PREFETCH_CHOICES``
# and returns the faster plan meeting the budget (the lower peak when none does; with
# no budget, the lower peak within the overhead), with its depth in
# ``Plan.prefetch_regions``. The first depth stays unless another is predicted
# ``PREFETCH_GAIN`` better: one group ahead leaves a reload no slack for what the model
# does not see (a host pause, another stream's copy). The runtime reloads
# each group of a pass as the plan it ran says (NOTE [Prefetch order] in
# offrecomp/transfer.py), and predicts it at that depth. A depth given is the only one.
# A profile without a link, or a solve without offloading, is solved once; so is every
# solve where a depth is given (``OFFRECOMP_PREFETCH`` set): otherwise each solve that
# may offload takes twice the time.


def solve(
    profile: Profile,
    *,
    budget_bytes: int | None,
    max_overhead: float | None = None,
    prefetch_regions: int | None = 2,
    allow_offload: bool = True,
    infeasible: str = "warn",
    log_infeasible: bool = True,
) -> Plan:
    """Placements that keep the predicted activation peak within ``budget_bytes`` at the
    least predicted step time.

    * ``log_infeasible``: log the ``infeasible="warn"`` case as a warning (the plan's
      ``notes`` say it either way; the runtime turns this off and warns once itself).

    * ``budget_bytes``: activation budget in bytes; ``None`` = no budget.
    * ``max_overhead``: accepted predicted step-time overhead over all-KEEP (0.05 = 5%).
      Without a budget the planner buys the smallest peak within that overhead; with a
      budget it only notes when meeting the budget costs more.
    * ``prefetch_regions``: how many regions ahead reloads are issued in backward; None
      plans at each of ``PREFETCH_CHOICES`` and takes the faster (NOTE [Chosen
      prefetch]). The plan's ``prefetch_regions`` says which.
    * ``allow_offload``: False restricts plans to KEEP and RECOMPUTE.
    * ``infeasible``: ``"warn"`` returns the most memory-frugal plan with
      ``feasible=False`` when the budget cannot be met; ``"error"`` raises
      ``InfeasibleBudgetError``.
    """
    budget = _check_budget(budget_bytes)
    overhead = _check_overhead(max_overhead)
    depths = PREFETCH_CHOICES if prefetch_regions is None else (check_prefetch(prefetch_regions),)
    if infeasible not in INFEASIBLE_POLICIES:
        raise ValueError(
            f"infeasible={infeasible!r} is invalid; accepted: " + ", ".join(INFEASIBLE_POLICIES)
        )
    flat = flatten(profile)
    ws = Workspace(flat)
    legal = flat.choice.copy()
    if not allow_offload or not flat.has_link:
        legal &= ~OFFLOAD_BIT
    if not (legal & OFFLOAD_BIT).any():
        depths = depths[:1]  # nothing reloads: every depth plans the same
    best: Plan | None = None
    smallest: list[int] = []
    for depth in depths:
        plan = _solve_at(flat, ws, legal, budget, overhead, depth)
        plan.prefetch_regions = depth
        if plan.min_feasible_budget_bytes is not None:
            smallest.append(plan.min_feasible_budget_bytes)
        if best is None or _better(plan, best, by_peak=budget is None):
            best = plan
    assert best is not None
    if not best.feasible:
        assert budget is not None and smallest
        if infeasible == "error":
            raise InfeasibleBudgetError(budget, min(smallest))
        if log_infeasible:
            logger.warning("offrecomp planner: %s", best.notes[-1])
    return best


def _better(plan: Plan, than: Plan, *, by_peak: bool) -> bool:
    """NOTE [Chosen prefetch]: is ``plan`` to replace ``than``: meeting the budget where
    the other does not; of two that meet it, faster by PREFETCH_GAIN (``by_peak``: no
    budget, the plans of the least peak within the overhead, by PREFETCH_GAIN of peak);
    of two that do not, a lower peak?"""
    if plan.feasible != than.feasible:
        return plan.feasible
    if plan.feasible and not by_peak:
        return (plan.predicted_step_seconds or 0.0) < (than.predicted_step_seconds or 0.0) * (1.0 - PREFETCH_GAIN)
    gain = PREFETCH_GAIN if plan.feasible else 0.0
    return (plan.predicted_peak_bytes or 0) < (than.predicted_peak_bytes or 0) * (1.0 - gain)


def _solve_at(
    flat: FlatProfile,
    ws: Workspace,
    legal: np.ndarray,
    budget: int | None,
    overhead: float | None,
    prefetch: int,
) -> Plan:
    """``solve`` at one reload depth; an infeasible budget gives the most frugal plan."""
    keep = np.zeros(flat.n_storages, dtype=np.int8)
    keep_res = ws.run(keep, prefetch)
    if budget is None and overhead is None:
        return _make_plan(flat, keep, keep_res, budget=None)
    if budget is not None and keep_res.peak <= budget:
        return _make_plan(flat, keep, keep_res, budget=budget)
    fam = _build_family(flat, ws, legal, prefetch, keep_res)
    times, peaks = fam.times, fam.peaks
    base = keep_res.step
    limit = base * (1.0 + overhead) * (1 + 1e-12) if overhead is not None else math.inf
    # pinned host memory: a plan may not offload more than the host limit
    host_ok = _within_host(fam.results, flat.host_limit_bytes)
    notes: list[str] = []
    if budget is None:
        i = _pick(times, peaks, host_ok & (times <= limit), peaks.astype(np.float64), times)
        res = fam.results[i]
        notes.append(
            f"no budget given: smallest predicted peak ({format_bytes(res.peak)}) within "
            f"max_overhead {overhead:.1%} (predicted overhead {_overhead(res.step, base)})"
        )
        return _make_plan(flat, fam.places[i], res, budget=None, notes=notes)
    fits = host_ok & (peaks <= budget)
    if not bool(np.any(fits)):
        i, smallest = _frugal(times, peaks, host_ok)
        res = fam.results[i]
        notes.append(
            f"budget {format_bytes(budget)} cannot be met; the smallest feasible budget is "
            f"{format_bytes(smallest)} ({smallest} bytes); this is the most memory-frugal plan"
        )
        return _make_plan(
            flat,
            fam.places[i],
            res,
            budget=budget,
            feasible=False,
            min_feasible=smallest,
            notes=notes,
        )
    i = _pick(times, peaks, fits, times, peaks.astype(np.float64))
    res = fam.results[i]
    if overhead is not None and res.step > limit:
        notes.append(
            f"meeting budget {format_bytes(budget)} costs a predicted overhead of "
            f"{_overhead(res.step, base)}, above max_overhead {overhead:.1%}; the plan meets the budget"
        )
    return _make_plan(flat, fam.places[i], res, budget=budget, notes=notes)


def _overhead(step: float, base: float) -> str:
    """``step`` over the all-KEEP ``base`` as a percentage (seconds when ``base`` is 0)."""
    return f"{step / base - 1:.1%}" if base > 0 else f"+{step:.3g} s"


def exhaustive_solve(
    profile: Profile,
    budget_bytes: int | None,
    *,
    prefetch_regions: int = 2,
    allow_offload: bool = True,
    max_plans: int = 200_000,
) -> Plan:
    """Best plan by trying every legal placement of every storage (tiny profiles only).

    Same contract as ``solve``'s ``infeasible='warn'``. Raises ValueError when there are
    more than ``max_plans`` combinations.
    """
    budget = _check_budget(budget_bytes)
    prefetch = check_prefetch(prefetch_regions)
    flat = flatten(profile)
    ws = Workspace(flat)
    legal = flat.choice.copy()
    if not allow_offload or not flat.has_link:
        legal &= ~OFFLOAD_BIT
    choices = [[p for p in (0, 1, 2) if legal[i] & (1 << p)] for i in range(flat.n_storages)]
    total = math.prod(len(c) for c in choices)
    if total > max_plans:
        raise ValueError(
            f"exhaustive search over {total} plans exceeds max_plans={max_plans}; use solve() "
            "or a smaller profile"
        )
    best: tuple[float, int] | None = None
    best_place = np.zeros(flat.n_storages, dtype=np.int8)
    best_res = None
    frugal: list[tuple[SimResult, np.ndarray]] = []  # (result, placement) of every plan the host allows
    place = np.zeros(flat.n_storages, dtype=np.int8)
    for combo in itertools.product(*choices):
        place[:] = combo
        res = ws.run(place, prefetch)
        if 0 < flat.host_limit_bytes < res.d2h_bytes:
            continue
        if (budget is None or res.peak <= budget) and (best is None or (res.step, res.peak) < best):
            best = (res.step, res.peak)
            best_place, best_res = place.copy(), res
        if best_res is None:
            frugal.append((res, place.copy()))
    if best_res is not None:
        return _make_plan(flat, best_place, best_res, budget=budget)
    assert frugal and budget is not None  # the loop ran at least once
    times = np.asarray([r.step for r, _ in frugal], dtype=np.float64)
    peaks = np.asarray([r.peak for r, _ in frugal], dtype=np.int64)
    i, smallest = _frugal(times, peaks, np.ones(len(frugal), dtype=bool))
    return _make_plan(
        flat,
        frugal[i][1],
        frugal[i][0],
        budget=budget,
        feasible=False,
        min_feasible=smallest,
        notes=[f"budget {format_bytes(budget)} cannot be met; smallest feasible {format_bytes(smallest)}"],
    )
