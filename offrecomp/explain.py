"""``rt.explain()``: what auto's plan places in each region call and why, or what a
forced mode did to each region call, and why, from the last step's storages; and the
table both share.

A forced mode (``keep``, ``offload``, ``recompute``) applies one placement wherever it is
legal. A storage gets another where the rules require it: a region's inputs are its
replay checkpoint (never dropped), storages under ``min_bytes`` are never offloaded, and
a region that writes its state, or whose forward reads its own saves, is never dropped.
The reason column says which of these applied. A plan set with ``rt.set_plan()`` meets
the same rules: a storage it asks to drop or offload that they refuse is kept, and the
reason column names the storage and the rule. ``mode="off"`` and ``OFFRECOMP_DISABLE=1``
install nothing, and the text says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from offrecomp.config import format_bytes
from offrecomp.placement import never_replayed, refusals
from scheduler.cost_model import replay_seconds
from scheduler.plan import Placement

if TYPE_CHECKING:
    from offrecomp.config import Config
    from offrecomp.regions import Region
    from offrecomp.state import PassState, RegionCall
    from scheduler.plan import Plan
    from scheduler.profile import Profile, RegionRecord

KEEP, OFFLOAD, RECOMPUTE = Placement.KEEP, Placement.OFFLOAD, Placement.RECOMPUTE


@dataclass
class CallSummary:
    """The placements one region call's storages got in a pass."""

    name: str
    call_index: int
    count: dict[Placement, int] = field(default_factory=lambda: {p: 0 for p in Placement})
    nbytes: dict[Placement, int] = field(default_factory=lambda: {p: 0 for p in Placement})
    inputs_kept: int = 0
    small_kept: int = 0
    """Activations kept for being under ``min_bytes`` (offload mode)."""
    activations_kept: int = 0
    call: RegionCall | None = field(default=None, repr=False)
    """The call summed up, for what a plan asked of its storages."""


def summarize(passes: list[PassState], min_bytes: int) -> list[CallSummary]:
    """Per region call of the last of ``passes``: its storages by placement."""
    if not passes:
        return []
    out = []
    for call in passes[-1].calls:
        s = CallSummary(call.name, call.call_index, call=call)
        if call.books is not None:  # NOTE [Native keep]: booked as its hooked call saved
            storages, nbytes, small = call.books[1:4]
            s.count[KEEP] += storages
            s.nbytes[KEEP] += nbytes
            s.activations_kept += storages
            s.small_kept += small
        for rec in call.storages:
            s.count[rec.placement] += 1
            s.nbytes[rec.placement] += rec.nbytes
            if rec.placement == KEEP:
                if rec.kind == "input":
                    s.inputs_kept += 1
                else:
                    s.activations_kept += 1
                    s.small_kept += rec.nbytes < min_bytes
        out.append(s)
    return out


PLACEMENT_COLUMNS = [("keep", 14), ("offload", 14), ("recompute", 14)]


def table(rows: list[tuple[str, int, list[str], str]], columns: list[tuple[str, int]] | None = None) -> list[str]:
    """Rows of (region, call, cells, reason) under ``columns`` (header, width; the
    placements by default), with the region column as wide as the longest name."""
    columns = columns or PLACEMENT_COLUMNS
    width = max([len("region")] + [len(r[0]) for r in rows])
    head = f"  {'region':<{width}} {'call':>4}" + "".join(f" {h:>{w}}" for h, w in columns) + "  why"
    lines = [head]
    for name, call, values, why in rows:
        body = "".join(f" {v:>{w}}" for v, (_, w) in zip(values, columns))
        lines.append(f"  {name:<{width}} {call:>4}{body}  {why}".rstrip())
    return lines


def cells(count: dict[Placement, int], nbytes: dict[Placement, int]) -> list[str]:
    return [f"{count[p]}/{format_bytes(nbytes[p])}" for p in (KEEP, OFFLOAD, RECOMPUTE)]


NO_PLAN_YET = (
    "offrecomp: no plan yet (auto measures the first pass of each input signature, "
    "calibrates the second and plans from the third; a signature that a larger, "
    "measured one covers runs that one's plan)"
)


def _seconds(x: float) -> str:
    """Seconds for the plan's table: 5 decimals, and a nonzero time under their
    resolution in scientific notation rather than as 0.00000."""
    return f"{x:.1e}" if 0 < x < 5e-6 else f"{x:.5f}"


def explain_plan(
    signature: str, plan: Plan, profile: Profile, regions: Sequence[Region], notes: Sequence[str] = (),
    replays: Mapping[tuple[str, int], float] | None = None,
) -> str:
    """What auto's ``plan`` for ``signature`` places in each region call of ``profile``,
    with the region's measured times, its replay's predicted seconds (the ops the plan
    makes it run) and, from ``replays``, the seconds its replays took in a planned pass
    (``-``: none timed), and why; ``notes`` follow the plan's own."""
    lines = [
        f"plan {plan.plan_id} for signature {signature}",
        f"  budget {format_bytes(plan.budget_bytes) if plan.budget_bytes is not None else 'none'}, "
        f"predicted peak {format_bytes(plan.predicted_peak_bytes or 0)}, "
        f"predicted step {plan.predicted_step_seconds or 0.0:.4f}s, "
        f"lower bound {plan.lower_bound_seconds or 0.0:.4f}s",
    ]
    if plan.prefetch_regions is not None and plan.counts()[Placement.OFFLOAD]:
        lines[-1] += f", reloads {plan.prefetch_regions} group{'s' if plan.prefetch_regions != 1 else ''} ahead"
    lines += [f"  note: {n}" for n in [*plan.notes, *notes]]
    rows = []
    for r in profile.regions:
        held, n, b = plan.held_totals(r.name, r.call_index, r.storages)
        placed = [KEEP if pl is None else pl for pl in held]  # what the replay's cost reads
        predicted = replay_seconds(r, placed, op_overhead_seconds=profile.replay_op_seconds)
        ran = (replays or {}).get((r.name, r.call_index))
        values = [
            *cells(n, b), _seconds(r.forward_seconds), _seconds(r.backward_seconds), _seconds(predicted),
            _seconds(ran) if ran is not None else "-",
        ]
        rows.append((r.name, r.call_index, values, _why(r, n, plan, regions)))
    traced = [g.name for g in regions if g.traced]
    if not profile.regions and traced:  # NOTE [Compiled regions]
        lines.append(
            f"  no region call to place: {', '.join(traced)} ran inside a torch.compile'd caller, traced "
            "into its graph, whose saves are kept (or offloaded); compile each block instead "
            "(block.compile()) to recompute them"
        )
        return "\n".join(lines)
    lines += table(rows, [*PLACEMENT_COLUMNS, ("fwd s", 9), ("bwd s", 9), ("replay s", 9), ("ran s", 9)])
    return "\n".join(lines)


def _why(r: RegionRecord, n: dict[Placement, int], plan: Plan, regions: Sequence[Region]) -> str:
    """Why auto placed a region call's storages as it did."""
    region = next((g for g in regions if g.name == r.name), None)
    if not r.replayable:
        return (never_replayed(region) or "runs collectives") + ": never recomputed"
    if region is not None and region.backward_in_forward:
        return "runs a backward inside its forward: its replays rerun it, holding their saves"
    if region is not None and region.variable:  # NOTE [Regions that vary] (placement.py)
        why = "saves other tensors from pass to pass (branches on the data): placed by position, a replay reruns its forward; "
    else:
        why = "opaque: a replay reruns its forward; " if r.opaque else ""
    if n[RECOMPUTE] == 0 and n[OFFLOAD] == 0:
        return why + ("kept: the budget holds it" if plan.feasible else "kept: nothing here frees memory")
    parts = []
    if n[RECOMPUTE]:
        parts.append("dropped where a replay costs least for the bytes it frees")
    if n[OFFLOAD]:
        parts.append("offloaded where the copy hides under compute")
    return why + "; ".join(parts) + " (budget)"


def explain_forced(
    config: Config, regions: Sequence[Region], calls: list[CallSummary], *, emulated: bool,
    user_plan: Plan | None = None, ran: bool = True,
) -> str:
    """What ``config.mode`` (or ``user_plan``, set with ``rt.set_plan()``) did to each
    region call of the last step, and why (``emulated``: offload copies within host
    memory, on CPU; ``ran``: a step has run)."""
    if config.disable or config.mode == "off":
        if config.disable:
            why = "OFFRECOMP_DISABLE=1" if config.sources.get("disable") == "env" else "disable=True"
        else:
            why = "OFFRECOMP_MODE=off" if config.sources.get("mode") == "env" else "mode='off'"
        names = ", ".join(r.name for r in regions) if regions else "none"
        return (
            f"offrecomp is off ({why}): nothing is installed, no region is wrapped, and "
            f"autograd saves every activation as it does without offrecomp. Regions: {names}"
        )
    mode = config.mode
    lines = [f"mode={mode!r}: one placement wherever it is legal, no plan"]
    if user_plan is not None:
        lines = [
            (f"plan {user_plan.plan_id}" if user_plan.plan_id else "a plan")
            + " set with rt.set_plan(): the placements it names, "
            f"{user_plan.default.name} for the rest, wherever legal"
            + (" (a new signature's measuring pass records as auto does)" if mode == "auto" else "")
        ]
    if not calls:
        names = ", ".join(r.name for r in regions) or "none"
        off = [r.name for r in regions if r.grad_off]
        if not ran:
            lines.append("  no step has run yet; regions: " + names)
        elif off:  # NOTE [Regions with gradients off] in diagnostics.py
            lines.append(
                f"  the last step ran no region call with gradients on: {', '.join(off)} ran "
                "their forward with gradients off (an autograd.Function's forward, as a "
                "reversible network's, or torch.no_grad()), saving nothing to place"
            )
        elif any(r.traced for r in regions):  # NOTE [Compiled regions]
            traced = ", ".join(r.name for r in regions if r.traced)
            lines.append(
                f"  the last step called no region outside a compiled frame: {traced} ran inside a "
                "torch.compile'd caller, traced into its graph, whose saves are kept (or offloaded), "
                "never recomputed; compile each block instead (block.compile()) to recompute them"
            )
        else:
            lines.append("  the last step called no region; regions: " + names)
        return "\n".join(lines)
    by_name = {r.name: r for r in regions}
    rows = [
        (
            c.name, c.call_index, cells(c.count, c.nbytes),
            _plan_reason(user_plan, c, config.min_bytes) if user_plan is not None
            else _reason(mode, c, by_name.get(c.name), config, emulated),
        )
        for c in calls
    ]
    return "\n".join(lines + table(rows))


def _plan_reason(plan: Plan, c: CallSummary, min_bytes: int) -> str:
    """``rt.set_plan()``, and the storages of the call it asked to drop or offload that
    the rules kept (NOTE [Placement rules] in placement.py)."""
    refused = refusals(plan, [c.call], min_bytes) if c.call is not None and plan.placements else []
    if not refused:
        return "rt.set_plan()"
    return f"rt.set_plan(); {len(refused)} kept against it: " + ", ".join(
        f"storage {key[2]} {what}" for key, what in refused
    )


_NOTHING_SAVED = (
    "saved no activation through offrecomp, so there is nothing to place (where it makes "
    "some, a checkpoint inside or around it owns them)"
)


def _reason(mode: str, c: CallSummary, region: Region | None, config: Config, emulated: bool) -> str:
    if mode == "keep":
        return "mode='keep' keeps every activation"
    if not c.count[RECOMPUTE] and not c.count[OFFLOAD] and not c.activations_kept and not c.small_kept:
        return _NOTHING_SAVED + (f"; {c.inputs_kept} region input(s) kept" if c.inputs_kept else "")
    if mode == "offload":
        why = "mode='offload' copies its activations to host memory" + (
            " (emulated on CPU: no memory saved)" if emulated else ""
        )
        if c.small_kept:
            why += f"; {c.small_kept} under min_bytes ({format_bytes(config.min_bytes)}) kept: a copy costs more"
        if c.inputs_kept:
            why += f"; {c.inputs_kept} region input(s) kept"
        return why
    why = "mode='recompute' drops its activations and replays its forward in backward"
    if c.activations_kept:
        cause = never_replayed(region)
        if cause is not None:
            why = cause + ": its activations are kept, never recomputed"
        elif region is not None and region.forward_used:
            why += f"; {c.activations_kept} read by a backward inside its forward kept"
        else:
            why += f"; {c.activations_kept} kept (made outside the region, or saved through an alias)"
    if c.inputs_kept or c.count[OFFLOAD]:
        why += "; its inputs are the replay's checkpoint"
    return why


def storage_keys(
    passes: list[PassState], plan: Plan | None = None, profile: Profile | None = None
) -> list[str]:
    """``rt.explain(storages=True)``'s listing: each (region, call, storage) key a pass
    has, the key ``rt.set_plan()`` places, with its placement, size and kind: ``plan``'s
    for ``profile``'s storages where given (auto; "unplanned" while a measured signature
    has no plan yet), else those of the last of ``passes`` (a forced mode, a user plan)."""
    rows: list[tuple[tuple[str, int, int], str, int, str]] = []
    if profile is not None:  # no plan yet: measured, not yet planned
        for r in profile.regions:
            for i, st in enumerate(r.storages):
                key = (r.name, r.call_index, i)
                placed = (plan.placement(key) or KEEP).name.lower() if plan is not None else "unplanned"
                rows.append((key, placed, st.nbytes, st.kind))
    elif passes:
        for call in passes[-1].calls:
            for rec in call.storages:
                if rec.index >= 0 and rec.placement is not None:
                    key = (call.name, call.call_index, rec.index)
                    rows.append((key, rec.placement.name.lower(), rec.nbytes, rec.kind))
    if not rows:
        return ["  storage keys: none yet (no step has placed a storage; under auto, none has been measured)"]
    width = max(len(repr(k)) for k, _, _, _ in rows)
    lines = ["  storage keys (region, call, storage), as rt.set_plan() places them:"]
    lines += [f"    {k!r:<{width}}  {pl:<9}  {format_bytes(n):>11}  {kind}" for k, pl, n, kind in rows]
    return lines
