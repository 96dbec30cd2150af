#!/usr/bin/env bash
# One command for a GPU machine without internet (torch 2.11 + transformers 5.17 preinstalled):
# installs the carried wheels (.whl/, see benchmarks/fetch_gpu_wheels.sh) into a private target,
# runs the GPU tests (tests/test_gpu.py: Unsloth path vs transformers path) and the benchmarks
# (benchmarks/gpu_bench.py), and writes one report:
#   bash benchmarks/gpu_check.sh                      # -> docs/gpu/<date>-<gpu>.md
#   REPORT=$OUT/gpu.md bash benchmarks/gpu_check.sh   # elsewhere
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/tarpo-site}
PY=${PYTHON:-python3}
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
    || { echo "gpu_check: installing the wheels in $WHEELS failed"; exit 1; }
fi
# The project itself into the same target (tarpo and tarpo.patches, as users install it).
"$PY" -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . \
  || { echo "gpu_check: installing the project failed"; exit 1; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
"$PY" - <<'PYEOF' || exit 1
import importlib, sys
import torch
assert torch.cuda.is_available(), "gpu_check: no CUDA device"
missing = [m for m in ("trl", "peft", "datasets", "math_verify", "bitsandbytes", "unsloth_zoo") if importlib.util.find_spec(m) is None]
if importlib.util.find_spec("unsloth") is None:
    missing.append("unsloth")
if missing:
    sys.exit(f"gpu_check: missing packages {missing}: carry them as wheels (benchmarks/fetch_gpu_wheels.sh)")
import tarpo.patches
print("tarpo.patches from", tarpo.patches.__file__, "| torch", torch.__version__, "|", torch.cuda.get_device_name())
PYEOF
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' /' '--')
REPORT=${REPORT:-docs/gpu/$(date +%F)-${GPU:-gpu}.md}
LOG=$(mktemp)
(cd tests && "$PY" -m pytest -q -p no:cacheprovider --rootdir=.. -c ../pytest.ini test_gpu.py test_patches.py \
  test_hooks.py -rs -s 2>&1) | tee "$LOG"
TESTS=${PIPESTATUS[0]}
"$PY" benchmarks/gpu_bench.py --report "$REPORT" --tests-log "$LOG"
BENCH=$?
echo "gpu_check: tests exit $TESTS, benchmark exit $BENCH, report $REPORT"
exit $(( TESTS != 0 || BENCH != 0 ))
