"""The loss variants and the rollout/training mismatch correction (docs/algorithm.md §8): each loss type of
the registry (tarpo.losses.LOSSES) and the entropy masking against TRL 1.15's own ``GRPOTrainer._compute_loss``
for hard routing, CISPO and SAPO on a worked example by hand, the router term by hand, the importance ratios
by hand, and every correction the identity where the two sides agree."""

import math
import os
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer

from helpers import loss_of
from tarpo.losses import LOSS_TYPES
from tarpo.method_fields import IS_CORRECTIONS
from tarpo.training.advantages import group_advantages
from tarpo.training.divergences import k3
from tarpo.training.loss_inputs import high_entropy_mask, mismatch_weights
from tarpo.training.objective import LossSettings

B, T = 4, 5


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    mask[1, 2:] = False  # rows of different lengths
    return dict(logp=-torch.rand(B, T, generator=g) * 2, ref=-torch.rand(B, T, generator=g) * 2,
                old=-torch.rand(B, T, generator=g) * 2, adv=torch.randn(B, generator=g), mask=mask)


VESPO = dict(vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)  # TRL's defaults


def trl_loss(loss_type, level, logp, old, ref, adv, mask, beta, eps=0.2, eps_high=0.28, entropies=None,
             quantile=1.0, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, delta=None, bias_correction_kl=False,
             off_policy_mask_threshold=None, entropy_coef=0.0):
    """TRL's own ``_compute_loss`` on an object that has what it reads; the log-probs (and the entropies) stand
    in for the model's."""
    entropies = torch.zeros_like(logp) if entropies is None else entropies
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, entropies, None),
        aux_loss_enabled=False, top_entropy_quantile=quantile, off_policy_mask_threshold=off_policy_mask_threshold,
        importance_sampling_level=level, beta=beta, loss_type=loss_type, epsilon_low=eps, epsilon_high=eps_high,
        args=SimpleNamespace(delta=delta, use_bias_correction_kl=bias_correction_kl, steps_per_generation=1,
                             sapo_temperature_pos=sapo_temperature_pos, sapo_temperature_neg=sapo_temperature_neg,
                             **VESPO),
        use_vllm=False, vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=T, _entropy_bonus_enabled=entropy_coef != 0,
        entropy_coef=entropy_coef, use_adaptive_entropy=False,
        accelerator=SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x,
                                    gather_for_metrics=lambda x: x, pad_across_processes=lambda x, **k: x,
                                    sync_gradients=True),
        _metrics=defaultdict(lambda: defaultdict(list)))
    fake.get_high_entropy_mask = lambda *a: GRPOTrainer.get_high_entropy_mask(fake, *a)
    fake.get_off_policy_mask, fake.get_gamma_weights = GRPOTrainer.get_off_policy_mask, GRPOTrainer.get_gamma_weights
    inputs = dict(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                  completion_ids=torch.zeros(B, T, dtype=torch.long), completion_mask=mask.long(), advantages=adv,
                  num_items_in_batch=mask.sum().float(), ref_per_token_logps=ref)
    if old is not None:
        inputs["old_per_token_logps"] = old
    return GRPOTrainer._compute_loss(fake, None, inputs)


def ours(loss_type, level, logp, old, ref, adv, mask, beta, eps=0.2, eps_high=0.28, entropy_mask=None,
         entropy=None, rows_kept=None, **kw):
    zeros = torch.zeros_like(logp)
    settings = LossSettings(lambda_act=0.5, beta=beta, alpha=1.0, use_router=False, clip_eps=eps,
                            clip_eps_high=eps_high, loss_type=loss_type, level=level, max_completion_length=T, **kw)
    return loss_of(settings, logp_tok=logp, logp_act=zeros, p_hard=torch.ones_like(logp), kl_tok=k3(logp, ref),
                   kl_act=zeros, advantages=adv, completion_mask=mask, is_soft=torch.zeros_like(mask), decided=mask,
                   old_logp_tok=old, num_units=mask.sum().float(), entropy_mask=entropy_mask, entropy=entropy,
                   rows_kept=rows_kept)[0]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("off_policy", [False, True])
def test_each_loss_type_equals_trls_for_hard_routing(loss_type, level, off_policy):
    b = batch()
    logp_a, logp_b = b["logp"].clone().requires_grad_(True), b["logp"].clone().requires_grad_(True)
    old = b["old"] if off_policy else None
    a = ours(loss_type, level, logp_a, old, b["ref"], b["adv"], b["mask"], beta=0.04)
    t = trl_loss(loss_type, level, logp_b, old, b["ref"], b["adv"], b["mask"], beta=0.04)
    g_a, = torch.autograd.grad(a, logp_a)
    g_t, = torch.autograd.grad(t, logp_b)
    torch.testing.assert_close(g_a, g_t)
    assert g_a.abs().sum() > 0
    if off_policy or level == "sequence":  # on-policy per step ours is -logp A (the paper's form), TRL's -r A
        torch.testing.assert_close(a, t)


OPTIONS = {  # TRL's loss options: each as its GRPOConfig field and our LossSettings field
    "delta": (dict(delta=1.5), dict(delta=1.5)),
    "use_bias_correction_kl": (dict(bias_correction_kl=True), dict(bias_correction_kl=True)),
    "off_policy_mask_threshold": (dict(off_policy_mask_threshold=0.05), dict(off_policy_mask_threshold=0.05)),
    "entropy_coef": (dict(entropy_coef=0.1), dict(entropy_coef=0.1)),
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "luspo"])
def test_trls_loss_options_equal_trls_for_hard_routing(option, loss_type):
    """delta (two-sided clipping), use_bias_correction_kl, off_policy_mask_threshold (TRL's own mask function) and
    entropy_coef, off-policy (a reused batch), against TRL's _compute_loss: the same loss and gradient."""
    b = batch(5)
    trl_kw, our_kw = OPTIONS[option]
    # the log-probs and the entropy from the same logits, so that the gradient through each is compared
    logits = torch.randn(B, T, 6, generator=torch.Generator().manual_seed(7)) * 2
    targets = torch.randint(0, 6, (B, T), generator=torch.Generator().manual_seed(8))
    leaf_a, leaf_b = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)

    def from_logits(z):
        logp_all = z.log_softmax(-1)
        return logp_all.gather(-1, targets[..., None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)
    (logp_a, entropy_a), (logp_b, entropy_b) = from_logits(leaf_a), from_logits(leaf_b)
    entropy = entropy_a.detach()
    old = logp_a.detach() - (torch.rand(B, T, generator=torch.Generator().manual_seed(6)) - 0.5) * 2.4  # e^-1.2..1.2
    kept = None
    if option == "off_policy_mask_threshold":
        kept = GRPOTrainer.get_off_policy_mask(b["adv"][:, None], logp_a, old, b["mask"].float(), 0.05)
        assert 0 < kept.sum() < B  # some rows dropped, some kept
    a = ours(loss_type, "token", logp_a, old, b["ref"], b["adv"], b["mask"], beta=0.04, entropy=entropy_a,
             rows_kept=kept, **our_kw)
    t = trl_loss(loss_type, "token", logp_b, old, b["ref"], b["adv"], b["mask"], beta=0.04, entropies=entropy_b,
                 **trl_kw)
    torch.testing.assert_close(a, t)
    g_t = torch.autograd.grad(t, leaf_b)[0]
    torch.testing.assert_close(torch.autograd.grad(a, leaf_a)[0], g_t)
    plain_leaf = logits.clone().requires_grad_(True)
    logp_c, _ = from_logits(plain_leaf)
    plain = trl_loss(loss_type, "token", logp_c, old, b["ref"], b["adv"], b["mask"], beta=0.04, entropies=entropy)
    assert not torch.allclose(t, plain)  # the option changes the loss here: the comparison means something
    # ... and its gradient
    assert not torch.allclose(g_t, torch.autograd.grad(plain, plain_leaf)[0])


def test_clip_higher_clips_above_at_epsilon_high():
    b = batch()
    old = b["logp"] - 0.3  # r = e^0.3 = 1.35: inside 1 + 0.4, outside 1 + 0.2
    for eps_high, moves in ((0.4, True), (0.2, False)):
        logp = b["logp"].clone().requires_grad_(True)
        loss = ours("grpo", "token", logp, old, b["ref"], b["adv"].abs(), b["mask"], beta=0.0, eps_high=eps_high)
        g, = torch.autograd.grad(loss, logp)
        assert bool(g[b["mask"]].abs().min() > 0) == moves


def router_example():
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    decided = torch.tensor([[True, True, False, False], [True, False, False, False]])
    logp_act = torch.tensor([[-0.1, -2.0, -9.0, -9.0], [-0.5, -9.0, -9.0, -9.0]])
    return mask, decided, logp_act, torch.tensor([1.0, -2.0])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_the_router_term_is_aggregated_like_the_token_term(loss_type):
    mask, decided, logp_act, adv = router_example()
    zeros = torch.zeros(2, 4)
    _, terms = loss_of(LossSettings(lambda_act=1.0, beta=0.0, alpha=0.0, loss_type=loss_type,
                                       max_completion_length=8), logp_tok=zeros, logp_act=logp_act,
                          p_hard=torch.ones(2, 4), kl_tok=zeros, kl_act=zeros, advantages=adv, completion_mask=mask,
                          is_soft=torch.zeros_like(mask), decided=decided, num_units=3.0)
    row0, row1 = -(-0.1 - 2.0) * 1.0, -(-0.5) * -2.0  # sum_t over thinking steps of -log rho A
    sapo0, sapo1 = -2.0 * 1.0 * 2, -(2.0 / 1.05) * -2.0  # on-policy -f(1) A = -(4/tau) sigmoid(0) A per step
    expected = {"grpo": (row0 / 4 + row1 / 2) / 2, "bnpo": (row0 + row1) / 6, "dr_grpo": (row0 + row1) / (2 * 8),
                "dapo": (row0 + row1) / 3.0, "cispo": 0.2 * (row0 + row1) / 3.0,  # min(r = 1, eps_high = 0.2)
                "sapo": (sapo0 / 4 + sapo1 / 2) / 2, "luspo": (row0 + row1) / 2,  # rows' sums, their mean
                "vespo": (row0 + row1) / 3.0}[loss_type]  # on-policy phi(w = 1) = e^l 1^k e^-l = 1: dapo's
    torch.testing.assert_close(terms["loss_act"], torch.tensor(expected))


def test_sequence_level_router_ratio_is_the_mean_over_thinking_steps():
    mask, decided, logp_act, adv = router_example()
    old = logp_act - torch.tensor([[0.2, 0.4, 5.0, 5.0], [0.1, 5.0, 5.0, 5.0]])  # answer steps must not count
    zeros = torch.zeros(2, 4)
    _, terms = loss_of(LossSettings(lambda_act=1.0, beta=0.0, alpha=0.0, clip_eps=10.0, level="sequence"),
                          logp_tok=zeros, logp_act=logp_act, p_hard=torch.ones(2, 4), kl_tok=zeros, kl_act=zeros,
                          advantages=adv, completion_mask=mask, is_soft=torch.zeros_like(mask), decided=decided,
                          old_logp_tok=zeros, old_logp_act=old)
    r0, r1 = math.exp((0.2 + 0.4) / 2), math.exp(0.1)
    expected = ((-r0 * 1.0) * 2 / 4 + (-r1 * -2.0) * 1 / 2) / 2
    torch.testing.assert_close(terms["loss_act"], torch.tensor(expected))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("off_policy", [False, True])
def test_entropy_masking_equals_trls_top_entropy_quantile(loss_type, off_policy):
    b = batch(3)
    entropy = torch.rand(B, T, generator=torch.Generator().manual_seed(4)) * 3
    keep = high_entropy_mask(entropy, b["mask"], 0.4)
    assert 0 < keep.sum() < b["mask"].sum() and not (keep & ~b["mask"]).any()
    old = b["old"] if off_policy else None
    logp_a, logp_b, logp_c = (b["logp"].clone().requires_grad_(True) for _ in range(3))
    a = ours(loss_type, "token", logp_a, old, b["ref"], b["adv"], b["mask"], beta=0.04, entropy_mask=keep)
    t = trl_loss(loss_type, "token", logp_b, old, b["ref"], b["adv"], b["mask"], beta=0.04, entropies=entropy,
                 quantile=0.4)
    g_a, = torch.autograd.grad(a, logp_a)
    torch.testing.assert_close(g_a, torch.autograd.grad(t, logp_b)[0])
    if off_policy or loss_type in ("cispo", "sapo"):  # the surrogates of CISPO and SAPO are TRL's values as well
        torch.testing.assert_close(a, t)
    policy_only = ours(loss_type, "token", logp_c, old, b["ref"], b["adv"], b["mask"], beta=0.0, entropy_mask=keep)
    g_c, = torch.autograd.grad(policy_only, logp_c)
    # exact: the masked steps' gradient is multiplied by a 0.0 mask (beta = 0)
    assert torch.equal(g_c[~keep], torch.zeros_like(g_c[~keep])) and g_c[keep].abs().sum() > 0


def worked_example():
    """Row 0: three steps, ratios 2, 0.5, 3, A = 1.5; row 1: two steps and padding, ratios 1, 0.8, A = -1."""
    p = torch.tensor([[0.5, 0.2, 0.9], [0.6, 0.4, 0.5]])
    ratio = torch.tensor([[2.0, 0.5, 3.0], [1.0, 0.8, 1.0]])
    steps = [(2.0, 0.5, 1.5, 0), (0.5, 0.2, 1.5, 0), (3.0, 0.9, 1.5, 0), (1.0, 0.6, -1.0, 1), (0.8, 0.4, -1.0, 1)]
    return p.log(), (p / ratio).log(), torch.tensor([[True, True, True], [True, True, False]]), \
        torch.tensor([1.5, -1.0]), steps


def by_hand(loss_type, steps, eps_max=2.5, tau_pos=1.0, tau_neg=1.05):
    """The worked example's loss and d loss / d log p per step, from the papers' formulas."""
    value, grad = 0.0, []
    for r, p, a, row in steps:
        if loss_type == "cispo":  # -sg(min(r, eps_max)) A log p, summed over the 5 units (dapo's divisor)
            value += -min(r, eps_max) * a * math.log(p) / 5
            grad.append(-min(r, eps_max) * a / 5)
        else:  # -sigmoid(tau (r - 1)) 4/tau A, each row's mean (3 and 2 units), then the mean over the 2 rows
            tau, units = (tau_pos if a > 0 else tau_neg), (3, 2)[row]
            s = 1 / (1 + math.exp(-tau * (r - 1)))
            value += -s * 4 / tau * a / units / 2
            grad.append(-4 * s * (1 - s) * r * a / units / 2)  # d/dlogp: f'(r) r, f'(r) = 4 s (1 - s)
    return value, grad


@pytest.mark.parametrize("loss_type", ["cispo", "sapo"])
def test_cispo_and_sapo_by_hand_on_the_token_and_the_router_terms(loss_type):
    logp, old, mask, adv, steps = worked_example()
    settings = LossSettings(lambda_act=1.0, beta=0.0, alpha=0.0, loss_type=loss_type, clip_eps_high=2.5,
                            sapo_temperature_pos=1.0, sapo_temperature_neg=1.05)
    tok, act = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    zeros = torch.zeros(2, 3)
    loss, terms = loss_of(settings, logp_tok=tok, logp_act=act, p_hard=torch.ones(2, 3), kl_tok=zeros,
                             kl_act=zeros, advantages=adv, completion_mask=mask, is_soft=torch.zeros_like(mask),
                             decided=mask, old_logp_tok=old, old_logp_act=old, num_units=5.0)
    value, grad = by_hand(loss_type, steps)
    expected_grad = torch.zeros(2, 3)
    expected_grad[mask] = torch.tensor(grad)
    for name, x in (("loss_tok", tok), ("loss_act", act)):  # the token term (pi's ratio) and the router's (rho's)
        torch.testing.assert_close(terms[name], torch.tensor(value))
        torch.testing.assert_close(torch.autograd.grad(loss, x, retain_graph=True)[0], expected_grad)
    if loss_type == "cispo":  # every step keeps its gradient, those PPO's clip (eps 0.2) drops included
        assert bool(expected_grad[mask].abs().min() > 0)


def test_sapo_on_policy_is_reinforce_and_cispo_on_policy_is_reinforce_scaled_by_min_1_eps_max():
    logp, _, mask, adv, _ = worked_example()
    for loss_type, eps_high, scale in (("sapo", None, 1.0), ("cispo", 5.0, 1.0), ("cispo", 0.5, 0.5)):
        x = logp.clone().requires_grad_(True)
        settings = LossSettings(lambda_act=0.0, beta=0.0, alpha=0.0, use_router=False, loss_type=loss_type,
                                clip_eps_high=eps_high)
        loss, _ = loss_of(settings, logp_tok=x, logp_act=torch.zeros(2, 3), p_hard=torch.ones(2, 3),
                             kl_tok=torch.zeros(2, 3), kl_act=torch.zeros(2, 3), advantages=adv, completion_mask=mask,
                             is_soft=torch.zeros_like(mask), decided=mask, num_units=5.0)
        units = 5.0 if loss_type == "cispo" else torch.tensor([[3.0], [2.0]]) * 2  # dapo's, grpo's divisors
        expected = torch.where(mask, -scale * adv[:, None] / units, torch.zeros(2, 3))
        torch.testing.assert_close(torch.autograd.grad(loss, x)[0], expected)


def test_the_registry_owns_the_loss_types_and_refuses_an_unknown_one_naming_loss_type():
    import re

    from tarpo import config, losses
    from tarpo.config import TarpoConfig

    assert config.LOSS_TYPES is losses.LOSS_TYPES == tuple(losses.LOSSES)
    assert set(LOSS_TYPES) == {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"}
    for make in (lambda: losses.loss_variant("gspo"), lambda: LossSettings(0.1, 0.0, 1.0, loss_type="gspo")):
        with pytest.raises(ValueError, match=r"^loss_type='gspo': must be one of grpo, dapo, dr_grpo, bnpo, cispo, "
                                             r"sapo, luspo, vespo$"):
            make()
    help_text = TarpoConfig.__dataclass_fields__["loss_type"].metadata["help"]
    assert all(f"'{name}'" in help_text for name in LOSS_TYPES)
    body = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                             "launch.sh")).read()
    comment = re.search(r"^LOSS_TYPE=\$\{LOSS_TYPE:-\}\s+# (.*)$", body, flags=re.M).group(1)
    assert [part.split()[0] for part in comment.split("|")] == list(LOSS_TYPES)


def test_the_scoring_gives_the_entropy_from_its_log_prob_chunks():
    from tarpo.training.scoring import token_logprobs

    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(8, 50)
    hidden = torch.randn(3, 4, 8, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (3, 4), generator=g)
    mask = torch.tensor([[True, True, True, False], [True, False, False, False], [True, True, True, True]])
    plain = token_logprobs(head, hidden, targets, mask, 0.5, 2)
    logp, entropy = token_logprobs(head, hidden, targets, mask, 0.5, 2, with_entropy=True)
    # exact: the same ops on the same chunks; with_entropy only adds an output
    assert torch.equal(logp, plain)
    full = torch.log_softmax(head(hidden).float() / 0.5, -1)
    reference = torch.where(mask, -(full.exp() * full).sum(-1), torch.zeros(3, 4))
    torch.testing.assert_close(entropy, reference)
    # the entropy keeps its gradient (the entropy bonus trains through it, as TRL's)
    torch.testing.assert_close(torch.autograd.grad(entropy.sum(), hidden, retain_graph=True)[0],
                               torch.autograd.grad(reference.sum(), hidden, retain_graph=True)[0])
    torch.testing.assert_close(torch.autograd.grad(logp.sum(), hidden)[0],
                               torch.autograd.grad(plain.sum(), hidden)[0])


def test_all_values_concatenates_every_process_values_of_any_length():
    from tarpo.training.distributed import all_values

    other = torch.tensor([7.0, 8.0, 9.0])  # what a second process holds

    def gather(x):
        theirs = torch.tensor([other.numel()]) if x.dtype == torch.long else torch.cat(
            [other, torch.zeros(x.numel() - other.numel())])
        return torch.cat([x, theirs])

    two = SimpleNamespace(num_processes=2, gather=gather, pad_across_processes=lambda x, dim: torch.cat(
        [x, torch.zeros(max(other.numel() - x.numel(), 0))]))
    assert all_values(two, torch.tensor([1.0])).tolist() == [1.0, 7.0, 8.0, 9.0]
    assert all_values(two, torch.zeros(0)).tolist() == [7.0, 8.0, 9.0]
    one = SimpleNamespace(num_processes=1)
    assert all_values(one, torch.tensor([1.0, 2.0])).tolist() == [1.0, 2.0]


# ---- advantages: scale_rewards as TRL's formulas
def test_scale_rewards_group_batch_none_as_trl():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5])
    g = r.view(-1, 4)
    centred = (g - g.mean(1, keepdim=True)).view(-1)
    torch.testing.assert_close(group_advantages(r, 4, 1e-4, "group"),
                               centred / (g.std(1, keepdim=True).repeat_interleave(4).view(-1) + 1e-4))
    torch.testing.assert_close(group_advantages(r, 4, 1e-4, "batch"), centred / (r.std() + 1e-4))
    torch.testing.assert_close(group_advantages(r, 4, 1e-4, "none"), centred)


# ---- the mismatch correction: ratios by hand, identity where the sides agree
def crafted():
    """Two rows; tokens at every step but soft ones, routing actions at thinking steps."""
    token_steps = torch.tensor([[True, False, True], [True, True, False]])
    route_steps = torch.tensor([[True, True, False], [True, False, False]])
    train_tok = torch.log(torch.tensor([[0.5, 0.9, 0.2], [0.3, 0.6, 0.9]]))
    roll_tok = torch.log(torch.tensor([[0.25, 0.1, 0.4], [0.3, 0.1, 0.1]]))
    train_act = torch.log(torch.tensor([[0.9, 0.2, 0.5], [0.8, 0.5, 0.5]]))
    roll_act = torch.log(torch.tensor([[0.9, 0.1, 0.1], [0.4, 0.5, 0.5]]))
    return [(train_tok, roll_tok, token_steps), (train_act, roll_act, route_steps)]


@pytest.mark.parametrize("mode, expected_tok, expected_act", [
    # per step: ratios 2, 0.5 (row 0 tokens), 1, 6 (row 1 tokens); 1, 2 (row 0 routes), 2 (row 1 route)
    ("token_truncate", [[2.0, 1.0, 0.5], [1.0, 3.0, 1.0]], [[1.0, 2.0, 1.0], [2.0, 1.0, 1.0]]),
    ("token_mask", [[2.0, 1.0, 0.5], [1.0, 0.0, 1.0]], [[1.0, 2.0, 1.0], [2.0, 1.0, 1.0]]),
])
def test_token_level_ratios_by_hand(mode, expected_tok, expected_act):
    (w_tok, w_act), stats = mismatch_weights(crafted(), mode, None, 3.0)
    torch.testing.assert_close(w_tok, torch.tensor(expected_tok))
    torch.testing.assert_close(w_act, torch.tensor(expected_act))
    observed = [2.0, 0.5, 1.0, 6.0, 1.0, 2.0, 2.0]
    torch.testing.assert_close(stats["ratio_mean"], torch.tensor(sum(observed) / 7))
    assert stats["ratio_min"] == pytest.approx(0.5) and stats["ratio_max"] == pytest.approx(6.0)
    assert stats["corrected"] == pytest.approx(1 / 7)


@pytest.mark.parametrize("mode, clip_min, clip_max", [("sequence_truncate", None, 1.5), ("sequence_mask", None, 1.5),
                                                      ("sequence_truncate", 1.2, None), ("sequence_mask", 1.2, None)])
def test_sequence_level_ratio_is_the_mean_of_the_log_ratios_over_tokens_and_routes(mode, clip_min, clip_max):
    # row 0: log 2 + log 0.5 (tokens) + log 1 + log 2 (routes) over 4 actions; row 1: log 1 + log 6 + log 2 over 3
    r0, r1 = math.exp(math.log(2) / 4), math.exp(math.log(12) / 3)  # 1.19, 2.29; a sum would give 2 and 12
    low, high = clip_min or 0.0, clip_max or math.inf
    if mode == "sequence_truncate":
        want = [min(max(r, low), high) for r in (r0, r1)]
    else:
        want = [r if low <= r <= high else 0.0 for r in (r0, r1)]
    pairs = crafted()
    (w_tok, w_act), stats = mismatch_weights(pairs, mode, clip_min, clip_max)
    for w, (_, _, m) in zip((w_tok, w_act), pairs):
        expected = torch.where(m, torch.tensor(want)[:, None].expand(2, 3), torch.ones(2, 3))
        torch.testing.assert_close(w, expected)
    torch.testing.assert_close(stats["ratio_mean"], torch.tensor((r0 + r1) / 2))
    assert stats["corrected"] == pytest.approx(0.5)


@pytest.mark.parametrize("mode", IS_CORRECTIONS[1:])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_correction_is_the_identity_when_rollout_and_training_agree(mode, loss_type):
    b = batch(1)
    decided = b["mask"].clone()
    decided[:, 3:] = False
    logp_act = -torch.rand(B, T)

    def run(weights):
        lt, la = b["logp"].clone().requires_grad_(True), logp_act.clone().requires_grad_(True)
        settings = LossSettings(lambda_act=0.3, beta=0.04, alpha=1.0, loss_type=loss_type, max_completion_length=T)
        loss, _ = loss_of(settings, logp_tok=lt, logp_act=la, p_hard=torch.full((B, T), 0.9),
                             kl_tok=k3(lt, b["ref"]), kl_act=torch.zeros(B, T), advantages=b["adv"],
                             completion_mask=b["mask"], is_soft=torch.zeros_like(b["mask"]), decided=decided,
                             num_units=9.0, is_weights=weights)
        return (loss, *torch.autograd.grad(loss, (lt, la)))

    pairs = [(b["logp"], b["logp"].clone(), b["mask"]), (logp_act, logp_act.clone(), decided)]
    weights, stats = mismatch_weights(pairs, mode, 0.5, 2.0)
    # exact: equal log-probs: log-ratios 0.0, weights exp(0.0) = 1.0, nothing corrected
    assert all(torch.equal(w, torch.ones_like(w)) for w in weights) and stats["corrected"] == 0
    for x, y in zip(run(None), run(tuple(weights))):
        assert torch.equal(x, y)  # exact: weights of exactly 1.0 (x * 1.0 == x), the same ops otherwise


def test_the_correction_weights_the_policy_gradient_and_not_the_kl():
    b = batch(2)
    w = torch.full((B, T), 0.5)
    zero = torch.zeros(B, T)
    common = dict(logp_act=zero, p_hard=torch.ones(B, T), kl_act=zero, advantages=b["adv"],
                  completion_mask=b["mask"], is_soft=torch.zeros_like(b["mask"]), decided=b["mask"])
    beta0, beta1 = (LossSettings(lambda_act=0.0, beta=beta, alpha=0.0, use_router=False) for beta in (0.0, 1.0))
    pg, _ = loss_of(beta0, logp_tok=b["logp"], kl_tok=zero, **common)
    pg_w, _ = loss_of(beta0, logp_tok=b["logp"], kl_tok=zero, is_weights=(w, w), **common)
    kl, _ = loss_of(beta1, logp_tok=zero, kl_tok=b["ref"].abs(), **common)
    kl_w, _ = loss_of(beta1, logp_tok=zero, kl_tok=b["ref"].abs(), is_weights=(w, w), **common)
    torch.testing.assert_close(pg_w, pg * 0.5)
    torch.testing.assert_close(kl_w, kl)


# ---- in the trainer and the launchers
def test_a_tiny_run_logs_the_ratio_metrics_and_saves_the_config_that_ran(tokenizer, tmp_path):
    from helpers import letter_reward, make_args, make_dataset
    from tarpo.models.tiny import tiny_causal_lm
    from tarpo.training.trainer import TarpoTrainer

    args = make_args(tmp_path, max_steps=2, loss_type="dapo", scale_rewards="batch", epsilon_high=0.28,
                     importance_sampling_level="sequence", mask_truncated_completions=True,
                     is_correction="token_truncate", is_clip_max=2.0, save_strategy="steps", save_steps=2)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, seed=2), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for h in logs:  # on-policy the two sides differ by numerics only
        assert 0.99 < h["importance_sampling/ratio_min"] <= h["importance_sampling/ratio_mean"] \
            <= h["importance_sampling/ratio_max"] < 1.01
        # exact: a fraction of a count (no ratio near the clip at 2.0)
        assert h["importance_sampling/corrected"] == 0.0
    saved = torch.load(tmp_path / "run" / "checkpoint-2" / "training_args.bin", weights_only=False)
    assert (saved.loss_type, saved.scale_rewards, saved.importance_sampling_level, saved.epsilon_high,
            saved.mask_truncated_completions, saved.is_correction, saved.is_clip_max) == (
        "dapo", "batch", "sequence", 0.28, True, "token_truncate", 2.0)


def test_the_trainer_builds_the_loss_settings_once_and_masks_the_token_term_by_entropy(tokenizer, tmp_path,
                                                                                       monkeypatch):
    from helpers import letter_reward, make_args, make_dataset
    from tarpo.models.tiny import tiny_causal_lm
    from tarpo.training import objective
    from tarpo.training import trainer as trainer_module

    seen, loss_fn = [], objective.tarpo_loss

    def recording_loss(settings, scores, batch):
        seen.append((settings, batch.entropy_mask, batch.completion_mask))
        return loss_fn(settings, scores, batch)

    monkeypatch.setattr(objective, "tarpo_loss", recording_loss)
    args = make_args(tmp_path, max_steps=2, loss_type="sapo", sapo_temperature_neg=1.2, top_entropy_quantile=0.5)
    trainer = trainer_module.TarpoTrainer(model=tiny_causal_lm(tokenizer, seed=2), reward_funcs=letter_reward,
                                          args=args, train_dataset=make_dataset(), processing_class=tokenizer)
    trainer.train()
    settings = trainer.loss_settings
    assert settings == LossSettings.of(args) and (settings.loss_type, settings.sapo_temperature_neg) == ("sapo", 1.2)
    assert len(seen) >= 2 and all(s is settings for s, _, _ in seen)  # one object, built in __init__
    for _, keep, mask in seen:  # the top half of the steps by entropy
        assert not (keep & ~mask).any() and 0.4 * mask.sum() <= keep.sum() <= 0.6 * mask.sum() + 1
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)


def test_mask_truncated_completions_leaves_cut_rows_out_of_the_loss():
    from tarpo.training.loss_inputs import loss_mask

    rollout = SimpleNamespace(completion_mask=torch.tensor([[True, True, True], [True, True, False]]),
                              ended_with_eos=torch.tensor([False, True]))
    for on, expected in ((False, rollout.completion_mask), (True, torch.tensor([[False] * 3, [True, True, False]]))):
        settings = LossSettings(lambda_act=0.1, beta=0.0, alpha=0.0, mask_truncated_completions=on)
        assert torch.equal(loss_mask(settings, rollout), expected)  # exact: boolean masks


def test_the_launcher_shows_the_loss_settings_in_its_resolved_config():
    from test_launch import dry_run
    cfg = dry_run("run_math.sh", LOSS_TYPE="dapo", IS_CORRECTION="sequence_mask", IS_CLIP_MAX="none",
                  EPSILON_HIGH="0.28", MASK_TRUNCATED="1", SCALE_REWARDS="none", IS_LEVEL="sequence")
    t = cfg["trainer"]
    assert (t["loss_type"], t["is_correction"], t["is_clip_max"], t["epsilon_high"], t["mask_truncated_completions"],
            t["scale_rewards"], t["importance_sampling_level"]) == ("dapo", "sequence_mask", None, 0.28, True,
                                                                     "none", "sequence")
    default = dry_run("run_math.sh")["trainer"]
    assert (default["loss_type"], default["is_correction"], default["scale_rewards"]) == ("grpo", "none", "group")
