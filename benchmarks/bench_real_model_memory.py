"""A real-model launcher run's peak RAM on a CPU, at the learning check's settings and at other micro-batches.

Runs ``python -m tarpo.runs.launch arith_one`` on SmolLM2-135M-Instruct (``python -m tarpo.models.offline
smollm2-135m`` first) with the variables of the learning check (``tarpo.runs.learning_check.REAL_MODELS``), for
``--steps`` steps, once per ``--micro-batch`` value (``MICRO_BATCH``), one after another, and reports each run's
peak resident set size (the largest of the launcher's processes, ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a fresh
child) and its seconds. The runs' loss and gradient norm are the same at every micro-batch (the step's gradient is
the sum of the micro-batches'); only the memory and the time differ.

    python benchmarks/bench_real_model_memory.py                       # MICRO_BATCH 8 (the check's) and 32
    python benchmarks/bench_real_model_memory.py --micro-batch 4,8,16,32 --json out.json

Where the memory goes: docs/real-model.md, "Memory".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def measure(micro_batch: int, steps: int, threads: int) -> dict:
    """One launcher run of the check's settings in a child that reports its own children's peak RSS."""
    from tarpo.runs.learning_check import REAL_TASK, real_model_variables

    with tempfile.TemporaryDirectory() as out:
        variables = {**real_model_variables("smollm2-135m", out, "tarpo", steps), "MICRO_BATCH": str(micro_batch)}
        probe = ("import resource, subprocess, sys; "
                 f"rc = subprocess.call([sys.executable, '-m', 'tarpo.runs.launch', {REAL_TASK!r}], "
                 "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
                 "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        started = time.time()
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
                                   **variables})
        rc, kib = (int(v) for v in done.stdout.split())
    return {"micro_batch": micro_batch, "exit": rc, "peak_rss_gib": round(kib / 2**20, 3),
            "peak_rss_gb": round(kib * 1024 / 1e9, 3), "seconds": round(time.time() - started, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--micro-batch", default="8,32", help="comma-separated MICRO_BATCH values")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run (the check's: 1)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args(argv)
    results = []
    for mb in (int(v) for v in args.micro_batch.split(",")):
        results.append(r := measure(mb, args.steps, args.threads))
        print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "threads": args.threads, "runs": results}, f, indent=1)
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
