"""``tarpo plot``: the paper's training curves from runs' metrics logs, several runs overlaid.

    tarpo plot runs/math-*-grpo-* runs/math-*-hrpo-* runs/math-*-tarpo-* --labels GRPO,HRPO,TARPO --out curves.png

Each run is a run folder (holding ``metrics.jsonl``) or a ``metrics.jsonl`` file. Four
panels over optimizer steps: training entropy, training units per completion (hard +
soft), training reward and soft ratio, each smoothed by a moving average (``--smooth``).
"""

from __future__ import annotations

import argparse
import json
import os

PANELS = [("entropy", "training entropy (nats)"), ("completions/mean_units", "training units (hard + soft)"),
          ("reward", "training reward"), ("soft_ratio", "soft ratio")]


def read_log(path: str) -> list[dict]:
    """Training log records (those with a reward) of a run folder or metrics.jsonl file, one per
    step in step order: of a step logged more than once (a resumed run trains the steps after its
    checkpoint again; logs written before issue #12 keep both), the latest. A line that is not a
    JSON record (cut by a kill) is skipped."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no metrics log (metrics.jsonl) there")
    latest = {}
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "reward" in record and "step" in record:
                latest[record["step"]] = record
    rows = [latest[step] for step in sorted(latest)]
    if not rows:
        raise ValueError(f"{path}: no training steps logged")
    return rows


def moving_average(values: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each point (fewer at the start).

    >>> moving_average([1, 2, 3, 4], 2)
    [1.0, 1.5, 2.5, 3.5]
    """
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_runs(runs: list[str], labels: list[str], out: str, smooth: int = 10) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = [read_log(r) for r in runs]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4))
    for ax, (key, title) in zip(axes, PANELS):
        for rows, label in zip(logs, labels):
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot([s for s, _ in pts], moving_average([v for _, v in pts], smooth), label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, out)
    return out


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
