import math

import pytest
import torch

from tarpo.evaluation.sample import summarize
from tarpo.tasks.graders import canonical_answers
from tarpo.evaluation.metrics import majority_vote, mean_sd_ci, pass_at_k


@pytest.mark.parametrize("c", [0, 1, 16, 32])
@pytest.mark.parametrize("k", [1, 8, 32])
def test_pass_at_k_equals_the_closed_form(c, k):
    n = 32
    # probability that k draws without replacement from n samples (c correct) hit at least one
    closed = 1 - math.prod((n - c - i) / (n - i) for i in range(k))
    assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    assert pass_at_k(n, c, n) == float(c > 0)


def test_pass_at_k_hand_values():
    assert pass_at_k(32, 1, 8) == pytest.approx(8 / 32)
    assert pass_at_k(32, 16, 8) == pytest.approx(1 - math.comb(16, 8) / math.comb(32, 8))
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 8)


def test_majority_vote_groups_equivalent_math_answers():
    answers = ["1/2", "0.5", "\\frac{1}{2}", "3", "3", None]
    canonical = canonical_answers(answers, "math")
    assert canonical[0] == canonical[1] == canonical[2] != canonical[3]
    assert canonical[5] == ""
    # three equivalent answers out-vote two "3"s even though no two strings are equal
    assert majority_vote(canonical, [True, True, True, False, False, False])
    assert not majority_vote(canonical[3:], [False, False, True])  # "3" wins; the empty answer never does
    assert not majority_vote(["", "", ""], [True, True, True])


def test_majority_vote_breaks_ties_by_first_appearance():
    assert majority_vote(["2", "1", "1", "2"], [False, True, True, False]) is False
    assert majority_vote(["1", "2", "1", "2"], [True, False, True, False]) is True


def test_sd_is_the_sample_sd_and_ci_the_normal_approximation():
    values = [0.0, 0.25, 0.5, 1.0]
    mean, sd, ci = mean_sd_ci(values)
    assert mean == pytest.approx(0.4375)
    hand_sd = math.sqrt(sum((v - 0.4375) ** 2 for v in values) / 3)  # n - 1
    assert sd == pytest.approx(hand_sd)
    assert ci == pytest.approx(1.96 * hand_sd / 2)


def test_summarize_on_hand_records():
    recs = []
    for q, scores, answers in [("a", [1, 0, 1, 1], ["1", "2", "1", "1"]), ("b", [0, 0, 0, 1], ["5", "5", "", "7"])]:
        for i, (s, a) in enumerate(zip(scores, answers)):
            recs.append({"id": q, "sample": i, "score": float(s), "units": 10, "hard_tokens": 8, "soft_steps": 2,
                         "answer": a})
    m = summarize(recs, (1, 2, 4), [r["answer"] for r in recs])
    assert m["pass@1"] == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert m["pass@4"] == 1.0
    assert m["pass@2"] == pytest.approx(((1 - 0 / 6) + (1 - math.comb(3, 2) / math.comb(4, 2))) / 2)
    assert m["maj@4"] == 0.5 and m["maj@1"] == 0.5 and m["maj@2"] == 0.5  # b's vote: "5" (wrong)
    assert m["accuracy_sd"] == pytest.approx(math.sqrt(2 * 0.25 ** 2))
    assert m["soft_ratio"] == pytest.approx(0.2) and m["units"] == 10 and m["hard_tokens"] == 8
    assert m["questions"] == 2 and m["samples"] == 8


def test_the_clip_ratios_are_trls_including_the_rows_extremes_and_cispos():
    """``clip_ratio/*`` as TRL 1.15 logs them for a reused batch: the share of steps the clip holds (low: r < 1 - eps
    with A < 0; high: r > 1 + eps_high with A > 0), the smallest and the largest of the rows' shares (``low_min``,
    ``high_max``, before: not logged), and CISPO's ``cispo_clip_ratio`` (r > eps_high with A > 0, before: not
    logged). Rows: A = -1 with r = 0.5, 1.0 (one step of two low-clipped); A = +1 with r = 1.5, 0.7, 1.0 (one of
    three high-clipped)."""
    from types import SimpleNamespace

    from tarpo.training.metrics import loss_type_metrics
    from tarpo.training.objective import LossSettings

    mask = torch.tensor([[True, True, False], [True, True, True]])
    ratio = torch.tensor([[0.5, 1.0, 9.0], [1.5, 0.7, 1.0]])
    rollout = SimpleNamespace(completion_mask=mask, logp=torch.zeros(2, 3))
    adv = torch.tensor([-1.0, 1.0])
    common = dict(lambda_act=0.5, beta=0.0, alpha=1.0, use_router=False, off_policy=True, clip_eps=0.2)
    m = loss_type_metrics(LossSettings(**common, clip_eps_high=0.28), ratio.log(), rollout, adv)
    assert {k: round(v.item(), 4) for k, v in m.items()} == {
        "clip_ratio/low_mean": 0.2, "clip_ratio/high_mean": 0.2, "clip_ratio/region_mean": 0.4,
        "clip_ratio/low_min": 0.0, "clip_ratio/high_max": 0.3333}
    m = loss_type_metrics(LossSettings(**common, clip_eps_high=1.2, loss_type="cispo"), ratio.log(), rollout, adv)
    assert {k: round(v.item(), 4) for k, v in m.items()} == {"cispo_clip_ratio": 0.2}


def test_the_steps_drift_percentile_is_torchs_at_any_size():
    """metrics.nan_quantile (the step's logp_drift_p99) equals torch.nanquantile, and takes more than the 2**24
    values torch's refuses (a long evaluation's drifts; before: "quantile() input tensor is too large")."""
    import torch

    from tarpo.training.metrics import nan_quantile

    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 1000):
        v = torch.rand(n, generator=g)
        v[torch.rand(n, generator=g) < 0.3] = float("nan")
        assert nan_quantile(v, 0.99).item() == pytest.approx(torch.nanquantile(v, 0.99).item(), abs=1e-7)
    big = torch.linspace(0, 1, 2 ** 24 + 1)
    with pytest.raises(RuntimeError, match="too large"):
        torch.nanquantile(big, 0.99)
    assert nan_quantile(big, 0.99).item() == pytest.approx(0.99, abs=1e-6)
    assert torch.isnan(nan_quantile(torch.full((3,), float("nan")), 0.99))
