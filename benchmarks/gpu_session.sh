#!/usr/bin/env bash
# A GPU session of the device tool in two calls (docs/gpu/README.md: 15 minutes of device time in all,
# machine starts included). Each call writes its log, a JSON of results and the run folders' small files
# under $OUT (or RESULTS_DIR) as soon as each exists. Carry .whl (benchmarks/fetch_gpu_wheels.sh) and
# .gpu-data (python benchmarks/gpu_session.py data .gpu-data ../shared/data; ignore it in .git/info/exclude).
#   bash benchmarks/gpu_session.sh call1   # install as scripts/install_gpu.sh does (offline: WHEELS), the default
#                                          # launcher run (run_gsm8k.sh, Qwen2.5-1.5B shape, 2 steps, then a resume
#                                          # for a third), tests/test_gpu.py
#   bash benchmarks/gpu_session.sh call2   # Qwen2.5-3B shape: one step at the paper's MATH settings (run_math.sh),
#                                          # then the compiled decode step against the bandwidth floor, soft vs hard
#   bash benchmarks/gpu_session.sh positions  # Qwen2.5-3B shape: the compiled step at write positions 64, 512 and
#                                          # 1,900 of a 2,048-position cache (attention over the written slots and
#                                          # over all), its cold compile and kernels; tests/test_gpu.py
# Both launcher runs train with torch.backends.cuda.enable_math_sdp(False) (a sitecustomize on PYTHONPATH):
# an attention call that only the math kernel takes raises "No available kernel" instead of running (issue 44).
# ALLOW_CPU=1: a CPU smoke run of the plumbing (tiny model, tiny lengths, the .venv's Python, nothing installed).
set -uo pipefail
cd "$(dirname "$0")/.."
CALL=${1:?usage: gpu_session.sh call1|call2}
DEST=${OUT:-${RESULTS_DIR:-/tmp/gpu-session}}
mkdir -p "$DEST"
JSON=$DEST/$CALL.json
LOG=$DEST/$CALL.log
exec > >(tee -a "$LOG") 2>&1
CPU=${ALLOW_CPU:-0}
PY=${PYTHON:-python3}
[ "$CPU" = 1 ] && PY=${PYTHON:-.venv/bin/python}
case $PY in */*) PY=$(realpath -s "$PY");; esac  # the tests run from tests/
export PYTHON=$PY HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  PYTHONUNBUFFERED=1 UNSLOTH_DISABLE_STATISTICS=1
T0=$SECONDS
BUDGET=${BUDGET:-$([ "$CPU" = 1 ] && echo 3000 || echo 540)}
left() { echo $((BUDGET - (SECONDS - T0))); }
say() { echo "gpu_session [$((SECONDS - T0)) s]: $*"; }
rec() { "$PY" benchmarks/gpu_session.py record "$JSON" "$1" "$2" || say "could not record $1"; }
timed() {  # KEY SECONDS CMD...: run CMD under a timeout, record its exit code and seconds as KEY
  local key=$1 limit=$2 start=$SECONDS; shift 2
  if [ "$limit" -lt 20 ]; then say "$key: not started, the budget is spent"; rec "$key" '{"rc": "not started"}'; return 200; fi
  say "$key: start (limit $limit s)"
  timeout -k 10 "$limit" "$@"
  local rc=$?
  say "$key: exit $rc after $((SECONDS - start)) s"
  rec "$key" "{\"rc\": $rc, \"seconds\": $((SECONDS - start))}"
  return $rc
}

say "$CALL on $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo cpu), \
commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo +changes)"
rec where "{\"date\": \"$(date -u +%FT%TZ)\", \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)\", \
\"commit\": \"$(git rev-parse HEAD 2>/dev/null)\", \"boot_id\": \"$(cat /proc/sys/kernel/random/boot_id)\"}"

install() {  # scripts/install_gpu.sh, offline from the carried wheels; the torch before and after
  if [ "$CPU" = 1 ]; then return 0; fi
  if (cd /tmp && "$PY" -c 'import tarpo.patches, unsloth, trl') >/dev/null 2>&1; then say "installed already"; return 0; fi
  local before after wheels=$PWD/.whl
  before=$("$PY" -c 'import torch; print(torch.__version__)')
  WHEELS=$wheels timed install_gpu 240 bash scripts/install_gpu.sh
  local rc=$?
  after=$("$PY" -c 'import torch; print(torch.__version__)')
  rec torch "{\"before\": \"$before\", \"after\": \"$after\", \"install_rc\": $rc}"
  say "torch before $before, after $after"
  "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|trl|peft|accelerate|datasets|bitsandbytes|unsloth|unsloth.zoo|triton|tarpo|tqdm|matplotlib) ' \
    | tee "$DEST/pip-list.txt"
  if [ $rc != 0 ]; then  # the kit alone, as benchmarks/gpu_check.sh installs it, so that the rest still runs
    say "install_gpu.sh failed; installing the wheels and the project (editable) without their dependencies"
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation "$wheels"/*.whl -e . \
      || say "the fallback install failed too"
  fi
  "$PY" -c 'import tarpo.patches as p; p.check_versions(); p.check_source(); print("tarpo.patches checks pass")'
}

NOMATH=/tmp/session-nomath
mkdir -p $NOMATH
cat > $NOMATH/sitecustomize.py <<'PYEOF'
import torch
if torch.cuda.is_available():
    torch.backends.cuda.enable_math_sdp(False)  # gpu_session.sh: an attention only math takes must raise
PYEOF

launch() {  # KEY LIMIT LAUNCHER [VAR=VALUE...]: a launcher run with math SDP off; its per-step figures recorded
  local key=$1 limit=$2 launcher=$3; shift 3
  timed "$key" "$limit" env PYTHONPATH=$NOMATH${PYTHONPATH:+:$PYTHONPATH} OUT_DIR=/tmp/session-runs "$@" \
    bash "$launcher" 2>&1 | tee "$DEST/$key.out" | grep -vE '^\s*$' | tail -n 60
  local rc=${PIPESTATUS[0]}
  local run=/tmp/session-runs/$(printf '%s\n' "$@" | sed -n 's/^RUN_NAME=//p')
  if [ -f "$run/metrics.jsonl" ]; then "$PY" benchmarks/gpu_session.py steps "$run" "$JSON" >/dev/null; fi
  grep -m1 -B2 -A12 "No available kernel" "$DEST/$key.out" && rec "$key-no-kernel" '"No available kernel: see the log"'
  return "$rc"
}

SHAPE15=1.5b SHAPE3=3b NEW=128 PLONG=1024 LONG=1024
if [ "$CPU" = 1 ]; then SHAPE15=tiny SHAPE3=tiny NEW=8 PLONG=400 LONG=8; fi
[ -f .gpu-data/gsm8k.jsonl ] || { say "no .gpu-data: python benchmarks/gpu_session.py data .gpu-data ../shared/data"; exit 2; }

case $CALL in
  call1)
    install
    timed model15 120 "$PY" benchmarks/gpu_session.py model /tmp/session-q15 $SHAPE15
    common=(MODEL=/tmp/session-q15 DATA_PATH=.gpu-data/gsm8k.jsonl RUN_NAME=gsm8k-default SAVE_STEPS=1
            MAX_COMPLETION_LENGTH=$NEW CPU_MAX_HOURS=2)
    launch launch-2-steps $(( $(left) - 120 )) run_gsm8k.sh "${common[@]}" MAX_STEPS=2
    launch launch-resume $(( $(left) - 60 )) run_gsm8k.sh "${common[@]}" MAX_STEPS=3
    tar czf "$DEST/call1-run.tgz" -C /tmp/session-runs gsm8k-default --exclude='*.safetensors' --exclude='*.pt' \
      --exclude='*.bin' 2>/dev/null
    timed test_gpu $(( $(left) - 10 )) bash -c 'cd tests && exec "$0" -m pytest -q -p no:cacheprovider --rootdir=.. \
      -c ../pytest.ini -rs -s test_gpu.py' "$PY" > "$DEST/test_gpu.log" 2>&1
    tail -n 40 "$DEST/test_gpu.log";;
  call2)
    install
    timed model3 120 "$PY" benchmarks/gpu_session.py model /tmp/session-q3 $SHAPE3
    launch launch-math-step $(( $(left) - 150 )) run_math.sh MODEL=/tmp/session-q3 DATA_PATH=.gpu-data/math_long.jsonl \
      RUN_NAME=math-paper MAX_STEPS=1 SAVE_STEPS=1 MAX_PROMPT_LENGTH=$PLONG MAX_COMPLETION_LENGTH=$LONG CPU_MAX_HOURS=2
    timed decode-run $(( $(left) - 10 )) "$PY" benchmarks/gpu_session.py decode /tmp/session-q3 "$JSON" \
      $([ "$CPU" = 1 ] && echo --tiny);;
  positions)  # issue 46: the compiled step at write positions 64, 512, 1,900 of a 2,048-position cache (3B shape)
    install
    timed model3 120 "$PY" benchmarks/gpu_session.py model /tmp/session-q3 $SHAPE3
    TORCH_LOGS=output_code timed write-positions $(( $(left) - 100 )) "$PY" benchmarks/bench_write_positions.py \
      --model /tmp/session-q3 --json "$JSON" --rounds 2 $([ "$CPU" = 1 ] && echo --batch 4 --steps 8 --rounds 1) \
      2> /tmp/session-code.log || grep -v __output_code /tmp/session-code.log | tail -n 40
    "$PY" benchmarks/count_kernels.py /tmp/session-code.log --json "$JSON" --key step-kernels | head -n 30
    timed test_gpu $(( $(left) - 10 )) bash -c 'cd tests && exec "$0" -m pytest -q -p no:cacheprovider --rootdir=.. \
      -c ../pytest.ini -rs -s test_gpu.py' "$PY" > "$DEST/test_gpu.log" 2>&1
    tail -n 40 "$DEST/test_gpu.log";;
  *) say "unknown call $CALL"; exit 2;;
esac
say "done; results in $JSON"
