"""Regression (timm_sweep --bf16): timm fastvit_t8 under CPU bf16 autocast, auto with a
tight budget (auto_tight, and auto_serve: replay_op_us=0) -> ReplayDivergedError in
'm.m.stages.3' "the recorded forward ran aten._to_copy.default, the replay ran
aten.convolution.default". Same class as repro_hf_bf16_auto_serve.py (bisected to 20db626).
Exit 1 while it fails.
    cd REPO && PYTHONPATH=DIR OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zf/repro_timm_fastvit_bf16.py   # timm 1.0.31 in DIR"""
import sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docs/results/cpu-2026-12-05")); sys.path.insert(0, str(ROOT))
import timm_sweep as T  # installs its torchvision stand-in before timm
import torch
from tests.helpers import check_variant

bad = 0
for v in ("auto_tight", "auto_serve"):
    torch.manual_seed(0)
    model = T.BF16Autocast(T.Cls(T.timm.create_model("fastvit_t8", num_classes=3))).train()
    try:
        check_variant(model, T.img(64), v, steps=4)
        print("PASS", v)
    except Exception as e:
        bad += 1
        print("FAIL", v, type(e).__name__, str(e)[:200])
sys.exit(1 if bad else 0)
