#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv from requirements.txt and
# setup.py. Idempotent: each layer does nothing when it matches those files.
#   bash scripts/setup_env.sh run       # what the demo and the launchers need (torch CPU wheel + pins)
#   bash scripts/setup_env.sh           # that, plus the test tools (pytest, the CPU copy of Unsloth,
#                                       # the GPU machine's torch 2.11 beside it): what scripts/test.sh uses
#   EXTRAS=dev,gpu bash scripts/setup_env.sh   # on a CUDA machine, with Unsloth (scripts/install_gpu.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
LAYER=${1:-dev}
case "$LAYER" in run|dev) ;; *) echo "setup_env.sh: unknown layer '$LAYER' (run | dev)" >&2; exit 2;; esac
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-dev,gguf}
[ "$LAYER" = run ] && EXTRAS=${EXTRAS//dev/} && EXTRAS=${EXTRAS//,,/,} && EXTRAS=${EXTRAS#,} && EXTRAS=${EXTRAS%,}
core=$(cat requirements.txt requirements-gpu.txt requirements-unsloth.txt setup.py scripts/setup_env.sh | sha256sum | cut -c1-16)
want=$core-$(cat scripts/setup_torch_side.sh scripts/torch_cuda_stubs.py | sha256sum | cut -c1-16)-$EXTRAS-${TARPO_TORCH_SIDE:-1}
stamp="$VENV/.tarpo-env"
run_stamp="$VENV/.tarpo-env-run"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0  # the full (dev) environment covers the run layer too
fi
if [ "$LAYER" = run ] && [ -f "$run_stamp" ] && [ "$(cat "$run_stamp")" = "$core-$EXTRAS" ]; then
  exit 0
fi
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "TARPO needs Python >= 3.11"'
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# pip installs without compiling to bytecode, and compile_all compiles what each layer installed on every core (pip
# compiles on one: 21 s of torch's 27 s install; 5.7 s without, then 8.6 s on 2 cores). Every module must have its
# bytecode: where PYTHONDONTWRITEBYTECODE=1 is set (as on some CI machines) Python never writes it later, and every
# process then compiles each module it imports from source. pip's own status is kept (its location warnings dropped).
pip() {
  local status=0
  "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v "^WARNING: Location" || true; } \
    || status=$?
  return "$status"
}
compile_all() {  # a file that does not compile is left as pip leaves it; no process pool here: one core
  "$VENV/bin/python" -m compileall -qq -j 0 "$@" >/dev/null 2>&1 || "$VENV/bin/python" -m compileall -qq "$@" \
    >/dev/null 2>&1 || true
}
site_packages() { "$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }

# torch first, pinned to the CPU build unless the machine has CUDA: an unpinned torch
# would pull several GB of CUDA libraries.
rm -f "$stamp"  # whatever changes below, the environment is complete again only when the stamp is written
torch_pin=$(grep -E '^torch==' requirements.txt)
installed=0
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '${torch_pin#torch==}')" 2>/dev/null; then
  if ls /opt/wheels/torch-"${torch_pin#torch==}"*cpu*.whl >/dev/null 2>&1; then
    pip install --no-compile --find-links /opt/wheels "$torch_pin"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    pip install --no-compile "$torch_pin"
  else
    pip install --no-compile "$torch_pin" --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
  fi
  installed=1
fi
# The test layer's folders beside the environment need nothing of it but its pip, so they install on the second
# core while the run layer installs (a fresh clone's set-up, 2-core AMD EPYC, 2026-11-29: 126 s one after the
# other; 72 s so, pip compiling; 87-90 s against 91-100 s of the same hour with compile_all, interleaved).
# The pinned Unsloth, kept OUT of the environment (importing it patches transformers process-wide)
# in a folder of its own: tests/test_unsloth_cpu.py runs its Python code on the CPU in a subprocess.
# triton is the version torch 2.13's CUDA wheel pins; unsloth_zoo imports it at top level.
# The GPU machine's torch (2.11, CUDA build with stub CUDA libraries: a 506 MiB download, 1.1 GB on
# disk) in a folder of its own: tests/test_torch_side.py runs the compiled engine's tests under it in a
# subprocess. TARPO_TORCH_SIDE=0 leaves it out (the test then skips, saying so). A failed install leaves
# .venv/torch-2.11.failed with the reason, and no stamp: the next run retries.
side_pid="" side_wanted=0 side_want=$(cat scripts/setup_torch_side.sh scripts/torch_cuda_stubs.py | sha256sum | cut -c1-16)
if [[ "$LAYER" = dev && ",$EXTRAS," == *",dev,"* ]]; then
  if [[ "${TARPO_TORCH_SIDE:-1}" != 0 ]] && { [ ! -d "$VENV/torch-2.11/torch" ] \
      || [ "$(cat "$VENV/torch-2.11/.stamp" 2>/dev/null)" != "$side_want" ]; }; then
    side_wanted=1
  fi
  side_log=$(mktemp)
  (
    set -e
    if [[ ",$EXTRAS," != *",gpu,"* ]]; then
      rm -rf "$VENV/unsloth-cpu.tmp"
      "$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-compile --no-deps \
        --target "$VENV/unsloth-cpu.tmp" -r requirements-unsloth.txt triton==3.7.1
      compile_all "$VENV/unsloth-cpu.tmp"
      rm -rf "$VENV/unsloth-cpu" && mv "$VENV/unsloth-cpu.tmp" "$VENV/unsloth-cpu"
    fi
    if [ "$side_wanted" = 1 ]; then
      bash scripts/setup_torch_side.sh "$VENV/bin/python" "$VENV/torch-2.11" install || true  # finish says
    fi
  ) >"$side_log" 2>&1 &
  side_pid=$!
  # the set-up failed or was stopped: no install left running (its folders are .tmp/.partial until complete)
  stop_side() {
    local child
    kill -STOP "$1" 2>/dev/null || return 0
    for child in $(pgrep -P "$1" 2>/dev/null); do stop_side "$child"; done
    kill -KILL "$1" 2>/dev/null || true
  }
  trap 'rm -f "$side_log"; if [ -n "$side_pid" ] && jobs -rp | grep -qx "$side_pid"; then stop_side "$side_pid"; fi' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
fi
if [ ! -f "$run_stamp" ] || [ "$(cat "$run_stamp")" != "$core-${EXTRAS}" ]; then
  pip install --no-compile -r requirements.txt
  extras=$(echo ",$EXTRAS," | sed 's/,gpu,/,/g; s/^,*//; s/,*$//')  # gpu: not an extra, scripts/install_gpu.sh
  if [[ ",$EXTRAS," == *",gpu,"* ]]; then
    PYTHON="$VENV/bin/python" EXTRAS="$extras" bash scripts/install_gpu.sh
  else
    pip install --no-compile -e ".${extras:+[$extras]}"
  fi
  installed=1
fi
if [ "$installed" = 1 ]; then
  compile_all "$(site_packages)"  # torch's and the layer's (a file compiled before is skipped)
  "$VENV/bin/python" -c "import tarpo, torch, trl, peft, transformers"
  echo "$core-$EXTRAS" > "$run_stamp"
fi
if [ "$LAYER" = run ]; then
  echo "environment ready: $VENV (torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'))"
  exit 0
fi
side_ok=1
if [ -n "$side_pid" ]; then  # the folders beside the environment (above), installed while the run layer was
  status=0 && wait "$side_pid" || status=$?
  side_pid="" && cat "$side_log"
  [ "$status" = 0 ] || { echo "setup_env: the test layer's install failed (above)" >&2; exit 1; }
  if [ "$side_wanted" = 1 ]; then  # torch 2.11's check imports the environment's packages: after the run layer
    if bash scripts/setup_torch_side.sh "$VENV/bin/python" "$VENV/torch-2.11" finish; then
      echo "$side_want" > "$VENV/torch-2.11/.stamp"
    else
      side_ok=0
    fi
  fi
fi
[ "$side_ok" = 0 ] || echo "$want" > "$stamp"
echo "environment ready: $VENV (torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'))"
