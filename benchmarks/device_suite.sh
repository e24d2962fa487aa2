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
# Usage: OUT=/some/dir bash benchmarks/device_suite.sh
set -uo pipefail
OUT=${OUT:-device_out}
source "$(dirname "$0")/device_lib.sh"

log "environment"
environment
"$PY" -m pip list 2>/dev/null | grep -iE '^(torch|numba|numpy|psutil|nvidia-ml-py|pytest|hypothesis) ' \
  | tee -a "$WORK/env.txt" "$OUT/suite.log"
pack

log "0. the planner's kernels (numba), compiled once for every step below"
timeout 90 "$PY" -m offrecomp warmup 2>&1 | tee -a "$OUT/suite.log"

log "1. planner: auto at 50% of keep's activation bytes, predicted vs measured, 8K and 4K tokens"
# OFFRECOMP_LOG=INFO: the calibration check, every (re-)plan and the offload trial, with
# their reasons; --warmup 9: an offload trial settles within 8 steps
for S in 8192 4096; do
  OFFRECOMP_LOG=INFO timeout 120 "$PY" benchmarks/bench_planner.py --device cuda --layers 24 \
    --hidden 2048 --heads 16 --seq $S --batch 1 --bf16 --dropout 0 --warmup 9 --repeats 5 \
    --min-bytes 1MiB --out "$WORK/bench_planner_$S.json" --profile "$WORK/bench_planner_profile_$S.json" \
    2>&1 | grep -v "^STAGE:\|profiler_st" > "$WORK/bench_planner_$S.log"
  tail -n 60 "$WORK/bench_planner_$S.log" | tee -a "$OUT/suite.log"
  pack
done

log "2. CUDA tests (but inductor and flex_attention)"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -m cuda -k "not inductor and not flex" -rfE \
  --durations=5 tests > "$WORK/cuda_tests.log" 2>&1
tail -n 30 "$WORK/cuda_tests.log" | tee -a "$OUT/suite.log"
pack

log "3. offload bandwidth and overlap"
timeout 45 "$PY" benchmarks/bench_offload.py --out "$WORK/bench_offload.json" 2>&1 | tail -n 30 \
  | tee -a "$OUT/suite.log"
pack

log "4. long-sequence comparison, gpu-1.3b preset"
# save_on_cpu and forced offload are link-bound (15-36x and 4x here before) and left out
timeout 170 "$PY" -m benchmarks.long_seq --preset gpu-1.3b --seq 4096,8192 --no-compile --no-search \
  --strategies none,ckpt_block,ckpt_sqrt,sac_matmul,offrecomp_keep,offrecomp_recompute,offrecomp_auto@50%,offrecomp_auto@25% \
  --no-plots --quiet --repeats 3 --out "$WORK/long_seq" 2>&1 | tail -n 40 | tee -a "$OUT/suite.log"
pack

log "5. dynamic padding: a new length every step (borrowed plans)"
timeout 75 "$PY" benchmarks/bench_dynamic_shapes.py --device cuda --layers 16 --hidden 1024 \
  --heads 16 --min-seq 1024 --max-seq 8192 --batch 1 --steps 40 --rounds 1 --bf16 \
  --out "$WORK/bench_dynamic_shapes.json" 2>&1 | grep -v "^STAGE:\|profiler_st" | tail -n 20 \
  | tee -a "$OUT/suite.log"
pack

log "6. host overhead per saved tensor and per op (wall clock, then the host thread's CPU time)"
timeout 45 "$PY" benchmarks/bench_host_overhead.py --device cuda --out "$WORK/bench_host_overhead.json" \
  2>/dev/null | tee -a "$OUT/suite.log"
timeout 45 "$PY" benchmarks/bench_host_overhead.py --device cuda --clock thread \
  --out "$WORK/bench_host_overhead_thread.json" 2>/dev/null | tee -a "$OUT/suite.log"
pack

log "6b. one planned auto step that offloads at 4K tokens, profiled (CPU + CUDA activities)"
# the runtime calls per offloaded storage and per group, host time per region, any
# synchronising call in forward, the three largest host costs (benchmarks/profile_step.py)
timeout 90 "$PY" benchmarks/profile_step.py --preset gpu-1.3b --seq 4096 --budget-fraction 0.25 \
  --out "$WORK/profile_step_4096.json" --trace "$OUT/profile_trace_4096.json.gz" 2>&1 | tail -n 40 \
  | tee -a "$OUT/suite.log"
pack

log "7. CUDA tests with inductor and flex_attention"
timeout 120 "$PY" -m pytest -q -p no:cacheprovider -m cuda -k "inductor or flex" -rfE tests \
  > "$WORK/cuda_tests_compiled.log" 2>&1
tail -n 20 "$WORK/cuda_tests_compiled.log" | tee -a "$OUT/suite.log"
pack

log "done"
ls -la "$WORK" "$WORK/long_seq" 2>/dev/null | tee -a "$OUT/suite.log"
