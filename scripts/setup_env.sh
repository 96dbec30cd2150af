#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv from requirements.txt
# and setup.py. Idempotent: does nothing when the environment matches those files.
#   bash scripts/setup_env.sh            # CPU environment (torch CPU wheel) + dev tools
#   EXTRAS=dev,gpu bash scripts/setup_env.sh   # on a CUDA machine, with Unsloth
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-dev}
stamp="$VENV/.tarpo-env"
want=$(cat requirements.txt setup.py | sha256sum | cut -c1-16)-$EXTRAS

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "TARPO needs Python >= 3.11"'
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }

# torch first, pinned to the CPU build unless the machine has CUDA: an unpinned torch
# would pull several GB of CUDA libraries.
torch_pin=$(grep -E '^torch==' requirements.txt)
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '${torch_pin#torch==}')" 2>/dev/null; then
  if ls /opt/wheels/torch-"${torch_pin#torch==}"*cpu*.whl >/dev/null 2>&1; then
    pip install --find-links /opt/wheels "$torch_pin"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    pip install "$torch_pin"
  else
    pip install "$torch_pin" --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
  fi
fi
pip install -r requirements.txt
pip install -e ".[$EXTRAS]"
"$VENV/bin/python" -c "import tarpo, torch, trl, peft, transformers" 
echo "$want" > "$stamp"
echo "environment ready: $VENV (torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'))"
