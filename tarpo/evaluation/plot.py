"""The paper's training curves: several runs' metrics logs overlaid, four panels over optimizer steps
(training entropy, units per completion, reward, soft ratio), each smoothed by a moving average.
The command: :mod:`tarpo.cli.plot`.
"""

from __future__ import annotations

import json
import os

from ..atomic_files import atomic_path

PANELS = [("entropy", "training entropy (nats)"), ("completions/mean_units", "training units (hard + soft)"),
          ("reward", "training reward"), ("soft_ratio", "soft ratio")]


def read_log(path: str) -> list[dict]:
    """Training log records (those with a reward) of a run folder or metrics.jsonl file, one per
    step in step order (the trainer's log keeps one record per step: a resumed run drops those of
    the steps it trains again, :class:`tarpo.training.callbacks.JsonlLogger`); a step logged twice
    is an error. A line that is not a JSON record (cut by a kill) is skipped."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no metrics log (metrics.jsonl) there")
    by_step = {}
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "reward" in record and "step" in record:
                if record["step"] in by_step:
                    raise ValueError(f"{path}: step {record['step']} is logged twice (a log of an earlier tarpo "
                                     "commit, or two runs in one file); this version reads one record per step")
                by_step[record["step"]] = record
    rows = [by_step[step] for step in sorted(by_step)]
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
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return out
