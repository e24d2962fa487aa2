"""Cause check (probe, monkeypatch in this process only): replays with autocast's weight
cache left on hold what torch.utils.checkpoint holds. Runs ../repro_autocast_replay_casts.py
with offrecomp.replay.autocast_contexts forced to cache=True.

Run: cd REPO && OMP_NUM_THREADS=1 .venv/bin/python docs/results/cpu-2026-12-05zd/probe/p_autocast_cache_on.py
"""
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import offrecomp.replay as R  # noqa: E402

orig = R.autocast_contexts
R.autocast_contexts = lambda state, cache=True: orig(state, cache=True)
sys.argv = ["x"]
try:
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "repro_autocast_replay_casts.py"), run_name="__main__")
except SystemExit as e:
    print("exit", e.code)
