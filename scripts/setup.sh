#!/usr/bin/env bash
# Creates .venv (if missing) and installs offrecomp with its dev and benchmark extras
# (and the transformers extra when it can be installed).
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
    "$VPY" -m pip install -q "torch>=2.5,<2.16"
  else
    echo "setup: no GPU, installing PyTorch's CPU build"
    # A local CPU wheel when the machine has one (pip find-links), else PyTorch's CPU index.
    "$VPY" -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || "$VPY" -m pip install -q "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi
"$VPY" -m pip install -q -e ".[dev,bench]"
# The Hugging Face model tests (tests/offrecomp/test_hf_models.py) need the optional
# transformers extra; without it (no network) they are skipped, not failed.
"$VPY" -m pip install -q -e ".[transformers]" >/dev/null 2>&1 \
  || echo "setup: transformers not installed; the Hugging Face model tests will be skipped"
"$VPY" -c "import torch, offrecomp, scheduler; print(f'setup: torch {torch.__version__}, offrecomp {offrecomp.__version__}, cuda {torch.cuda.is_available()}')"
