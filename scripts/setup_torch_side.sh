#!/usr/bin/env bash
# A second torch beside the environment's, for tests/test_torch_side.py: the GPU machine's torch
# (2.11) on this CPU, in a folder of its own that a subprocess puts first on PYTHONPATH, so its
# `import torch` takes that torch and everything else (transformers, peft, trl, ...) from the
# environment at the pinned versions.
#   bash scripts/setup_torch_side.sh PYTHON DEST      # PYTHON: the environment's python (both phases below)
# PyPI's Linux x86-64 torch 2.11 is the CUDA 13.0 build (506 MiB wheel) and declares ~1.6 GB of
# nvidia-* wheels that its libraries link; a CPU run never calls them, so they are replaced by
# stub libraries (scripts/torch_cuda_stubs.py) and only the real CUDA runtime (2 MiB, which answers
# "no device") is installed. Installed into DEST.partial and renamed: DEST is complete or absent.
# On failure DEST.failed keeps the reason, which the test shows when it skips.
#   bash scripts/setup_torch_side.sh PYTHON DEST install   # the download and unpacking only (DEST.partial): it
#                                                          # needs nothing of the environment but its pip
#   bash scripts/setup_torch_side.sh PYTHON DEST finish    # then the check on this CPU, and DEST: this imports
#                                                          # torch 2.11 with the environment's packages
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # absolute (the check below runs in /tmp), links kept
DEST=$(realpath -m "$2")
PHASE=${3:-all}
case "$PHASE" in
  all|install|finish) ;;
  *) echo "setup_torch_side.sh: unknown phase '$PHASE' (all | install | finish)" >&2; exit 2;;
esac
TORCH=${TORCH_SIDE_VERSION:-2.11.0}
CUDART=13.0.96  # nvidia-cuda-runtime, as torch 2.11's cuda-toolkit[cudart]==13.0.2 pins it
SETUPTOOLS=81.0.0  # torch 2.11 declares setuptools<82; the environment's is newer
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail() { { echo "$*"; tail -n 20 "$log"; } >"$DEST.failed"; rm -rf "$DEST.partial"; echo "setup_torch_side: $*" >&2; exit 1; }
if [ "$PHASE" != finish ]; then
  rm -rf "$DEST.partial" "$DEST.failed"
  "$PY" -m pip --disable-pip-version-check -q install --no-compile --no-deps --only-binary=:all: \
    --target "$DEST.partial" "torch==$TORCH" "nvidia-cuda-runtime==$CUDART" "setuptools==$SETUPTOOLS" >"$log" 2>&1 \
    || fail "pip could not install torch==$TORCH, nvidia-cuda-runtime==$CUDART, setuptools==$SETUPTOOLS"
  # what a CPU run never reads: CUDA headers and static libraries
  rm -rf "$DEST.partial"/nvidia/cu13/include "$DEST.partial"/nvidia/cu13/lib/*.a
  "$PY" scripts/torch_cuda_stubs.py "$DEST.partial" >"$log" 2>&1 || fail "torch_cuda_stubs.py failed"
  # bytecode on every core (pip compiles on one): a process under this torch would otherwise compile each module it
  # imports from source where PYTHONDONTWRITEBYTECODE=1 is set (a file that does not compile is left as pip leaves it)
  "$PY" -m compileall -qq -j 0 "$DEST.partial" >/dev/null 2>&1 \
    || "$PY" -m compileall -qq "$DEST.partial" >/dev/null 2>&1 || true
fi
[ "$PHASE" = install ] && exit 0
if [ ! -d "$DEST.partial" ]; then  # the install phase failed (it said why, and DEST.failed keeps it) or never ran
  if [ ! -f "$DEST.failed" ]; then
    echo "the install phase did not run" >"$DEST.failed"
    echo "setup_torch_side: $(cat "$DEST.failed")" >&2
  fi
  exit 1
fi
(cd /tmp && PYTHONPATH="$DEST.partial" "$PY" -c "
import torch, sys
assert torch.__version__.split('+')[0] == '$TORCH', torch.__version__
assert torch.__file__.startswith('$DEST.partial/'), torch.__file__
assert not torch.cuda.is_available()
x = torch.randn(8, 8)
torch.testing.assert_close((x @ x).relu(), torch.relu(x @ x))
print('torch', torch.__version__)") >"$log" 2>&1 || fail "torch $TORCH does not import and run on the CPU"
# (compiling is what tests/test_torch_side.py checks, at the engine's scale: a compile here cost 30 s more)
rm -rf "$DEST" && mv "$DEST.partial" "$DEST"
echo "setup_torch_side: torch $TORCH in $DEST ($(du -sh "$DEST" | cut -f1))"
