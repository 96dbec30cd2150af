#!/usr/bin/env bash
# Time the README's quick start as a newcomer meets it: clone this checkout (its committed HEAD)
# into a new temporary folder and run both README commands there, the demo first, with every cache
# empty (pip, Hugging Face, torch inductor, triton, the demo's warm start), then the demo a second time
# (.venv and the warm start present, as a user's second run finds them). The last line printed is
#   suite_s=<seconds of `bash scripts/test.sh`> demo_s=<seconds of `bash run_demo.sh`, set-up included>
#   demo_again_s=<seconds of the second `bash run_demo.sh`>
# The demo's table and the suite's summary line come before it. A data folder beside the checkout (the
# benchmark files some tests read) is linked beside the clone when present. Arguments go to the demo
# as settings, e.g. `SEED=1 bash scripts/fresh_timing.sh`; KEEP=1 keeps the temporary folder.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/tarpo-fresh.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
git clone -q "$src" "$work/tarpo"
if [ -d "$src/../shared" ]; then ln -s "$(cd "$src/../shared" && pwd)" "$work/shared"; fi
mkdir -p "$work/cache"
export PIP_CACHE_DIR=$work/cache/pip HF_HOME=$work/cache/hf XDG_CACHE_HOME=$work/cache/xdg \
  TORCHINDUCTOR_CACHE_DIR=$work/cache/inductor TRITON_CACHE_DIR=$work/cache/triton
cd "$work/tarpo"
echo "fresh_timing: $(git log -1 --format='%h %s' | cut -c1-80) in $work/tarpo ($(nproc) cores)"
t0=$(date +%s)
bash run_demo.sh > "$work/demo.log" 2>&1 || { tail -n 40 "$work/demo.log"; echo "fresh_timing: the demo failed" >&2; exit 1; }
t1=$(date +%s)
grep -E '^\|' "$work/demo.log" || true
summary=$(tail -n 1 "$work/demo.log")
.venv/bin/python - "$summary" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("pass@1 " + " ".join(f"{name}={m['pass@1']:.3f}" for name, m in s.items()))
PY
bash run_demo.sh > "$work/demo-again.log" 2>&1 || { tail -n 40 "$work/demo-again.log"; echo "fresh_timing: the second demo run failed" >&2; exit 1; }
t1b=$(date +%s)
status=0
bash scripts/test.sh -q -p no:cacheprovider > "$work/suite.log" 2>&1 || status=$?
t2=$(date +%s)
tail -n 1 "$work/suite.log"
[ "$status" = 0 ] || { tail -n 60 "$work/suite.log"; echo "fresh_timing: the suite failed (exit $status)" >&2; }
echo "suite_s=$((t2 - t1b)) demo_s=$((t1 - t0)) demo_again_s=$((t1b - t1))"
exit "$status"
