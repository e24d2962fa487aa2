#!/usr/bin/env bash
# Sets everything up, then runs the long-sequence benchmark (small CPU default, larger on a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m benchmarks.long_seq "$@"
