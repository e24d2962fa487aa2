"""Per-step statistics: the records, the human table, JSON lines."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from offrecomp.config import format_bytes

__all__ = ["Report", "ReportFileError", "StepRecord"]


class ReportFileError(ValueError):
    """A report that cannot be read: names the file (or text), the record and what is wrong."""


@dataclass(kw_only=True)
class StepRecord:
    """What one training step did. Bytes are device bytes; seconds are device time."""

    step: int
    """Step number (0-based) within this runtime."""
    passes: int = 1
    """Forward+backward passes in the step (micro-batches under gradient accumulation)."""
    signature: str = ""
    """Input-shape signature of the step's first pass."""
    mode: str = ""
    """Configured mode."""
    phase: str = ""
    """``measure`` (first pass of a signature: full recompute while timing),
    ``calibrate`` (the second: full recompute, untraced, to fit the times), ``planned``,
    ``borrowed`` (the plan of a larger signature of the same family, NOTE [Borrowed
    plans]), ``user-plan`` (``rt.set_plan``), or the forced mode: the phase of the step's
    first pass."""
    phases: str = ""
    """Every phase the step's passes ran, in order, joined by ``+``: under gradient
    accumulation auto's first step measures and then calibrates (``measure+calibrate``).
    The report's table shows this."""
    plan_id: str = ""
    """Id of the plan used (empty for forced modes; a borrowed plan's own id)."""
    backend: str = ""
    """Offload backend (``cuda``, ``emulated``) when anything was offloaded."""
    peak_activation_bytes: int = 0
    """Peak of activation bytes resident on the device, by the runtime's books (kept
    storages + region inputs + offloads in flight + reloads + replayed tensors), the
    highest of the step's passes. Where a region's recording describes its call (auto's
    passes), the temporaries its forward holds while it runs count too (NOTE [Forward
    transients] in scheduler/working_set.py); a forced mode's calls have no recording, so
    the same placements can book less there than under auto."""
    device_peak_bytes: int | None = None
    """Allocator peak during the step minus the allocation at its start (CUDA only): an
    independent check of the books."""
    kept_bytes: int = 0
    """Bytes placed KEEP (region inputs included), each storage counted once per pass and
    summed over the step's passes (micro-batches): unlike the peak, which is one pass's."""
    offloaded_bytes: int = 0
    """Bytes placed OFFLOAD, summed over passes as ``kept_bytes``. With the ``emulated``
    backend (on CPU) the copies stay in host memory and save none: the report's table
    marks them ``(emulated)``."""
    recomputed_bytes: int = 0
    """Bytes placed RECOMPUTE (dropped in forward); summed over passes, as ``kept_bytes``."""
    input_bytes: int = 0
    """Bytes of region inputs (replay checkpoints), whatever their placement."""
    recompute_seconds: float = 0.0
    """Time spent replaying regions."""
    step_seconds: float = 0.0
    """Step time (device time on GPU, wall time on CPU)."""
    forward_seconds: float = 0.0
    """From the start of the step to the start of its backward (the first region whose
    saved tensors backward reads), summed over the step's passes."""
    forward_host_seconds: float = 0.0
    """Host time from the start of the step to the start of its backward, summed over the
    step's passes: near ``forward_seconds`` on a GPU, the device waited on the host."""
    wall_seconds: float = 0.0
    """Wall-clock time of the step as the host saw it."""
    replays: int = 0
    """Region replays."""
    served_ops: int = 0
    """Ops replay did not run (served from held storages, or not needed); counted for
    regions with a recorded structure (auto mode)."""
    rerun_ops: int = 0
    """Compute ops (views excluded) replay ran, for regions with a recorded structure."""
    saved_tensors: int = 0
    """Tensors autograd saved."""
    storages: int = 0
    """Distinct saved storages."""
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    served_groups: int = 0
    """Offload groups whose device sources were still held when backward reached them,
    handed out instead of reloaded (NOTE [Served groups] in transfer.py)."""
    d2h_gbps: float = 0.0
    """Achieved device-to-host bandwidth (GB/s) of the offload copies."""
    h2d_gbps: float = 0.0
    """Achieved host-to-device bandwidth (GB/s) of the reloads."""
    stall_seconds: float = 0.0
    """Time the compute stream waited for reloads."""
    pool_reserved_bytes: int = 0
    pool_high_water_bytes: int = 0
    predicted_step_seconds: float | None = None
    """The plan's predicted step time under the estimate learnt from the steps before
    this one (NOTE [Live prediction] in planning/drift.py; the solve's own prediction
    until one is learnt); for a step of several passes, their plans' summed (None if
    one ran no plan of its own: NOTE [Budgets per pass] in planning/records.py)."""
    predicted_peak_bytes: int | None = None
    predicted_forward_seconds: float | None = None
    """The plan's predicted time to the start of backward (compare ``forward_seconds``),
    under the same estimate as ``predicted_step_seconds``."""
    predicted_recompute_seconds: float | None = None
    """The plan's predicted replay time (compare ``recompute_seconds``)."""
    predicted_stall_seconds: float | None = None
    """The plan's predicted wait for reloads (compare ``stall_seconds``)."""
    replay_op_us: float = 0.0
    """What a replay under the dispatch mode costs per op it sees, in microseconds, as
    the runtime estimates it after this step (``OFFRECOMP_REPLAY_OP_US``)."""
    budget_bytes: int | None = None
    planner_seconds: float = 0.0
    """Host seconds offrecomp's planner spent on this step outside ``step_seconds``:
    solving a plan before a pass, building the profile after a measuring pass, learning
    the step's times (on GPU once its events have landed, during a later step). It adds
    to the training loop's time when the device has no queued work to hide it behind."""
    pause_seconds: float = 0.0
    """Host seconds the interpreter spent in garbage collection during the step's passes
    (NOTE [Host pauses] in ``offrecomp/measure.py``); on GPU the device idles through a
    pause longer than its queued work. Spans a pause distorted teach the planner
    nothing, and the step says so in ``notes``."""
    fallbacks: dict[str, int] = field(default_factory=dict)
    """Placements that could not be carried out, by kind (``offload_to_recompute``, ...)."""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "step record") -> StepRecord:
        """The record :meth:`to_dict` gave, each field checked (``where`` names it in the
        :class:`ReportFileError` a bad one raises). Fields a later offrecomp added are
        skipped; fields it dropped keep their defaults."""
        if not isinstance(data, dict) or type(data.get("step")) is not int:
            raise ReportFileError(
                f"{where}: expected a step record (a JSON object with an integer 'step'), got {str(data)[:80]!r}"
            )
        fields = {k: v for k, v in data.items() if k in _KINDS}
        for k, v in fields.items():
            _check_field(k, v, where)
        return cls(**fields)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (float, int), "bool": (bool,), "str": (str,), "dict": (dict,), "list": (list,),
}


def _kind(f: dataclasses.Field[Any]) -> tuple[type, ...] | None:
    """The JSON types a step record field accepts, from its annotation (None: any)."""
    return _JSON_TYPES.get(str(f.type).replace(" | None", "").split("[")[0])


_KINDS = {f.name: _kind(f) for f in dataclasses.fields(StepRecord)}
_NULLABLE = {f.name for f in dataclasses.fields(StepRecord) if str(f.type).endswith("| None")}
_NUMBERS = ((int,), (float, int))
_MOST = 1 << 63  # no count, size or time a step records reaches 64 bits


def _check_field(k: str, v: Any, where: str) -> None:
    kinds = _KINDS[k]
    ok = kinds is None or (v is None and k in _NULLABLE) or (
        isinstance(v, kinds) and (bool in kinds or not isinstance(v, bool))
    )
    if not ok:
        expected = " or ".join(t.__name__ for t in kinds or ())
        raise ReportFileError(f"{where}: field {k!r} is {v!r}; expected {expected}")
    if kinds in _NUMBERS and v is not None and not (
        0 <= v < _MOST if isinstance(v, int) else math.isfinite(v) and v >= 0
    ):
        raise ReportFileError(
            f"{where}: field {k!r} is {str(v)[:40]}; expected a finite number >= 0 and below 2**63 (no "
            "step record holds a negative count, size or time, nor NaN, Infinity or more than 64 bits: "
            "the file is damaged or was edited)"
        )
    if k == "fallbacks":
        bad = next(((n, c) for n, c in v.items() if isinstance(c, bool) or not isinstance(c, int) or c < 0), None)
        if bad is not None:
            raise ReportFileError(f"{where}: field 'fallbacks' counts {bad[1]!r} for {bad[0]!r}; expected an integer >= 0")
    if k == "notes" and not all(isinstance(n, str) for n in v):
        raise ReportFileError(f"{where}: field 'notes' is {str(v)[:80]}; expected a list of strings")


_COLUMNS = (
    ("step", "step", lambda r: str(r.step)),
    ("phase", "phases", lambda r: r.phases or r.phase),
    ("peak act", "peak_activation_bytes", lambda r: format_bytes(r.peak_activation_bytes)),
    ("kept", "kept_bytes", lambda r: format_bytes(r.kept_bytes)),
    ("offloaded", "offloaded_bytes",
     lambda r: format_bytes(r.offloaded_bytes) + (" (emulated)" if r.backend == "emulated" and r.offloaded_bytes else "")),
    ("recomputed", "recomputed_bytes", lambda r: format_bytes(r.recomputed_bytes)),
    ("recompute s", "recompute_seconds", lambda r: f"{r.recompute_seconds:.4f}"),
    ("stall s", "stall_seconds", lambda r: f"{r.stall_seconds:.4f}"),
    ("step s", "step_seconds", lambda r: f"{r.step_seconds:.4f}"),
    ("pred s", "predicted_step_seconds",
     lambda r: "-" if r.predicted_step_seconds is None else f"{r.predicted_step_seconds:.4f}"),
)


@dataclass
class Report:
    """All steps a runtime has seen. ``str()`` is a table; ``to_json()`` the data."""

    steps: list[StepRecord] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps({"config": self.config, "steps": [s.to_dict() for s in self.steps]}, indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Report:
        """The report :meth:`to_json` wrote; a bad one raises :class:`ReportFileError`
        naming the record and the field. (A file of ``OFFRECOMP_REPORT`` lines, one
        record per line, is read by ``python -m offrecomp report``.)"""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ReportFileError(f"not JSON ({exc}); expected the text Report.to_json() returns") from None
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise ReportFileError(
                f"expected a JSON object with a 'steps' list (Report.to_json()), got {str(data)[:80]!r}"
            )
        config = data.get("config", {})
        if not isinstance(config, dict):
            raise ReportFileError(f"'config' is {str(config)[:80]}; expected a JSON object")
        steps = [StepRecord.from_dict(d, where=f"steps[{i}]") for i, d in enumerate(data["steps"])]
        return cls(steps=steps, config=config)

    def __str__(self) -> str:
        if not self.steps:
            return "offrecomp report: no steps recorded"
        header = [c[0] for c in _COLUMNS]
        rows = [[c[2](r) for c in _COLUMNS] for r in self.steps]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows]
        fallbacks: dict[str, int] = {}
        for r in self.steps:
            for k, v in r.fallbacks.items():
                fallbacks[k] = fallbacks.get(k, 0) + v
        if fallbacks:
            lines.append("fallbacks: " + ", ".join(f"{k}={v}" for k, v in sorted(fallbacks.items())))
        if any(r.backend == "emulated" and r.offloaded_bytes for r in self.steps):
            lines.append(
                "offloaded (emulated): without a GPU the offload copies stay in host memory, so they "
                "save no memory; they exercise the offload path only"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Report(steps={len(self.steps)})"
