#!/usr/bin/env bash
# The CPU demo: warm-start a tiny model on synthetic arithmetic, train it with GRPO and
# with TARPO, evaluate CoT / GRPO / TARPO and print a table. Needs only Python >= 3.11:
# the environment is set up from the project's files on first use. Offline throughout.
# Any setting listed below can be set in the environment: STEPS=100 bash run_demo.sh
# The last line printed is the path of the run's summary.json.
set -euo pipefail
cd "$(dirname "$0")"

# The demo's settings, each passed as its flag when set (STEPS=100 -> --steps 100); the ones left unset keep
# the demo's own defaults, which `.venv/bin/python -m tarpo.runs.demo --help` lists with what each means.
flags=()
for name in SEED WARM_SEED SFT_STEPS SFT_BATCH SFT_NOISE STEPS GROUP_SIZE BATCH LR ROUTER_LR LR_SCHEDULE \
            TEMPERATURE MAX_NEW_TOKENS EVAL_QUESTIONS EVAL_N ALGOS ENGINE WORKERS CACHE_DIR OUT; do
  if [ -n "${!name:-}" ]; then
    flag=${name,,}
    flags+=("--${flag//_/-}" "${!name}")
  fi
done

bash scripts/setup_env.sh run   # the demo needs no test tools
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m tarpo.runs.demo "${flags[@]}"
