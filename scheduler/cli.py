"""``plan``: make a plan from a saved profile or a model description, and explain it.

    plan PROFILE.json --budget 20GiB [--d2h-gbps 50] [--h2d-gbps 50] [--max-overhead 0.05] [--json]
    plan --model layers=80,hidden=8192,heads=64,seq=131072,batch=1 --device-tflops 990 \\
         --d2h-gbps 50 --h2d-gbps 50 --budget 60GiB
    plan --model ... --device-tflops 990 --max-overhead 0.05 --min-budget

The runtime exposes it as ``python -m offrecomp plan ...``. Exit status: 0 with a plan
that meets the budget, 1 when the budget cannot be met, 2 for invalid arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from scheduler.cost_model import predict
from scheduler.plan import ROOT, Placement, Plan
from scheduler.profile import Profile
from scheduler.solver import InfeasibleBudgetError, solve
from scheduler.units import (
    GBPS,
    INFEASIBLE_POLICIES,
    MAX_OVERHEAD,
    MIN_PREFETCH_REGIONS,
    REPLAY_OP_US,
    NumberRange,
    format_bytes,
    parse_bytes,
)
from scheduler.whatif import gpt_profile

__all__ = ["main", "parse_bytes", "parse_model"]

_MODEL_INTS = ("layers", "hidden", "heads", "seq", "batch", "dtype_bytes", "ffn_mult")
_MODEL_BOOLS = ("fused_attention", "micro_ops", "dropout", "causal")
_MODEL_FLOATS = ("mfu", "hbm_bytes_per_s")
_MODEL_REQUIRED = ("layers", "hidden", "heads", "seq", "batch")
#: The most layers a what-if model may have: a profile of about 20 storages a layer,
#: which the solver plans in seconds (a larger one grows without bound, unannounced).
MAX_MODEL_LAYERS = 4096


def parse_model(spec: str) -> dict[str, Any]:
    """``'layers=80,hidden=8192,...'`` -> keyword arguments of ``gpt_profile``."""
    out: dict[str, Any] = {}
    accepted = ", ".join(_MODEL_INTS + _MODEL_BOOLS + _MODEL_FLOATS)
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip().replace("-", "_")
        raw = raw.strip()
        if not sep or not raw:
            raise ValueError(
                f"model spec item {part!r} is invalid; write key=value, keys: {accepted}"
            )
        if key in out:
            raise ValueError(f"model spec {spec!r} gives {key} twice; give each key once")
        if key in _MODEL_INTS:
            try:
                out[key] = int(raw)
            except ValueError:
                raise ValueError(
                    f"model spec {key}={raw!r} is invalid; accepted: an integer"
                ) from None
        elif key in _MODEL_BOOLS:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(
                    f"model spec {key}={raw!r} is invalid; accepted: true, false, 1, 0, yes, no, on, off"
                )
            out[key] = raw.lower() in ("1", "true", "yes", "on")
        elif key in _MODEL_FLOATS:
            try:
                out[key] = float(raw)
            except ValueError:
                raise ValueError(
                    f"model spec {key}={raw!r} is invalid; accepted: a number"
                ) from None
        else:
            raise ValueError(f"model spec key {key!r} is unknown; accepted: {accepted}")
    if not 1 <= out.get("layers", 1) <= MAX_MODEL_LAYERS:
        raise ValueError(f"model spec layers={out['layers']} is invalid; accepted: 1 to {MAX_MODEL_LAYERS}")
    missing = [k for k in _MODEL_REQUIRED if k not in out]
    if missing:
        raise ValueError(
            f"model spec is missing {', '.join(missing)}; e.g. layers=80,hidden=8192,heads=64,seq=131072,batch=1"
        )
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m offrecomp", description="offrecomp activation planner")
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="plan placements for a profile or a model description")
    plan.add_argument(
        "profile", nargs="?", help="profile JSON saved by the runtime (OFFRECOMP_PROFILE)"
    )
    plan.add_argument(
        "--model", help="GPT model spec: layers=,hidden=,heads=,seq=,batch= (what-if)"
    )
    plan.add_argument(
        "--budget", help="activation budget: bytes or with a unit (20GiB, 512MiB, 1.5GB), or a percentage of "
        "the profile's device capacity (60%%)"
    )
    plan.add_argument(
        "--max-overhead", help="accepted step-time overhead, a fraction from 0 to 10 (0.05 = 5%%)"
    )
    plan.add_argument(
        "--min-budget", action="store_true", help="print the smallest budget within --max-overhead"
    )
    plan.add_argument(
        "--d2h-gbps",
        help="device-to-host GB/s, 1e-6 to 1e6 (overrides the profile; with --model, without "
        "--d2h-gbps and --h2d-gbps: no host link, no offload)",
    )
    plan.add_argument(
        "--h2d-gbps",
        help="host-to-device GB/s, 1e-6 to 1e6 (overrides the profile; with --model, without "
        "--d2h-gbps and --h2d-gbps: no host link, no offload)",
    )
    plan.add_argument(
        "--device-tflops", help="dense 16-bit TFLOP/s of the device (--model)"
    )
    plan.add_argument(
        "--mfu", help="model FLOP utilisation of matmuls (--model), in (0, 1], default 0.5"
    )
    plan.add_argument(
        "--prefetch-regions", default=None,
        help=f"regions reloads run ahead, {MIN_PREFETCH_REGIONS} or more (default: the faster of 2 and 1)",
    )
    plan.add_argument(
        "--replay-op-us",
        help="what a replay under the runtime's dispatch mode costs per op, in microseconds, "
        "0 to 1e6 (overrides the profile; --model default 0)",
    )
    for flag, what in _HOST_FLAGS.values():
        plan.add_argument(
            flag,
            help=f"offrecomp's host time {what}, in microseconds, 0 to 1e6 (overrides the "
            "profile; --model default 0)",
        )
    plan.add_argument(
        "--native-keep",
        action=argparse.BooleanOptionalAction,
        help="regions a plan keeps whole save without the hooks, as the runtime's default "
        "native_keep does, so --pack-us and --unpack-us charge only the others and the root "
        "(overrides the profile; --model default off)",
    )
    plan.add_argument("--no-offload", action="store_true", help="plan with KEEP and RECOMPUTE only")
    plan.add_argument(
        "--infeasible",
        type=lambda text: text.strip().lower(),  # any case, as OFFRECOMP_INFEASIBLE
        choices=INFEASIBLE_POLICIES,
        help="when the budget cannot be met (exit 1): warn (the default) prints the most frugal "
        "plan, error the smallest feasible budget",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


#: The runtime's ranges for the knobs it shares with the command line (scheduler.units),
#: and the command line's own.
_RANGES: dict[str, NumberRange] = {
    "--max-overhead": MAX_OVERHEAD,
    "--d2h-gbps": GBPS,
    "--h2d-gbps": GBPS,
    "--replay-op-us": REPLAY_OP_US,
    "--device-tflops": NumberRange(1e-6, 1e9, "dense TFLOP/s, a number from 1e-6 to 1e9 (990)"),
    "--mfu": NumberRange(1e-6, 1.0, "a fraction of peak FLOP/s from 1e-6 to 1 (0.5)"),
}


#: Flags that take a fraction, where a percentage is the likely slip (``5%`` for 0.05).
_FRACTIONS = ("--max-overhead", "--mfu")


def _check_args(args: argparse.Namespace) -> None:
    """Every number against its range, and the budget's size, each error naming its flag
    (not the Python parameter the value goes on to), the value as given and the forms
    accepted. argparse hands them over as text: its own ``type=float`` would refuse a
    malformed one with only "invalid float value"."""
    for flag, rng in [*_RANGES.items(), *((f, _HOST_US) for f, _ in _HOST_FLAGS.values())]:
        dest = flag[2:].replace("-", "_")
        value = getattr(args, dest)
        if value is None:
            continue
        try:
            setattr(args, dest, rng.parse(value, name=flag))
        except ValueError as e:
            if rng is GBPS and _number(value) <= 0:
                # the runtime takes no 0 either: a plan without the link is this
                raise ValueError(f"{e}; --no-offload plans without the host link") from None
            if flag in _FRACTIONS:
                raise ValueError(f"{e}{_as_fraction(value)}") from None
            raise
    if args.prefetch_regions is not None:
        args.prefetch_regions = _regions(args.prefetch_regions)
    if args.budget is not None:
        text = str(args.budget).strip()
        if text.endswith("%"):  # of the profile's device capacity, once it is read
            pct = _number(text[:-1])
            if not 0.0 < pct <= 100.0:
                raise ValueError(
                    f"--budget={args.budget!r} is invalid; accepted: an integer byte count or a number with a "
                    "unit (20GiB), or a percentage in (0%, 100%] of the profile's device capacity (60%)"
                )
            args.budget = pct / 100.0
        else:
            args.budget = parse_bytes(args.budget, name="--budget")


def _number(text: object) -> float:
    """``text`` as a number, NaN where it is none."""
    try:
        return float(str(text))
    except ValueError:
        return math.nan


def _as_fraction(value: object) -> str:
    """For a percentage given where a fraction goes, the fraction to give instead."""
    text = str(value).strip()
    pct = _number(text[:-1]) if text.endswith("%") else math.nan
    return f"; for {text} give {pct / 100:g}" if math.isfinite(pct) else ""


def _regions(value: object) -> int:
    """``--prefetch-regions``: a whole number of regions, ``MIN_PREFETCH_REGIONS`` or more."""
    text = str(value).strip()
    if text.isascii() and text.isdigit() and int(text) >= MIN_PREFETCH_REGIONS:
        return int(text)
    raise ValueError(
        f"--prefetch-regions={value!r} is invalid; accepted: a number of regions, "
        f"{MIN_PREFETCH_REGIONS} or more (2)"
    )


def _check_min_budget(args: argparse.Namespace) -> None:
    """``--min-budget`` plans for no budget: a ``--budget`` or ``--infeasible`` beside it
    would go unread, so it is refused by name."""
    flags = (("--budget", args.budget), ("--infeasible", args.infeasible))
    given = [flag for flag, value in flags if value is not None]
    if args.min_budget and given:
        raise ValueError(
            f"--min-budget finds the smallest budget within --max-overhead and takes no {' or '.join(given)}; "
            "leave out --min-budget to plan for a budget"
        )


def _load_profile(args: argparse.Namespace) -> Profile:
    if (args.profile is None) == (args.model is None):
        raise ValueError("give either a profile JSON path or --model, not both and not neither")
    if args.model is not None:
        if args.device_tflops is None:
            raise ValueError("--model needs --device-tflops (e.g. 990 for H100/H200 bf16 dense)")
        if (args.d2h_gbps is None) != (args.h2d_gbps is None):
            given = "--d2h-gbps" if args.d2h_gbps is not None else "--h2d-gbps"
            raise ValueError(
                f"--model with {given} alone: a host link needs both --d2h-gbps and --h2d-gbps "
                "(neither: no host link, no offload)"
            )
        kwargs = parse_model(args.model)
        if args.mfu is not None:
            kwargs["mfu"] = args.mfu
        try:
            profile = gpt_profile(
                device_tflops=args.device_tflops,
                d2h_gbps=args.d2h_gbps if args.d2h_gbps is not None else 0.0,
                h2d_gbps=args.h2d_gbps if args.h2d_gbps is not None else 0.0,
                **kwargs,
            )
        except ValueError as e:  # a key of the spec: say where it came from
            raise ValueError(f"--model {args.model!r}: {e}") from None
        _set_replay_op(profile, args.replay_op_us)
        _set_host_costs(profile, args)
        return profile
    try:
        profile = Profile.load(args.profile)
    except OSError as e:
        raise ValueError(f"cannot read profile {args.profile!r}: {e.strerror or e}") from None
    except (json.JSONDecodeError, TypeError, KeyError) as e:
        raise ValueError(f"profile {args.profile!r} is not a valid profile JSON: {e}{_report_hint(args.profile)}") from None
    if args.d2h_gbps is not None:
        profile.d2h_gbps = args.d2h_gbps
    if args.h2d_gbps is not None:
        profile.h2d_gbps = args.h2d_gbps
    _set_replay_op(profile, args.replay_op_us)
    _set_host_costs(profile, args)
    return profile


def _report_hint(path: str) -> str:
    """A hint where the file at ``path`` reads as a run's report rather than a profile."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(4096)
    except OSError:
        return ""
    if '"steps"' in head or head.lstrip().startswith('{"step"'):
        return "; it looks like a run's report, which `python -m offrecomp report FILE` reads"
    return ""


#: Profile field -> (flag, what it costs): NOTE [Host time] in scheduler/timeline.py.
_HOST_FLAGS = {
    "pack_host_seconds": ("--pack-us", "per saved tensor in forward"),
    "unpack_host_seconds": ("--unpack-us", "per saved tensor in backward"),
    "capture_host_seconds": ("--capture-us", "per region call a plan does not keep whole"),
    "offload_host_seconds": ("--offload-us", "per group offload issued at a region's exit"),
    "reload_host_seconds": ("--reload-us", "per group reload issued in backward"),
    "replay_host_seconds": ("--replay-us", "per replay, beyond its ops"),
}


_HOST_US = NumberRange(0.0, 1e6, "microseconds, a number from 0 to 1e6")


def _set_host_costs(profile: Profile, args: argparse.Namespace) -> None:
    for field, (flag, _) in _HOST_FLAGS.items():
        us = getattr(args, flag[2:].replace("-", "_"))
        if us is not None:
            setattr(profile, field, us * 1e-6)
    if args.native_keep is not None:
        profile.native_keep = args.native_keep


def _set_replay_op(profile: Profile, us: float | None) -> None:
    if us is not None:
        profile.replay_op_seconds = us * 1e-6


def _region_rows(profile: Profile, plan: Plan) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def row(name: str, call: int, sizes: list[int], placements: list[Placement]) -> dict[str, Any]:
        r: dict[str, Any] = {"name": name, "call_index": call}
        for p in Placement:
            key = p.name.lower()
            r[key] = sum(1 for q in placements if q == p)
            r[f"{key}_bytes"] = sum(b for b, q in zip(sizes, placements) if q == p)
        return r

    if profile.root:
        rows.append(
            row(
                "(root)",
                0,
                [s.nbytes for s in profile.root],
                [plan.placement((ROOT, 0, i)) for i in range(len(profile.root))],
            )
        )
    for reg in profile.regions:
        rows.append(
            row(
                reg.name,
                reg.call_index,
                [s.nbytes for s in reg.storages],
                [plan.placement((reg.name, reg.call_index, i)) for i in range(len(reg.storages))],
            )
        )
    return rows


def _print_table(rows: list[dict[str, Any]], out: TextIO) -> None:
    # consecutive regions with the same placements are shown as one line
    groups: list[tuple[str, str, dict[str, Any]]] = []
    sig_keys = [k for k in rows[0] if k not in ("name", "call_index")] if rows else []
    for r in rows:
        label = r["name"] if r["call_index"] == 0 else f"{r['name']}#{r['call_index']}"
        if (
            groups
            and all(groups[-1][2][k] == r[k] for k in sig_keys)
            and r["name"] != "(root)"
            and groups[-1][0] != "(root)"
        ):
            groups[-1] = (groups[-1][0], label, r)
        else:
            groups.append((label, label, r))
    header = f"{'regions':<28} {'keep':>5} {'offl':>5} {'recomp':>6} {'kept':>11} {'offloaded':>11} {'dropped':>11}"
    print(header, file=out)
    for first, last, r in groups:
        label = first if first == last else f"{first} .. {last}"
        print(
            f"{label:<28} {r['keep']:>5} {r['offload']:>5} {r['recompute']:>6} "
            f"{format_bytes(r['keep_bytes']):>11} {format_bytes(r['offload_bytes']):>11} "
            f"{format_bytes(r['recompute_bytes']):>11}",
            file=out,
        )


def _run(args: argparse.Namespace, out: TextIO) -> int:
    _check_args(args)
    _check_min_budget(args)
    profile = _load_profile(args)
    budget: int | None = args.budget
    if isinstance(args.budget, float):  # a share of the device's capacity
        if profile.device_capacity_bytes <= 0:
            raise ValueError(
                "--budget as a percentage needs a profile with device_capacity_bytes (a saved profile's; "
                "--model's has none); give the budget in bytes (20GiB)"
            )
        budget = int(args.budget * profile.device_capacity_bytes)
    if args.min_budget:
        overhead = args.max_overhead if args.max_overhead is not None else 0.05
        plan = solve(
            profile,
            budget_bytes=None,
            max_overhead=overhead,
            prefetch_regions=args.prefetch_regions,
            allow_offload=not args.no_offload,
        )
        peak = plan.predicted_peak_bytes or 0
        if args.json:
            print(
                json.dumps(
                    {
                        "max_overhead": overhead,
                        "min_budget_bytes": peak,
                        "predicted_step_seconds": plan.predicted_step_seconds,
                    }
                ),
                file=out,
            )
        else:
            print(
                f"smallest budget within {overhead:.1%} overhead: {format_bytes(peak)} ({peak} bytes)",
                file=out,
            )
        return 0
    if budget is None and args.max_overhead is None:
        raise ValueError(
            "give --budget (e.g. 20GiB) or --max-overhead (e.g. 0.05), or --min-budget"
        )
    plan = solve(
        profile,
        budget_bytes=budget,
        max_overhead=args.max_overhead,
        prefetch_regions=args.prefetch_regions,
        allow_offload=not args.no_offload,
        infeasible=args.infeasible or "warn",
    )
    depth = plan.prefetch_regions if plan.prefetch_regions is not None else 2
    keep = predict(profile, Plan(), prefetch_regions=depth)
    rows = _region_rows(profile, plan)
    step = plan.predicted_step_seconds or 0.0
    if args.json:
        doc = {
            "plan_id": plan.plan_id,
            "feasible": plan.feasible,
            "budget_bytes": plan.budget_bytes,
            "min_feasible_budget_bytes": plan.min_feasible_budget_bytes,
            "predicted_step_seconds": step,
            "predicted_peak_bytes": plan.predicted_peak_bytes,
            "lower_bound_seconds": plan.lower_bound_seconds,
            "keep_step_seconds": keep.step_seconds,
            "keep_peak_bytes": keep.peak_bytes,
            "prefetch_regions": depth,
            "notes": plan.notes,
            "regions": rows,
            "placements": [[k[0], k[1], k[2], p.name] for k, p in plan],
        }
        print(json.dumps(doc), file=out)
        return 0 if plan.feasible else 1
    n_st = sum(len(r.storages) for r in profile.regions) + len(profile.root)
    print(
        f"profile {profile.signature}: {len(profile.regions)} region calls, {n_st} storages, "
        f"{format_bytes(profile.activation_bytes)} of activations",
        file=out,
    )
    link = (
        f"d2h {profile.d2h_gbps:g} GB/s, h2d {profile.h2d_gbps:g} GB/s"
        if profile.d2h_gbps > 0 and profile.h2d_gbps > 0
        else "no host link"
    )
    print(
        f"budget {format_bytes(budget) if budget is not None else 'none'}, {link}, prefetch {depth} regions"
        f"{'' if args.prefetch_regions is not None else ' (the faster of 2 and 1)'}, "
        f"replay dispatch {1e6 * profile.replay_op_seconds:g} us/op",
        file=out,
    )
    _print_table(rows, out)
    over = step / keep.step_seconds - 1 if keep.step_seconds > 0 else 0.0
    print(
        f"predicted step   {step:.4g} s ({over:+.1%} over all-KEEP {keep.step_seconds:.4g} s)",
        file=out,
    )
    print(
        f"predicted peak   {format_bytes(plan.predicted_peak_bytes or 0)} (all-KEEP {format_bytes(keep.peak_bytes)})",
        file=out,
    )
    lb = plan.lower_bound_seconds
    print(
        f"lower bound      {lb:.4g} s"
        if lb is not None and math.isfinite(lb)
        else "lower bound      none (budget cannot be met)",
        file=out,
    )
    print(f"plan id          {plan.plan_id}", file=out)
    for note in plan.notes:
        print(f"note: {note}", file=out)
    return 0 if plan.feasible else 1


def warmup(out: TextIO | None = None) -> float:
    """Compile the planner's kernels (numba) by planning a small synthetic model, so that
    the first plan of a training run does not (about 30 s on one CPU core). numba keeps
    the compiled code on disk, next to the package or under ``NUMBA_CACHE_DIR``, for
    later processes on machines with the same CPU; a container image can run this once
    when it is built. Returns the seconds it took."""
    import time

    t0 = time.perf_counter()
    profile = gpt_profile(
        layers=4, hidden=64, heads=2, seq=128, batch=1, device_tflops=100.0, d2h_gbps=10.0, h2d_gbps=10.0
    )
    solve(profile, budget_bytes=profile.activation_bytes // 2, prefetch_regions=2, allow_offload=True)
    solve(profile, budget_bytes=None, max_overhead=0.05, prefetch_regions=2, allow_offload=True)
    predict(profile, Plan(), prefetch_regions=2)
    seconds = time.perf_counter() - t0
    if out is not None:
        print(f"offrecomp: the planner's kernels are compiled and cached ({seconds:.1f} s)", file=out)
    return seconds


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    stream = out if out is not None else sys.stdout
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(list(argv) if argv is not None else None)
        if extra:  # the subcommand's usage, not the top level's (which would hide its flags)
            _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else 2
    try:
        return _run(args, stream)
    except InfeasibleBudgetError as e:
        print(
            f"offrecomp plan: activation budget {format_bytes(e.budget_bytes)} ({e.budget_bytes} bytes) "
            f"cannot be met; the smallest feasible budget is {format_bytes(e.min_feasible_bytes)} "
            f"({e.min_feasible_bytes} bytes). Raise --budget, or leave out --infeasible error to "
            "get the most memory-frugal plan",
            file=sys.stderr,
        )
        return 1
    except (ValueError, TypeError) as e:
        print(f"offrecomp plan: error: {e}", file=sys.stderr)
        return 2


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of ``command`` under ``parser``'s subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]  # type: ignore[no-any-return]
    raise KeyError(command)


if __name__ == "__main__":
    sys.exit(main())
