# Shared by the device scripts (sourced, not run): where results go and how a step runs.
# The caller sets OUT (a folder; made here), may set DRY_RUN=1 and PYTHON, and gets:
#   WORK   a fresh folder for raw files, packed into $OUT/results.tgz;
#   PY     the interpreter;
#   log    a timestamped line on the screen and in $OUT/suite.log;
#   pack   $OUT/results.tgz brought up to date (a call stopped early keeps what finished);
#   environment  the GPU, Python, torch and commit into $WORK/env.txt and suite.log;
#   left_s  the seconds left of DEVICE_BUDGET_S (below);
#   within SECONDS SLACK  SECONDS, or less where the budget left less SLACK is less (1 at least);
#   step NAME SECONDS CMD...  CMD under `timeout` (doubled in a dry run, which checks the
#          script on a CPU that may be shared, not how fast anything is), its output in
#          $WORK/NAME.log, its tail and exit status in suite.log, then pack. A step gets
#          at most what is left of DEVICE_BUDGET_S, the seconds the whole script may take
#          (a whole number, else exit 2; default 570, under the device tool's 590 s limit;
#          3600 in a dry run), and one that would get under 15 s is skipped and says so:
#          the script then ends inside its caller's limit with every step that ran whole
#          packed.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DRY_RUN=${DRY_RUN:-0}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
START_S=$(date +%s)
[ "$DRY_RUN" = 1 ] && DEVICE_BUDGET_S=${DEVICE_BUDGET_S:-3600}
DEVICE_BUDGET_S=${DEVICE_BUDGET_S:-570}
case $DEVICE_BUDGET_S in
  ''|*[!0-9]*) echo "DEVICE_BUDGET_S=$DEVICE_BUDGET_S is invalid; accepted: a whole number of seconds >= 0" >&2; exit 2 ;;
esac
left_s() { echo $((START_S + DEVICE_BUDGET_S - $(date +%s))); }
within() { local cap=$(($(left_s) - $2)); [ "$cap" -lt 1 ] && cap=1; [ "$cap" -lt "$1" ] && echo "$cap" || echo "$1"; }
log() { echo "== $(date +%H:%M:%S) $*" | tee -a "$OUT/suite.log"; }
pack() { tar czf "$OUT/results.tgz.part" -C "$WORK" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"; }
step() {
  local name=$1 limit=$2
  shift 2
  [ "$DRY_RUN" = 1 ] && limit=$((limit * 2))
  local left
  left=$(left_s)
  if [ "$left" -lt 15 ]; then
    echo "   [$name: skipped, $left s of DEVICE_BUDGET_S=$DEVICE_BUDGET_S left]" | tee -a "$OUT/suite.log"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  grep -v "^STAGE:\|profiler_st\|^USDT:" "$WORK/$name.log" | tail -n 45 | tee -a "$OUT/suite.log"
  echo "   [$name: exit $rc$([ $rc = 124 ] && echo ', timed out')]" | tee -a "$OUT/suite.log"
  pack
}
environment() {
  {
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    "$PY" -c "import torch, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda); print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
    git rev-parse HEAD 2>/dev/null
  } > "$WORK/env.txt" 2>&1
  tee -a "$OUT/suite.log" < "$WORK/env.txt"
}
