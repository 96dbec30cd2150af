"""Evaluation metrics as pure functions: pass@k, maj@k, and the SD and 95% CI of question-level
accuracy (the paper's metrics: Section 4, Metrics, and Appendix C, Additional Experimental Statistics).

    >>> pass_at_k(32, 0, 8), pass_at_k(32, 32, 8), round(pass_at_k(32, 1, 8), 4)
    (0.0, 1.0, 0.25)
    >>> pass_at_k(4, 1, 4)
    1.0
"""

from __future__ import annotations

import math
from collections import Counter


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) for c correct of n samples (k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(counts: list[tuple[int, int]], k: int) -> float:
    """Mean over questions of pass@k, each question given as ``(n, c)``."""
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def majority_vote(canonical: list[str], correct: list[bool]) -> bool:
    """Whether the most frequent non-empty canonical answer is correct.

    Ties go to the answer that appeared first; empty answers never win (all empty: False).

    >>> majority_vote(["1/2", "3", "1/2", ""], [True, False, True, False])
    True
    >>> majority_vote(["3", "1/2", "1/2", "3"], [False, True, True, False])  # tie: "3" came first
    False
    """
    counts = Counter(a for a in canonical if a)
    if not counts:
        return False
    best = max(counts.values())
    winner = next(a for a in canonical if a and counts[a] == best)
    return correct[canonical.index(winner)]


def ci95_half_width(sd: float, n: int) -> float:
    """Half-width 1.96 SD / sqrt(n) of the 95% normal-approximation CI of a mean over n questions.

    >>> half = ci95_half_width(0.344, 1319)  # Qwen2.5-1.5B CoT on GSM8K, 60.89: the paper's [59.03, 62.74]
    >>> round(100 * (0.6089 - half), 2), round(100 * (0.6089 + half), 2)
    (59.03, 62.75)
    """
    return 1.96 * sd / math.sqrt(n)


def mean_sd_ci(values: list[float]) -> tuple[float, float, float]:
    """Mean, sample SD (n-1) and the 95% normal-approximation CI half-width 1.96 SD / sqrt(n)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, sd, ci95_half_width(sd, n)
