"""What auto plans on the conv+ReLU stack of books_probe.py under a budget between what
keep holds (18.19 MiB) and what keep booked when calls kept whole counted shared
storages twice (32.19 MiB).

    OMP_NUM_THREADS=1 python docs/results/cpu-2026-12-07f/plan_probe.py [BUDGET_MIB]

Prints, for the last planned steps, the bytes the plan drops (recomputed), the booked and
predicted peaks, and the step time against the same steps under keep, interleaved.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from books_probe import ConvRelu, Stack

import offrecomp

MIB = 2**20


def main() -> None:
    budget = float(sys.argv[1]) if len(sys.argv) > 1 else 24.0
    x = torch.randn(4, 3, 64, 64)
    runs = {}
    for mode in ("keep", "auto"):
        torch.manual_seed(0)
        model = Stack(ConvRelu)
        kw = {"budget": int(budget * MIB)} if mode == "auto" else {}
        runs[mode] = (model, offrecomp.runtime(model, mode=mode, **kw))
    for _ in range(12):  # interleaved: one step of each in turn
        for model, rt in runs.values():
            with rt:
                model(x).backward()
    keep = [s.step_seconds for s in runs["keep"][1].report().steps[-6:]]
    steps = runs["auto"][1].report().steps[-6:]
    last = steps[-1]
    print(f"torch {torch.__version__}; budget {budget:.1f} MiB; phases {[s.phase for s in steps]}")
    print(
        f"auto: recomputed {last.recomputed_bytes / MIB:.2f} MiB, booked peak {last.peak_activation_bytes / MIB:.2f} MiB, "
        f"predicted {(last.predicted_peak_bytes or 0) / MIB:.2f} MiB; step median "
        f"{statistics.median(s.step_seconds for s in steps) * 1e3:.1f} ms against keep's {statistics.median(keep) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
