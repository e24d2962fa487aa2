"""Shared test setup: the CUDA marker, deterministic seeds, a frozen heap, no leaked
runtimes, and a warm interpreter for the tests that run Python scripts."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# The property tests draw the same examples on every run (a CI run is never the one that
# happens on a new counterexample); HYPOTHESIS_PROFILE=explore draws new ones each run.
_PROFILES = {"default": True, "explore": False}  # name: derandomize
for _name, _fixed in _PROFILES.items():
    settings.register_profile(_name, derandomize=_fixed)
_profile = os.environ.get("HYPOTHESIS_PROFILE", "default")
if _profile not in _PROFILES:
    raise pytest.UsageError(f"HYPOTHESIS_PROFILE={_profile!r} is invalid; accepted: {', '.join(_PROFILES)}")
settings.load_profile(_profile)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The slow tests first: with several workers, the longest ones start at once instead of
    # finishing alone at the end of the run.
    items.sort(key=lambda item: "slow" not in item.keywords)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _frozen_heap() -> Iterator[None]:
    """What the session holds before a test (torch, transformers, earlier tests' objects)
    is frozen for the test (gc.freeze): a gc.collect() then walks the test's own objects,
    where a full collection of the session's heap takes 0.2-0.5 s (the long_seq harness
    collects before every timed window; the runtime's leak tests collect in loops). The
    test's own garbage is collected at its end, before the heap thaws: frozen again by
    the next test, cycles it left (holding tensors, CUDA memory) would never be."""
    gc.freeze()
    yield
    gc.collect()
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _reloads_unless_serving(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offload reloads every group outside the tests marked ``serve_held``: the emulated
    backend's copies start late, so a short test step would find every group's sources
    still held at its backward and serve them all (NOTE [Served groups] in
    offrecomp/transfer.py), and the reload path would go untested. ``SERVE_HELD=1``
    serves in every test."""
    if request.node.get_closest_marker("serve_held") is None and os.environ.get("SERVE_HELD") != "1":
        from offrecomp.offload import OffloadEngine

        monkeypatch.setattr(OffloadEngine, "serve_held", False)


@pytest.fixture(autouse=True)
def _no_active_runtime() -> None:
    """Every test starts and ends with no runtime entered and no hooks installed."""
    import importlib

    rtmod = importlib.import_module("offrecomp.context")

    assert rtmod._active is None
    yield
    leaked = rtmod._active
    rtmod._active = None
    assert leaked is None, "a test left an offrecomp runtime entered"


@pytest.fixture(scope="session")
def warm_python() -> Iterator[str]:
    """A ``python`` for the tests that run scripts in a process of their own (the device
    scripts' dry runs, the examples), backed by one server per test process that has
    torch and the other heavy imports loaded (tests/warm_python.py; its environment this
    process's, OMP_NUM_THREADS=1); WARM_PYTHON=0 gives the plain interpreter instead."""
    if os.environ.get("WARM_PYTHON") == "0":
        yield sys.executable
        return
    from tests import warm_python as warm

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
