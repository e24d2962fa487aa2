"""``python -m offrecomp report run.jsonl [--plot out.png] [--table]``: the summary of a
report written with ``OFFRECOMP_REPORT`` (one JSON line per step, the fields of
:class:`offrecomp.StepRecord`), and with ``--plot`` a figure of each step's peak
activation memory, step time and predicted step time, to see the plan take effect.

The runtime appends to the file, so one file can hold several runs: a step number that
does not grow starts a new run, and each run is summed up on its own. A file written
with ``rt.report().to_json()`` (one JSON object) is read too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from offrecomp.config import format_bytes
from offrecomp.phases import Phase
from offrecomp.report import Report, ReportFileError, StepRecord

__all__ = ["load_runs", "main", "plot_runs", "summarize"]

def load_runs(path: str | Path, notes: list[str] | None = None) -> list[list[StepRecord]]:
    """The step records in ``path``, split into runs (a step number that does not grow
    starts a new one). A last line that is not JSON (a run killed while writing it) is
    skipped, and said in ``notes``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportFileError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ReportFileError(f"{path} is not UTF-8 text; expected JSON step records") from None
    try:
        whole = json.loads(text)  # a Report.to_json() file is one JSON object
    except json.JSONDecodeError:
        whole = None  # JSON lines (or not JSON at all: the lines say where)
    if isinstance(whole, dict) and isinstance(whole.get("steps"), list):
        return _split([StepRecord.from_dict(d, where=f"{path}: steps[{i}]") for i, d in enumerate(whole["steps"])])
    if whole is not None and len(text.strip().splitlines()) > 1:
        # valid JSON over several lines, but no report (a saved profile, pretty-printed)
        what = "a JSON object without a 'steps' list" if isinstance(whole, dict) else f"a JSON {type(whole).__name__}"
        keys = f" (keys: {', '.join(list(whole)[:6])})" if isinstance(whole, dict) and whole else ""
        raise ReportFileError(
            f"{path} holds {what}{keys}; expected a report: JSON lines of step records "
            "(OFFRECOMP_REPORT) or a Report.to_json() file"
        )
    records: list[StepRecord] = []
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    for n, line in lines:
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == lines[-1][0] and records and notes is not None:
                notes.append(f"{path}:{n}: skipped a last line that is not JSON ({exc.msg}): cut short?")
                break
            raise ReportFileError(f"{path}:{n}: not JSON ({exc.msg}); expected one step record per line") from None
        records.append(StepRecord.from_dict(data, where=f"{path}:{n}"))
    return _split(records)


def _split(records: list[StepRecord]) -> list[list[StepRecord]]:
    runs: list[list[StepRecord]] = []
    for r in records:
        if not runs or r.step <= runs[-1][-1].step:
            runs.append([])
        runs[-1].append(r)
    return runs


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


_PHASE_ORDER = {p.value: i for i, p in enumerate(Phase)}


def _phases_of(r: StepRecord) -> str:
    """The phases ``r``'s step ran, each once, in the order a signature meets them (a
    step whose passes ran ``borrowed`` then ``planned`` counts with one that ran them
    the other way round)."""
    names = (r.phases or r.phase or "-").split("+")
    return "+".join(sorted(dict.fromkeys(names), key=lambda n: _PHASE_ORDER.get(n, len(_PHASE_ORDER))))


def summarize(run: Sequence[StepRecord], title: str = "run") -> str:
    """A few lines on one run: its phases, peak activation memory, placements, and
    measured against predicted step time."""
    if not run:
        return f"{title}: no steps"
    last = run[-1]
    phases: dict[str, list[StepRecord]] = {}
    for r in run:  # every phase the step ran (measure+calibrate under gradient accumulation)
        phases.setdefault(_phases_of(r), []).append(r)
    head = f"{title}: {len(run)} steps (step {run[0].step} to {last.step})"
    if last.mode:
        head += f", mode {last.mode}"
    if last.budget_bytes is not None:
        head += f", budget {format_bytes(last.budget_bytes)}"
    lines = [head]
    lines.append("  phases: " + ", ".join(f"{p} {len(rs)}" for p, rs in phases.items()))
    peak = max(r.peak_activation_bytes for r in run)
    lines.append(f"  peak activation: highest {format_bytes(peak)}, last step {format_bytes(last.peak_activation_bytes)}")
    lines.append(
        f"  last step's placements: kept {format_bytes(last.kept_bytes)}, offloaded "
        f"{format_bytes(last.offloaded_bytes)}, recomputed {format_bytes(last.recomputed_bytes)}"
    )
    predicted = [r for r in run if r.predicted_step_seconds is not None]
    if predicted:
        measured = statistics.fmean(r.step_seconds for r in predicted)
        pred = statistics.fmean(r.predicted_step_seconds or 0.0 for r in predicted)
        ratio = f" (measured/predicted {measured / pred:.3f})" if pred > 0 else ""
        lines.append(f"  step time over the {len(predicted)} steps with a prediction: {measured:.4f} s, predicted {pred:.4f} s{ratio}")
    else:
        lines.append(f"  step time: mean {statistics.fmean(r.step_seconds for r in run):.4f} s (no step had a prediction)")
    fallbacks: dict[str, int] = {}
    for r in run:
        for k, v in r.fallbacks.items():
            fallbacks[k] = fallbacks.get(k, 0) + v
    if fallbacks:
        lines.append("  fallbacks: " + ", ".join(f"{k}={v}" for k, v in sorted(fallbacks.items())))
    header = ("phase", "steps", "step s", "pred s", "recompute s", "stall s", "peak act")
    rows = [
        (
            phase,
            str(len(rs)),
            _secs(_mean([r.step_seconds for r in rs])),
            _secs(_mean([r.predicted_step_seconds for r in rs if r.predicted_step_seconds is not None]))
            if all(r.predicted_step_seconds is not None for r in rs) else "-",  # beside every step's mean
            _secs(_mean([r.recompute_seconds for r in rs])),
            _secs(_mean([r.stall_seconds for r in rs])),
            format_bytes(max(r.peak_activation_bytes for r in rs)),
        )
        for phase, rs in phases.items()
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines.append("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths)))
    lines += ["  " + "  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def plot_runs(runs: Sequence[Sequence[StepRecord]], out: str | Path, title: str = "") -> None:
    """Draw each step's peak activation memory (top) and its measured and predicted
    step time (bottom) into ``out`` (PNG, or any format matplotlib knows by suffix).
    Runs follow each other along the x axis; a dashed line marks where one starts, a
    dotted one a run's first planned step. Needs matplotlib (the ``bench`` extra)."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "offrecomp report --plot needs matplotlib: pip install 'offrecomp[bench]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (mem, time_ax) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), constrained_layout=True)
    highest = max((r.peak_activation_bytes for run in runs for r in run), default=0)
    unit, scale = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20)) if highest >= s), ("KiB", 2**10))
    x0 = 0
    for i, run in enumerate(runs):
        xs = list(range(x0, x0 + len(run)))
        first = i == 0
        mem.plot(xs, [r.peak_activation_bytes / scale for r in run], "o-", ms=3, color="C0",
                 label="peak activation (offrecomp's books)" if first else None)
        device = [(x, r.device_peak_bytes / scale) for x, r in zip(xs, run) if r.device_peak_bytes is not None]
        if device:
            mem.plot(*zip(*device), "x", ms=4, color="C2", label="device allocator peak" if first else None)
        budget = [r.budget_bytes for r in run if r.budget_bytes is not None]
        if budget and budget[-1] <= 4 * max(highest, 1):  # else it would flatten the curve
            mem.hlines(budget[-1] / scale, xs[0], xs[-1], colors="C3", linestyles="--",
                       label="budget" if first else None)
        elif budget and first:
            mem.plot([], [], " ", label=f"budget {format_bytes(budget[-1])} (off the scale)")
        time_ax.plot(xs, [r.step_seconds for r in run], "o-", ms=3, color="C0", label="step time" if first else None)
        pred = [(x, r.predicted_step_seconds) for x, r in zip(xs, run) if r.predicted_step_seconds is not None]
        if pred:
            time_ax.plot(*zip(*pred), "s--", ms=3, color="C1", label="predicted step time" if first else None)
        if i:
            for ax in (mem, time_ax):
                ax.axvline(x0 - 0.5, color="grey", linestyle="--", linewidth=0.8)
        planned = next((x for x, r in zip(xs, run) if r.phase in ("planned", "borrowed", "user-plan")), None)
        if planned is not None:
            for ax in (mem, time_ax):
                ax.axvline(planned, color="grey", linestyle=":", linewidth=0.8)
        x0 += len(run)
    mem.set_ylabel(unit)
    mem.set_ylim(bottom=0)
    mem.set_title(title or "offrecomp report")
    mem.legend(loc="best", fontsize=8)
    time_ax.set_ylabel("seconds")
    time_ax.set_ylim(bottom=0)
    time_ax.set_xlabel("step (runs one after another)" if len(runs) > 1 else "step")
    time_ax.legend(loc="best", fontsize=8)
    fig.savefig(str(out), dpi=100)
    plt.close(fig)


def main(argv: Sequence[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    parser = argparse.ArgumentParser(
        prog="python -m offrecomp report",
        description="Summarize a report written with OFFRECOMP_REPORT=run.jsonl (one JSON line per step).",
    )
    parser.add_argument("path", help="the report file (JSON lines, or a Report.to_json() file)")
    parser.add_argument("--plot", metavar="OUT.png", help="also draw peak activation memory and step times per step")
    parser.add_argument("--table", action="store_true", help="also print every step (the table print(rt.report()) shows)")
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # --help (0), or a usage error argparse has printed (2)
        return exc.code if isinstance(exc.code, int) else 2
    if args.plot is not None and not args.plot.strip():
        print("offrecomp report: --plot '' is invalid; accepted: a file name (out.png, out.pdf, out.svg)", file=err)
        return 2
    if args.plot and (args.plot.endswith(("/", os.sep)) or Path(args.plot).is_dir()):
        print(
            f"offrecomp report: --plot {args.plot!r} is invalid; accepted: a file name "
            "(out.png, out.pdf, out.svg), not a directory",
            file=err,
        )
        return 2
    notes: list[str] = []
    try:
        runs = load_runs(args.path, notes)
    except ReportFileError as exc:
        print(f"offrecomp report: {exc}", file=err)
        return 2
    for note in notes:
        print(f"offrecomp report: {note}", file=err)
    if not runs:
        print(f"offrecomp report: {args.path} holds no steps", file=err)
        return 2
    for i, run in enumerate(runs, 1):
        title = f"{args.path}" if len(runs) == 1 else f"{args.path}, run {i} of {len(runs)}"
        try:
            print(summarize(run, title), file=out)
            if args.table:
                print(Report(steps=list(run)), file=out)
        except (TypeError, ValueError) as exc:  # a field of a type the file should not hold
            print(f"offrecomp report: {args.path}: a step record holds a value of the wrong type ({exc})", file=err)
            return 2
    if args.plot:
        # a name without a suffix gets matplotlib's default format, added here so that
        # the name said is the file written
        target = args.plot if Path(args.plot).suffix else args.plot + ".png"
        try:
            plot_runs(runs, target, title=Path(args.path).name)
        except ImportError as exc:
            print(f"offrecomp report: {exc}", file=err)
            return 2
        except OSError as exc:
            print(f"offrecomp report: cannot write {target!r}: {exc.strerror or exc}", file=err)
            return 2
        except ValueError as exc:  # a suffix matplotlib has no writer for
            print(f"offrecomp report: cannot write {target!r}: {exc}", file=err)
            return 2
        print(f"wrote {target}", file=out)
    return 0
