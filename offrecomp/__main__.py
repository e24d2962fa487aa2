"""``python -m offrecomp``: what-if planning (``plan``), compiling the planner ahead
(``warmup``), and reading a run's report file (``report``).

As argparse does: ``-h``/``--help`` (after the command too) prints help to stdout and
exits 0; a missing or unknown command prints the usage to stderr and exits 2.
"""

from __future__ import annotations

import sys

USAGE = """usage: python -m offrecomp plan PROFILE.json --budget 20GiB [--d2h-gbps 50 ...]
       python -m offrecomp plan --model layers=80,hidden=8192,heads=64,seq=131072,batch=1 \\
           --device-tflops 990 --d2h-gbps 50 --h2d-gbps 50 --budget 60GiB

       python -m offrecomp warmup

       python -m offrecomp report run.jsonl [--plot out.png] [--table]

Commands:
  plan    print the plan, predicted step time and memory, and the lower bound
  warmup  compile the planner's kernels ahead (about 30 s, once per machine: numba caches
          them on disk), e.g. when a container image is built; otherwise the first plan
          of a training run pays for it
  report  summarize a report written with OFFRECOMP_REPORT=run.jsonl: phases, peak
          activation memory, placements, measured against predicted step time; --plot
          draws them per step (needs matplotlib, the bench extra)

python -m offrecomp COMMAND --help lists a command's options.
"""

WARMUP_USAGE = """usage: python -m offrecomp warmup [-h]

Compile the planner's kernels (numba) ahead by planning a small synthetic model, so that
the first plan of a training run does not (about 30 s on one CPU core). numba caches
them on disk, next to the package or under NUMBA_CACHE_DIR, for later processes on
machines with the same CPU; a container image can run this once when it is built.

options:
  -h, --help  show this help message and exit
"""

COMMANDS = ("plan", "warmup", "report")
_HELP = ("-h", "--help")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(f"offrecomp: a command is required; accepted: {', '.join(COMMANDS)}\n\n{USAGE}", file=sys.stderr)
        return 2
    command, rest = args[0], args[1:]
    if command in (*_HELP, "help"):
        if command == "help" and rest:  # `help plan` is `plan --help`
            return main([rest[0], "--help"])
        print(USAGE)
        return 0
    if command == "warmup":
        if any(a in _HELP for a in rest):
            print(WARMUP_USAGE)
            return 0
        if rest:
            print(f"offrecomp warmup: takes no arguments, got {' '.join(rest)!r}\n\n{WARMUP_USAGE}", file=sys.stderr)
            return 2
        from scheduler.cli import warmup

        warmup(sys.stdout)
        return 0
    if command == "report":
        from offrecomp.report_cli import main as report_main

        return report_main(rest)
    if command != "plan":
        print(
            f"offrecomp: unknown command {command!r}; accepted: {', '.join(COMMANDS)}\n\n{USAGE}",
            file=sys.stderr,
        )
        return 2
    from scheduler.cli import main as plan_main  # never imports torch

    return plan_main([command, *rest])


if __name__ == "__main__":
    sys.exit(main())
