"""Is solve()'s plan a local optimum of the model? From it, take the best single-storage
change (KEEP, OFFLOAD, RECOMPUTE) that lowers the predicted step within the budget, again
and again; where none does, try pairs: a kept storage offloaded with a dropped one kept, a dropped storage
offloaded with an offloaded one kept or dropped, or a dropped storage kept with a kept
one of the same region dropped (the first pair that lowers the step is taken).

    python local_search.py PROFILE.json SHARE SECONDS
SHARE: the budget as a share of all-KEEP's predicted peak."""
import sys, time, dataclasses
from scheduler import Profile, solve, predict, Placement
p = Profile.load(sys.argv[1]); frac = float(sys.argv[2])
K, O, R = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE
allkeep = predict(p, solve(p, budget_bytes=None)); b = int(frac * allkeep.peak_bytes)
plan = solve(p, budget_bytes=b, log_infeasible=False)
def ev(pl):
    try:
        return predict(p, dataclasses.replace(plan, placements=pl, releases=()))
    except ValueError:
        return None
cur = dict(plan.placements); cur_t = predict(p, plan).step_seconds; t_solve = cur_t
print(f"solve {cur_t*1e3:.2f}")
t0 = time.perf_counter(); budget_s = float(sys.argv[3])
while time.perf_counter() - t0 < budget_s:
    best = None
    keys = list(cur)
    # single moves
    for k in keys:
        for o in (K, O, R):
            if o != cur[k]:
                pl = dict(cur); pl[k] = o; pr = ev(pl)
                if pr and pr.peak_bytes <= b and pr.step_seconds < cur_t - 1e-7 and (best is None or pr.step_seconds < best[0]):
                    best = (pr.step_seconds, pl)
    if best is None:
        # pair moves: a -> OFFLOAD (from R), c from OFFLOAD -> K or R; or R->K with K->R
        offl = [k for k in keys if cur[k] == O]; rec = [k for k in keys if cur[k] == R]; kep = [k for k in keys if cur[k] == K]
        cands = [(a, O, c, K) for a in kep for c in rec]  # offload a kept one, keep a dropped one
        cands += [(a, O, c, x) for a in rec for c in offl for x in (K, R)]
        cands += [(a, K, c, R) for a in rec for c in kep if c[0] == a[0]]
        print(f"pairs: {len(cands)}", flush=True)
        for a, oa, c, oc in cands:
            if time.perf_counter() - t0 > budget_s: break
            pl = dict(cur); pl[a] = oa; pl[c] = oc; pr = ev(pl)
            if pr and pr.peak_bytes <= b and pr.step_seconds < cur_t - 1e-7:
                best = (pr.step_seconds, pl); break
    if best is None:
        break
    cur_t, cur = best[0], best[1]
    print(f"{cur_t*1e3:.2f} ({time.perf_counter()-t0:.0f}s)", flush=True)
print(f"final {cur_t*1e3:.2f} vs solve {t_solve*1e3:.2f}: {cur_t/t_solve:.4f}")
