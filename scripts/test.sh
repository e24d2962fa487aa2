#!/usr/bin/env bash
# Sets everything up, then runs the linters, the type checker and the CPU test tier.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# The planner's numba kernels take about 30 s of one core to compile on a fresh checkout
# (their cache lives beside the sources). Compiled here while ruff and mypy run, each
# pytest worker loads them instead of compiling its own copy.
WARM_LOG=$(mktemp)
python -m offrecomp warmup >"$WARM_LOG" 2>&1 &
WARM_PID=$!
echo "== ruff"; ruff check offrecomp scheduler tests benchmarks examples
echo "== mypy"; mypy offrecomp scheduler
if wait "$WARM_PID"; then
  cat "$WARM_LOG"
else  # not fatal: the tests compile the kernels themselves, and test what fails
  echo "warning: python -m offrecomp warmup failed:"; cat "$WARM_LOG"
fi
rm -f "$WARM_LOG"
# One pytest worker per core (pytest-xdist), each with one intra-op thread: the tests are
# small models whose time goes to Python, so two single-threaded workers on two cores run
# the tier in about 60% of the time one two-threaded process takes.
# At most 8 workers by default (each holds its own torch import); PYTEST_WORKERS=N
# sets the number, PYTEST_WORKERS=0 runs them in this process. Workers steal queued tests
# from each other (--dist worksteal), and tests/conftest.py hands out the slow ones first.
WORKERS=${PYTEST_WORKERS:-$(python -c "import os; print(min(8, len(os.sched_getaffinity(0))))")}
if [ "$WORKERS" != "0" ] && python -c "import xdist" >/dev/null 2>&1; then
  echo "== pytest (workers: $WORKERS)"
  OMP_NUM_THREADS=1 python -m pytest -q -n "$WORKERS" --dist worksteal "$@"
else
  echo "== pytest"
  python -m pytest -q "$@"
fi
