"""What the benchmark shows and writes: progress, the table, CSV, JSON and plots."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from scheduler.units import format_bytes as _format_bytes

from .measure import BenchResult, Row, SearchRow

__all__ = [
    "COLUMNS",
    "Progress",
    "format_bytes",
    "render_search",
    "render_table",
    "write_all",
]

COLUMNS: tuple[tuple[str, str], ...] = (
    ("strategy", "strategy"),
    ("seq", "seq"),
    ("step_ms", "step ms"),
    ("vs_none", "vs none"),
    ("tokens_per_s", "tok/s"),
    ("peak_mem", "peak mem"),
    ("act_mem", "act mem"),
    ("mfu", "MFU"),
    ("link_gbps", "link GB/s"),
    ("status", "status"),
)


class Progress:
    """A progress bar on stderr: tqdm when installed, else one counter line per update."""

    def __init__(self, total: int | None, desc: str, *, enabled: bool = True) -> None:
        self.total, self.desc, self.enabled, self.n = total, desc, enabled, 0
        self._bar: Any = None
        if enabled and importlib.util.find_spec("tqdm") is not None:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True
            )

    def __call__(self, note: str) -> None:
        self.n += 1
        if self._bar is not None:
            if self.total is not None and self.n > self.total:
                self._bar.total = self.n
            self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(1)
        elif self.enabled:
            of = f"/{self.total}" if self.total else ""
            print(f"[{self.desc} {self.n}{of}] {note}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def format_bytes(n: float | None) -> str:
    """``scheduler.units.format_bytes``, and ``None -> '-'``."""
    return "-" if n is None else _format_bytes(n)


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _link(row: Row) -> str:
    if row.d2h_gbps is None and row.h2d_gbps is None:
        return "-"
    return f"{_num(row.d2h_gbps, '.1f')}/{_num(row.h2d_gbps, '.1f')}"


_STATUS_WIDTH = 72


def _clip(text: str, width: int = _STATUS_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _cells(row: Row) -> list[str]:
    return [
        row.strategy,
        str(row.seq),
        _num(row.median_ms, ".1f"),
        _num(row.ratio_vs_none, ".2f"),
        _num(row.tokens_per_s, ",.0f"),
        format_bytes(row.peak_bytes),
        format_bytes(row.act_bytes),
        "-" if row.mfu is None else f"{row.mfu * 100:.1f}%",
        _link(row),
        _clip(row.status),
    ]


def _render(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)
    ]

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            last = i == len(cells) - 1
            left = i == 0 or last
            out.append(cell if last else cell.ljust(widths[i]) if left else cell.rjust(widths[i]))
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in body)])


def render_table(rows: Sequence[Row]) -> str:
    """The comparison table: one line per (sequence length, strategy)."""
    ordered = sorted(rows, key=lambda r: r.seq)
    return _render([title for _, title in COLUMNS], [_cells(r) for r in ordered])


def render_search(search: Sequence[SearchRow], budget_bytes: int | None) -> str:
    """The longest-sequence table, with each strategy's gain over ``none``."""
    base = next((s.longest_seq for s in search if s.strategy == "none"), None)
    body = []
    for s in search:
        if s.longest_seq is None:
            longest = "-"
        elif s.longest_seq == 0:
            longest = f"<{min((p.seq for p in s.probes), default=64)}"
        else:
            longest = f"{'>=' if s.capped else ''}{s.longest_seq}"
        gain = "-"
        if s.longest_seq and base:
            gain = f"{s.longest_seq / base:.2f}x"
        probes = " ".join(f"{p.seq}{'+' if p.fits else 'x'}" for p in s.probes)
        body.append([s.strategy, longest, gain, _clip(s.status), probes])
    title = f"longest sequence with step peak <= {format_bytes(budget_bytes)}"
    return title + "\n" + _render(["strategy", "longest seq", "vs none", "status", "probes"], body)


def _csv_rows(rows: Sequence[Row]) -> list[dict[str, Any]]:
    out = []
    for r in sorted(rows, key=lambda r: r.seq):
        out.append(
            {
                "strategy": r.strategy,
                "seq": r.seq,
                "median_step_ms": r.median_ms,
                "ratio_vs_none": r.ratio_vs_none,
                "tokens_per_s": r.tokens_per_s,
                "peak_bytes": r.peak_bytes,
                "act_bytes": r.act_bytes,
                "mfu": r.mfu,
                "d2h_gbps": r.d2h_gbps,
                "h2d_gbps": r.h2d_gbps,
                "step_ms_all": " ".join(f"{s * 1e3:.2f}" for s in r.step_seconds),
                "status": r.status,
            }
        )
    return out


def _to_data(result: BenchResult, meta: dict[str, Any]) -> dict[str, Any]:
    def row(r: Row) -> dict[str, Any]:
        d = dict(vars(r))
        d["step_ms_all"] = [s * 1e3 for s in d.pop("step_seconds")]
        return d

    return {
        "meta": {**result.meta, **meta, "elapsed_s": result.elapsed_s},
        "plain_saved_bytes": {str(k): v for k, v in result.plain_saved_bytes.items()},
        "rows": [row(r) for r in result.rows],
        "search": [
            {
                **{k: v for k, v in vars(s).items() if k != "probes"},
                "probes": [vars(p) for p in s.probes],
            }
            for s in result.search
        ],
        "notes": result.notes,
    }


def _plots(result: BenchResult, out_dir: Path, budget_bytes: int | None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    if any(r.median_ms is not None for r in result.rows):
        written.append(_memory_plot(result, out_dir))
    found = [s for s in result.search if s.longest_seq]
    if found:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.barh([s.strategy for s in found], [s.longest_seq or 0 for s in found])
        for i, s in enumerate(found):
            ax.text(
                s.longest_seq or 0,
                i,
                f" {'>=' if s.capped else ''}{s.longest_seq}",
                va="center",
                fontsize=8,
            )
        ax.invert_yaxis()
        ax.set_xlabel(f"longest sequence with step peak <= {format_bytes(budget_bytes)}")
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        path = out_dir / "longest_seq.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def _memory_plot(result: BenchResult, out_dir: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]
    markers = "os^Dv<>pP*hX"
    for i, name in enumerate(dict.fromkeys(r.strategy for r in result.rows)):
        pts = [
            (r.seq, r.median_ms, r.peak_bytes / 2**20)
            for r in result.rows
            if r.strategy == name and r.median_ms is not None and r.peak_bytes is not None
        ]
        if pts:
            ax.plot(
                [p[1] for p in pts],
                [p[2] for p in pts],
                marker=markers[i % len(markers)],
                color=colors[(2 * i) % 20 + (i // 10) % 2],
                label=name,
            )
            for seq, ms, mib in pts:
                ax.annotate(str(seq), (ms, mib), fontsize=7)
    ax.set_xlabel("median step time (ms)")
    ax.set_ylabel("peak step memory above resting (MiB)")
    ax.set_title("memory vs step time (labels: sequence length)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "memory_vs_time.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_all(
    result: BenchResult,
    out_dir: Path,
    *,
    meta: dict[str, Any],
    plots: bool = True,
    stream: TextIO | None = None,
) -> list[Path]:
    """Write ``results.csv``, ``results.json`` (and plots); return the written paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    csv_path = out_dir / "results.csv"
    rows = _csv_rows(result.rows)
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["strategy"])
        writer.writeheader()
        writer.writerows(rows)
    written.append(csv_path)
    if result.search:
        search_path = out_dir / "longest_seq.csv"
        with search_path.open("w", newline="") as f:
            plain = csv.writer(f)
            plain.writerow(["strategy", "longest_seq", "capped", "status", "probes"])
            for s in result.search:
                probes = " ".join(
                    f"{p.seq}:{'fit' if p.fits else 'no'}:{p.peak_bytes}" for p in s.probes
                )
                plain.writerow([s.strategy, s.longest_seq, s.capped, s.status, probes])
        written.append(search_path)
    if plots:
        if importlib.util.find_spec("matplotlib") is None:
            result.notes.append(
                "plots skipped: matplotlib not installed (pip install offrecomp[bench])"
            )
        else:
            try:
                written.extend(_plots(result, out_dir, result.meta.get("mem_budget_bytes")))
            except Exception as exc:
                result.notes.append(f"plots skipped: {type(exc).__name__}: {exc}")
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps(_to_data(result, meta), indent=2, default=str) + "\n")
    written.append(json_path)
    return written
