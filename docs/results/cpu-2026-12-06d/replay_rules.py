"""The planner's re-solve and offload-trial rules applied to the step records an H200
wrote on 2026-12-04 (docs/results/h200-2026-12-04/run1/long_seq_*/results.json).

    python docs/results/cpu-2026-12-06d/replay_rules.py

Each `auto` runner's step records hold, per planned step, the measured step time, the
plan's prediction (its solve's on the plan's first step, the live prediction after), the
plan id, the host pause and the bytes offloaded. For each runner this prints:

* the step that would run a re-solved plan under NOTE [Model moves]: a step's record
  holds the live prediction made after the step before it was learnt, so a move of
  more than 5% (a fifth of drift 0.25) from the one the plan was judged at, on two
  records in a row, marks a re-solve that the second record's own step starts with.
  The records after it are the old plan's, which that run kept: the rule is not read
  on past the first mark;
* the passes NOTE [Offload trial] watches under each rule: before (every planned pass
  of an offloading plan) and now (not a plan's first pass, not one a host pause
  distorted: over 1 ms and over 10% of the step), and the median of the first three.

It cannot say which plan a re-solve would pick: the profiles the runners solved with
were not saved by that run.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "docs/results/h200-2026-12-04/run1"
MOVE, REFRESHES, DRIFT = 0.05, 2, 0.25
TRIAL_PASSES, TRIAL_EXCESS = 3, 0.10


def distorts(pause: float, step: float) -> bool:
    return pause > 1e-3 and pause > 0.1 * step


def main() -> int:
    for tokens in (4096, 8192, 16384):
        data = json.loads((RUN / f"long_seq_{tokens}/results.json").read_text())
        for row in data["rows"]:
            if not row["strategy"].startswith("offrecomp_auto@"):
                continue
            steps = [s for s in row["extras"]["report"]["steps"] if s["phase"] == "planned"]
            print(f"{tokens:6d} {row['strategy']}")
            judged, plan, moves, marked = None, None, 0, False
            before: list[float] = []
            now: list[float] = []
            first_of_plan = True
            for s in steps:
                ms, pred = 1e3 * s["step_seconds"], 1e3 * (s["predicted_step_seconds"] or 0)
                if s["plan_id"] != plan:
                    plan, judged, moves, marked, first_of_plan = s["plan_id"], pred, 0, False, True
                    note = f"plan {plan}: solved for {pred:.1f} ms"
                else:
                    moved = pred / judged - 1
                    if abs(moved) > DRIFT:
                        note = f"live {pred:.1f} ms ({100 * moved:+.1f}%): past drift, re-solve"
                    elif abs(moved) > MOVE and not marked:
                        moves += 1
                        note = f"live {pred:.1f} ms ({100 * moved:+.1f}%), move {moves}"
                        if moves == REFRESHES:
                            note += ": this step would run the re-solved plan"
                            marked = True
                    else:
                        moves = 0
                        note = f"live {pred:.1f} ms ({100 * moved:+.1f}%)"
                offloads = s["offloaded_bytes"] > 0
                pause = s.get("pause_seconds") or 0.0
                if offloads:
                    before.append(ms)
                    if not first_of_plan and not distorts(pause, s["step_seconds"]):
                        now.append(ms)
                first_of_plan = False
                print(f"    step {s['step']:2d}  {ms:6.1f} ms  pause {1e3 * pause:6.1f} ms  "
                      f"{'offloads' if offloads else 'no offload':10s}  {note}")
            for name, seen in (("before", before), ("now", now)):
                first = seen[:TRIAL_PASSES]
                med = f"{statistics.median(first):.1f} ms" if len(first) == TRIAL_PASSES else "-"
                print(f"    trial watched ({name}): {', '.join(f'{x:.1f}' for x in first)}; median {med}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
