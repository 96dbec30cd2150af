#!/usr/bin/env bash
# The common tail of run_gsm8k.sh / run_math.sh / run_dapo.sh: run tarpo.launch for the
# data set given as $1 with the variables the launcher exported. The Python is $PYTHON,
# else the project's .venv (made by scripts/setup_env.sh), else `python`. With NUM_PROCESSES > 1
# or an ACCELERATE_CONFIG, tarpo.launch checks the settings here, then starts training (and
# EVAL=1's evaluation) through `$PYTHON -m accelerate.commands.launch`; DRY_RUN=1 shows the command.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
exec "$PYTHON" -m tarpo.launch "$1"
