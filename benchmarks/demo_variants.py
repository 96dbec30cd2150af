"""TARPO in the CPU demo's setting with and without the rollout/training mismatch correction and with
exploration inside the soft mode (docs/algorithm.md §8), several seeds each; the README quotes its table.

    python benchmarks/demo_variants.py --seeds 0,1,2 --out runs/variants

Each seed runs ``tarpo.runs.demo`` twice from the same cached warm start: once with ALGOs ``tarpo`` and
``tarpo_gumbel`` (no correction), once with ``tarpo`` under ``--is-correction`` (default
``sequence_mask``, TRL's default mode). Every other setting is the demo's default. Prints, per variant,
pass@1 and pass@k over the seeds (mean, min, max) and each seed's value, and writes them to
``<out>/variants.json`` and ``<out>/variants.md``. A finished seed folder (its ``summary.json``) is
reused, so a killed run resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from tarpo.atomic_files import write_json_atomic, write_text_atomic


def run_demo(out: str, seed: int, algos: str, extra: list[str]) -> dict:
    path = os.path.join(out, "summary.json")
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-m", "tarpo.runs.demo", "--out", out, "--seed", str(seed), "--algos", algos,
                        *extra], check=True)
    with open(path) as f:
        return json.load(f)


def spread(values: list[float]) -> str:
    return (f"{statistics.mean(values):.3f} [{min(values):.3f}, {max(values):.3f}] ("
            + ", ".join(f"{v:.3f}" for v in values) + ")")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default=os.path.join("runs", "variants"))
    ap.add_argument("--is-correction", default="sequence_mask")
    args, demo_args = ap.parse_known_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    variants = {"CoT (warm start)": [], "TARPO": [], "TARPO + IS " + args.is_correction: [], "TARPO w/ Gumbel": []}
    for seed in seeds:
        plain = run_demo(os.path.join(args.out, f"plain-seed{seed}"), seed, "tarpo,tarpo_gumbel", demo_args)
        corrected = run_demo(os.path.join(args.out, f"is-seed{seed}"), seed, "tarpo",
                             ["--is-correction", args.is_correction, *demo_args])
        for name, summary in zip(variants, (plain["cot"], plain["tarpo"], corrected["tarpo"], plain["tarpo_gumbel"])):
            summary["seed"] = seed
            variants[name].append(summary)
    k = variants["TARPO"][0]["k"]
    lines = [f"| system | pass@1: mean [min, max] (each seed) | pass@{k}: mean [min, max] (each seed) | soft ratio |",
             "|---|---|---|---|"]
    for name, runs in variants.items():
        lines.append(f"| {name} | {spread([r['pass@1'] for r in runs])} | {spread([r['pass@k'] for r in runs])} | "
                     f"{statistics.mean(r['soft_ratio'] for r in runs):.3f} |")
    table = "\n".join(lines)
    print(table)
    write_text_atomic(os.path.join(args.out, "variants.md"), table + "\n")
    write_json_atomic(os.path.join(args.out, "variants.json"), {"seeds": seeds, "variants": variants})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
