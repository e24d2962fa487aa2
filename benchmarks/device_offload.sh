#!/usr/bin/env bash
# Does offloading pay on this GPU? The checks of an offloading plan in one call, planned
# to fit 8.5 minutes on one H200, so run it with a 590 s limit (323 s on 2026-12-04, with
# a 90 s cap at 16K tokens that is now 150 s, and without step 5's replay check, capped
# at 75 s, or step 2's region-call and issue timings, at 60 and 40 s; each long_seq step
# stops starting new work at its --max-seconds and runs under a timeout 45 s longer).
# The whole script keeps to DEVICE_BUDGET_S (default 570 s, device_lib.sh): a step gets
# at most what is left, and the steps are ordered so that what may be cut is last:
#   1. `python -m offrecomp warmup` (the planner's numba kernels), then the CUDA-marked
#      tests but the inductor and flex_attention ones, four workers (cuda_tests.log);
#   2. one planned auto step that offloads at 4K tokens, profiled (CPU and CUDA
#      activities): CUDA runtime calls per offloaded storage, host time per region, any
#      synchronising call in forward (benchmarks/profile_step.py; profile_step.json, and
#      the Chrome trace profile_trace_4096.json.gz beside results.tgz); then the host
#      time of a region call's entry and exit part by part in keep, recompute and offload
#      (benchmarks/bench_region_calls.py on 8 blocks at 4K tokens; region_calls.json),
#      and of each call an offload group's issue is made of, with the group's copies
#      issued one by one, in one _foreach_copy_, or gathered on the device first
#      (benchmarks/bench_issue_primitives.py; issue_primitives.json);
#   3. python -m benchmarks.long_seq at the gpu-1.3b preset, 8K then 16K tokens: plain,
#      keep, auto at 50% and 25% of plain's saved bytes, the same budgets with nothing
#      offloadable (offrecomp_auto_no_offload@X: the best plan without offloading), and
#      the peers ckpt_block, sac_matmul, ckpt_sqrt, save_on_cpu (last: it is link-bound);
#   4. the same as 3 at 4K tokens without the peers (the prediction of offloading plans);
#   5. at 16K tokens, each replay of the plan without offloading at 50% against the
#      planner's prediction of it, op by op (benchmarks/replay_check.py;
#      replay_check_16384.json): a diagnostic, so last;
#   each long_seq run saves the profile its last plan was solved with (profile_<tokens>.json,
#   for `python -m offrecomp plan` offline, and headroom_<tokens>.log: the planner's
#   predicted auto / no-offload and lower bound on it, benchmarks/offload_headroom.py)
#   and is judged by benchmarks/offload_checks.py
#   (checks_<tokens>.txt: keep within 1% of plain; auto's offloading steps within 10% of
#   prediction, 5% faster than the no-offload plan, faster than every peer at or below
#   its memory), with benchmarks/model_fit.py's measured over predicted step, forward,
#   replay and rest of each run (fit_<tokens>.txt).
# $OUT (default ./device_offload_out) gets suite.log (what each step printed and its exit
# status) and results.tgz (every raw file), both brought up to date after every step.
#
# DRY_RUN=1 (or --dry-run) runs the same steps on the CPU at the cpu-tiny preset, tiny
# sizes and budgets, and the CUDA tests of one file (all skip), to check the script
# anywhere; every step's timeout is doubled.
# STEPS (default 1,2,3,4,5) names the numbered steps to run, to run some again after a
# fix within one lease (the planner's kernels are compiled first whatever it names); SEQS
# (default "8192 16384") the lengths of step 3.
# Usage: OUT=/some/dir [STEPS=3,4] [SEQS=8192] bash benchmarks/device_offload.sh [--dry-run]
set -uo pipefail
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
OUT=${OUT:-device_offload_out}
source "$(dirname "$0")/device_lib.sh"

AUTO=offrecomp_auto@50%,offrecomp_auto@25%,offrecomp_auto_no_offload@50%,offrecomp_auto_no_offload@25%
PEERS=ckpt_block,sac_matmul,ckpt_sqrt,save_on_cpu
HEADROOM_GBPS=55  # the H200's measured link (docs/results/h200-2026-12-04)
if [ "$DRY_RUN" = 1 ]; then
  MODEL=(--preset cpu-tiny --device cpu --layers 2 --hidden 32 --heads 2 --batch 1)
  SEQS=${SEQS:-128} SHORT=64 REPEATS=1 MAXS="128:40" SHORT_MAXS=30
  PEERS=ckpt_block  # save_on_cpu needs a GPU; the script is what is checked
  PROFILE=(--preset cpu-tiny --device cpu --layers 2 --hidden 32 --heads 2 --batch 1 --seq 64)
  CUDA_TESTS=(tests/offrecomp/test_offload_cuda.py)  # the invocation is what is checked: all skip
  CUDA_WORKERS=0  # no worker processes to start for tests that all skip
  REPLAY_CHECK=(--preset cpu-tiny --device cpu --layers 2 --hidden 32 --heads 2 --batch 1) CHECK=128
  REGION_CALLS=(--device cpu --layers 2 --hidden 32 --heads 2 --seq 64 --steps 3 --warmup 2)
  PRIMITIVES=(--device cpu --storages 4 --mib 1 --reps 5)
else
  MODEL=(--preset gpu-1.3b --device cuda)
  # 16384 needs about 150 s for every runner (90 s skipped plain, keep and two peers)
  SEQS=${SEQS:-8192 16384} SHORT=4096 REPEATS=3 MAXS="8192:90 16384:150" SHORT_MAXS=40
  PROFILE=(--preset gpu-1.3b --device cuda --seq 4096)
  CUDA_TESTS=(tests)
  CUDA_WORKERS=4
  # 16K: where plans that serve replays ran at 0.70-0.76x their predicted replay time
  REPLAY_CHECK=(--preset gpu-1.3b --device cuda) CHECK=16384
  REGION_CALLS=(--device cuda --layers 8 --hidden 2048 --heads 16 --seq "$SHORT" --steps 20 --warmup 5)
  PRIMITIVES=(--device cuda --storages 13 --mib 16 --reps 100)
fi

# headroom TOKENS: benchmarks/offload_headroom.py on that length's saved profile, the link
# at HEADROOM_GBPS (the last plan saved may be the no-offload runner's, told of no link):
# the planner's predicted auto / no-offload and lower bound / no-offload at 50% and 25%,
# with the host costs the runtime learnt, then with them at zero (what the link allows)
headroom() {
  [ -f "$WORK/profile_$1.json" ] || return 0
  step "headroom_$1" 60 "$PY" benchmarks/offload_headroom.py --profile "$WORK/profile_$1.json" \
    --gbps "$HEADROOM_GBPS"
  step "headroom_free_$1" 60 "$PY" benchmarks/offload_headroom.py --profile "$WORK/profile_$1.json" \
    --gbps "$HEADROOM_GBPS" --no-host-cost
}

# judge NAME: offload_checks.py over long_seq run NAME, into checks_NAME.txt, and
# model_fit.py (measured over predicted, part by part) into fit_NAME.txt (nothing where
# the run left no results.json)
judge() {
  if [ ! -f "$WORK/$1/results.json" ]; then  # the run was skipped, or stopped before writing it
    echo "   [judge $1: no results.json to judge]" | tee -a "$OUT/suite.log"
    return 0
  fi
  "$PY" benchmarks/offload_checks.py "$WORK/$1/results.json" --out "$WORK/checks_$1.json" \
    > "$WORK/checks_$1.txt" 2>&1
  tee -a "$OUT/suite.log" < "$WORK/checks_$1.txt"
  "$PY" benchmarks/model_fit.py "$WORK/$1/results.json" --out "$WORK/fit_$1.json" > "$WORK/fit_$1.txt" 2>&1
  tee -a "$OUT/suite.log" < "$WORK/fit_$1.txt"
  pack
}

STEPS=${STEPS:-1,2,3,4,5}
for n in ${STEPS//,/ }; do
  case $n in 1|2|3|4|5) ;; *) echo "STEPS=$STEPS is invalid; accepted: step numbers from 1 to 5, comma-separated" >&2; exit 2 ;; esac
done
want() { [[ ",$STEPS," == *",$1,"* ]] || { log "$1. skipped: STEPS=$STEPS"; return 1; }; }

log "environment (dry run: $DRY_RUN)"
environment
pack

log "1. the planner's kernels (numba)"
step warmup 90 "$PY" -m offrecomp warmup
if want 1; then
  step cuda_tests 90 "$PY" -m pytest -q -p no:cacheprovider -n "$CUDA_WORKERS" -m cuda -k "not inductor and not flex" \
    -rfE --durations=5 "${CUDA_TESTS[@]}"
fi

if want 2; then
log "2. one planned auto step that offloads at $SHORT tokens, profiled"
step profile_step 90 "$PY" benchmarks/profile_step.py "${PROFILE[@]}" --budget-fraction 0.25 \
  --out "$WORK/profile_step.json" --trace "$OUT/profile_trace_$SHORT.json.gz"
step region_calls 60 "$PY" benchmarks/bench_region_calls.py "${REGION_CALLS[@]}" --out "$WORK/region_calls.json"
step issue_primitives 40 "$PY" benchmarks/bench_issue_primitives.py "${PRIMITIVES[@]}" \
  --out "$WORK/issue_primitives.json"
fi

if want 3; then
for S in $SEQS; do
  log "3. auto against the plan without offloading and the peers at $S tokens"
  M=$(tr ' ' '\n' <<< "$MAXS" | sed -n "s/^$S://p")  # this length's --max-seconds
  M=${M:-90}  # a length of SEQS the table does not name
  M=$(within "$M" 50)  # stop starting work early enough to end inside the budget
  step "long_seq_$S" $((M + 45)) env OFFRECOMP_PROFILE="$WORK/profile_$S.json" \
    "$PY" -m benchmarks.long_seq "${MODEL[@]}" --seq "$S" \
    --strategies "none,offrecomp_keep,$AUTO,$PEERS" --no-search --no-plots --quiet --warmup 1 \
    --repeats "$REPEATS" --max-seconds "$M" --out "$WORK/long_seq_$S"
  judge "long_seq_$S"
  headroom "$S"
done
fi

if want 4; then
log "4. offloading plans against their prediction at $SHORT tokens"
SHORT_MAXS=$(within "$SHORT_MAXS" 50)
step "long_seq_$SHORT" $((SHORT_MAXS + 45)) env OFFRECOMP_PROFILE="$WORK/profile_$SHORT.json" \
  "$PY" -m benchmarks.long_seq "${MODEL[@]}" --seq "$SHORT" \
  --strategies "none,offrecomp_keep,$AUTO" --no-search --no-plots --quiet --warmup 1 \
  --repeats "$REPEATS" --max-seconds "$SHORT_MAXS" --out "$WORK/long_seq_$SHORT"
judge "long_seq_$SHORT"
headroom "$SHORT"
fi

if want 5; then
log "5. each replay of a plan without offloading against its prediction, op by op, at $CHECK tokens"
step "replay_check_$CHECK" 75 "$PY" benchmarks/replay_check.py "${REPLAY_CHECK[@]}" --seq "$CHECK" \
  --budget-fraction 0.5 --out "$WORK/replay_check_$CHECK.json"
fi

log "done"
ls -la "$WORK" | tee -a "$OUT/suite.log"
