#!/usr/bin/env bash
# The CPU demo: warm-start a tiny model on synthetic arithmetic, train it with GRPO and
# with TARPO, evaluate CoT / GRPO / TARPO and print a table. Needs only Python >= 3.11:
# the environment is set up from the project's files on first use. Offline throughout.
# Every setting below can be overridden from the environment: STEPS=100 bash run_demo.sh
# The last line printed is the path of the run's summary.json.
set -euo pipefail
cd "$(dirname "$0")"

SEED=${SEED:-0}                      # seed of RL and evaluation
WARM_SEED=${WARM_SEED:-0}            # seed of the warm start (cached; shared by all SEEDs)
SFT_STEPS=${SFT_STEPS:-1500}         # supervised warm-start steps (cached in CACHE_DIR)
SFT_BATCH=${SFT_BATCH:-32}           # demonstrations per warm-start step
SFT_NOISE=${SFT_NOISE:-0.4}          # chance that a demonstrated step is off by one
STEPS=${STEPS:-100}                  # RL steps for each of GRPO and TARPO
GROUP_SIZE=${GROUP_SIZE:-8}          # completions per prompt (G)
BATCH=${BATCH:-64}                   # completions per RL step (8 prompts x G)
LR=${LR:-1e-3}                       # LoRA learning rate
ROUTER_LR=${ROUTER_LR:-5e-3}         # router learning rate
LR_SCHEDULE=${LR_SCHEDULE:-constant_with_warmup}  # paper: cosine; the short demo keeps the LR constant
TEMPERATURE=${TEMPERATURE:-0.5}      # sampling temperature, training and evaluation (paper: 0.5)
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-32}
EVAL_QUESTIONS=${EVAL_QUESTIONS:-300}
EVAL_N=${EVAL_N:-8}                  # samples per test question: pass@1 and pass@EVAL_N
ALGOS=${ALGOS:-grpo,tarpo}
ENGINE=${ENGINE:-auto}               # rollout engine of the RL runs: auto (decided by cost) | eager | compiled
WORKERS=${WORKERS:-0}                # processes training/evaluating the systems side by side (0: one per core)
CACHE_DIR=${CACHE_DIR:-runs/cache}
OUT=${OUT:-runs/demo-$(date +%Y%m%d-%H%M%S)-seed$SEED}

bash scripts/setup_env.sh run   # the demo needs no test tools
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m tarpo.demo --out "$OUT" --cache-dir "$CACHE_DIR" --seed "$SEED" --warm-seed "$WARM_SEED" \
  --sft-steps "$SFT_STEPS" --sft-batch "$SFT_BATCH" --sft-noise "$SFT_NOISE" --steps "$STEPS" --group-size "$GROUP_SIZE" \
  --batch "$BATCH" --lr "$LR" --router-lr "$ROUTER_LR" --lr-schedule "$LR_SCHEDULE" --temperature "$TEMPERATURE" \
  --max-new-tokens "$MAX_NEW_TOKENS" --eval-questions "$EVAL_QUESTIONS" --eval-n "$EVAL_N" --algos "$ALGOS" \
  --engine "$ENGINE" --workers "$WORKERS"
