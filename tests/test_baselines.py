"""HRPO and Soft Tokens (DESIGN §3) in the shared engine, and every ALGO of the launchers."""

import math

import pytest
import torch

from helpers import BiasedBackbone, decode_kwargs, encode_prompts
from tarpo.latent import GaussianSoftTokens, HrpoGate
from tarpo.objective import tarpo_loss
from tarpo.presets import ALGOS
from tarpo.rollout import RolloutSpec, hybrid_generate
from tarpo.scoring import score_rollout
from tarpo.tiny import tiny_causal_lm
from tarpo.trainer import TarpoTrainer
from test_trainer import letter_reward, make_args, make_dataset


def test_hrpo_gate_starts_with_at_least_99_percent_token_embedding():
    gate = HrpoGate(64, seed=0)
    a_min = torch.exp(-gate.c * torch.nn.functional.softplus(-gate.lam))
    assert 0.99 <= a_min.min() and a_min.max() <= 0.999 and a_min.std() > 1e-3  # ~U[0.99, 0.999]
    e = torch.randn(100, 64)
    a = gate.blend_weight(e)
    assert a.min() >= 0.99 and a.max() < 1
    m = torch.randn(100, 64)
    u = gate(e, m)
    m_hat = m * e.norm(dim=-1, keepdim=True) / m.norm(dim=-1, keepdim=True)
    hand = a * e + torch.sqrt(1 - a * a) * torch.sigmoid(gate.i(e)) * m_hat
    torch.testing.assert_close(u, hand)
    assert ((u - e).norm(dim=-1) < 0.2 * e.norm(dim=-1)).all()  # mostly the token embedding


def test_soft_tokens_noise_is_a_third_of_the_embedding_rms_and_the_likelihood_is_gaussian(tokenizer):
    model = tiny_causal_lm(tokenizer)
    E = model.get_input_embeddings().weight
    noise = GaussianSoftTokens(E)
    assert noise.sigma == pytest.approx(0.33 * E.detach().pow(2).mean().sqrt().item())
    logits = torch.randn(3, E.shape[0])
    mean = GaussianSoftTokens.mean(logits, E)
    torch.testing.assert_close(mean, torch.softmax(logits, -1) @ E.detach())
    torch.manual_seed(0)
    u = noise.sample(logits, E)
    assert ((u - mean).std() / noise.sigma - 1).abs() < 0.1
    ref = torch.distributions.Normal(mean, noise.sigma).log_prob(u).sum(-1)
    torch.testing.assert_close(noise.log_likelihood(u, mean), ref)


def test_loss_terms_of_the_latent_baselines_by_hand():
    kw = dict(logp_act=torch.zeros(1, 3), p_hard=torch.ones(1, 3), kl_tok=torch.zeros(1, 3),
              kl_act=torch.zeros(1, 3), advantages=torch.tensor([2.0]), completion_mask=torch.ones(1, 3, dtype=bool),
              is_soft=torch.tensor([[True, False, False]]), decided=torch.tensor([[True, True, False]]),
              lambda_act=0.1, beta=0.0, alpha=1.0, use_router=False)
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    tarpo, _ = tarpo_loss(logp_tok=logp, **kw)
    assert tarpo.item() == pytest.approx(-(-2 - 3) * 2 / 3)  # the soft step's placeholder is out
    hrpo, _ = tarpo_loss(logp_tok=logp, token_loss_on_soft=True, **kw)
    assert hrpo.item() == pytest.approx(-(-1 - 2 - 3) * 2 / 3)  # the blended token was fed: in
    latent = torch.tensor([[-10.0, 99.0, 99.0]])  # only the soft step's Gaussian term counts
    soft_tokens, _ = tarpo_loss(logp_tok=logp, logp_latent=latent, **kw)
    assert soft_tokens.item() == pytest.approx(-(-2 - 3 - 10) * 2 / 3)


@pytest.mark.parametrize("routing", ["hrpo", "soft_tokens"])
def test_latent_rollouts_are_rebuilt_exactly_by_the_training_forward(model, tokenizer, routing):
    torch.manual_seed(0)
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 3.0 if routing == "hrpo" else 1.0  # rows end at different steps (compaction)
    backbone = BiasedBackbone(model, bias)
    E = backbone.embed_weight
    latent = HrpoGate(model.config.hidden_size, a_range=(0.5, 0.6)) if routing == "hrpo" else GaussianSoftTokens(E)
    enc = encode_prompts(tokenizer, ["what is 2+3?", "hi", "a longer prompt here"])
    spec = RolloutSpec(max_new_tokens=40, temperature=0.8, soft_top_k=5, routing=routing)
    out = hybrid_generate(backbone, None, enc.input_ids, enc.attention_mask, spec, **decode_kwargs(tokenizer),
                          latent=latent)
    m = out.completion_mask
    assert out.is_soft.any() and (out.is_soft == out.decided).all()  # every thinking step is soft
    assert out.units.min() < out.units.max()
    with torch.no_grad():
        scores = score_rollout(backbone, None, None, out, temperature=0.8, chunk_size=7, use_router=False,
                               with_reference=False, latent=latent)
    torch.testing.assert_close(scores.logp_tok[m], out.logp[m], atol=1e-4, rtol=0)
    if routing == "soft_tokens":
        assert out.soft_inputs.shape[-1] == model.config.hidden_size
        soft = m & out.is_soft
        assert scores.logp_latent is not None and (scores.logp_latent[~soft] == 0).all()
        # On-policy the recorded input is mean + sigma * eps, so log N = -|eps|^2 / 2 - d log(sigma sqrt(2 pi))
        # with eps ~ N(0, I): |eps|^2 / d averages 1 over the soft steps.
        d = model.config.hidden_size
        const = d * (math.log(latent.sigma) + 0.5 * math.log(2 * math.pi))
        eps2 = -2 * (scores.logp_latent[soft] + const)
        assert soft.sum() >= 20 and abs(eps2.mean().item() / d - 1) < 0.15


@pytest.mark.parametrize("algo", list(ALGOS))
def test_every_algo_trains_and_changes_every_trainable_parameter(tokenizer, tmp_path, algo):
    args = make_args(tmp_path, routing=ALGOS[algo]["routing"], max_steps=3, hrpo_lr=1e-1)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, seed=2), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in trainable)
    assert any("tarpo_router" in n for n in trainable) == (algo == "tarpo")
    assert any("tarpo_gate" in n for n in trainable) == (algo == "hrpo")
    for n, p in trainer.model.named_parameters():
        assert torch.equal(p, before[n]) != (n in trainable), f"{n}: trainable={n in trainable}"
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3 and all(math.isfinite(h["loss"]) for h in logs)
    if algo in ("hrpo", "soft_tokens", "grpo_pure_latent"):
        assert all(h["soft_ratio"] > 0 for h in logs)
    if algo == "hrpo":
        lrs = [g["initial_lr"] for g in trainer.optimizer.param_groups]
        assert lrs == [args.learning_rate, 1e-1]  # LoRA, gate (the router is frozen: no group)


def test_hrpo_gate_is_saved_and_evaluated(tokenizer, tmp_path):
    from tarpo.evaluation import sample
    from tarpo.modeling import load_gate

    args = make_args(tmp_path, routing="hrpo", max_steps=1)
    trainer = TarpoTrainer(model=tiny_causal_lm(tokenizer, seed=2), reward_funcs=letter_reward, args=args,
                           train_dataset=make_dataset(), processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    gate = load_gate(str(tmp_path / "adapter"))
    for k, v in trainer.gate.state_dict().items():
        torch.testing.assert_close(gate.state_dict()[k], v)
    examples = [{"id": "q", "prompt": [{"role": "user", "content": "question 1?"}]}]
    recs = sample(trainer.model, None, tokenizer, examples, 2, RolloutSpec(max_new_tokens=8), mode="hrpo",
                  max_prompt_length=64, gate=gate)
    assert len(recs) == 2 and all(r["soft_steps"] > 0 for r in recs)
    with pytest.raises(ValueError, match="needs a trained HRPO gate"):
        sample(trainer.model, None, tokenizer, examples, 1, RolloutSpec(max_new_tokens=4), mode="hrpo",
               max_prompt_length=64)
