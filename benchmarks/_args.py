"""Command-line checks shared by the benchmark scripts.

A bad value is refused the argparse way, before any work starts: exit status 2, the
usage line, and a message that names the flag, the value and what is accepted. The
``argparse`` types here refuse a value while the command line is parsed
(``argument --repeats: '0' is invalid; accepted: an integer, 1 or more``); the helpers
that take the parser (:func:`device`, :func:`read_results`) refuse with ``parser.error``.
:func:`looks_like` says what a JSON file a script was given looks like, for the message
when it is not the kind of file the script reads.

Importing this module imports nothing heavy (torch only inside :func:`device`).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["count", "device", "looks_like", "number", "out_file", "read_results"]

#: What a run's report is read by (the wording of ``offrecomp plan``, scheduler/cli.py).
REPORT = "a run's report, which `python -m offrecomp report FILE` reads"
PROFILE = "a planner profile (what OFFRECOMP_PROFILE saves), which benchmarks/offload_headroom.py --profile reads"
RESULTS = (
    "the results.json of `python -m benchmarks.long_seq`, which benchmarks/offload_checks.py "
    "and benchmarks/model_fit.py read"
)


def count(lowest: int = 1) -> Callable[[str], int]:
    """An argparse type: an integer, ``lowest`` or more."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = lowest - 1
        if value < lowest:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; accepted: an integer, {lowest} or more")
        return value

    return parse


def _fmt(x: float) -> str:
    return f"{x:g}"


def number(
    *,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    at_most: float | None = None,
) -> Callable[[str], float]:
    """An argparse type: a number within the bounds given (open at ``above`` and
    ``below``, closed at ``at_least`` and ``at_most``); NaN never is."""
    if (above is not None and at_least is not None) or (below is not None and at_most is not None):
        raise TypeError("give one lower bound and one upper bound at most")
    lo, hi = (above if above is not None else at_least), (below if below is not None else at_most)
    if lo is not None and hi is not None:
        accepted = f"a number in {'(' if above is not None else '['}{_fmt(lo)}, {_fmt(hi)}{')' if below is not None else ']'}"
    elif lo is not None:
        accepted = f"a number {'>' if above is not None else '>='} {_fmt(lo)}"
    elif hi is not None:
        accepted = f"a number {'<' if below is not None else '<='} {_fmt(hi)}"
    else:
        accepted = "a number"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = not math.isnan(value) and (
            (above is None or value > above)
            and (at_least is None or value >= at_least)
            and (below is None or value < below)
            and (at_most is None or value <= at_most)
        )
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; accepted: {accepted}")
        return value

    return parse


def out_file(*, make_folder: bool = False) -> Callable[[str], str]:
    """An argparse type: the path of a file to write, refused when it is a folder or
    (unless the script makes it, ``make_folder``) when its folder does not exist, so a
    long run does not fail at its very end. The text comes back as given."""

    def parse(text: str) -> str:
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a folder; accepted: the path of a file to write")
        parent = path.parent
        if not make_folder and not parent.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text!r}: its folder {str(parent)!r} does not exist; accepted: a file path in an existing folder"
            )
        return text

    return parse


def device(parser: argparse.ArgumentParser, text: str, *, auto: bool = False, index: bool = True) -> Any:
    """The ``torch.device`` that ``--device text`` names (``auto``: CUDA if there is one,
    where ``auto``; ``cuda:N`` where ``index``), or ``parser.error`` for anything else or
    for a CUDA device this machine lacks."""
    import torch

    accepted = ", ".join([*(["auto"] if auto else []), "cpu", "cuda", *(["cuda:N"] if index else [])])
    if auto and text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda") or (dev.index is not None and not index):
        parser.error(f"--device {text!r} is invalid; accepted: {accepted}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            parser.error(f"--device {text}: no CUDA device is available here; accepted: cpu{', auto' if auto else ''}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            parser.error(
                f"--device {text}: no such CUDA device; accepted: cuda:0 to cuda:{torch.cuda.device_count() - 1}"
            )
    return dev


def looks_like(path: str | Path, text: str | None = None) -> str:
    """What the file at ``path`` (whose ``text`` may be given) looks like: a run's
    report, a planner profile, a long_seq results file, or else what JSON (or not JSON)
    it holds."""
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            return "a binary file (no UTF-8 text)"
        except OSError as exc:
            return f"an unreadable file ({exc.strerror or exc})"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            line = json.loads(first)
        except json.JSONDecodeError:
            return f"no JSON ({exc.msg} at line {exc.lineno})" if text.strip() else "an empty file"
        if isinstance(line, dict) and "step" in line:
            return REPORT  # JSON lines of step records
        return "JSON lines"
    if isinstance(data, dict):
        if isinstance(data.get("steps"), list) or ("step" in data and "phase" in data):
            return REPORT  # Report.to_json(), or a report of one step
        if "regions" in data and "signature" in data:
            return PROFILE
        if isinstance(data.get("rows"), list) and all(
            isinstance(r, dict) and "strategy" in r and "seq" in r for r in data["rows"]
        ):
            return RESULTS
        keys = ", ".join(list(data)[:6])
        return f"a JSON object with keys {keys}" if keys else "an empty JSON object"
    return f"a JSON {type(data).__name__}"


def read_results(parser: argparse.ArgumentParser, path: str, name: str = "results") -> dict[str, Any]:
    """The ``results.json`` of ``python -m benchmarks.long_seq`` at ``path`` (a JSON
    object whose ``rows`` each name a strategy and a sequence length), or ``parser.error``
    saying why it cannot be read or what the file looks like instead."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        parser.error(f"{name} {path!r}: cannot read it: {exc.strerror or exc}")
    except UnicodeDecodeError:
        parser.error(f"{name} {path!r} is not a results file of `python -m benchmarks.long_seq`; it looks like a binary file (no UTF-8 text)")
    what = looks_like(path, text)
    if what != RESULTS:
        parser.error(
            f"{name} {path!r} is not a results file of `python -m benchmarks.long_seq` (a JSON object whose "
            f"'rows' name a strategy and a seq each); it looks like {what}"
        )
    return json.loads(text)  # type: ignore[no-any-return]
