"""Per case, auto's worst measure or calibrate step at the 30% budget against recompute's
allocator peak, from <outdir>/*.json (default: this folder's out/); a step over 1.2x
recompute's is marked <--. Prints out/measure_calibrate_steps.txt.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/measure_calibrate.py [outdir]
"""
import glob
import json
import sys
from pathlib import Path

d = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent / "out")
for f in sorted(glob.glob(f"{d}/*.json")):
    r = json.load(open(f))
    run = r["runs"][0]
    mc = [s for s in run["steps"] if s.get("phase") in ("measure", "calibrate")]
    w = max(mc, key=lambda s: s["alloc"])
    flag = "  <--" if w["alloc"] > 1.2 * r["rec_alloc"] else ""
    print(f"{r['case']:18} rec_alloc {r['rec_alloc']/1e6:7.2f}  B0.3 {run['B']/1e6:7.2f}  worst measure/calibrate step {w['step']} "
          f"{w['phase']:9} alloc {w['alloc']/1e6:7.2f} books {w['books']/1e6:6.2f}{flag}")
