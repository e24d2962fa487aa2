#!/usr/bin/env bash
# Long-context evidence on one GPU, about 8-9 minutes on one H200: each long_seq step stops
# starting new work at its --max-seconds (the peers are listed most important first) and
# runs under a timeout 50 s longer; the others have their own timeouts.
#   0. environment; torchtune and torchao installed from a folder of wheels (WHEELS, else
#      shared/wheels/, wheels/ or ../wheels, made by scripts/fetch_wheels.sh);
#      optional_packages.txt says what could not be installed and why;
#   1. `python -m offrecomp warmup` (the planner's numba kernels);
#   2. compile_budget compiled once, with dynamic shapes and the position table every
#      later step uses, so later steps load it from Inductor's on-disk cache
#      (compile_warm/: its one timed step follows the cold compile);
#   3. python -m benchmarks.long_seq at the gpu-1.3b preset, 16K then 32K tokens, every
#      peer: none, ckpt_block, ckpt_sqrt, sac_matmul, save_on_cpu, compile_budget,
#      torchtune_offload, offrecomp keep / recompute / auto@50% / auto@25%;
#   4. 64K tokens for the strategies that may fit (one that does not is listed as oom);
#   5. the longest sequence under a step-memory budget of 32 GiB, then 64 GiB, for
#      ckpt_block, sac_matmul, torchtune_offload, compile_budget and offrecomp auto with
#      the same budget (offrecomp_auto@budget; NOTE [Step budget for auto] in
#      benchmarks/long_seq/strategies.py), none as the base;
#   6. benchmarks/profile_step.py: one planned auto step that offloads, profiled (CPU and
#      CUDA activities), summarised in profile_step.json.
# $OUT (default ./device_long_out) gets suite.log (what each step printed and its exit
# status) and results.tgz (every raw file), both brought up to date after every step, so
# a call stopped early still returns what finished; and profile_trace.json.gz, the
# profiler's Chrome trace of step 6 (kept out of results.tgz, which it would swell).
#
# DRY_RUN=1 (or --dry-run) runs the same steps on the CPU with the cpu-tiny preset at
# tiny sizes, the eager compile backend (Dynamo traces, nothing is compiled), one budget
# in MiB, two peers at the first length and at the longest, and compile_budget left out
# at the second length (steps 2 and 5 compile it), to check the script anywhere; every
# step's timeout is doubled.
# Usage: OUT=/some/dir bash benchmarks/device_long.sh [--dry-run]
set -uo pipefail
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
OUT=${OUT:-device_long_out}
source "$(dirname "$0")/device_lib.sh"

# Peers in order of importance: when --max-seconds stops a run, the last ones lose out.
ALL_PEERS=none,ckpt_block,offrecomp_auto@25%,offrecomp_auto@50%,compile_budget,torchtune_offload
ALL_PEERS+=,sac_matmul,ckpt_sqrt,offrecomp_recompute,offrecomp_keep,save_on_cpu
LONGEST_PEERS=ckpt_block,offrecomp_auto@25%,offrecomp_recompute,compile_budget,torchtune_offload
LONGEST_PEERS+=,sac_matmul,ckpt_sqrt,save_on_cpu
SEARCH_PEERS=ckpt_block,offrecomp_auto@budget,compile_budget,torchtune_offload,sac_matmul
# compile_budget compiles one dynamic graph (--compile-dynamic) for a model whose position
# table is the same in every step (--max-seq), so step 2's compile serves every later step
# from Inductor's on-disk cache.
if [ "$DRY_RUN" = 1 ]; then
  MODEL=(--preset cpu-tiny --device cpu --layers 2 --hidden 32 --heads 2 --batch 1 --max-seq 4096)
  SEQ1=64 SEQ2=128 LONGEST=256 BUDGETS="6MiB"
  SEQ1_PEERS=none,offrecomp_auto@25%  # every peer runs at SEQ2: the script is what is checked
  SEQ2_PEERS=${ALL_PEERS/,compile_budget/}  # compiled in steps 2 and 5 already (no disk cache here)
  LONGEST_PEERS=ckpt_block,offrecomp_auto@25%
  SEARCH=(--search-start 128 --search-max 256 --search-quantum 128)  # one probe fits, one does not
  COMPILE=(--with-compile --compile-dynamic --compile-backend eager)  # traced by Dynamo, not partitioned
  PROFILE=(--preset cpu-tiny --device cpu --layers 2 --hidden 32 --heads 2 --batch 1 --seq 64)
  REPEATS=1
else
  MODEL=(--preset gpu-1.3b --device cuda --max-seq 131072)
  SEQ1=16384 SEQ2=32768 LONGEST=65536 BUDGETS="32GiB 64GiB"
  SEARCH=(--search-start 16384 --search-max 131072 --search-quantum 2048)
  COMPILE=(--with-compile --compile-dynamic)
  PROFILE=(--preset gpu-1.3b --device cuda --seq 16384)
  REPEATS=2
fi
# long_seq stops starting new work after --max-seconds; the step's timeout is that plus
# the longest single visit it may be in the middle of (a 64K step is ~5 s on an H200).
# lseq NAME MAX_SECONDS ARGS...: one long_seq run into $WORK/NAME.
# TIME_SCALE=N multiplies every --max-seconds by N (an integer), for a machine held longer.
lseq() {
  local name=$1 max=$(($2 * ${TIME_SCALE:-1}))
  shift 2
  step "$name" $((max + 50)) "$PY" -m benchmarks.long_seq "${MODEL[@]}" "${COMPILE[@]}" \
    --max-seconds "$max" --quiet --out "$WORK/$name" "$@"
}

log "environment (dry run: $DRY_RUN)"
environment

log "0. torchtune and torchao from a folder of wheels"
# The GPU machine reaches no registry: install from WHEELS (scripts/fetch_wheels.sh), with
# torch pinned to the installed build. nodeps.txt lists the packages that declare torch.
optional() {
  local status="$WORK/optional_packages.txt" wheels="${WHEELS:-}"
  if "$PY" -c "import torchtune, torchao; from torchtune.training import OffloadActivations" 2>/dev/null; then
    echo "torchtune and torchao: already installed" > "$status"
    return
  fi
  if [ -z "$wheels" ]; then
    for d in shared/wheels wheels ../wheels; do [ -d "$d" ] && wheels=$d && break; done
  fi
  if [ -z "$wheels" ] || [ ! -d "$wheels" ]; then
    echo "torchtune and torchao: NOT installed: no wheels folder (WHEELS, shared/wheels/, wheels/; see scripts/fetch_wheels.sh); torchtune_offload is n/a" > "$status"
    return
  fi
  "$PY" -c "import torch; print('torch==' + torch.__version__)" > "$WORK/torch_pin.txt"
  local deps=() nodeps=()
  [ -f "$wheels/deps.txt" ] && mapfile -t deps < "$wheels/deps.txt"
  [ -f "$wheels/nodeps.txt" ] && mapfile -t nodeps < "$wheels/nodeps.txt"
  [ ${#nodeps[@]} = 0 ] && nodeps=(torchtune "torchao<0.12" torchdata)
  {
    [ ${#deps[@]} = 0 ] || timeout 120 "$PY" -m pip install --no-index --find-links "$wheels" \
      -c "$WORK/torch_pin.txt" "${deps[@]}"
    timeout 60 "$PY" -m pip install --no-index --find-links "$wheels" --no-deps "${nodeps[@]}"
  } > "$WORK/pip_install.log" 2>&1
  if "$PY" -c "import torchtune, torchao; from torchtune.training import OffloadActivations" >> "$WORK/pip_install.log" 2>&1; then
    "$PY" -c "import torchtune, torchao; print('torchtune', torchtune.__version__, 'and torchao', torchao.__version__, 'installed from $wheels')" > "$status" 2>&1
  else
    { echo "torchtune and torchao: NOT installed from $wheels (torchtune_offload is n/a); last lines of pip_install.log:"; tail -n 5 "$WORK/pip_install.log"; } > "$status"
  fi
}
optional
tee -a "$OUT/suite.log" < "$WORK/optional_packages.txt"
"$PY" -m pip list 2>/dev/null | grep -iE '^(torch|torchtune|torchao|torchdata|numba|numpy|matplotlib) ' >> "$WORK/env.txt"
pack

log "1. the planner's kernels (numba)"
step warmup 90 "$PY" -m offrecomp warmup

log "2. compile_budget compiled once (later steps find Inductor's cache warm)"
lseq compile_warm 130 --seq "$SEQ1" --strategies compile_budget --no-search --warmup 0 --repeats 1 \
  --no-plots

log "3. every peer at $SEQ1 tokens"
lseq long_seq_$SEQ1 60 --seq "$SEQ1" --strategies "${SEQ1_PEERS:-$ALL_PEERS}" --no-search --warmup 1 \
  --repeats "$REPEATS"

log "3. every peer at $SEQ2 tokens"
lseq long_seq_$SEQ2 100 --seq "$SEQ2" --strategies "${SEQ2_PEERS:-$ALL_PEERS}" --no-search --warmup 1 \
  --repeats "$REPEATS"

log "4. at $LONGEST tokens, the strategies that may fit (oom where one does not)"
lseq long_seq_$LONGEST 45 --seq "$LONGEST" --strategies "$LONGEST_PEERS" --no-search --warmup 0 --repeats 1

for B in $BUDGETS; do
  log "5. longest sequence with step peak <= $B"
  lseq "search_$B" 40 --no-compare --mem-budget "$B" --strategies "$SEARCH_PEERS" "${SEARCH[@]}"
done

log "6. one planned auto step that offloads, profiled"
step profile_step 100 "$PY" benchmarks/profile_step.py "${PROFILE[@]}" --budget-fraction 0.25 \
  --out "$WORK/profile_step.json" --trace "$OUT/profile_trace.json.gz"

log "done"
ls -la "$WORK" | tee -a "$OUT/suite.log"
