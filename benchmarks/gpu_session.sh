#!/usr/bin/env bash
# Short checks on a CUDA GPU, one per call of this script (docs/gpu/README.md). BUDGET is a time limit in seconds
# that a call keeps within. A call first prints what each part is expected to take, skips a part that cannot fit in
# what is left of its BUDGET, writes every figure under $OUT (or RESULTS_DIR) as soon as it exists, and ends with one
# line: a JSON object of its figures (null where a figure was not reached; benchmarks/gpu_session.py summary).
#   BUDGET=250 bash benchmarks/gpu_session.sh call1  # install (scripts/install_gpu.sh, offline from .whl), the
#       learning check (GRPO and TARPO at once from the demo's warm start, the launchers' default GPU path:
#       python -m tarpo.runs.learning_check), then tests/test_gpu.py if the time left allows it
#   BUDGET=400 bash benchmarks/gpu_session.sh call2  # random Qwen2.5-3B weights; run_math.sh for two steps at the
#       paper's MATH settings (64 x 1,024 + 1,024 tokens, ACTION_BIAS=2.2,0), nvidia-smi's memory every 0.5 s beside
#   bash benchmarks/gpu_session.sh positions   # Qwen2.5-3B shape: the compiled step at write positions 64, 512 and
#       1,900 of a 2,048-position cache, attention over the written slots, at DECODE_MERGE none, attention and all,
#       with LoRA on q/k/v/o and then on every linear layer, each with its cold compile; tests/test_gpu.py if time
#   bash benchmarks/gpu_session.sh decode      # Qwen2.5-3B shape: the compiled step at batch 64 (learned, all-hard,
#       all-soft rows) against the weight-reading floor
# Needs .whl (the wheel kit of benchmarks/fetch_gpu_wheels.sh; not read when the project is installed already) and,
# for call1 and call2, .gpu-data (python benchmarks/gpu_session.py data .gpu-data DATA, DATA a folder holding
# gsm8k/train.jsonl and math/train.jsonl: GSM8K and long MATH rows, the demo's warm start); both are in .gitignore,
# so copy them beside the checkout. GPU_DATA reads another folder. The launcher runs train with
# torch.backends.cuda.enable_math_sdp(False) (a sitecustomize on PYTHONPATH): an attention call that only the math
# kernel takes raises "No available kernel".
# ALLOW_CPU=1: a CPU smoke run of the plumbing (tiny sizes, the .venv's Python, nothing installed). SESSION_WORK: the
# folder of the models and run folders (default /tmp/gpu-session-work).
set -uo pipefail
cd "$(dirname "$0")/.."
CALL=${1:?usage: gpu_session.sh call1|call2|positions|decode}
DEST=${OUT:-${RESULTS_DIR:-/tmp/gpu-session}}
mkdir -p "$DEST"
JSON=$DEST/$CALL.json
LOG=$DEST/$CALL.log
exec > >(tee -a "$LOG") 2>&1
CPU=${ALLOW_CPU:-0}
PY=${PYTHON:-python3}
[ "$CPU" = 1 ] && PY=${PYTHON:-.venv/bin/python}
case $PY in */*) PY=$(realpath -s "$PY");; esac  # the tests run from tests/
DATA=$(realpath -s "${GPU_DATA:-.gpu-data}")
WORK=${SESSION_WORK:-/tmp/gpu-session-work}  # models and run folders (not copied to the results folder)
mkdir -p "$WORK"
export PYTHON=$PY HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  PYTHONUNBUFFERED=1 UNSLOTH_DISABLE_STATISTICS=1
T0=$SECONDS
case $CALL in call1) B=250;; call2) B=400;; *) B=540;; esac
BUDGET=${BUDGET:-$([ "$CPU" = 1 ] && echo 3000 || echo $B)}
left() { echo $((BUDGET - (SECONDS - T0))); }
say() { echo "gpu_session [$((SECONDS - T0)) s]: $*"; }
rec() { "$PY" benchmarks/gpu_session.py record "$JSON" "$1" "$2" || say "could not record $1"; }
timed() {  # KEY SECONDS CMD...: run CMD under a timeout, record its exit code and seconds as KEY
  local key=$1 limit=$2 start=$SECONDS; shift 2
  if [ "$limit" -lt 20 ]; then say "$key: not started, BUDGET is spent"; rec "$key" '{"rc": "not started"}'; return 200; fi
  say "$key: start (limit $limit s)"
  timeout -k 10 "$limit" "$@"
  local rc=$?
  say "$key: exit $rc after $((SECONDS - start)) s"
  rec "$key" "{\"rc\": $rc, \"seconds\": $((SECONDS - start))}"
  return $rc
}
fits() {  # KEY EXPECTED: whether EXPECTED seconds (and 10 to spare) are left; if not, say so and record the skip
  if [ "$(left)" -ge $(( $2 + 10 )) ]; then return 0; fi
  say "$1: skipped, expected $2 s and $(left) s are left"
  rec "$1" "{\"rc\": \"skipped\", \"expected_s\": $2, \"left_s\": $(left)}"
  return 1
}
mirror() {  # SRC DST: copy SRC to DST whenever it changes, every second, until killed (figures out as they exist)
  while true; do
    if [ -f "$1" ] && ! cmp -s "$1" "$2"; then cp "$1" "$2.tmp" && mv "$2.tmp" "$2"; fi
    sleep 1
  done
}

say "$CALL on $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo cpu), \
commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo +changes), budget $BUDGET s"
rec where "{\"date\": \"$(date -u +%FT%TZ)\", \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)\", \
\"commit\": \"$(git rev-parse HEAD 2>/dev/null)\", \"boot_id\": \"$(cat /proc/sys/kernel/random/boot_id)\", \"budget_s\": $BUDGET}"

# What each part is expected to take on a GPU (seconds) and where the figure comes from (docs/gpu/README.md)
E_INSTALL=50    # scripts/install_gpu.sh offline, nothing installed before: 14-16 s (H100, H200, 2026-11-26), 47 s (H100, 2026-11-27)
E_MODEL3=45     # random Qwen2.5-3B weights written: 30-35 s (2026-11-26)
E_LEARNING=150  # the learning check, 100 steps of each algorithm at once: 135 s (H100, 2026-11-27)
E_TEST_GPU=200  # tests/test_gpu.py: 170-195 s (2026-11-26)
E_MATH=200      # run_math.sh, 2 steps of the 3B shape: 180 s (H100, 2026-11-27: compile and capture 54 s, rollouts
                # 61 and 7 s, trainings 36 and 13.5 s, the rest Unsloth's import and the load)
STEPS=100 SHAPE3=3b PLONG=1024 LONG=1024 MATH_BATCH=64
if [ "$CPU" = 1 ]; then
  E_INSTALL=0 E_MODEL3=10 E_LEARNING=60 E_MATH=60 STEPS=3 SHAPE3=tiny PLONG=400 LONG=8 MATH_BATCH=16
fi
case $CALL in
  call1) say "expected: install $E_INSTALL s, learning check $E_LEARNING s, tests/test_gpu.py $E_TEST_GPU s (only if \
that much is left)";;
  call2) say "expected: install $E_INSTALL s, 3B weights $E_MODEL3 s, two MATH steps $E_MATH s";;
esac
rec plan "{\"install\": $E_INSTALL, \"model3\": $E_MODEL3, \"learning\": $E_LEARNING, \"test_gpu\": $E_TEST_GPU, \
\"math\": $E_MATH}"

install() {  # scripts/install_gpu.sh, offline from the wheel kit in .whl; the torch before and after
  if [ "$CPU" = 1 ]; then return 0; fi
  if (cd /tmp && "$PY" -c 'import tarpo.patches, unsloth, trl') >/dev/null 2>&1; then say "installed already"; return 0; fi
  local before after wheels=$PWD/.whl
  before=$("$PY" -c 'import torch; print(torch.__version__)')
  WHEELS=$wheels timed install_gpu 120 bash scripts/install_gpu.sh
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

NOMATH=$WORK/nomath
mkdir -p $NOMATH
cat > $NOMATH/sitecustomize.py <<'PYEOF'
import torch
if torch.cuda.is_available():
    torch.backends.cuda.enable_math_sdp(False)  # gpu_session.sh: an attention only math takes must raise
PYEOF
export PYTHONPATH=$NOMATH${PYTHONPATH:+:$PYTHONPATH}

test_gpu() {  # tests/test_gpu.py if its expected time is left (it skips itself without CUDA: not run on the CPU)
  if [ "$CPU" = 1 ]; then say "test_gpu: not run on the CPU"; rec test_gpu '{"rc": "not run on the CPU"}'; return 0; fi
  fits test_gpu $E_TEST_GPU || return 0
  timed test_gpu $(( $(left) - 10 )) bash -c 'cd tests && exec "$0" -m pytest -q -p no:cacheprovider --rootdir=.. \
    -c ../pytest.ini -rs -s test_gpu.py' "$PY" > "$DEST/test_gpu.log" 2>&1
  tail -n 40 "$DEST/test_gpu.log"
}

case $CALL in
  call1)
    [ -f "$DATA/warm/config.json" ] || { say "no $DATA/warm: python benchmarks/gpu_session.py data .gpu-data DATA (DATA: gsm8k/ and math/ train.jsonl)"; exit 2; }
    install
    runs=$WORK/learning
    rm -rf $runs
    mkdir -p $runs
    pids=()
    for algo in grpo tarpo; do mirror "$runs/$algo/metrics.jsonl" "$DEST/learning-$algo.jsonl" & pids+=($!); done
    limit=$(( $(left) - 15 ))
    # the check stops its runs itself 20 s before the limit and summarises what they logged
    timed learning $limit "$PY" -m tarpo.runs.learning_check --warm "$DATA/warm" --out $runs --steps $STEPS \
      --max-seconds $(( limit - 20 > 1 ? limit - 20 : 1 ))
    kill "${pids[@]}" 2>/dev/null
    for algo in grpo tarpo; do
      [ -f "$runs/$algo/metrics.jsonl" ] && cp "$runs/$algo/metrics.jsonl" "$DEST/learning-$algo.jsonl"
      [ -f "$runs/$algo.log" ] && tail -n 30 "$runs/$algo.log" | cut -c1-400
    done
    [ -f $runs/learning.json ] && cp $runs/learning.json "$DEST/learning.json"
    test_gpu;;
  call2)
    [ -f "$DATA/math_long.jsonl" ] || { say "no $DATA: python benchmarks/gpu_session.py data .gpu-data DATA (DATA: gsm8k/ and math/ train.jsonl)"; exit 2; }
    install
    timed model3 90 "$PY" benchmarks/gpu_session.py model $WORK/q3 $SHAPE3
    run=$WORK/runs/math-paper
    rm -rf $WORK/runs
    sampler=
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 500 > "$DEST/memory.csv" &
      sampler=$!
    fi
    mirror "$run/metrics.jsonl" "$DEST/math.jsonl" & m1=$!
    mirror "$run/launch_config.json" "$DEST/math_plan.json" & m2=$!
    timed math $(( $(left) - 15 )) env OUT_DIR=$WORK/runs RUN_NAME=math-paper MODEL=$WORK/q3 \
      DATA_PATH="$DATA/math_long.jsonl" MAX_STEPS=2 SAVE_STEPS=100 ACTION_BIAS=2.2,0 BATCH=$MATH_BATCH \
      MAX_PROMPT_LENGTH=$PLONG MAX_COMPLETION_LENGTH=$LONG CPU_MAX_HOURS=2 bash run_math.sh 2>&1 \
      | grep -vE '^\s*$' | cut -c1-600 | tail -n 40
    kill $m1 $m2 ${sampler:+$sampler} 2>/dev/null
    [ -f "$run/metrics.jsonl" ] && cp "$run/metrics.jsonl" "$DEST/math.jsonl"
    [ -f "$run/launch_config.json" ] && cp "$run/launch_config.json" "$DEST/math_plan.json";;
  positions)  # the compiled step at write positions 64, 512, 1,900 of a 2,048-position cache (3B shape)
    install
    timed model3 120 "$PY" benchmarks/gpu_session.py model $WORK/q3 $SHAPE3
    small=$([ "$CPU" = 1 ] && echo --batch 4 --steps 8 --rounds 1)
    # with the paper's LoRA targets (q, k, v, o), what each level of decode copies buys
    timed write-positions $(( $(left) - 160 )) "$PY" benchmarks/bench_write_positions.py --model $WORK/q3 \
      --json "$JSON" --rounds 3 --modes written --merges none,attention,all $small 2> $WORK/err.log \
      || tail -n 40 $WORK/err.log
    # LoRA on every linear layer: merging the MLP's adapters (all) against keeping them as adapters (attention)
    fits write-positions-linear 150 && timed write-positions-linear $(( $(left) - 10 )) "$PY" \
      benchmarks/bench_write_positions.py --model $WORK/q3 --json "$JSON" --key write_positions_all_linear \
      --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --rounds 3 --modes written \
      --merges none,attention,all $small 2> $WORK/err.log || tail -n 40 $WORK/err.log
    test_gpu;;
  decode)
    install
    timed model3 120 "$PY" benchmarks/gpu_session.py model $WORK/q3 $SHAPE3
    timed decode-run $(( $(left) - 10 )) "$PY" benchmarks/gpu_session.py decode $WORK/q3 "$JSON" \
      $([ "$CPU" = 1 ] && echo --tiny);;
  *) say "unknown call $CALL"; exit 2;;
esac
say "done; results in $JSON; the last line: the call's figures"
"$PY" benchmarks/gpu_session.py summary "$CALL" "$JSON" "$DEST"
