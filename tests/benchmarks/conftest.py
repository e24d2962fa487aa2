"""The warm interpreter the device scripts' dry runs call (tests/benchmarks/warm_python.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.benchmarks import warm_python as warm


@pytest.fixture(scope="session")
def warm_python() -> Iterator[str]:
    """A ``python`` for the dry runs' ``PYTHON``, backed by one server per test process
    that has torch and the other heavy imports loaded (its environment the dry runs',
    OMP_NUM_THREADS=1); WARM_PYTHON=0 gives the plain interpreter instead."""
    if os.environ.get("WARM_PYTHON") == "0":
        yield sys.executable
        return
    folder = Path(tempfile.mkdtemp(prefix="warm_py"))  # short: a socket path has ~100 bytes
    sock = str(folder / "s")
    server = subprocess.Popen(
        [sys.executable, "-I", warm.__file__, "serve", sock],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready", "the server did not start"
        yield warm.write_wrapper(str(folder / "python"), sock)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
