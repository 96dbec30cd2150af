"""Math answers graded per second with math-verify in 1 and 2 worker processes.

Completions are MATH-500's reference answers (from a local MATH-500 folder given as
``--data``, else a synthetic mix of fractions, radicals and intervals) written after the
answer tag; each answer is graded against its gold, so every check does a full parse + verify.

    python benchmarks/bench_grading.py [--data path/to/math500] [--n 500] [--timeout 10]
"""

from __future__ import annotations

import argparse
import os
import time

from tarpo.tasks.graders import grade_batch
from tarpo.tasks.registry import load_task
from tarpo.tasks.workers import shared_pool

def examples(n: int, data: str | None):
    if data and os.path.isdir(data):
        ds = list(load_task("math500", data, "test"))
        source = "MATH-500 reference answers"
    else:
        golds = ["\\frac{3}{4}", "2\\sqrt{5}", "(-\\infty, 2) \\cup (3, \\infty)", "17", "\\pi/3"]
        ds = [{"gold": golds[i % 5], "task": "math500"} for i in range(n)]
        source = "synthetic answers"
    ds = (ds * (n // len(ds) + 1))[:n]
    return [f"reasoning... #### {e['gold']}" for e in ds], ds, source


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--data", help="a local MATH-500 folder (test.jsonl); default: synthetic answers")
    args = ap.parse_args()
    completions, exs, source = examples(args.n, args.data)
    rates = {}
    for workers in (1, 2):
        shared_pool(workers, args.timeout)  # start the workers before timing
        grade_batch(completions[:10], exs[:10], "math_verify", workers=workers, timeout=args.timeout)
        start = time.perf_counter()
        grades = grade_batch(completions, exs, "math_verify", workers=workers, timeout=args.timeout)
        rates[workers] = len(grades) / (time.perf_counter() - start)
        correct = sum(g.score for g in grades)
        print(f"workers={workers}: {rates[workers]:.1f} answers/s ({int(correct)}/{len(grades)} correct, "
              f"{sum(g.timed_out for g in grades)} timeouts)")
    print(f"{args.n} {source}, {os.cpu_count()} cores: 1 worker {rates[1]:.1f}/s, 2 workers {rates[2]:.1f}/s, "
          f"speed-up {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
