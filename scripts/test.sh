#!/usr/bin/env bash
# Sets everything up, then runs the linters, the type checker and the CPU test tier.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
echo "== ruff"; ruff check offrecomp scheduler tests benchmarks
echo "== mypy"; mypy offrecomp scheduler
echo "== pytest"; python -m pytest -q "$@"
