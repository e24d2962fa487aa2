"""Where each offrecomp run's model is off: measured over predicted, part by part.

    python benchmarks/model_fit.py RESULTS.json [--out fit.json]

``RESULTS.json`` is the ``results.json`` that ``python -m benchmarks.long_seq`` writes;
each offrecomp row carries the runtime's step records (``extras.report.steps``). For each
row with planned steps this prints the medians, over its steady planned steps (each
plan's first step and steps a host pause distorted left out, as ``offload_checks.py``
does), of measured over predicted step, forward (start of the step to the start of
backward), replay and the rest of the step (backward without replays, stalls), the
stall measured and predicted, and the host's share of the forward (forward host seconds
over forward device seconds: under 1, the host ran ahead of the device). It reads what the
runtime recorded and judges nothing; the exit status is 0, or 2 (and nothing printed but why)
when the file cannot be read or is no long_seq results file (a planner profile, a run's report).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._args import out_file, read_results
from benchmarks.offload_checks import planned_records, steady_records

COLUMNS = ("step", "forward", "replay", "rest", "stall ms", "host/dev fwd", "steps")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted:
        return None
    return measured / predicted


def fit(row: dict[str, Any]) -> dict[str, Any] | None:
    """The medians of one long_seq row's steady planned steps (None: no such step)."""
    steps = steady_records([s for s in planned_records(row) if s.get("step_seconds")], row)
    if not steps:
        return None

    def part(s: dict[str, Any], name: str) -> tuple[float | None, float | None]:
        return s.get(f"{name}_seconds"), s.get(f"predicted_{name}_seconds")

    def rest(s: dict[str, Any]) -> tuple[float | None, float | None]:
        m = [s.get(k) for k in ("step_seconds", "forward_seconds", "recompute_seconds")]
        p = [s.get(k) for k in ("predicted_step_seconds", "predicted_forward_seconds", "predicted_recompute_seconds")]
        if any(x is None for x in m + p):
            return None, None
        return m[0] - m[1] - m[2], p[0] - p[1] - p[2]  # type: ignore[operator]

    out: dict[str, Any] = {"strategy": row["strategy"], "seq": int(row["seq"]), "steps": len(steps)}
    for name, pick in (
        ("step", lambda s: part(s, "step")), ("forward", lambda s: part(s, "forward")),
        ("replay", lambda s: (s.get("recompute_seconds"), s.get("predicted_recompute_seconds"))), ("rest", rest),
    ):
        out[name] = _median([r for r in (_ratio(*pick(s)) for s in steps) if r is not None])
    out["stall_ms"] = _median([1e3 * float(s.get("stall_seconds") or 0.0) for s in steps])
    out["predicted_stall_ms"] = _median([1e3 * float(s.get("predicted_stall_seconds") or 0.0) for s in steps])
    out["host_per_device_forward"] = _median(
        [s["forward_host_seconds"] / s["forward_seconds"] for s in steps
         if s.get("forward_host_seconds") and s.get("forward_seconds")]
    )
    return out


def _cell(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="results.json of python -m benchmarks.long_seq")
    ap.add_argument("--out", type=out_file(), help="write the figures as JSON here")
    args = ap.parse_args(argv)
    data = read_results(ap, args.results)
    fits = [f for f in (fit(r) for r in data.get("rows", []) if r.get("status") == "ok") if f is not None]
    print("measured / predicted, medians of the steady planned steps")
    print(f"{'strategy':32s}{'seq':>7s}" + "".join(f"{c:>14s}" for c in COLUMNS))
    for f in fits:
        stall = f"{_cell(f['stall_ms'], '{:.1f}')}/{_cell(f['predicted_stall_ms'], '{:.1f}')}"
        cells = [_cell(f["step"]), _cell(f["forward"]), _cell(f["replay"]), _cell(f["rest"]), stall,
                 _cell(f["host_per_device_forward"], "{:.2f}"), str(f["steps"])]
        print(f"{f['strategy']:32s}{f['seq']:7d}" + "".join(f"{c:>14s}" for c in cells))
    if args.out:
        Path(args.out).write_text(json.dumps(fits, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
