"""``tarpo plot``: the paper's training curves from runs' metrics logs, several runs overlaid.

    tarpo plot runs/math-*-grpo-* runs/math-*-hrpo-* runs/math-*-tarpo-* --labels GRPO,HRPO,TARPO --out curves.png

Each run is a run folder (holding ``metrics.jsonl``) or a ``metrics.jsonl`` file. Four
panels over optimizer steps: training entropy, training units per completion (hard +
soft), training reward and soft ratio, each smoothed by a moving average (``--smooth``).
"""

from __future__ import annotations

import argparse
import os

from ..evaluation.plot import plot_runs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="run folders or metrics.jsonl files")
    p.add_argument("--labels", help="comma-separated legend labels (default: folder names)")
    p.add_argument("--smooth", type=int, default=10, help="moving-average window in steps")
    p.add_argument("--out", required=True, help="PNG file to write")


def run(args) -> int:
    labels = args.labels.split(",") if args.labels else [os.path.basename(os.path.normpath(r)) for r in args.runs]
    if len(labels) != len(args.runs):
        raise ValueError(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    if args.smooth < 1:
        raise ValueError("--smooth must be >= 1")
    print(plot_runs(args.runs, labels, args.out, args.smooth))
    return 0
