#!/usr/bin/env bash
# TARPO (or a baseline, ALGO) on MATH with one GPU (NUM_PROCESSES=N: N GPUs), then optionally the paper's
# evaluation (MATH with its MATH-500 subset, AMC23, OlympiadBench).
# Set any launcher variable below or in the environment:   BETA=0.01 bash run_math.sh
# Every variable and the values it takes are listed in scripts/launch.sh (shared by the three
# launchers); an empty value means the paper's value for MATH and MODEL. DRY_RUN=1 prints the resolved
# configuration, every default included (its last line is one JSON object), and exits.
set -euo pipefail
set -a
MODEL=${MODEL:-}   # a preset (listed in scripts/launch.sh), a hub id or a local folder
ALGO=${ALGO:-}     # tarpo, or a baseline (every one is listed in scripts/launch.sh)
EVAL=${EVAL:-}     # 1: evaluate the trained system after training
# e.g. BETA=0.01   LR=1e-6   MAX_STEPS=100   (any variable of scripts/launch.sh)
set +a
exec bash "$(dirname "$0")/scripts/launch.sh" math
