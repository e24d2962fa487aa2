#!/usr/bin/env bash
# Download the wheels of the optional long-context peers (torchtune's OffloadActivations
# and torchao, which torchtune imports) for a GPU machine that reaches no package
# registry. Run it where a registry is reachable; copy the folder beside the working
# tree as shared/wheels/ (or wheels/, or point WHEELS at it), where
# benchmarks/device_long.sh installs from it. Wheels are never committed.
#
# torchtune 0.6.1 imports only with torchao < 0.12. torch itself is never downloaded:
# the packages that declare a torch requirement (torchtune, torchao, torchdata) are
# fetched without dependencies and installed with --no-deps next to the machine's torch;
# their other dependencies are fetched with theirs. Two lists record which is which
# (nodeps.txt, deps.txt), and device_long.sh reads them.
#
# Usage: bash scripts/fetch_wheels.sh [DEST]        (default shared/wheels)
# Target interpreter and platform (default: the GPU machine's Python 3.12 on x86-64 Linux):
#   WHEELS_PYTHON_VERSION=3.12 WHEELS_PLATFORMS="manylinux_2_28_x86_64 manylinux2014_x86_64"
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-shared/wheels}
PY=${PYTHON:-python3}
PYVER=${WHEELS_PYTHON_VERSION:-3.12}
PLATFORMS=${WHEELS_PLATFORMS:-"manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64"}
mkdir -p "$DEST"

NODEPS=("torchtune==0.6.1" "torchao>=0.11,<0.12" "torchdata==0.11.0")
DEPS=(datasets "huggingface_hub[hf_transfer]" safetensors kagglehub sentencepiece tiktoken
      "blobfile>=2" tokenizers omegaconf "Pillow>=9.4.0" psutil tqdm numpy)
# Pure-Python sources without a wheel on the index, built here into py3-none-any wheels.
SDIST_ONLY=("antlr4-python3-runtime==4.9.3")

target=(--python-version "$PYVER" --only-binary=:all:)
for p in $PLATFORMS; do target+=(--platform "$p"); done

"$PY" -m pip wheel --no-deps -w "$DEST" "${SDIST_ONLY[@]}"
"$PY" -m pip download --no-deps -d "$DEST" "${target[@]}" "${NODEPS[@]}"
"$PY" -m pip download -d "$DEST" --find-links "$DEST" "${target[@]}" "${DEPS[@]}"
printf '%s\n' "${NODEPS[@]}" > "$DEST/nodeps.txt"
printf '%s\n' "${DEPS[@]}" > "$DEST/deps.txt"
if ls "$DEST"/torch-[0-9]*.whl >/dev/null 2>&1; then
  echo "fetch_wheels: a torch wheel was pulled in by a dependency; remove it" >&2
  exit 1
fi
echo "fetch_wheels: $(ls "$DEST"/*.whl | wc -l) wheels in $DEST for Python $PYVER"
