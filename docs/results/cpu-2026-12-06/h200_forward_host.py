"""The planned steps of the H200 run of 2026-12-04 (docs/results/h200-2026-12-04/run1),
read again: per runner, medians over its planned steps of the step, the forward's device
and host time, what it offloaded, and the planner's predictions.

    cd REPO && python3 docs/results/cpu-2026-12-06/h200_forward_host.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RUN = Path(__file__).resolve().parents[1] / "h200-2026-12-04" / "run1"


def main() -> None:
    print(f"{'seq':>6} {'runner':32} {'step':>7} {'pred':>7} {'fwd dev':>8} {'fwd host':>8} "
          f"{'offloaded':>9} {'storages':>8}  (ms, GiB; medians over planned steps)")
    for seq in (4096, 8192, 16384):
        rows = json.loads((RUN / f"long_seq_{seq}" / "results.json").read_text())["rows"]
        for r in rows:
            extras = r.get("extras") or {}
            if not r["strategy"].startswith("offrecomp") or "report" not in extras:
                continue
            keep = r["strategy"] == "offrecomp_keep"
            steps = [s for s in extras["report"]["steps"] if keep or s["phase"] == "planned"]

            def med(key: str, steps: list[dict] = steps) -> float:
                return statistics.median([s[key] or 0.0 for s in steps])

            print(f"{seq:6d} {r['strategy']:32} {1e3 * med('step_seconds'):7.1f} "
                  f"{1e3 * med('predicted_step_seconds'):7.1f} {1e3 * med('forward_seconds'):8.1f} "
                  f"{1e3 * med('forward_host_seconds'):8.1f} {med('offloaded_bytes') / 2**30:9.2f} "
                  f"{med('storages'):8.0f}")


if __name__ == "__main__":
    main()
