"""The learning check's figures (:mod:`tarpo.runs.learning_check`): a run's reward curve and its rise, read from
the ``metrics.jsonl`` it has logged so far (:func:`summarize`; the rise that of the least-squares line,
:func:`fitted_rise`), and the table the check prints of its runs, with the evaluation before and after where there is
one (:func:`report`). A run learns when its fitted rise is over twice the rise's standard error *widened for the
dependence of consecutive steps* (:func:`dependent_rise_se`): a step's policy is the last one's plus one update, so
its reward is not an independent draw, and the least-squares error alone calls a flat curve "learning" about twice
as often as it should (docs/paper-mini.md, "The statistics").
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


def lag1_autocorrelation(values: list[float]) -> float:
    """The lag-1 autocorrelation of ``values`` (``sum(v[t] v[t-1]) / sum(v[t]^2)``, values centred already), with
    the small-sample bias correction ``+ (1 + 4 rho) / n`` (Kendall's, for an AR(1) series) and clipped to
    [0, 0.9]: a negative estimate is taken as independence, never as a narrower interval.

    >>> lag1_autocorrelation([1.0, 1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0])  # raw 1/8, + (1 + 0.5) / 8
    0.3125
    >>> lag1_autocorrelation([1.0, -1.0] * 4)  # raw -7/8: clipped to 0
    0.0
    """
    n = len(values)
    denominator = sum(v * v for v in values)
    if n < 3 or denominator == 0:
        return 0.0
    rho = sum(a * b for a, b in zip(values[1:], values[:-1])) / denominator
    return min(max(rho + (1 + 4 * rho) / n, 0.0), 0.9)


def dependent_rise_se(values: list[float]) -> tuple[float, float | None, float]:
    """:func:`fitted_rise` with its standard error widened for lag-1 dependence: ``se * sqrt((1 + rho) / (1 -
    rho))``, ``rho`` the :func:`lag1_autocorrelation` of the line's residuals (the variance of a mean of an AR(1)
    series, the usual first-order correction). Returns ``(rise, widened se, rho)``.

    Why: on 30-step flat curves whose steps follow an AR(1) with rho 0.4 (the dependence measured on the real
    model's reward curves), ``rise > 2 se`` says "learns" for about 10% of them with the least-squares ``se``, 3-7%
    with this one (``tests/test_learning_curves.py``: 3% of its 400 seeded curves); on independent steps both stay
    near the one-sided 2.3%. The price is power: a true rise of 0.3 over 30 steps with noise 0.1 is found 88% of the
    time instead of 98%.

    Worked example: the curve 0, 0.2, 0.1, 0.3 of :func:`fitted_rise` has residuals -0.03, 0.09, -0.09, 0.03,
    whose raw lag-1 autocorrelation is (-0.0027 - 0.0081 - 0.0027) / 0.018 = -0.75, corrected -0.75 + (1 - 3) / 4
    = -1.25, clipped to 0: the se stays 0.1273.

    >>> rise, se, rho = dependent_rise_se([0.0, 0.2, 0.1, 0.3])
    >>> round(rise, 4), round(se, 4), rho
    (0.24, 0.1273, 0.0)
    """
    rise, se = fitted_rise(values)
    if se is None:
        return rise, None, 0.0
    n = len(values)
    mx, my = (n - 1) / 2, sum(values) / n
    slope = rise / (n - 1)
    rho = lag1_autocorrelation([y - my - slope * (x - mx) for x, y in enumerate(values)])
    return rise, se * math.sqrt((1 + rho) / (1 - rho)), rho


def learns(values: list[float]) -> bool | None:
    """The learning criterion: the fitted rise is over twice its dependence-widened standard error
    (:func:`dependent_rise_se`); None under 3 steps."""
    rise, se, _ = dependent_rise_se(values)
    return None if se is None else rise > 2 * se


def mean_present(values):
    """The mean of the values that are not None (None if there are none): a figure some runs or steps lack."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def median_after_first(times: list) -> float | None:
    """The typical time of a step: the median after the first (which compiles), so that a step during which the
    process was paused moves it no more than any other step; the first alone where there is no other."""
    return statistics.median(times[1:]) if len(times) > 1 else (times[0] if times else None)


def summarize(run_dir: str) -> dict:
    """A run's learning figures from its ``metrics.jsonl`` (the steps logged so far; ``None`` where a figure
    needs more). ``curve``: the mean reward of each step; ``first`` / ``last``: the mean of the first 10% / the
    last 20% of the steps (steps 1-10 and 81-100 of 100); ``rise``, ``rise_se`` and ``rise_rho``:
    :func:`dependent_rise_se` of the curve (``rise_se_ols`` the least-squares error before the widening);
    ``learns``: :func:`learns`. ``step_s`` and ``rollout_s``: :func:`median_after_first`; the soft ratio, the
    log-prob drift's mean, ``logp_drift_p99`` the mean over steps of each step's 99th percentile (not one
    percentile of all steps) and its largest value, and on CUDA the memory peaks."""
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
    rise, se, rho = dependent_rise_se(curve) if n else (None, None, None)

    def column(key):
        return [r[key] for r in rows if r.get(key) is not None]

    def peak(key):
        return max(column(key), default=None)
    times = column("timing/step_s")
    return {"steps": n, "curve": [round(c, 4) for c in curve],
            "first": mean_present(curve[:max(1, round(FIRST * n))]) if n else None,
            "last": mean_present(curve[-max(1, round(LAST * n)):]) if n else None,
            "rise": rise, "rise_se": se, "rise_rho": rho, "rise_se_ols": fitted_rise(curve)[1] if n else None,
            "learns": learns(curve) if n else None,
            "step_s": median_after_first(times),
            "first_step_s": times[0] if times else None, "rollout_s": median_after_first(column("timing/rollout_s")),
            "soft_ratio": mean_present(column("soft_ratio")), "router_p_soft": mean_present(column("router/p_soft")),
            "logp_drift": mean_present(column("logp_drift")),
            "logp_drift_p99": mean_present(column("logp_drift_p99")), "logp_drift_max": peak("logp_drift_max"),
            "logp_drift_frac_over_0.1": mean_present(column("logp_drift_frac_over_0.1")),
            "peak_gib": peak("memory/peak_gib"), "reserved_gib": peak("memory/peak_reserved_gib"),
            "rollout_peak_gib": peak("memory/rollout_peak_gib")}


def report(results: dict[str, dict], evaluation: dict | None = None) -> str:
    """A table of the runs' figures, then each reward curve as the means of tenths of the run; then the evaluation
    before and after, where there is one."""
    def f(v, digits=3):
        return "-" if v is None else f"{v:.{digits}f}"

    def g(v):
        return "-" if v is None else f"{v:.2g}"
    lines = ["| algo | steps | first | last | rise (± 2 se, widened for dependence) | learns | step s (rollout s) "
             "| soft ratio | router p(soft) | drift mean / step p99 (mean over steps) / max |",
             "|---|---|---|---|---|---|---|---|---|---|"]
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
