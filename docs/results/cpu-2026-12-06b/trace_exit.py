"""The exit of each region call in the forward of the profiled H200 step of 2026-12-04
(docs/results/h200-2026-12-04/run1/profile_trace_4096.json.gz: gpu-1.3b at 4096 tokens,
auto at 25%, the second planned step, under torch.profiler without Python stacks): from
the end of the region's last model op (its second residual ``aten::add``) to the end of
the region's span, the time in the offload engine's ``copy_`` ops, in the ops that make
the host views of the slots (``slice``, ``view``, ``as_strided``), in the ops that make a
flat tensor over a storage (``empty``, ``set_``), in other ops, and between ops (Python:
the runtime's, with the CUDA runtime calls it makes directly: events, queries, waits).

    cd REPO && python3 docs/results/cpu-2026-12-06b/trace_exit.py
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

TRACE = Path(__file__).resolve().parents[1] / "h200-2026-12-04" / "run1" / "profile_trace_4096.json.gz"
VIEWS = {"aten::slice", "aten::view", "aten::as_strided"}
FLAT = {"aten::empty", "aten::set_"}


def main() -> None:
    with gzip.open(TRACE) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    regions = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("region::")),
        key=lambda e: e["ts"],
    )
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
    print(f"{'region':18} {'exit':>7} {'copy_':>7} {'n':>3} {'views':>7} {'flat':>6} {'other':>6} "
          f"{'between':>8} {'rt calls':>8}  (us)")
    for r in regions:
        t0, t1 = r["ts"], r["ts"] + r["dur"]
        inside = sorted((o for o in ops if o["tid"] == r["tid"] and t0 <= o["ts"] and o["ts"] + o["dur"] <= t1),
                        key=lambda o: o["ts"])
        top, end = [], -1.0
        for o in inside:  # top-level ops only
            if o["ts"] >= end:
                top.append(o)
                end = o["ts"] + o["dur"]
        adds = [i for i, o in enumerate(top) if o["name"] == "aten::add"]
        if not adds:
            continue
        last = top[adds[-1]]
        start = last["ts"] + last["dur"]
        tail = top[adds[-1] + 1:]
        busy = {"copy": 0.0, "views": 0.0, "flat": 0.0, "other": 0.0}
        copies = 0
        for o in tail:
            if o["name"] == "aten::copy_":
                busy["copy"] += o["dur"]
                copies += 1
            elif o["name"] in VIEWS:
                busy["views"] += o["dur"]
            elif o["name"] in FLAT:
                busy["flat"] += o["dur"]
            else:
                busy["other"] += o["dur"]
        span = t1 - start
        calls = [e for e in runtime if e["tid"] == r["tid"] and start <= e["ts"] <= t1]
        outside_ops = [e for e in calls if not any(o["ts"] <= e["ts"] <= o["ts"] + o["dur"] for o in tail)]
        print(f"{r['name']:18} {span:7.1f} {busy['copy']:7.1f} {copies:3d} {busy['views']:7.1f} "
              f"{busy['flat']:6.1f} {busy['other']:6.1f} {span - sum(busy.values()):8.1f} "
              f"{len(outside_ops):8d}")


if __name__ == "__main__":
    main()
