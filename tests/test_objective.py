import math

import torch

from helpers import loss_of
from tarpo.training.advantages import group_advantages
from tarpo.training.divergences import k3, kl_divergence, two_class_kl
from tarpo.training.objective import LossSettings


def test_group_advantages_hand_values_and_zero_spread():
    a = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0, 2.0, 2.0, 2.0]), 4)
    std = math.sqrt(1 / 3)  # sample std of [1, 0, 1, 0]
    torch.testing.assert_close(a[:4], torch.tensor([0.5, -0.5, 0.5, -0.5]) / (std + 1e-4))
    # exact: a constant group: mean 2.0 exactly, so centred 0.0 and 0.0 / (std + eps) = 0.0
    assert torch.equal(a[4:], torch.zeros(4))
    assert torch.isfinite(a).all()


def test_k3_and_two_class_kl():
    p, q = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    torch.testing.assert_close(k3(p, q), torch.tensor([0.5 - math.log(0.5) - 1]))
    rho = torch.log(torch.tensor([[0.9, 0.1]]))
    ref = torch.log(torch.tensor([[0.99, 0.01]]))
    expected = 0.9 * math.log(0.9 / 0.99) + 0.1 * math.log(0.1 / 0.01)
    torch.testing.assert_close(two_class_kl(rho, ref), torch.tensor([expected]))


def test_kl_gradient_is_exactly_zero_where_the_policy_is_the_reference():
    """At initialisation the policy is the reference, bitwise. Autograd's gradient of
    sum p (logp - ref) reaches the logits as p - p * sum(p), about 1e-8 and not 0, and Adam turns
    that into full-size steps; kl_divergence's is exactly 0 there, and autograd's elsewhere."""
    torch.manual_seed(0)
    for V in (2, 50):  # the router's two actions, a vocabulary (token_kl="full")
        logits = torch.randn(64, V, requires_grad=True)
        logp = torch.log_softmax(logits, -1)
        ref = logp.detach().clone()
        kl = (two_class_kl if V == 2 else kl_divergence)(logp, ref)
        assert torch.equal(kl, torch.zeros(64))  # exact: ref is a copy of logp: every difference is 0.0
        grad = torch.autograd.grad(kl.sum(), logits)[0]
        # exact: differences of 0.0 give p * 0.0 (the property under test)
        assert torch.equal(grad, torch.zeros_like(grad)), (V, grad.abs().max())
        # elsewhere the value and, through the log-softmax, the gradient of the plain formula
        logits = torch.randn(5, 3, V, dtype=torch.float64, requires_grad=True)
        ref = torch.log_softmax(torch.randn(5, 3, V, dtype=torch.float64), -1).requires_grad_(True)
        weights = torch.randn(5, 3, dtype=torch.float64)
        ours, plain = (f(torch.log_softmax(logits, -1), ref) for f in (
            kl_divergence, lambda lp, r: (lp.exp() * (lp - r)).sum(-1)))
        torch.testing.assert_close(ours, plain, rtol=0, atol=1e-15)
        for a, b in zip(torch.autograd.grad((ours * weights).sum(), (logits, ref)),
                        torch.autograd.grad((plain * weights).sum(), (logits, ref))):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def example():
    """Two trajectories, T = 4 slots. Row 0: thinking, thinking(soft), answer, answer.
    Row 1: thinking, answer, then padding."""
    return dict(
        logp_tok=torch.tensor([[-1.0, -2.0, -0.5, -0.25], [-3.0, -1.5, 0.0, 0.0]]),
        logp_act=torch.tensor([[-0.1, -2.3, 0.0, 0.0], [-0.2, 0.0, 0.0, 0.0]]),
        p_hard=torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.95, 0.5, 0.5, 0.5]]),
        kl_tok=torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 9.0, 9.0]]),
        kl_act=torch.tensor([[0.01, 0.02, 5.0, 5.0], [0.03, 5.0, 5.0, 5.0]]),
        advantages=torch.tensor([1.0, -2.0]),
        completion_mask=torch.tensor([[True, True, True, True], [True, True, False, False]]),
        is_soft=torch.tensor([[False, True, False, False], [False, False, False, False]]),
        decided=torch.tensor([[True, True, False, False], [True, False, False, False]]),
    )


def test_loss_terms_by_hand():
    lam, beta, alpha = 0.1, 0.005, 1.0
    loss, terms = loss_of(LossSettings(lambda_act=lam, beta=beta, alpha=alpha), **example())
    # L_tok: soft step (row 0, t=1) excluded; T_0 = 4, T_1 = 2.
    l_tok0 = -(-1.0 - 0.5 - 0.25) / 4 * 1.0
    l_tok1 = -(-3.0 - 1.5) / 2 * -2.0
    # L_act: only thinking (decided) steps; answer steps excluded even with big values.
    l_act0 = -(-0.1 - 2.3) / 4 * 1.0
    l_act1 = -(-0.2) / 2 * -2.0
    # L_KL: delta = p_hard at thinking steps, 1 in the answer phase; kl_act only thinking.
    l_kl0 = (0.9 * 0.1 + 0.8 * 0.2 + 1 * 0.3 + 1 * 0.4 + alpha * (0.01 + 0.02)) / 4
    l_kl1 = (0.95 * 0.5 + 1 * 0.6 + alpha * 0.03) / 2
    expected = ((l_tok0 + lam * l_act0 + beta * l_kl0) + (l_tok1 + lam * l_act1 + beta * l_kl1)) / 2
    torch.testing.assert_close(loss, torch.tensor(expected))
    torch.testing.assert_close(terms["loss_tok"], torch.tensor((l_tok0 + l_tok1) / 2))
    torch.testing.assert_close(terms["loss_act"], torch.tensor((l_act0 + l_act1) / 2))
    torch.testing.assert_close(terms["loss_kl"], torch.tensor((l_kl0 + l_kl1) / 2))


def test_without_router_action_terms_vanish_and_delta_is_one():
    loss, terms = loss_of(LossSettings(lambda_act=0.1, beta=1.0, alpha=1.0, use_router=False), **example())
    # exact: without a router the action terms are sums of zeros
    assert terms["loss_act"] == 0 and terms["kl_act"] == 0
    kl0 = (0.1 + 0.2 + 0.3 + 0.4) / 4
    kl1 = (0.5 + 0.6) / 2
    torch.testing.assert_close(terms["loss_kl"], torch.tensor((kl0 + kl1) / 2))


def test_delta_gradient_switch():
    ex = example()
    ex["p_hard"] = ex["p_hard"].clone().requires_grad_(True)
    loss, _ = loss_of(LossSettings(lambda_act=0.0, beta=1.0, alpha=0.0, detach_kl_weight=True), **ex)
    assert not loss.requires_grad or torch.autograd.grad(loss, ex["p_hard"], allow_unused=True)[0] is None
    loss, _ = loss_of(LossSettings(lambda_act=0.0, beta=1.0, alpha=0.0, detach_kl_weight=False), **ex)
    g = torch.autograd.grad(loss, ex["p_hard"])[0]
    # d loss / d p_hard[0, 0] = kl_tok[0, 0] / T_0 / B = 0.1 / 4 / 2; answer steps get none.
    torch.testing.assert_close(g[0, 0], torch.tensor(0.1 / 4 / 2))
    assert g[0, 2] == 0 and g[1, 1] == 0  # exact: torch.where passes no gradient to answer steps


def test_zero_spread_group_gives_zero_gradient_not_nan():
    ex = example()
    ex["advantages"] = group_advantages(torch.tensor([1.0, 1.0]), 2)
    ex["logp_tok"] = ex["logp_tok"].clone().requires_grad_(True)
    loss, _ = loss_of(LossSettings(lambda_act=0.1, beta=0.0, alpha=1.0), **ex)
    g = torch.autograd.grad(loss, ex["logp_tok"])[0]
    # exact: a constant group's advantages are 0.0, every gradient term is times 0.0
    assert torch.isfinite(loss) and torch.equal(g, torch.zeros_like(g))


def test_clipped_ratio_form_equals_reinforce_gradient_on_policy():
    ex = example()
    ex["logp_tok"] = ex["logp_tok"].clone().requires_grad_(True)
    loss_a, _ = loss_of(LossSettings(lambda_act=0.0, beta=0.0, alpha=0.0), **ex)
    loss_b, _ = loss_of(LossSettings(lambda_act=0.0, beta=0.0, alpha=0.0), **ex,
                           old_logp_tok=ex["logp_tok"].detach())
    ga = torch.autograd.grad(loss_a, ex["logp_tok"])[0]
    gb = torch.autograd.grad(loss_b, ex["logp_tok"])[0]
    torch.testing.assert_close(ga, gb)


def test_a_row_no_reward_function_scored_is_left_out_of_its_group_as_in_trl():
    """TRL 1.15's "unscorable" rows (every reward function returned None, NaN here): out of the group's mean and
    standard deviation, advantage 0, out of the logged reward. Group [1, 0, None, 0]: mean 1/3, std 0.5774 over the
    three scored rows (before: the None taken as 0, advantages 1.5, -0.5, -0.5, -0.5)."""
    from tarpo.training.advantages import reward_advantages

    r = torch.tensor([[1.0], [0.0], [float("nan")], [0.0], [1.0], [1.0], [0.0], [0.0]])
    rewards, adv = reward_advantages(r, torch.ones(1), 4, 1e-4, "group")
    third = 1 / 3
    std = ((2 / 3) ** 2 / 2 + 2 * (1 / 3) ** 2 / 2) ** 0.5  # the sample std of 1, 0, 0: 0.5774
    expected = [(1 - third) / (std + 1e-4), -third / (std + 1e-4), 0.0, -third / (std + 1e-4)]
    torch.testing.assert_close(adv[:4], torch.tensor(expected))
    torch.testing.assert_close(adv[4:], reward_advantages(r[4:], torch.ones(1), 4, 1e-4, "group")[1])  # unchanged
    assert torch.isnan(rewards[2]) and math.isclose(torch.nanmean(rewards).item(), 3 / 7, rel_tol=1e-6)


def test_normalize_then_sum_leaves_an_unscored_row_out_as_trl_does():
    """GDPO's aggregation with a row no function scored: out of the batch's mean and std, advantage 0 (TRL 1.15's
    formulas, written out here as grpo_trainer.py has them)."""
    from trl.trainer.utils import nanstd

    from tarpo.training.advantages import reward_advantages

    nan = float("nan")
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0], [nan, nan], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    _, adv = reward_advantages(r, torch.ones(2), 2, 1e-4, "group", "normalize_then_sum")
    g = r.view(-1, 2, 2)
    summed = ((g - torch.nanmean(g, 1, keepdim=True)) / (nanstd(g, 1, keepdim=True) + 1e-4)).view(-1, 2).nansum(1)
    summed[2] = float("nan")  # TRL: rewards[unscorable_mask] = nan
    expected = torch.nan_to_num((summed - torch.nanmean(summed)) / (nanstd(summed) + 1e-4), nan=0.0)
    torch.testing.assert_close(adv, expected)
    assert adv[2] == 0 and adv.abs().sum() > 0  # exact: the unscored row is set to 0, not computed
