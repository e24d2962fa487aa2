"""Each script in examples/ runs to the end in a tiny configuration and prints the
runtime's report (their defaults, about a minute each on a 2-core CPU, are shown in
docs/integrations.md)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "32", "--batch", "2"]

EXAMPLES = {
    "nanogpt.py": ([], ["--steps", "4"]),
    "hf_trainer.py": (["transformers", "accelerate"], ["--steps", "3", "--gradient-checkpointing"]),
    "lightning_gpt.py": (["lightning"], ["--steps", "4"]),
}


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs(script: str, warm_python: str) -> None:
    needs, flags = EXAMPLES[script]
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{script} needs {', '.join(missing)} (optional extras: pip install -e '.[{','.join(missing)}]')")
    # this checkout's offrecomp, whatever the environment has installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("OMP_NUM_THREADS", "1")
    out = subprocess.run(
        [warm_python, str(ROOT / "examples" / script), *TINY, *flags],  # as `python script.py`
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "peak act" in out.stdout and "planned" in out.stdout, out.stdout[-3000:]
    if script == "hf_trainer.py":
        assert "turned off the model's own activation checkpointing" in out.stderr
        assert "'offrecomp/peak_activation_bytes'" in out.stdout  # the Trainer's logs
