"""Import hygiene: no torch, works with a read-only install, public names frozen."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import scheduler

REPO = Path(__file__).resolve().parents[2]


def run_python(
    code: str, *, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_importing_the_planner_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import scheduler, scheduler.cli, scheduler.cost_model, scheduler.simulate, scheduler.solver, scheduler.whatif\n"
        "p = scheduler.gpt_profile(layers=2, hidden=256, heads=4, seq=128, batch=1, device_tflops=100, d2h_gbps=10, h2d_gbps=10)\n"
        "scheduler.solve(p, budget_bytes=p.activation_bytes // 2)\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    res = run_python(code, cwd=REPO)
    assert res.returncode == 0, res.stdout + res.stderr


def test_works_when_no_numba_cache_location_is_usable(tmp_path: Path) -> None:
    # A copy of the package whose __pycache__ is a file, and numba/user cache dirs that
    # sit under a file: no cache location can be created (not even by root), so numba
    # refuses cache=True and the planner must fall back to uncached kernels.
    site = tmp_path / "site"
    shutil.copytree(
        REPO / "scheduler", site / "scheduler", ignore=shutil.ignore_patterns("__pycache__")
    )
    (site / "scheduler" / "__pycache__").write_text("not a directory")
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(blocker / "numba"),
        "XDG_CACHE_HOME": str(blocker / "xdg"),
        "HOME": str(blocker),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    code = (
        "import sys\n"
        "import scheduler\n"
        "from numba.core.caching import NullCache\n"
        f"assert scheduler.__file__.startswith({str(site)!r}), scheduler.__file__\n"
        "kernel = sys.modules['scheduler.timeline'].run_timeline\n"
        "assert isinstance(kernel._cache, NullCache), type(kernel._cache)\n"
        "p = scheduler.gpt_profile(layers=2, hidden=256, heads=4, seq=128, batch=1, device_tflops=100, d2h_gbps=10, h2d_gbps=10)\n"
        "t = scheduler.simulate(p, scheduler.Plan())\n"  # compiles the simulator kernels, uncached
        "assert t.peak_bytes == p.activation_bytes and t.step_seconds > 0\n"
    )
    res = run_python(code, cwd=site, env=env)
    assert res.returncode == 0, res.stderr[-3000:]


def test_public_names_are_frozen() -> None:
    assert sorted(scheduler.__all__) == sorted(
        [
            "ROOT",
            "Placement",
            "Plan",
            "StorageKey",
            "OpRecord",
            "Profile",
            "RegionRecord",
            "StorageRecord",
            "CostModel",
            "Prediction",
            "predict",
            "replay_seconds",
            "Interval",
            "Timeline",
            "lower_bound",
            "simulate",
            "InfeasibleBudgetError",
            "exhaustive_solve",
            "solve",
            "format_bytes",
            "gpt_profile",
            "parse_bytes",
        ]
    )
    for name in scheduler.__all__:
        assert getattr(scheduler, name) is not None
    assert callable(scheduler.simulate) and callable(scheduler.solve)
