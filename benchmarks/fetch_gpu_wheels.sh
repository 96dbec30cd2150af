#!/usr/bin/env bash
# On a machine WITH internet: download the wheels that a GPU machine without internet lacks
# (its image has torch 2.11, transformers 5.17, accelerate, peft, triton, numpy, ...) into .whl/,
# for Python 3.12 on x86-64 Linux. Carry .whl/ to the GPU machine, then run benchmarks/gpu_check.sh.
#   bash benchmarks/fetch_gpu_wheels.sh            # PYTHON_VERSION=3.12 DEST=.whl by default
# --no-deps: every package is named here; torch and the CUDA libraries are never fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-.whl}
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
PACKAGES=(
  # the project's pins (requirements.txt, setup.py extras)
  trl==1.15.0 peft==0.21.2 datasets==4.8.5 math-verify==0.9.0 bitsandbytes==0.50.2
  unsloth==2026.10.7 unsloth_zoo==2026.10.7 pytest==9.2.0
  # their dependencies missing from the GPU image
  dill multiprocess latex2sympy2_extended "antlr4-python3-runtime==4.13.2" tyro docstring-parser shtab typeguard
  hf_transfer structlog nest-asyncio msgspec torchao cut_cross_entropy diffusers pydantic pydantic-core
  annotated-types typing-inspection
)
mkdir -p "$DEST"
python3 -m pip download --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$DEST" "${PACKAGES[@]}"
echo "wheels in $DEST: $(ls "$DEST" | wc -l)"
