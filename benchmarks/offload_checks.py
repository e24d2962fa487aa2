"""The GPU criteria of an offloading plan, read off a long-sequence comparison.

    python benchmarks/offload_checks.py RESULTS.json [--out checks.json]

``RESULTS.json`` is the ``results.json`` that ``python -m benchmarks.long_seq`` writes.
For each sequence length it holds, this prints one line per criterion with the figures
it was judged by and its verdict:

* ``keep``: ``offrecomp_keep`` within 1% of plain (``none``);
* for each budget ``X`` that ran (``offrecomp_auto@X``):
  - ``offloads``: the planned steps offloaded something (a plan that never offloads
    says nothing of offloading);
  - ``prediction``: the planned steps that offloaded ran within 10% of their prediction
    (the runtime's own records: the median of measured over predicted step time), in
    steady state: a plan's first step (one-time costs) and steps a host pause distorted
    (over 1 ms of collections and over 10% of the step, the runtime's own rule) are left
    out, and the line also gives the median over every offloading step;
  - ``vs no offload``: at least 5% faster than ``offrecomp_auto_no_offload@X``, the
    best plan the planner makes at that budget when nothing can be offloaded; its line
    also gives the ratio the planner predicted for the two plans (the medians of their
    planned steps' predictions), which tells a runtime short of its model from a model
    that expected no 5% there;
  - ``vs peers``: faster than every peer (``ckpt_block``, ``ckpt_sqrt``, ``sac_matmul``,
    ``save_on_cpu``) whose step-memory peak is at or below its own.

A criterion whose strategies did not run (or failed) is ``n/a``, named as such; the exit
status is 1 when any criterion failed, else 0, and 2 when the file cannot be read or is no
long_seq results file (a planner profile, a run's report: the message says which). The thresholds are ``KEEP_MAX``,
``PREDICTION_TOL``, ``NO_OFFLOAD_MAX`` below.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._args import out_file, read_results
from offrecomp.measure import distorts

KEEP_MAX = 1.01  # keep's step time over plain's
PREDICTION_TOL = 0.10  # measured over predicted, either way
NO_OFFLOAD_MAX = 0.95  # auto's step time over the no-offload plan's at the same budget
PEERS = ("ckpt_block", "ckpt_sqrt", "sac_matmul", "save_on_cpu")


@dataclass
class Check:
    seq: int
    name: str
    verdict: str  # "pass", "fail" or "n/a"
    detail: str


def _rows(data: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["strategy"], int(r["seq"])): r for r in data.get("rows", []) if r.get("status") == "ok"}


def _budgets(rows: dict[tuple[str, int], dict[str, Any]], seq: int) -> list[str]:
    """The budgets ``X`` of the ``offrecomp_auto@X`` rows at ``seq`` (not ``@budget``)."""
    out = []
    for name, s in rows:
        if s == seq and name.startswith("offrecomp_auto@") and name != "offrecomp_auto@budget":
            out.append(name.split("@", 1)[1])
    return sorted(out, key=lambda x: float(x.rstrip("%")), reverse=True)


def planned_records(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The runtime's planned step records of ``row`` that carry a prediction."""
    report = row.get("extras", {}).get("report")
    steps = report.get("steps", []) if isinstance(report, dict) else []
    return [s for s in steps if isinstance(s, dict) and s.get("phase") == "planned" and s.get("predicted_step_seconds")]


def _planned_offloading(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Those of them that offloaded bytes (and were measured)."""
    return [s for s in planned_records(row) if (s.get("offloaded_bytes") or 0) > 0 and s.get("step_seconds")]


def steady_records(steps: list[dict[str, Any]], row: dict[str, Any]) -> list[dict[str, Any]]:
    """``steps`` (of ``row``'s planned records) less each plan's first step and those a
    host pause distorted (NOTE [Host pauses] in offrecomp/measure.py)."""
    firsts, seen = set(), set()
    for s in planned_records(row):
        if s.get("plan_id") not in seen:
            seen.add(s.get("plan_id"))
            firsts.add(id(s))
    return [
        s for s in steps
        if id(s) not in firsts and not distorts(float(s.get("pause_seconds") or 0.0), s["step_seconds"])
    ]


def _ratio(steps: list[dict[str, Any]]) -> float:
    return statistics.median(s["step_seconds"] / s["predicted_step_seconds"] for s in steps)


def _predicted(row: dict[str, Any]) -> float | None:
    """The median predicted step seconds of ``row``'s planned steps (None: no prediction)."""
    found = [float(s["predicted_step_seconds"]) for s in planned_records(row)]
    return statistics.median(found) if found else None


def _ms(row: dict[str, Any]) -> float:
    return float(row["median_ms"])


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def checks(data: dict[str, Any]) -> list[Check]:
    """Every criterion of the module docstring, for every sequence length in ``data``."""
    rows = _rows(data)
    seqs = sorted({int(r["seq"]) for r in data.get("rows", [])})
    out: list[Check] = []
    for seq in seqs:
        plain = rows.get(("none", seq))
        keep = rows.get(("offrecomp_keep", seq))
        if plain is None or keep is None:
            out.append(Check(seq, "keep", "n/a", "needs none and offrecomp_keep"))
        else:
            ratio = _ms(keep) / _ms(plain)
            out.append(Check(seq, "keep", "pass" if ratio <= KEEP_MAX else "fail",
                             f"{_ms(keep):.1f} / {_ms(plain):.1f} ms = {ratio:.3f} (<= {KEEP_MAX})"))
        budgets = _budgets(rows, seq)
        if not budgets:
            out.append(Check(seq, "auto", "n/a", "no offrecomp_auto@X ran"))
        for x in budgets:
            auto = rows[(f"offrecomp_auto@{x}", seq)]
            out += _auto_checks(rows, seq, x, auto)
    return out


def _auto_checks(rows: dict[tuple[str, int], dict[str, Any]], seq: int, x: str, auto: dict[str, Any]) -> list[Check]:
    out = []
    offloading = _planned_offloading(auto)
    moved = auto.get("extras", {}).get("median_offloaded_bytes")
    out.append(Check(seq, f"auto@{x} offloads", "pass" if offloading else "fail",
                     f"{len(offloading)} planned steps offloaded; median offloaded {_gib(moved)}"))
    steady = steady_records(offloading, auto)
    if steady:
        ratio = _ratio(steady)
        ok = abs(ratio - 1) <= PREDICTION_TOL
        out.append(Check(seq, f"auto@{x} prediction", "pass" if ok else "fail",
                         f"measured/predicted {ratio:.3f} over {len(steady)} steady offloading steps "
                         f"(within {PREDICTION_TOL:.0%}; {_ratio(offloading):.3f} over all {len(offloading)})"))
    elif offloading:
        out.append(Check(seq, f"auto@{x} prediction", "n/a",
                         f"no steady offloading step ({len(offloading)} offloading steps: first of a plan or paused; "
                         f"measured/predicted {_ratio(offloading):.3f} over them)"))
    else:
        out.append(Check(seq, f"auto@{x} prediction", "n/a", "no planned step offloaded"))
    base = rows.get((f"offrecomp_auto_no_offload@{x}", seq))
    if base is None:
        out.append(Check(seq, f"auto@{x} vs no offload", "n/a", f"offrecomp_auto_no_offload@{x} did not run"))
    else:
        ratio = _ms(auto) / _ms(base)
        pa, pb = _predicted(auto), _predicted(base)
        model = f"; predicted {pa / pb:.3f}" if pa and pb else "; predicted: n/a"
        out.append(Check(seq, f"auto@{x} vs no offload", "pass" if ratio <= NO_OFFLOAD_MAX else "fail",
                         f"{_ms(auto):.1f} / {_ms(base):.1f} ms = {ratio:.3f} (<= {NO_OFFLOAD_MAX}){model}"))
    peak = auto.get("peak_bytes")
    ran = [p for p in PEERS if (p, seq) in rows]
    within = [p for p in ran if peak is not None and (rows[(p, seq)].get("peak_bytes") or 0) <= peak]
    slower = [p for p in within if _ms(rows[(p, seq)]) <= _ms(auto)]
    if not ran:
        out.append(Check(seq, f"auto@{x} vs peers", "n/a", "no peer ran"))
    else:
        shown = ", ".join(f"{p} {_ms(rows[(p, seq)]):.1f} ms at {_gib(rows[(p, seq)].get('peak_bytes'))}" for p in within)
        missing = [p for p in PEERS if p not in ran]
        detail = (f"auto {_ms(auto):.1f} ms at {_gib(peak)}; peers at or below its peak: {shown or 'none'}"
                  + (f"; not run: {', '.join(missing)}" if missing else ""))
        out.append(Check(seq, f"auto@{x} vs peers", "fail" if slower else "pass",
                         detail + (f"; as fast or faster: {', '.join(slower)}" if slower else "")))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="results.json of python -m benchmarks.long_seq")
    ap.add_argument("--out", type=out_file(), help="write the checks as JSON here")
    args = ap.parse_args(argv)
    data = read_results(ap, args.results)
    found = checks(data)
    width = max((len(c.name) for c in found), default=4)
    for c in found:
        print(f"{c.seq:>6}  {c.name:<{width}}  {c.verdict:<4}  {c.detail}")
    failed = sum(c.verdict == "fail" for c in found)
    print(f"{len(found)} checks: {sum(c.verdict == 'pass' for c in found)} pass, {failed} fail, "
          f"{sum(c.verdict == 'n/a' for c in found)} n/a")
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(c) for c in found], indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
