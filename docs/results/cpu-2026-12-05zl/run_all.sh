#!/bin/bash
# Runs every case x variant of soak.py, one process at a time, into out_<case>_<variant>.txt
# usage: /tmp/sweep_soak/run_all.sh [case ...]
cd /work/main
cases=${@:-fixed cycle8 rand30 evalint newsize fail20 recreate accum4 envreport}
for c in $cases; do
  case $c in
    cycle8|rand30) vs="plain2 recompute auto auto_tight" ;;
    *) vs="plain2 keep recompute offload auto auto_tight" ;;
  esac
  for v in $vs; do
    OMP_NUM_THREADS=1 timeout 300 .venv/bin/python /tmp/sweep_soak/soak.py $c $v > /tmp/sweep_soak/out_${c}_${v}.txt 2>&1
    echo "rc=$?" >> /tmp/sweep_soak/out_${c}_${v}.txt
    grep RESULT /tmp/sweep_soak/out_${c}_${v}.txt || echo "NO RESULT $c $v"
  done
done
