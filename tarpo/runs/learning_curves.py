"""The learning check's figures (:mod:`tarpo.runs.learning_check`): a run's reward curve and its rise, read from
the ``metrics.jsonl`` it has logged so far (:func:`summarize`; the rise that of the least-squares line,
:func:`fitted_rise`), and the table the check prints of its runs, with the evaluation before and after where there is
one (:func:`report`). A run learns when its fitted rise is over twice the rise's standard error.
"""

from __future__ import annotations

import json
import math
import os
import statistics

FIRST, LAST = 0.1, 0.2  # the shares of the steps whose mean reward is ``first`` and ``last``


def fitted_rise(values: list[float]) -> tuple[float, float | None]:
    """The least-squares line through ``values`` (one per step): its rise from the first step to the last (slope
    times ``len - 1``), and that rise's standard error (None under 3 values).

    Worked example: steps x = 0..3 and rewards y = 0, 0.2, 0.1, 0.3 give the slope
    sum((x - 1.5)(y - 0.15)) / sum((x - 1.5)^2) = 0.4 / 5 = 0.08, so a rise of 3 x 0.08 = 0.24; the residuals
    -0.03, 0.09, -0.09, 0.03 give the slope's standard error sqrt(0.018 / 2 / 5) = 0.0424, the rise's 0.127.

    >>> rise, se = fitted_rise([0.0, 0.2, 0.1, 0.3])
    >>> round(rise, 4), round(se, 4)
    (0.24, 0.1273)
    """
    n = len(values)
    if n < 2:
        return 0.0, None
    mx, my = (n - 1) / 2, sum(values) / n
    sxx = sum((x - mx) ** 2 for x in range(n))
    slope = sum((x - mx) * (y - my) for x, y in enumerate(values)) / sxx
    if n < 3:
        return slope * (n - 1), None
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in enumerate(values))
    return slope * (n - 1), math.sqrt(residual / (n - 2) / sxx) * (n - 1)


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize(run_dir: str) -> dict:
    """A run's learning figures from its ``metrics.jsonl`` (the steps logged so far; ``None`` where a figure
    needs more). ``curve``: the mean reward of each step; ``first`` / ``last``: the mean of the first 10% / the
    last 20% of the steps (steps 1-10 and 81-100 of 100); ``rise`` and ``rise_se``: :func:`fitted_rise` of the
    curve; ``learns``: ``rise`` over twice ``rise_se``. ``step_s``: the median step time after the first (which
    compiles); the soft ratio, the log-prob drift's mean and tails, and on CUDA the memory peaks."""
    path = os.path.join(run_dir, "metrics.jsonl")
    rows = []
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:  # a line being written
                    continue
                if isinstance(row, dict) and "reward" in row:
                    rows.append(row)
    curve = [r["reward"] for r in rows]
    n = len(curve)
    rise, se = fitted_rise(curve) if n else (None, None)

    def column(key):
        return [r[key] for r in rows if r.get(key) is not None]

    def peak(key):
        return max(column(key), default=None)
    times = column("timing/step_s")
    return {"steps": n, "curve": [round(c, 4) for c in curve],
            "first": _mean(curve[:max(1, round(FIRST * n))]) if n else None,
            "last": _mean(curve[-max(1, round(LAST * n)):]) if n else None,
            "rise": rise, "rise_se": se, "learns": None if se is None else rise > 2 * se,
            "step_s": statistics.median(times[1:]) if len(times) > 1 else (times[0] if times else None),
            "first_step_s": times[0] if times else None, "rollout_s": _mean(column("timing/rollout_s")[1:]),
            "soft_ratio": _mean(column("soft_ratio")), "router_p_soft": _mean(column("router/p_soft")),
            "logp_drift": _mean(column("logp_drift")),
            "logp_drift_p99": _mean(column("logp_drift_p99")), "logp_drift_max": peak("logp_drift_max"),
            "logp_drift_frac_over_0.1": _mean(column("logp_drift_frac_over_0.1")),
            "peak_gib": peak("memory/peak_gib"), "reserved_gib": peak("memory/peak_reserved_gib"),
            "rollout_peak_gib": peak("memory/rollout_peak_gib")}


def report(results: dict[str, dict], evaluation: dict | None = None) -> str:
    """A table of the runs' figures, then each reward curve as the means of tenths of the run; then the evaluation
    before and after, where there is one."""
    def f(v, digits=3):
        return "-" if v is None else f"{v:.{digits}f}"

    def g(v):
        return "-" if v is None else f"{v:.2g}"
    lines = ["| algo | steps | first | last | rise (± 2 se) | learns | step s (rollout s) | soft ratio "
             "| router p(soft) | drift mean / p99 / max |", "|---|---|---|---|---|---|---|---|---|---|"]
    for algo, s in results.items():
        band = "" if s["rise_se"] is None else f" ± {2 * s['rise_se']:.3f}"
        lines.append(f"| {algo} | {s['steps']} | {f(s['first'])} | {f(s['last'])} | {f(s['rise'])}{band} | "
                     f"{s['learns']} | {f(s['step_s'], 2)} ({f(s['rollout_s'], 2)}) | {f(s['soft_ratio'])} | "
                     f"{f(s.get('router_p_soft'))} | {g(s['logp_drift'])} / {g(s['logp_drift_p99'])} / "
                     f"{g(s['logp_drift_max'])} |")
    for algo, s in results.items():
        curve, size = s["curve"], max(1, len(s["curve"]) // 10)
        tenths = [sum(curve[i:i + size]) / len(curve[i:i + size]) for i in range(0, len(curve), size)]
        lines.append(f"{algo} reward, mean of each {size} steps: " + " ".join(f"{v:.3f}" for v in tenths))
    for name, e in (evaluation or {}).items():
        if "failed" in e:
            lines.append(f"evaluation {name} ({e['mode']}): {e['failed']}")
            continue
        above = "" if name == "base" else f", above the base's interval: {e.get('above_base_interval')}"
        lines.append(f"evaluation {name} ({e['mode']}): pass@1 {e['pass@1']:.3f} ± {e['ci95']:.3f}{above}")
    return "\n".join(lines)
