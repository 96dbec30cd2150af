#!/usr/bin/env bash
# TARPO (or a baseline, ALGO) on DAPO-Math-17k with one GPU (NUM_PROCESSES=N: N GPUs), then optionally the paper's
# evaluation (GPQA-Diamond, ARC-C, HumanEval).
# The variables below hold the paper's values for DAPO-Math-17k: edit one to change the run, or set it in the
# environment, which wins:   BETA=0.01 bash run_dapo.sh
# Every other variable (MAX_STEPS, ENGINE, IS_CORRECTION, ...) and the values each takes: scripts/launch.sh
# (shared by the three launchers). A run first prints each variable's value and where it came from; DRY_RUN=1
# prints that and the resolved configuration, every default included (its last line is one JSON object), and exits.
set -euo pipefail
set -a
# >>> the paper's settings for dapo (qwen2.5-3b's where they depend on the model), written by
# scripts/write_launchers.py from tarpo/runs/presets.py (digest 5dd4484e5b96)
TARPO_FROM_ENVIRONMENT=$(for v in MODEL ALGO ACTION_BIAS LR ROUTER_LR GROUP_SIZE BATCH MAX_PROMPT_LENGTH \
  MAX_COMPLETION_LENGTH TEMPERATURE SOFT_TOP_K ACTION_TEMPERATURE BETA ALPHA LAMBDA LORA_R \
  LORA_ALPHA LORA_TARGETS OPTIM LR_SCHEDULE WARMUP WEIGHT_DECAY MAX_GRAD_NORM EPOCHS BF16 \
  GRAD_CHECKPOINTING SEED SAVE_STEPS EVAL;
  do [ -n "${!v:-}" ] && printf '%s ' "$v"; done; true)
MODEL=${MODEL:-qwen2.5-3b}                   # a preset (scripts/launch.sh lists them), a hub id or a local folder
ALGO=${ALGO:-tarpo}                          # tarpo, or a baseline (scripts/launch.sh lists them)
case "${MODEL,,}" in  # the other models' b0 and learning rates (Table 6); qwen2.5-3b's below
  qwen2.5-1.5b|qwen2.5-7b|qwen2.5-14b|qwen2.5-32b) ACTION_BIAS=${ACTION_BIAS:-4.6,0} ;;
  qwen2.5-3b) ;;
  smollm2-135m) LR=${LR:-0.0005} ROUTER_LR=${ROUTER_LR:-0.0005} ;;
  llama3.1-8b) ACTION_BIAS=${ACTION_BIAS:-4.6,0} LR=${LR:-2e-06} ROUTER_LR=${ROUTER_LR:-2e-06} ;;
  *) ACTION_BIAS=${ACTION_BIAS:-4.6,0} ;;  # a model without a preset
esac
ACTION_BIAS=${ACTION_BIAS:-2.2,0}            # router bias b0 = hard,soft: soft ~10% of steps at 2.2, ~1% at 4.6 (Table 6)
LR=${LR:-5e-06}                              # LoRA learning rate (Table 6)
ROUTER_LR=${ROUTER_LR:-0.0001}               # router learning rate (Table 6)
GROUP_SIZE=${GROUP_SIZE:-8}                  # G, completions per prompt (Table 6)
BATCH=${BATCH:-64}                           # completions per optimizer step, all processes together (Table 6)
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-1024} # prompt tokens, cut from the left beyond (Table 7)
MAX_COMPLETION_LENGTH=${MAX_COMPLETION_LENGTH:-2048} # generated units, hard + soft (Table 7)
TEMPERATURE=${TEMPERATURE:-0.5}              # T_s: sampling temperature, log-probs taken at it (Table 6)
SOFT_TOP_K=${SOFT_TOP_K:-30}                 # k of the soft mixture of top-k token embeddings (Table 6)
ACTION_TEMPERATURE=${ACTION_TEMPERATURE:-1}  # tau_a of the router's softmax (Table 6)
BETA=${BETA:-0.005}                          # beta: weight of the KL term (Table 6)
ALPHA=${ALPHA:-1}                            # alpha: weight of the router's KL inside it (Table 6)
LAMBDA=${LAMBDA:-0.1}                        # lambda: weight of the router's term (Eq. 5; value: docs/algorithm.md §2)
LORA_R=${LORA_R:-32}                         # LoRA rank (Table 6)
LORA_ALPHA=${LORA_ALPHA:-64}                 # LoRA alpha (Table 6)
LORA_TARGETS=${LORA_TARGETS:-paper}          # paper: q, k, v, o (Table 6) | all-linear: + gate, up, down (released scripts)
OPTIM=${OPTIM:-paged_adamw_8bit}             # 8-bit AdamW, paged on a GPU (docs/algorithm.md §4)
LR_SCHEDULE=${LR_SCHEDULE:-cosine}           # learning-rate schedule (Table 6)
WARMUP=${WARMUP:-0.1}                        # linear warm-up, a fraction of the steps if < 1 (Table 6)
WEIGHT_DECAY=${WEIGHT_DECAY:-0.1}            # AdamW weight decay (Table 6)
MAX_GRAD_NORM=${MAX_GRAD_NORM:-0.1}          # gradient clipping norm (Table 6)
EPOCHS=${EPOCHS:-1}                          # epochs over the training set (Table 6)
BF16=${BF16:-1}                              # 1: bfloat16 weights and compute (a CPU run trains in fp32 unless set)
GRAD_CHECKPOINTING=${GRAD_CHECKPOINTING:-1}  # 1: recompute activations in the backward pass
SEED=${SEED:-0}                              # seed of sampling, LoRA init and data order
SAVE_STEPS=${SAVE_STEPS:-100}                # a checkpoint every N optimizer steps
EVAL=${EVAL:-0}                              # 1: evaluate after training on the data set's benchmarks (32 samples a question)
# <<< the paper's settings
set +a
exec bash "$(dirname "$0")/scripts/launch.sh" dapo
