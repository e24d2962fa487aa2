#!/bin/bash
# Reruns the committed sweeps listed in README.md, one python process at a time, each
# under 600 s, writing every output to OUT (default /tmp/zh_out).
#   cd REPO && PKGS_N=DIR_N PKGS_S=DIR_S bash docs/results/cpu-2026-12-05zh/rerun.sh [OUT]
# DIR_N: timm 1.0.31 + torchvision 0.28.0 (../cpu-2026-12-05n); DIR_S: snntorch, norse,
# ncps, xlstm (../cpu-2026-12-05s). The HF sweeps read the screen cached by
# hf_auto_sweep.py (/tmp/sweep5f) and run in two halves of its model list.
cd "$(dirname "${BASH_SOURCE[0]}")/../../.." || exit 1
O=${1:-/tmp/zh_out}; mkdir -p $O/zd
PY=.venv/bin/python; R=docs/results
export OMP_NUM_THREADS=1
step() { local n=$1; shift; local t0=$(date +%s); timeout 600 "$@" > $O/$n.txt 2>&1; echo "$n rc=$? $(( $(date +%s) - t0 ))s" >> $O/_log.txt; }
names() { $PY -c "import json,sys; r=json.load(open('/tmp/sweep5f/$1.json'))['result']; ok=[m for m,w in r.items() if w=='']; h=len(ok)//2; print(','.join(ok[:h] if sys.argv[1]=='1' else ok[h:]))" $2; }
step hf_bf16_1 $PY -u $R/cpu-2026-12-05f/hf_auto_sweep.py $(names screen_bf16 1) --bf16
step hf_bf16_2 $PY -u $R/cpu-2026-12-05f/hf_auto_sweep.py $(names screen_bf16 2) --bf16
step timm_bf16 env PYTHONPATH=$PKGS_N $PY -u $R/cpu-2026-12-05/timm_sweep.py all --bf16
step hf_fp32_1 $PY -u $R/cpu-2026-12-05f/hf_auto_sweep.py $(names screen 1)
step hf_fp32_2 $PY -u $R/cpu-2026-12-05f/hf_auto_sweep.py $(names screen 2)
step rnn $PY -u $R/cpu-2026-12-05n/rnn_sweep.py all
step sweep_k $PY -u $R/cpu-2026-12-05k/sweep_k.py all
for s in sweep_p sweep_p2 sweep_p3; do step $s $PY -u $R/cpu-2026-12-05p/$s.py all; done
for s in sweep_p sweep_p2 sweep_p3; do step verify_$s env OFFRECOMP_VERIFY=1 $PY -u $R/cpu-2026-12-05p/$s.py all recompute,auto_serve; done
for c in a b c d; do step hooks_$c $PY -u $R/cpu-2026-12-05q/cases_$c.py all; done
step moe_w $PY -u $R/cpu-2026-12-05w/sweep_w.py all
step snn_s env PYTHONPATH=$PKGS_S $PY -u $R/cpu-2026-12-05s/sweep_s.py all
step loops_s env PYTHONPATH=$PKGS_S $PY -u $R/cpu-2026-12-05s/loops_s.py
step shapes_r $PY -u $R/cpu-2026-12-05r/sweep_r.py all
python3 $R/cpu-2026-12-05r/analyze.py $O/shapes_r.txt > $O/shapes_r_books.txt
for c in gpt gpt_nodrop gpt_deep mlp_stack mlp_small vit resnet_bn cnn_bn unet lstm_stack gru_stack encdec moe tied_lm \
         big_root accum2 bf16 twice kw_tuple inplace densenet convnext hf_gpt2 hf_llama hf_bert hf_t5 narrow_out ctx_attr \
         stages deep_sup dyn_len gpt_h32 emul_offload bf16_gru accum2_bf16_llama cell_loop bf16_cell_loop ema_buffers; do
  SWEEP_OUT=$O/zd step zd_$c $PY -u $R/cpu-2026-12-05zd/sweep.py $c
done
$PY $R/cpu-2026-12-05zd/summarize.py $O/zd > $O/zd_summary.txt
bash $R/cpu-2026-12-05zc/run_all.sh _zh > $O/zc_run_all.txt 2>&1   # writes out_*_zh.txt, summary_zh.txt into that folder
