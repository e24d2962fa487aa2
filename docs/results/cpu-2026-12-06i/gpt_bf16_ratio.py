"""The bf16 GPT allocator check of tests/offrecomp/test_replay_transients.py (4 blocks, h=64,
budget 0.3 of a plain step's saves), once: the allocator's peak less a plain step's non-saved
bytes, the books and the prediction, over the budget. PYTHONPATH=. python THIS"""
import sys, torch
from tests import models
from tests.offrecomp.test_replay_transients import _peaks, _tokens
torch.manual_seed(0)
model = models.GPT(layers=4, h=64, heads=4, p=0.1)
saved, held, step = _peaks(model, _tokens(0), 0.3, bf16=True)
budget = int(0.3 * saved)
print(f"RATIO measured/budget {held / budget:.3f} books/budget {step.peak_activation_bytes / budget:.3f} "
      f"predicted/budget {step.predicted_peak_bytes / budget:.3f} replays {step.replays}", flush=True)
