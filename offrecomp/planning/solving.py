"""Solving a signature's plan: its budget, the solver's call, the most frugal plan where
no plan meets the budget (NOTE [Small storages]), the plan lent to borrowing passes, and
the pinned host memory a plan's offloads need, prepared ahead."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from offrecomp.config import format_bytes
from offrecomp.measure import host_available_bytes
from offrecomp.planning.drift import MODEL_GAIN
from offrecomp.planning.profiling import chosen_depth, prefetch_depth, save_profile
from offrecomp.transfer import slot_offsets
from scheduler.plan import ROOT, Placement, Plan

if TYPE_CHECKING:
    from offrecomp.planning.entries import PlanEntry
    from offrecomp.planning.host import PlannerHost
    from offrecomp.planning.replay_cost import ReplayCost
    from scheduler.profile import Profile

log = logging.getLogger(__name__)

KEEP, OFFLOAD, RECOMPUTE = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE

#: A first solve slower than this compiled the planner's kernels: say so, once.
SLOW_FIRST_SOLVE_SECONDS = 5.0
_solved_once = False


def offload_allowed(entry: PlanEntry, profile: Profile) -> bool:
    """Offloading needs a GPU and a measured or configured link, and a signature whose
    trial did not settle against it (NOTE [Offload trial])."""
    return (
        entry.trial.allow_offload
        and profile.device == "cuda"
        and profile.d2h_gbps > 0
        and profile.h2d_gbps > 0
    )


def infeasible_note(budget: int, smallest: int) -> str:
    return (
        f"budget {format_bytes(budget)} cannot be met; the smallest feasible budget is "
        f"{format_bytes(smallest)} ({smallest} bytes); this is the most memory-frugal plan"
    )


def offloaded_sizes(profile: Profile, plan: Plan) -> list[int]:
    """The pinned block of each region call's offload group (the root's as one)."""
    blocks = []
    for r in profile.regions:
        sizes = [
            s.nbytes for i, s in enumerate(r.storages)
            if plan.placement((r.name, r.call_index, i)) == OFFLOAD
        ]
        blocks.append(slot_offsets(sizes)[1])
    root = [s.nbytes for i, s in enumerate(profile.root) if plan.placement((ROOT, 0, i)) == OFFLOAD]
    return [n for n in [*blocks, slot_offsets(root)[1]] if n > 0]


# NOTE [Small storages]
# Storages under min_bytes are kept by every plan: a copy of one costs more than it
# saves, and dropping one pays for a replay that plans which keep the rest of its
# region would not run. With small activations (small configs, LoRA's rank-r
# intermediates) they are most of a region's saves, and the most frugal plan that
# keeps them holds more than the measuring pass, which dropped them as forced
# recompute and torch.utils.checkpoint do. So a budget no plan meets is solved again
# with those storages droppable (never offloaded: the runtime keeps a small storage a
# plan offloads), and the plan with the lower predicted peak runs. The budget is
# called infeasible only when the measuring pass did not meet it either, and the
# smallest feasible budget named is the lower of that pass's peak and the frugal
# plan's prediction, the budget this check accepts; the warning waits for the first
# planned step, and is not given when that step met the budget (NOTE [Infeasible
# budgets]). A budget the measuring pass met, where the most frugal plan runs over it,
# gets the over-budget warning, saying that no plan holds less. Such a plan is
# predicted again (NOTE [Live prediction] in drift.py) as it was solved, those storages
# droppable (``PlanEntry.predict``): on the profile as measured it places nowhere.


class Solver:
    """Solves the plans of the planner's entries for the host's budget and config,
    pricing replays at the planner's current replay cost."""

    #: Replay cost per op under the dispatch mode that makes every replay plain.
    PLAIN_REPLAY_OP_SECONDS = 1.0

    def __init__(self, host: PlannerHost, replay_cost: ReplayCost) -> None:
        self.host = host
        self.replay_cost = replay_cost

    def budget_bytes(self, profile: Profile) -> int | None:
        cfg = self.host.config
        device = self.host.device()
        if cfg.budget is not None:
            if cfg.budget.nbytes is not None:
                return cfg.budget.nbytes
            return cfg.budget.resolve(profile.device_capacity_bytes)
        if device.type == "cuda":
            cap = profile.device_capacity_bytes
            return max(0, int(cap * (1.0 - cfg.budget_margin)) - profile.fixed_bytes)
        return int(host_available_bytes() * (1.0 - cfg.budget_margin))

    def entry_budget(self, entry: PlanEntry) -> int | None:
        """The budget ``entry``'s plans are solved for (shrunk after a device OOM)."""
        assert entry.profile is not None
        budget = self.budget_bytes(entry.profile)
        if budget is not None and entry.budget_scale < 1.0:
            budget = int(budget * entry.budget_scale)
        return budget

    def solve_plan(self, entry: PlanEntry, *, allow_offload: bool | None = None) -> Plan:
        """Solve ``entry``'s profile, at its budget, as its replays are priced now."""
        cfg = self.host.config
        profile = entry.profile
        assert profile is not None
        from scheduler.solver import solve

        global _solved_once
        t0 = time.perf_counter()
        budget = self.entry_budget(entry)

        depth = chosen_depth(cfg, profile)

        def solved(budget_bytes: int | None) -> Plan:
            plan = solve(
                profile,
                budget_bytes=budget_bytes,
                max_overhead=cfg.max_overhead,
                prefetch_regions=depth,
                allow_offload=offload_allowed(entry, profile) if allow_offload is None else allow_offload,
                infeasible="warn",  # the entry's own plan raises in solve, after the frugal end
                log_infeasible=False,
            )
            if depth is not None:
                plan.prefetch_regions = None  # the engine reloads as configured (a byte window, say)
            return plan

        plan = None
        if cfg.budget is None and cfg.max_overhead is not None and entry.budget_scale >= 1.0:
            # the automatic budget and an overhead: as much memory as the overhead buys,
            # unless that peak is over the automatic budget
            plan = solved(None)
            if budget is not None and (plan.predicted_peak_bytes or 0) > budget:
                plan = None
        if plan is None:
            plan = solved(budget)
        seconds = time.perf_counter() - t0
        if not _solved_once and seconds > SLOW_FIRST_SOLVE_SECONDS:
            log.warning(
                "offrecomp: the first plan of this process took %.1f s, most of it compiling "
                "the planner's kernels (numba). They are cached on disk for later processes "
                "on this machine; `python -m offrecomp warmup` compiles them ahead (in a "
                "container image's build, say)",
                seconds,
            )
        _solved_once = True
        return plan

    def solve_without_offload(self, entry: PlanEntry) -> Plan:
        """``entry``'s budget solved without offloading (NOTE [Offload trial])."""
        return self.solve_plan(entry, allow_offload=False)

    def frugal_end(self, entry: PlanEntry, plan: Plan) -> Plan:
        """NOTE [Small storages]: the most frugal of ``plan`` (infeasible) and the plan
        solved with every small storage of a replayable region droppable; raises for
        ``infeasible='error'``."""
        plan = self.with_small_dropped(entry, plan)
        measured = entry.measured_peak_bytes
        if any(st.kept_dropped for st in entry.structures.values()):
            measured = None  # it dropped storages every plan keeps: no plan holds that little
        budget = plan.budget_bytes
        if plan.feasible or budget is None:
            return plan
        plan.notes = [n for n in plan.notes if "cannot be met" not in n]
        if measured is not None and measured <= budget:
            plan.feasible = True
            plan.min_feasible_budget_bytes = None
            entry.frugal_plan_id = plan.plan_id
            plan.notes.append(
                f"the most frugal plan is predicted to hold {format_bytes(plan.predicted_peak_bytes or 0)}, "
                f"above the budget {format_bytes(budget)}, but the measuring pass (every droppable "
                f"save dropped) held {format_bytes(measured)}, within it; this is the most "
                "memory-frugal plan"
            )
            return plan
        smallest = min(x for x in (plan.min_feasible_budget_bytes, measured, plan.predicted_peak_bytes) if x)
        plan.min_feasible_budget_bytes = smallest
        if self.host.config.infeasible == "error":
            from scheduler.solver import InfeasibleBudgetError

            raise InfeasibleBudgetError(budget, smallest)
        plan.notes.append(infeasible_note(budget, smallest))
        return plan

    def with_small_dropped(self, entry: PlanEntry, plan: Plan) -> Plan:
        """NOTE [Small storages]: ``plan`` (infeasible), or the plan solved with every
        small storage of a replayable region droppable where that one fits or holds
        less (solved as replays are priced now)."""
        profile = entry.profile
        assert profile is not None
        convert = entry.small_externals(profile)
        if not convert:
            return plan
        for r, i in convert:
            r.storages[i].kind = "activation"
        try:
            frugal = self.solve_plan(entry, allow_offload=False)
        finally:
            for r, i in convert:
                r.storages[i].kind = "external"
        if frugal.feasible or (frugal.predicted_peak_bytes or 0) < (plan.predicted_peak_bytes or 0):
            return frugal  # predicted as it was solved (PlanEntry.predict)
        return plan

    def solve_borrow_plan(self, entry: PlanEntry) -> None:
        """NOTE [Borrowed plans]: a borrowing pass replays plainly (the donor's recording is
        another shape's, so nothing is served), running each replayed block up to its
        last dropped save. The plan it runs is solved for that: the same profile and
        budget with every replay priced as a plain one, which drops whole prefixes where
        the served plan would drop a few late outputs of every block."""
        profile = entry.profile
        assert profile is not None
        saved = profile.replay_op_seconds
        profile.replay_op_seconds = self.PLAIN_REPLAY_OP_SECONDS
        try:
            plan = self.solve_plan(entry)
            if not plan.feasible:
                plan = self.with_small_dropped(entry, plan)
        finally:
            profile.replay_op_seconds = saved
        entry.borrow_plan = plan
        self.pin_ahead(offloaded_sizes(profile, plan))
        log.info(
            "offrecomp: plan %s for passes borrowing signature %s (replays priced plainly): "
            "predicted peak %s, predicted step %.4fs",
            plan.plan_id, entry.signature, format_bytes(plan.predicted_peak_bytes or 0),
            plan.predicted_step_seconds or 0.0,
        )

    def solve(self, entry: PlanEntry) -> None:
        """Solve ``entry``'s own plan (or install the one already solved for it) and
        start its checks afresh: drift window, live prediction."""
        cfg = self.host.config
        profile = entry.profile
        assert profile is not None
        # NOTE [Serving overhead]: price replays as the runtime will run them
        profile.replay_op_seconds = self.replay_cost.seconds
        entry.solved_replay_op_seconds = self.replay_cost.seconds
        # NOTE [Model moves] (drift.py): a plan the trial solved (``next_plan``) runs as it is
        incumbent = entry.incumbent if entry.next_plan is None else None
        entry.incumbent = None
        plan = entry.next_plan if entry.next_plan is not None else self.solve_plan(entry)
        entry.next_plan = None
        entry.borrow_plan = None  # solved again when next lent
        if not plan.feasible:
            plan = self.frugal_end(entry, plan)
        if incumbent is not None and incumbent is entry.plan and self._incumbent_stays(entry, incumbent, plan):
            return
        entry.live_reference = None
        entry.model_moves = 0  # NOTE [Model moves]: counted for this plan's predictions
        entry.plan = plan
        entry.needs_measure = False
        entry.needs_solve = False
        entry.drift_ratios.clear()  # a new prediction: a new window
        entry.live = None
        entry.live_skipped = 0
        entry.learnt_since_solve = entry.learn_skipped = 0  # NOTE [Learning cadence]
        if cfg.profile_path:
            # the profile this plan was solved with (calibrated, smoothed): the latest wins
            save_profile(profile, cfg.profile_path, entry.signature)
        self.pin_ahead(offloaded_sizes(profile, plan))
        _log_plan(entry, plan, profile)

    def _incumbent_stays(self, entry: PlanEntry, incumbent: Plan, plan: Plan) -> bool:
        """NOTE [Model moves] (drift.py): does ``incumbent``, predicted under the estimate
        the re-solve used, fit the budget and run within MODEL_GAIN of the new ``plan``?
        If so it stays, and its prediction becomes the one later moves are judged from."""
        profile = entry.profile
        assert profile is not None
        try:
            depth = incumbent.reload_depth(prefetch_depth(self.host.config.prefetch, profile))
            now = entry.predict(profile, incumbent, prefetch_regions=depth)
        except ValueError:  # it no longer places on this profile
            return False
        budget = incumbent.budget_bytes
        fits = incumbent.feasible and (budget is None or now.peak_bytes <= budget)
        new = plan.predicted_step_seconds
        if not fits or (plan.feasible and new is not None and new < (1.0 - MODEL_GAIN) * now.step_seconds):
            return False
        entry.needs_solve = False
        entry.live = now
        entry.live_reference = now.step_seconds
        if self.host.config.profile_path:  # the profile it was judged on, as at a solve
            save_profile(profile, self.host.config.profile_path, entry.signature)
        log.info(
            "offrecomp: signature %s keeps plan %s (predicted %.4fs a step): the plan solved "
            "again, %s, is predicted %.4fs",
            entry.signature, incumbent.plan_id, now.step_seconds, plan.plan_id, new or 0.0,
        )
        return True

    def pin_ahead(self, sizes: list[int]) -> None:
        """Pin the plan's host memory now, outside any step: the pool would otherwise pin
        it inside the first planned step (seconds for gigabytes), which that step's
        timing, and the drift check, would take for the plan's cost."""
        if not sizes:
            return
        t0 = time.perf_counter()
        engine = self.host.engine()
        # NOTE [Window under a plan]: the plan counts in-flight bytes itself
        reserved = engine.prepare(sizes, window_bytes=max(engine.window_bytes, sum(sizes)))
        log.info(
            "offrecomp: pinned pool ready for %s of planned offloads: %s reserved in %.2fs",
            format_bytes(sum(sizes)), format_bytes(reserved), time.perf_counter() - t0,
        )


def _log_plan(entry: PlanEntry, plan: Plan, profile: Profile) -> None:
    """One INFO line for the plan applied, one for the inputs it was solved from."""
    counts = {p: 0 for p in Placement}
    nbytes = {p: 0 for p in Placement}
    for r in profile.regions:
        _, n, b = plan.held_totals(r.name, r.call_index, r.storages)
        for p in Placement:
            counts[p] += n[p]
            nbytes[p] += b[p]
    log.info(
        "offrecomp: plan %s for %s: keep %d (%s), offload %d (%s), recompute %d (%s); "
        "budget %s, predicted peak %s, predicted step %.4fs%s",
        plan.plan_id, entry.signature,
        counts[KEEP], format_bytes(nbytes[KEEP]), counts[OFFLOAD], format_bytes(nbytes[OFFLOAD]),
        counts[RECOMPUTE], format_bytes(nbytes[RECOMPUTE]),
        "none" if plan.budget_bytes is None else format_bytes(plan.budget_bytes),
        format_bytes(plan.predicted_peak_bytes or 0), plan.predicted_step_seconds or 0.0,
        "" if plan.feasible else " (budget NOT met: " + "; ".join(plan.notes) + ")",
    )
    log.info(
        "offrecomp: the plan's inputs: forward %.4fs (regions %.4fs), backward %.4fs "
        "(regions %.4fs), ops %.4fs, link %.1f/%.1f GB/s, replay %.1f us per op; predicted "
        "forward %.4fs, replay %.4fs, stall %.4fs",
        profile.forward_seconds, sum(r.forward_seconds for r in profile.regions),
        profile.backward_seconds, sum(r.backward_seconds for r in profile.regions),
        sum(op.seconds for r in profile.regions for op in r.ops),
        profile.d2h_gbps, profile.h2d_gbps, 1e6 * profile.replay_op_seconds,
        plan.predicted_forward_seconds, plan.predicted_recompute_seconds,
        plan.predicted_stall_seconds,
    )
