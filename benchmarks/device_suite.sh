#!/usr/bin/env bash
# The GPU checks in one call, under 8 minutes on one H200:
#   1. the CUDA-marked tests (offload engine races and bandwidth, runtime gradients/memory);
#   2. the offload bandwidth and overlap benchmark;
#   3. the planner benchmark on a ~1.5B model (predicted vs measured step time, budget);
#   4. the long-sequence comparison at the ~1.3B preset on two sequence lengths;
#   5. dynamic padding (a new sequence length every step) under auto and its peers;
#   6. host overhead per saved tensor and per op (the dispatch modes) on this host.
# Results go under $OUT (default ./device_out): at most 10 files, one folder deep
# (bench_planner_profile.json is the profile auto's last plan was solved with:
# `python -m offrecomp plan $OUT/bench_planner_profile.json --budget ...` replays it).
# Usage: OUT=/some/dir bash benchmarks/device_suite.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
log() { echo "== $(date +%H:%M:%S) $*" | tee -a "$OUT/suite.log"; }

log "environment"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$PY" -c "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda); print(torch.cuda.get_device_name())"
  "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|numba|numpy|psutil|nvidia-ml-py|pytest|hypothesis) '
  git rev-parse HEAD 2>/dev/null
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" | tee -a "$OUT/suite.log"

log "CUDA tests"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -m cuda -rA tests 2>&1 | tail -n 200 > "$OUT/cuda_tests.log"
tail -n 25 "$OUT/cuda_tests.log" | tee -a "$OUT/suite.log"

log "offload bandwidth and overlap"
timeout 90 "$PY" benchmarks/bench_offload.py --out "$OUT/bench_offload.json" 2>&1 | tail -n 40 | tee -a "$OUT/suite.log"

log "planner: auto at 50% of keep's activation bytes, predicted vs measured"
# OFFRECOMP_LOG=INFO: the calibration check and every (re-)plan, with their reasons
OFFRECOMP_LOG=INFO timeout 150 "$PY" benchmarks/bench_planner.py --device cuda --layers 24 \
  --hidden 2048 --heads 16 --seq 8192 --batch 1 --bf16 --dropout 0 --warmup 5 --repeats 5 \
  --min-bytes 1MiB --out "$OUT/bench_planner.json" --profile "$OUT/bench_planner_profile.json" \
  2>&1 | grep -v "^STAGE:\|profiler_st" | tail -n 80 | tee -a "$OUT/suite.log"

log "long-sequence comparison, gpu-1.3b preset"
timeout 200 "$PY" -m benchmarks.long_seq --preset gpu-1.3b --seq 4096,8192 --no-compile --no-search \
  --no-plots --quiet --repeats 3 --out "$OUT/long_seq" 2>&1 | tail -n 60 | tee -a "$OUT/suite.log"

log "dynamic padding: a new length every step (borrowed plans)"
timeout 90 "$PY" benchmarks/bench_dynamic_shapes.py --device cuda --layers 16 --hidden 1024 \
  --heads 16 --min-seq 1024 --max-seq 8192 --batch 1 --steps 40 --rounds 1 --bf16 \
  --out "$OUT/bench_dynamic_shapes.json" 2>&1 | grep -v "^STAGE:\|profiler_st" | tail -n 20 | tee -a "$OUT/suite.log"

log "host overhead per saved tensor and per op"
timeout 60 "$PY" benchmarks/bench_host_overhead.py --device cuda --out "$OUT/bench_host_overhead.json" \
  2>/dev/null | tee -a "$OUT/suite.log"

log "done"
ls -la "$OUT" "$OUT/long_seq" 2>/dev/null | tee -a "$OUT/suite.log"
