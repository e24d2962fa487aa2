#!/usr/bin/env bash
# The GPU checks in one call, about 6 minutes on one H200 (each step has its own timeout):
#   0. `python -m offrecomp warmup` (the planner's numba kernels, about 20 s);
#   1. the planner benchmark on a ~1.5B model at 8K and 4K tokens (predicted vs measured
#      step time, budget, the offload trial);
#   2. the CUDA-marked tests (offload engine races and bandwidth, runtime gradients/memory,
#      model and layout zoos), the inductor and flex_attention ones last (step 7);
#   3. the offload bandwidth and overlap benchmark;
#   4. the long-sequence comparison at the ~1.3B preset on two sequence lengths;
#   5. dynamic padding (a new sequence length every step) under auto and its peers;
#   6. host overhead per saved tensor and per op (the dispatch modes) on this host, and
#      one planned offloading step at 4K tokens under torch.profiler (profile_step.py).
# $OUT (default ./device_out) gets two files, both brought up to date after every step,
# so a run stopped early still returns what it finished: suite.log (what each step
# printed) and results.tgz (every raw file; bench_planner_profile_<tokens>.json is the
# profile auto's last plan was solved with: `python -m offrecomp plan
# bench_planner_profile_8192.json --budget ...` replays it).
#
# DRY_RUN=1 (or --dry-run) runs the same steps on the CPU at tiny sizes, and the CUDA tests
# of one file (all skip), to check the script anywhere; every step's timeout is doubled.
# Usage: OUT=/some/dir bash benchmarks/device_suite.sh [--dry-run]
set -uo pipefail
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
OUT=${OUT:-device_out}
source "$(dirname "$0")/device_lib.sh"

if [ "$DRY_RUN" = 1 ]; then
  PLANNER=(--device cpu --layers 2 --hidden 32 --heads 2 --batch 1 --dropout 0 --warmup 3 --repeats 1
    --min-bytes 0)
  PLANNER_SEQS="32"
  # the invocations are what is checked: every test skips
  CUDA_TESTS=(tests/offrecomp/test_offload_cuda.py) COMPILED_TESTS=(tests/offrecomp/test_compiled_functions.py)
  OFFLOAD=(--device cpu --quick)
  LONG_SEQ=(--preset cpu-tiny --device cpu --layers 2 --hidden 32 --heads 2 --batch 1 --seq 64
    --strategies none,ckpt_block,offrecomp_recompute,offrecomp_auto@50% --repeats 1)
  DYNAMIC=(--device cpu --layers 4 --hidden 64 --min-seq 16 --max-seq 64 --steps 12 --rounds 1)  # as its test
  HOST=(--device cpu --ops 32 --rounds 1 --reps 2)
  PROFILE=(--preset cpu-tiny --device cpu --layers 2 --hidden 32 --heads 2 --batch 1 --seq 64)
else
  PLANNER=(--device cuda --layers 24 --hidden 2048 --heads 16 --batch 1 --bf16 --dropout 0 --warmup 9
    --repeats 5 --min-bytes 1MiB)
  PLANNER_SEQS="8192 4096"
  CUDA_TESTS=(tests) COMPILED_TESTS=(tests)
  OFFLOAD=()
  # save_on_cpu and forced offload are link-bound (15-36x and 4x here before) and left out
  LONG_SEQ=(--preset gpu-1.3b --seq 4096,8192 --repeats 3
    --strategies none,ckpt_block,ckpt_sqrt,sac_matmul,offrecomp_keep,offrecomp_recompute,offrecomp_auto@50%,offrecomp_auto@25%)
  DYNAMIC=(--device cuda --layers 16 --hidden 1024 --heads 16 --min-seq 1024 --max-seq 8192 --batch 1
    --steps 40 --rounds 1 --bf16)
  HOST=(--device cuda)
  PROFILE=(--preset gpu-1.3b --seq 4096)
fi

log "environment (dry run: $DRY_RUN)"
environment
"$PY" -m pip list 2>/dev/null | grep -iE '^(torch|numba|numpy|psutil|nvidia-ml-py|pytest|hypothesis) ' \
  | tee -a "$WORK/env.txt" "$OUT/suite.log"
pack

log "0. the planner's kernels (numba), compiled once for every step below"
step warmup 90 "$PY" -m offrecomp warmup

log "1. planner: auto at 50% of keep's activation bytes, predicted vs measured, at $PLANNER_SEQS tokens"
# OFFRECOMP_LOG=INFO: the calibration check, every (re-)plan and the offload trial, with
# their reasons; --warmup 9: an offload trial settles within 8 steps
for S in $PLANNER_SEQS; do
  step "bench_planner_$S" 120 env OFFRECOMP_LOG=INFO "$PY" benchmarks/bench_planner.py "${PLANNER[@]}" \
    --seq "$S" --out "$WORK/bench_planner_$S.json" --profile "$WORK/bench_planner_profile_$S.json"
done

log "2. CUDA tests (but inductor and flex_attention)"
step cuda_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m cuda -k "not inductor and not flex" -rfE \
  --durations=5 "${CUDA_TESTS[@]}"

log "3. offload bandwidth and overlap"
step bench_offload 45 "$PY" benchmarks/bench_offload.py "${OFFLOAD[@]}" --out "$WORK/bench_offload.json"

log "4. long-sequence comparison"
step long_seq 170 "$PY" -m benchmarks.long_seq "${LONG_SEQ[@]}" --no-compile --no-search --no-plots --quiet \
  --out "$WORK/long_seq"

log "5. dynamic padding: a new length every step (borrowed plans)"
step bench_dynamic_shapes 75 "$PY" benchmarks/bench_dynamic_shapes.py "${DYNAMIC[@]}" \
  --out "$WORK/bench_dynamic_shapes.json"

log "6. host overhead per saved tensor and per op (wall clock, then the host thread's CPU time)"
step bench_host_overhead 45 "$PY" benchmarks/bench_host_overhead.py "${HOST[@]}" \
  --out "$WORK/bench_host_overhead.json"
step bench_host_overhead_thread 45 "$PY" benchmarks/bench_host_overhead.py "${HOST[@]}" --clock thread \
  --out "$WORK/bench_host_overhead_thread.json"

log "6b. one planned auto step that offloads, profiled (CPU + CUDA activities)"
# the runtime calls per offloaded storage and per group, host time per region, any
# synchronising call in forward, the three largest host costs (benchmarks/profile_step.py)
step profile_step 90 "$PY" benchmarks/profile_step.py "${PROFILE[@]}" --budget-fraction 0.25 \
  --out "$WORK/profile_step.json" --trace "$OUT/profile_trace.json.gz"

log "7. CUDA tests with inductor and flex_attention"
step cuda_tests_compiled 120 "$PY" -m pytest -q -p no:cacheprovider -m cuda -k "inductor or flex" -rfE \
  "${COMPILED_TESTS[@]}"

log "done"
ls -la "$WORK" "$WORK/long_seq" 2>/dev/null | tee -a "$OUT/suite.log"
