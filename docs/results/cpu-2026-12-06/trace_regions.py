"""Host time per region call in the forward of the profiled H200 step of 2026-12-04
(docs/results/h200-2026-12-04/run1/profile_trace_4096.json.gz: gpu-1.3b at 4096 tokens,
auto at 25%, the second planned step, under torch.profiler): each region's span, the
top-level ops in it (with its D2H ``copy_`` ops apart), and the time between them
(Python: the model's and the runtime's).

    cd REPO && python3 docs/results/cpu-2026-12-06/trace_regions.py
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

TRACE = Path(__file__).resolve().parents[1] / "h200-2026-12-04" / "run1" / "profile_trace_4096.json.gz"


def main() -> None:
    with gzip.open(TRACE) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    regions = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("region::")),
        key=lambda e: e["ts"],
    )
    print(f"{'region':18} {'span':>8} {'ops':>8} {'copy_':>7} {'n':>3} {'between':>8} {'ops n':>5}  (us)")
    for r in regions:
        t0, t1 = r["ts"], r["ts"] + r["dur"]
        inside = sorted((o for o in ops if o["tid"] == r["tid"] and o["ts"] >= t0 and o["ts"] + o["dur"] <= t1),
                        key=lambda o: o["ts"])
        top, end = [], -1.0
        for o in inside:
            if o["ts"] >= end:
                top.append(o)
                end = o["ts"] + o["dur"]
        busy = sum(o["dur"] for o in top)
        copies = [o for o in top if o["name"] == "aten::copy_"]
        print(f"{r['name']:18} {r['dur']:8.1f} {busy:8.1f} {sum(o['dur'] for o in copies):7.1f} "
              f"{len(copies):3d} {r['dur'] - busy:8.1f} {len(top):5d}")


if __name__ == "__main__":
    main()
