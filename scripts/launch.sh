#!/usr/bin/env bash
# The one body of run_gsm8k.sh / run_math.sh / run_dapo.sh: every launcher variable, then tarpo.runs.launch for
# the data set given as $1. A launcher (or the environment) sets any of these variables; each launcher writes out
# the paper's values of the ones the paper fixes (its generated block); an empty value means the paper's value for
# the data set and MODEL (docs/algorithm.md §5; the values live in tarpo/runs/presets.py and TarpoConfig; the
# comments below give what a variable means and takes, not its default). DRY_RUN=1 prints the resolved configuration, every default included (its last line is one JSON
# object), and exits. A variable the launcher does not know would be ignored, so one that looks meant for it is
# refused, naming the variable meant (tarpo.runs.launch_variables.misspelt): a variable's name in another case or the
# TarpoConfig field it sets (IMPORTANCE_SAMPLING_LEVEL: IS_LEVEL), a near spelling (difflib ratio >= 0.85:
# LAMDA), or a name that begins ACTION_, ENTROPY_, EPSILON_, GUMBEL_, HRPO_, LORA_, NOISE_, ROUTER_ or SOFT_
# (GUMBEL_TAU). Other programs' variables (PATH, CUDA_VISIBLE_DEVICES, WANDB_*, MASTER_PORT, ...) are left
# alone; `env -u NAME bash run_math.sh` keeps one out of the run. The Python is $PYTHON, else the active
# environment's, else the project's .venv (made by scripts/setup_env.sh), else `python`. With NUM_PROCESSES > 1 or
# an ACCELERATE_CONFIG, tarpo.runs.launch checks the settings here, then starts training (and EVAL=1's evaluation) through
# `$PYTHON -m accelerate.commands.launch`; DRY_RUN=1 shows the command.
set -euo pipefail
set -a
MODEL=${MODEL:-}                   # qwen2.5-1.5b | qwen2.5-3b | qwen2.5-7b | llama3.1-8b | qwen2.5-14b | qwen2.5-32b
                                   # | smollm2-135m | hub id | local folder | .gguf file
ALGO=${ALGO:-}                     # tarpo | grpo | grpo_pure_latent | grpo_entropy | hrpo | soft_tokens | tarpo_gumbel
DATA_PATH=${DATA_PATH:-}           # local training data (file or folder); empty: the hub
OUT_DIR=${OUT_DIR:-}               # the run folder is OUT_DIR/<name encoding the key settings>
RUN_NAME=${RUN_NAME:-}             # the run folder's name instead of the one encoding the key settings
SEED=${SEED:-}
GROUP_SIZE=${GROUP_SIZE:-}         # G
BATCH=${BATCH:-}                   # completions per optimizer step (all processes together)
MICRO_BATCH=${MICRO_BATCH:-}       # completions per forward/backward (a divisor of BATCH/NUM_PROCESSES); empty: the
                                   # largest that the memory plan fits on the GPU (docs/memory-plan.md)
LR=${LR:-}                         # LoRA learning rate
ROUTER_LR=${ROUTER_LR:-}
HRPO_LR=${HRPO_LR:-}               # ALGO=hrpo: learning rate of the gate's W_r, W_i
HRPO_LAMBDA_LR=${HRPO_LAMBDA_LR:-} # ALGO=hrpo: learning rate of its Lambda
HRPO_MIXTURE=${HRPO_MIXTURE:-}     # ALGO=hrpo: full (HRPO's (p.E)/|p|) | top_k (top-k mixture scaled to |E(v)|)
BETA=${BETA:-}                     # token KL weight
ALPHA=${ALPHA:-}                   # action KL weight
LAMBDA=${LAMBDA:-}                 # router policy-gradient weight
ACTION_BIAS=${ACTION_BIAS:-}       # router bias b0, e.g. 2.2,0
ACTION_TEMPERATURE=${ACTION_TEMPERATURE:-}
TEMPERATURE=${TEMPERATURE:-}       # sampling temperature
TOP_K=${TOP_K:-}                   # token filter, 0 = off (the authors' generate() used 50)
TOP_P=${TOP_P:-}                   # token filter, 1 = off
SOFT_TOP_K=${SOFT_TOP_K:-}
ENTROPY_THRESHOLD=${ENTROPY_THRESHOLD:-}  # ALGO=grpo_entropy
ENTROPY_TEMPERATURE=${ENTROPY_TEMPERATURE:-}  # ALGO=grpo_entropy: entropy of softmax(z/this)
ENTROPY_SOFT_WHEN=${ENTROPY_SOFT_WHEN:-}  # ALGO=grpo_entropy: high (soft above the threshold) | low (below)
NOISE_SCALE=${NOISE_SCALE:-}       # ALGO=soft_tokens: noise std / rms(E)
GUMBEL_TEMPERATURE=${GUMBEL_TEMPERATURE:-}  # ALGO=tarpo_gumbel: tau_g of the soft steps' Gumbel-softmax weights
LOSS_TYPE=${LOSS_TYPE:-}           # grpo (the paper) | dapo | dr_grpo | bnpo | cispo | sapo | luspo | vespo (docs/algorithm.md §8)
SCALE_REWARDS=${SCALE_REWARDS:-}   # group | batch | none
IS_LEVEL=${IS_LEVEL:-}             # clipped ratio per step: token | sequence (GSPO)
MASK_TRUNCATED=${MASK_TRUNCATED:-} # 1: completions cut at MAX_COMPLETION_LENGTH stay out of the loss
EPSILON=${EPSILON:-}               # clip range of the ratio
EPSILON_HIGH=${EPSILON_HIGH:-}     # upper clip range (clip-higher; default = EPSILON); LOSS_TYPE=cispo: the ratio's bound (ScaleRL: 5)
SAPO_TEMPERATURE_POS=${SAPO_TEMPERATURE_POS:-}  # LOSS_TYPE=sapo: tau of the gate where A > 0
SAPO_TEMPERATURE_NEG=${SAPO_TEMPERATURE_NEG:-}  # LOSS_TYPE=sapo: tau of the gate where A <= 0
TOP_ENTROPY_QUANTILE=${TOP_ENTROPY_QUANTILE:-}  # the token term only at this top fraction of the steps by entropy; 1 = all (Beyond the 80/20 Rule: 0.2)
IS_CORRECTION=${IS_CORRECTION:-}   # rollout/training mismatch: none | token_truncate | token_mask | sequence_truncate | sequence_mask
IS_CLIP_MIN=${IS_CLIP_MIN:-}       # lower bound of the importance ratio; none: no bound
IS_CLIP_MAX=${IS_CLIP_MAX:-}       # upper bound of the importance ratio; none: no bound
LORA_R=${LORA_R:-}
LORA_ALPHA=${LORA_ALPHA:-}
LORA_TARGETS=${LORA_TARGETS:-}     # paper (q,k,v,o) | all-linear (+ gate,up,down: the released scripts) | names
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-}
MAX_COMPLETION_LENGTH=${MAX_COMPLETION_LENGTH:-}
WEIGHT_DECAY=${WEIGHT_DECAY:-}
MAX_GRAD_NORM=${MAX_GRAD_NORM:-}
WARMUP=${WARMUP:-}                 # warm-up: a fraction of the steps if < 1
LR_SCHEDULE=${LR_SCHEDULE:-}
EPOCHS=${EPOCHS:-}
MAX_STEPS=${MAX_STEPS:-}           # >= 1: that many optimizer steps instead of EPOCHS (empty: EPOCHS)
SAVE_STEPS=${SAVE_STEPS:-}         # >= 1: a checkpoint every N optimizer steps
SAVE_ON_SIGNALS=${SAVE_ON_SIGNALS:-}  # signals that stop the run after the step in flight with a checkpoint, exit
                                   # status 75 (TERM,USR1; none: off); a re-run resumes from it
MAX_NONFINITE_STEPS=${MAX_NONFINITE_STEPS:-}  # a step with a NaN/inf loss or gradient is skipped; this many in a row stop
REPORT_TO=${REPORT_TO:-}           # where the logged metrics go besides metrics.jsonl: none | tensorboard | wandb | any
                                   # integration of transformers' (comma-separated: several)
TIME_SCORING=${TIME_SCORING:-}     # 1: log timing/scoring_s, each training forward's seconds (synchronises the GPU)
OPTIM=${OPTIM:-}                   # optimizer, a name of transformers' (without CUDA or bitsandbytes, see TarpoConfig.optim)
BF16=${BF16:-}                     # 1: bfloat16 weights and compute; 0: float32
GRAD_CHECKPOINTING=${GRAD_CHECKPOINTING:-}  # 1: recompute activations in the backward pass
TRAIN_LIMIT=${TRAIN_LIMIT:-}       # first N training questions (quick trials)
EVAL=${EVAL:-}                     # 1: evaluate the trained system after training
EVAL_N=${EVAL_N:-}                 # samples per question
EVAL_LIMIT=${EVAL_LIMIT:-}         # first N questions per benchmark
EVAL_DATA_DIR=${EVAL_DATA_DIR:-}   # local benchmark folders (<task>/); empty: the hub
DRY_RUN=${DRY_RUN:-}               # 1: print the resolved configuration and exit
ENGINE=${ENGINE:-}                 # rollout engine: auto (compiled on CUDA, either backend; eager on the CPU) | eager (Unsloth's decode on unsloth) | compiled
DECODE_MERGE=${DECODE_MERGE:-}     # compiled engine's decode weights: auto (the memory plan's) | all (every LoRA merged into
                                   # a copy of what carries it) | attention (q|k|v and o's only) | none (the adapter)
BACKEND=${BACKEND:-}               # auto: Unsloth (tarpo.patches) on CUDA where scripts/install_gpu.sh installed it; hf: transformers + PEFT
NUM_PROCESSES=${NUM_PROCESSES:-}   # > 1: that many processes (one per GPU) under accelerate launch; empty: 1,
                                   # or ACCELERATE_CONFIG's num_processes
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-}  # accelerate config file; configs/fsdp2.yaml shards the model (FSDP2); empty: DDP
NUM_MACHINES=${NUM_MACHINES:-}     # > 1: the run spans that many machines (NUM_PROCESSES counts all their processes)
MACHINE_RANK=${MACHINE_RANK:-}     # this machine's rank, 0 .. NUM_MACHINES-1 (0: the main one)
MAIN_PROCESS_IP=${MAIN_PROCESS_IP:-}      # the address of the machine with MACHINE_RANK=0
MAIN_PROCESS_PORT=${MAIN_PROCESS_PORT:-}  # its port for the process group; empty: accelerate's
CPU_MAX_HOURS=${CPU_MAX_HOURS:-}     # no CUDA: the run starts after a printed time estimate, refused past this many hours
set +a
cd "$(dirname "$0")/.."
# The Python: $PYTHON, else the active environment's (a venv's, then a conda environment's other than base, which
# conda activates in every shell), else the project's .venv, else `python`; the run's first line names it and why
# (tarpo.runs.launch_environment).
if [ -n "${PYTHON:-}" ]; then
  TARPO_PYTHON_FROM="PYTHON"
elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  PYTHON="$VIRTUAL_ENV/bin/python"; TARPO_PYTHON_FROM="the active environment, $VIRTUAL_ENV"
elif [ -n "${CONDA_PREFIX:-}" ] && [ "${CONDA_DEFAULT_ENV:-base}" != base ] && [ -x "$CONDA_PREFIX/bin/python" ]; then
  PYTHON="$CONDA_PREFIX/bin/python"; TARPO_PYTHON_FROM="the active conda environment, $CONDA_PREFIX"
elif [ -x .venv/bin/python ]; then
  PYTHON=.venv/bin/python; TARPO_PYTHON_FROM="the project's .venv: no environment is active (conda's base aside)"
else
  PYTHON=python; TARPO_PYTHON_FROM="python on PATH: no environment is active and there is no .venv"
fi
export TARPO_PYTHON_FROM
exec "$PYTHON" -m tarpo.runs.launch "$1"
