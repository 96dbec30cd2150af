#!/usr/bin/env bash
# The GPU check of the Unsloth path against the transformers path, in steps that each take well under
# 10 minutes, on a GPU machine that needs no internet access (it installs from the wheel kit; docs/gpu/README.md).
#   bash benchmarks/gpu_check.sh [STEP...]         # no STEP: all of them, in this order
#     install     the wheel kit (.whl/, benchmarks/fetch_gpu_wheels.sh) and the project into
#                 $SITE; import check (versions, GPU name, `import unsloth`, tarpo.patches' checks)
#     tests       test-patches test-hooks test-gpu: tests/test_{patches,hooks,gpu}.py, each in its own
#                 process (importing unsloth changes transformers process-wide)
#     rollout-hf rollout-compiled reference train-hf rollout-unsloth rollout-compiled-unsloth train-unsloth bandwidth
#                 one benchmark of benchmarks/gpu_bench.py each, in its own process
#     report      re-render REPORT from RESULTS only (every other step re-renders it too)
# Every step first installs into $SITE when that is missing or stale (nothing installed yet, a changed kit
# or project); the others then merge their result (with date, device, boot id) into RESULTS and
# re-render REPORT, both replaced atomically: the report always holds every step finished so far.
# Env: REPORT (docs/gpu/<UTC date>-<gpu>.md), RESULTS (REPORT with .json), WHEELS (.whl),
#   SHAPE (1.5b; 3b: the Qwen2.5-3B configuration of the decode-step measurement, docs/rollout-engines.md),
#   SITE (/tmp/tarpo-site; empty: use PYTHON's own environment, install nothing), PYTHON (python3),
#   BUDGET (seconds for the whole command; 560 where $OUT is set, else none: a step's process that
#   outlasts it is stopped and recorded as timed out), ALLOW_CPU=1 (no CUDA: a smoke run of the
#   plumbing, benchmarks at --tiny sizes, GPU tests skipped).
# Where OUT names a folder, REPORT, RESULTS and the steps' logs are copied there too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
case $PY in */*) PY=$(realpath -s "$PY");; esac  # the tests run from tests/
WHEELS=${WHEELS:-.whl}
SITE=${SITE-/tmp/tarpo-site}
BUDGET=${BUDGET:-$([ -n "${OUT:-}" ] && echo 560 || echo 0)}
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$LOGS"' EXIT
FAILED=()
die() { echo "gpu_check: $*" >&2; exit 1; }

DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) || true
export GPU_DEVICE=${DEVICE:-cpu}
REPORT=${REPORT:-docs/gpu/$(date -u +%F)-$(printf %s "$GPU_DEVICE" | tr -cs 'A-Za-z0-9._-' '-').md}
RESULTS=${RESULTS:-${REPORT%.md}.json}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  PYTHONUNBUFFERED=1 UNSLOTH_DISABLE_STATISTICS=1
if [ -n "$SITE" ]; then export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"; fi

# helper.py check OUT: the install step's import check; helper.py record RESULTS KEY RC SECONDS LOG [JSON]:
# merge a step's result (JSON, or what its log says) into RESULTS, atomically.
cat >"$LOGS/helper.py" <<'EOF'
import json, os, subprocess, sys, tempfile
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version

KIT = ("trl", "peft", "datasets", "dill", "multiprocess", "math-verify", "latex2sympy2_extended",
       "antlr4-python3-runtime", "bitsandbytes", "unsloth", "unsloth_zoo", "torchao", "cut_cross_entropy", "fsspec")
LEFT_OUT = ("tyro", "diffusers", "hf-transfer", "hf_transfer", "pydantic", "xformers", "msgspec", "structlog",
            "nest-asyncio", "nest_asyncio")  # benchmarks/gpu_wheels.md says why

def ver(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None

def where():
    try:
        boot_id = open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        boot_id = None
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": os.environ["GPU_DEVICE"],
            "boot_id": boot_id}

def write_atomic(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)

def check(out):
    import importlib.util
    import platform
    import torch
    cuda = torch.cuda.is_available()
    missing = [m for m in ("trl", "peft", "datasets", "math_verify", "bitsandbytes", "unsloth", "unsloth_zoo",
                           "tarpo") if importlib.util.find_spec(m) is None]
    if missing and (cuda or "tarpo" in missing):
        sys.exit(f"gpu_check: missing {missing}: put the kit of benchmarks/fetch_gpu_wheels.sh in .whl")
    import tarpo.training.trainer  # noqa: F401  TRL's own GRPOTrainer before unsloth, as tarpo does
    import tarpo.patches
    if "unsloth" not in missing:
        tarpo.patches.check_versions()
        tarpo.patches.check_source()
    if cuda:
        import unsloth  # noqa: F401  the whole import chain, on the GPU
    pip = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout
    kit = {n.lower().replace("_", "-") for n in KIT + ("tarpo",)}
    conflicts = [line for line in pip.splitlines() if line.split(" ")[0].lower().replace("_", "-") in kit
                 and not any(f" {n}," in line or f" {n} " in line for n in LEFT_OUT)]
    names = ("torch", "transformers", "accelerate", *KIT, "triton", "tarpo")
    entry = {**where(), "python": platform.python_version(), "torch": torch.__version__,
             "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name() if cuda else None,
             "versions": {n: ver(n) for n in names}, "pip_check": conflicts}
    print(json.dumps(entry, indent=1))
    write_atomic(out, entry)

def record(results, key, rc, seconds, log, result=None):
    rc, lines = int(rc), open(log, errors="replace").read().splitlines()
    if rc == 0 and result:
        entry = {**json.load(open(result)), "seconds": int(seconds)}
    else:
        entry = {**where(), "rc": rc, "seconds": int(seconds),
                 "summary": next((l.strip() for l in reversed(lines) if l.strip()), ""), "tail": lines[-25:]}
        if rc != 0:
            entry["error"] = {124: f"timed out after {seconds} s", 137: f"killed after {seconds} s",
                              200: "not started: the command's BUDGET was spent"}.get(rc, f"exit {rc}")
    merged = json.load(open(results)) if os.path.exists(results) else {}
    merged[key] = entry
    write_atomic(results, merged)

{"check": check, "record": record}[sys.argv[1]](*sys.argv[2:])
EOF

stamp() {  # what the installed site was built from: the kit and the project's sources
  { sha256sum "$WHEELS"/*.whl 2>/dev/null || true
    find setup.py requirements.txt tarpo patches -type f \( -name '*.py' -o -name '*.json' -o -name '*.txt' \) \
      -print0 | sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-16
}

install_site() {  # into $SITE.partial, then renamed: $SITE is complete or absent
  [ -n "$SITE" ] || return 0
  local want; want=$(stamp)
  [ "$(cat "$SITE/.stamp" 2>/dev/null)" != "$want" ] || return 0
  ls "$WHEELS"/*.whl >/dev/null 2>&1 \
    || die "no wheels in $WHEELS/: run benchmarks/fetch_gpu_wheels.sh where there is internet access and copy .whl here"
  if [ -f "$WHEELS/SHA256SUMS" ]; then
    (cd "$WHEELS" && sha256sum --quiet -c SHA256SUMS) || die "$WHEELS/ does not match its SHA256SUMS: fetch it again"
  fi
  echo "gpu_check: installing $WHEELS/*.whl and the project into $SITE"
  rm -rf "$SITE.partial"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE.partial" "$WHEELS"/*.whl \
    || die "installing the wheels in $WHEELS failed"
  rm -rf build  # setuptools' in-tree build folder would keep modules since deleted from the source
  "$PY" -m pip install -q --no-deps --no-build-isolation --no-compile --no-cache-dir --target "$SITE.partial" . \
    || die "installing the project failed"
  echo "$want" >"$SITE.partial/.stamp"
  rm -rf "$SITE" && mv "$SITE.partial" "$SITE"
}

CUDA= TINY=
need_cuda() {
  [ -z "$CUDA" ] || return 0
  CUDA=yes
  "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null && return 0
  [ "${ALLOW_CPU:-0}" = 1 ] \
    || die "no CUDA device for $PY (torch.cuda.is_available() is False); ALLOW_CPU=1 for a CPU smoke run"
  CUDA=no TINY=--tiny
}

T0=$SECONDS
run() {  # LOG CMD...: CMD with the time left in BUDGET, output to the terminal and LOG; sets RC and SECS
  local log=$1 t=0 start=$SECONDS; shift
  if [ "$BUDGET" -gt 0 ]; then
    t=$((BUDGET - (SECONDS - T0)))
    if [ "$t" -lt 30 ]; then
      echo "gpu_check: BUDGET=$BUDGET s is spent; run this step in another command" | tee "$log"
      RC=200 SECS=0  # helper.py: not started
      return
    fi
  fi
  set +e
  timeout -k 10 "$t" "$@" 2>&1 | tee "$log"
  RC=${PIPESTATUS[0]}
  set -e
  SECS=$((SECONDS - start))
}

record() {  # KEY LOG [RESULT_JSON]: after run
  "$PY" "$LOGS/helper.py" record "$RESULTS" "$1" "$RC" "$SECS" "$2" "${3:-}" || die "could not record $1 in $RESULTS"
  echo "gpu_check: $1: exit $RC after $SECS s, recorded in $RESULTS"
  "$PY" benchmarks/gpu_bench.py --render "$RESULTS" --report "$REPORT" >/dev/null \
    || { echo "gpu_check: could not render $REPORT" >&2; RC=1; }
  if [ "$RC" != 0 ]; then FAILED+=("$1"); fi
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp "$REPORT" "$RESULTS" "$2" "$OUT/"; fi
}

step() {
  case $1 in
    install)
      install_site; need_cuda
      run "$LOGS/install.log" "$PY" "$LOGS/helper.py" check "$LOGS/install.json"
      record install "$LOGS/install.log" "$LOGS/install.json"
      [ "$RC" = 0 ] || die "the import check failed (its output is above)";;
    tests) step test-patches; step test-hooks; step test-gpu;;
    test-patches|test-hooks|test-gpu)
      install_site; need_cuda
      local f="test_${1#test-}.py"
      run "$LOGS/$f.log" bash -c 'cd tests && exec "$0" -m pytest -q -p no:cacheprovider --rootdir=.. \
        -c ../pytest.ini -rs "$1"' "$PY" "$f"
      record "$f" "$LOGS/$f.log";;
    rollout-hf|rollout-compiled|reference|train-hf|rollout-unsloth|rollout-compiled-unsloth|train-unsloth|bandwidth)
      install_site; need_cuda
      rm -f "$LOGS/$1.json"
      run "$LOGS/$1.log" "$PY" benchmarks/gpu_bench.py --only "$1" --json "$LOGS/$1.json" --shape "${SHAPE:-1.5b}" $TINY
      record "$1" "$LOGS/$1.log" "$LOGS/$1.json";;
    report)
      install_site
      [ -f "$RESULTS" ] || die "no results file $RESULTS (set REPORT or RESULTS)"
      "$PY" benchmarks/gpu_bench.py --render "$RESULTS" --report "$REPORT" >/dev/null || die "could not render $REPORT"
      if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp "$REPORT" "$RESULTS" "$OUT/"; fi
      echo "gpu_check: $REPORT rendered from $RESULTS";;
    *) die "unknown step '$1': see the head of $0";;
  esac
}

[ $# -gt 0 ] || set -- install tests rollout-hf rollout-compiled reference train-hf rollout-unsloth rollout-compiled-unsloth train-unsloth bandwidth
for s in "$@"; do step "$s"; done
echo "gpu_check: report $REPORT, results $RESULTS${FAILED[*]:+; failed: ${FAILED[*]}}"
[ ${#FAILED[@]} -eq 0 ]
