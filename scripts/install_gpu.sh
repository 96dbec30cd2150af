#!/usr/bin/env bash
# The project with Unsloth, on a CUDA machine whose torch (2.11 to 2.13, the CUDA build) is already installed,
# keeping that torch. From the repository root, in the environment that holds the torch:
#   bash scripts/install_gpu.sh                        # PYTHON=... picks the interpreter (default: python)
#   DRY_RUN_REPORT=/tmp/gpu bash scripts/install_gpu.sh # pip's --dry-run --report /tmp/gpu-{1,2}.json; installs nothing
#   WHEELS=.whl bash scripts/install_gpu.sh            # offline: only the wheels in that folder (and what is installed)
# unsloth declares torchvision and xformers, and each release of either is built for one torch: a resolving
# `pip install unsloth` over an installed torch can replace it (or fail offline). So: the project and what
# Unsloth needs (requirements-gpu.txt), with the installed torch as a constraint (pip fails rather than
# replace it), then unsloth and unsloth_zoo without their declared dependencies (docs/gpu-install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
# the installed torch, and whether pip will refuse to install into this Python (PEP 668: a system Python marked
# EXTERNALLY-MANAGED, outside a venv, unless PIP_BREAK_SYSTEM_PACKAGES says otherwise)
probe='import importlib.metadata as m, os, sys, sysconfig
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) and sys.prefix == sys.base_prefix
print(m.version("torch"), int(managed))'
if ! read -r torch_version managed < <("$PYTHON" -c "$probe" 2>/dev/null) || [ -z "$torch_version" ]; then
  echo "install_gpu.sh: $PYTHON has no torch: install the CUDA build of torch 2.11-2.13 for this machine first" >&2
  exit 2
fi
if [ "$managed" = 1 ] && [ -z "${PIP_BREAK_SYSTEM_PACKAGES:-}" ]; then
  echo "install_gpu.sh: $PYTHON is externally managed (PEP 668) and pip will not install into it; make a venv that" \
    "sees its torch and install there: $PYTHON -m venv --system-site-packages .venv-gpu &&" \
    "PYTHON=.venv-gpu/bin/python bash scripts/install_gpu.sh (then PYTHON=.venv-gpu/bin/python for the launchers)" >&2
  exit 2
fi
constraint=$(mktemp)
trap 'rm -f "$constraint"' EXIT
echo "torch==$torch_version" > "$constraint"
offline=()
if [ -n "${WHEELS:-}" ]; then  # a machine without an index (benchmarks/fetch_gpu_wheels.sh builds such a folder)
  [ -d "$WHEELS" ] || { echo "install_gpu.sh: WHEELS=$WHEELS is not a folder" >&2; exit 2; }
  offline=(--no-index --find-links "$WHEELS" --no-build-isolation)
fi
n=0
pip() {
  n=$((n + 1))
  if [ -n "${DRY_RUN_REPORT:-}" ]; then
    "$PYTHON" -m pip install ${offline[@]+"${offline[@]}"} --dry-run --report "$DRY_RUN_REPORT-$n.json" "$@"
  else
    "$PYTHON" -m pip install ${offline[@]+"${offline[@]}"} "$@"
  fi
}
pip -c "$constraint" -e ".${EXTRAS:+[$EXTRAS]}" -r requirements-gpu.txt
pip --no-deps -r requirements-unsloth.txt
[ -n "${DRY_RUN_REPORT:-}" ] && echo "dry run: pip's reports in $DRY_RUN_REPORT-{1,2}.json" || echo "installed; torch $torch_version kept"
