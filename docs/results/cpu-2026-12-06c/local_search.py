"""Is solve()'s plan a local optimum of the model? From it, take the best single-storage
change (KEEP, OFFLOAD, RECOMPUTE) that lowers the predicted step within the budget, again
and again; where none does, try pairs: a kept storage offloaded with a dropped one kept, a
dropped storage offloaded with an offloaded one kept or dropped, or a dropped storage
kept with a kept one of the same region dropped (the first pair that lowers the step is
taken).

    python local_search.py PROFILE.json SHARE SECONDS
SHARE: the budget as a share of all-KEEP's predicted peak; SECONDS: the search's limit.
"""

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
from scheduler import Placement, Prediction, Profile, predict, solve

KEEP, OFFLOAD, DROP = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE


def main() -> None:
    profile = Profile.load(sys.argv[1])
    share, limit = float(sys.argv[2]), float(sys.argv[3])
    budget = int(share * predict(profile, solve(profile, budget_bytes=None)).peak_bytes)
    plan = solve(profile, budget_bytes=budget, log_infeasible=False)

    def evaluate(placements: dict) -> Prediction | None:
        try:
            return predict(profile, dataclasses.replace(plan, placements=placements, releases=()))
        except ValueError:  # a placement the storage's kind does not allow
            return None

    def better(pred: Prediction | None, than: float) -> bool:
        return pred is not None and pred.peak_bytes <= budget and pred.step_seconds < than - 1e-7

    cur, cur_t = dict(plan.placements), predict(profile, plan).step_seconds
    solved = cur_t
    print(f"solve {cur_t * 1e3:.2f}")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        best = None
        for key in cur:
            for to in (KEEP, OFFLOAD, DROP):
                if to != cur[key]:
                    trial = {**cur, key: to}
                    pred = evaluate(trial)
                    if better(pred, cur_t if best is None else best[0]):
                        best = (pred.step_seconds, trial)
        if best is None:
            kept = [k for k in cur if cur[k] == KEEP]
            offloaded = [k for k in cur if cur[k] == OFFLOAD]
            dropped = [k for k in cur if cur[k] == DROP]
            pairs = [(a, OFFLOAD, c, KEEP) for a in kept for c in dropped]
            pairs += [(a, OFFLOAD, c, to) for a in dropped for c in offloaded for to in (KEEP, DROP)]
            pairs += [(a, KEEP, c, DROP) for a in dropped for c in kept if c[0] == a[0]]
            print(f"pairs: {len(pairs)}", flush=True)
            for a, to_a, c, to_c in pairs:
                if time.perf_counter() - t0 > limit:
                    break
                trial = {**cur, a: to_a, c: to_c}
                pred = evaluate(trial)
                if better(pred, cur_t):
                    best = (pred.step_seconds, trial)
                    break
        if best is None:
            break
        cur_t, cur = best
        print(f"{cur_t * 1e3:.2f} ({time.perf_counter() - t0:.0f}s)", flush=True)
    print(f"final {cur_t * 1e3:.2f} vs solve {solved * 1e3:.2f}: {cur_t / solved:.4f}")


if __name__ == "__main__":
    main()
