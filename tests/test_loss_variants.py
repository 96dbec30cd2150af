"""The loss variants and the rollout/training mismatch correction (docs/algorithm.md §5): each loss type
against TRL 1.15's own ``GRPOTrainer._compute_loss`` for hard routing, the router term by hand, the
importance ratios by hand, and every correction the identity where the two sides agree."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer

from tarpo.config import IS_CORRECTIONS, LOSS_TYPES
from tarpo.training.objective import aggregate, group_advantages, k3, mismatch_weights, tarpo_loss

B, T = 4, 5


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    mask[1, 2:] = False  # rows of different lengths
    return dict(logp=-torch.rand(B, T, generator=g) * 2, ref=-torch.rand(B, T, generator=g) * 2,
                old=-torch.rand(B, T, generator=g) * 2, adv=torch.randn(B, generator=g), mask=mask)


def trl_loss(loss_type, level, logp, old, ref, adv, mask, beta, eps=0.2, eps_high=0.28):
    """TRL's own ``_compute_loss`` on an object that has what it reads; the log-probs stand in for the model's."""
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=beta, loss_type=loss_type, epsilon_low=eps, epsilon_high=eps_high,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        use_vllm=False, vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=T, _entropy_bonus_enabled=False,
        accelerator=SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x,
                                    gather_for_metrics=lambda x: x),
        _metrics=defaultdict(lambda: defaultdict(list)))
    inputs = dict(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                  completion_ids=torch.zeros(B, T, dtype=torch.long), completion_mask=mask.long(), advantages=adv,
                  num_items_in_batch=mask.sum().float(), ref_per_token_logps=ref)
    if old is not None:
        inputs["old_per_token_logps"] = old
    return GRPOTrainer._compute_loss(fake, None, inputs)


def ours(loss_type, level, logp, old, ref, adv, mask, beta, eps=0.2, eps_high=0.28, **kw):
    zeros = torch.zeros_like(logp)
    return tarpo_loss(logp_tok=logp, logp_act=zeros, p_hard=torch.ones_like(logp), kl_tok=k3(logp, ref), kl_act=zeros,
                      advantages=adv, completion_mask=mask, is_soft=torch.zeros_like(mask), decided=mask,
                      lambda_act=0.5, beta=beta, alpha=1.0, use_router=False, old_logp_tok=old, clip_eps=eps,
                      clip_eps_high=eps_high, loss_type=loss_type, level=level, max_completion_length=T,
                      num_units=mask.sum().float(), **kw)[0]


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
    _, terms = tarpo_loss(logp_tok=zeros, logp_act=logp_act, p_hard=torch.ones(2, 4), kl_tok=zeros, kl_act=zeros,
                          advantages=adv, completion_mask=mask, is_soft=torch.zeros_like(mask), decided=decided,
                          lambda_act=1.0, beta=0.0, alpha=0.0, loss_type=loss_type, max_completion_length=8,
                          num_units=3.0)
    row0, row1 = -(-0.1 - 2.0) * 1.0, -(-0.5) * -2.0  # sum_t over thinking steps of -log rho A
    expected = {"grpo": (row0 / 4 + row1 / 2) / 2, "bnpo": (row0 + row1) / 6, "dr_grpo": (row0 + row1) / (2 * 8),
                "dapo": (row0 + row1) / 3.0}[loss_type]
    torch.testing.assert_close(terms["loss_act"], torch.tensor(expected))


def test_sequence_level_router_ratio_is_the_mean_over_thinking_steps():
    mask, decided, logp_act, adv = router_example()
    old = logp_act - torch.tensor([[0.2, 0.4, 5.0, 5.0], [0.1, 5.0, 5.0, 5.0]])  # answer steps must not count
    zeros = torch.zeros(2, 4)
    _, terms = tarpo_loss(logp_tok=zeros, logp_act=logp_act, p_hard=torch.ones(2, 4), kl_tok=zeros, kl_act=zeros,
                          advantages=adv, completion_mask=mask, is_soft=torch.zeros_like(mask), decided=decided,
                          lambda_act=1.0, beta=0.0, alpha=0.0, old_logp_tok=zeros, old_logp_act=old, clip_eps=10.0,
                          level="sequence")
    r0, r1 = math.exp((0.2 + 0.4) / 2), math.exp(0.1)
    expected = ((-r0 * 1.0) * 2 / 4 + (-r1 * -2.0) * 1 / 2) / 2
    torch.testing.assert_close(terms["loss_act"], torch.tensor(expected))


def test_aggregate_refuses_an_unknown_loss_type():
    with pytest.raises(ValueError, match="loss_type='cispo'"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), "cispo")


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
        loss, _ = tarpo_loss(logp_tok=lt, logp_act=la, p_hard=torch.full((B, T), 0.9), kl_tok=k3(lt, b["ref"]),
                             kl_act=torch.zeros(B, T), advantages=b["adv"], completion_mask=b["mask"],
                             is_soft=torch.zeros_like(b["mask"]), decided=decided, lambda_act=0.3, beta=0.04,
                             alpha=1.0, loss_type=loss_type, max_completion_length=T, num_units=9.0,
                             is_weights=weights)
        return (loss, *torch.autograd.grad(loss, (lt, la)))

    pairs = [(b["logp"], b["logp"].clone(), b["mask"]), (logp_act, logp_act.clone(), decided)]
    weights, stats = mismatch_weights(pairs, mode, 0.5, 2.0)
    assert all(torch.equal(w, torch.ones_like(w)) for w in weights) and stats["corrected"] == 0
    for x, y in zip(run(None), run(tuple(weights))):
        assert torch.equal(x, y)


def test_the_correction_weights_the_policy_gradient_and_not_the_kl():
    b = batch(2)
    w = torch.full((B, T), 0.5)
    zero = torch.zeros(B, T)
    common = dict(logp_act=zero, p_hard=torch.ones(B, T), kl_act=zero, advantages=b["adv"],
                  completion_mask=b["mask"], is_soft=torch.zeros_like(b["mask"]), decided=b["mask"], lambda_act=0.0,
                  alpha=0.0, use_router=False)
    pg, _ = tarpo_loss(logp_tok=b["logp"], kl_tok=zero, beta=0.0, **common)
    pg_w, _ = tarpo_loss(logp_tok=b["logp"], kl_tok=zero, beta=0.0, is_weights=(w, w), **common)
    kl, _ = tarpo_loss(logp_tok=zero, kl_tok=b["ref"].abs(), beta=1.0, **common)
    kl_w, _ = tarpo_loss(logp_tok=zero, kl_tok=b["ref"].abs(), beta=1.0, is_weights=(w, w), **common)
    torch.testing.assert_close(pg_w, pg * 0.5)
    torch.testing.assert_close(kl_w, kl)


# ---- in the trainer and the launchers
def test_a_tiny_run_logs_the_ratio_metrics_and_saves_the_config_that_ran(tokenizer, tmp_path):
    from helpers import letter_reward, make_args, make_dataset
    from tarpo.tiny import tiny_causal_lm
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
        assert h["importance_sampling/corrected"] == 0.0
    saved = torch.load(tmp_path / "run" / "checkpoint-2" / "training_args.bin", weights_only=False)
    assert (saved.loss_type, saved.scale_rewards, saved.importance_sampling_level, saved.epsilon_high,
            saved.mask_truncated_completions, saved.is_correction, saved.is_clip_max) == (
        "dapo", "batch", "sequence", 0.28, True, "token_truncate", 2.0)


def test_mask_truncated_completions_leaves_cut_rows_out_of_the_loss():
    from tarpo.training.trainer import TarpoTrainer

    rollout = SimpleNamespace(completion_mask=torch.tensor([[True, True, True], [True, True, False]]),
                              ended_with_eos=torch.tensor([False, True]))
    for on, expected in ((False, rollout.completion_mask), (True, torch.tensor([[False] * 3, [True, True, False]]))):
        trainer = SimpleNamespace(args=SimpleNamespace(mask_truncated_completions=on))
        assert torch.equal(TarpoTrainer._loss_mask(trainer, rollout), expected)


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
