#!/usr/bin/env bash
# Creates .venv (if missing) and installs offrecomp with its dev and benchmark extras
# (and the transformers, accelerate and lightning extras when they can be installed).
# Without an NVIDIA GPU it installs PyTorch's CPU build, never the multi-GB CUDA one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found, installing PyTorch with CUDA"
    "$VPY" -m pip install -q "torch>=2.10,<2.16"
  else
    echo "setup: no GPU, installing PyTorch's CPU build"
    # A local CPU wheel when the machine has one (pip find-links), else PyTorch's CPU index.
    "$VPY" -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || "$VPY" -m pip install -q "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi
"$VPY" -m pip install -q -e ".[dev,bench]"
# The Hugging Face model tests (tests/offrecomp/test_hf_models.py) and the trainer
# integrations (tests/integrations/, examples/) need the optional framework extras; one
# that cannot be installed (no network, no wheel for this Python) has its tests skipped,
# not failed. The torchtune extra is left out: about twenty packages (datasets, pandas,
# pyarrow) for one snippet's test, which is skipped without it (docs/integrations.md).
for extra in transformers accelerate lightning; do
  "$VPY" -m pip install -q -e ".[$extra]" >/dev/null 2>&1 \
    || echo "setup: the $extra extra is not installed; the tests that need it will be skipped"
done
"$VPY" -c "import torch, offrecomp, scheduler; print(f'setup: torch {torch.__version__}, offrecomp {offrecomp.__version__}, cuda {torch.cuda.is_available()}')"
