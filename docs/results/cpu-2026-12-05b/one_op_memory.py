"""VGG-11-BN and AlexNet (torchvision, torch's layers in Sequentials alone) under keep and
recompute: regions found, the runtime's peak activation bytes, bytes recomputed, replays.

    PYTHONPATH=DIR python docs/results/cpu-2026-12-05b/one_op_memory.py ROOT

ROOT is a checkout of offrecomp; DIR as vision_audio_sweep.py takes it.
"""

import logging
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tv_stubs  # noqa: E402,F401  (before torchvision)

# isort: split
import torch  # noqa: E402
import torchvision  # noqa: E402

import offrecomp  # noqa: E402

for name, factory in [("vgg11_bn", torchvision.models.vgg11_bn), ("alexnet", torchvision.models.alexnet)]:
    for mode in ["keep", "recompute"]:
        torch.manual_seed(0)
        model = factory(num_classes=3).train()
        x = torch.randn(2, 3, 64, 64)
        with offrecomp.runtime(model, mode=mode, min_bytes=0) as rt:
            for _ in range(2):
                model(x).pow(2).mean().backward()
        s = rt.report().steps[-1]
        print(f"{name} {mode}: regions {len(rt.regions)}, peak {s.peak_activation_bytes} B, "
              f"recomputed {s.recomputed_bytes} B, replays {s.replays}")
