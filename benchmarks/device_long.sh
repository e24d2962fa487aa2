#!/usr/bin/env bash
# Long-context evidence on one GPU, about 8 minutes on one H200 (each step has its own
# timeout, and the long_seq steps stop starting new work at --max-seconds):
#   0. environment; torchtune and torchao installed from a folder of wheels (WHEELS, else
#      shared/wheels/ or wheels/ beside the working tree, made by scripts/fetch_wheels.sh);
#      optional_packages.txt says what could not be installed and why;
#   1. `python -m offrecomp warmup` (the planner's numba kernels);
#   2. compile_budget's graphs compiled once at 16K and 32K tokens, so that step 3 times
#      warm compiles (Inductor's on-disk cache); the cold compile is in compile_warm/;
#   3. python -m benchmarks.long_seq at the gpu-1.3b preset, 16K and 32K tokens, every
#      peer: none, ckpt_block, ckpt_sqrt, sac_matmul, save_on_cpu, compile_budget,
#      torchtune_offload, offrecomp keep / recompute / auto@50% / auto@25%;
#   4. the same at 64K tokens (a strategy that does not fit is listed as oom);
#   5. the longest sequence under a step-memory budget of 32 GiB, then 64 GiB, for
#      ckpt_block, sac_matmul, torchtune_offload, compile_budget and offrecomp auto with
#      the same budget (offrecomp_auto@budget; NOTE [Step budget for auto] in
#      benchmarks/long_seq/strategies.py);
#   6. benchmarks/profile_step.py: one planned auto step that offloads, profiled (CPU and
#      CUDA activities), summarised in profile_step.json, its trace in
#      profile_trace.json.gz.
# $OUT (default ./device_long_out) gets suite.log (what each step printed) and
# results.tgz (every raw file), both brought up to date after every step, so a call
# stopped early still returns what finished.
#
# DRY_RUN=1 (or --dry-run) runs the same steps on the CPU with the cpu-tiny preset at
# tiny sizes, the fast compile backend and budgets in MiB, to check the script anywhere.
# Usage: OUT=/some/dir bash benchmarks/device_long.sh [--dry-run]
set -uo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
DRY_RUN=${DRY_RUN:-0}
OUT=${OUT:-device_long_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
log() { echo "== $(date +%H:%M:%S) $*" | tee -a "$OUT/suite.log"; }
pack() { tar czf "$OUT/results.tgz.part" -C "$WORK" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"; }
# step NAME SECONDS CMD...: run CMD under `timeout`, its output in $WORK/NAME.log, its
# tail and exit status in suite.log, then refresh results.tgz.
step() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  grep -v "^STAGE:\|profiler_st\|^USDT:" "$WORK/$name.log" | tail -n 45 | tee -a "$OUT/suite.log"
  echo "   [$name: exit $rc$([ $rc = 124 ] && echo ', timed out')]" | tee -a "$OUT/suite.log"
  pack
}

ALL_PEERS=none,ckpt_block,ckpt_sqrt,sac_matmul,save_on_cpu,compile_budget,torchtune_offload
ALL_PEERS+=,offrecomp_keep,offrecomp_recompute,offrecomp_auto@50%,offrecomp_auto@25%
SEARCH_PEERS=ckpt_block,sac_matmul,torchtune_offload,compile_budget,offrecomp_auto@budget
if [ "$DRY_RUN" = 1 ]; then
  SIZE=(--preset cpu-tiny --device cpu --layers 2 --hidden 32 --heads 2 --batch 1)
  SEQS=64,128 LONGEST=256 BUDGETS="3MiB 6MiB"
  SEARCH=(--search-start 64 --search-max 256 --search-quantum 64)
  TIMED=(--warmup 0 --repeats 1)
  COMPILE=(--with-compile --compile-backend aot_eager_decomp_partition)
  PROFILE=(--preset cpu-tiny --device cpu --layers 2 --hidden 32 --heads 2 --batch 1 --seq 64)
  MAXS=(60 60 60)  # --max-seconds of the compare, 64K and search steps
else
  SIZE=(--preset gpu-1.3b --device cuda)
  SEQS=16384,32768 LONGEST=65536 BUDGETS="32GiB 64GiB"
  SEARCH=(--search-start 16384 --search-max 131072 --search-quantum 2048)
  TIMED=(--warmup 1 --repeats 2)
  COMPILE=(--with-compile)
  PROFILE=(--preset gpu-1.3b --device cuda --seq 16384)
  MAXS=(150 60 55)
fi

log "environment (dry run: $DRY_RUN)"
{
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$PY" -c "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda); print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  git rev-parse HEAD 2>/dev/null
} > "$WORK/env.txt" 2>&1
tee -a "$OUT/suite.log" < "$WORK/env.txt"

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
  local deps nodeps
  deps=$(cat "$wheels/deps.txt" 2>/dev/null || echo "datasets huggingface_hub safetensors kagglehub sentencepiece tiktoken blobfile tokenizers omegaconf Pillow psutil tqdm numpy")
  nodeps=$(cat "$wheels/nodeps.txt" 2>/dev/null || echo "torchtune torchao<0.12 torchdata")
  # shellcheck disable=SC2086
  timeout 120 "$PY" -m pip install --no-index --find-links "$wheels" -c "$WORK/torch_pin.txt" $deps > "$WORK/pip_install.log" 2>&1
  # shellcheck disable=SC2086
  timeout 60 "$PY" -m pip install --no-index --find-links "$wheels" --no-deps $nodeps >> "$WORK/pip_install.log" 2>&1
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

log "2. compile_budget compiled once at $SEQS tokens (later steps find Inductor's cache warm)"
step compile_warm 150 "$PY" -m benchmarks.long_seq "${SIZE[@]}" --seq "$SEQS" --strategies compile_budget \
  "${COMPILE[@]}" --no-search --warmup 0 --repeats 1 --no-plots --quiet --out "$WORK/compile_warm"

log "3. every peer at $SEQS tokens"
step compare 170 "$PY" -m benchmarks.long_seq "${SIZE[@]}" --seq "$SEQS" --strategies "$ALL_PEERS" \
  "${COMPILE[@]}" --no-search "${TIMED[@]}" --max-seconds "${MAXS[0]}" --quiet --out "$WORK/long_seq"

log "4. every peer at $LONGEST tokens (oom where a strategy does not fit)"
step compare_longest 80 "$PY" -m benchmarks.long_seq "${SIZE[@]}" --seq "$LONGEST" --strategies "$ALL_PEERS" \
  "${COMPILE[@]}" --no-search --warmup 0 --repeats 1 --max-seconds "${MAXS[1]}" --quiet \
  --out "$WORK/long_seq_longest"

for B in $BUDGETS; do
  log "5. longest sequence with step peak <= $B"
  step "search_$B" 75 "$PY" -m benchmarks.long_seq "${SIZE[@]}" --no-compare --mem-budget "$B" \
    --strategies "$SEARCH_PEERS" "${COMPILE[@]}" "${SEARCH[@]}" --max-seconds "${MAXS[2]}" --quiet \
    --out "$WORK/search_$B"
done

log "6. one planned auto step that offloads, profiled"
step profile_step 90 "$PY" benchmarks/profile_step.py "${PROFILE[@]}" --budget-fraction 0.25 \
  --out "$WORK/profile_step.json" --trace "$WORK/profile_trace.json.gz"

log "done"
ls -la "$WORK" | tee -a "$OUT/suite.log"
