"""The regions automatic discovery finds in every model of this folder's sweeps, by class.

    PYTHONPATH=DIR python docs/results/cpu-2026-12-05b/regions_list.py ROOT > regions.txt

ROOT is a checkout of offrecomp (``git worktree add /tmp/old REV`` for another tree);
DIR as the sweeps take it. ``regions_before.txt`` is the tree before NOTE [One-op
modules] (1a4c731), ``regions_after.txt`` this folder's tree.
"""

import logging
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, str(Path(__file__).resolve().parent))

import offrecomp.regions  # noqa: E402  (from ROOT, before the sweeps put this checkout first)

# isort: split
import community_sweep  # noqa: E402
import vision_audio_sweep  # noqa: E402

models = {**community_sweep.Z, **vision_audio_sweep.Z}
for name, (factory, _) in models.items():
    regions = offrecomp.regions.discover_regions(factory(), None)
    classes: dict[str, int] = {}
    for r in regions:
        classes[type(r.module).__name__] = classes.get(type(r.module).__name__, 0) + 1
    print(f"{name:18s} {len(regions):3d}  " + ", ".join(f"{k} x{v}" for k, v in classes.items()))
