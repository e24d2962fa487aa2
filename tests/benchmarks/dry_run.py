"""The device scripts' CPU dry runs, as their tests run them (through the warm
interpreter of the ``warm_python`` fixture: tests/warm_python.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

needs_bash_and_tar = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar"
)


def dry_run(
    script: str, tmp_path: Path, timeout: float, *, python: str = sys.executable, **env: str
) -> tuple[Path, str]:
    """Run ``benchmarks/<script>`` with DRY_RUN=1, PYTHON=``python`` (and ``env``) from
    ``tmp_path``; check it exited 0 with no step timed out. Returns its OUT folder and its
    suite.log."""
    out = tmp_path / "out"
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / script)],
        cwd=tmp_path,
        env={**os.environ, "OUT": str(out), "PYTHON": python, "DRY_RUN": "1", "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=timeout,  # the script's own step limits come first (doubled in a dry run)
    )
    assert res.returncode == 0, res.stderr[-2000:]
    log = (out / "suite.log").read_text()
    assert "timed out" not in log, log[-3000:]
    return out, log


def archived(out: Path) -> dict[str, bytes]:
    """The files a dry run packed into ``out``/results.tgz, by their path in it (no ``./``)."""
    with tarfile.open(out / "results.tgz") as tar:
        return {
            m.name.removeprefix("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers() if m.isfile()
        }
