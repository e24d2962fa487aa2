#!/bin/bash
# Runs every sweep in chunks (each one python process under 300 s), one at a time.
#   cd REPO && bash docs/results/cpu-2026-12-05zc/run_all.sh           # out_*.txt, summary.txt
#   cd REPO && bash docs/results/cpu-2026-12-05zc/run_all.sh _after    # out_*_after.txt, summary_after.txt
# The outputs go to this folder; scratch files (Trainer output dirs, checkpoints) to temporary directories.
cd "$(dirname "${BASH_SOURCE[0]}")/../../.." || exit 1
D=docs/results/cpu-2026-12-05zc
S=${1:-}
PY=.venv/bin/python
export OMP_NUM_THREADS=1
timeout 300 $PY -u $D/sweep_hf.py accum2 accum3_uneven max_grad_norm bf16_cpu grad_ckpt ckpt_reentrant compile_false eval_steps eval_on_start resume compute_loss label_smooth group_by_length > $D/out_hf_1$S.txt 2>&1; echo "hf_1 rc=$?"
timeout 300 $PY -u $D/sweep_hf.py llama_tied t5 seqcls cb_raises cb_raises_then_train train_twice two_trainers two_trainers_same_cb add_callback neftune model_init realistic auto_long > $D/out_hf_2$S.txt 2>&1; echo "hf_2 rc=$?"
timeout 300 $PY -u $D/sweep_lightning.py accum2 clip_norm clip_value bf16_mixed gan_manual val_every2 lr_sched resume_new_cb resume_same_cb refit_same_trainer eval_after_fit validate_first > $D/out_lightning_1$S.txt 2>&1; echo "l_1 rc=$?"
timeout 300 $PY -u $D/sweep_lightning.py dict_output limit_train early_stop overfit hf_gpt2 cb_raises swa ckpt_callback lr_find realistic > $D/out_lightning_2$S.txt 2>&1; echo "l_2 rc=$?"
timeout 300 $PY -u $D/sweep_accelerate.py > $D/out_accelerate$S.txt 2>&1; echo "acc rc=$?"
(cd $D && grep -h -A40 "^SUMMARY" out_hf_1$S.txt out_hf_2$S.txt out_lightning_1$S.txt out_lightning_2$S.txt out_accelerate$S.txt | grep -v "^SUMMARY\|^real\|^user\|^sys\|^$" > summary$S.txt)
