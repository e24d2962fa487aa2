"""How often scheduler.solve() finds the optimum: against exhaustive search on random
tiny profiles, with the replay rules the runtime uses (views, a dispatch-mode cost per
op drawn from 0, 0.05 and 0.3 s).

    python benchmarks/solver_optimality.py [--profiles 1500] [--dataflow 2400]

Two families from the property tests' generators (``tests/scheduler/instances.py``):
profiles without dataflow and profiles with random reads, sinks and views. Each gets up to
four budgets from the smallest feasible one to just under keep-all. A pair matches when
the solver's plan is as fast as the exhaustive optimum (relative 1e-9), or when both
find the budget infeasible with the same smallest feasible budget.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._args import count
from scheduler import Plan, Profile, exhaustive_solve, simulate, solve
from tests.scheduler.instances import random_dataflow_profile, random_profile


def budgets(profile: Profile) -> list[int]:
    keep = simulate(profile, Plan()).peak_bytes
    frugal = exhaustive_solve(profile, 0)
    floor = frugal.min_feasible_budget_bytes or frugal.predicted_peak_bytes or 0
    return sorted({floor, floor + (keep - floor) // 4, (floor + keep) // 2, max(keep - 1, 0)})


def run(name: str, make: Callable[[int], Profile], n: int, seed0: int) -> bool:
    pairs = matched = over = 0
    misses: list[tuple[int, int, float]] = []
    for seed in range(seed0, seed0 + n):
        profile = make(seed)
        profile.replay_op_seconds = random.Random(seed).choice([0.0, 0.0, 0.05, 0.3])
        for budget in budgets(profile):
            best = exhaustive_solve(profile, budget)
            plan = solve(profile, budget_bytes=budget, log_infeasible=False)
            pairs += 1
            if best.feasible and plan.feasible:
                assert plan.predicted_step_seconds is not None
                assert best.predicted_step_seconds is not None
                over += (plan.predicted_peak_bytes or 0) > budget
                gap = plan.predicted_step_seconds / max(best.predicted_step_seconds, 1e-300) - 1.0
                if gap <= 1e-9:
                    matched += 1
                else:
                    misses.append((seed, budget, gap))
            elif not best.feasible and not plan.feasible:
                ok = plan.min_feasible_budget_bytes == best.min_feasible_budget_bytes
                matched += ok
                if not ok:
                    misses.append((seed, budget, float("nan")))
            else:
                misses.append((seed, budget, float("nan")))
    print(
        f"{name}: {n} profiles, {pairs} (profile, budget) pairs: {matched} matched, "
        f"{len(misses)} not; {over} over budget"
    )
    for seed, budget, gap in misses:
        print(f"  miss: seed {seed}, budget {budget} B: {gap:+.2%} slower than the optimum")
    return over == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--profiles", type=count(1), default=1500, help="profiles without dataflow, 1 or more (default 1500)"
    )
    ap.add_argument(
        "--dataflow", type=count(1), default=2400, help="profiles with dataflow, 1 or more (default 2400)"
    )
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    ok = run("no dataflow", random_profile, args.profiles, 10_000)
    ok &= run("dataflow", random_dataflow_profile, args.dataflow, 20_000)
    print(f"{time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
