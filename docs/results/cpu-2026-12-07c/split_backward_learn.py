"""(d) continued: what each learnt pass feeds learn_backward under 1F1B vs all-forwards-first."""
import sys, runpy
import offrecomp.planning.learning as L
LEARN = []
_orig = L.learn_backward
def lb(p, measured, *, clock, calibrating, on_device=False):
    bwd_total = clock.seconds(p.backward_start_mark, p.backward_end_mark)
    replay = sum(clock.seconds(a, b) or 0.0 for _, a, b in p.replay_marks)
    est = sum(r.backward_seconds for r in measured.regions)
    before = [r.backward_seconds for r in measured.regions]
    ok = _orig(p, measured, clock=clock, calibrating=calibrating, on_device=on_device)
    after = [r.backward_seconds for r in measured.regions]
    LEARN.append(dict(phase=str(p.phase), calls=len(p.calls), replay_marks=len(p.replay_marks),
                      backward_ends=len(p.backward_ends), bwd_span=round(bwd_total or 0, 4), replay=round(replay, 4),
                      est_sum_region_bwd=round(est, 4), scale=round(after[0] / before[0], 3) if before[0] else None))
    return ok
L.learn_backward = lb
sys.argv = ["split_backward.py"] + sys.argv[1:]
try:
    from pathlib import Path
    runpy.run_path(str(Path(__file__).resolve().parent / "split_backward.py"), run_name="__main__")
finally:
    for x in LEARN: print("LEARN", x, file=sys.stderr)
