"""What offloading buys in the planner's own model: the predicted step of the plan that
may offload against the plan without offloads, at the same budget, on what-if GPT
profiles (scheduler.whatif) of the benchmark's ``gpu-1.3b`` shape, or on a profile a run
saved (``OFFRECOMP_PROFILE``; ``benchmarks/device_offload.sh`` saves one per length).

    python benchmarks/offload_headroom.py [--gbps 55] [--tflops 989] [--mfu 0.5] [--dropout]
    python benchmarks/offload_headroom.py --profile profile_8192.json [--gbps 55] [--no-host-cost]

Budgets are shares of all-KEEP's predicted peak. The lower bound (``Plan.lower_bound_seconds``)
is what no plan within the budget can beat in this model. ``--no-host-cost`` sets the
runtime's own host costs of a saved profile (``scheduler.cost_model.HOST_COSTS``: per save, per
checkpoint, per group, per reload, per replay) to zero: what the link and the model would
allow a runtime that cost nothing on the host. A model figure, not a measurement:
``benchmarks/device_offload.sh`` measures the same comparison on a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._args import PROFILE, looks_like, number
from scheduler import Placement, Plan, Profile, gpt_profile, simulate, solve
from scheduler.cost_model import HOST_COSTS
from scheduler.units import format_bytes

SEQS = (4096, 8192, 16384)
SHARES = (0.5, 0.25)


def _load(ap: argparse.ArgumentParser, path: Path) -> Profile:
    """The profile saved at ``path``, or ``ap.error`` saying why it cannot be read or what
    the file looks like when it is not a profile (a run's report, long_seq's results)."""
    try:
        return Profile.load(path)
    except OSError as exc:
        ap.error(f"--profile {str(path)!r}: cannot read it: {exc.strerror or exc}")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # not JSON, or JSON of no profile
        what = looks_like(path)
        if what == PROFILE:  # a profile's keys, but something in it is wrong
            ap.error(f"--profile {str(path)!r} is not a valid profile JSON: {exc}")
        ap.error(f"--profile {str(path)!r} is not a valid profile JSON; it looks like {what}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--gbps", type=number(above=0),
        help="D2H and H2D GB/s, > 0 (default 55; with --profile, the profile's own link)",
    )
    ap.add_argument("--profile", type=Path, help="a saved profile instead of the what-if GPTs")
    ap.add_argument(
        "--tflops", type=number(above=0), default=989.0, help="dense 16-bit TFLOP/s, > 0 (default 989)"
    )
    ap.add_argument(
        "--mfu", type=number(above=0, at_most=1), default=0.5,
        help="matmul FLOP utilisation, in (0, 1] (default 0.5)",
    )
    ap.add_argument(
        "--dropout", action="store_true", help="dropout layers (the gpu-1.3b preset has none)"
    )
    ap.add_argument(
        "--no-host-cost", action="store_true",
        help="a saved profile's offrecomp host costs set to zero (the what-if GPTs have none)",
    )
    args = ap.parse_args(argv)
    if args.profile is not None:
        saved = _load(ap, args.profile)
        if args.gbps is not None:
            saved.d2h_gbps = saved.h2d_gbps = args.gbps
        costs = ", ".join(f"{f.removesuffix('_host_seconds')} {1e6 * getattr(saved, f):.1f} us" for f in HOST_COSTS)
        if args.no_host_cost:
            for f in HOST_COSTS:
                setattr(saved, f, 0.0)
            costs = "set to zero (--no-host-cost)"
        print(f"profile {args.profile} ({saved.signature}); link {saved.d2h_gbps:g}/{saved.h2d_gbps:g} GB/s; "
              f"offrecomp's host costs: {costs}")
        cases = [("-", saved)]
    else:
        gbps = args.gbps if args.gbps is not None else 55.0
        print(f"gpt 24x2048, 16 heads, batch 1, {'with' if args.dropout else 'no'} dropout; link {gbps:g} GB/s, {args.tflops:g} TFLOP/s, mfu {args.mfu:g}")
        cases = [
            (str(seq), gpt_profile(
                layers=24, hidden=2048, heads=16, seq=seq, batch=1, device_tflops=args.tflops,
                d2h_gbps=gbps, h2d_gbps=gbps, mfu=args.mfu, dropout=args.dropout,
            ))
            for seq in SEQS
        ]
    print(f"{'tokens':>6} {'budget':>6} {'keep ms':>8} {'no offload ms':>13} {'auto ms':>8} "
          f"{'auto/no':>7} {'offloaded':>11} {'bound ms':>8} {'bound/no':>8}")
    for seq, profile in cases:
        keep = simulate(profile, Plan())
        for share in SHARES:
            budget = int(keep.peak_bytes * share)
            auto = solve(profile, budget_bytes=budget, log_infeasible=False)
            drops = solve(profile, budget_bytes=budget, allow_offload=False, log_infeasible=False)
            if not (auto.feasible and drops.feasible):
                print(f"{seq:>6} {share:>6.0%} {keep.step_seconds * 1e3:>8.1f}  infeasible: "
                      f"the most frugal plans hold {format_bytes(auto.predicted_peak_bytes or 0)} "
                      f"(may offload), {format_bytes(drops.predicted_peak_bytes or 0)} (no offload)")
                continue
            off = sum(
                s.nbytes for r in profile.regions for i, s in enumerate(r.storages)
                if auto.placement((r.name, r.call_index, i)) is Placement.OFFLOAD
            )
            a = auto.predicted_step_seconds or 0.0
            n = drops.predicted_step_seconds or 0.0
            lb = auto.lower_bound_seconds or 0.0
            print(
                f"{seq:>6} {share:>6.0%} {keep.step_seconds * 1e3:>8.1f} {n * 1e3:>13.1f} "
                f"{a * 1e3:>8.1f} {a / n:>7.3f} {off / 2**30:>7.2f} GiB {lb * 1e3:>8.1f} {lb / n:>8.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
