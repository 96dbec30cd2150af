"""Exploration inside the soft mode (routing ``learned_gumbel``, ALGO ``tarpo_gumbel``) and the other direction of
entropy routing (``entropy_soft_when="low"``), docs/algorithm.md §8: the draws follow their distribution, the
training forward rebuilds the rollout's inputs exactly and scores the draw, and the launchers know the new ALGO."""

import math

import pytest
import torch

from helpers import BiasedBackbone, policy_of, encode_prompts
from tarpo.engine.soft_input import GumbelTopK
from tarpo.engine.mixture import soft_topk
from tarpo.engine.rollout import RolloutSpec, hybrid_generate
from tarpo.engine.router import Router
from tarpo.engine.sampling import STREAM_GUMBEL, row_keys, step_uniforms
from tarpo.training.scoring import ScoreSettings, score_rollout, sequence_hidden

N = 40_000


def draws(log_alpha, tau, seed=3):
    u = step_uniforms(row_keys(seed, torch.arange(N)), 0, STREAM_GUMBEL, log_alpha.shape[-1])
    return GumbelTopK.weights(log_alpha.expand(N, -1), u, tau)


def test_the_argmax_of_the_draw_follows_the_token_distribution():
    """Gumbel-max: argmax_i (log alpha_i + g_i) ~ softmax(log alpha), whatever tau."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    for tau in (0.5, 2.0):
        w = draws(p.log(), tau)
        torch.testing.assert_close(w.sum(-1), torch.ones(N))
        freq = torch.bincount(w.argmax(-1), minlength=4).float() / N
        assert (freq - p).abs().max() < 0.012, (tau, freq)  # 4.5 standard errors at p = 0.5


def test_the_draws_follow_the_concrete_density_that_training_scores():
    """k = 2: the empirical distribution of w_1 against the integral of exp(log_density) over (0, a)."""
    tau, log_alpha = 0.5, torch.tensor([0.3, -0.4])
    g = GumbelTopK(tau)
    w1 = draws(log_alpha, tau)[:, 0]
    grid = (torch.arange(400_000, dtype=torch.float64) + 0.5) / 400_000  # midpoints of (0, 1)
    dens = g.log_density(log_alpha.double().expand(len(grid), -1), torch.stack([grid, 1 - grid], -1)).exp()
    assert abs(dens.mean().item() - 1) < 0.01  # a density: it integrates to 1
    for a in (0.1, 0.3, 0.5, 0.7, 0.9):
        want = dens[grid < a].sum().item() / len(grid)
        assert abs((w1 < a).float().mean().item() - want) < 0.01, a


def test_the_density_is_shift_invariant_and_matches_the_two_point_formula():
    g = GumbelTopK(0.7)
    log_alpha, w = torch.tensor([0.2, -1.0, 0.5]), torch.tensor([0.2, 0.5, 0.3])
    torch.testing.assert_close(g.log_density(log_alpha + 3.0, w), g.log_density(log_alpha, w))
    a, x, t = log_alpha.exp(), w, 0.7  # (k-1)! t^(k-1) prod a x^(-t-1) / (sum a x^(-t))^k, k = 3
    by_hand = math.log(2 * t ** 2 * (a * x ** (-t - 1)).prod().item() / (a * x ** (-t)).sum().item() ** 3)
    assert g.log_density(log_alpha, w).item() == pytest.approx(by_hand, rel=1e-5)


def test_a_gumbel_rollout_is_rebuilt_exactly_in_training_and_its_draw_is_scored(model, tokenizer):
    torch.manual_seed(0)
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 1.0
    backbone = BiasedBackbone(model, bias)
    router = Router(model.config.hidden_size, bias=[0.0, 0.0], init_std=0.05)  # soft about half the time
    gumbel = GumbelTopK(0.5)
    enc = encode_prompts(tokenizer, ["what is 2+3?", "hi", "a longer prompt here"])
    spec = RolloutSpec(max_new_tokens=30, temperature=0.8, soft_top_k=5, routing="learned_gumbel")
    out = hybrid_generate(policy_of(backbone, tokenizer, router, gumbel), enc.input_ids, enc.attention_mask, spec,
                          noise_seed=5, row_ids=torch.arange(3))
    m, soft = out.completion_mask, out.completion_mask & out.is_soft
    assert soft.sum() >= 10 and (m & out.decided & ~out.is_soft).any()
    # the weights are a draw, not the plain top-k softmax of the step's logits
    with torch.no_grad():
        logits = backbone.logits(sequence_hidden(backbone, out, gumbel)[soft]).float() / 0.8
    ids, plain = soft_topk(logits, 5)
    assert torch.equal(ids, out.soft_ids[soft])  # exact: integer ids
    torch.testing.assert_close(out.soft_weights[soft].sum(-1), torch.ones(int(soft.sum())))
    assert (out.soft_weights[soft] - plain).abs().max() > 0.1
    # the same draw from the same keyed noise, by hand
    u = torch.stack([step_uniforms(row_keys(5, torch.tensor([b])), t, STREAM_GUMBEL, 5)[0]
                     for b, t in soft.nonzero().tolist()])
    torch.testing.assert_close(out.soft_weights[soft], GumbelTopK.weights(logits.gather(-1, ids), u, 0.5),
                               atol=1e-5, rtol=1e-5)
    # training: the recorded ids and weights give the inputs the rollout fed, so the token log-probs agree
    with torch.no_grad():
        scores = score_rollout(backbone, router, None, out,
                               ScoreSettings(temperature=0.8, chunk_size=7, use_router=True, with_reference=False),
                                             soft_input=gumbel)
    torch.testing.assert_close(scores.logp_tok[m], out.logp[m], atol=1e-4, rtol=0)
    hand = gumbel.log_density(logits.gather(-1, ids), out.soft_weights[soft])
    torch.testing.assert_close(scores.logp_soft_input[soft], hand, atol=1e-3, rtol=1e-4)
    assert (scores.logp_soft_input[~soft] == 0).all()  # exact: masked zeros (only the soft steps are written)


def test_entropy_routing_goes_soft_below_the_threshold_when_asked(model, tokenizer):
    """The first step, from the same prompts: with the threshold at the median entropy, 'low' is soft exactly
    where 'high' is hard."""
    backbone = BiasedBackbone(model, torch.zeros(model.config.vocab_size))
    enc = encode_prompts(tokenizer, ["what is 2+3?", "hi", "a longer prompt here", "x", "abc", "zz top"])
    outs, threshold = {}, None
    for side in ("high", "low", "high"):
        if threshold is None:  # a first pass to read the first step's entropies
            spec = RolloutSpec(max_new_tokens=1, temperature=0.8, routing="hard")
            first = hybrid_generate(policy_of(backbone, tokenizer), enc.input_ids, enc.attention_mask,
                                    spec).entropy[:, 0]
            threshold = first.median().item() + 1e-4  # between two of the six values
        spec = RolloutSpec(max_new_tokens=2, temperature=0.8, routing="entropy", entropy_soft_when=side,
                           entropy_threshold=threshold, entropy_temperature=0.8)
        outs[side] = hybrid_generate(policy_of(backbone, tokenizer), enc.input_ids, enc.attention_mask, spec)
    assert outs["high"].decided[:, 0].all() and outs["low"].decided[:, 0].all()
    assert torch.equal(outs["high"].is_soft[:, 0], first > threshold)  # exact: boolean masks
    assert torch.equal(outs["low"].is_soft[:, 0], first < threshold)  # exact: boolean masks
    assert 0 < int(outs["low"].is_soft[:, 0].sum()) < 6
    with pytest.raises(ValueError, match="entropy_soft_when='mid'"):
        RolloutSpec(max_new_tokens=1, routing="entropy", entropy_soft_when="mid")


def test_the_launchers_and_the_tables_know_tarpo_gumbel():
    from test_launch import dry_run
    from tarpo.evaluation.tables import build
    cfg = dry_run("run_math.sh", ALGO="tarpo_gumbel", GUMBEL_TEMPERATURE="0.7")
    assert (cfg["trainer"]["routing"], cfg["trainer"]["gumbel_temperature"]) == ("learned_gumbel", 0.7)
    assert (cfg["system"], cfg["eval_mode"]) == ("TARPO w/ Gumbel", "tarpo")
    low = dry_run("run_math.sh", ALGO="grpo_entropy", ENTROPY_SOFT_WHEN="low")
    assert low["trainer"]["entropy_soft_when"] == "low"
    results = {("TARPO w/ Gumbel", "tiny", "math", "sampled"): {"metrics": {"pass@1": 0.5, "units": 100.0}}}
    sections = [sec for sec in build(1, results)["sections"] if sec["model"] == "tiny"]
    assert [r["label"][0] for r in sections[0]["rows"]] == ["TARPO w/ Gumbel"]
