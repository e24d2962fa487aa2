"""Summary of out/*.json: per case and budget, the planned steps' worst ratios and flags.
cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/summarize.py [outdir] > docs/results/cpu-2026-12-05zd/out/summary.txt
(outdir defaults to this folder's out/)"""
import glob, json, sys
from pathlib import Path
d = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent / "out")
M = lambda n: "-" if n is None else f"{n/1e6:.2f}"
print(f"{'case':12} {'Kb':>6} {'Rb':>6} {'Ka':>6} {'Ra':>6} {'Pa':>6} {'Ca':>6} | {'f':>4} {'B':>6} {'#pl':>3} {'books/B':>7} {'pred/B':>6} {'a/(Ka-Kb+B)':>11} {'a/docbound':>10} {'a/Ra':>5} {'bitw':>4} warns  flags")
for f in sorted(glob.glob(f"{d}/*.json")):
    r = json.load(open(f))
    head = f"{r['case']:12} {M(r['keep_books']):>6} {M(r['rec_books']):>6} {M(r['keep_alloc']):>6} {M(r['rec_alloc']):>6} {M(r['plain_alloc']):>6} {M(r['ckpt_alloc']):>6}"
    for run in r["runs"]:
        B = run["B"]; pl = [s for s in run["steps"] if s.get("phase") == "planned"]
        if pl:
            bb = max(s["books"] for s in pl) / B
            pb = max((s["pred"] or 0) for s in pl) / B
            ak = max(s["alloc"] / s["exp_keep"] for s in pl)
            ad = max(s["alloc"] / s["allowed_rec"] for s in pl)
            ar = max(s["alloc"] for s in pl) / r["rec_alloc"]
        else:
            bb = pb = ak = ad = ar = float("nan")
        bit = all(s["bitwise"] for s in run["steps"])
        flags = sorted({fl.split(":")[0] for s in pl for fl in s["flags"]})
        warns = len(run["warnings"])
        phases = "".join(s.get("phase", "?")[0] for s in run["steps"])
        print(f"{head} | {run['frac']:>4} {M(B):>6} {len(pl):>3} {bb:>7.3f} {pb:>6.3f} {ak:>11.3f} {ad:>10.3f} {ar:>5.2f} {('Y' if bit else 'N'):>4} {warns:>5}  {phases} {','.join(flags)}")
        head = " " * len(head)
print("\nKb/Rb: keep/recompute books; Ka/Ra/Pa/Ca: allocator peak keep/recompute/plain/checkpoint; "
      "books/B, pred/B: worst planned step; a/(Ka-Kb+B): allocator vs keep's peak minus the saving its books imply; "
      "a/docbound: allocator vs reliability.md's bound rec_alloc+(B-Rb)+5%B; phases: m=measure c=calibrate p=planned")
